-- No false exhaustion: draining a budget in fixed steps yields exactly the
-- claims the whole budget (all stripes together) can cover, then the exact
-- remainder, then exhausted, for any stripe count, with and without packets.
-- 100.00 claimed 0.07 at a time gives 1428 claims and leaves 0.04.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- Fund an activity, claim `step` `tries` times (one user each), then one
-- claim per amount in `after`; report the status counts and the books.
CREATE FUNCTION pg_temp.drain(total numeric, step numeric, tries integer, nstripes integer,
                              npackets integer DEFAULT NULL, after numeric[] DEFAULT '{}')
RETURNS TABLE (stripes_ok boolean, claimed bigint, exhausted bigint, other bigint,
               amounts_ok boolean, after_statuses text, claims bigint, claimed_sum numeric,
               remaining numeric, remaining_packets numeric, balanced boolean)
LANGUAGE plpgsql AS $$
DECLARE
    aid bigint;
BEGIN
    aid := redpacket.rp_create_activity(total, packets => npackets, stripes => nstripes);
    stripes_ok := (SELECT a.stripes BETWEEN 1 AND nstripes FROM redpacket.activity a WHERE a.id = aid);
    SELECT count(*) FILTER (WHERE r.status = 'claimed'),
           count(*) FILTER (WHERE r.status = 'exhausted'),
           count(*) FILTER (WHERE r.status NOT IN ('claimed', 'exhausted')),
           coalesce(bool_and(r.amount = step) FILTER (WHERE r.status = 'claimed'), true)
      INTO claimed, exhausted, other, amounts_ok
      FROM generate_series(1, tries) g
      CROSS JOIN LATERAL redpacket.rp_claim(aid, 'user-' || g, step) r;
    SELECT string_agg(r.status || ' ' || x.amt, ', ' ORDER BY x.i)
      INTO after_statuses
      FROM unnest(after) WITH ORDINALITY x(amt, i)
      CROSS JOIN LATERAL redpacket.rp_claim(aid, 'after-' || x.i, x.amt) r;
    SELECT b.claims, b.claimed, b.remaining, b.remaining_packets, b.balanced
      INTO claims, claimed_sum, remaining, remaining_packets, balanced
      FROM pg_temp.books(aid) b;
    RETURN NEXT;
END $$;

-- 100.00 by 0.07 over 1, 2, 3, 16, 64 and 1024 stripes.
SELECT s AS stripes, d.*
FROM unnest(ARRAY[1, 2, 3, 16, 64, 1024]) s,
     pg_temp.drain(100.00, 0.07, 1430, s, after => '{0.07,0.05,0.04,0.01}') d
ORDER BY s;

-- With packets: more packets than the budget covers (budget runs out),
-- exactly one more than 1428 (the 0.04 takes the last packet), exactly 1428
-- (0.04 is left but no packet), and fewer (packets run out first).
SELECT s AS stripes, p AS packets, d.*
FROM (VALUES (3, 5000), (16, 1429), (1024, 1429), (64, 1428), (1024, 1000)) v(s, p),
     pg_temp.drain(100.00, 0.07, 1430, s, p, '{0.04,0.01}') d
ORDER BY p DESC, s;

-- Steps that leave a remainder spread thinly over many stripes.
SELECT t AS total, st AS step, s AS stripes, d.*
FROM (VALUES (1.00, 0.33, 64), (1.00, 0.33, 1024), (10.00, 0.99, 1024), (100.00, 3.00, 37),
             (0.07, 0.07, 16), (100.00, 100.00, 1024), (100.00, 50.01, 1024)) v(t, st, s),
     pg_temp.drain(t, st, 40, s, after => '{0.01}') d
ORDER BY t, st, s;

-- The same drain with every claim its own transaction.
SET synchronous_commit = off;
CREATE PROCEDURE pg_temp.drain_committing(aid bigint, step numeric, tries integer)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..tries LOOP
        PERFORM redpacket.rp_claim(aid, 'user-' || i, step);
        COMMIT;
    END LOOP;
END $$;
SELECT redpacket.rp_create_activity(100.00, stripes => 16) AS c16 \gset
CALL pg_temp.drain_committing(:c16, 0.07, 1430);
SELECT * FROM pg_temp.books(:c16);
SELECT status FROM redpacket.rp_claim(:c16, 'last-1', 0.07);
SELECT status FROM redpacket.rp_claim(:c16, 'last-2', 0.05);
SELECT status FROM redpacket.rp_claim(:c16, 'last-3', 0.04);
SELECT status FROM redpacket.rp_claim(:c16, 'last-4', 0.01);
SELECT * FROM pg_temp.books(:c16);
SELECT redpacket.rp_create_activity(100.00, packets => 1429, stripes => 1024) AS c1024 \gset
CALL pg_temp.drain_committing(:c1024, 0.07, 1430);
SELECT status FROM redpacket.rp_claim(:c1024, 'last-1', 0.04);
SELECT status FROM redpacket.rp_claim(:c1024, 'last-2', 0.01);
SELECT * FROM pg_temp.books(:c1024);
RESET synchronous_commit;

-- No stripe ever went below zero in any of these activities.
SELECT count(*) FILTER (WHERE balance < 0 OR packets < 0) AS negative_stripes FROM redpacket.stripe;
