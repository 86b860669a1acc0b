-- The books of every activity, one row each: the invariant every test
-- checks after claims, top-ups, withdrawals, closes and reconciliation.
-- Shared by the regression helpers (sql/include/helpers.sql), the TAP tests
-- (test/perl/RedpacketTest.pm) and the stress run (test/stress/check.sql);
-- it creates the temporary view rp_books in the session that runs it.
--
--   total          what the activity was created with (activity.total),
--                  which the ledger's funding entry must equal
--   packets        the packet cap today: activity.packets (the cap at
--                  creation) plus the packets of the top-ups; NULL without a cap
--   funded         today's funded total: the ledger's funding plus its
--                  top-ups less its withdrawals (topped_up, withdrawn)
--   claimed        the sum of the claims, n_claims how many
--   remaining      the stripes' balances, in the activity's currency
--   returned       what went back to the funder at close or expiry, and
--                  refunds (ledger)
--   packets_left   the stripes' packets (NULL without a packet cap; settlement
--                  zeroes them when the activity is closed)
--   stripe_claims  the stripes' claim counters, which must equal n_claims
--   negative       stripes with a negative balance or packet count
--   whole          every claim is a whole number of minor units
--   balanced       all of it adds up:
--                  the funding = total, funded = claimed + remaining +
--                  returned, the counts agree (packets - n_claims =
--                  packets_left while open), nothing negative, every
--                  amount whole
CREATE TEMP VIEW rp_books AS
SELECT a.id, a.name, a.total, a.packets + l.added_packets AS packets, a.per_user_limit, a.scale,
       l.funded, l.returned, c.claimed, c.n_claims,
       st.balance / 10::numeric ^ a.scale AS remaining,
       st.packets_left, st.stripe_claims, st.negative, c.whole,
       l.topped_up, l.withdrawn,
       l.fund = a.total
         AND l.funded = c.claimed + st.balance / 10::numeric ^ a.scale + l.returned
         AND c.n_claims = st.stripe_claims
         AND st.negative = 0
         AND c.whole
         AND (a.packets IS NULL OR a.packets + l.added_packets - c.n_claims = st.packets_left
              OR (a.closed_at IS NOT NULL AND st.packets_left = 0
                  AND c.n_claims <= a.packets + l.added_packets)) AS balanced
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT count(*) AS n_claims, coalesce(sum(k.amount), 0) AS claimed,
           coalesce(bool_and(k.amount * 10::numeric ^ a.scale
                             = trunc(k.amount * 10::numeric ^ a.scale)), true) AS whole
    FROM redpacket.claim k WHERE k.activity_id = a.id) c
CROSS JOIN LATERAL (
    SELECT coalesce(sum(s.balance), 0)::numeric AS balance, sum(s.packets) AS packets_left,
           coalesce(sum(s.claims), 0) AS stripe_claims,
           count(*) FILTER (WHERE s.balance < 0 OR s.packets < 0) AS negative
    FROM redpacket.stripe s WHERE s.activity_id = a.id) st
CROSS JOIN LATERAL (
    SELECT f.fund, f.topped_up, f.withdrawn, f.fund + f.topped_up - f.withdrawn AS funded,
           f.returned, f.added_packets
    FROM (SELECT coalesce(sum(g.amount) FILTER (WHERE g.kind = 'fund'), 0) AS fund,
                 coalesce(sum(g.amount) FILTER (WHERE g.kind = 'top_up'), 0) AS topped_up,
                 coalesce(sum(g.amount) FILTER (WHERE g.kind = 'withdraw'), 0) AS withdrawn,
                 coalesce(sum(g.amount) FILTER (WHERE g.kind IN ('return', 'refund')), 0) AS returned,
                 coalesce(sum(g.packets) FILTER (WHERE g.kind = 'top_up'), 0) AS added_packets
          FROM redpacket.ledger g WHERE g.activity_id = a.id) f) l;
