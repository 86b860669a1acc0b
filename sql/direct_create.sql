-- rp_create_activity writes its four rows through the executor directly
-- (src/base/insert.c) when the tables allow, and through its SQL statement
-- otherwise; either way the rows are the ones an INSERT would write: column
-- defaults (an administrator's too) filled, every CHECK constraint enforced,
-- triggers fired.  Each creation here sets redpacket.direct_claims itself, so
-- the test means the same when the whole suite runs with the switch off.  The
-- DEBUG1 lines prove which way each creation went.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql
SET redpacket.direct_claims = on;

-- The same activity written both ways: the same rows but for ids and times.
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(20.00, 10, ends_at => now() + interval '1 h',
                                    name => 'both ways') AS d \gset
SELECT :d = currval('redpacket.activity_id_seq') AS id_from_sequence;
SET redpacket.direct_claims = off;
SELECT redpacket.rp_create_activity(20.00, 10, ends_at => now() + interval '1 h',
                                    name => 'both ways') AS s \gset
SET redpacket.direct_claims = on;
RESET client_min_messages;
SELECT count(DISTINCT (name, total, packets, scale, stripes, per_user_limit,
                       ends_at - starts_at, closed_at, frozen_reason, frozen_at,
                       created_at = starts_at, created_by, revision, restricted)) AS activity_shapes
  FROM redpacket.activity WHERE id IN (:d, :s);
SELECT count(DISTINCT (stripe, balance, packets, claims, halted, revision, dealt,
                       dealt_units, dealt_count)) AS stripe_shapes
  FROM redpacket.stripe WHERE activity_id IN (:d, :s);
SELECT count(DISTINCT (kind, amount, reason, created_by, packets)) AS ledger_shapes,
       count(*) AS entries
  FROM redpacket.ledger WHERE activity_id IN (:d, :s);
SELECT count(DISTINCT (last_claim_id, claimed, claim_count, settled, last_pass_at,
                       last_balance, last_packets, last_claims, last_full_check_at,
                       last_settlement_id, reversed, reversed_count, last_entry_id, last_ok)) AS state_shapes,
       count(*) AS states
  FROM redpacket.reconcile_state WHERE activity_id IN (:d, :s);
-- the spread of budget and packets over stripes, and no cap
SELECT redpacket.rp_create_activity(7.00, stripes => 3) AS d3 \gset
SELECT stripe, balance, packets FROM redpacket.stripe WHERE activity_id = :d3 ORDER BY stripe;
SELECT redpacket.rp_create_activity(10.00, 130) AS d130 \gset
SELECT stripe, balance, packets FROM redpacket.stripe WHERE activity_id = :d130 ORDER BY stripe;
SELECT packets FROM redpacket.ledger WHERE activity_id = :d3;
-- claims on what the direct path wrote, and the books of both
SELECT count(*) FROM generate_series(1, 10) g, redpacket.rp_claim(:d, 'u' || g) r
 WHERE r.status = 'claimed';
SELECT * FROM pg_temp.books(:d);
SELECT activity_id = :d AS direct, ok, drift FROM redpacket.rp_reconcile(:d);

-- An administrator's column with a default: filled, on the direct path.
ALTER TABLE redpacket.activity ADD COLUMN region text DEFAULT 'cn';
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(1.00) AS r \gset
RESET client_min_messages;
SELECT region FROM redpacket.activity WHERE id = :r;
ALTER TABLE redpacket.activity DROP COLUMN region;

-- A default that calls a function of the administrator's, replaced later:
-- each creation evaluates today's function, though the planner inlines it.
CREATE FUNCTION public.rp_test_tag() RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'v1' $$;
ALTER TABLE redpacket.reconcile_state ADD COLUMN tag text DEFAULT public.rp_test_tag();
SELECT redpacket.rp_create_activity(1.00) AS t1 \gset
CREATE OR REPLACE FUNCTION public.rp_test_tag() RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'v2' $$;
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(1.00) AS t2 \gset
RESET client_min_messages;
SELECT activity_id = :t1 AS first, tag FROM redpacket.reconcile_state
 WHERE activity_id IN (:t1, :t2) ORDER BY activity_id;
ALTER TABLE redpacket.reconcile_state DROP COLUMN tag;
DROP FUNCTION public.rp_test_tag();

-- CHECK constraints added later (NOT VALID: other tests' rows stay) are
-- enforced on the direct path, in the session that added them and in a
-- transaction that adds one.
\set VERBOSITY terse
ALTER TABLE redpacket.ledger ADD CONSTRAINT rp_test_small CHECK (amount < 1000) NOT VALID;
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(999.00) IS NOT NULL AS created;
SELECT redpacket.rp_create_activity(1000.00);
RESET client_min_messages;
ALTER TABLE redpacket.ledger DROP CONSTRAINT rp_test_small;
BEGIN;
SELECT redpacket.rp_create_activity(500.00, 3) IS NOT NULL AS created;
ALTER TABLE redpacket.activity ADD CONSTRAINT rp_test_few CHECK (packets <= 200) NOT VALID;
SELECT redpacket.rp_create_activity(500.00, 201);
ROLLBACK;
SELECT redpacket.rp_create_activity(500.00, 201) IS NOT NULL AS created_after_rollback;
\set VERBOSITY default

-- A CHECK calling an administrator's IMMUTABLE function, replaced later:
-- each creation checks against today's function, not one folded earlier.
CREATE FUNCTION public.rp_test_cap() RETURNS numeric LANGUAGE sql IMMUTABLE AS $$ SELECT 1000 $$;
ALTER TABLE redpacket.activity ADD CONSTRAINT rp_test_cap CHECK (total <= public.rp_test_cap()) NOT VALID;
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(500.00) IS NOT NULL AS created_under_cap;
RESET client_min_messages;
CREATE OR REPLACE FUNCTION public.rp_test_cap() RETURNS numeric LANGUAGE sql IMMUTABLE AS $$ SELECT 100 $$;
\set VERBOSITY terse
SELECT redpacket.rp_create_activity(500.00);
\set VERBOSITY default
ALTER TABLE redpacket.activity DROP CONSTRAINT rp_test_cap;
DROP FUNCTION public.rp_test_cap();

-- Two CHECKs that both fail: the rows are written in the SQL statement's
-- order, so both paths name the same constraint.
ALTER TABLE redpacket.stripe ADD CONSTRAINT rp_test_no_stripe CHECK (balance < 0) NOT VALID;
ALTER TABLE redpacket.reconcile_state ADD CONSTRAINT rp_test_no_state CHECK (activity_id < 0) NOT VALID;
SELECT pg_temp.err($$SELECT redpacket.rp_create_activity(10.00)$$) AS direct;
SET redpacket.direct_claims = off;
SELECT pg_temp.err($$SELECT redpacket.rp_create_activity(10.00)$$) AS sql_statement;
SET redpacket.direct_claims = on;
ALTER TABLE redpacket.stripe DROP CONSTRAINT rp_test_no_stripe;
ALTER TABLE redpacket.reconcile_state DROP CONSTRAINT rp_test_no_state;

-- A transaction that moves the catalog generation between creations many
-- times keeps no more than the current shapes.
CREATE ROLE regress_rp_shapes;
BEGIN;
DO $$
BEGIN
    FOR i IN 1..200 LOOP
        GRANT SELECT ON redpacket.ledger TO regress_rp_shapes;
        PERFORM redpacket.rp_create_activity(1.00);
        REVOKE SELECT ON redpacket.ledger FROM regress_rp_shapes;
    END LOOP;
END $$;
SELECT count(*) <= 4 AS shapes_bounded FROM pg_backend_memory_contexts
 WHERE name = 'redpacket insert shape';
COMMIT;
DROP ROLE regress_rp_shapes;

-- Code of the administrator's that runs while a table's shape is read (the
-- planner folds a GREATEST of ranges, whose comparison function is theirs)
-- and creates an activity: each creation keeps one shape a table, in
-- transactions that commit one after another too.
CREATE ROLE regress_rp_fold;
CREATE FUNCTION public.rp_test_cmp(int4, int4) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF current_setting('rp_test.cmp', true) = 'armed' THEN
        PERFORM set_config('rp_test.cmp', 'fired', false);
        PERFORM redpacket.rp_create_activity(7.00, name => 'from a comparison');
    END IF;
    RETURN btint4cmp($1, $2);
END $$;
CREATE OPERATOR CLASS public.rp_test_int4_ops FOR TYPE int4 USING btree AS
    OPERATOR 1 <, OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >,
    FUNCTION 1 public.rp_test_cmp(int4, int4);
CREATE TYPE public.rp_test_range AS RANGE (subtype = int4, subtype_opclass = public.rp_test_int4_ops);
ALTER TABLE redpacket.reconcile_state ADD COLUMN span public.rp_test_range
    DEFAULT GREATEST('[1,2)'::public.rp_test_range, '[3,4)'::public.rp_test_range);
SELECT redpacket.rp_create_activity(1.00) IS NOT NULL AS created;
DO $$
BEGIN
    FOR i IN 1..20 LOOP
        GRANT SELECT ON redpacket.ledger TO regress_rp_fold;
        PERFORM set_config('rp_test.cmp', 'armed', false);
        PERFORM redpacket.rp_create_activity(1.00);
        COMMIT;
    END LOOP;
END $$;
SELECT count(*) <= 4 AS shapes_bounded FROM pg_backend_memory_contexts
 WHERE name = 'redpacket insert shape';
SELECT count(*) AS created_from_a_comparison FROM redpacket.activity
 WHERE name = 'from a comparison';
ALTER TABLE redpacket.reconcile_state DROP COLUMN span;
DROP TYPE public.rp_test_range;
DROP OPERATOR CLASS public.rp_test_int4_ops USING btree;
DROP OPERATOR FAMILY public.rp_test_int4_ops USING btree;
DROP FUNCTION public.rp_test_cmp(int4, int4);
REVOKE SELECT ON redpacket.ledger FROM regress_rp_fold;
DROP ROLE regress_rp_fold;

-- A column INSERT may not set (GENERATED ALWAYS AS IDENTITY): the SQL
-- statement runs and gives INSERT's own error.
ALTER TABLE redpacket.stripe ALTER COLUMN stripe ADD GENERATED ALWAYS AS IDENTITY;
SET client_min_messages = debug1;
SELECT pg_temp.err($$SELECT redpacket.rp_create_activity(1.00)$$);
RESET client_min_messages;
ALTER TABLE redpacket.stripe ALTER COLUMN stripe DROP IDENTITY;

-- A creation inside a creation: a default whose function changes a grant
-- (which moves our catalog generation) and creates an activity of its own.
-- The outer creation finishes on the table shape it started with.
CREATE ROLE regress_rp_nested;
CREATE FUNCTION public.rp_test_nested() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('rp_test.nested', true) IS DISTINCT FROM 'armed' THEN
        RETURN 'inner';
    END IF;
    PERFORM set_config('rp_test.nested', 'fired', false);
    GRANT SELECT ON redpacket.ledger TO regress_rp_nested;
    PERFORM redpacket.rp_create_activity(3.00, 2, name => 'inner');
    RETURN 'outer';
END $$;
ALTER TABLE redpacket.reconcile_state ADD COLUMN tag text;
ALTER TABLE redpacket.reconcile_state ALTER COLUMN tag SET DEFAULT public.rp_test_nested();
SET rp_test.nested = 'armed';
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(4.00, 2, name => 'outer') AS outer_id \gset
RESET client_min_messages;
SELECT current_setting('rp_test.nested') AS nested;
SELECT a.name, r.tag FROM redpacket.reconcile_state r JOIN redpacket.activity a ON a.id = r.activity_id
 WHERE a.id >= :outer_id - 1 AND a.name IN ('inner', 'outer') ORDER BY a.name;
ALTER TABLE redpacket.reconcile_state DROP COLUMN tag;
DROP FUNCTION public.rp_test_nested();
REVOKE SELECT ON redpacket.ledger FROM regress_rp_nested;
DROP ROLE regress_rp_nested;
SELECT a.name, a.total, count(s.*) AS stripes, sum(s.balance) AS balance
  FROM redpacket.activity a JOIN redpacket.stripe s ON s.activity_id = a.id
 WHERE a.id >= :outer_id - 1 AND a.name IN ('inner', 'outer')
 GROUP BY a.name, a.total ORDER BY a.name;

-- A trigger on one of the four tables: the SQL statement runs, and fires it.
CREATE FUNCTION public.rp_test_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger saw stripe % of a new activity', NEW.stripe;
    RETURN NEW;
END $$;
CREATE TRIGGER rp_test_seen BEFORE INSERT ON redpacket.stripe
    FOR EACH ROW EXECUTE FUNCTION public.rp_test_seen();
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(2.00, stripes => 2) IS NOT NULL AS created;
RESET client_min_messages;
DROP TRIGGER rp_test_seen ON redpacket.stripe;
DROP FUNCTION public.rp_test_seen();
SET client_min_messages = debug1;
SELECT redpacket.rp_create_activity(2.00, stripes => 2) IS NOT NULL AS created;
RESET client_min_messages;

-- A read-only transaction gets the SQL's error.
BEGIN READ ONLY;
SELECT pg_temp.err($$SELECT redpacket.rp_create_activity(1.00)$$);
ROLLBACK;

-- Every activity of this test reconciles.
SELECT count(*) AS activities, bool_and(r.ok) AS all_ok
  FROM redpacket.activity a, redpacket.rp_reconcile(a.id, true) r
 WHERE a.id >= :d;
