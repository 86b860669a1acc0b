-- Settling claims with the wallet: rp_credited (the wallet paid), rp_reverse
-- (the claim is undone), rp_pending_credits (neither yet), rp_grant_wallet.
-- A claim moves once; the claim row never changes; reversed claims leave the
-- books (claims, stripes, packets) as if they had not been made, and their
-- idempotency key stays taken.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql
SET client_min_messages = warning;

-- Run q and show its SQLSTATE and message, activity and claim ids masked;
-- with detail and hint when asked.
CREATE FUNCTION pg_temp.fails(q text, full_text boolean DEFAULT false) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    msg text;
    det text;
    hint text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    msg := regexp_replace(regexp_replace(msg, 'activity -?[0-9]+', 'activity N', 'g'),
                          'claim -?[0-9]+', 'claim N', 'g');
    IF full_text THEN
        msg := msg || E'\nDETAIL: ' || coalesce(det, '') || E'\nHINT: ' || coalesce(hint, '');
    END IF;
    RETURN SQLSTATE || ': ' || msg;
END $$;
-- The ids of an activity's claims at these positions (1 = its first claim).
CREATE FUNCTION pg_temp.ids(aid bigint, VARIADIC pos int[]) RETURNS bigint[] LANGUAGE sql AS $$
SELECT array_agg(c.claim_id ORDER BY p.o)
  FROM unnest(pos) WITH ORDINALITY p(n, o)
  JOIN (SELECT claim_id, row_number() OVER (ORDER BY claim_id) AS n
          FROM redpacket.claim WHERE activity_id = aid) c ON c.n = p.n
$$;
-- The position of a claim among its activity's claims.
CREATE FUNCTION pg_temp.pos(aid bigint, cid bigint) RETURNS bigint LANGUAGE sql AS $$
SELECT count(*) FROM redpacket.claim WHERE activity_id = aid AND claim_id <= cid
$$;
-- Each claim of an activity: its position and how it is settled.
CREATE FUNCTION pg_temp.settled(aid bigint)
RETURNS TABLE (pos bigint, user_id text, amount numeric, state text, reference text, reason text)
LANGUAGE sql AS $$
SELECT row_number() OVER (ORDER BY c.claim_id), c.user_id, c.amount, coalesce(s.state, 'pending'),
       s.reference, s.reason
  FROM redpacket.claim c
  LEFT JOIN redpacket.claim_settlement s USING (activity_id, claim_id)
 WHERE c.activity_id = aid ORDER BY c.claim_id
$$;
-- The pending claims of an activity, by position, oldest first.
CREATE FUNCTION pg_temp.pending(aid bigint, older interval DEFAULT '0')
RETURNS TABLE (pos bigint, user_id text, amount numeric) LANGUAGE sql AS $$
SELECT pg_temp.pos(aid, p.claim_id), p.user_id, p.amount
  FROM redpacket.rp_pending_credits(aid, older) p
$$;
-- Rows written so far to the tables a call could write.
CREATE FUNCTION pg_temp.rows() RETURNS text LANGUAGE sql AS $$
SELECT format('settlements %s, changes %s, ledger %s',
              (SELECT count(*) FROM redpacket.claim_settlement),
              (SELECT count(*) FROM redpacket.activity_change),
              (SELECT count(*) FROM redpacket.ledger))
$$;

-- rp_credited ------------------------------------------------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'credit') AS a \gset
SELECT pg_temp.claim(:a, 'u' || g, 1.00) FROM generate_series(1, 6) g;
-- newly credited claims are counted; already credited ones are skipped
SELECT redpacket.rp_credited(:a, pg_temp.ids(:a, 1, 2), 'batch-1') AS credited;
SELECT redpacket.rp_credited(:a, pg_temp.ids(:a, 1, 2), 'batch-1') AS credited_again;
SELECT redpacket.rp_credited(:a, pg_temp.ids(:a, 2, 3, 1), 'batch-2') AS one_more;
-- an id given twice is one claim
SELECT redpacket.rp_credited(:a, pg_temp.ids(:a, 4, 4, 4)) AS repeated_id;
-- the reference is kept with the first credit; amount and who come along
SELECT * FROM pg_temp.settled(:a);
SELECT count(*) FILTER (WHERE settled_by = session_user) AS by_me,
       count(*) FILTER (WHERE settled_at >= c.claimed_at) AS after_claim,
       count(*) FILTER (WHERE s.amount = c.amount) AS amounts_match
  FROM redpacket.claim_settlement s JOIN redpacket.claim c USING (activity_id, claim_id)
 WHERE activity_id = :a;
-- settlement ids grow with each settlement
SELECT bool_and(prev < settlement_id) AS growing
  FROM (SELECT settlement_id, lag(settlement_id, 1, 0::bigint) OVER (ORDER BY settlement_id) AS prev
          FROM redpacket.claim_settlement WHERE activity_id = :a) s;
-- nothing to credit
SELECT redpacket.rp_credited(:a, '{}') AS empty_list;
-- bad input, nothing written
SELECT redpacket.rp_create_activity(5.00, stripes => 2, name => 'other') AS o \gset
SELECT pg_temp.claim(:o, 'u1', 1.00);
SELECT pg_temp.rows() AS before \gset
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(NULL, %L)', pg_temp.ids(:a, 5)));
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, NULL)', :a));
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, ARRAY[%s, NULL])', :a, (pg_temp.ids(:a, 5))[1]));
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, ARRAY[[%s], [%s]])', :a,
                            (pg_temp.ids(:a, 5))[1], (pg_temp.ids(:a, 6))[1]));
SELECT pg_temp.fails('SELECT redpacket.rp_credited(-1, ARRAY[1::bigint])');
-- an unknown claim, or one of another activity, is an error naming it
-- (P0002): nothing of the call is credited
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, %L)', :a,
                            pg_temp.ids(:a, 5) || pg_temp.ids(:o, 1)), true);
SELECT pg_temp.rows() = :'before' AS nothing_written;

-- rp_reverse while the activity is open ------------------------------------------
SELECT s.stripe AS st, s.balance, s.claims FROM redpacket.stripe s
 WHERE s.activity_id = :a AND s.stripe = (SELECT stripe FROM redpacket.claim
                                          WHERE claim_id = (pg_temp.ids(:a, 5))[1]) \gset before_
SELECT c::text AS claim_row FROM redpacket.claim c WHERE claim_id = (pg_temp.ids(:a, 5))[1] \gset
SELECT redpacket.rp_reverse(:a, (pg_temp.ids(:a, 5))[1], 'risk control: duplicate device') AS reversed;
-- the paying stripe gets its money back and counts one claim less; the
-- claim row is unchanged
SELECT balance - :before_balance AS balance_back, :before_claims - claims AS claims_less
  FROM redpacket.stripe WHERE activity_id = :a AND stripe = :before_st;
SELECT c::text = :'claim_row' AS claim_row_unchanged FROM redpacket.claim c
 WHERE claim_id = (pg_temp.ids(:a, 5))[1];
-- the reversal is a settlement and a change of the activity
SELECT * FROM pg_temp.settled(:a);
SELECT kind, before - 'claim_id' AS before, after - 'claim_id' - 'stripe' AS after, reason,
       (after->>'claim_id')::bigint = (pg_temp.ids(:a, 5))[1] AS names_claim,
       (after->>'stripe')::int = :before_st AS names_stripe, changed_by = session_user AS by_me
  FROM redpacket.activity_change WHERE activity_id = :a;
SELECT * FROM pg_temp.books(:a);
-- the user's idempotency key stays taken: a retry answers duplicate with
-- the original claim, and the money reversed is not paid again
SELECT pg_temp.claim(:a, 'u5', 1.00);
SELECT * FROM pg_temp.books(:a);
-- reversing again returns 0 and writes nothing
SELECT pg_temp.rows() AS before \gset
SELECT redpacket.rp_reverse(:a, (pg_temp.ids(:a, 5))[1], 'again') AS reversed_again;
SELECT pg_temp.rows() = :'before' AS nothing_written;
-- a reversed claim cannot be credited (55000), alone or in a list
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, %L)', :a, pg_temp.ids(:a, 5)));
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, %L)', :a, pg_temp.ids(:a, 6, 5)));
SELECT pg_temp.rows() = :'before' AS nothing_written;
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, %L)', :a, pg_temp.ids(:a, 6, 5)), true);
-- a credited claim cannot be reversed (55000)
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, %L)', :a, (pg_temp.ids(:a, 1))[1], 'too late'), true);
-- bad input
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, NULL)', :a, (pg_temp.ids(:a, 6))[1]));
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, %L)', :a, (pg_temp.ids(:a, 6))[1], ''));
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, NULL, %L)', :a, 'x'));
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(NULL, %s, %L)', (pg_temp.ids(:a, 6))[1], 'x'));
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, %L)', :a, (pg_temp.ids(:o, 1))[1], 'x'));
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, %L)', -1, (pg_temp.ids(:a, 6))[1], 'x'));
SELECT pg_temp.rows() = :'before' AS nothing_written;

-- A lucky draw: a reversed packet goes back to the pool ----------------------------
-- Every packet drawn, one reversed: the pool has that packet and its money
-- again, and the next draw (the last packet) takes exactly what is left,
-- so the live claims still add up to the total.
SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2, name => 'lucky-reverse') AS l \gset
SELECT pg_temp.claim(:l, 'u' || g) FROM generate_series(1, 5) g;
SELECT pg_temp.claim(:l, 'late');
SELECT redpacket.rp_reverse(:l, (pg_temp.ids(:l, 2))[1], 'fraud') = (SELECT amount FROM redpacket.claim WHERE claim_id = (pg_temp.ids(:l, 2))[1]) AS returns_its_amount;
SELECT remaining_amount = (SELECT amount FROM redpacket.claim WHERE claim_id = (pg_temp.ids(:l, 2))[1]) AS pool_has_it,
       remaining_packets FROM redpacket.activity_status WHERE id = :l;
SELECT pg_temp.claim(:l, 'late');
SELECT pg_temp.claim(:l, 'later');
SELECT (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = :l)
       - (SELECT sum(amount) FROM redpacket.claim_settlement WHERE activity_id = :l AND state = 'reversed') AS live_total;
SELECT * FROM pg_temp.books(:l);
-- Reversed while packets are still left: the draws to the end still add up.
SELECT redpacket.rp_create_activity(10.00, 8, stripes => 3, name => 'lucky-midway') AS m \gset
SELECT pg_temp.claim(:m, 'u' || g) FROM generate_series(1, 3) g;
SELECT redpacket.rp_reverse(:m, (pg_temp.ids(:m, 1))[1], 'fraud') > 0 AS reversed;
SELECT redpacket.rp_reverse(:m, (pg_temp.ids(:m, 3))[1], 'fraud') > 0 AS reversed;
SELECT count(*) FILTER (WHERE s LIKE 'claimed%') AS claimed, count(*) FILTER (WHERE s = 'exhausted') AS exhausted
  FROM (SELECT pg_temp.claim(:m, 'v' || g) AS s FROM generate_series(1, 8) g) x;
SELECT (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = :m)
       - (SELECT sum(amount) FROM redpacket.claim_settlement WHERE activity_id = :m AND state = 'reversed') AS live_total;
SELECT * FROM pg_temp.books(:m);

-- rp_reverse after the activity is settled: a refund to the funder -------------------
SELECT redpacket.rp_create_activity(10.00, 4, stripes => 2, name => 'refund') AS r \gset
SELECT pg_temp.claim(:r, 'u' || g, 2.00) FROM generate_series(1, 3) g;
SELECT redpacket.rp_close_activity(:r) AS returned;
SELECT redpacket.rp_reverse(:r, (pg_temp.ids(:r, 2))[1], 'wallet refused: account closed') AS refunded;
SELECT kind, amount, reason FROM redpacket.ledger WHERE activity_id = :r ORDER BY entry_id;
SELECT sum(balance) AS balance, sum(packets) AS packets, sum(claims) AS claims
  FROM redpacket.stripe WHERE activity_id = :r;
SELECT after->>'returned_to' AS returned_to,
       (after->>'entry_id')::bigint = (SELECT entry_id FROM redpacket.ledger WHERE activity_id = :r AND kind = 'refund') AS names_entry
  FROM redpacket.activity_change WHERE activity_id = :r AND kind = 'reverse';
SELECT * FROM pg_temp.books(:r);
SELECT redpacket.rp_reverse(:r, (pg_temp.ids(:r, 2))[1], 'again') AS again;
SELECT count(*) AS refunds FROM redpacket.ledger WHERE activity_id = :r AND kind = 'refund';
SELECT pg_temp.claim(:r, 'u2', 2.00);
-- An expired activity the reconciler has not settled yet is still open: the
-- money goes back to the stripes, and the settlement returns it with the rest.
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'expiring',
                                    starts_at => now() - interval '1 hour',
                                    ends_at => now() + interval '1 day') AS e \gset
SELECT pg_temp.claim(:e, 'u1', 3.00);
SET session_replication_role = replica;
UPDATE redpacket.activity SET ends_at = now() - interval '1 minute' WHERE id = :e;
RESET session_replication_role;
SELECT redpacket.rp_reverse(:e, (pg_temp.ids(:e, 1))[1], 'expired unpaid') AS back_to_budget;
SELECT redpacket.rp_close_activity(:e) AS returned_with_the_rest;
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :e ORDER BY entry_id;
SELECT * FROM pg_temp.books(:e);

-- rp_pending_credits ----------------------------------------------------------------
-- Claims in transactions of their own (their claimed_at differ), credited
-- out of order: pending are the others, oldest first.
SELECT redpacket.rp_create_activity(20.00, stripes => 4, name => 'pending') AS p \gset
SELECT pg_temp.claim(:p, 'p1', 1.00);
SELECT pg_temp.claim(:p, 'p2', 1.00);
SELECT pg_temp.claim(:p, 'p3', 1.00);
SELECT pg_temp.claim(:p, 'p4', 1.00);
SELECT pg_temp.claim(:p, 'p5', 1.00);
SELECT * FROM pg_temp.pending(:p);
SELECT redpacket.rp_credited(:p, pg_temp.ids(:p, 2, 4)) AS credited;
SELECT * FROM pg_temp.pending(:p);
-- the frontier moved to claim 4, past the skipped claims 1 and 3 (gaps)
SELECT pg_temp.pos(:p, settled_through) AS settled_through FROM redpacket.settlement_state WHERE activity_id = :p;
SELECT pg_temp.pos(:p, claim_id) AS gap FROM redpacket.settlement_gap WHERE activity_id = :p ORDER BY 1;
SELECT redpacket.rp_credited(:p, pg_temp.ids(:p, 3)) AS credited;
SELECT redpacket.rp_reverse(:p, (pg_temp.ids(:p, 5))[1], 'fraud') AS reversed;
SELECT * FROM pg_temp.pending(:p);
-- the settled gap is gone, the frontier is at claim 5
SELECT pg_temp.pos(:p, settled_through) AS settled_through FROM redpacket.settlement_state WHERE activity_id = :p;
SELECT pg_temp.pos(:p, claim_id) AS gap FROM redpacket.settlement_gap WHERE activity_id = :p ORDER BY 1;
SELECT pg_temp.claim(:p, 'p6', 1.00);
SELECT * FROM pg_temp.pending(:p);
-- older_than: none of these claims is an hour old
SELECT * FROM pg_temp.pending(:p, '1 hour');
-- NULL: every activity, oldest first (here, those of this test)
SELECT a.name, pg_temp.pos(p.activity_id, p.claim_id) AS pos, p.user_id
  FROM redpacket.rp_pending_credits() p JOIN redpacket.activity a ON a.id = p.activity_id
 WHERE a.id IN (:a, :o, :p) ORDER BY p.claimed_at, p.activity_id, p.claim_id;
SELECT bool_and(claimed_at >= lag) AS oldest_first
  FROM (SELECT claimed_at, lag(claimed_at, 1, '-infinity') OVER () FROM redpacket.rp_pending_credits()) x;
-- the default arguments: all activities, any age
SELECT count(*) = (SELECT count(*) FROM redpacket.claim c WHERE NOT EXISTS
                     (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = c.activity_id AND s.claim_id = c.claim_id))
       AS every_unsettled_claim
  FROM redpacket.rp_pending_credits();
-- bad input
SELECT pg_temp.fails('SELECT * FROM redpacket.rp_pending_credits(-1)');
SELECT pg_temp.fails(format('SELECT * FROM redpacket.rp_pending_credits(%s, NULL)', :p));
SELECT pg_temp.fails(format('SELECT * FROM redpacket.rp_pending_credits(%s, %L)', :p, '-1 second'));
-- a read-only transaction reads the pending claims without moving anything
SELECT pg_temp.claim(:p, 'p7', 1.00);
SELECT redpacket.rp_credited(:p, pg_temp.ids(:p, 7)) AS credited;
BEGIN TRANSACTION READ ONLY;
SELECT * FROM pg_temp.pending(:p);
COMMIT;
SELECT pg_temp.pos(:p, settled_through) AS settled_through FROM redpacket.settlement_state WHERE activity_id = :p;

-- Locks: rp_credited holds the same locks for 10,000 claims as for one ------------
SELECT redpacket.rp_create_activity(1000.00, stripes => 16, name => 'many') AS big \gset
SELECT count(*) AS claimed FROM redpacket.rp_claim_batch(:big, ARRAY(SELECT 'm' || g FROM generate_series(1, 10000) g),
                                                        array_fill(0.01, ARRAY[10000]));
CREATE TEMP TABLE big_ids AS
SELECT array_agg(claim_id ORDER BY claim_id) AS every_id, (array_agg(claim_id ORDER BY claim_id))[1:1] AS one_id
  FROM redpacket.claim WHERE activity_id = :big;
BEGIN;
SELECT redpacket.rp_credited(:big, (SELECT one_id FROM big_ids)) AS credited;
SELECT count(*) AS one_claim_locks FROM pg_locks WHERE pid = pg_backend_pid() \gset
ROLLBACK;
BEGIN;
SELECT redpacket.rp_credited(:big, (SELECT every_id FROM big_ids)) AS credited;
SELECT count(*) = :one_claim_locks AS same_locks, count(*) FILTER (WHERE locktype = 'advisory') AS advisory
  FROM pg_locks WHERE pid = pg_backend_pid();
COMMIT;
SELECT count(*) AS pending FROM redpacket.rp_pending_credits(:big);

-- Append-only --------------------------------------------------------------------
SELECT pg_temp.fails('UPDATE redpacket.claim_settlement SET state = ''credited''');
SELECT pg_temp.fails('DELETE FROM redpacket.claim_settlement');
SELECT pg_temp.fails('TRUNCATE redpacket.claim_settlement');

-- Who may call what ---------------------------------------------------------------
SELECT (pg_temp.ids(:p, 1))[1] AS p1, (pg_temp.ids(:p, 6))[1] AS p6 \gset
CREATE ROLE regress_rp_wallet;
CREATE ROLE regress_rp_ops;
CREATE ROLE regress_rp_claimer;
SELECT redpacket.rp_grant_wallet('regress_rp_wallet');
SELECT redpacket.rp_grant_operator('regress_rp_ops');
SELECT redpacket.rp_grant_app('regress_rp_claimer');
SELECT f, has_function_privilege('regress_rp_wallet', f, 'EXECUTE') AS wallet,
       has_function_privilege('regress_rp_ops', f, 'EXECUTE') AS operator,
       has_function_privilege('regress_rp_claimer', f, 'EXECUTE') AS app,
       has_function_privilege('public', f, 'EXECUTE') AS public
  FROM unnest(ARRAY['redpacket.rp_credited(bigint, bigint[], text)',
                    'redpacket.rp_pending_credits(bigint, interval)',
                    'redpacket.rp_reverse(bigint, bigint, text)',
                    'redpacket.rp_grant_wallet(regrole)']) f;
SELECT t, has_table_privilege('regress_rp_wallet', t, 'SELECT') AS wallet_reads,
       has_table_privilege('regress_rp_wallet', t, 'INSERT,UPDATE,DELETE,TRUNCATE') AS wallet_writes,
       has_table_privilege('regress_rp_ops', t, 'SELECT') AS operator_reads
  FROM unnest(ARRAY['redpacket.claim', 'redpacket.ledger', 'redpacket.activity_change',
                    'redpacket.claim_settlement', 'redpacket.settlement_state',
                    'redpacket.settlement_gap']) t;
SET ROLE regress_rp_wallet;
SELECT redpacket.rp_credited(:p, ARRAY[:p6::bigint], 'wallet-1') AS credited_by_wallet;
SELECT count(*) AS pending_seen_by_wallet FROM redpacket.rp_pending_credits(:p);
SELECT pg_temp.fails(format('SELECT redpacket.rp_reverse(%s, %s, %L)', :p, :p1, 'x'));
RESET ROLE;
SET ROLE regress_rp_ops;
SELECT redpacket.rp_reverse(:p, :p1, 'operator') AS reversed_by_operator;
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, ARRAY[%s::bigint])', :p, :p6));
RESET ROLE;
SET ROLE regress_rp_claimer;
SELECT pg_temp.fails(format('SELECT redpacket.rp_credited(%s, ARRAY[%s::bigint])', :p, :p6));
SELECT pg_temp.fails('SELECT * FROM redpacket.rp_pending_credits()');
RESET ROLE;
SELECT settled_by, state, reference, reason FROM redpacket.claim_settlement
 WHERE activity_id = :p AND claim_id IN (:p1, :p6) ORDER BY claim_id;
DROP OWNED BY regress_rp_wallet, regress_rp_ops, regress_rp_claimer;
DROP ROLE regress_rp_wallet, regress_rp_ops, regress_rp_claimer;

-- Every activity of this test balances, reversed claims counted out ------------------
SELECT name, n_claims, n_reversed, claimed, round(remaining, scale) AS remaining, returned, refunded,
       balanced
  FROM rp_books WHERE id IN (:a, :o, :l, :m, :r, :e, :p, :big) ORDER BY id;
