-- Security: what application, operator and unprivileged roles may do, that
-- nothing is executable by PUBLIC, that SECURITY DEFINER functions pin their
-- search_path, that claims, ledger entries and reconciliation records are
-- append-only even for the owner, and that a hostile search_path (shadowing
-- functions, operators, aggregates and tables) changes no outcome of a claim.
-- Roles are cluster-wide, so they carry the regress_ prefix and are dropped at
-- the end.
SET client_min_messages = warning;

-- Run a statement and say how it went: 'ok', or SQLSTATE, message and detail.
-- SECURITY INVOKER, so it runs with the privileges of the current role.
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    det text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(nullif(' (' || det || ')', ' ()'), '');
END $$;

-- The extension's relations and functions, from pg_depend.
CREATE TEMP VIEW rp_rels AS
SELECT c.oid, c.relname, c.relkind
FROM pg_class c
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
 AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redpacket';
CREATE TEMP VIEW rp_funcs AS
SELECT p.oid, p.oid::regprocedure::text AS func, p.prosecdef, p.proconfig
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
 AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redpacket';
GRANT SELECT ON rp_rels, rp_funcs TO PUBLIC;

-- Every write (and read) a role could try on every table of the extension.
-- Run inside a transaction that is rolled back, so that a write that wrongly
-- succeeds is reported but leaves nothing behind.
CREATE FUNCTION pg_temp.table_attempts() RETURNS TABLE (rel name, op text, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    col name;
    q text;
BEGIN
    FOR r IN SELECT oid, relname FROM rp_rels WHERE relkind = 'r' ORDER BY relname LOOP
        SELECT a.attname INTO col FROM pg_attribute a
         WHERE a.attrelid = r.oid AND a.attnum = 1;
        FOREACH q IN ARRAY ARRAY[
            'SELECT count(*) FROM redpacket.%1$I',
            'INSERT INTO redpacket.%1$I DEFAULT VALUES',
            'UPDATE redpacket.%1$I SET %2$I = %2$I',
            'DELETE FROM redpacket.%1$I',
            'TRUNCATE redpacket.%1$I',
            'LOCK TABLE redpacket.%1$I IN ACCESS SHARE MODE'] LOOP
            rel := r.relname;
            op := split_part(q, ' ', 1);
            outcome := pg_temp.try(format(q, r.relname, col));
            RETURN NEXT;
        END LOOP;
    END LOOP;
END $$;

-- Roles ---------------------------------------------------------------------
CREATE ROLE regress_rp_app LOGIN;
CREATE ROLE regress_rp_operator LOGIN;
CREATE ROLE regress_rp_nobody LOGIN;
CREATE ROLE regress_rp_usage LOGIN;
CREATE ROLE regress_rp_hostile LOGIN;
CREATE ROLE regress_rp_sender LOGIN;
SELECT redpacket.rp_grant_app('regress_rp_app');
SELECT redpacket.rp_grant_app('regress_rp_hostile');
SELECT redpacket.rp_grant_operator('regress_rp_operator');
SELECT redpacket.rp_grant_sender('regress_rp_sender');
-- USAGE on the schema alone is not enough to claim.
GRANT USAGE ON SCHEMA redpacket TO regress_rp_usage;

SELECT redpacket.rp_create_activity(100.00, stripes => 4, name => 'security') AS act \gset

-- Nothing for PUBLIC ---------------------------------------------------------
-- No function of the extension is executable by PUBLIC (a NULL proacl would
-- mean the default EXECUTE for PUBLIC; has_function_privilege sees that).
SELECT func, has_function_privilege('public', oid, 'EXECUTE') AS public_execute,
       EXISTS (SELECT 1 FROM aclexplode(coalesce(proacl, acldefault('f', proowner))) x
               WHERE x.grantee = 0) AS public_in_acl
FROM rp_funcs JOIN pg_proc USING (oid) ORDER BY func;
-- Nor any table, view or sequence, nor the schema.
SELECT count(*) AS relations,
       count(*) FILTER (WHERE has_table_privilege('public', oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')
                           OR (relkind = 'S' AND has_sequence_privilege('public', oid, 'USAGE,SELECT,UPDATE')))
           AS public_accessible
FROM rp_rels;
SELECT has_schema_privilege('public', 'redpacket', 'USAGE') AS public_usage,
       has_schema_privilege('public', 'redpacket', 'CREATE') AS public_create;

-- What each role may execute: the application role rp_claim and
-- rp_claim_batch only; the operator the admin functions; the sender what
-- sending a packet takes; nobody the grant helpers (they are for the owner).
SELECT func,
       has_function_privilege('regress_rp_app', oid, 'EXECUTE') AS app,
       has_function_privilege('regress_rp_operator', oid, 'EXECUTE') AS operator,
       has_function_privilege('regress_rp_sender', oid, 'EXECUTE') AS sender,
       has_function_privilege('regress_rp_usage', oid, 'EXECUTE') AS usage_only
FROM rp_funcs ORDER BY func;

-- SECURITY DEFINER functions pin search_path in their definitions, ending
-- in pg_temp, naming no schema that anyone but a superuser may create
-- objects in (claim_search_path attacks the claim functions through it).
SELECT func, prosecdef, cfg AS search_path_setting,
       coalesce(path[array_upper(path, 1)] = 'pg_temp'
                AND NOT EXISTS (SELECT 1 FROM unnest(path) s
                                WHERE s NOT IN ('pg_catalog', 'pg_temp', 'redpacket')), false) AS pinned
FROM rp_funcs
LEFT JOIN LATERAL (SELECT c AS cfg,
                          regexp_split_to_array(substr(c, length('search_path=') + 1), '\s*,\s*') AS path
                   FROM unnest(proconfig) c WHERE c LIKE 'search_path=%') sp ON true
ORDER BY func;
SELECT count(*) AS security_definer_functions,
       string_agg(func, ', ') FILTER (WHERE NOT EXISTS (SELECT 1 FROM unnest(proconfig) c
                                                     WHERE c = 'search_path=pg_catalog, pg_temp')) AS unpinned
FROM rp_funcs WHERE prosecdef;
SELECT has_schema_privilege('public', 'redpacket', 'CREATE') OR has_schema_privilege('public', 'pg_catalog', 'CREATE')
       AS pinned_path_writable_by_public;

-- Application role -----------------------------------------------------------
SET ROLE regress_rp_app;
-- Claiming works.
SELECT status, amount FROM redpacket.rp_claim(:act, 'app-1', 1.00);
SELECT status, amount FROM redpacket.rp_claim(:act, 'app-1', 1.00);
SELECT ord, user_id, status, amount
FROM redpacket.rp_claim_batch(:act, ARRAY['app-2', 'app-3'], ARRAY[0.50, 0.25]);
-- Everything else fails with 42501.
BEGIN;
SELECT * FROM pg_temp.table_attempts();
ROLLBACK;
SELECT fn, pg_temp.try(q) AS outcome
FROM (VALUES
    ('rp_create_activity', 'SELECT redpacket.rp_create_activity(10.00)'),
    ('rp_close_activity', format('SELECT redpacket.rp_close_activity(%s)', :act)),
    ('rp_freeze', format('SELECT redpacket.rp_freeze(%s, %L)', :act, 'app says so')),
    ('rp_unfreeze', format('SELECT redpacket.rp_unfreeze(%s)', :act)),
    ('rp_reconcile()', 'SELECT count(*) FROM redpacket.rp_reconcile()'),
    ('rp_reconcile(id, true)', format('SELECT count(*) FROM redpacket.rp_reconcile(%s, true)', :act)),
    ('rp_grant_app', 'SELECT redpacket.rp_grant_app(''regress_rp_nobody'')'),
    ('rp_grant_operator', 'SELECT redpacket.rp_grant_operator(''regress_rp_app'')'),
    ('activity_status', 'SELECT count(*) FROM redpacket.activity_status'),
    ('nextval', 'SELECT nextval(''redpacket.claim_id_seq'')'),
    ('setval', 'SELECT setval(''redpacket.claim_id_seq'', 1)'),
    ('create in schema', 'CREATE TABLE redpacket.app_table (x int)'),
    ('create function in schema', 'CREATE FUNCTION redpacket.rp_claim(bigint) RETURNS int LANGUAGE sql AS ''SELECT 1''')
) v(fn, q);
RESET ROLE;

-- Roles without the grants ------------------------------------------------------
SET ROLE regress_rp_nobody;
SELECT pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 1.00)', :act, 'nobody-1')) AS no_grants;
RESET ROLE;
SET ROLE regress_rp_usage;
SELECT pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 1.00)', :act, 'usage-1')) AS schema_usage_only;
SELECT pg_temp.try(format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[%L], ARRAY[1.00])', :act, 'usage-2')) AS schema_usage_only_batch;
RESET ROLE;
-- None of them left a claim.
SELECT user_id, amount FROM redpacket.claim WHERE activity_id = :act ORDER BY claim_id;

-- Operator role -----------------------------------------------------------------
SET ROLE regress_rp_operator;
SELECT redpacket.rp_create_activity(5.00, stripes => 2, name => 'operator made') AS op_act \gset
SELECT redpacket.rp_freeze(:op_act, 'operator hold');
SELECT name, state, total, remaining_amount FROM redpacket.activity_status WHERE id = :op_act;
SELECT redpacket.rp_unfreeze(:op_act);
SELECT redpacket.rp_close_activity(:op_act) AS returned;
SELECT activity_id = :op_act AS this_activity, ok FROM redpacket.rp_reconcile(:op_act, true);
SELECT name, state, total, claimed_amount, remaining_amount FROM redpacket.activity_status WHERE id = :op_act;
SELECT user_id, amount FROM redpacket.claim WHERE activity_id = :act ORDER BY claim_id;
-- Reads are allowed, writes are not; claiming is not an operator's business.
BEGIN;
SELECT * FROM pg_temp.table_attempts();
ROLLBACK;
SELECT pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 1.00)', :act, 'operator-1')) AS operator_claim;
SELECT pg_temp.try('SELECT setval(''redpacket.claim_id_seq'', 1)') AS operator_setval;
RESET ROLE;

-- Sender role -------------------------------------------------------------------
-- It sends a packet end to end: creates it, lists and unlists who may claim,
-- tops it up, moves its window, reads it as an application does, closes it.
SET ROLE regress_rp_sender;
SELECT redpacket.rp_create_activity(6.00, 3, stripes => 1, restricted => true, name => 'sender made') AS snd_act \gset
SELECT redpacket.rp_allow(:snd_act, ARRAY['s-1', 's-2']) AS allowed;
SELECT redpacket.rp_disallow(:snd_act, ARRAY['s-2']) AS disallowed;
SELECT redpacket.rp_top_up(:snd_act, 3.00, 1) AS funded;
SELECT redpacket.rp_set_window(:snd_act, now() - interval '1 minute', NULL, 'open now');
RESET ROLE;
SELECT status FROM redpacket.rp_claim(:snd_act, 's-1', 1.00);
SET ROLE regress_rp_sender;
SELECT state, remaining_amount, remaining_packets, total, packets, eligible
  FROM redpacket.rp_activity_info(:snd_act, 's-2');
SELECT user_id, amount, final FROM redpacket.rp_best_luck(:snd_act);
SELECT amount FROM redpacket.rp_user_claims(:snd_act, 's-1');
-- Nothing else: no table, no withdrawal, reversal, freeze, repair or claim.
BEGIN;
SELECT * FROM pg_temp.table_attempts();
ROLLBACK;
SELECT fn, pg_temp.try(q) AS outcome
FROM (VALUES
    ('rp_withdraw', format('SELECT redpacket.rp_withdraw(%s, 1.00)', :snd_act)),
    ('rp_reverse', format('SELECT redpacket.rp_reverse(%s, 1, %L)', :snd_act, 'sender says so')),
    ('rp_freeze', format('SELECT redpacket.rp_freeze(%s, %L)', :snd_act, 'sender says so')),
    ('rp_unfreeze', format('SELECT redpacket.rp_unfreeze(%s)', :snd_act)),
    ('rp_repair_stripes', format('SELECT redpacket.rp_repair_stripes(%s, %L)', :snd_act, 'sender says so')),
    ('rp_reconcile', format('SELECT count(*) FROM redpacket.rp_reconcile(%s, true)', :snd_act)),
    ('rp_claim', format('SELECT redpacket.rp_claim(%s, %L, 1.00)', :snd_act, 's-1')),
    ('rp_credited', format('SELECT redpacket.rp_credited(%s, ARRAY[1]::bigint[])', :snd_act)),
    ('rp_pending_credits', 'SELECT count(*) FROM redpacket.rp_pending_credits()'),
    ('rp_grant_sender', 'SELECT redpacket.rp_grant_sender(''regress_rp_nobody'')'),
    ('activity_status', 'SELECT count(*) FROM redpacket.activity_status')
) v(fn, q);
SELECT redpacket.rp_close_activity(:snd_act) AS returned;
RESET ROLE;
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :snd_act ORDER BY entry_id;

-- Append-only, even for the owner --------------------------------------------------
-- A claim, a ledger entry and a reconciliation record exist, so the row
-- triggers have rows to refuse.
SELECT count(*) > 0 AS has_passes FROM redpacket.rp_reconcile(:act, true);
SELECT (SELECT count(*) FROM redpacket.claim) > 0 AS claims,
       (SELECT count(*) FROM redpacket.ledger) > 0 AS ledger,
       (SELECT count(*) FROM redpacket.reconciliation) > 0 AS reconciliation;
CREATE TEMP TABLE before_counts AS
SELECT (SELECT count(*) FROM redpacket.claim) AS claims,
       (SELECT sum(amount) FROM redpacket.claim) AS claimed,
       (SELECT count(*) FROM redpacket.ledger) AS ledger,
       (SELECT sum(amount) FROM redpacket.ledger) AS ledger_sum,
       (SELECT count(*) FROM redpacket.reconciliation) AS passes;
SELECT current_setting('is_superuser') AS superuser,
       (SELECT relowner::regrole = current_user::regrole FROM pg_class WHERE oid = 'redpacket.claim'::regclass) AS owner;
SELECT t, op, pg_temp.try(format(q, t)) AS outcome
FROM unnest(ARRAY['claim', 'ledger', 'reconciliation']) t,
     (VALUES ('UPDATE', 'UPDATE redpacket.%I SET amount = amount'),
             ('UPDATE WHERE', 'UPDATE redpacket.%I SET activity_id = activity_id WHERE activity_id > 0'),
             ('DELETE', 'DELETE FROM redpacket.%I'),
             ('TRUNCATE', 'TRUNCATE redpacket.%I'),
             ('TRUNCATE CASCADE', 'TRUNCATE redpacket.%I CASCADE')) v(op, q)
WHERE NOT (t = 'reconciliation' AND q LIKE '%amount = amount')
ORDER BY t, op;
-- The same statements directly, to show the whole message.
UPDATE redpacket.reconciliation SET ok = true, drift = 0;
DELETE FROM redpacket.claim WHERE user_id = 'app-1';
TRUNCATE redpacket.ledger;
-- Nothing changed.
SELECT b.claims = (SELECT count(*) FROM redpacket.claim)
       AND b.claimed = (SELECT sum(amount) FROM redpacket.claim)
       AND b.ledger = (SELECT count(*) FROM redpacket.ledger)
       AND b.ledger_sum = (SELECT sum(amount) FROM redpacket.ledger)
       AND b.passes = (SELECT count(*) FROM redpacket.reconciliation) AS unchanged
FROM before_counts b;
-- The triggers are in place on exactly these tables.
SELECT c.relname, t.tgname, t.tgenabled,
       (t.tgtype & 8) <> 0 AS on_delete, (t.tgtype & 16) <> 0 AS on_update, (t.tgtype & 32) <> 0 AS on_truncate
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'redpacket'::regnamespace AND NOT t.tgisinternal
ORDER BY c.relname, t.tgname;

-- The rows only the extension changes: an UPDATE or DELETE by hand (even of
-- no row, even one that changes nothing) and any TRUNCATE are refused, on
-- every table that has the guard; the extension's own changes go through.
SELECT c.relname AS t, op,
       split_part(pg_temp.try(format(q, c.relname, a.attname)), ' (', 1) AS outcome
FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = 1,
     (VALUES ('UPDATE', 'UPDATE redpacket.%I SET %2$I = %2$I'),
             ('UPDATE none', 'UPDATE redpacket.%I SET %2$I = %2$I WHERE false'),
             ('DELETE', 'DELETE FROM redpacket.%I'),
             ('TRUNCATE', 'TRUNCATE redpacket.%I')) v(op, q)
WHERE c.relnamespace = 'redpacket'::regnamespace AND g.tgname = 'guard'
ORDER BY 1, 2;
SELECT b.claims = (SELECT count(*) FROM redpacket.claim) AS claims_unchanged,
       (SELECT count(*) FROM redpacket.activity) > 0 AS activities_kept
FROM before_counts b;
UPDATE redpacket.stripe SET balance = balance;

-- Hostile search_path ---------------------------------------------------------------
-- A role with claim rights builds a schema that shadows now(), count(*),
-- sum(), the comparison and arithmetic operators and our table names, plus
-- temporary tables with our names (pg_temp is searched after pg_catalog even
-- in a pinned path), and claims with search_path = hostile, public,
-- pg_catalog.  Every outcome must be the same as with a clean search_path.
-- Two identical sets of activities: one claimed with a clean path, the other
-- with the hostile one.
CREATE TEMP TABLE sec_pair (label text, clean bigint, hostile bigint);
INSERT INTO sec_pair
SELECT label, redpacket.rp_create_activity(total, packets => packets, stripes => stripes,
                                           per_user_limit => lim, starts_at => sa, ends_at => ea),
              redpacket.rp_create_activity(total, packets => packets, stripes => stripes,
                                           per_user_limit => lim, starts_at => sa, ends_at => ea)
FROM (VALUES ('fixed',   1.00, NULL::int, 2, 1, now(), NULL::timestamptz),
             ('rain',    1.00, NULL, 1, 2, now(), NULL),
             ('lucky',   0.30, 2, 1, 1, now(), NULL),
             ('frozen',  1.00, NULL, 1, 1, now(), NULL),
             ('closed',  1.00, NULL, 1, 1, now(), NULL),
             ('later',   1.00, NULL, 1, 1, now() + interval '1 day', NULL),
             ('expired', 1.00, NULL, 1, 1, now() - interval '2 days', now() - interval '1 day'))
     v(label, total, packets, stripes, lim, sa, ea);
SELECT redpacket.rp_freeze(id, 'held') FROM sec_pair, LATERAL (VALUES (clean), (hostile)) x(id) WHERE label = 'frozen';
SELECT count(*) FROM sec_pair, LATERAL (VALUES (clean), (hostile)) x(id), LATERAL redpacket.rp_close_activity(id)
WHERE label = 'closed';
SELECT clean AS fixed_c, hostile AS fixed_h FROM sec_pair WHERE label = 'fixed' \gset
SELECT clean AS rain_c, hostile AS rain_h FROM sec_pair WHERE label = 'rain' \gset
SELECT clean AS lucky_c, hostile AS lucky_h FROM sec_pair WHERE label = 'lucky' \gset
SELECT clean AS frozen_c, hostile AS frozen_h FROM sec_pair WHERE label = 'frozen' \gset
SELECT clean AS closed_c, hostile AS closed_h FROM sec_pair WHERE label = 'closed' \gset
SELECT clean AS later_c, hostile AS later_h FROM sec_pair WHERE label = 'later' \gset
SELECT clean AS expired_c, hostile AS expired_h FROM sec_pair WHERE label = 'expired' \gset
DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO regress_rp_hostile', current_database()); END $$;

SET ROLE regress_rp_hostile;
CREATE SCHEMA hostile;
-- A clock stuck in 2000, and predicates that always hold.
CREATE FUNCTION hostile.now() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT '2000-01-01 00:00:00+00'::pg_catalog.timestamptz $$;
CREATE FUNCTION hostile.keep(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT $1';
CREATE FUNCTION hostile.keep(integer, integer) RETURNS integer LANGUAGE sql AS 'SELECT $1';
CREATE FUNCTION hostile.keep(bigint, integer) RETURNS bigint LANGUAGE sql AS 'SELECT $1';
CREATE FUNCTION hostile.keep(numeric, numeric) RETURNS numeric LANGUAGE sql AS 'SELECT $1';
CREATE FUNCTION hostile.zero_state(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE FUNCTION hostile.zero_state(numeric, bigint) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
CREATE FUNCTION hostile.zero_state(numeric, numeric) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
CREATE AGGREGATE hostile.count(*) (sfunc = hostile.zero_state, stype = bigint, initcond = '0');
CREATE AGGREGATE hostile.sum(bigint) (sfunc = hostile.zero_state, stype = numeric, initcond = '0');
CREATE AGGREGATE hostile.sum(numeric) (sfunc = hostile.zero_state, stype = numeric, initcond = '0');
-- =, >=, <= always hold, >, <, <> never; - and + leave the left side as it is.
DO $$
DECLARE
    t text;
    o text;
BEGIN
    FOREACH t IN ARRAY ARRAY['bigint', 'integer', 'text', 'numeric', 'timestamptz', 'boolean'] LOOP
        EXECUTE format('CREATE FUNCTION hostile.yes(%1$s, %1$s) RETURNS boolean LANGUAGE sql AS ''SELECT true''', t);
        EXECUTE format('CREATE FUNCTION hostile.no(%1$s, %1$s) RETURNS boolean LANGUAGE sql AS ''SELECT false''', t);
        FOREACH o IN ARRAY ARRAY['=', '>=', '<=', '>', '<', '<>'] LOOP
            EXECUTE format('CREATE OPERATOR hostile.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = hostile.%s)',
                           o, t, t, CASE WHEN o IN ('=', '>=', '<=') THEN 'yes' ELSE 'no' END);
        END LOOP;
    END LOOP;
    FOREACH o IN ARRAY ARRAY['bigint, bigint', 'integer, integer', 'bigint, integer', 'numeric, numeric'] LOOP
        EXECUTE format('CREATE OPERATOR hostile.- (LEFTARG = %s, RIGHTARG = %s, FUNCTION = hostile.keep)',
                       split_part(o, ', ', 1), split_part(o, ', ', 2));
        EXECUTE format('CREATE OPERATOR hostile.+ (LEFTARG = %s, RIGHTARG = %s, FUNCTION = hostile.keep)',
                       split_part(o, ', ', 1), split_part(o, ', ', 2));
    END LOOP;
END $$;
-- Look-alike tables: an activity that is frozen and huge, claims for every
-- user, a stripe with an endless balance, a ledger funding a fortune.
CREATE TABLE hostile.activity (
    id bigint, name text, total numeric, packets integer, scale integer, stripes integer,
    per_user_limit integer, starts_at timestamptz, ends_at timestamptz, closed_at timestamptz,
    frozen_reason text, frozen_at timestamptz, created_at timestamptz, created_by name);
CREATE TABLE hostile.claim (
    activity_id bigint, claim_id bigint, user_id text, request_id text, idempotency_key text,
    amount numeric, stripe integer, claimed_at timestamptz);
CREATE TABLE hostile.stripe (
    activity_id bigint, stripe integer, balance bigint, packets integer, claims bigint);
CREATE TABLE hostile.ledger (
    activity_id bigint, entry_id bigint, kind text, amount numeric, reason text,
    created_at timestamptz, created_by name);
INSERT INTO hostile.activity (id, name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at,
                              closed_at, frozen_reason, created_at, created_by)
SELECT id, 'evil', 1e9, NULL, 2, 1, 1000, '3000-01-01', NULL, now(), 'evil', now(), 'evil'
FROM unnest(ARRAY[:fixed_h, :rain_h, :lucky_h, :frozen_h, :closed_h, :later_h, :expired_h]::bigint[]) id;
INSERT INTO hostile.claim
SELECT a, 42, 'u' || u, 'r' || u, '', 0.01, 0, '2000-01-01'
FROM unnest(ARRAY[:fixed_h, :rain_h, :lucky_h]::bigint[]) a, generate_series(1, 9) u;
INSERT INTO hostile.stripe SELECT a, s, 9000000000, 1000, 0
FROM unnest(ARRAY[:fixed_h, :rain_h, :lucky_h]::bigint[]) a, generate_series(0, 3) s;
INSERT INTO hostile.ledger SELECT a, 1, 'fund', 1e9, 'evil', now(), 'evil'
FROM unnest(ARRAY[:fixed_h, :rain_h, :lucky_h]::bigint[]) a;
CREATE TEMP TABLE activity AS SELECT * FROM hostile.activity;
CREATE TEMP TABLE claim AS SELECT * FROM hostile.claim;
CREATE TEMP TABLE stripe AS SELECT * FROM hostile.stripe;
CREATE TEMP TABLE ledger AS SELECT * FROM hostile.ledger;

-- The claims, first with a clean search_path on the clean activities.
SHOW search_path;
SELECT 'fixed u1' AS step, status, amount FROM redpacket.rp_claim(:fixed_c, 'u1', 0.30)
UNION ALL SELECT 'fixed u1 again', status, amount FROM redpacket.rp_claim(:fixed_c, 'u1', 0.40)
UNION ALL SELECT 'fixed u2', status, amount FROM redpacket.rp_claim(:fixed_c, 'u2', 0.50)
UNION ALL SELECT 'fixed u3', status, amount FROM redpacket.rp_claim(:fixed_c, 'u3', 0.30)
UNION ALL SELECT 'fixed u4', status, amount FROM redpacket.rp_claim(:fixed_c, 'u4', 0.20)
UNION ALL SELECT 'fixed u5', status, amount FROM redpacket.rp_claim(:fixed_c, 'u5', 0.01)
UNION ALL SELECT 'rain u1 r1', status, amount FROM redpacket.rp_claim(:rain_c, 'u1', 0.10, 'r1')
UNION ALL SELECT 'rain u1 r2', status, amount FROM redpacket.rp_claim(:rain_c, 'u1', 0.20, 'r2')
UNION ALL SELECT 'rain u1 r3', status, amount FROM redpacket.rp_claim(:rain_c, 'u1', 0.30, 'r3')
UNION ALL SELECT 'rain u1 r1 again', status, amount FROM redpacket.rp_claim(:rain_c, 'u1', 0.10, 'r1')
UNION ALL SELECT 'rain u2 r1', status, amount FROM redpacket.rp_claim(:rain_c, 'u2', 0.75, 'r1')
UNION ALL SELECT 'lucky u1', status, NULL FROM redpacket.rp_claim(:lucky_c, 'u1')
UNION ALL SELECT 'lucky u2', status, NULL FROM redpacket.rp_claim(:lucky_c, 'u2')
UNION ALL SELECT 'lucky u3', status, NULL FROM redpacket.rp_claim(:lucky_c, 'u3')
UNION ALL SELECT 'frozen', status, amount FROM redpacket.rp_claim(:frozen_c, 'u1', 0.10)
UNION ALL SELECT 'closed', status, amount FROM redpacket.rp_claim(:closed_c, 'u1', 0.10)
UNION ALL SELECT 'later', status, amount FROM redpacket.rp_claim(:later_c, 'u1', 0.10)
UNION ALL SELECT 'expired', status, amount FROM redpacket.rp_claim(:expired_c, 'u1', 0.10);
SELECT ord, user_id, status, amount
FROM redpacket.rp_claim_batch(:fixed_c, ARRAY['u1', 'u6', 'u7'], ARRAY[0.30, 0.01, 0.01]);

-- The hostile objects are live under the hostile path: shadowed functions,
-- operators, aggregates and tables win over pg_catalog's and ours.
SET search_path = hostile, public, pg_catalog;
SELECT now() AS clock, 2::bigint >= 3::bigint AS ge, 7::bigint - 3::bigint AS minus,
       7::integer + 3::integer AS plus, 'a'::text = 'b'::text AS eq,
       (SELECT count(*) FROM generate_series(1, 5)) AS count_star,
       (SELECT sum(g::bigint) FROM generate_series(1, 5) g) AS sum_bigint,
       (SELECT string_agg(DISTINCT frozen_reason, ',') FROM activity) AS unqualified_activity,
       (SELECT relnamespace = pg_my_temp_schema() FROM pg_class WHERE oid = 'claim'::regclass) AS temp_claim_wins;

-- The same claims with the hostile search_path on the twin activities.
SHOW search_path;
SELECT 'fixed u1' AS step, status, amount FROM redpacket.rp_claim(:fixed_h, 'u1', 0.30)
UNION ALL SELECT 'fixed u1 again', status, amount FROM redpacket.rp_claim(:fixed_h, 'u1', 0.40)
UNION ALL SELECT 'fixed u2', status, amount FROM redpacket.rp_claim(:fixed_h, 'u2', 0.50)
UNION ALL SELECT 'fixed u3', status, amount FROM redpacket.rp_claim(:fixed_h, 'u3', 0.30)
UNION ALL SELECT 'fixed u4', status, amount FROM redpacket.rp_claim(:fixed_h, 'u4', 0.20)
UNION ALL SELECT 'fixed u5', status, amount FROM redpacket.rp_claim(:fixed_h, 'u5', 0.01)
UNION ALL SELECT 'rain u1 r1', status, amount FROM redpacket.rp_claim(:rain_h, 'u1', 0.10, 'r1')
UNION ALL SELECT 'rain u1 r2', status, amount FROM redpacket.rp_claim(:rain_h, 'u1', 0.20, 'r2')
UNION ALL SELECT 'rain u1 r3', status, amount FROM redpacket.rp_claim(:rain_h, 'u1', 0.30, 'r3')
UNION ALL SELECT 'rain u1 r1 again', status, amount FROM redpacket.rp_claim(:rain_h, 'u1', 0.10, 'r1')
UNION ALL SELECT 'rain u2 r1', status, amount FROM redpacket.rp_claim(:rain_h, 'u2', 0.75, 'r1')
UNION ALL SELECT 'lucky u1', status, NULL FROM redpacket.rp_claim(:lucky_h, 'u1')
UNION ALL SELECT 'lucky u2', status, NULL FROM redpacket.rp_claim(:lucky_h, 'u2')
UNION ALL SELECT 'lucky u3', status, NULL FROM redpacket.rp_claim(:lucky_h, 'u3')
UNION ALL SELECT 'frozen', status, amount FROM redpacket.rp_claim(:frozen_h, 'u1', 0.10)
UNION ALL SELECT 'closed', status, amount FROM redpacket.rp_claim(:closed_h, 'u1', 0.10)
UNION ALL SELECT 'later', status, amount FROM redpacket.rp_claim(:later_h, 'u1', 0.10)
UNION ALL SELECT 'expired', status, amount FROM redpacket.rp_claim(:expired_h, 'u1', 0.10);
SELECT ord, user_id, status, amount
FROM redpacket.rp_claim_batch(:fixed_h, ARRAY['u1', 'u6', 'u7'], ARRAY[0.30, 0.01, 0.01]);
-- Errors are the same errors.
SELECT pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 0.001)', :fixed_h, 'u8')) AS too_fine,
       pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 0.10)', 999999999, 'u8')) AS unknown;
RESET search_path;
SELECT pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 0.001)', :fixed_c, 'u8')) AS too_fine,
       pg_temp.try(format('SELECT redpacket.rp_claim(%s, %L, 0.10)', 999999999, 'u8')) AS unknown;
RESET ROLE;

-- Compare the twins with a clean search_path as the owner: claims (user,
-- request, amount), times, remaining budget, packets, state and the books.
-- Lucky amounts are random, so only their sum is compared.
SHOW search_path;
CREATE TEMP VIEW sec_state AS
SELECT p.label, x.side, x.id,
       (SELECT string_agg(format('%s/%s/%s', c.user_id, coalesce(c.request_id, '-'),
                                 CASE WHEN p.label = 'lucky' THEN '?' ELSE c.amount::text END),
                          ' ' ORDER BY c.user_id, c.request_id)
        FROM redpacket.claim c WHERE c.activity_id = x.id) AS claims,
       (SELECT count(*) FROM redpacket.claim c WHERE c.activity_id = x.id
           AND (c.claimed_at < now() - interval '1 hour' OR c.claimed_at > now())) AS odd_times,
       s.state, s.claimed_amount, s.claimed_count, s.remaining_amount, s.remaining_packets,
       (SELECT sum(amount) FROM redpacket.claim c WHERE c.activity_id = x.id) AS claim_sum,
       (SELECT sum(balance) FROM redpacket.stripe st WHERE st.activity_id = x.id) AS balance_units,
       (SELECT sum(claims) FROM redpacket.stripe st WHERE st.activity_id = x.id) AS stripe_claims
FROM sec_pair p
CROSS JOIN LATERAL (VALUES ('clean', p.clean), ('hostile', p.hostile)) x(side, id)
JOIN redpacket.activity_status s ON s.id = x.id;
SELECT label, side, claims, odd_times, state, claimed_amount, claimed_count, remaining_amount, remaining_packets
FROM sec_state ORDER BY label, side;
SELECT c.label,
       c.claims IS NOT DISTINCT FROM h.claims AND c.state = h.state
       AND c.claimed_amount = h.claimed_amount AND c.claimed_count = h.claimed_count
       AND c.remaining_amount = h.remaining_amount
       AND c.remaining_packets IS NOT DISTINCT FROM h.remaining_packets
       AND c.claim_sum IS NOT DISTINCT FROM h.claim_sum
       AND c.balance_units = h.balance_units AND c.stripe_claims = h.stripe_claims AS same
FROM sec_state c JOIN sec_state h ON h.label = c.label AND c.side = 'clean' AND h.side = 'hostile'
ORDER BY c.label;
-- The books of every activity balance and every pass is clean.
SELECT count(*) AS passes, count(*) FILTER (WHERE NOT ok) AS not_ok
FROM redpacket.rp_reconcile(NULL, true)
WHERE activity_id IN (:act, :op_act) OR activity_id IN (SELECT clean FROM sec_pair UNION ALL SELECT hostile FROM sec_pair);

-- rp_regrant gives a kind's grants only to a role that holds, in its own
-- grants, what the helper of that kind granted: one an administrator let
-- run rp_reconcile, rp_claim or three sender functions by hand stays as it
-- was, and so does one that has rp_reconcile by hand and the rest through
-- an operator role it belongs to; a sender that belongs to an operator role
-- is still a sender; a wallet role is found too.
CREATE ROLE regress_rp_hand_reconcile;
GRANT USAGE ON SCHEMA redpacket TO regress_rp_hand_reconcile;
GRANT EXECUTE ON FUNCTION redpacket.rp_reconcile(bigint, boolean) TO regress_rp_hand_reconcile;
CREATE ROLE regress_rp_hand_claim;
GRANT USAGE ON SCHEMA redpacket TO regress_rp_hand_claim;
GRANT EXECUTE ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text) TO regress_rp_hand_claim;
CREATE ROLE regress_rp_hand_topper;
GRANT USAGE ON SCHEMA redpacket TO regress_rp_hand_topper;
GRANT EXECUTE ON FUNCTION redpacket.rp_top_up(bigint, numeric, integer, text),
    redpacket.rp_close_activity(bigint),
    redpacket.rp_set_window(bigint, timestamptz, timestamptz, text) TO regress_rp_hand_topper;
CREATE ROLE regress_rp_hand_member;
GRANT USAGE ON SCHEMA redpacket TO regress_rp_hand_member;
GRANT EXECUTE ON FUNCTION redpacket.rp_reconcile(bigint, boolean) TO regress_rp_hand_member;
GRANT regress_rp_operator TO regress_rp_hand_member;
CREATE ROLE regress_rp_sender_member;
SELECT redpacket.rp_grant_sender('regress_rp_sender_member');
GRANT regress_rp_operator TO regress_rp_sender_member;
CREATE ROLE regress_rp_wallet;
SELECT redpacket.rp_grant_wallet('regress_rp_wallet');
SELECT role, kind FROM redpacket.rp_regrant()
 WHERE role::text LIKE 'regress_rp_%' AND role::text <> 'regress_rp_hostile'
 ORDER BY kind, role::text;
SELECT has_function_privilege('regress_rp_hand_reconcile', 'redpacket.rp_reverse(bigint, bigint, text)', 'EXECUTE') AS hand_reconcile_reverses,
       has_table_privilege('regress_rp_hand_reconcile', 'redpacket.claim', 'SELECT') AS hand_reconcile_reads_claims,
       has_function_privilege('regress_rp_hand_claim', 'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])', 'EXECUTE') AS hand_claim_batches,
       has_function_privilege('regress_rp_hand_topper', 'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text)', 'EXECUTE') AS hand_topper_creates;
REVOKE regress_rp_operator FROM regress_rp_hand_member;
SELECT has_table_privilege('regress_rp_hand_member', 'redpacket.claim', 'SELECT') AS member_reads_claims_after_leaving;
DROP OWNED BY regress_rp_hand_reconcile, regress_rp_hand_claim, regress_rp_hand_topper,
    regress_rp_hand_member, regress_rp_sender_member, regress_rp_wallet;
DROP ROLE regress_rp_hand_reconcile, regress_rp_hand_claim, regress_rp_hand_topper,
    regress_rp_hand_member, regress_rp_sender_member, regress_rp_wallet;

-- Books the reconciler found wrong are not settled or moved: close, top-up,
-- withdrawal and window moves are refused (55000) until a repair and an
-- unfreeze, for the sender and the operator alike.
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'wrong books') AS wb \gset
SELECT status FROM redpacket.rp_claim(:wb, 'wb-1', 1.00);
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 500 WHERE activity_id = :wb AND stripe = 0;
RESET session_replication_role;
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_reconcile(:wb, true);
RESET client_min_messages;
SELECT starts_with(frozen_reason, 'reconciliation mismatch') AS frozen_by_check FROM redpacket.activity WHERE id = :wb;
SET ROLE regress_rp_sender;
SELECT fn, regexp_replace(pg_temp.try(q), 'activity \d+', 'activity N') AS outcome
FROM (VALUES
    ('rp_close_activity', format('SELECT redpacket.rp_close_activity(%s)', :wb)),
    ('rp_top_up', format('SELECT redpacket.rp_top_up(%s, 1.00)', :wb)),
    ('rp_set_window', format('SELECT redpacket.rp_set_window(%s, now() - interval %L, now() - interval %L)', :wb, '2 days', '1 day'))
) v(fn, q);
RESET ROLE;
SET ROLE regress_rp_operator;
SELECT regexp_replace(pg_temp.try(format('SELECT redpacket.rp_withdraw(%s, 1.00)', :wb)),
                      'activity \d+', 'activity N') AS operator_withdraw;
SELECT regexp_replace(pg_temp.try(format('SELECT redpacket.rp_close_activity(%s)', :wb)),
                      'activity \d+', 'activity N') AS operator_close;
RESET ROLE;
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :wb ORDER BY entry_id;
SELECT ok FROM redpacket.rp_repair_stripes(:wb, 'stripe 0 edited by hand');
SELECT redpacket.rp_unfreeze(:wb);
SELECT redpacket.rp_close_activity(:wb) AS returned_after_repair;
-- A check that could not run (a lock timeout: its row says error) finds
-- nothing wrong: it does not stop a top-up or a close.
SELECT redpacket.rp_create_activity(5.00, stripes => 1, name => 'unchecked books') AS ub \gset
INSERT INTO redpacket.reconciliation (activity_id, checked_at, full_check, expected, actual, drift,
       expected_claims, actual_claims, negative_stripes, new_claims, ok, problems, error)
VALUES (:ub, now(), false, 0, 0, 0, 0, 0, 0, 0, false, '{error}', 'canceling statement due to lock timeout');
SELECT redpacket.rp_top_up(:ub, 1.00) AS topped_up_after_unchecked;
SELECT redpacket.rp_close_activity(:ub) AS closed_after_unchecked;
-- Books found wrong are not settled when the activity ends either: the
-- reconciler leaves them frozen, paying nothing out, until they are repaired.
SELECT redpacket.rp_create_activity(10.00, 5, starts_at => now() - interval '1 minute',
                                    ends_at => clock_timestamp() + interval '1 second',
                                    stripes => 2, name => 'wrong books ending') AS we \gset
SELECT status FROM redpacket.rp_claim(:we, 'we-1', 1.00);
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 50000 WHERE activity_id = :we AND stripe = 0;
RESET session_replication_role;
SET client_min_messages = error;
SELECT ok, problems FROM redpacket.rp_reconcile(:we, true);
SELECT pg_sleep(1.2);
SELECT count(*) AS passes FROM redpacket.rp_reconcile(:we);
RESET client_min_messages;
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :we ORDER BY entry_id;
SELECT closed_at IS NULL AS not_settled FROM redpacket.activity WHERE id = :we;

-- Clean up ----------------------------------------------------------------------------
DROP SCHEMA hostile CASCADE;
DO $$ BEGIN EXECUTE format('REVOKE CREATE ON DATABASE %I FROM regress_rp_hostile', current_database()); END $$;
DROP OWNED BY regress_rp_app, regress_rp_operator, regress_rp_nobody, regress_rp_usage, regress_rp_hostile, regress_rp_sender;
DROP ROLE regress_rp_app, regress_rp_operator, regress_rp_nobody, regress_rp_usage, regress_rp_hostile, regress_rp_sender;
