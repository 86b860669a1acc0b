-- The identities of 1.4: a top-up and a withdrawal are ledger entries, and
-- funded + top-ups - withdrawals - returned - refunds - live claims =
-- stripe balances; the packet cap is the activity's packets plus the
-- top-ups' packets; a reversed claim (redpacket.claim_settlement,
-- rp_reverse) is no longer live; what was
-- dealt to a stripe adds up (full checks).  Each change is made here the
-- way the functions that make it change the tables, and each tampered one
-- the way a superuser could behind the extension's back.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'top up') AS a \gset
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
FROM generate_series(1, 3) g, redpacket.rp_claim(:a, 'u' || g, 1.00);
SELECT ok FROM redpacket.rp_reconcile(:a);

-- a top-up of 5.00 and 5 packets, spread over the stripes, as rp_top_up does
BEGIN;
INSERT INTO redpacket.ledger (activity_id, kind, amount, packets, reason)
VALUES (:a, 'top_up', 5.00, 5, 'more');
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 250, packets = packets + CASE stripe WHEN 0 THEN 3 ELSE 2 END
WHERE activity_id = :a;
RESET session_replication_role;
COMMIT;
-- the pass over all sees the new entry, and the books balance with it
SELECT new_claims, expected, actual, expected_packets, actual_packets, ok
FROM redpacket.rp_reconcile() WHERE activity_id = :a;
-- a withdrawal of 2.00, as rp_withdraw does (owed to the funder: a refund row)
BEGIN;
WITH l AS (INSERT INTO redpacket.ledger (activity_id, kind, amount, reason)
           VALUES (:a, 'withdraw', 2.00, 'less') RETURNING activity_id, entry_id)
INSERT INTO redpacket.refund (activity_id, entry_id) SELECT activity_id, entry_id FROM l;
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 200 WHERE activity_id = :a AND stripe = 0;
RESET session_replication_role;
COMMIT;
SELECT expected, actual, expected_packets, ok FROM redpacket.rp_reconcile() WHERE activity_id = :a;
SELECT expected, actual, expected_packets, ok FROM redpacket.rp_reconcile(:a, true);
-- settled, the return is what was funded and not claimed or withdrawn
SELECT redpacket.rp_close_activity(:a) AS returned;
SELECT expected, actual, expected_packets, actual_packets, ok, problems
FROM redpacket.rp_reconcile(:a, true);

-- A top-up entry forged behind the extension's back: money that is not on
-- any stripe.  The next pass over all sees the new entry and fails.
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'forged top up') AS f \gset
SELECT ok FROM redpacket.rp_reconcile(:f);
SET session_replication_role = replica;
INSERT INTO redpacket.ledger (activity_id, kind, amount, packets, reason)
VALUES (:f, 'top_up', 3.00, 3, 'forged');
RESET session_replication_role;
SET client_min_messages = error;
SELECT expected, actual, drift, expected_packets, actual_packets, ok, problems
FROM redpacket.rp_reconcile() WHERE activity_id = :f;
RESET client_min_messages;
SELECT state FROM redpacket.activity_status WHERE id = :f;
-- the forged entry removed, unfrozen: clean again
SET session_replication_role = replica;
DELETE FROM redpacket.ledger WHERE activity_id = :f AND kind = 'top_up';
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:f);
SELECT ok FROM redpacket.rp_reconcile(:f, true);

-- A withdrawal's amount changed behind the extension's back: an old entry,
-- which passes over what changed do not re-read; a full check does.
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'changed withdrawal') AS w \gset
BEGIN;
WITH l AS (INSERT INTO redpacket.ledger (activity_id, kind, amount, reason)
           VALUES (:w, 'withdraw', 1.00, 'less') RETURNING activity_id, entry_id)
INSERT INTO redpacket.refund (activity_id, entry_id) SELECT activity_id, entry_id FROM l;
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 100 WHERE activity_id = :w AND stripe = 0;
RESET session_replication_role;
COMMIT;
SELECT ok FROM redpacket.rp_reconcile(:w);
SET session_replication_role = replica;
UPDATE redpacket.ledger SET amount = 0.50 WHERE activity_id = :w AND kind = 'withdraw';
RESET session_replication_role;
SELECT count(*) FILTER (WHERE activity_id = :w) AS listed FROM redpacket.rp_reconcile();
SET client_min_messages = error;
SELECT full_check, expected, actual, drift, ok, problems FROM redpacket.rp_reconcile(:w, true);
RESET client_min_messages;
SET session_replication_role = replica;
UPDATE redpacket.ledger SET amount = 1.00 WHERE activity_id = :w AND kind = 'withdraw';
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:w);
SELECT ok FROM redpacket.rp_reconcile(:w, true);

-- Reversed claims (redpacket.claim_settlement, rp_reverse): a reversal
-- while the activity is open gives its stripe the money, the packet and the
-- claim back; after settlement it is a refund entry.  Either way the books
-- balance.
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'reversed') AS r \gset
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
FROM generate_series(1, 4) g, redpacket.rp_claim(:r, 'u' || g, 1.00);
SELECT ok FROM redpacket.rp_reconcile(:r);
-- one credited, one reversed while open
SELECT redpacket.rp_credited(:r, array_agg(claim_id), 'paid') AS credited
  FROM redpacket.claim WHERE activity_id = :r AND user_id = 'u1';
SELECT redpacket.rp_reverse(:r, claim_id, 'risk') AS reversed
  FROM redpacket.claim WHERE activity_id = :r AND user_id = 'u2';
SELECT new_claims, expected, actual, expected_packets, actual_packets, expected_claims, actual_claims, ok
FROM redpacket.rp_reconcile() WHERE activity_id = :r;
-- settled, then one more reversed: a refund entry; its stripe counts one claim less
SELECT redpacket.rp_close_activity(:r) AS returned;
SELECT redpacket.rp_reverse(:r, claim_id, 'late') AS refunded
  FROM redpacket.claim WHERE activity_id = :r AND user_id = 'u3';
SELECT expected, actual, expected_packets, actual_packets, expected_claims, actual_claims, ok
FROM redpacket.rp_reconcile(:r);
SELECT expected, actual, expected_claims, actual_claims, ok FROM redpacket.rp_reconcile(:r, true);
-- a reversal forged behind the extension's back (no money back on a stripe)
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 1, name => 'forged reversal') AS v \gset
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
FROM generate_series(1, 2) g, redpacket.rp_claim(:v, 'u' || g, 1.00);
SELECT ok FROM redpacket.rp_reconcile(:v);
INSERT INTO redpacket.claim_settlement (activity_id, claim_id, state, amount, reason)
SELECT :v, claim_id, 'reversed', amount, 'forged' FROM redpacket.claim
 WHERE activity_id = :v AND user_id = 'u1';
SET client_min_messages = error;
SELECT expected, actual, drift, expected_claims, actual_claims, ok, problems
FROM redpacket.rp_reconcile() WHERE activity_id = :v;
RESET client_min_messages;
-- the two activities go with the test (the forged one fails every pass)
SET session_replication_role = replica;
DELETE FROM redpacket.claim_settlement WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.settlement_state WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.settlement_gap WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.reconciliation WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.reconcile_state WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.claim WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.ledger WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.stripe WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.activity_change WHERE activity_id IN (:r, :v);
DELETE FROM redpacket.activity WHERE id IN (:r, :v);
RESET session_replication_role;

-- What was dealt to a stripe (lucky draws drawn ahead): its sum and number
-- are dealt_units and dealt_count, within the stripe's balance and packets.
-- A full check proves it.
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'dealt') AS d \gset
SET session_replication_role = replica;
UPDATE redpacket.stripe SET dealt = '{120, 80}', dealt_units = 200, dealt_count = 2
WHERE activity_id = :d AND stripe = 0;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_reconcile(:d, true);
SET session_replication_role = replica;
UPDATE redpacket.stripe SET dealt_units = 150 WHERE activity_id = :d AND stripe = 0;
RESET session_replication_role;
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_reconcile(:d, true);
RESET client_min_messages;
-- put right (an unfreeze needs books that balance)
SET session_replication_role = replica;
UPDATE redpacket.stripe SET dealt_units = 200 WHERE activity_id = :d AND stripe = 0;
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:d);
SET session_replication_role = replica;
UPDATE redpacket.stripe SET dealt = '{120, 80, 600}', dealt_units = 800, dealt_count = 3
WHERE activity_id = :d AND stripe = 0;
RESET session_replication_role;
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_reconcile(:d, true);
RESET client_min_messages;
SET session_replication_role = replica;
UPDATE redpacket.stripe SET dealt = '{120, 80}', dealt_units = 200, dealt_count = 2
WHERE activity_id = :d AND stripe = 0;
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:d);
-- settlement empties what was dealt with the rest
SELECT redpacket.rp_close_activity(:d) AS returned;
SELECT count(*) FILTER (WHERE dealt IS NOT NULL OR dealt_units <> 0 OR dealt_count <> 0) AS dealt_left
FROM redpacket.stripe WHERE activity_id = :d;
SELECT ok, problems FROM redpacket.rp_reconcile(:d, true);
