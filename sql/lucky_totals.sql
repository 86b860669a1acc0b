-- A lucky draw is refused only when the activity has no money or no packet
-- left, wherever the stripes keep them.  Funding 3.00 in 3 packets on 3
-- stripes, then claiming 0.50 and 2.40, leaves 0.10 and one packet, often
-- on different stripes (which ones depends on where the claims start, so
-- each case is tried on several activities).  The last packet is then drawn
-- by rp_claim and by rp_claim_batch alike: it gets all of the 0.10, and the
-- next draw is exhausted.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

CREATE FUNCTION pg_temp.last_packet(via text)
RETURNS TABLE (fixed text, left_over text, split boolean, draw text, after text, balanced boolean)
LANGUAGE plpgsql AS $$
DECLARE
    aid bigint;
BEGIN
    aid := redpacket.rp_create_activity(3.00, packets => 3, stripes => 3);
    fixed := (redpacket.rp_claim(aid, 'f1', 0.50)).status || ', '
          || (redpacket.rp_claim(aid, 'f2', 2.40)).status;
    SELECT sum(s.balance) * 0.01 || ' in ' || sum(s.packets) || ' packet',
           NOT bool_or(s.balance > 0 AND s.packets > 0)
      INTO left_over, split
      FROM redpacket.stripe s WHERE s.activity_id = aid;
    IF via = 'rp_claim' THEN
        SELECT r.status || ' ' || coalesce(r.amount::text, '-') INTO draw
          FROM redpacket.rp_claim(aid, 'lucky', NULL) r;
        after := (redpacket.rp_claim(aid, 'late', NULL)).status;
    ELSE
        SELECT string_agg(r.status || ' ' || coalesce(r.amount::text, '-'), ', ' ORDER BY r.ord)
          INTO draw
          FROM redpacket.rp_claim_batch(aid, ARRAY['lucky'], ARRAY[NULL]::numeric[]) r;
        after := (SELECT r.status FROM redpacket.rp_claim_batch(aid, ARRAY['late']) r);
    END IF;
    balanced := (SELECT b.balanced FROM pg_temp.books(aid) b);
    RETURN NEXT;
END $$;

-- every case draws the 0.10
SELECT via, fixed, left_over, draw, after, balanced, count(*) AS activities
  FROM (VALUES ('rp_claim'), ('rp_claim_batch')) v(via)
  CROSS JOIN generate_series(1, 6) g
  CROSS JOIN LATERAL pg_temp.last_packet(v.via)
 GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6;

-- the same, in one batch: a lucky draw after fixed amounts in the same call
SELECT r.ord, r.status, r.amount
  FROM (SELECT redpacket.rp_create_activity(3.00, packets => 3, stripes => 3) AS aid) a
  CROSS JOIN LATERAL redpacket.rp_claim_batch(a.aid, ARRAY['f1', 'f2', 'lucky', 'late'],
                                              ARRAY[0.50, 2.40, NULL, NULL]) r
 ORDER BY r.ord;
