-- Getting a frozen activity back into service.  rp_unfreeze lifts an
-- operator's hold on books that balance as before; an activity the
-- reconciler froze, or whose last check failed, is unfrozen only when a
-- full check passes at that moment (55000 naming the failed check
-- otherwise).  rp_repair_stripes rebuilds the stripes of a frozen, open
-- activity from its ledger and claims, records who did it and why
-- (activity_change, kind repair), ends with a full check that must pass,
-- and leaves the activity frozen until rp_unfreeze.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- An error's SQLSTATE, message and detail, activity ids masked.
CREATE FUNCTION pg_temp.refusal(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    d text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
    RETURN regexp_replace(SQLSTATE || ': ' || SQLERRM || coalesce(E'\nDETAIL: ' || nullif(d, ''), ''),
                          'activity -?[0-9]+', 'activity N', 'g');
END $$;

-- What a session with superuser rights can do behind the extension's back.
CREATE FUNCTION pg_temp.tamper(q text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL session_replication_role = replica;
    EXECUTE q;
    SET LOCAL session_replication_role = origin;
END $$;

-- The reconciler's warnings name activity ids; the checks below show what
-- matters.
SET client_min_messages = error;

-- An operator's hold on books that balance: unfreeze as before, no check.
SELECT redpacket.rp_create_activity(100.00, 20, stripes => 4, name => 'healthy') AS h \gset
SELECT pg_temp.claim(:h, 'u' || g, 1.00) FROM generate_series(1, 3) g;
SELECT redpacket.rp_freeze(:h, 'campaign paused');
SELECT redpacket.rp_unfreeze(:h);
SELECT frozen_reason IS NULL AS unfrozen,
       (SELECT count(*) FROM redpacket.reconciliation WHERE activity_id = :h) AS checks
  FROM redpacket.activity WHERE id = :h;

-- A stripe changed behind the back: the reconciler freezes the activity,
-- and rp_unfreeze refuses while the books do not balance.
SELECT redpacket.rp_create_activity(100.00, 20, stripes => 4, name => 'stripe') AS a \gset
SELECT pg_temp.claim(:a, 'u' || g, 1.00) FROM generate_series(1, 5) g;
SELECT pg_temp.tamper(format('UPDATE redpacket.stripe SET balance = balance - 5 WHERE activity_id = %s AND stripe = 1', :a));
SELECT ok, problems FROM redpacket.rp_reconcile(:a);
SELECT frozen_reason LIKE 'reconciliation mismatch%' AS frozen_by_the_reconciler
  FROM redpacket.activity WHERE id = :a;
SELECT pg_temp.refusal(format('SELECT redpacket.rp_unfreeze(%s)', :a));
SELECT state FROM redpacket.activity_status WHERE id = :a;
SELECT pg_temp.claim(:a, 'newcomer', 1.00);

-- An operator's hold whose last check failed (the reconciler did not
-- replace the operator's reason): rp_unfreeze needs a full check too.
SELECT redpacket.rp_create_activity(50.00, stripes => 2, name => 'held') AS o \gset
SELECT pg_temp.claim(:o, 'u1', 2.00);
SELECT redpacket.rp_freeze(:o, 'fraud review');
SELECT pg_temp.tamper(format('UPDATE redpacket.stripe SET balance = balance + 100 WHERE activity_id = %s AND stripe = 0', :o));
SELECT ok, problems FROM redpacket.rp_reconcile(:o);
SELECT frozen_reason FROM redpacket.activity WHERE id = :o;
SELECT pg_temp.refusal(format('SELECT redpacket.rp_unfreeze(%s)', :o));

-- Bad input, and activities the repair refuses.
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'open') AS live \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'closed') AS shut \gset
SELECT redpacket.rp_freeze(:shut, 'before close');
SELECT redpacket.rp_close_activity(:shut) AS returned;
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset
SELECT pg_temp.refusal('SELECT redpacket.rp_repair_stripes(NULL, ''why'')');
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, NULL)', :a));
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, '''')', :a));
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, ''why'')', :unknown));
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, ''why'')', :live));
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, ''why'')', :shut));
-- Both read the books after their locks: READ COMMITTED only.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, ''why'')', :a));
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.refusal(format('SELECT redpacket.rp_unfreeze(%s)', :a));
ROLLBACK;

-- The repair: the stripes are rebuilt from the ledger and the claims, the
-- full check passes, the change is recorded, the activity stays frozen.
SELECT activity_id = :a AS same, full_check, ok, expected, actual, expected_packets,
       actual_packets, expected_claims, actual_claims, problems
  FROM redpacket.rp_repair_stripes(:a, 'stripe 1 edited by hand; ledger and claims verified');
SELECT * FROM pg_temp.books(:a);
SELECT stripe, balance, packets, halted, dealt, dealt_units, dealt_count,
       revision = (SELECT revision FROM redpacket.activity WHERE id = :a) AS revision
  FROM redpacket.stripe WHERE activity_id = :a ORDER BY stripe;
-- each stripe counts the claims whose stripe it is
SELECT sum(claims) AS claims,
       bool_and(claims = (SELECT count(*) FROM redpacket.claim c
                           WHERE c.activity_id = s.activity_id AND c.stripe = s.stripe)) AS own_claims
  FROM redpacket.stripe s WHERE activity_id = :a;
SELECT kind, changed_by = session_user AS by_me, reason,
       before - 'stripes' AS before, after - 'stripes' AS after,
       jsonb_array_length(before -> 'stripes') AS stripes_changed
  FROM redpacket.activity_change WHERE activity_id = :a AND kind = 'repair';
-- the reconciler's freeze is recorded beside it
SELECT count(*) AS freezes FROM redpacket.activity_change
 WHERE activity_id = :a AND kind = 'freeze' AND changed_by IS NOT NULL;
SELECT state FROM redpacket.activity_status WHERE id = :a;
SELECT pg_temp.claim(:a, 'newcomer', 1.00);
SELECT redpacket.rp_unfreeze(:a);
SELECT pg_temp.claim(:a, 'newcomer', 1.00);
SELECT ok FROM redpacket.rp_reconcile(:a);
SELECT * FROM pg_temp.books(:a);

-- The operator's hold too: repaired, it unfreezes.
SELECT ok FROM redpacket.rp_repair_stripes(:o, 'balance inflated by hand');
SELECT redpacket.rp_unfreeze(:o);
SELECT * FROM pg_temp.books(:o);

-- A claim row that vanished, one forged for 0.07 more (so the money is off
-- whatever the draw paid), packets and counters changed, a lucky draw's
-- dealt amounts made up: the repair trusts the claim rows and the ledger,
-- and clears what was dealt.
SELECT redpacket.rp_create_activity(30.00, 30, stripes => 3, name => 'lucky') AS l \gset
SELECT count(*) FROM generate_series(1, 6) g, LATERAL pg_temp.claim(:l, 'u' || g) c WHERE c LIKE 'claimed%';
SELECT pg_temp.tamper(format($q$
    WITH gone AS (DELETE FROM redpacket.claim WHERE activity_id = %1$s AND user_id = 'u2' RETURNING amount)
    INSERT INTO redpacket.claim (activity_id, user_id, idempotency_key, amount, stripe, claimed_at)
    SELECT %1$s, 'forger', '', amount + 0.07, 2, now() FROM gone;
    UPDATE redpacket.stripe SET packets = packets + 3, claims = claims + 1 WHERE activity_id = %1$s AND stripe = 0;
    UPDATE redpacket.stripe SET dealt = '{5,7}', dealt_units = 12, dealt_count = 2 WHERE activity_id = %1$s AND stripe = 1;
$q$, :l));
SELECT ok, problems FROM redpacket.rp_reconcile(:l, true);
SELECT ok, expected_claims, actual_claims, expected_packets, actual_packets
  FROM redpacket.rp_repair_stripes(:l, 'claim rows edited by hand');
SELECT claims, balanced FROM pg_temp.books(:l);
SELECT sum(claims) AS claims, sum(packets) AS packets, count(dealt) AS dealt,
       sum(dealt_units) AS dealt_units, sum(dealt_count) AS dealt_count,
       bool_and(claims = (SELECT count(*) FROM redpacket.claim c
                           WHERE c.activity_id = s.activity_id AND c.stripe = s.stripe)) AS own_claims
  FROM redpacket.stripe s WHERE activity_id = :l;
SELECT redpacket.rp_unfreeze(:l);
SELECT count(*) FROM generate_series(7, 12) g, LATERAL pg_temp.claim(:l, 'u' || g) c WHERE c LIKE 'claimed%';
SELECT ok FROM redpacket.rp_reconcile(:l, true);

-- Claims of more than was funded cannot be repaired: nothing is written.
SELECT redpacket.rp_create_activity(5.00, stripes => 2, name => 'oversold') AS x \gset
SELECT pg_temp.claim(:x, 'u1', 4.00);
SELECT pg_temp.tamper(format($q$
    INSERT INTO redpacket.claim (activity_id, user_id, idempotency_key, amount, stripe, claimed_at)
    VALUES (%s, 'forger', '', 3.00, 0, now())$q$, :x));
SELECT ok, problems FROM redpacket.rp_reconcile(:x);
SELECT pg_temp.refusal(format('SELECT redpacket.rp_repair_stripes(%s, ''why'')', :x));
SELECT count(*) AS changes FROM redpacket.activity_change WHERE activity_id = :x AND kind = 'repair';
SELECT sum(balance) AS balance FROM redpacket.stripe WHERE activity_id = :x;
-- with the forged row gone, the books come right again
SELECT pg_temp.tamper(format('DELETE FROM redpacket.claim WHERE activity_id = %s AND user_id = ''forger''', :x));
SELECT ok FROM redpacket.rp_reconcile(:x, true);
SELECT redpacket.rp_unfreeze(:x);

-- A stripe whose revision was changed by hand: a claim that needs it ends
-- with an error instead of reading the activity again until a timeout; the
-- repair rebuilds the revision and claims pay again.
SELECT redpacket.rp_create_activity(4.00, 4, stripes => 1) AS r \gset
SELECT pg_temp.tamper(format('UPDATE redpacket.stripe SET revision = revision + 7 WHERE activity_id = %s', :r));
SET statement_timeout = '20s';
SELECT pg_temp.refusal(format('SELECT redpacket.rp_claim(%s, ''u1'', 1.00)', :r));
SELECT pg_temp.refusal(format('SELECT redpacket.rp_claim_batch(%s, ARRAY[''u2''], ARRAY[1.00])', :r));
RESET statement_timeout;
SELECT redpacket.rp_freeze(:r, 'stripe revision edited by hand');
SELECT ok FROM redpacket.rp_repair_stripes(:r, 'revision rebuilt');
SELECT redpacket.rp_unfreeze(:r);
SELECT status, amount FROM redpacket.rp_claim(:r, 'u1', 1.00);

-- The operator role gets rp_repair_stripes from rp_grant_operator, the
-- application role does not.
CREATE ROLE regress_rp_repair_ops;
CREATE ROLE regress_rp_repair_app;
SELECT redpacket.rp_grant_operator('regress_rp_repair_ops');
SELECT redpacket.rp_grant_app('regress_rp_repair_app');
SELECT has_function_privilege('regress_rp_repair_ops', 'redpacket.rp_repair_stripes(bigint, text)', 'EXECUTE') AS ops,
       has_function_privilege('regress_rp_repair_app', 'redpacket.rp_repair_stripes(bigint, text)', 'EXECUTE') AS app;
DROP OWNED BY regress_rp_repair_ops, regress_rp_repair_app;
DROP ROLE regress_rp_repair_ops, regress_rp_repair_app;
RESET client_min_messages;
