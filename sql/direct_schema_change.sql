-- Schema changes a superuser/DBA can make to redpacket.claim after
-- which the direct path (src/claim/direct.c) must still write what the fast path's
-- SQL statement writes (or refuse as it refuses).  Each claim below runs on
-- the path the instance is configured for (direct by default; test/run_all.sh
-- reruns with redpacket.direct_claims = off); the expected output is the SQL
-- statement's behaviour.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql
\set VERBOSITY terse

-- 1. A column typmod: amount declared numeric(20,4) (every scale fits; the
-- rows of earlier tests get their own scale back afterwards).  The SQL INSERT coerces to the column's type
-- and refuses a value that does not fit (22003); nothing may store
-- 10^16 in a numeric(20,4) column (a dump of such a row cannot be restored).
SELECT redpacket.rp_create_activity(20000000000000000.00, stripes => 1) AS t \gset
ALTER TABLE redpacket.claim ALTER COLUMN amount TYPE numeric(20,4);
SELECT status FROM redpacket.rp_claim(:t, 'typmod1', 10000000000000000.00);
SELECT count(*) AS rows_over_typmod FROM redpacket.claim
 WHERE activity_id = :t AND amount >= 10000000000000000;
CREATE FUNCTION pg_temp.rescale(a bigint, v numeric) RETURNS numeric LANGUAGE sql
    AS $$ SELECT round(v, (SELECT scale FROM redpacket.activity WHERE id = a)) $$;
ALTER TABLE redpacket.claim ALTER COLUMN amount TYPE numeric
    USING pg_temp.rescale(activity_id, amount);

-- 2. A child table of claim (table inheritance; say, claims imported from a
-- legacy system).  The SQL statement's duplicate check reads redpacket.claim
-- with its children, as every other query of the extension does: a user
-- whose claim is in the child has claimed and gets "duplicate", not a second
-- payment.
SELECT redpacket.rp_create_activity(100.00, stripes => 1) AS h \gset
CREATE TABLE public.claim_legacy () INHERITS (redpacket.claim);
INSERT INTO public.claim_legacy (activity_id, user_id, idempotency_key, amount, stripe, claimed_at)
VALUES (:h, 'legacy1', '', 5.00, 0, now());
SELECT status, amount FROM redpacket.rp_claim(:h, 'legacy1', 5.00);
SELECT count(*) AS claims_of_legacy1 FROM redpacket.claim
 WHERE activity_id = :h AND user_id = 'legacy1';
DROP TABLE public.claim_legacy;

-- 3. claim attached as a partition of a DBA's partitioned table.  An SQL
-- INSERT into a partition checks the partition constraint (23514); a row
-- outside its bounds would be invisible through the parent.
SELECT redpacket.rp_create_activity(100.00, stripes => 1) AS p \gset
CREATE TABLE public.claims_all (LIKE redpacket.claim) PARTITION BY RANGE (activity_id);
ALTER TABLE public.claims_all ATTACH PARTITION redpacket.claim FOR VALUES FROM (MINVALUE) TO (:p);
SELECT status FROM redpacket.rp_claim(:p, 'part1', 1.00);
SELECT count(*) AS outside_bounds FROM redpacket.claim WHERE activity_id >= :p;
ALTER TABLE public.claims_all DETACH PARTITION redpacket.claim;
DROP TABLE public.claims_all;

-- 4. An identity column GENERATED ALWAYS where the claim sets a value (the
-- stripe it was paid from).  INSERT refuses a value for one (428C9); the
-- claim is not written with the value set behind the identity's back.
SELECT redpacket.rp_create_activity(100.00, stripes => 1) AS g \gset
ALTER TABLE redpacket.claim ALTER COLUMN stripe ADD GENERATED ALWAYS AS IDENTITY;
SELECT pg_temp.err(format($$SELECT status FROM redpacket.rp_claim(%s, 'ident1', 1.00)$$, :g)) AS refused;
SELECT count(*) AS claims_written FROM redpacket.claim WHERE activity_id = :g;
ALTER TABLE redpacket.claim ALTER COLUMN stripe DROP IDENTITY;
SELECT status FROM redpacket.rp_claim(:g, 'ident1', 1.00);
\set VERBOSITY default
