-- What goes back to a funder (a withdrawal, the remainder returned at close,
-- a claim reversed after settlement) is owed until the wallet acknowledges
-- paying it back, once: rp_pending_refunds lists it, rp_refunded records it.
SET client_min_messages = warning;
-- an error as its SQLSTATE and message, the activity ids as N
CREATE FUNCTION pg_temp.try(q text) RETURNS TABLE (code text, message text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN QUERY SELECT 'ok', NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    RETURN QUERY SELECT code, regexp_replace(regexp_replace(message, 'activity [0-9]+', 'activity N', 'g'),
                                             'entry [0-9]+', 'entry E', 'g');
END $$;
-- the pending refunds of an activity, without ids and times
CREATE FUNCTION pg_temp.owed(a bigint) RETURNS TABLE (funder text, kind text, amount numeric)
LANGUAGE sql AS $$
    SELECT p.funder, p.kind, p.amount FROM redpacket.rp_pending_refunds(a) p
$$;

SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, split => 'equal', funder => 'alice') AS a \gset
SELECT redpacket.rp_create_activity(5.00, 5, funder => 'bob') AS b \gset
SELECT * FROM pg_temp.owed(:a);
-- a withdrawal is owed back at once
SELECT redpacket.rp_create_activity(3.00, 3, split => 'caller', funder => 'carol') AS c \gset
SELECT redpacket.rp_withdraw(:c, 1.00, 'less');
SELECT * FROM pg_temp.owed(:c);
-- claims, then the close returns the rest: owed back
SELECT (redpacket.rp_claim(:a, 'u' || g)).status FROM generate_series(1, 3) g;
SELECT redpacket.rp_close_activity(:a);
SELECT * FROM pg_temp.owed(:a);
-- a claim reversed after the close is refunded to the funder: owed back too
SELECT redpacket.rp_reverse(:a, (SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = :a), 'fraud');
SELECT * FROM pg_temp.owed(:a);
-- an activity emptied by its claims returns nothing: nothing owed
SELECT (redpacket.rp_claim(:b, 'v' || g, 1.00)).status FROM generate_series(1, 5) g;
SELECT redpacket.rp_close_activity(:b);
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :b ORDER BY entry_id;
SELECT * FROM pg_temp.owed(:b);
-- every activity's, oldest first
SELECT activity_id = :c AS of_c, funder, kind, amount
  FROM redpacket.rp_pending_refunds() WHERE activity_id IN (:a, :b, :c);

-- acknowledged: all or nothing, once
SELECT array_agg(entry_id ORDER BY entry_id) AS owed_a FROM redpacket.rp_pending_refunds(:a) \gset
SELECT entry_id AS fund_a FROM redpacket.ledger WHERE activity_id = :a AND kind = 'fund' \gset
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_refunded(%s, %L::bigint[] || %s::bigint)',
                                 :a, :'owed_a', :fund_a));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_refunded(%s, %L::bigint[])', :b, :'owed_a'));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_refunded(%s, ARRAY[NULL]::bigint[])', :a));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_refunded(NULL, %L::bigint[])', :'owed_a'));
SELECT count(*) AS still_owed FROM redpacket.rp_pending_refunds(:a);
SELECT redpacket.rp_refunded(:a, :'owed_a'::bigint[] || :'owed_a'::bigint[], 'payout-7') AS refunded;
SELECT redpacket.rp_refunded(:a, :'owed_a'::bigint[], 'payout-8') AS again;
SELECT redpacket.rp_refunded(:a, '{}') AS nothing;
SELECT * FROM pg_temp.owed(:a);
SELECT activity_id = :a AS of_a, funder, amount FROM redpacket.rp_refunds('payout-7');
SELECT count(*) AS none FROM redpacket.rp_refunds('payout-8');
SELECT * FROM pg_temp.try('SELECT redpacket.rp_refunds(NULL)');
SELECT refunded_by = session_user AS by_me, reference FROM redpacket.refund WHERE activity_id = :a;

-- only the functions change the rows
SELECT * FROM pg_temp.try(format('UPDATE redpacket.refund SET refunded_at = NULL, refunded_by = NULL, reference = NULL WHERE activity_id = %s', :a));
SELECT * FROM pg_temp.try(format('DELETE FROM redpacket.refund WHERE activity_id = %s', :c));
SELECT * FROM pg_temp.try('TRUNCATE redpacket.refund');

-- and the checks report a row missing, or one that owes nothing
SELECT ok, problems FROM redpacket.rp_reconcile(:c, true);
SET session_replication_role = replica;
DELETE FROM redpacket.refund WHERE activity_id = :c;
RESET session_replication_role;
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_verify(:c);
RESET client_min_messages;
WITH l AS (SELECT activity_id, entry_id FROM redpacket.ledger WHERE activity_id = :c AND kind = 'withdraw')
INSERT INTO redpacket.refund (activity_id, entry_id) SELECT activity_id, entry_id FROM l;
SELECT ok, problems FROM redpacket.rp_verify(:c);
INSERT INTO redpacket.refund (activity_id, entry_id)
SELECT activity_id, entry_id FROM redpacket.ledger WHERE activity_id = :c AND kind = 'fund';
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_verify(:c);
RESET client_min_messages;
SELECT count(*) AS owed_c FROM redpacket.rp_pending_refunds(:c);
SET session_replication_role = replica;
DELETE FROM redpacket.refund r USING redpacket.ledger l
 WHERE r.activity_id = :c AND l.activity_id = r.activity_id AND l.entry_id = r.entry_id AND l.kind = 'fund';
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:c);

-- the wallet lists and acknowledges; an application does neither
CREATE ROLE regress_rp_refund_wallet;
CREATE ROLE regress_rp_refund_app;
SELECT redpacket.rp_grant_wallet('regress_rp_refund_wallet');
SELECT redpacket.rp_grant_app('regress_rp_refund_app');
SELECT array_agg(entry_id) AS owed_w FROM redpacket.ledger WHERE activity_id = :c AND kind = 'withdraw' \gset
SET ROLE regress_rp_refund_app;
SELECT * FROM pg_temp.try(format('SELECT * FROM redpacket.rp_pending_refunds(%s)', :c));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_refunded(%s, %L)', :c, :'owed_w'));
SET ROLE regress_rp_refund_wallet;
SELECT funder, kind, amount FROM redpacket.rp_pending_refunds(:c) WHERE kind = 'withdraw';
SELECT redpacket.rp_refunded(:c, :'owed_w', 'w-1') AS refunded;
SELECT * FROM pg_temp.try('SELECT * FROM redpacket.refund');
RESET ROLE;
DROP OWNED BY regress_rp_refund_wallet, regress_rp_refund_app;
DROP ROLE regress_rp_refund_wallet, regress_rp_refund_app;
