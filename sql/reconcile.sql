-- rp_reconcile: one pass over one activity or over those that changed,
-- proving funded - returned - claims = stripe balances and the packet count,
-- recorded in redpacket.reconciliation; incremental (new_claims); a mismatch
-- fails the pass and freezes the activity; expired activities are settled.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(10.00, packets => 10, stripes => 4, name => 'rc') AS a \gset
SELECT status FROM redpacket.rp_claim(:a, 'alice', 1.00);
SELECT status FROM redpacket.rp_claim(:a, 'bob', 1.50);
SELECT status FROM redpacket.rp_claim(:a, 'carol', 0.75);

-- a clean pass
SELECT activity_id = :a AS same_activity, checked_at IS NOT NULL AS checked, full_check,
       expected, actual, drift, expected_packets, actual_packets, expected_claims, actual_claims,
       negative_stripes, new_claims, ok
FROM redpacket.rp_reconcile(:a);
SELECT expected = 10.00 - (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = :a) AS expected_is_remainder
FROM redpacket.reconciliation WHERE activity_id = :a;
SELECT count(*) AS passes, bool_and(ok) AS all_ok FROM redpacket.reconciliation WHERE activity_id = :a;

-- incremental: the next pass reads only the new claims
SELECT status FROM redpacket.rp_claim(:a, 'dave', 0.25);
SELECT status FROM redpacket.rp_claim(:a, 'erin', 0.25);
SELECT new_claims, expected_claims, actual_claims, expected_packets, actual_packets, drift, ok
FROM redpacket.rp_reconcile(:a);
SELECT new_claims, expected_claims, drift, ok FROM redpacket.rp_reconcile(:a);
-- a full check re-sums everything and agrees
SELECT full_check, expected_claims, actual_claims, drift, ok FROM redpacket.rp_reconcile(:a, full_check => true);
SELECT count(*) AS passes, bool_and(ok) AS all_ok FROM redpacket.reconciliation WHERE activity_id = :a;

-- Earlier tests left activities pending (expired ones to settle, some of
-- 1024 stripes).  A transaction keeps the stripe locks of at most 1024
-- stripes it settled or froze, and leaves the rest for the next call: drain
-- them here, one call per transaction.
SET client_min_messages = error;
\set ECHO none
\o /dev/null
SELECT 'SELECT count(*) FROM redpacket.rp_reconcile()' FROM generate_series(1, 30) \gexec
\o
\set ECHO all
RESET client_min_messages;
-- a pass over all: an activity with new claims is in it, and clean
SELECT status FROM redpacket.rp_claim(:a, 'frank', 0.25);
SELECT count(*) FILTER (WHERE activity_id = :a) AS rows_for_a,
       sum(new_claims) FILTER (WHERE activity_id = :a) AS new_claims_for_a,
       bool_and(ok) FILTER (WHERE activity_id = :a) AS ok_for_a
FROM redpacket.rp_reconcile();
-- ... and in the next pass over all, an activity that did not change is not
SELECT count(*) FILTER (WHERE activity_id = :a) AS rows_for_unchanged_a
FROM redpacket.rp_reconcile();
SELECT count(*) FILTER (WHERE activity_id = :a) AS rows_for_a_again
FROM redpacket.rp_reconcile(NULL);

-- an expired activity is settled by a pass: its remainder is returned -------
SELECT redpacket.rp_create_activity(4.00, starts_at => now() - interval '2 hours',
       ends_at => now() - interval '1 hour', stripes => 2, name => 'rc expired') AS e \gset
SELECT expected, actual, drift, ok FROM redpacket.rp_reconcile(:e);
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :e ORDER BY entry_id;
SELECT * FROM pg_temp.books(:e);
SELECT state, claimed_amount, remaining_amount FROM redpacket.activity_status WHERE id = :e;
SELECT redpacket.rp_close_activity(:e) = 0 AS nothing_left_to_close;
SELECT status FROM redpacket.rp_claim(:e, 'alice', 1.00);

-- a mismatch fails the pass and freezes the activity -------------------------
-- (the WARNING it logs names the activity id, so it is not shown here)
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 5
WHERE activity_id = :a AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :a);
RESET session_replication_role;
SET client_min_messages = error;
SELECT expected, actual, drift, ok FROM redpacket.rp_reconcile(:a);
RESET client_min_messages;
SELECT frozen_reason IS NOT NULL AS frozen FROM redpacket.activity WHERE id = :a;
SELECT state, last_reconcile_ok FROM redpacket.activity_status WHERE id = :a;
SELECT status FROM redpacket.rp_claim(:a, 'george', 0.01);
SELECT status FROM redpacket.rp_claim(:a, 'alice', 1.00);
-- put it right, lift the freeze, and the next pass is clean again
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 5
WHERE activity_id = :a AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :a);
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:a);
SELECT drift, ok FROM redpacket.rp_reconcile(:a);
SELECT state, last_reconcile_ok FROM redpacket.activity_status WHERE id = :a;
SELECT status FROM redpacket.rp_claim(:a, 'george', 0.01);

-- a packet count that does not add up fails too
SET session_replication_role = replica;
UPDATE redpacket.stripe SET packets = packets + 1
WHERE activity_id = :a AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :a);
RESET session_replication_role;
SET client_min_messages = error;
SELECT expected_packets, actual_packets, drift, ok FROM redpacket.rp_reconcile(:a);
RESET client_min_messages;
SELECT frozen_reason IS NOT NULL AS frozen FROM redpacket.activity WHERE id = :a;
SET session_replication_role = replica;
UPDATE redpacket.stripe SET packets = packets - 1
WHERE activity_id = :a AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :a);
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:a);
SELECT ok FROM redpacket.rp_reconcile(:a, full_check => true);
SELECT * FROM pg_temp.books(:a);

-- the record of passes: failed ones stay on file
SELECT count(*) FILTER (WHERE NOT ok) AS failed_passes,
       bool_and(ok) FILTER (WHERE pass_id > (SELECT max(pass_id) FROM redpacket.reconciliation
                                              WHERE activity_id = :a AND NOT ok)) AS ok_since
FROM redpacket.reconciliation WHERE activity_id = :a;

-- errors
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_reconcile(%s)', :unknown));

-- tampering behind the extension's back ---------------------------------------
-- A superuser with session_replication_role = replica silences the
-- append-only triggers.  Activity ids are pinned here so that the WARNING a
-- mismatch logs can be shown in full.
SELECT setval('redpacket.activity_id_seq', 990000) AS pinned_ids;
SELECT redpacket.rp_create_activity(10.00, packets => 10, stripes => 2, name => 'rc tamper') AS t \gset
SELECT redpacket.rp_create_activity(10.00, packets => 10, stripes => 2, name => 'rc stripe') AS s \gset
SELECT :t AS t, :s AS s;
SELECT set_config('rp.s', :'s', false) IS NOT NULL AS remembered;
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
FROM unnest(ARRAY['u1', 'u2', 'u3', 'u4']) u, redpacket.rp_claim(:t, u, 1.00);
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
FROM unnest(ARRAY['u1', 'u2']) u, redpacket.rp_claim(:s, u, 1.00);
SELECT new_claims, expected, actual, ok FROM redpacket.rp_reconcile(:t);
SELECT new_claims, expected, actual, ok FROM redpacket.rp_reconcile(:s);

-- without replica role the claim table refuses the delete
SELECT pg_temp.err(format('DELETE FROM redpacket.claim WHERE activity_id = %s AND user_id = %L', :t, 'u1'));
-- an old claim (already counted by a pass) deleted: the incremental pass
-- does not re-read old claims; a full check re-sums them and catches it
CREATE TEMP TABLE gone AS SELECT * FROM redpacket.claim WHERE false;
SET session_replication_role = replica;
WITH d AS (DELETE FROM redpacket.claim WHERE activity_id = :t AND user_id = 'u1' RETURNING *)
INSERT INTO gone SELECT * FROM d;
RESET session_replication_role;
SELECT full_check, expected, actual, drift, expected_packets, actual_packets,
       expected_claims, actual_claims, ok
FROM redpacket.rp_reconcile(:t, full_check => true);
SELECT state, last_reconcile_ok, frozen_reason LIKE 'reconciliation mismatch at pass %' AS reason
FROM redpacket.activity_status WHERE id = :t;
SELECT status FROM redpacket.rp_claim(:t, 'u9', 1.00);
-- later passes, incremental or full, keep failing: the watermark now holds
-- the re-summed claims
SELECT drift, expected_claims, actual_claims, ok FROM redpacket.rp_reconcile(:t);
SELECT drift, expected_claims, actual_claims, ok FROM redpacket.rp_reconcile(:t, full_check => true);
-- the claim put back and the activity unfrozen: clean again, claimable
INSERT INTO redpacket.claim SELECT * FROM gone;
SELECT drift, expected_claims, actual_claims, ok FROM redpacket.rp_reconcile(:t, full_check => true);
SELECT redpacket.rp_unfreeze(:t);
SELECT status FROM redpacket.rp_claim(:t, 'u9', 1.00);
SELECT new_claims, drift, ok FROM redpacket.rp_reconcile(:t);
SELECT * FROM pg_temp.books(:t);

-- a stripe balance changed: incremental passes over all see it.  A pass
-- reads the stripes of one slice of the open activities (about 8192
-- stripes), in turn; this database has more than that, so it takes one of
-- the next few passes.
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 3
WHERE activity_id = :s AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :s);
RESET session_replication_role;
CREATE TEMP TABLE seen_s AS SELECT * FROM redpacket.reconciliation WHERE false;
SET client_min_messages = error;
DO $$
BEGIN
    FOR i IN 1 .. 20 LOOP
        INSERT INTO seen_s SELECT * FROM redpacket.rp_reconcile()
         WHERE activity_id = current_setting('rp.s')::bigint;
        EXIT WHEN FOUND;
    END LOOP;
END $$;
RESET client_min_messages;
SELECT full_check, new_claims, expected, actual, drift, ok FROM seen_s;
SELECT state, last_reconcile_ok FROM redpacket.activity_status WHERE id = :s;
SELECT status FROM redpacket.rp_claim(:s, 'u9', 1.00);
-- the stripe put back and the activity unfrozen: clean again, claimable
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 3
WHERE activity_id = :s AND stripe = (SELECT min(stripe) FROM redpacket.stripe WHERE activity_id = :s);
RESET session_replication_role;
SELECT redpacket.rp_unfreeze(:s);
SELECT drift, ok FROM redpacket.rp_reconcile(:s, full_check => true);
SELECT status FROM redpacket.rp_claim(:s, 'u9', 1.00);
SELECT * FROM pg_temp.books(:s);

-- redpacket.freeze_on_mismatch is on by default and only the server
-- configuration sets it (reload); a session cannot turn it off
SHOW redpacket.freeze_on_mismatch;
SELECT pg_temp.err('SET redpacket.freeze_on_mismatch = off');
SELECT context FROM pg_settings WHERE name = 'redpacket.freeze_on_mismatch';

-- expiry: an activity whose ends_at passes is settled by the next pass, once
SELECT redpacket.rp_create_activity(5.00, packets => 5, stripes => 2,
       ends_at => clock_timestamp() + interval '1 second', name => 'rc expiring') AS x \gset
SELECT status FROM redpacket.rp_claim(:x, 'alice', 1.00);
SELECT status FROM redpacket.rp_claim(:x, 'bob', 0.50);
SELECT expected, actual, ok FROM redpacket.rp_reconcile(:x);
SELECT count(*) AS returns FROM redpacket.ledger WHERE activity_id = :x AND kind = 'return';
SELECT pg_sleep(greatest(0, extract(epoch FROM ends_at - clock_timestamp())) + 0.1) AS waited
FROM redpacket.activity WHERE id = :x;
SELECT expected, actual, drift, ok FROM redpacket.rp_reconcile(:x);
SELECT kind, amount, reason FROM redpacket.ledger WHERE activity_id = :x ORDER BY entry_id;
SELECT closed_at IS NOT NULL AS closed, closed_at >= ends_at AS closed_after_end
FROM redpacket.activity WHERE id = :x;
SELECT sum(balance) AS stripes FROM redpacket.stripe WHERE activity_id = :x;
-- a second pass, a pass over all and a full check change nothing
SELECT expected, actual, ok FROM redpacket.rp_reconcile(:x);
SELECT count(*) FILTER (WHERE activity_id = :x) AS rows_for_x FROM redpacket.rp_reconcile();
SELECT expected, actual, expected_claims, ok FROM redpacket.rp_reconcile(:x, full_check => true);
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :x ORDER BY entry_id;
SELECT * FROM pg_temp.books(:x);
SELECT redpacket.rp_close_activity(:x) AS closed_again_returns;
SELECT count(*) AS returns FROM redpacket.ledger WHERE activity_id = :x AND kind = 'return';
SELECT status FROM redpacket.rp_claim(:x, 'carol', 1.00);
SELECT status, amount FROM redpacket.rp_claim(:x, 'alice', 1.00);
SELECT state, claimed_amount, claimed_count, remaining_amount, last_reconcile_ok
FROM redpacket.activity_status WHERE id = :x;
