-- The books of every activity, one row each: the invariant every test
-- checks after claims, closes and reconciliation.  Shared by the regression
-- helpers (test/sql/helpers.sql), the TAP tests (test/perl/RedpacketTest.pm)
-- and the stress run (test/stress/check.sql); it creates the temporary view
-- rp_books in the session that runs it.  A catalog older than 1.4 has no
-- reversals and no ledger packets: rp_reversed and rp_ledger stand in for
-- them (psql's \if, so this runs where psql runs it, as everywhere here).
--
--   funded         the ledger's funding, which must equal total
--   topped_up      top-ups minus withdrawals (ledger), topup_packets the
--                  packets the top-ups added to the cap
--   claimed        the sum of the live claims (those not reversed), n_claims
--                  how many; reversed, n_reversed the reversed ones
--   remaining      the stripes' balances, in the activity's currency
--   returned       what close returned to the funder, and refunded what
--                  reversals after it refunded (ledger)
--   packets_left   the stripes' packets (NULL without a packet cap; settlement
--                  zeroes them when the activity is closed)
--   stripe_claims  the stripes' claim counters, which must equal n_claims
--   negative       stripes with a negative balance or packet count
--   whole          every claim is a whole number of minor units
--   balanced       all of it adds up:
--                  funded = total, funded + topped_up = claimed + remaining
--                  + returned + refunded, the counts agree, nothing negative,
--                  every amount whole
SELECT pg_catalog.to_regclass('redpacket.claim_settlement') IS NOT NULL AS rp_books_14 \gset
\if :rp_books_14
CREATE TEMP VIEW rp_reversed AS
SELECT s.activity_id, s.claim_id FROM redpacket.claim_settlement s WHERE s.state = 'reversed';
CREATE TEMP VIEW rp_ledger AS
SELECT g.activity_id, g.kind, g.amount, g.packets FROM redpacket.ledger g;
\else
CREATE TEMP VIEW rp_reversed AS
SELECT NULL::bigint AS activity_id, NULL::bigint AS claim_id WHERE false;
CREATE TEMP VIEW rp_ledger AS
SELECT g.activity_id, g.kind, g.amount, NULL::integer AS packets FROM redpacket.ledger g;
\endif
CREATE TEMP VIEW rp_books AS
SELECT a.id, a.name, a.total, a.packets, a.per_user_limit, a.scale,
       l.funded, l.topped_up, l.returned, l.refunded, c.claimed, c.n_claims,
       c.reversed, c.n_reversed,
       st.balance / 10::numeric ^ a.scale AS remaining,
       st.packets_left, st.stripe_claims, st.negative, c.whole,
       l.funded = a.total
         AND l.funded + l.topped_up = c.claimed + st.balance / 10::numeric ^ a.scale
                                      + l.returned + l.refunded
         AND c.n_claims = st.stripe_claims
         AND st.negative = 0
         AND c.whole
         AND (a.packets IS NULL OR a.packets + l.topup_packets - c.n_claims = st.packets_left
              OR (a.closed_at IS NOT NULL AND st.packets_left = 0
                  AND c.n_claims <= a.packets + l.topup_packets)) AS balanced
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE NOT r.reversed) AS n_claims,
           coalesce(sum(k.amount) FILTER (WHERE NOT r.reversed), 0) AS claimed,
           count(*) FILTER (WHERE r.reversed) AS n_reversed,
           coalesce(sum(k.amount) FILTER (WHERE r.reversed), 0) AS reversed,
           coalesce(bool_and(k.amount * 10::numeric ^ a.scale
                             = trunc(k.amount * 10::numeric ^ a.scale)), true) AS whole
    FROM redpacket.claim k
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT FROM rp_reversed s
                        WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id) AS reversed) r
    WHERE k.activity_id = a.id) c
CROSS JOIN LATERAL (
    SELECT coalesce(sum(s.balance), 0)::numeric AS balance, sum(s.packets) AS packets_left,
           coalesce(sum(s.claims), 0) AS stripe_claims,
           count(*) FILTER (WHERE s.balance < 0 OR s.packets < 0) AS negative
    FROM redpacket.stripe s WHERE s.activity_id = a.id) st
CROSS JOIN LATERAL (
    SELECT coalesce(sum(g.amount) FILTER (WHERE g.kind = 'fund'), 0) AS funded,
           coalesce(sum(g.amount) FILTER (WHERE g.kind = 'top_up'), 0)
             - coalesce(sum(g.amount) FILTER (WHERE g.kind = 'withdraw'), 0) AS topped_up,
           coalesce(sum(g.packets) FILTER (WHERE g.kind = 'top_up'), 0) AS topup_packets,
           coalesce(sum(g.amount) FILTER (WHERE g.kind = 'return'), 0) AS returned,
           coalesce(sum(g.amount) FILTER (WHERE g.kind = 'refund'), 0) AS refunded
    FROM rp_ledger g WHERE g.activity_id = a.id) l;
