-- Group red packets with default settings: 200.00 in 5, 20 or 100 lucky
-- draws, the shapes a chat group sends.  Whatever the stripe count the
-- activity gets, its amounts follow the double-mean method run on one pool
-- of 20000 units: every position in the claim order expects the same amount,
-- and one activity's amounts spread as the method spreads them.  The same
-- checks run on twins made with more stripes (amounts drawn for the whole
-- activity and dealt to the stripes).
--
-- Theory (`make lucky-theory`, test/alloc/lucky_theory.c), in minor units:
--   packets  mean  largest sd of a draw  largest |E[draw k] - mean|
--         5  4000               2909.204                      0.500
--        20  1000                785.355                      0.803
--       100   200                158.945                      1.216
-- and the sample variance of one activity's amounts, exact expectation and
-- its standard deviation over activities (simulated, 10^6 activities):
--         5  8655134.7  5893113
--        20   413090.2   154489
--       100    14176.4     2252
--
-- Tolerances (flakiness).  A position's mean over N activities is within
-- 7 sd/sqrt(N) (largest sd) plus the largest bias of a draw from the mean
-- (the claim order of dealt stripes is not the draw order); each such
-- check fails a correct draw with probability below 3e-12, 245 checks.  The
-- mean of the per-activity variances is within 6.5 x 1.05 sd/sqrt(N) of
-- its expectation (5% for the simulation's error), each failing below 1e-10,
-- 5 checks.  The whole file fails spuriously with probability below 1e-9.
-- A draw confined to a stripe (a stripe of one packet pays its whole share)
-- fails the variance check at once: every packet of 200.00 in 5 or 20 was
-- the same amount.
--
-- Only booleans, counts and constants are printed, never a random amount.

\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- The server's own default stripe count, not the one the test instance sets.
LOAD 'redpacket';
SELECT boot_val AS default_stripes, set_config('redpacket.stripes', boot_val, false) = boot_val AS set
FROM pg_settings WHERE name = 'redpacket.stripes';

CREATE TEMP TABLE shape (shape text PRIMARY KEY, packets integer, stripes integer,
                         n integer, mean numeric, sd_max numeric, bias_max numeric,
                         var_mean numeric, var_sd numeric);
INSERT INTO shape VALUES
    ('5 packets',               5,  NULL, 2000, 4000, 2909.204, 0.500, 8655134.7, 5893113),
    ('20 packets',             20,  NULL,  500, 1000,  785.355, 0.803,  413090.2,  154489),
    ('100 packets',           100,  NULL,  100,  200,  158.945, 1.216,   14176.4,    2252),
    ('20 packets, 4 stripes',  20,     4,  500, 1000,  785.355, 0.803,  413090.2,  154489),
    ('100 packets, 16 stripes', 100,  16,  100,  200,  158.945, 1.216,   14176.4,    2252);

-- The activities, made as an application makes them: no stripes argument
-- for the default shapes.
CREATE TEMP TABLE group_act AS
SELECT s.shape, g AS k,
       CASE WHEN s.stripes IS NULL
            THEN redpacket.rp_create_activity(200.00, packets => s.packets)
            ELSE redpacket.rp_create_activity(200.00, packets => s.packets, stripes => s.stripes)
       END AS aid
FROM shape s CROSS JOIN generate_series(1, s.n) g;

-- The stripes each shape got: one for a default group packet (a stripe
-- per 64 packets, up to redpacket.stripes).
SELECT g.shape, min(a.stripes) AS stripes, max(a.stripes) = min(a.stripes) AS all_same
FROM group_act g JOIN redpacket.activity a ON a.id = g.aid
GROUP BY g.shape ORDER BY g.shape;

-- Every packet claimed by a lucky draw, one member after another, then one
-- more claim finds the activity exhausted; 100 activities a transaction, so
-- that the claims' transaction-scoped locks stay far below the lock table.
CREATE TEMP TABLE group_status (shape text, status text, n bigint);
DO $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT * FROM shape ORDER BY shape LOOP
        FOR lo IN 1..s.n BY 100 LOOP
            INSERT INTO group_status
            SELECT s.shape, r.status, count(*)
              FROM group_act a CROSS JOIN generate_series(1, s.packets + 1) g
             CROSS JOIN LATERAL redpacket.rp_claim(a.aid, 'member-' || g, NULL) r
             WHERE a.shape = s.shape AND a.k BETWEEN lo AND lo + 99
             GROUP BY r.status;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;
SELECT shape, status, sum(n) AS count FROM group_status GROUP BY shape, status ORDER BY shape, status;

-- The amounts in minor units, with their position in the claim order.
CREATE TEMP TABLE group_claim AS
SELECT a.shape, c.activity_id, (c.amount * 100)::bigint AS u,
       row_number() OVER (PARTITION BY c.activity_id ORDER BY c.claim_id) AS pos
FROM group_act a JOIN redpacket.claim c ON c.activity_id = a.aid;

-- Hard bounds, replayed in the order the amounts were drawn: at least one
-- unit, at most twice the mean remaining per packet of the whole activity,
-- a unit left for every later packet, the last takes the rest; every
-- activity pays exactly 200.00 in all its packets.
SELECT g.shape, count(*) AS draws,
       count(*) FILTER (WHERE d.u < 1) AS below_one_unit,
       count(*) FILTER (WHERE d.u * d.p > 2 * d.r) AS above_2x_mean,
       count(*) FILTER (WHERE d.r - d.u < d.p - 1) AS starves_later,
       count(*) FILTER (WHERE d.p = 1 AND d.u <> d.r) AS last_not_rest
FROM group_act g CROSS JOIN LATERAL pg_temp.draws(g.aid) d
GROUP BY g.shape ORDER BY g.shape;

SELECT a.shape,
       count(*) FILTER (WHERE x.total <> 20000 OR x.n <> s.packets) AS not_exact,
       count(*) FILTER (WHERE x.lo = x.hi) AS all_packets_equal
FROM group_act a JOIN shape s USING (shape)
JOIN (SELECT activity_id, sum(u) AS total, count(*) AS n, min(u) AS lo, max(u) AS hi
        FROM group_claim GROUP BY activity_id) x ON x.activity_id = a.aid
GROUP BY a.shape ORDER BY a.shape;

-- Every position in the claim order expects the same amount; tol in yuan.
SELECT s.shape,
       round((7 * s.sd_max / sqrt(s.n::numeric) + s.bias_max) / 100, 2) AS tol,
       count(*) AS positions,
       count(*) FILTER (WHERE abs(p.mean - s.mean) >= 7 * s.sd_max / sqrt(s.n::numeric) + s.bias_max)
           AS positions_off
FROM shape s
JOIN (SELECT shape, pos, avg(u) AS mean FROM group_claim GROUP BY shape, pos) p USING (shape)
GROUP BY s.shape, s.n, s.sd_max, s.bias_max ORDER BY s.shape;

-- One activity's amounts spread as the method on one pool spreads them:
-- the mean of the per-activity sample variances against its expectation;
-- tol relative to it.
SELECT s.shape,
       round(6.5 * 1.05 * s.var_sd / sqrt(s.n::numeric) / s.var_mean, 3) AS rel_tol,
       abs(v.mean_var - s.var_mean) < 6.5 * 1.05 * s.var_sd / sqrt(s.n::numeric) AS spread_ok
FROM shape s
JOIN (SELECT shape, avg(var) AS mean_var
        FROM (SELECT shape, activity_id, var_samp(u) AS var
                FROM group_claim GROUP BY shape, activity_id) x
       GROUP BY shape) v USING (shape)
ORDER BY s.shape;

-- Best luck (手气最佳): the largest packet, the earliest claim of it on a tie;
-- final once every packet is claimed.
SELECT a.shape,
       count(*) FILTER (WHERE b.amount * 100 = x.hi AND b.claim_id = x.first_hi) AS best_is_largest,
       count(*) FILTER (WHERE b.final) AS final,
       count(*) AS activities
FROM group_act a
CROSS JOIN LATERAL redpacket.rp_best_luck(a.aid) b
JOIN (SELECT c.activity_id, max(c.u) AS hi,
             (SELECT min(cl.claim_id) FROM redpacket.claim cl
               WHERE cl.activity_id = c.activity_id
                 AND cl.amount * 100 = max(c.u)) AS first_hi
        FROM group_claim c GROUP BY c.activity_id) x ON x.activity_id = a.aid
GROUP BY a.shape ORDER BY a.shape;

-- A reversed claim was never luck: best luck is the largest claim held.
-- final is false, not NULL, while an activity with no end can still pay;
-- a NULL or unknown activity is an error.
SELECT redpacket.rp_create_activity(1.00, 4, stripes => 1, name => 'best luck') AS bl \gset
SELECT (redpacket.rp_claim(:bl, 'big', 0.50)).claim_id AS big \gset
SELECT status FROM redpacket.rp_claim(:bl, 'small', 0.10);
SELECT user_id, amount, final FROM redpacket.rp_best_luck(:bl);
SELECT redpacket.rp_reverse(:bl, :big, 'sent by mistake') AS reversed;
SELECT user_id, amount, final FROM redpacket.rp_best_luck(:bl);
SELECT pg_temp.err('SELECT * FROM redpacket.rp_best_luck(NULL)') AS null_activity;
SELECT pg_temp.err('SELECT * FROM redpacket.rp_best_luck(-1)') AS unknown_activity;
