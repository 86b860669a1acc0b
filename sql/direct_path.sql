-- The executor-direct fast path of rp_claim (src/claim/direct.c) and when the SPI
-- path is used instead.  Each claim here sets redpacket.direct_claims itself,
-- so the test means the same when the whole suite runs with the switch off
-- (test/run_all.sh does that).  The DEBUG1 line "claim took the direct path"
-- proves the path was taken; without it the test fails, so the direct path
-- cannot silently stop being used.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(100.00, stripes => 2) AS a \gset
-- the switch exists, is on by default, and only a superuser may change it
SELECT boot_val, context FROM pg_settings WHERE name = 'redpacket.direct_claims';

SET redpacket.direct_claims = on;
SET client_min_messages = debug1;
SELECT status, amount FROM redpacket.rp_claim(:a, 'd1', 1.00);
-- a duplicate is found by the direct path's probe and answered by the careful path
SELECT status, amount FROM redpacket.rp_claim(:a, 'd1', 1.00);
SET redpacket.direct_claims = off;
SELECT status, amount FROM redpacket.rp_claim(:a, 'd2', 1.00);
SET redpacket.direct_claims = on;
RESET client_min_messages;

-- Both paths wrote the same shape of row: claimed_at is the transaction
-- start, claim ids come from the sequence, indexes find the rows.
SELECT user_id, request_id, idempotency_key, amount,
       claimed_at <= now() AS claimed_at_ok, claim_id > 0 AS id_ok
FROM redpacket.claim WHERE activity_id = :a ORDER BY claim_id;
SET enable_seqscan = off;
SELECT count(*) AS by_unique_key FROM redpacket.claim
 WHERE activity_id = :a AND user_id IN ('d1', 'd2') AND idempotency_key = '';
SELECT count(*) AS by_primary_key FROM redpacket.claim
 WHERE activity_id = :a AND claim_id > 0;
RESET enable_seqscan;
SELECT * FROM pg_temp.books(:a);

-- Two claims in one transaction: the second sees the first's stripe row.
BEGIN;
SET LOCAL client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'd3', 2.00);
SELECT status FROM redpacket.rp_claim(:a, 'd4', 2.00);
COMMIT;
SELECT sum(balance) AS remaining_units, sum(claims) AS claims FROM redpacket.stripe WHERE activity_id = :a;

-- Lucky draws take the direct path too: on a one-stripe activity the draw is
-- made over the stripe; on a dealing activity the next amount dealt to the
-- stripe is taken; a stripe with nothing dealt is left to the careful path,
-- which deals from the pool.  Either way the amounts add up to the total.
SELECT redpacket.rp_create_activity(10.00, packets => 4) AS l1 \gset
SELECT redpacket.rp_create_activity(10.00, packets => 4, stripes => 2) AS l2 \gset
SELECT status FROM redpacket.rp_claim(:l1, 'l1-0');  -- the careful path remembers the activity
SELECT status FROM redpacket.rp_claim(:l2, 'l2-0');  -- deals from the pool
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:l1, 'l1-1');
SELECT status FROM redpacket.rp_claim(:l2, 'l2-1');
RESET client_min_messages;
SELECT count(*) FROM generate_series(2, 4) g, redpacket.rp_claim(:l1, 'l1-' || g) r
 WHERE r.status = 'claimed';
SELECT count(*) FROM generate_series(2, 4) g, redpacket.rp_claim(:l2, 'l2-' || g) r
 WHERE r.status = 'claimed';
SELECT activity_id = :l1 AS one_stripe, count(*), sum(amount), min(amount) >= 0.01 AS each_a_cent
  FROM redpacket.claim WHERE activity_id IN (:l1, :l2) GROUP BY activity_id ORDER BY 1 DESC;
SELECT sum(balance) AS left, sum(packets) AS packets_left, sum(dealt_count) AS dealt_left
  FROM redpacket.stripe WHERE activity_id IN (:l1, :l2);

-- A user index on claim is maintained by the direct path.
CREATE INDEX claim_by_amount ON redpacket.claim (amount);
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'd5', 7.77);
RESET client_min_messages;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT user_id FROM redpacket.claim WHERE amount = 7.77;
SELECT user_id FROM redpacket.claim WHERE amount = 7.77;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX redpacket.claim_by_amount;

-- CHECK constraints are checked, with the SQL's error, on either path.
ALTER TABLE redpacket.claim ADD CONSTRAINT claim_small CHECK (amount < 50) NOT VALID;
\set VERBOSITY terse
SELECT status FROM redpacket.rp_claim(:a, 'd6', 60.00);
SET redpacket.direct_claims = off;
SELECT status FROM redpacket.rp_claim(:a, 'd6', 60.00);
SET redpacket.direct_claims = on;
\set VERBOSITY default
ALTER TABLE redpacket.claim DROP CONSTRAINT claim_small;
SELECT * FROM pg_temp.books(:a);

-- A user trigger on INSERT into claim (the same-transaction wallet credit of
-- doc/wallet.md): the direct path steps aside, the SQL INSERT fires the trigger,
-- and once the trigger is dropped the direct path is taken again.
CREATE TABLE public.wallet (user_id text PRIMARY KEY, balance numeric NOT NULL);
CREATE FUNCTION public.credit_wallet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.wallet VALUES (NEW.user_id, NEW.amount)
    ON CONFLICT (user_id) DO UPDATE SET balance = wallet.balance + EXCLUDED.balance;
    RETURN NULL;
END $$;
CREATE TABLE public.statement_calls (n int);
CREATE FUNCTION public.count_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.statement_calls VALUES (1);
    RETURN NULL;
END $$;
CREATE TRIGGER credit_wallet AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION public.credit_wallet();
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'w1', 3.00);
RESET client_min_messages;
SELECT * FROM public.wallet;
DROP TRIGGER credit_wallet ON redpacket.claim;
-- a statement-level trigger fires for an SQL INSERT too
CREATE TRIGGER count_statement AFTER INSERT ON redpacket.claim
    FOR EACH STATEMENT EXECUTE FUNCTION public.count_statement();
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'w2', 3.00);
RESET client_min_messages;
SELECT count(*) AS statement_trigger_calls FROM public.statement_calls;
DROP TRIGGER count_statement ON redpacket.claim;
-- an UPDATE trigger on stripe, likewise
CREATE TRIGGER count_statement AFTER UPDATE ON redpacket.stripe
    FOR EACH STATEMENT EXECUTE FUNCTION public.count_statement();
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'w3', 3.00);
RESET client_min_messages;
SELECT count(*) AS statement_trigger_calls FROM public.statement_calls;
DROP TRIGGER count_statement ON redpacket.stripe;
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:a, 'w4', 3.00);
RESET client_min_messages;
SELECT * FROM pg_temp.books(:a);
DROP TABLE public.wallet, public.statement_calls;
DROP FUNCTION public.credit_wallet(), public.count_statement();

-- A read-only transaction (as on a standby) gets the SQL's 25006 on both paths.
\set VERBOSITY terse
BEGIN READ ONLY;
SELECT status FROM redpacket.rp_claim(:a, 'ro', 1.00);
ROLLBACK;
BEGIN READ ONLY;
SET LOCAL redpacket.direct_claims = off;
SELECT status FROM redpacket.rp_claim(:a, 'ro', 1.00);
ROLLBACK;
\set VERBOSITY default

-- An activity with several claims per user always takes the SPI path
-- (the limit check is not in the direct path).
SELECT redpacket.rp_create_activity(10.00, stripes => 1, per_user_limit => 2) AS r \gset
SET client_min_messages = debug1;
SELECT status FROM redpacket.rp_claim(:r, 'x', 1.00, 'r1');
RESET client_min_messages;

-- Only a superuser may flip the switch.
CREATE ROLE regress_direct_path;
SET ROLE regress_direct_path;
SET redpacket.direct_claims = off;
RESET ROLE;
DROP ROLE regress_direct_path;
