-- Lucky draws (amount NULL): every packet is drawn, each at least one minor
-- unit and at most twice the mean remaining per packet of the whole
-- activity, whatever its stripe count, never so much that a later packet
-- could get less than one unit; all packets sum to the total exactly; after
-- the last packet, exhausted.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- Fund an activity with packets, draw every packet, then try once more, and
-- check the draws, replayed in the order they were drawn (pg_temp.draws):
-- before the k-th draw of an activity of B units in P packets, R = B minus
-- what was drawn before it and P - k packets remain.
CREATE FUNCTION pg_temp.lucky(total numeric, npackets integer, nstripes integer, nscale integer DEFAULT 2)
RETURNS TABLE (stripes_ok boolean, drawn bigint, not_claimed bigint, after_last text,
               sum_exact boolean, min_one_unit boolean, whole_units boolean,
               within_double_mean boolean, leaves_a_unit_each boolean,
               stripes_empty boolean, balanced boolean)
LANGUAGE plpgsql AS $$
DECLARE
    aid bigint;
    unit numeric := 10::numeric ^ nscale;
BEGIN
    aid := redpacket.rp_create_activity(total, packets => npackets, stripes => nstripes, scale => nscale);
    stripes_ok := (SELECT a.stripes BETWEEN 1 AND nstripes FROM redpacket.activity a WHERE a.id = aid);
    SELECT count(*) FILTER (WHERE r.status = 'claimed'), count(*) FILTER (WHERE r.status <> 'claimed')
      INTO drawn, not_claimed
      FROM generate_series(1, npackets) g
      CROSS JOIN LATERAL redpacket.rp_claim(aid, 'user-' || g, NULL) r;
    SELECT r1.status || ', ' || r2.status || ', ' || r3.status INTO after_last
      FROM redpacket.rp_claim(aid, 'late-1', NULL) r1,
           redpacket.rp_claim(aid, 'late-2', 1 / unit) r2,
           redpacket.rp_claim(aid, 'user-1', NULL) r3;
    SELECT sum(d.u) = total * unit,
           min(d.u) >= 1,
           bool_and(d.u = trunc(d.u)),
           bool_and(d.u * d.p <= 2 * d.r),
           bool_and(d.u <= d.r - (d.p - 1))
      INTO sum_exact, min_one_unit, whole_units, within_double_mean, leaves_a_unit_each
      FROM pg_temp.draws(aid) d;
    stripes_empty := (SELECT bool_and(s.balance = 0 AND s.packets = 0)
                      FROM redpacket.stripe s WHERE s.activity_id = aid);
    balanced := (SELECT coalesce(sum(cl.amount), 0) = total FROM redpacket.claim cl WHERE cl.activity_id = aid)
                AND (SELECT sum(le.amount) FILTER (WHERE le.kind = 'fund') = total
                       AND count(*) FILTER (WHERE le.kind = 'return') = 0
                     FROM redpacket.ledger le WHERE le.activity_id = aid);
    RETURN NEXT;
END $$;

SELECT v.total, v.packets, v.stripes, v.scale, l.*
FROM (VALUES (100.00, 10, 1, 2),
             (100.00, 10, 4, 2),
             (100.00, 1000, 16, 2),
             (100.00, 37, 1024, 2),
             (200.00, 500, 64, 2),
             (88.88, 1, 1, 2),
             (88.88, 1, 16, 2),
             (1.00, 100, 1, 2),
             (1.00, 100, 16, 2),
             (0.10, 10, 3, 2),
             (0.11, 10, 3, 2),
             (5, 3, 2, 0),
             (1000000, 7, 3, 0),
             (1.2345, 7, 2, 4),
             (0.0007, 7, 7, 4),
             (92233720368547758.07, 5, 2, 2)) v(total, packets, stripes, scale),
     pg_temp.lucky(v.total, v.packets, v.stripes, v.scale) l
ORDER BY v.scale, v.total, v.packets, v.stripes;

-- Total = packets minor units: every packet is exactly one unit.
SELECT redpacket.rp_create_activity(0.50, packets => 50, stripes => 8) AS exact \gset
SELECT r.status, r.amount, count(*)
FROM generate_series(1, 51) g CROSS JOIN LATERAL redpacket.rp_claim(:exact, 'u' || g) r
GROUP BY r.status, r.amount ORDER BY r.status;

-- One packet takes the whole total.
SELECT redpacket.rp_create_activity(66.66, packets => 1, stripes => 4) AS one \gset
SELECT status, amount = 66.66 AS whole_total FROM redpacket.rp_claim(:one, 'alice');
SELECT status FROM redpacket.rp_claim(:one, 'bob');
SELECT status, amount = 66.66 AS same_claim FROM redpacket.rp_claim(:one, 'alice');

-- The draws are random, not a fixed split: amounts vary, and two identical
-- activities do not draw the same sequence.
SELECT redpacket.rp_create_activity(100.00, packets => 100, stripes => 1) AS r1 \gset
SELECT redpacket.rp_create_activity(100.00, packets => 100, stripes => 1) AS r2 \gset
SELECT count(*) FILTER (WHERE x.status = 'claimed') AS drawn_1,
       count(*) FILTER (WHERE y.status = 'claimed') AS drawn_2,
       count(DISTINCT x.amount) > 10 AS amounts_vary,
       count(*) FILTER (WHERE x.amount <> y.amount) > 0 AS sequences_differ
FROM generate_series(1, 100) g
CROSS JOIN LATERAL redpacket.rp_claim(:r1, 'u' || g) x
CROSS JOIN LATERAL redpacket.rp_claim(:r2, 'u' || g) y;

-- A lucky draw in a rolled-back transaction returns its packet.
SELECT redpacket.rp_create_activity(1.00, packets => 2, stripes => 1) AS rb \gset
BEGIN;
SELECT status FROM redpacket.rp_claim(:rb, 'alice');
SELECT status FROM redpacket.rp_claim(:rb, 'bob');
SELECT status FROM redpacket.rp_claim(:rb, 'carol');
ROLLBACK;
SELECT sum(balance) AS units, sum(packets) AS packets FROM redpacket.stripe WHERE activity_id = :rb;
SELECT status FROM redpacket.rp_claim(:rb, 'carol');
SELECT status FROM redpacket.rp_claim(:rb, 'dave');
SELECT count(*), sum(amount) FROM redpacket.claim WHERE activity_id = :rb;
