-- redpacket.activity_status: one row per activity with its state
-- (scheduled, active, exhausted, ended, frozen; frozen wins) and its numbers.
SELECT coalesce(max(id), 0) AS before FROM redpacket.activity \gset

SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'sv untouched') AS untouched \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'sv active') AS active \gset
SELECT redpacket.rp_create_activity(10.00, packets => 5, stripes => 2, name => 'sv packets') AS packets \gset
SELECT redpacket.rp_create_activity(1.00, stripes => 4, name => 'sv exhausted budget') AS budget \gset
SELECT redpacket.rp_create_activity(10.00, packets => 2, stripes => 2, name => 'sv exhausted packets') AS nopackets \gset
SELECT redpacket.rp_create_activity(10.00, starts_at => now() + interval '1 hour', stripes => 2,
       name => 'sv scheduled') AS scheduled \gset
SELECT redpacket.rp_create_activity(10.00, starts_at => now() - interval '2 hours',
       ends_at => now() - interval '1 hour', stripes => 2, name => 'sv expired') AS expired \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'sv closed') AS closed \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'sv frozen') AS frozen \gset
SELECT redpacket.rp_create_activity(10.00, starts_at => now() + interval '1 hour', stripes => 2,
       name => 'sv frozen scheduled') AS frozen_scheduled \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'sv frozen closed') AS frozen_closed \gset
SELECT redpacket.rp_create_activity(1.00, stripes => 2, name => 'sv frozen exhausted') AS frozen_exhausted \gset
SELECT redpacket.rp_create_activity(100, scale => 0, stripes => 2, name => 'sv scale 0') AS scale0 \gset
SELECT redpacket.rp_create_activity(1.0000, scale => 4, stripes => 2, name => 'sv scale 4') AS scale4 \gset

SELECT status FROM redpacket.rp_claim(:active, 'alice', 1.25);
SELECT status FROM redpacket.rp_claim(:active, 'bob', 2.50);
SELECT status FROM redpacket.rp_claim(:packets, 'alice', 3.00);
SELECT status FROM redpacket.rp_claim(:packets, 'bob', 0.01);
SELECT status FROM redpacket.rp_claim(:budget, 'alice', 0.40);
SELECT status FROM redpacket.rp_claim(:budget, 'bob', 0.60);
SELECT status FROM redpacket.rp_claim(:nopackets, 'alice', 1.00);
SELECT status FROM redpacket.rp_claim(:nopackets, 'bob', 2.00);
SELECT status FROM redpacket.rp_claim(:closed, 'alice', 4.00);
SELECT redpacket.rp_close_activity(:closed) = 6.00 AS returned_6;
SELECT status FROM redpacket.rp_claim(:frozen, 'alice', 1.00);
SELECT redpacket.rp_freeze(:frozen, 'operator hold');
SELECT redpacket.rp_freeze(:frozen_scheduled, 'operator hold');
SELECT status FROM redpacket.rp_claim(:frozen_closed, 'alice', 1.00);
SELECT redpacket.rp_close_activity(:frozen_closed) = 9.00 AS returned_9;
SELECT redpacket.rp_freeze(:frozen_closed, 'after close');
SELECT status FROM redpacket.rp_claim(:frozen_exhausted, 'alice', 1.00);
SELECT redpacket.rp_freeze(:frozen_exhausted, 'after drain');
SELECT status FROM redpacket.rp_claim(:scale0, 'alice', 7);
SELECT status FROM redpacket.rp_claim(:scale4, 'alice', 0.1234);

SELECT name, state, scale, total, claimed_amount, claimed_count, remaining_amount,
       remaining_packets, stripes, frozen_reason
FROM redpacket.activity_status WHERE id > :before ORDER BY id;

-- The numbers agree with the tables underneath.
SELECT count(*) AS activities,
       bool_and(v.claimed_amount = coalesce(c.s, 0)) AS claimed_amount_ok,
       bool_and(v.claimed_count = coalesce(c.n, 0)) AS claimed_count_ok,
       bool_and(v.remaining_amount = s.b / 10::numeric ^ v.scale) AS remaining_ok,
       bool_and(v.claimed_amount + v.remaining_amount + coalesce(l.ret, 0) = v.total) AS balanced,
       bool_and(v.stripes = a.stripes AND v.starts_at = a.starts_at
                AND v.ends_at IS NOT DISTINCT FROM a.ends_at) AS schedule_ok
FROM redpacket.activity_status v
JOIN redpacket.activity a ON a.id = v.id
LEFT JOIN (SELECT activity_id, sum(amount) AS s, count(*) AS n FROM redpacket.claim GROUP BY 1) c ON c.activity_id = v.id
LEFT JOIN (SELECT activity_id, sum(balance)::numeric AS b FROM redpacket.stripe GROUP BY 1) s ON s.activity_id = v.id
LEFT JOIN (SELECT activity_id, sum(amount) FILTER (WHERE kind = 'return') AS ret FROM redpacket.ledger GROUP BY 1) l ON l.activity_id = v.id
WHERE v.id > :before;

-- Unfreezing shows the state underneath again.
SELECT redpacket.rp_unfreeze(:frozen);
SELECT redpacket.rp_unfreeze(:frozen_scheduled);
SELECT redpacket.rp_unfreeze(:frozen_closed);
SELECT redpacket.rp_unfreeze(:frozen_exhausted);
SELECT name, state, frozen_reason FROM redpacket.activity_status
WHERE id IN (:frozen, :frozen_scheduled, :frozen_closed, :frozen_exhausted) ORDER BY id;

-- A rolled-back claim does not show.
BEGIN;
SELECT status FROM redpacket.rp_claim(:untouched, 'alice', 10.00);
SELECT state, claimed_amount, remaining_amount FROM redpacket.activity_status WHERE id = :untouched;
ROLLBACK;
SELECT state, claimed_amount, claimed_count, remaining_amount FROM redpacket.activity_status WHERE id = :untouched;

-- Reconciliation shows up: never reconciled, then reconciled and ok.
SELECT last_reconciled_at IS NULL AS never, last_reconcile_ok FROM redpacket.activity_status WHERE id = :active;
SELECT ok, drift FROM redpacket.rp_reconcile(:active);
SELECT last_reconciled_at IS NOT NULL AS reconciled, last_reconcile_ok FROM redpacket.activity_status WHERE id = :active;
