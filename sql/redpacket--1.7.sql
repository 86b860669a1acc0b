-- redpacket 1.7: schema, tables, functions and views of the extension (full install script).
-- Its part "1.4" below is written as the additions to 1.3, in the same order
-- as redpacket--1.3--1.4.sql, the changes of redpacket--1.4--1.5.sql are
-- made where their objects are (a new column in the part "1.5" at the end),
-- and the parts "1.6" and "1.7" at the end are redpacket--1.5--1.6.sql and
-- redpacket--1.6--1.7.sql, so that an upgraded database and a fresh one have
-- the same columns in the same order.
\echo Use "CREATE EXTENSION redpacket" to load this file. \quit

-- The schema must be a superuser's that nobody else may create objects in:
-- CREATE EXTENSION adopts an existing schema "redpacket", and objects a
-- database owner added there beforehand (an operator, an overload) would
-- capture this script's expressions and the extension's calls.
DO $guard$
DECLARE
    owner_name name;
    owner_super boolean;
    creators text;
BEGIN
    SELECT r.rolname, r.rolsuper INTO owner_name, owner_super
      FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'redpacket';
    IF NOT owner_super THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('schema "redpacket" is owned by %I, who is not a superuser', owner_name),
            DETAIL = 'Objects its owner can create beside the extension''s would run with the rights of whoever calls the extension.',
            HINT = 'As a superuser: ALTER SCHEMA redpacket OWNER TO postgres (after checking what is in it), then try again.';
    END IF;
    SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END, ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n
     CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
     WHERE n.nspname OPERATOR(pg_catalog.=) 'redpacket'
       AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND (a.grantee OPERATOR(pg_catalog.=) 0 OR NOT r.rolsuper);
    IF creators IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('%s may create objects in schema "redpacket"', creators),
            DETAIL = 'Objects they can create beside the extension''s would run with the rights of whoever calls the extension.',
            HINT = pg_catalog.format('REVOKE CREATE ON SCHEMA redpacket FROM %s, then try again.', creators);
    END IF;
END
$guard$;

-- Types ------------------------------------------------------------------

CREATE TYPE redpacket.claim_status AS ENUM (
    'duplicate', 'frozen', 'not_started', 'ended', 'not_eligible', 'user_limit', 'busy',
    'exhausted', 'claimed'
);
COMMENT ON TYPE redpacket.claim_status IS
    'Outcome of a claim, in the order rp_claim checks them: duplicate, frozen, not_started, ended, not_eligible, user_limit, busy, exhausted, claimed.';

CREATE TYPE redpacket.claim_result AS (
    status     redpacket.claim_status,
    claim_id   bigint,
    amount     numeric,
    claimed_at timestamptz
);
COMMENT ON TYPE redpacket.claim_result IS
    'Result of rp_claim: the status, and for claimed/duplicate the claim''s id, amount and time.';

-- Tables -----------------------------------------------------------------
-- Every table is keyed by activity id first so that it can be distributed
-- by activity.  Balances inside are integer minor units (bigint); amounts
-- shown to people are numeric with the activity's scale.

CREATE SEQUENCE redpacket.activity_id_seq;

CREATE TABLE redpacket.activity (
    id             bigint PRIMARY KEY DEFAULT pg_catalog.nextval('redpacket.activity_id_seq'),
    name           text,
    total          numeric NOT NULL CHECK (total > 0),
    packets        integer CHECK (packets >= 1),
    scale          integer NOT NULL CHECK (scale BETWEEN 0 AND 4),
    stripes        integer NOT NULL CHECK (stripes BETWEEN 1 AND 1024),
    per_user_limit integer NOT NULL CHECK (per_user_limit >= 1),
    starts_at      timestamptz NOT NULL,
    ends_at        timestamptz,
    closed_at      timestamptz,
    frozen_reason  text,
    frozen_at      timestamptz,
    created_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    created_by     name NOT NULL DEFAULT pg_catalog.session_user(),
    CHECK (ends_at IS NULL OR ends_at > starts_at)
);
ALTER SEQUENCE redpacket.activity_id_seq OWNED BY redpacket.activity.id;
COMMENT ON TABLE redpacket.activity IS
    'One row per red-packet activity: its funding, limits, schedule and operator state. Written only by the rp_* functions.';
COMMENT ON COLUMN redpacket.activity.total IS 'Funded budget, in currency units with the activity''s scale.';
COMMENT ON COLUMN redpacket.activity.packets IS 'Cap on successful claims; required for lucky draws; NULL means no cap.';
COMMENT ON COLUMN redpacket.activity.scale IS 'Fractional digits of the currency unit (2 = cents/fen).';
COMMENT ON COLUMN redpacket.activity.stripes IS 'Number of sub-balances the budget is split across (may be fewer than asked when the budget or packet count is small).';
COMMENT ON COLUMN redpacket.activity.per_user_limit IS 'Claims one user may hold; above 1, each claim needs a request_id.';
COMMENT ON COLUMN redpacket.activity.closed_at IS 'Set when the activity was closed or settled after ends_at.';
COMMENT ON COLUMN redpacket.activity.frozen_reason IS 'Non-NULL while the activity is frozen (operator hold or reconciliation mismatch).';

CREATE TABLE redpacket.stripe (
    activity_id bigint NOT NULL,
    stripe      integer NOT NULL,
    balance     bigint NOT NULL,
    packets     integer,
    claims      bigint NOT NULL DEFAULT 0,
    halted      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (activity_id, stripe)
) WITH (fillfactor = 10);
-- No CHECK constraints on stripe and claim: they would be recompiled for
-- every claim statement, the C code never writes a negative balance, and
-- reconciliation proves it on every pass.
COMMENT ON TABLE redpacket.stripe IS
    'Sub-balances of each activity, in integer minor units; claims on one activity spread over these rows. Low fillfactor keeps updates HOT and stripes on separate pages.';
COMMENT ON COLUMN redpacket.stripe.balance IS 'Remaining budget of this stripe in minor units (10^-scale of the currency unit).';
COMMENT ON COLUMN redpacket.stripe.packets IS 'Remaining packets of this stripe; NULL when the activity has no packet cap.';
COMMENT ON COLUMN redpacket.stripe.claims IS 'Claims recorded against this stripe.';
COMMENT ON COLUMN redpacket.stripe.halted IS 'Copy of "the activity is frozen or closed", kept on every stripe so a claim checks it on the row it decrements.';

-- No CACHE: the reconciliation watermark relies on claim ids of one
-- activity being handed out in the order its stripe locks are granted.
CREATE SEQUENCE redpacket.claim_id_seq;

CREATE TABLE redpacket.claim (
    activity_id     bigint NOT NULL,
    claim_id        bigint NOT NULL DEFAULT pg_catalog.nextval('redpacket.claim_id_seq'),
    user_id         text COLLATE "C" NOT NULL,
    request_id      text COLLATE "C",
    idempotency_key text COLLATE "C" NOT NULL,
    amount          numeric NOT NULL,
    stripe          integer NOT NULL,
    claimed_at      timestamptz NOT NULL,
    PRIMARY KEY (activity_id, claim_id),
    UNIQUE (activity_id, user_id, idempotency_key)
);
ALTER SEQUENCE redpacket.claim_id_seq OWNED BY redpacket.claim.claim_id;
COMMENT ON TABLE redpacket.claim IS
    'One row per successful claim; append-only. Unique on (activity_id, user_id, idempotency_key).';
-- User and request ids are opaque identifiers: byte order ("C") keeps the
-- unique index fast and independent of the database's locale.
COMMENT ON COLUMN redpacket.claim.idempotency_key IS
    'Empty when per_user_limit is 1 (one claim per user); the request_id otherwise.';
COMMENT ON COLUMN redpacket.claim.stripe IS 'Stripe that paid the packet count of this claim (or most of its amount).';

CREATE SEQUENCE redpacket.ledger_entry_id_seq;

CREATE TABLE redpacket.ledger (
    activity_id bigint NOT NULL,
    entry_id    bigint NOT NULL DEFAULT pg_catalog.nextval('redpacket.ledger_entry_id_seq'),
    kind        text NOT NULL CHECK (kind IN ('fund', 'return')),
    amount      numeric NOT NULL CHECK (amount >= 0),
    reason      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    created_by  name NOT NULL DEFAULT pg_catalog.session_user(),
    PRIMARY KEY (activity_id, entry_id)
);
ALTER SEQUENCE redpacket.ledger_entry_id_seq OWNED BY redpacket.ledger.entry_id;
-- An activity is funded once and its remainder returned at most once.
CREATE UNIQUE INDEX ledger_once ON redpacket.ledger (activity_id, kind);
COMMENT ON TABLE redpacket.ledger IS
    'Every money movement that is not a claim: the funding, and the remainder returned at close or expiry. Append-only.';

CREATE TABLE redpacket.reconcile_state (
    activity_id   bigint PRIMARY KEY,
    last_claim_id bigint NOT NULL DEFAULT 0,
    claimed       numeric NOT NULL DEFAULT 0,
    claim_count   bigint NOT NULL DEFAULT 0,
    settled       boolean NOT NULL DEFAULT false,
    last_pass_at  timestamptz,
    last_balance  numeric,
    last_packets  bigint,
    last_claims   bigint,
    last_full_check_at timestamptz
);
COMMENT ON TABLE redpacket.reconcile_state IS
    'Per-activity watermark of the incremental reconciliation: claims up to last_claim_id are summed into claimed and claim_count; last_balance, last_packets and last_claims are the stripe sums the last pass saw, so a pass over all activities can tell which changed.';

CREATE SEQUENCE redpacket.reconciliation_pass_id_seq;

CREATE TABLE redpacket.reconciliation (
    activity_id      bigint NOT NULL,
    pass_id          bigint NOT NULL DEFAULT pg_catalog.nextval('redpacket.reconciliation_pass_id_seq'),
    checked_at       timestamptz NOT NULL,
    full_check       boolean NOT NULL,
    expected         numeric,
    actual           numeric,
    drift            numeric,
    expected_packets bigint,
    actual_packets   bigint,
    expected_claims  bigint,
    actual_claims    bigint,
    negative_stripes integer,
    new_claims       bigint,
    ok               boolean NOT NULL,
    problems         text[],
    error            text,
    PRIMARY KEY (activity_id, pass_id)
);
ALTER SEQUENCE redpacket.reconciliation_pass_id_seq OWNED BY redpacket.reconciliation.pass_id;
COMMENT ON TABLE redpacket.reconciliation IS
    'One row per activity per reconciliation pass: expected = funded - returned - sum of claims, actual = sum of stripe balances, drift = actual - expected. Append-only.';

-- Append-only guard --------------------------------------------------------

CREATE FUNCTION redpacket.refuse_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'insufficient_privilege',
        MESSAGE = pg_catalog.format('%s on %I.%I is not allowed', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME),
        DETAIL = 'Claims, ledger entries and reconciliation records are append-only.',
        HINT = 'Money moves only through the redpacket functions; correct a mistake with a new entry.';
END;
$$;
COMMENT ON FUNCTION redpacket.refuse_change() IS
    'Trigger function that refuses UPDATE, DELETE and TRUNCATE on the append-only tables.';

CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON redpacket.claim
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON redpacket.ledger
    FOR EACH ROW EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON redpacket.ledger
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON redpacket.reconciliation
    FOR EACH ROW EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON redpacket.reconciliation
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.refuse_change();

-- Functions ----------------------------------------------------------------

CREATE FUNCTION redpacket.rp_create_activity(
    total          numeric,
    packets        integer DEFAULT NULL,
    starts_at      timestamptz DEFAULT pg_catalog.now(),
    ends_at        timestamptz DEFAULT NULL,
    stripes        integer DEFAULT NULL,
    name           text DEFAULT NULL,
    scale          integer DEFAULT 2,
    per_user_limit integer DEFAULT 1)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_create_activity'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer) IS
    'Funds a new activity with total (split over stripes sub-balances) and returns its id; packets caps the number of claims and enables lucky draws.';

CREATE FUNCTION redpacket.rp_claim(
    activity   bigint,
    user_id    text,
    amount     numeric DEFAULT NULL,
    request_id text DEFAULT NULL)
RETURNS redpacket.claim_result
AS 'MODULE_PATHNAME', 'rp_claim_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- The symbol is new in 1.4 (as rp_claim_batch_v14): a backend still running
-- a library older than 1.4 knows neither eligibility lists nor the other 1.4
-- rules, and refuses the call instead of running it.
COMMENT ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text) IS
    'Claims from an activity: records the claim and decrements a stripe in the caller''s transaction. amount NULL draws a lucky amount. Business outcomes are statuses, bad input is an error.';

CREATE FUNCTION redpacket.rp_claim_batch(
    activity    bigint,
    user_ids    text[],
    amounts     numeric[] DEFAULT NULL,
    request_ids text[] DEFAULT NULL)
RETURNS TABLE (ord integer, user_id text, status redpacket.claim_status,
               claim_id bigint, amount numeric, claimed_at timestamptz)
AS 'MODULE_PATHNAME', 'rp_claim_batch_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100;
COMMENT ON FUNCTION redpacket.rp_claim_batch(bigint, text[], numeric[], text[]) IS
    'Many claims on one activity in one call, element by element in array order, with the same outcomes as rp_claim; any bad element makes the whole call an error.';

CREATE FUNCTION redpacket.rp_close_activity(activity bigint)
RETURNS numeric
AS 'MODULE_PATHNAME', 'rp_close_activity'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_close_activity(bigint) IS
    'Ends the activity now, returns the unclaimed remainder to the funder in the ledger, and returns that remainder (0 when already settled).';

CREATE FUNCTION redpacket.rp_freeze(activity bigint, reason text)
RETURNS void
AS 'MODULE_PATHNAME', 'rp_freeze'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_freeze(bigint, text) IS
    'Operator hold: new claims get status frozen until rp_unfreeze.';

CREATE FUNCTION redpacket.rp_unfreeze(activity bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'rp_unfreeze'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_unfreeze(bigint) IS
    'Lifts an operator or reconciliation freeze.';

CREATE FUNCTION redpacket.rp_reconcile(activity bigint DEFAULT NULL, full_check boolean DEFAULT false)
RETURNS SETOF redpacket.reconciliation
AS 'MODULE_PATHNAME', 'rp_reconcile'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_reconcile(bigint, boolean) IS
    'One reconciliation pass over one activity, or over every activity that changed since its last pass; settles expired activities. full_check re-sums every claim instead of only the new ones. Returns nothing when another pass is running.';

-- Operator view ------------------------------------------------------------

CREATE VIEW redpacket.activity_status AS
SELECT a.id,
       a.name,
       CASE
           WHEN a.frozen_reason IS NOT NULL THEN 'frozen'
           WHEN a.closed_at IS NOT NULL
                OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'ended'
           WHEN a.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'scheduled'
           WHEN s.balance OPERATOR(pg_catalog.=) 0
                OR s.packets OPERATOR(pg_catalog.=) 0 THEN 'exhausted'
           ELSE 'active'
       END AS state,
       a.scale,
       a.total,
       a.total OPERATOR(pg_catalog.-) COALESCE(r.returned, 0)
               OPERATOR(pg_catalog.-) s.remaining AS claimed_amount,
       s.claims AS claimed_count,
       s.remaining AS remaining_amount,
       s.packets AS remaining_packets,
       a.stripes,
       a.starts_at,
       a.ends_at,
       p.checked_at AS last_reconciled_at,
       p.ok AS last_reconcile_ok,
       a.frozen_reason,
       (SELECT rs.last_full_check_at FROM redpacket.reconcile_state rs
         WHERE rs.activity_id OPERATOR(pg_catalog.=) a.id) AS last_full_check_at
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT pg_catalog.sum(st.balance) AS balance,
           pg_catalog.sum(st.packets) AS packets,
           pg_catalog.sum(st.claims) AS claims,
           pg_catalog.round(pg_catalog.sum(st.balance)::numeric
                            OPERATOR(pg_catalog./) (10::numeric OPERATOR(pg_catalog.^) a.scale),
                            a.scale) AS remaining
    FROM redpacket.stripe st
    WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s
LEFT JOIN LATERAL (
    SELECT pg_catalog.sum(l.amount) AS returned
    FROM redpacket.ledger l
    WHERE l.activity_id OPERATOR(pg_catalog.=) a.id
      AND l.kind OPERATOR(pg_catalog.=) 'return') r ON true
LEFT JOIN LATERAL (
    SELECT rc.checked_at, rc.ok
    FROM redpacket.reconciliation rc
    WHERE rc.activity_id OPERATOR(pg_catalog.=) a.id
    ORDER BY rc.pass_id DESC
    LIMIT 1) p ON true;
COMMENT ON VIEW redpacket.activity_status IS
    'One row per activity for operators: state (scheduled, active, exhausted, ended, frozen), claimed and remaining amounts and packets, last reconciliation.';
COMMENT ON COLUMN redpacket.activity_status.last_full_check_at IS
    'When every claim of the activity was last re-summed by a full check (worker or rp_reconcile(..., true)); NULL when never.';

-- Role helpers ----------------------------------------------------------------
-- Run by the extension owner (or a superuser): they grant exactly what the
-- README's roles section describes, nothing more.

CREATE FUNCTION redpacket.rp_grant_app(role regrole) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'role must not be NULL';
    END IF;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA redpacket TO %s', role);
    EXECUTE pg_catalog.format(
        'GRANT EXECUTE ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text),'
        ' redpacket.rp_claim_batch(bigint, text[], numeric[], text[]),'
        ' redpacket.rp_activity_info(bigint) TO %s', role);
END;
$$;
COMMENT ON FUNCTION redpacket.rp_grant_app(regrole) IS
    'Grants an application role what it needs to claim: USAGE on the schema and EXECUTE on rp_claim, rp_claim_batch and the read-only rp_activity_info.';

CREATE FUNCTION redpacket.rp_grant_operator(role regrole) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF role IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'role must not be NULL';
    END IF;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA redpacket TO %s', role);
    EXECUTE pg_catalog.format(
        'GRANT EXECUTE ON FUNCTION'
        ' redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer),'
        ' redpacket.rp_close_activity(bigint), redpacket.rp_freeze(bigint, text),'
        ' redpacket.rp_unfreeze(bigint), redpacket.rp_reconcile(bigint, boolean),'
        ' redpacket.rp_activity_info(bigint), redpacket.rp_activity_stats(),'
        ' redpacket.rp_stats_reset(bigint) TO %s', role);
    EXECUTE pg_catalog.format(
        'GRANT EXECUTE ON PROCEDURE redpacket.rp_reconcile_strict(boolean) TO %s', role);
    EXECUTE pg_catalog.format(
        'GRANT SELECT ON redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,'
        ' redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_status,'
        ' redpacket.activity_stats, redpacket.reconciler, redpacket.reconciler_status TO %s', role);
END;
$$;
COMMENT ON FUNCTION redpacket.rp_grant_operator(regrole) IS
    'Grants an operator role the admin functions (create, close, freeze, unfreeze, reconcile, rp_reconcile_strict), the counters (activity_stats, rp_stats_reset), rp_activity_info, and SELECT on the tables and views.';

-- Privileges: nothing for PUBLIC; the owner grants application and operator
-- roles what they need (see rp_grant_app / rp_grant_operator).

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA redpacket FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA redpacket FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA redpacket FROM PUBLIC;

-- pg_dump keeps the data of extension tables only when told to.
SELECT pg_catalog.pg_extension_config_dump('redpacket.activity', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.activity_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.stripe', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.claim', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.claim_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.ledger', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.ledger_entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.reconcile_state', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.reconciliation', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.reconciliation_pass_id_seq', '');

-- [rec] Reconciler 1.1: failed checks by name, error rows, full-check times,
-- the reconciler's own status. ----------------------------------------------

COMMENT ON COLUMN redpacket.reconciliation.problems IS
    'Names of the failed checks: money, packets, claims, negative, not_empty (closed but stripes not empty or return wrong), error; empty when ok; NULL on rows written by 1.0.';
COMMENT ON COLUMN redpacket.reconciliation.error IS
    'Message of the error that stopped the check of this activity (problems = {error}); the pass went on with the next activity.';
COMMENT ON COLUMN redpacket.reconcile_state.last_full_check_at IS
    'When every claim of the activity was last re-summed (a full check); NULL when never.';

CREATE TABLE redpacket.reconciler (
    singleton             boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_pass_started_at  timestamptz,
    last_pass_finished_at timestamptz,
    last_pass_ms          numeric,
    activities_checked    integer,
    failures              integer
);
COMMENT ON TABLE redpacket.reconciler IS
    'The reconciler''s own status in this database: one row, overwritten by every pass over all activities (worker or rp_reconcile()). Not dumped: it describes this server''s passes, not the data.';
COMMENT ON COLUMN redpacket.reconciler.singleton IS 'Always true: the table has one row.';
COMMENT ON COLUMN redpacket.reconciler.last_pass_started_at IS 'Start of the last pass over all activities.';
COMMENT ON COLUMN redpacket.reconciler.last_pass_finished_at IS 'End of the last pass over all activities.';
COMMENT ON COLUMN redpacket.reconciler.last_pass_ms IS 'Duration of the last pass in milliseconds.';
COMMENT ON COLUMN redpacket.reconciler.activities_checked IS 'Activities the last pass checked.';
COMMENT ON COLUMN redpacket.reconciler.failures IS 'Activities of the last pass whose check failed, could not run, or found the activity incomplete.';
INSERT INTO redpacket.reconciler (singleton) VALUES (true);

CREATE VIEW redpacket.reconciler_status AS
SELECT pg_catalog.current_database() AS database,
       r.last_pass_started_at,
       r.last_pass_finished_at,
       r.last_pass_ms,
       r.activities_checked,
       r.failures,
       CASE WHEN i.every OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
            THEN COALESCE(r.last_pass_finished_at OPERATOR(pg_catalog.+) i.every, pg_catalog.now())
       END AS next_due_at,
       f.last_full_check_at
FROM (SELECT pg_catalog.current_setting('redpacket.reconcile_interval', true)::pg_catalog.interval
             AS every) i
LEFT JOIN redpacket.reconciler r ON true
CROSS JOIN (SELECT pg_catalog.min(s.last_full_check_at) AS last_full_check_at
              FROM redpacket.reconcile_state s) f;
COMMENT ON VIEW redpacket.reconciler_status IS
    'The reconciler in this database: the last pass over all activities (start, end, duration, activities checked, failures), when the worker''s next pass is due (NULL when paused or the library is not loaded), and last_full_check_at, the time since which every activity has had a full check (NULL while any never had one).';
COMMENT ON COLUMN redpacket.reconciler_status.database IS 'This database.';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_started_at IS 'Start of the last pass over all activities.';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_finished_at IS 'End of the last pass over all activities.';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_ms IS 'Duration of the last pass in milliseconds.';
COMMENT ON COLUMN redpacket.reconciler_status.activities_checked IS 'Activities the last pass checked.';
COMMENT ON COLUMN redpacket.reconciler_status.failures IS 'Activities of the last pass that failed a check, could not be checked, or were incomplete.';
COMMENT ON COLUMN redpacket.reconciler_status.next_due_at IS 'last_pass_finished_at + redpacket.reconcile_interval; NULL when the worker is paused or not loaded.';
COMMENT ON COLUMN redpacket.reconciler_status.last_full_check_at IS 'Oldest of the activities'' last full checks: every activity was fully checked since then.';
REVOKE ALL ON redpacket.reconciler, redpacket.reconciler_status FROM PUBLIC;

-- [rec] A pass for schedulers that fails when a check fails.  A procedure,
-- so that it can commit what the pass recorded (rows, freezes) before it
-- raises the error a scheduler sees; SECURITY INVOKER (a procedure with
-- SECURITY DEFINER or SET cannot commit), so every name in it is qualified
-- and the caller needs EXECUTE on rp_reconcile (rp_grant_operator).
CREATE PROCEDURE redpacket.rp_reconcile_strict(full_check boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    checked pg_catalog.int8;
    failed pg_catalog.int8;
    which pg_catalog.text;
BEGIN
    -- SECURITY INVOKER (it commits, so it cannot SET search_path): every name
    -- below is qualified or typed, and the path is pinned for its statements.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF full_check IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'full_check must not be NULL';
    END IF;
    SELECT pg_catalog.count(*), pg_catalog.count(*) FILTER (WHERE NOT r.ok),
           pg_catalog.string_agg(r.activity_id::pg_catalog.text, ', ') FILTER (WHERE NOT r.ok)
      INTO checked, failed, which
      FROM redpacket.rp_reconcile(NULL::pg_catalog.int8, full_check) r;
    COMMIT;
    IF failed OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'data_corrupted',
            MESSAGE = pg_catalog.format('redpacket reconciliation failed for %s of %s activities', failed, checked),
            DETAIL = pg_catalog.format('Failed activities: %s.', which),
            HINT = 'The failed checks are recorded in redpacket.reconciliation (problems, error); the pass itself was committed.';
    END IF;
END;
$$;
COMMENT ON PROCEDURE redpacket.rp_reconcile_strict(boolean) IS
    'rp_reconcile() for schedulers (CALL it, outside a transaction block): commits the pass, then raises SQLSTATE XX001 when any check failed, so pg_cron records the run as failed.';
REVOKE ALL ON PROCEDURE redpacket.rp_reconcile_strict(boolean) FROM PUBLIC;

-- [ops] Counters, the application's read-only view of an activity, role helpers

CREATE FUNCTION redpacket.rp_activity_stats(
    OUT activity_id bigint,
    OUT duplicate bigint,
    OUT frozen bigint,
    OUT not_started bigint,
    OUT ended bigint,
    OUT user_limit bigint,
    OUT exhausted bigint,
    OUT claimed bigint,
    OUT stripe_waits bigint,
    OUT gathers bigint,
    OUT errors bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rp_activity_stats'
LANGUAGE C VOLATILE SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_activity_stats() IS
    'The shared-memory counters of this database''s activities (empty unless redpacket is in shared_preload_libraries); a row with a NULL activity_id holds the events of activities that found the table full. Read it through the activity_stats view.';

CREATE FUNCTION redpacket.rp_stats_reset(activity bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_stats_reset'
LANGUAGE C VOLATILE SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_stats_reset(bigint) IS
    'Forgets the counters of one activity of this database, or with NULL of all of them and the untracked counters; returns how many activities were forgotten. Also frees the counters of dropped databases and of a dropped installation of the extension.';

CREATE VIEW redpacket.activity_stats AS
SELECT activity_id, claimed, duplicate, exhausted, frozen, ended, not_started, user_limit,
       stripe_waits, gathers, errors
FROM redpacket.rp_activity_stats();
COMMENT ON VIEW redpacket.activity_stats IS
    'Answers and events per activity of this database since the server started, CREATE EXTENSION or rp_stats_reset(): kept in shared memory, lost on restart, empty unless redpacket is in shared_preload_libraries.';
COMMENT ON COLUMN redpacket.activity_stats.activity_id IS 'The activity; NULL for the row of events of activities that did not fit in redpacket.stats_max_activities (all databases).';
COMMENT ON COLUMN redpacket.activity_stats.claimed IS 'Answers claimed (new claims recorded; counted when answered, even if the caller later rolled back).';
COMMENT ON COLUMN redpacket.activity_stats.duplicate IS 'Answers duplicate (retries or second grabs).';
COMMENT ON COLUMN redpacket.activity_stats.exhausted IS 'Answers exhausted (budget or packets could not cover the claim).';
COMMENT ON COLUMN redpacket.activity_stats.frozen IS 'Answers frozen.';
COMMENT ON COLUMN redpacket.activity_stats.ended IS 'Answers ended (after ends_at or close).';
COMMENT ON COLUMN redpacket.activity_stats.not_started IS 'Answers not_started (before starts_at).';
COMMENT ON COLUMN redpacket.activity_stats.user_limit IS 'Answers user_limit (the user already held per_user_limit claims).';
COMMENT ON COLUMN redpacket.activity_stats.stripe_waits IS 'Times a claim waited for a busy stripe lock.';
COMMENT ON COLUMN redpacket.activity_stats.gathers IS 'Times a claim locked every stripe to pay from the whole remaining budget.';
COMMENT ON COLUMN redpacket.activity_stats.errors IS 'Claim calls that raised an error.';

CREATE FUNCTION redpacket.rp_activity_info(activity bigint)
RETURNS TABLE (state text, remaining_amount numeric, remaining_packets bigint,
               starts_at timestamptz, ends_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF activity IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'activity must not be NULL';
    END IF;
    RETURN QUERY
        SELECT s.state, s.remaining_amount, s.remaining_packets, s.starts_at, s.ends_at
          FROM redpacket.activity_status s
         WHERE s.id OPERATOR(pg_catalog.=) rp_activity_info.activity;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = pg_catalog.format('activity %s does not exist', activity);
    END IF;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_activity_info(bigint) IS
    'Read-only view of one activity for applications: its state (scheduled, active, exhausted, ended, frozen), remaining amount and packets, start and end. Granted by rp_grant_app.';

REVOKE ALL ON FUNCTION redpacket.rp_activity_stats(), redpacket.rp_stats_reset(bigint),
    redpacket.rp_activity_info(bigint) FROM PUBLIC;
REVOKE ALL ON redpacket.activity_stats FROM PUBLIC;

-- [ops] A comment on every object: psql's \d+ and \df+ are the operator's manual
COMMENT ON SCHEMA redpacket IS
    'redpacket: lucky-money activities, claims, ledger and reconciliation, enforced in the database. Money moves only through the rp_* functions.';
COMMENT ON SEQUENCE redpacket.activity_id_seq IS 'Ids of activities.';
COMMENT ON SEQUENCE redpacket.claim_id_seq IS 'Ids of claims, in the order stripe locks are granted (no CACHE: the reconciliation watermark relies on it).';
COMMENT ON SEQUENCE redpacket.ledger_entry_id_seq IS 'Ids of ledger entries.';
COMMENT ON SEQUENCE redpacket.reconciliation_pass_id_seq IS 'Ids of reconciliation rows; a later pass has a larger id.';
COMMENT ON COLUMN redpacket.activity.id IS 'Activity id, returned by rp_create_activity.';
COMMENT ON COLUMN redpacket.activity.name IS 'Free-form label given at creation; not unique.';
COMMENT ON COLUMN redpacket.activity.starts_at IS 'Claims before this time get not_started.';
COMMENT ON COLUMN redpacket.activity.ends_at IS 'Claims at or after this time get ended; NULL means open-ended.';
COMMENT ON COLUMN redpacket.activity.frozen_at IS 'When the current freeze began; NULL while not frozen.';
COMMENT ON COLUMN redpacket.activity.created_at IS 'When the activity was created.';
COMMENT ON COLUMN redpacket.activity.created_by IS 'Session user who created the activity.';
COMMENT ON COLUMN redpacket.stripe.activity_id IS 'The activity this stripe belongs to.';
COMMENT ON COLUMN redpacket.stripe.stripe IS 'Stripe number, 0 to stripes - 1.';
COMMENT ON COLUMN redpacket.claim.activity_id IS 'The activity claimed from.';
COMMENT ON COLUMN redpacket.claim.claim_id IS 'Claim id, returned by rp_claim.';
COMMENT ON COLUMN redpacket.claim.user_id IS 'The application''s user id (opaque, at most 256 bytes, compared byte-wise).';
COMMENT ON COLUMN redpacket.claim.request_id IS 'The caller''s request id, required when per_user_limit is above 1; NULL otherwise.';
COMMENT ON COLUMN redpacket.claim.amount IS 'Amount paid, in currency units with the activity''s scale.';
COMMENT ON COLUMN redpacket.claim.claimed_at IS 'When the claim was recorded.';
COMMENT ON COLUMN redpacket.ledger.activity_id IS 'The activity the money moved for.';
COMMENT ON COLUMN redpacket.ledger.entry_id IS 'Ledger entry id.';
COMMENT ON COLUMN redpacket.ledger.kind IS 'fund (the budget, once at creation) or return (the remainder, once at close or expiry).';
COMMENT ON COLUMN redpacket.ledger.amount IS 'Amount moved, in currency units with the activity''s scale.';
COMMENT ON COLUMN redpacket.ledger.reason IS 'Why the money moved (creation, close, expiry).';
COMMENT ON COLUMN redpacket.ledger.created_at IS 'When the entry was recorded.';
COMMENT ON COLUMN redpacket.ledger.created_by IS 'Session user (or the reconciler''s role) who recorded the entry.';
COMMENT ON COLUMN redpacket.reconcile_state.activity_id IS 'The activity this watermark belongs to.';
COMMENT ON COLUMN redpacket.reconcile_state.last_claim_id IS 'Claims with ids up to this one are summed into claimed and claim_count.';
COMMENT ON COLUMN redpacket.reconcile_state.claimed IS 'Sum of the amounts of the claims up to last_claim_id.';
COMMENT ON COLUMN redpacket.reconcile_state.claim_count IS 'Number of claims up to last_claim_id.';
COMMENT ON COLUMN redpacket.reconcile_state.settled IS 'True once an expired activity''s remainder was returned by a pass.';
COMMENT ON COLUMN redpacket.reconcile_state.last_pass_at IS 'When a pass last checked this activity.';
COMMENT ON COLUMN redpacket.reconcile_state.last_balance IS 'Sum of the stripe balances the last pass saw.';
COMMENT ON COLUMN redpacket.reconcile_state.last_packets IS 'Sum of the stripe packet counts the last pass saw.';
COMMENT ON COLUMN redpacket.reconcile_state.last_claims IS 'Sum of the stripe claim counters the last pass saw.';
COMMENT ON COLUMN redpacket.reconciliation.activity_id IS 'The activity checked.';
COMMENT ON COLUMN redpacket.reconciliation.pass_id IS 'Row id; later passes have larger ids.';
COMMENT ON COLUMN redpacket.reconciliation.checked_at IS 'When the pass checked the activity.';
COMMENT ON COLUMN redpacket.reconciliation.full_check IS 'True when every claim was re-summed, false when only claims past the watermark were.';
COMMENT ON COLUMN redpacket.reconciliation.expected IS 'funded - returned - sum of claims, in currency units; NULL when the check could not run (problems = {error}).';
COMMENT ON COLUMN redpacket.reconciliation.actual IS 'Sum of the stripe balances, in currency units; NULL when the check could not run (problems = {error}).';
COMMENT ON COLUMN redpacket.reconciliation.drift IS 'actual - expected; 0 when the books balance.';
COMMENT ON COLUMN redpacket.reconciliation.expected_packets IS 'packets - number of claims, 0 once the activity is closed; NULL when the activity has no packet cap.';
COMMENT ON COLUMN redpacket.reconciliation.actual_packets IS 'Sum of the stripe packet counts; NULL when the activity has no packet cap.';
COMMENT ON COLUMN redpacket.reconciliation.expected_claims IS 'Number of claims in the claim table.';
COMMENT ON COLUMN redpacket.reconciliation.actual_claims IS 'Sum of the stripe claim counters.';
COMMENT ON COLUMN redpacket.reconciliation.negative_stripes IS 'Stripes with a negative balance or packet count (must be 0).';
COMMENT ON COLUMN redpacket.reconciliation.new_claims IS 'Claims this pass counted past the previous watermark.';
COMMENT ON COLUMN redpacket.reconciliation.ok IS 'True when every check held; false raises an alert (and freezes when redpacket.freeze_on_mismatch is on).';
COMMENT ON COLUMN redpacket.activity_status.id IS 'Activity id.';
COMMENT ON COLUMN redpacket.activity_status.name IS 'Activity name.';
COMMENT ON COLUMN redpacket.activity_status.state IS 'scheduled, active, exhausted, ended or frozen (frozen wins over the others).';
COMMENT ON COLUMN redpacket.activity_status.scale IS 'Fractional digits of the currency unit.';
COMMENT ON COLUMN redpacket.activity_status.total IS 'Funded budget.';
COMMENT ON COLUMN redpacket.activity_status.claimed_amount IS 'total - returned - remaining: what claims have taken.';
COMMENT ON COLUMN redpacket.activity_status.claimed_count IS 'Claims recorded (sum of the stripe claim counters).';
COMMENT ON COLUMN redpacket.activity_status.remaining_amount IS 'Budget still claimable (sum of the stripe balances).';
COMMENT ON COLUMN redpacket.activity_status.remaining_packets IS 'Packets still claimable; NULL when there is no packet cap.';
COMMENT ON COLUMN redpacket.activity_status.stripes IS 'Number of stripes.';
COMMENT ON COLUMN redpacket.activity_status.starts_at IS 'When claims open.';
COMMENT ON COLUMN redpacket.activity_status.ends_at IS 'When claims close; NULL means open-ended.';
COMMENT ON COLUMN redpacket.activity_status.last_reconciled_at IS 'When a reconciliation pass last checked this activity; NULL if never. An activity that did not change is not checked again, so an old value alone is not a problem.';
COMMENT ON COLUMN redpacket.activity_status.last_reconcile_ok IS 'Result of the latest check of this activity.';
COMMENT ON COLUMN redpacket.activity_status.frozen_reason IS 'Why the activity is frozen; NULL when it is not.';
-- [life] Drop guard -------------------------------------------------------------
-- DROP EXTENSION redpacket (or DROP SCHEMA redpacket CASCADE, or DROP OWNED BY
-- its owner) would delete every claim and ledger entry with the tables; the
-- guard refuses that unless redpacket.allow_drop is on.  An event trigger the
-- extension owns: pg_dump leaves it to CREATE EXTENSION, and calling its
-- function loads the library in any session.

CREATE FUNCTION redpacket.rp_drop_guard() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'rp_drop_guard'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_drop_guard() IS
    'Event trigger function: refuses DROP EXTENSION redpacket, DROP SCHEMA redpacket CASCADE and DROP OWNED BY the extension owner while claims or ledger entries exist, unless redpacket.allow_drop is on.';
REVOKE ALL ON FUNCTION redpacket.rp_drop_guard() FROM PUBLIC;

CREATE EVENT TRIGGER redpacket_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION redpacket.rp_drop_guard();
-- also under session_replication_role = replica
ALTER EVENT TRIGGER redpacket_drop_guard ENABLE ALWAYS;
COMMENT ON EVENT TRIGGER redpacket_drop_guard IS
    'Refuses to drop redpacket''s tables while they hold money records (see redpacket.allow_drop).';

-- [life] Publication for wallets and CDC ------------------------------------------
-- Claims and ledger entries as a logical-replication stream for a wallet
-- service or a Debezium-style consumer (doc/wallet.md).  Made
-- here, or completed when it survived a DROP EXTENSION.  PostgreSQL 15 cannot
-- make a publication an extension member, so the publication keeper (event
-- triggers below, src/guard.c) puts claim and ledger back into it when a
-- dump recreates it.  It needs wal_level = logical only when someone
-- subscribes; PostgreSQL's warning about that is silenced here (client and
-- server log) and documented instead.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication
                    WHERE pubname OPERATOR(pg_catalog.=) 'redpacket_events') THEN
        SET LOCAL client_min_messages = error;
        SET LOCAL log_min_messages = error;
        CREATE PUBLICATION redpacket_events FOR TABLE redpacket.claim, redpacket.ledger;
    ELSE
        ALTER PUBLICATION redpacket_events ADD TABLE redpacket.claim, redpacket.ledger;
    END IF;
END
$$;
COMMENT ON PUBLICATION redpacket_events IS
    'Every claim and ledger entry, for subscribers that credit wallets; consumers are idempotent on (activity_id, claim_id) for claims and (activity_id, entry_id) for ledger entries. Kept by the redpacket_publication_* event triggers.';

-- Not SECURITY DEFINER: it drops and alters the publication with the rights
-- of whoever runs CREATE PUBLICATION, so a role that may not own
-- redpacket_events cannot make it do so.
CREATE FUNCTION redpacket.rp_publication_keeper() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'rp_publication_keeper'
LANGUAGE C SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_publication_keeper() IS
    'Event trigger function: when CREATE PUBLICATION redpacket_events runs (a restored dump), replaces the one the extension made and puts claim and ledger into it.';
REVOKE ALL ON FUNCTION redpacket.rp_publication_keeper() FROM PUBLIC;

CREATE EVENT TRIGGER redpacket_publication_start ON ddl_command_start
    WHEN TAG IN ('CREATE PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
CREATE EVENT TRIGGER redpacket_publication_end ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
COMMENT ON EVENT TRIGGER redpacket_publication_start IS
    'Before CREATE PUBLICATION redpacket_events (from a dump): drops the one CREATE EXTENSION made.';
COMMENT ON EVENT TRIGGER redpacket_publication_end IS
    'After CREATE PUBLICATION redpacket_events (from a dump): puts redpacket.claim and redpacket.ledger into it.';

-- [life] Restore procedure ------------------------------------------------------
-- CALL redpacket.rp_pre_restore() before restoring a dump into this database
-- and CALL redpacket.rp_post_restore() after it (README "Backup and
-- restore").  Between them no reconciliation pass writes anything here.
-- Procedures without SET clauses so that they can commit; every name in
-- them is qualified.  Superuser only: redpacket.restoring is PGC_SUSET.

CREATE PROCEDURE redpacket.rp_pre_restore()
LANGUAGE plpgsql AS $$
DECLARE
    clean integer := 0;
BEGIN
    EXECUTE pg_catalog.format('ALTER DATABASE %I SET redpacket.restoring = on',
                              pg_catalog.current_database());
    PERFORM pg_catalog.set_config('redpacket.restoring', 'on', false);
    COMMIT;
    -- a pass that began before the commit may still be checking one
    -- activity: wait until no pass holds the reconciliation lock (advisory
    -- lock kind 0x5203 = 20995 in this database), seen free twice in a row
    WHILE clean < 2 LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                    WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
                      AND l.objsubid OPERATOR(pg_catalog.=) 20995
                      AND l.database OPERATOR(pg_catalog.=)
                          (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) THEN
            clean := 0;
        ELSE
            clean := clean OPERATOR(pg_catalog.+) 1;
        END IF;
        PERFORM pg_catalog.pg_sleep(0.1);
    END LOOP;
    RAISE NOTICE 'redpacket: restore mode is on for database %', pg_catalog.current_database()
        USING HINT = 'Restore the dump, then CALL redpacket.rp_post_restore().';
END;
$$;
COMMENT ON PROCEDURE redpacket.rp_pre_restore() IS
    'Before a restore into this database: sets redpacket.restoring = on for the database and the session (no reconciliation pass writes while it is on) and waits for a running pass to finish.';
REVOKE ALL ON PROCEDURE redpacket.rp_pre_restore() FROM PUBLIC;

CREATE PROCEDURE redpacket.rp_post_restore()
LANGUAGE plpgsql AS $$
DECLARE
    a record;
    r record;
    deadline timestamptz;
    checked bigint := 0;
    failed bigint := 0;
BEGIN
    EXECUTE pg_catalog.format('ALTER DATABASE %I RESET redpacket.restoring',
                              pg_catalog.current_database());
    PERFORM pg_catalog.set_config('redpacket.restoring', 'off', false);
    COMMIT;
    -- a full check of every activity, one transaction each (so the locks of
    -- one activity at a time are held); a pass of the worker running at the
    -- same moment makes rp_reconcile return no row: wait and try again
    FOR a IN SELECT act.id FROM redpacket.activity act ORDER BY act.id LOOP
        deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) interval '60 s';
        LOOP
            SELECT pg_catalog.count(*) AS n,
                   pg_catalog.count(*) FILTER (WHERE NOT x.ok) AS bad
              INTO r FROM redpacket.rp_reconcile(a.id, true) x;
            EXIT WHEN r.n OPERATOR(pg_catalog.>) 0;
            IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>) deadline THEN
                RAISE EXCEPTION 'redpacket: activity % could not be checked within 60 s', a.id
                    USING ERRCODE = 'lock_not_available',
                          HINT = 'Another reconciliation pass kept running; CALL redpacket.rp_post_restore() again.';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.1);
        END LOOP;
        checked := checked OPERATOR(pg_catalog.+) 1;
        failed := failed OPERATOR(pg_catalog.+) r.bad;
        COMMIT;
    END LOOP;
    IF failed OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'redpacket: restore finished, % activities checked, % failed', checked, failed
            USING HINT = 'See redpacket.reconciliation for the failed checks.';
    ELSE
        RAISE NOTICE 'redpacket: restore finished, % activities checked, all ok', checked;
    END IF;
END;
$$;
COMMENT ON PROCEDURE redpacket.rp_post_restore() IS
    'After a restore into this database: clears redpacket.restoring for the database and the session, then fully checks every activity, one transaction each. CALL it outside a transaction block.';
REVOKE ALL ON PROCEDURE redpacket.rp_post_restore() FROM PUBLIC;

-- [citus] Scale-out on Citus ------------------------------------------
-- rp_distribute() turns an installed redpacket into a Citus-distributed one;
-- rp_node_sequences() is its per-node part.  Both are for the extension owner
-- (a superuser on a Citus cluster) and granted to nobody.

CREATE FUNCTION redpacket.rp_node_sequences() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    grp  bigint;
    seq  text;
    top  bigint;
    last bigint;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'citus is not installed in this database',
            HINT = 'Run CREATE EXTENSION citus on every node first.';
    END IF;
    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO grp;
    IF grp IS NULL OR grp OPERATOR(pg_catalog.<) 0 OR grp OPERATOR(pg_catalog.>) 32766 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = pg_catalog.format('this node has no usable Citus group id (%s)', grp),
            HINT = 'Add the node to the cluster with citus_add_node() on the coordinator first.';
    END IF;
    -- Node group g hands out ids in [g * 2^48 + 1, (g + 1) * 2^48 - 1].
    top := ((grp OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.<<) 48) OPERATOR(pg_catalog.-) 1;
    FOREACH seq IN ARRAY ARRAY['activity_id_seq', 'claim_id_seq', 'ledger_entry_id_seq',
                               'reconciliation_pass_id_seq'] LOOP
        last := GREATEST(
            pg_catalog.pg_sequence_last_value(pg_catalog.format('redpacket.%I', seq)::pg_catalog.regclass),
            grp OPERATOR(pg_catalog.<<) 48);
        IF last OPERATOR(pg_catalog.>=) top THEN
            RAISE EXCEPTION USING
                ERRCODE = 'sequence_generator_limit_exceeded',
                MESSAGE = pg_catalog.format('sequence redpacket.%I is beyond the range of node group %s', seq, grp);
        END IF;
        EXECUTE pg_catalog.format('ALTER SEQUENCE redpacket.%I MAXVALUE %s', seq, top);
        -- setval, not RESTART: the sequence then reports its last value, which
        -- the reconciler's completeness check compares ids against.
        IF last OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.setval(pg_catalog.format('redpacket.%I', seq)::pg_catalog.regclass, last, true);
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_node_sequences() IS
    'Citus: gives this node''s redpacket sequences the id range of its node group (group g: g*2^48+1 up to (g+1)*2^48-1), never going backwards, so ids drawn on different nodes never collide and claim ids of an activity keep rising on the node that holds it. Called by rp_distribute() on every node.';

CREATE FUNCTION redpacket.rp_distribute(shard_count integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t      record;
    f      text;
    r      record;
    mine   text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'citus is not installed in this database',
            DETAIL = 'rp_distribute() distributes redpacket''s tables with Citus.',
            HINT = 'Preload citus before redpacket on every node, CREATE EXTENSION citus, add the workers, then call rp_distribute() on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'rp_distribute() must run on the Citus coordinator',
            HINT = 'Connect to the coordinator, or call citus_set_coordinator_host() there first.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node n
                    WHERE n.groupid OPERATOR(pg_catalog.<>) 0 AND n.isactive) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'the Citus cluster has no worker node',
            HINT = 'Add the workers with citus_add_node() first.';
    END IF;
    -- Every worker must have the same redpacket (its functions run there).
    SELECT e.extversion INTO mine FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'redpacket';
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 $q$SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'redpacket'$q$) LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM mine THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('worker %s:%s does not have redpacket %s', r.nodename, r.nodeport, mine),
                DETAIL = pg_catalog.format('It answered: %s.', COALESCE(NULLIF(r.result, ''), 'not installed')),
                HINT = 'Install the same redpacket on every node (shared_preload_libraries = ''citus,redpacket'', CREATE EXTENSION redpacket), then retry.';
        END IF;
    END LOOP;

    -- No reconciliation pass (worker or rp_reconcile) may run while the tables
    -- move: it would read half-moved data.  These locks make every pass on
    -- this node wait until this transaction commits (create_distributed_table
    -- takes them too, but one at a time; here all of them come first, in one
    -- order).  The workers' passes: see the end.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation IN ACCESS EXCLUSIVE MODE;

    PERFORM pg_catalog.set_config('citus.shard_replication_factor', '1', true);
    -- The append-only triggers must hold on every shard.
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    IF shard_count IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.shard_count', shard_count::text, true);
    END IF;

    -- Every table is keyed by activity first; all colocated with activity, so
    -- one activity's rows sit on one node.  No reference table: nothing is
    -- shared between activities.
    FOR t IN SELECT * FROM (VALUES (1, 'redpacket.activity', 'id'),
                                   (2, 'redpacket.stripe', 'activity_id'),
                                   (3, 'redpacket.claim', 'activity_id'),
                                   (4, 'redpacket.ledger', 'activity_id'),
                                   (5, 'redpacket.reconcile_state', 'activity_id'),
                                   (6, 'redpacket.reconciliation', 'activity_id')) v(n, rel, col)
             ORDER BY n LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
                               WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.create_distributed_table(t.rel::pg_catalog.regclass, t.col,
            colocate_with => CASE WHEN t.n OPERATOR(pg_catalog.=) 1 THEN 'none' ELSE 'redpacket.activity' END);
        -- The rows now live in the shards; drop the invisible local copy
        -- (the append-only guard must not fire for that: replica role).
        PERFORM pg_catalog.set_config('session_replication_role', 'replica', true);
        PERFORM pg_catalog.truncate_local_data_after_distributing_table(t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.set_config('session_replication_role', 'origin', true);
    END LOOP;

    -- Every function that takes our locks runs on the node holding the
    -- activity, also inside an explicit transaction (force_delegation).
    FOREACH f IN ARRAY ARRAY['redpacket.rp_claim(bigint, text, numeric, text)',
                             'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])',
                             'redpacket.rp_close_activity(bigint)',
                             'redpacket.rp_freeze(bigint, text)',
                             'redpacket.rp_unfreeze(bigint)'] LOOP
        PERFORM pg_catalog.create_distributed_function(f::pg_catalog.regprocedure, distribution_arg_name => 'activity',
            colocate_with => 'redpacket.activity', force_delegation => true);
    END LOOP;
    -- rp_reconcile(NULL) lists every activity: forced delegation would refuse
    -- that query, so it is delegated only when called on its own.
    PERFORM pg_catalog.create_distributed_function('redpacket.rp_reconcile(bigint, boolean)'::pg_catalog.regprocedure,
        distribution_arg_name => 'activity', colocate_with => 'redpacket.activity');

    -- Disjoint id ranges per node.
    PERFORM redpacket.rp_node_sequences();
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 'SELECT redpacket.rp_node_sequences()') LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('could not set the sequences of worker %s:%s', r.nodename, r.nodeport),
                DETAIL = r.result;
        END IF;
    END LOOP;

    -- The lock above holds this node's passes only.  A worker's own pass
    -- reads its copy of the tables, which Citus turns into distributed
    -- tables when this transaction commits there: a pass planning its query
    -- at that moment sees them change under it and fails.  The tables are
    -- distributed now, so the same LOCK goes to every worker, inside this
    -- transaction: their passes wait until the commit, or it waits for them.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation IN ACCESS EXCLUSIVE MODE;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_distribute(integer) IS
    'Citus, on the coordinator: distributes every redpacket table by activity id (colocated with redpacket.activity, no reference table), delegates every function that takes redpacket''s locks to the node holding the activity (force_delegation, but rp_reconcile only in its own statement), and gives each node''s sequences a disjoint range; reconciliation passes on every node wait while it converts. Refuses without Citus, off the coordinator, or when a worker lacks the same redpacket.';

REVOKE ALL ON FUNCTION redpacket.rp_node_sequences(), redpacket.rp_distribute(integer) FROM PUBLIC;

-- ============================================================================
-- 1.4: the additions to 1.3, area by area, in the order of
-- redpacket--1.3--1.4.sql.
-- ============================================================================

-- [engine] The claim engine ---------------------------------------------------
-- revision: bumped, under every stripe lock of the activity, by any change
-- of what a claim reads from the activity once and keeps (the schedule, the
-- packet cap); a claim pays from a stripe only at the revision it read.
-- dealt: amounts of a lucky draw drawn ahead for the whole activity (the
-- double-mean method over its undealt money and packets) and dealt to this
-- stripe; dealt_units and dealt_count are their sum and number, which
-- balance and packets include.  Fixed amounts are paid from the rest.
ALTER TABLE redpacket.activity ADD COLUMN revision bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.activity.revision IS
    'Bumped by every change of the schedule or the packet cap; the stripes carry the same number.';
ALTER TABLE redpacket.activity ADD COLUMN restricted boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN redpacket.activity.restricted IS
    'Only users on the activity''s list (redpacket.eligible) may claim; others get not_eligible.';
CREATE TABLE redpacket.eligible (
    activity_id bigint NOT NULL,
    user_id     text COLLATE "C" NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    added_by    name NOT NULL DEFAULT pg_catalog.session_user(),
    PRIMARY KEY (activity_id, user_id)
);
COMMENT ON TABLE redpacket.eligible IS
    'The users who may claim from a restricted activity (rp_allow, rp_disallow). Removing a user never touches a claim already made.';
COMMENT ON COLUMN redpacket.eligible.activity_id IS 'The restricted activity.';
COMMENT ON COLUMN redpacket.eligible.user_id IS 'A user who may claim (compared byte-wise, as claim.user_id).';
COMMENT ON COLUMN redpacket.eligible.added_at IS 'When the user was added.';
COMMENT ON COLUMN redpacket.eligible.added_by IS 'Session user who added the user.';
REVOKE ALL ON redpacket.eligible FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('redpacket.eligible', '');
ALTER TABLE redpacket.stripe
    ADD COLUMN revision bigint NOT NULL DEFAULT 0,
    ADD COLUMN dealt bigint[],
    ADD COLUMN dealt_units bigint NOT NULL DEFAULT 0,
    ADD COLUMN dealt_count integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.stripe.revision IS
    'The activity''s revision this stripe was last brought to; a claim pays from it only at the revision it read.';
COMMENT ON COLUMN redpacket.stripe.dealt IS
    'Lucky-draw amounts (minor units) drawn ahead for the whole activity and dealt to this stripe, next first; NULL when none.';
COMMENT ON COLUMN redpacket.stripe.dealt_units IS 'Sum of dealt (included in balance).';
COMMENT ON COLUMN redpacket.stripe.dealt_count IS 'Number of dealt amounts (included in packets).';

-- Ledger entries of 1.4: top_up and withdraw (an operator changes a live
-- budget, any number of times), refund (a claim reversed after its activity
-- was settled goes back to the funder).  The funding and the return of the
-- remainder stay at most one each.
ALTER TABLE redpacket.ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE redpacket.ledger ADD CONSTRAINT ledger_kind_check
    CHECK (kind IN ('fund', 'top_up', 'withdraw', 'return', 'refund'));
DROP INDEX redpacket.ledger_once;
CREATE UNIQUE INDEX ledger_once ON redpacket.ledger (activity_id, kind)
    WHERE kind IN ('fund', 'return');
COMMENT ON INDEX redpacket.ledger_once IS
    'An activity is funded once and its remainder returned at most once.';
COMMENT ON COLUMN redpacket.ledger.kind IS
    'fund (the budget, once at creation), top_up and withdraw (an operator changed the budget), return (the remainder, once at close or expiry), refund (a claim reversed after settlement, back to the funder).';

-- How many packets an entry adds to (fund, top_up) or takes from the cap;
-- NULL when it moves none.  activity.total and activity.packets keep what
-- the activity was created with; the funded total and the packet cap of
-- today are the sums of the ledger.
ALTER TABLE redpacket.ledger ADD COLUMN packets integer;
COMMENT ON COLUMN redpacket.ledger.packets IS
    'Packets this entry adds to the cap (fund: the cap at creation; top_up: the packets added); NULL when it moves none. Entries written before 1.4 have NULL (their fund entry''s packets are activity.packets).';

-- Every change of an activity after its creation, whatever made it: the
-- operator's (top_up, withdraw, set_window, freeze, unfreeze, close, allow,
-- disallow, reverse), the reconciler's (settle, freeze).  Append-only;
-- written by RpRecordChange (src/change.c).
CREATE SEQUENCE redpacket.activity_change_id_seq;
CREATE TABLE redpacket.activity_change (
    activity_id bigint NOT NULL,
    change_id   bigint NOT NULL DEFAULT pg_catalog.nextval('redpacket.activity_change_id_seq'),
    changed_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    changed_by  name NOT NULL DEFAULT pg_catalog.session_user(),
    kind        text NOT NULL CHECK (kind IN ('top_up', 'withdraw', 'set_window', 'freeze',
                                              'unfreeze', 'close', 'settle', 'allow',
                                              'disallow', 'reverse', 'repair')),
    before      jsonb,
    after       jsonb,
    reason      text,
    PRIMARY KEY (activity_id, change_id)
);
ALTER SEQUENCE redpacket.activity_change_id_seq OWNED BY redpacket.activity_change.change_id;
COMMENT ON SEQUENCE redpacket.activity_change_id_seq IS 'Ids of activity changes.';
COMMENT ON TABLE redpacket.activity_change IS
    'One row per change of an activity after its creation, whoever made it (operator or reconciler): what it was before, what it is after, and why. Append-only.';
COMMENT ON COLUMN redpacket.activity_change.activity_id IS 'The activity changed.';
COMMENT ON COLUMN redpacket.activity_change.change_id IS 'Change id; a later change has a larger id.';
COMMENT ON COLUMN redpacket.activity_change.changed_at IS 'When the change was made (its transaction''s start).';
COMMENT ON COLUMN redpacket.activity_change.changed_by IS 'Session user who made it (the reconciler''s role for settle and reconciliation freezes).';
COMMENT ON COLUMN redpacket.activity_change.kind IS
    'top_up, withdraw, set_window, freeze, unfreeze, close, settle, allow, disallow, reverse or repair.';
COMMENT ON COLUMN redpacket.activity_change.before IS 'What the change replaced (the fields it changed), as JSON.';
COMMENT ON COLUMN redpacket.activity_change.after IS 'What the change set (the fields it changed, or counts for allow and disallow), as JSON.';
COMMENT ON COLUMN redpacket.activity_change.reason IS 'The reason given, if any.';
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON redpacket.activity_change
    FOR EACH ROW EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON redpacket.activity_change
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.refuse_change();
REVOKE ALL ON redpacket.activity_change, redpacket.activity_change_id_seq FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('redpacket.activity_change', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.activity_change_id_seq', '');

-- What each kind of role may use, one row per grant: rp_grant_app,
-- rp_grant_operator (and later helpers) grant exactly the rows of their
-- kind, so a function added by a later version is one row here.
CREATE TABLE redpacket.role_grant (
    role_kind text NOT NULL CHECK (role_kind IN ('app', 'operator', 'wallet', 'sender')),
    privilege text NOT NULL,
    PRIMARY KEY (role_kind, privilege)
);
COMMENT ON TABLE redpacket.role_grant IS
    'What the rp_grant_* helpers grant: for each kind of role, the GRANT clauses (privilege ON object) it receives besides USAGE on the schema. Part of the extension''s definition; not dumped.';
COMMENT ON COLUMN redpacket.role_grant.role_kind IS 'app (rp_grant_app), operator (rp_grant_operator), wallet (rp_grant_wallet) or sender (rp_grant_sender).';
COMMENT ON COLUMN redpacket.role_grant.privilege IS 'A GRANT clause without its TO part, e.g. EXECUTE ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text).';
REVOKE ALL ON redpacket.role_grant FROM PUBLIC;
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text)'),
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_claim_batch(bigint, text[], numeric[], text[])'),
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_close_activity(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_freeze(bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_unfreeze(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_reconcile(bigint, boolean)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_activity_stats()'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_stats_reset(bigint)'),
    ('operator', 'EXECUTE ON PROCEDURE redpacket.rp_reconcile_strict(boolean)'),
    ('operator', 'SELECT ON redpacket.activity'),
    ('operator', 'SELECT ON redpacket.stripe'),
    ('operator', 'SELECT ON redpacket.claim'),
    ('operator', 'SELECT ON redpacket.ledger'),
    ('operator', 'SELECT ON redpacket.reconcile_state'),
    ('operator', 'SELECT ON redpacket.reconciliation'),
    ('operator', 'SELECT ON redpacket.activity_status'),
    ('operator', 'SELECT ON redpacket.activity_stats'),
    ('operator', 'SELECT ON redpacket.reconciler'),
    ('operator', 'SELECT ON redpacket.reconciler_status'),
    ('operator', 'SELECT ON redpacket.activity_change');

CREATE FUNCTION redpacket.rp_grant_role(role regrole, kind text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
BEGIN
    IF role IS NULL OR kind IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'role and kind must not be NULL';
    END IF;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA redpacket TO %s', role);
    FOR g IN SELECT r.privilege FROM redpacket.role_grant r
              WHERE r.role_kind OPERATOR(pg_catalog.=) kind ORDER BY r.privilege LOOP
        EXECUTE pg_catalog.format('GRANT %s TO %s', g.privilege, role);
    END LOOP;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_grant_role(regrole, text) IS
    'Grants a role USAGE on the schema and every privilege redpacket.role_grant lists for its kind (app, operator, wallet, sender). Used by the rp_grant_* helpers; for the extension owner.';
REVOKE ALL ON FUNCTION redpacket.rp_grant_role(regrole, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION redpacket.rp_grant_app(role regrole) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT redpacket.rp_grant_role(role, 'app');
END;
COMMENT ON FUNCTION redpacket.rp_grant_app(regrole) IS
    'Grants an application role what it needs to claim: USAGE on the schema and what redpacket.role_grant lists for app (rp_claim, rp_claim_batch and the read-only lookups).';

CREATE OR REPLACE FUNCTION redpacket.rp_grant_operator(role regrole) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT redpacket.rp_grant_role(role, 'operator');
END;
COMMENT ON FUNCTION redpacket.rp_grant_operator(regrole) IS
    'Grants an operator role USAGE on the schema and what redpacket.role_grant lists for operator: the admin functions, reconciliation, the counters and SELECT on the tables and views.';

-- Best luck (手气最佳) of an activity: its largest claim, the earliest of
-- them on a tie, and whether it can still change.
CREATE FUNCTION redpacket.rp_best_luck(activity bigint)
RETURNS TABLE (claim_id bigint, user_id text, amount numeric, claimed_at timestamptz,
               final boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF activity IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'activity must not be NULL';
    END IF;
    -- a reversed claim is not held: it was never luck
    RETURN QUERY
    SELECT c.claim_id, c.user_id, c.amount, c.claimed_at,
           (a.closed_at IS NOT NULL
            OR COALESCE(a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now(), false)
            OR NOT EXISTS (SELECT 1 FROM redpacket.stripe s
                            WHERE s.activity_id OPERATOR(pg_catalog.=) a.id
                              AND s.balance OPERATOR(pg_catalog.>) 0
                              AND (s.packets IS NULL OR s.packets OPERATOR(pg_catalog.>) 0)))
      FROM redpacket.claim c
      JOIN redpacket.activity a ON a.id OPERATOR(pg_catalog.=) c.activity_id
     WHERE c.activity_id OPERATOR(pg_catalog.=) rp_best_luck.activity
       AND NOT EXISTS (SELECT 1 FROM redpacket.claim_settlement r
                        WHERE r.activity_id OPERATOR(pg_catalog.=) c.activity_id
                          AND r.claim_id OPERATOR(pg_catalog.=) c.claim_id
                          AND r.state OPERATOR(pg_catalog.=) 'reversed')
     ORDER BY c.amount DESC, c.claim_id
     LIMIT 1;
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM redpacket.activity a
                                  WHERE a.id OPERATOR(pg_catalog.=) rp_best_luck.activity) THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = pg_catalog.format('activity %s does not exist', rp_best_luck.activity);
    END IF;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_best_luck(bigint) IS
    'Best luck (手气最佳): the activity''s largest claim held (not reversed; the earliest of them on a tie), and final: true once the activity has ended or closed or has no money or packet left (a later top-up can make it false again), else false. No row before the first claim; 22004 for a NULL activity, P0002 for an unknown one. Reads every claim of the activity.';
REVOKE ALL ON FUNCTION redpacket.rp_best_luck(bigint) FROM PUBLIC;
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_best_luck(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_best_luck(bigint)');

-- [campaign] Eligibility lists, live changes and their record -----------------

-- rp_create_activity and rp_activity_info gain an argument: new functions
-- replace the 1.3 ones, with the EXECUTE grants of the old ones (below).
CREATE FUNCTION redpacket.rp_create_activity(
    total          numeric,
    packets        integer DEFAULT NULL,
    starts_at      timestamptz DEFAULT pg_catalog.now(),
    ends_at        timestamptz DEFAULT NULL,
    stripes        integer DEFAULT NULL,
    name           text DEFAULT NULL,
    scale          integer DEFAULT 2,
    per_user_limit integer DEFAULT 1,
    restricted     boolean DEFAULT false)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_create_activity'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean) IS
    'Funds a new activity with total (split over stripes sub-balances) and returns its id; packets caps the number of claims and enables lucky draws; restricted pays only the users rp_allow lists.';
REVOKE ALL ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean) FROM PUBLIC;

-- Today's funded total and packet cap (the ledger's sums; activity.total and
-- activity.packets keep what the activity was created with), and whether it
-- is restricted.  Columns are only added at the end.
CREATE OR REPLACE VIEW redpacket.activity_status AS
SELECT a.id,
       a.name,
       CASE
           WHEN a.frozen_reason IS NOT NULL THEN 'frozen'
           WHEN a.closed_at IS NOT NULL
                OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'ended'
           WHEN a.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'scheduled'
           WHEN s.balance OPERATOR(pg_catalog.=) 0
                OR s.packets OPERATOR(pg_catalog.=) 0 THEN 'exhausted'
           ELSE 'active'
       END AS state,
       a.scale,
       l.funded AS total,
       l.funded OPERATOR(pg_catalog.-) l.returned
                OPERATOR(pg_catalog.-) s.remaining AS claimed_amount,
       s.claims AS claimed_count,
       s.remaining AS remaining_amount,
       s.packets AS remaining_packets,
       a.stripes,
       a.starts_at,
       a.ends_at,
       p.checked_at AS last_reconciled_at,
       p.ok AS last_reconcile_ok,
       a.frozen_reason,
       (SELECT rs.last_full_check_at FROM redpacket.reconcile_state rs
         WHERE rs.activity_id OPERATOR(pg_catalog.=) a.id) AS last_full_check_at,
       (a.packets OPERATOR(pg_catalog.+) l.added_packets)::pg_catalog.int8 AS packets,
       a.restricted
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT pg_catalog.sum(st.balance) AS balance,
           pg_catalog.sum(st.packets) AS packets,
           pg_catalog.sum(st.claims) AS claims,
           pg_catalog.round(pg_catalog.sum(st.balance)::numeric
                            OPERATOR(pg_catalog./) (10::numeric OPERATOR(pg_catalog.^) a.scale),
                            a.scale) AS remaining
    FROM redpacket.stripe st
    WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s
CROSS JOIN LATERAL (
    SELECT COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}')), 0)
           OPERATOR(pg_catalog.-)
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded,
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{return,refund}')), 0) AS returned,
           COALESCE(pg_catalog.sum(g.packets) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'top_up'), 0) AS added_packets
    FROM redpacket.ledger g
    WHERE g.activity_id OPERATOR(pg_catalog.=) a.id) l
LEFT JOIN LATERAL (
    SELECT rc.checked_at, rc.ok
    FROM redpacket.reconciliation rc
    WHERE rc.activity_id OPERATOR(pg_catalog.=) a.id
    ORDER BY rc.pass_id DESC
    LIMIT 1) p ON true;
COMMENT ON COLUMN redpacket.activity_status.total IS
    'Funded budget today: the funding plus top-ups less withdrawals (activity.total keeps the budget at creation).';
COMMENT ON COLUMN redpacket.activity_status.claimed_amount IS
    'total - returned - remaining: what claims have taken (returned counts the remainder given back at close or expiry, and refunds).';
COMMENT ON COLUMN redpacket.activity_status.packets IS
    'Packet cap today: the cap at creation plus the packets of the top-ups; NULL when there is no cap.';
COMMENT ON COLUMN redpacket.activity_status.restricted IS
    'True when only the users on the activity''s list may claim (redpacket.eligible).';

CREATE FUNCTION redpacket.rp_activity_info(activity bigint, user_id text DEFAULT NULL)
RETURNS TABLE (state text, remaining_amount numeric, remaining_packets bigint,
               starts_at timestamptz, ends_at timestamptz, total numeric, packets bigint,
               eligible boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF activity IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'activity must not be NULL';
    END IF;
    IF pg_catalog.octet_length(user_id) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'user_id must not be empty';
    END IF;
    IF pg_catalog.octet_length(user_id) OPERATOR(pg_catalog.>) 256 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'user_id is too long',
            DETAIL = pg_catalog.format('A user_id has at most 256 bytes; this one has %s.',
                                       pg_catalog.octet_length(user_id));
    END IF;
    RETURN QUERY
        SELECT s.state, s.remaining_amount, s.remaining_packets, s.starts_at, s.ends_at,
               s.total, s.packets,
               CASE WHEN rp_activity_info.user_id IS NULL THEN NULL
                    WHEN NOT s.restricted THEN true
                    ELSE EXISTS (SELECT FROM redpacket.eligible e
                                  WHERE e.activity_id OPERATOR(pg_catalog.=) s.id
                                    AND e.user_id OPERATOR(pg_catalog.=) rp_activity_info.user_id)
               END
          FROM redpacket.activity_status s
         WHERE s.id OPERATOR(pg_catalog.=) rp_activity_info.activity;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = pg_catalog.format('activity %s does not exist', activity);
    END IF;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_activity_info(bigint, text) IS
    'Read-only view of one activity for applications: its state (scheduled, active, exhausted, ended, frozen), remaining amount and packets, start and end, funded total and packet cap today, and with a user_id whether that user is eligible (unrestricted, or on the list; NULL without a user). Granted by rp_grant_app.';
REVOKE ALL ON FUNCTION redpacket.rp_activity_info(bigint, text) FROM PUBLIC;

-- The 1.3 functions go; the roles granted them get the new ones from
-- rp_regrant() after the update (a grant made by an update script is an
-- initial privilege of the extension, which pg_dump leaves out).
DROP FUNCTION IF EXISTS redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer);
DROP FUNCTION IF EXISTS redpacket.rp_activity_info(bigint);

-- Eligibility lists in bulk: at most one lock per user bucket of the
-- activity (64) whatever the size of the list.
CREATE FUNCTION redpacket.rp_allow(activity bigint, user_ids text[])
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_allow'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_allow(bigint, text[]) IS
    'Adds users to the list of a restricted activity (already listed ones are skipped) and returns how many were added; refused on an unrestricted or settled activity.';

CREATE FUNCTION redpacket.rp_disallow(activity bigint, user_ids text[])
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_disallow'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_disallow(bigint, text[]) IS
    'Removes users from the list of a restricted activity and returns how many were removed; their claims already made stay (a retry answers duplicate). Refused on an unrestricted or settled activity.';

-- Changing a live activity, under every stripe lock, each a ledger entry
-- (money) and a row of activity_change.
CREATE FUNCTION redpacket.rp_top_up(activity bigint, amount numeric, packets integer DEFAULT NULL,
                                    reason text DEFAULT NULL)
RETURNS numeric
AS 'MODULE_PATHNAME', 'rp_top_up'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_top_up(bigint, numeric, integer, text) IS
    'Adds amount to the budget and packets to the packet cap of a live activity (packets required when it has a cap, 0 for money only; NULL when it has none), spread over the stripes; returns the new funded total.';

CREATE FUNCTION redpacket.rp_withdraw(activity bigint, amount numeric, reason text DEFAULT NULL)
RETURNS numeric
AS 'MODULE_PATHNAME', 'rp_withdraw'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_withdraw(bigint, numeric, text) IS
    'Gives amount of the unclaimed budget of a live activity back to the funder (ledger); every remaining packet keeps at least one minor unit. An error, nothing written, when the budget is smaller; returns the remaining budget.';

CREATE FUNCTION redpacket.rp_set_window(activity bigint, starts_at timestamptz, ends_at timestamptz,
                                        reason text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'rp_set_window'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_set_window(bigint, timestamptz, timestamptz, text) IS
    'Moves the window of a live activity: claims from starts_at until ends_at (NULL: no end), which must be after starts_at.';

REVOKE ALL ON FUNCTION redpacket.rp_allow(bigint, text[]), redpacket.rp_disallow(bigint, text[]),
    redpacket.rp_top_up(bigint, numeric, integer, text), redpacket.rp_withdraw(bigint, numeric, text),
    redpacket.rp_set_window(bigint, timestamptz, timestamptz, text) FROM PUBLIC;

DELETE FROM redpacket.role_grant
 WHERE privilege IN ('EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer)',
                     'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint)');
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_allow(bigint, text[])'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_disallow(bigint, text[])'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_top_up(bigint, numeric, integer, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_withdraw(bigint, numeric, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'),
    ('operator', 'SELECT ON redpacket.eligible');

-- [wallet] Settling claims with the wallet -----------------------------------
-- What the wallet service that pays users did with each claim: credited
-- (it paid) or reversed (undone: the money went back to the activity, or to
-- the funder once the activity was settled).  One row per settled claim,
-- written once (the primary key is the arbiter between rp_credited and
-- rp_reverse of the same claim); the claim row itself never changes.
-- settlement_id comes from an uncached sequence, and a reversal draws it
-- under every stripe lock of its activity, so a reconciliation pass (which
-- holds them too) has seen every reversal below the largest id it saw.
CREATE SEQUENCE redpacket.claim_settlement_id_seq;
CREATE TABLE redpacket.claim_settlement (
    activity_id   bigint NOT NULL,
    claim_id      bigint NOT NULL,
    settlement_id bigint NOT NULL DEFAULT pg_catalog.nextval('redpacket.claim_settlement_id_seq'),
    state         text NOT NULL CHECK (state IN ('credited', 'reversed')),
    amount        numeric NOT NULL,
    settled_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    settled_by    name NOT NULL DEFAULT pg_catalog.session_user(),
    reference     text,
    reason        text,
    PRIMARY KEY (activity_id, claim_id)
);
ALTER SEQUENCE redpacket.claim_settlement_id_seq OWNED BY redpacket.claim_settlement.settlement_id;
CREATE INDEX claim_settlement_reversed ON redpacket.claim_settlement (activity_id, settlement_id)
    WHERE state = 'reversed';
COMMENT ON SEQUENCE redpacket.claim_settlement_id_seq IS
    'Ids of settlements (no CACHE: a reversal draws its id under every stripe lock of its activity, which the reconciliation watermark relies on).';
COMMENT ON TABLE redpacket.claim_settlement IS
    'One row per settled claim: credited (the wallet paid it, rp_credited) or reversed (undone, rp_reverse). A claim moves once; claims without a row are pending (rp_pending_credits). Append-only.';
COMMENT ON COLUMN redpacket.claim_settlement.activity_id IS 'The activity of the claim.';
COMMENT ON COLUMN redpacket.claim_settlement.claim_id IS 'The claim settled (redpacket.claim.claim_id).';
COMMENT ON COLUMN redpacket.claim_settlement.settlement_id IS 'Settlement id; of two reversals of one activity, the later has the larger id.';
COMMENT ON COLUMN redpacket.claim_settlement.state IS 'credited (the wallet paid the claim) or reversed (the claim was undone and its amount returned).';
COMMENT ON COLUMN redpacket.claim_settlement.amount IS 'The claim''s amount, in currency units with the activity''s scale.';
COMMENT ON COLUMN redpacket.claim_settlement.settled_at IS 'When the settlement was recorded (its transaction''s start).';
COMMENT ON COLUMN redpacket.claim_settlement.settled_by IS 'Session user who recorded it (the wallet service''s role, or the operator''s).';
COMMENT ON COLUMN redpacket.claim_settlement.reference IS 'The wallet''s reference given to rp_credited (a batch or payment id), if any.';
COMMENT ON COLUMN redpacket.claim_settlement.reason IS 'Why the claim was reversed (rp_reverse); NULL for credits.';
COMMENT ON INDEX redpacket.claim_settlement_reversed IS
    'Reversals of an activity in settlement_id order: what an incremental reconciliation reads past its watermark.';
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON redpacket.claim_settlement
    FOR EACH ROW EXECUTE FUNCTION redpacket.refuse_change();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON redpacket.claim_settlement
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.refuse_change();
REVOKE ALL ON redpacket.claim_settlement, redpacket.claim_settlement_id_seq FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('redpacket.claim_settlement', '');
SELECT pg_catalog.pg_extension_config_dump('redpacket.claim_settlement_id_seq', '');

-- Where rp_pending_credits starts: per activity, every claim up to
-- settled_through is settled except the few in settlement_gap, so finding
-- the pending claims reads only those and the claims after settled_through,
-- however many claims were settled before.  Derived from claim and
-- claim_settlement and rebuilt from them (not dumped: after a restore the
-- first call reads the activity's claims once).
CREATE TABLE redpacket.settlement_state (
    activity_id     bigint PRIMARY KEY,
    settled_through bigint NOT NULL DEFAULT 0,
    advanced_at     timestamptz
);
COMMENT ON TABLE redpacket.settlement_state IS
    'Per activity, how far its claims are known to be settled: every claim with claim_id up to settled_through has a claim_settlement row, except those listed in settlement_gap. Advanced by rp_pending_credits; derived data, not dumped.';
COMMENT ON COLUMN redpacket.settlement_state.activity_id IS 'The activity.';
COMMENT ON COLUMN redpacket.settlement_state.settled_through IS 'Every claim of the activity up to this id is settled or listed in settlement_gap; advanced only past claims that can no longer commit.';
COMMENT ON COLUMN redpacket.settlement_state.advanced_at IS 'When settled_through last moved.';
CREATE TABLE redpacket.settlement_gap (
    activity_id bigint NOT NULL,
    claim_id    bigint NOT NULL,
    PRIMARY KEY (activity_id, claim_id)
);
COMMENT ON TABLE redpacket.settlement_gap IS
    'Claims at or below their activity''s settlement_state.settled_through that were not settled when it moved past them (claims the wallet skipped); removed once settled. Derived data, not dumped.';
COMMENT ON COLUMN redpacket.settlement_gap.activity_id IS 'The activity.';
COMMENT ON COLUMN redpacket.settlement_gap.claim_id IS 'A claim that was pending when settled_through passed it.';
REVOKE ALL ON redpacket.settlement_state, redpacket.settlement_gap FROM PUBLIC;

CREATE FUNCTION redpacket.rp_credited(activity bigint, claim_ids bigint[], reference text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_credited'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_credited(bigint, bigint[], text) IS
    'The wallet service acknowledges claims of one activity it paid: records each as credited (with reference), skips those already credited, returns how many it newly credited. All or nothing: an unknown claim (P0002) or a reversed one (55000) is an error naming it. Granted by rp_grant_wallet.';

CREATE FUNCTION redpacket.rp_reverse(activity bigint, claim_id bigint, reason text)
RETURNS numeric
AS 'MODULE_PATHNAME', 'rp_reverse'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_reverse(bigint, bigint, text) IS
    'Undoes a claim that was not credited: its amount and packet go back to the activity''s budget while it is open, or to the funder (a ledger refund entry) once it is settled; records the reversal and an activity_change row; returns the amount (0 when already reversed). A credited claim is refused (55000). For operators.';

CREATE FUNCTION redpacket.rp_pending_credits(activity bigint DEFAULT NULL,
                                             older_than interval DEFAULT '0')
RETURNS TABLE (activity_id bigint, claim_id bigint, user_id text, amount numeric,
               claimed_at timestamptz)
AS 'MODULE_PATHNAME', 'rp_pending_credits'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100;
COMMENT ON FUNCTION redpacket.rp_pending_credits(bigint, interval) IS
    'Claims neither credited nor reversed, of one activity or (NULL) of all, claimed at least older_than ago, oldest first: what a wallet consumer re-drives after it lost messages. Its cost follows the pending claims, not the settled ones. Granted by rp_grant_wallet and rp_grant_operator.';

CREATE FUNCTION redpacket.rp_grant_wallet(role regrole) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT redpacket.rp_grant_role(role, 'wallet');
END;
COMMENT ON FUNCTION redpacket.rp_grant_wallet(regrole) IS
    'Grants a wallet service''s role USAGE on the schema and what redpacket.role_grant lists for wallet: rp_credited, rp_pending_credits and SELECT on the published tables (its subscription copies them).';

REVOKE ALL ON FUNCTION redpacket.rp_credited(bigint, bigint[], text),
    redpacket.rp_reverse(bigint, bigint, text),
    redpacket.rp_pending_credits(bigint, interval),
    redpacket.rp_grant_wallet(regrole) FROM PUBLIC;

INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_credited(bigint, bigint[], text)'),
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_pending_credits(bigint, interval)'),
    ('wallet', 'SELECT ON redpacket.claim'),
    ('wallet', 'SELECT ON redpacket.ledger'),
    ('wallet', 'SELECT ON redpacket.activity_change'),
    ('wallet', 'SELECT ON redpacket.claim_settlement'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_reverse(bigint, bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_pending_credits(bigint, interval)'),
    ('operator', 'SELECT ON redpacket.claim_settlement');

-- The publication carries the settlements and the changes too, so that the
-- wallet sees reversals.  Made here when it is missing; the publication
-- keeper (src/guard.c) puts the same four tables back after a restore.
DO $$
DECLARE
    t text;
BEGIN
    SET LOCAL client_min_messages = error;
    SET LOCAL log_min_messages = error;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication
                    WHERE pubname OPERATOR(pg_catalog.=) 'redpacket_events') THEN
        CREATE PUBLICATION redpacket_events FOR TABLE redpacket.claim, redpacket.ledger,
            redpacket.activity_change, redpacket.claim_settlement;
    ELSE
        FOREACH t IN ARRAY ARRAY['redpacket.claim', 'redpacket.ledger',
                                 'redpacket.activity_change', 'redpacket.claim_settlement'] LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r
                             JOIN pg_catalog.pg_publication p ON p.oid OPERATOR(pg_catalog.=) r.prpubid
                            WHERE p.pubname OPERATOR(pg_catalog.=) 'redpacket_events'
                              AND r.prrelid OPERATOR(pg_catalog.=) t::pg_catalog.regclass) THEN
                EXECUTE pg_catalog.format('ALTER PUBLICATION redpacket_events ADD TABLE %s', t);
            END IF;
        END LOOP;
    END IF;
END
$$;
COMMENT ON PUBLICATION redpacket_events IS
    'Every claim, ledger entry, activity change and claim settlement, for subscribers that credit wallets; consumers are idempotent on (activity_id, claim_id) for claims and settlements, (activity_id, entry_id) for ledger entries and (activity_id, change_id) for changes. Kept by the redpacket_publication_* event triggers.';
COMMENT ON FUNCTION redpacket.rp_publication_keeper() IS
    'Event trigger function: when CREATE PUBLICATION redpacket_events runs (a restored dump), replaces the one the extension made and puts claim, ledger, activity_change and claim_settlement into it.';
COMMENT ON EVENT TRIGGER redpacket_publication_end IS
    'After CREATE PUBLICATION redpacket_events (from a dump): puts redpacket.claim, ledger, activity_change and claim_settlement into it.';

-- [recon] The reconciler ------------------------------------------------------
-- What the pass lists, through indexes, so that a pass does not grow with
-- the history of activities: the activities not settled yet, and the ones
-- whose last full check is oldest.
CREATE INDEX reconcile_state_unsettled ON redpacket.reconcile_state (activity_id)
    WHERE NOT settled;
COMMENT ON INDEX redpacket.reconcile_state_unsettled IS
    'The activities a reconciliation pass looks at for changes: those it has not seen settled.';
CREATE INDEX reconcile_state_full_check ON redpacket.reconcile_state
    (last_full_check_at NULLS FIRST, activity_id);
COMMENT ON INDEX redpacket.reconcile_state_full_check IS
    'The activities whose last full check is oldest, for the share of full checks of each pass.';
-- The watermark of reversals (claims reversed with the wallet, 1.4): like
-- the claims', the running sums up to last_settlement_id; and the last
-- ledger entry the last pass saw, so that a new entry (a top-up, or one
-- added behind the extension's back) makes the activity pending.
ALTER TABLE redpacket.reconcile_state
    ADD COLUMN last_settlement_id bigint NOT NULL DEFAULT 0,
    ADD COLUMN reversed numeric NOT NULL DEFAULT 0,
    ADD COLUMN reversed_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_entry_id bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.reconcile_state.last_settlement_id IS
    'Reversals (claim_settlement rows with state reversed) with settlement ids up to this one are summed into reversed and reversed_count.';
COMMENT ON COLUMN redpacket.reconcile_state.reversed IS
    'Sum of the amounts of the claims reversed up to last_settlement_id.';
COMMENT ON COLUMN redpacket.reconcile_state.reversed_count IS
    'Number of claims reversed up to last_settlement_id.';
COMMENT ON COLUMN redpacket.reconcile_state.last_entry_id IS
    'The largest ledger entry id of the activity the last pass saw.';
COMMENT ON COLUMN redpacket.reconcile_state.settled IS
    'True once a pass saw the activity closed (settled by it after expiry, or closed by an operator); passes then look at it only for full checks.';
COMMENT ON COLUMN redpacket.reconcile_state.last_full_check_at IS
    'When every claim of the activity was last re-summed: a full check, or a check that started from no watermark (the first); NULL when never.';
COMMENT ON COLUMN redpacket.reconciliation.problems IS
    'Names of the failed checks: money, packets, claims, negative, not_empty (closed but stripes not empty or return wrong), dealt (what was dealt to a stripe does not add up), copies (a stripe''s halted or revision, the activity''s total, cap, creation time or creator, a settlement''s amount, the settlement frontier, the reconciliation state or the length of an eligibility list disagrees with what it copies), incomplete, error; empty when ok; NULL on rows written by 1.0.';
COMMENT ON TABLE redpacket.reconciliation IS
    'One row per activity per reconciliation pass: expected = funded + top-ups - withdrawals - returned - refunds - sum of live claims, actual = sum of stripe balances, drift = actual - expected. Append-only.';
-- Passes over all so far: each pass compares the stripe sums of one slice
-- of the activities not settled, in turn.
ALTER TABLE redpacket.reconciler ADD COLUMN passes bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.reconciler.passes IS
    'Passes over all activities completed in this database (a counter).';
-- The counters gain the 1.4 answers (not_eligible, busy), the folded row of
-- the database (the activities whose counters left shared memory once
-- settled, or to make room) and when each row started counting.  The OUT
-- columns of rp_activity_stats change, so it and its view are made again
-- (rp_regrant() gives them back to the operator roles after the update).
DROP VIEW redpacket.activity_stats;
DROP FUNCTION redpacket.rp_activity_stats();
CREATE FUNCTION redpacket.rp_activity_stats(
    OUT activity_id bigint,
    OUT scope text,
    OUT counting_since timestamptz,
    OUT duplicate bigint,
    OUT frozen bigint,
    OUT not_started bigint,
    OUT ended bigint,
    OUT not_eligible bigint,
    OUT user_limit bigint,
    OUT busy bigint,
    OUT exhausted bigint,
    OUT claimed bigint,
    OUT stripe_waits bigint,
    OUT gathers bigint,
    OUT errors bigint,
    OUT retryable bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rp_activity_stats'
LANGUAGE C VOLATILE SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_activity_stats() IS
    'The shared-memory counters of this database (empty unless redpacket is in shared_preload_libraries): a row per activity, the folded row of the activities whose counters left shared memory, and the untracked events. Read it through the activity_stats view.';
REVOKE ALL ON FUNCTION redpacket.rp_activity_stats() FROM PUBLIC;
CREATE VIEW redpacket.activity_stats AS
SELECT activity_id, scope, counting_since, claimed, duplicate, exhausted, frozen, ended,
       not_started, not_eligible, user_limit, busy, stripe_waits, gathers, errors, retryable
FROM redpacket.rp_activity_stats();
COMMENT ON VIEW redpacket.activity_stats IS
    'Answers and events of this database since the server started, CREATE EXTENSION or rp_stats_reset(): a row per activity in shared memory, plus the folded row (activities whose counters left it: settled, or the least recently active when room was needed) and the untracked row; lost on restart, empty unless redpacket is in shared_preload_libraries. The rows add up to every answer given.';
COMMENT ON COLUMN redpacket.activity_stats.activity_id IS 'The activity; NULL for the folded and untracked rows.';
COMMENT ON COLUMN redpacket.activity_stats.scope IS 'activity (one activity), folded (every activity of this database whose counters left shared memory) or untracked (events that found no room at all, all databases).';
COMMENT ON COLUMN redpacket.activity_stats.counting_since IS 'When this row started counting: an activity whose counters were folded earlier starts a new row.';
COMMENT ON COLUMN redpacket.activity_stats.claimed IS 'Answers claimed (new claims recorded; counted when answered, even if the caller later rolled back).';
COMMENT ON COLUMN redpacket.activity_stats.duplicate IS 'Answers duplicate (retries or second grabs).';
COMMENT ON COLUMN redpacket.activity_stats.exhausted IS 'Answers exhausted (budget or packets could not cover the claim).';
COMMENT ON COLUMN redpacket.activity_stats.frozen IS 'Answers frozen.';
COMMENT ON COLUMN redpacket.activity_stats.ended IS 'Answers ended (after ends_at or close).';
COMMENT ON COLUMN redpacket.activity_stats.not_started IS 'Answers not_started (before starts_at).';
COMMENT ON COLUMN redpacket.activity_stats.not_eligible IS 'Answers not_eligible (the user is not on the list of a restricted activity).';
COMMENT ON COLUMN redpacket.activity_stats.user_limit IS 'Answers user_limit (the user already held per_user_limit claims).';
COMMENT ON COLUMN redpacket.activity_stats.busy IS 'Answers busy (the claim would have waited behind redpacket.max_waiting others).';
COMMENT ON COLUMN redpacket.activity_stats.stripe_waits IS 'Times a claim waited for a busy stripe lock.';
COMMENT ON COLUMN redpacket.activity_stats.gathers IS 'Times a claim locked every stripe to pay from the whole remaining budget.';
COMMENT ON COLUMN redpacket.activity_stats.errors IS 'Claim calls that raised an error other than a retryable one (bad input, a fault): the count to alert on.';
COMMENT ON COLUMN redpacket.activity_stats.retryable IS 'Claim calls that failed with an error the caller retries: 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout, 57014 statement timeout or cancel (contention, not a fault).';
REVOKE ALL ON redpacket.activity_stats FROM PUBLIC;

-- The reconciler's own record: counters that only grow (so alerts on them
-- do not flap), what the last pass found, split into checked and wrong
-- (mismatches) and could not check (unchecked: an error such as a lock
-- timeout, or an incomplete activity), and since when the extension is
-- here (a reconciler that never ran is overdue from then).
ALTER TABLE redpacket.reconciler
    ADD COLUMN installed_at timestamptz,
    ADD COLUMN checks bigint NOT NULL DEFAULT 0,
    ADD COLUMN mismatches bigint NOT NULL DEFAULT 0,
    ADD COLUMN unchecked bigint NOT NULL DEFAULT 0,
    ADD COLUMN settlements bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_pass_mismatches integer,
    ADD COLUMN last_pass_unchecked integer;
-- (set, not a default of ADD COLUMN: that would keep the time of the update
-- in the catalog, which a fresh install does not have)
UPDATE redpacket.reconciler SET installed_at = pg_catalog.now();
ALTER TABLE redpacket.reconciler ALTER COLUMN installed_at SET DEFAULT pg_catalog.now(),
    ALTER COLUMN installed_at SET NOT NULL;
COMMENT ON COLUMN redpacket.reconciler.installed_at IS 'When the extension got this row (CREATE EXTENSION, or the update to 1.4).';
COMMENT ON COLUMN redpacket.reconciler.checks IS 'Checks of activities that ran, by any pass (a counter).';
COMMENT ON COLUMN redpacket.reconciler.mismatches IS 'Checks that found the books wrong (a counter).';
COMMENT ON COLUMN redpacket.reconciler.unchecked IS 'Checks that could not run (an error such as a lock timeout), and incomplete activities reported (once per change of what is missing) (a counter).';
COMMENT ON COLUMN redpacket.reconciler.settlements IS 'Expired activities the passes settled (a counter).';
COMMENT ON COLUMN redpacket.reconciler.last_pass_mismatches IS 'Activities of the last pass over all whose books were wrong.';
COMMENT ON COLUMN redpacket.reconciler.last_pass_unchecked IS 'Activities of the last pass over all that could not be checked (error or incomplete).';
COMMENT ON COLUMN redpacket.reconciler.last_pass_ms IS 'Duration of the last pass in milliseconds (to the microsecond).';
COMMENT ON COLUMN redpacket.reconciler.failures IS 'Activities of the last pass over all that failed a check, could not be checked, or were incomplete (last_pass_mismatches + last_pass_unchecked).';

-- Whether each activity's latest check found its books right: the
-- activities whose books are wrong now are few and found by an index.
ALTER TABLE redpacket.reconcile_state ADD COLUMN last_ok boolean;
COMMENT ON COLUMN redpacket.reconcile_state.last_ok IS
    'Whether the latest check that ran found the books right; NULL before the first.';
CREATE INDEX reconcile_state_failing ON redpacket.reconcile_state (activity_id) WHERE NOT last_ok;
COMMENT ON INDEX redpacket.reconcile_state_failing IS 'The activities whose latest check found the books wrong.';
-- The frozen activities, which monitoring lists: few, whatever the history.
CREATE INDEX activity_frozen ON redpacket.activity (id) WHERE frozen_reason IS NOT NULL;
COMMENT ON INDEX redpacket.activity_frozen IS 'The frozen activities (monitoring lists them).';

-- Problems the reconciler reported and still sees, so that it reports each
-- once per change instead of once per pass.  Not dumped: it describes what
-- this server's passes told people.
CREATE TABLE redpacket.reconcile_problem (
    activity_id bigint NOT NULL,
    problem     text NOT NULL CHECK (problem IN ('incomplete', 'uncredited')),
    detail      text NOT NULL,
    since       timestamptz NOT NULL,
    reported_at timestamptz NOT NULL,
    PRIMARY KEY (activity_id, problem)
);
COMMENT ON TABLE redpacket.reconcile_problem IS
    'Problems of activities the reconciler reported (WARNING and NOTIFY) and still sees: reported again only when what it sees changes; a row goes when the problem does. Not dumped.';
COMMENT ON COLUMN redpacket.reconcile_problem.activity_id IS 'The activity.';
COMMENT ON COLUMN redpacket.reconcile_problem.problem IS 'incomplete (the pass cannot see the whole activity) or uncredited (claims older than redpacket.credit_deadline not credited).';
COMMENT ON COLUMN redpacket.reconcile_problem.detail IS 'What the pass saw, as last reported.';
COMMENT ON COLUMN redpacket.reconcile_problem.since IS 'When the problem was first seen.';
COMMENT ON COLUMN redpacket.reconcile_problem.reported_at IS 'When it was last reported.';
REVOKE ALL ON redpacket.reconcile_problem FROM PUBLIC;

-- Whether the launcher runs, from shared memory: pg_stat_activity hides the
-- launcher's backend type from a role without pg_read_all_stats.
CREATE FUNCTION redpacket.rp_launcher_running()
RETURNS boolean
AS 'MODULE_PATHNAME', 'rp_launcher_running'
LANGUAGE C STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_launcher_running() IS
    'Whether the redpacket launcher runs on this server (read from shared memory, the same for every role); false when redpacket is not in shared_preload_libraries.';
REVOKE ALL ON FUNCTION redpacket.rp_launcher_running() FROM PUBLIC;
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_launcher_running()');

-- The reconciler's status: when the next pass is due and whether it is
-- late, whether a launcher runs at all, the counters, and the activities
-- that need a person now.  A pass is expected every
-- redpacket.reconcile_interval (every minute while it is 0 or unknown: the
-- pace of a pg_cron schedule); a database with no pass finished within two
-- of them since the extension came is overdue, preloaded or not.
CREATE OR REPLACE VIEW redpacket.reconciler_status AS
SELECT pg_catalog.current_database() AS database,
       r.last_pass_started_at,
       r.last_pass_finished_at,
       pg_catalog.round(r.last_pass_ms, 3) AS last_pass_ms,
       r.activities_checked,
       r.failures,
       COALESCE(r.last_pass_finished_at, r.installed_at) OPERATOR(pg_catalog.+) i.every AS next_due_at,
       f.last_full_check_at,
       pg_catalog.now() OPERATOR(pg_catalog.>)
           (COALESCE(r.last_pass_finished_at, r.installed_at)
            OPERATOR(pg_catalog.+) (i.every OPERATOR(pg_catalog.*) 2::pg_catalog.float8)) AS overdue,
       i.every AS expected_every,
       redpacket.rp_launcher_running() AS launcher_running,
       r.passes,
       r.checks,
       r.mismatches,
       r.unchecked,
       r.settlements,
       r.last_pass_mismatches,
       r.last_pass_unchecked,
       (SELECT pg_catalog.count(*) FROM redpacket.reconcile_state s WHERE NOT s.last_ok) AS failing,
       (SELECT pg_catalog.count(*) FROM redpacket.reconcile_problem p
         WHERE p.problem OPERATOR(pg_catalog.=) 'incomplete') AS incomplete
FROM (SELECT CASE WHEN s.every OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN s.every
                  ELSE '60 s'::pg_catalog.interval END AS every
        FROM (SELECT COALESCE(pg_catalog.current_setting('redpacket.reconcile_interval', true),
                              '60')::pg_catalog.interval AS every) s) i
LEFT JOIN redpacket.reconciler r ON true
CROSS JOIN (SELECT pg_catalog.min(s.last_full_check_at) AS last_full_check_at
              FROM redpacket.reconcile_state s) f;
COMMENT ON VIEW redpacket.reconciler_status IS
    'The reconciler in this database: the last pass over all activities, when the next is due and whether it is overdue (no pass within two expected intervals, whatever the reason: paused, not preloaded, no worker slot, failing), the counters, and the activities that need a person now.';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_ms IS 'Duration of the last pass in milliseconds.';
COMMENT ON COLUMN redpacket.reconciler_status.failures IS 'Activities of the last pass over all that failed a check or could not be checked (last_pass_mismatches + last_pass_unchecked).';
COMMENT ON COLUMN redpacket.reconciler_status.next_due_at IS 'When the next pass over all is due: the end of the last one (or the installation) + expected_every.';
COMMENT ON COLUMN redpacket.reconciler_status.overdue IS 'True when no pass over all finished within two expected intervals: the reconciler is not running here, whatever the reason.';
COMMENT ON COLUMN redpacket.reconciler_status.expected_every IS 'redpacket.reconcile_interval, or one minute while it is 0 (paused: passes are expected from pg_cron) or unknown.';
COMMENT ON COLUMN redpacket.reconciler_status.launcher_running IS 'Whether the launcher (redpacket in shared_preload_libraries) runs on this server.';
COMMENT ON COLUMN redpacket.reconciler_status.passes IS 'Passes over all completed (a counter).';
COMMENT ON COLUMN redpacket.reconciler_status.checks IS 'Checks that ran (a counter).';
COMMENT ON COLUMN redpacket.reconciler_status.mismatches IS 'Checks that found the books wrong (a counter).';
COMMENT ON COLUMN redpacket.reconciler_status.unchecked IS 'Checks that could not run, and incomplete activities reported (a counter).';
COMMENT ON COLUMN redpacket.reconciler_status.settlements IS 'Expired activities settled by the passes (a counter).';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_mismatches IS 'Activities of the last pass whose books were wrong.';
COMMENT ON COLUMN redpacket.reconciler_status.last_pass_unchecked IS 'Activities of the last pass that could not be checked.';
COMMENT ON COLUMN redpacket.reconciler_status.failing IS 'Activities whose latest check found the books wrong (whether frozen or not).';
COMMENT ON COLUMN redpacket.reconciler_status.incomplete IS 'Activities the passes see incomplete now (reconcile_problem).';

-- activity_status: last_reconciled_at and last_reconcile_ok say what the
-- latest check that ran found; a check that could not run (an error, a
-- lock timeout) is no longer a failed one, and shows in unchecked_since
-- and last_check_error.
CREATE OR REPLACE VIEW redpacket.activity_status AS
SELECT a.id,
       a.name,
       CASE
           WHEN a.frozen_reason IS NOT NULL THEN 'frozen'
           WHEN a.closed_at IS NOT NULL
                OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'ended'
           WHEN a.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'scheduled'
           WHEN s.balance OPERATOR(pg_catalog.=) 0
                OR s.packets OPERATOR(pg_catalog.=) 0 THEN 'exhausted'
           ELSE 'active'
       END AS state,
       a.scale,
       l.funded AS total,
       l.funded OPERATOR(pg_catalog.-) l.returned
                OPERATOR(pg_catalog.-) s.remaining AS claimed_amount,
       s.claims AS claimed_count,
       s.remaining AS remaining_amount,
       s.packets AS remaining_packets,
       a.stripes,
       a.starts_at,
       a.ends_at,
       p.checked_at AS last_reconciled_at,
       p.ok AS last_reconcile_ok,
       a.frozen_reason,
       (SELECT rs.last_full_check_at FROM redpacket.reconcile_state rs
         WHERE rs.activity_id OPERATOR(pg_catalog.=) a.id) AS last_full_check_at,
       (a.packets OPERATOR(pg_catalog.+) l.added_packets)::pg_catalog.int8 AS packets,
       a.restricted,
       u.since AS unchecked_since,
       u.error AS last_check_error
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT pg_catalog.sum(st.balance) AS balance,
           pg_catalog.sum(st.packets) AS packets,
           pg_catalog.sum(st.claims) AS claims,
           pg_catalog.round(pg_catalog.sum(st.balance)::numeric
                            OPERATOR(pg_catalog./) (10::numeric OPERATOR(pg_catalog.^) a.scale),
                            a.scale) AS remaining
    FROM redpacket.stripe st
    WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s
CROSS JOIN LATERAL (
    SELECT COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}')), 0)
           OPERATOR(pg_catalog.-)
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded,
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{return,refund}')), 0) AS returned,
           COALESCE(pg_catalog.sum(g.packets) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'top_up'), 0) AS added_packets
    FROM redpacket.ledger g
    WHERE g.activity_id OPERATOR(pg_catalog.=) a.id) l
LEFT JOIN LATERAL (
    SELECT rc.checked_at, rc.ok, rc.pass_id
    FROM redpacket.reconciliation rc
    WHERE rc.activity_id OPERATOR(pg_catalog.=) a.id
      AND NOT COALESCE(rc.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[], false)
    ORDER BY rc.pass_id DESC
    LIMIT 1) p ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.min(e.checked_at) AS since,
           (pg_catalog.array_agg(e.error ORDER BY e.pass_id DESC))[1] AS error
    FROM redpacket.reconciliation e
    WHERE e.activity_id OPERATOR(pg_catalog.=) a.id
      AND e.pass_id OPERATOR(pg_catalog.>) COALESCE(p.pass_id, 0)
      AND e.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[]) u ON true;
COMMENT ON COLUMN redpacket.activity_status.last_reconciled_at IS 'When the latest check that ran checked this activity; NULL if none. An activity that did not change is not checked again, so an old value alone is not a problem.';
COMMENT ON COLUMN redpacket.activity_status.last_reconcile_ok IS 'What the latest check that ran found: true when the books balanced, false when they did not (a check that could not run does not count).';
COMMENT ON COLUMN redpacket.activity_status.unchecked_since IS 'Since when the checks of this activity could not run (an error, a lock timeout); NULL when the latest attempt ran.';
COMMENT ON COLUMN redpacket.activity_status.last_check_error IS 'Why the latest attempt could not run; NULL when it ran.';

-- A read-only verification: the checks of rp_reconcile, the same rows, no
-- lock and nothing written, in one snapshot: on a standby, in a read-only
-- transaction, at any isolation level.
CREATE FUNCTION redpacket.rp_verify(activity bigint DEFAULT NULL, full_check boolean DEFAULT true)
RETURNS SETOF redpacket.reconciliation
AS 'MODULE_PATHNAME', 'rp_verify'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_verify(bigint, boolean) IS
    'Verifies the books of one activity, or of every activity, in one snapshot of committed data, writing nothing: the checks and result rows of rp_reconcile (pass_id NULL; nothing settled, frozen or recorded). Runs on a standby and in read-only transactions; full_check (the default) re-sums every claim.';
REVOKE ALL ON FUNCTION redpacket.rp_verify(bigint, boolean) FROM PUBLIC;

-- One step of rp_reconcile_strict: it waits for a pass that holds the lock,
-- then checks what is pending after an activity, as far as the lock budget
-- of one transaction allows.
CREATE FUNCTION redpacket.rp_reconcile_step(full_check boolean, lock_wait interval,
                                            after_activity bigint,
                                            OUT checked bigint, OUT mismatches bigint,
                                            OUT unchecked bigint, OUT failed bigint[],
                                            OUT last_activity bigint, OUT left_pending bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'rp_reconcile_step'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_reconcile_step(boolean, interval, bigint) IS
    'One transaction of rp_reconcile_strict: waits at most lock_wait for a running pass (SQLSTATE 55P03 after that), then checks the pending activities after after_activity (NULL: all) within one transaction''s lock budget; returns the counts, the failed activities, the last activity reached and how many are left.';
REVOKE ALL ON FUNCTION redpacket.rp_reconcile_step(boolean, interval, bigint) FROM PUBLIC;

-- The strict pass for schedulers.  It used to succeed without checking
-- anything when another pass held the lock (rp_reconcile returned no row):
-- now it waits for that pass (lock_wait at most, then SQLSTATE 55P03),
-- checks everything pending, one transaction per lock budget, and fails
-- with XX001 when a check found the books wrong, with 55000 when one could
-- not run.  It gains lock_wait: the procedure is made again (rp_regrant()
-- gives it back to the operator roles after the update).
DROP PROCEDURE redpacket.rp_reconcile_strict(boolean);
CREATE PROCEDURE redpacket.rp_reconcile_strict(full_check boolean DEFAULT false,
                                               lock_wait interval DEFAULT '1 min')
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    after pg_catalog.int8 := NULL;
    checked pg_catalog.int8 := 0;
    mismatches pg_catalog.int8 := 0;
    unchecked pg_catalog.int8 := 0;
    failed pg_catalog.int8[] := '{}';
    still pg_catalog.int8[];
BEGIN
    -- SECURITY INVOKER (it commits, so it cannot SET search_path): every name
    -- below is qualified or typed, and the path is pinned for its statements.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF full_check IS NULL OR lock_wait IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed',
            MESSAGE = 'full_check and lock_wait must not be NULL';
    END IF;
    LOOP
        SELECT * INTO r FROM redpacket.rp_reconcile_step(full_check, lock_wait, after);
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        checked := checked OPERATOR(pg_catalog.+) r.checked;
        mismatches := mismatches OPERATOR(pg_catalog.+) r.mismatches;
        unchecked := unchecked OPERATOR(pg_catalog.+) r.unchecked;
        failed := failed OPERATOR(pg_catalog.||) r.failed;
        EXIT WHEN r.left_pending OPERATOR(pg_catalog.=) 0;
        after := r.last_activity;
    END LOOP;
    -- What earlier passes found and nobody resolved: an activity that has
    -- not changed since its check failed is not checked again, so the books
    -- stay wrong without a new mismatch.
    SELECT pg_catalog.array_agg(o.id ORDER BY o.id) INTO still
      FROM (SELECT s.activity_id AS id FROM redpacket.reconcile_state s WHERE NOT s.last_ok
            UNION
            SELECT a.id FROM redpacket.activity a
             WHERE pg_catalog.starts_with(a.frozen_reason, 'reconciliation mismatch')
            UNION
            SELECT p.activity_id FROM redpacket.reconcile_problem p
             WHERE p.problem OPERATOR(pg_catalog.<>) 'uncredited') o;
    IF mismatches OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'data_corrupted',
            MESSAGE = pg_catalog.format('redpacket reconciliation failed for %s of %s activities', mismatches, checked),
            DETAIL = pg_catalog.format('Failed activities: %s.', pg_catalog.array_to_string(failed, ', ')),
            HINT = 'The failed checks are recorded in redpacket.reconciliation (problems, error); the pass itself was committed.';
    END IF;
    IF still IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'data_corrupted',
            MESSAGE = pg_catalog.format('redpacket books of %s activities are still wrong', pg_catalog.cardinality(still)),
            DETAIL = pg_catalog.format('Activities whose latest check failed, that a check froze, or with an open problem in redpacket.reconcile_problem: %s.', pg_catalog.array_to_string(still, ', ')),
            HINT = 'Repair them (redpacket.rp_repair_stripes, or restore the missing rows), then redpacket.rp_unfreeze; until then every run fails.';
    END IF;
    IF unchecked OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = pg_catalog.format('redpacket reconciliation could not check %s of %s activities', unchecked, checked),
            DETAIL = pg_catalog.format('Activities not checked: %s.', pg_catalog.array_to_string(failed, ', ')),
            HINT = 'An error (redpacket.reconciliation.error, e.g. a lock timeout) or an incomplete activity (redpacket.reconcile_problem) stopped their checks; nothing is known to be wrong with them.';
    END IF;
END;
$$;
COMMENT ON PROCEDURE redpacket.rp_reconcile_strict(boolean, interval) IS
    'The pass for schedulers (CALL it, outside a transaction block): waits up to lock_wait for a running pass (then SQLSTATE 55P03), checks every pending activity, committing each transaction''s share, then raises XX001 when a check found the books wrong or an activity is still wrong from an earlier check (its latest check failed, a check froze it, or it has an open problem) and 55000 when one could not run, so pg_cron records every run as failed until the books are repaired and unfrozen.';
REVOKE ALL ON PROCEDURE redpacket.rp_reconcile_strict(boolean, interval) FROM PUBLIC;
DELETE FROM redpacket.role_grant
 WHERE privilege OPERATOR(pg_catalog.=) 'EXECUTE ON PROCEDURE redpacket.rp_reconcile_strict(boolean)';

INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_verify(bigint, boolean)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_reconcile_step(boolean, interval, bigint)'),
    ('operator', 'SELECT ON redpacket.reconcile_problem'),
    ('operator', 'EXECUTE ON PROCEDURE redpacket.rp_reconcile_strict(boolean, interval)');

-- [ops] Operating -------------------------------------------------------------

-- Ids never repeat in a database, across DROP and CREATE EXTENSION too.  The
-- positions of the extension's sequences are kept in the database setting
-- redpacket.id_marks, which outlives the extension: written by the drop
-- guard before a drop, by CREATE EXTENSION and ALTER EXTENSION UPDATE (the
-- last statement of this section), by rp_post_restore and by the reconciler;
-- a new installation starts its sequences past them.  src/ids.c has the
-- argument.
CREATE FUNCTION redpacket.rp_keep_ids(new_installation boolean DEFAULT false) RETURNS boolean
AS 'MODULE_PATHNAME', 'rp_keep_ids'
LANGUAGE C VOLATILE SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_keep_ids(boolean) IS
    'Keeps the positions of redpacket''s sequences in the database setting redpacket.id_marks (which outlives the extension) and, for a new installation (the install script) or after a drop, starts the sequences past the ids an earlier installation handed out. Returns whether it wrote the setting. Superuser.';
REVOKE ALL ON FUNCTION redpacket.rp_keep_ids(boolean) FROM PUBLIC;

-- rp_post_restore also records the positions the restore gave the sequences.
CREATE OR REPLACE PROCEDURE redpacket.rp_post_restore()
LANGUAGE plpgsql AS $$
DECLARE
    a record;
    r record;
    deadline timestamptz;
    checked bigint := 0;
    failed bigint := 0;
BEGIN
    EXECUTE pg_catalog.format('ALTER DATABASE %I RESET redpacket.restoring',
                              pg_catalog.current_database());
    PERFORM pg_catalog.set_config('redpacket.restoring', 'off', false);
    -- the restore set the sequences: keep their positions (redpacket.id_marks)
    PERFORM redpacket.rp_keep_ids(false);
    COMMIT;
    -- a full check of every activity, one transaction each (so the locks of
    -- one activity at a time are held); a pass of the worker running at the
    -- same moment makes rp_reconcile return no row: wait and try again
    FOR a IN SELECT act.id FROM redpacket.activity act ORDER BY act.id LOOP
        deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) interval '60 s';
        LOOP
            SELECT pg_catalog.count(*) AS n,
                   pg_catalog.count(*) FILTER (WHERE NOT x.ok) AS bad
              INTO r FROM redpacket.rp_reconcile(a.id, true) x;
            EXIT WHEN r.n OPERATOR(pg_catalog.>) 0;
            IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>) deadline THEN
                RAISE EXCEPTION 'redpacket: activity % could not be checked within 60 s', a.id
                    USING ERRCODE = 'lock_not_available',
                          HINT = 'Another reconciliation pass kept running; CALL redpacket.rp_post_restore() again.';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.1);
        END LOOP;
        checked := checked OPERATOR(pg_catalog.+) 1;
        failed := failed OPERATOR(pg_catalog.+) r.bad;
        COMMIT;
    END LOOP;
    IF failed OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'redpacket: restore finished, % activities checked, % failed', checked, failed
            USING HINT = 'See redpacket.reconciliation for the failed checks.';
    ELSE
        RAISE NOTICE 'redpacket: restore finished, % activities checked, all ok', checked;
    END IF;
END;
$$;
COMMENT ON PROCEDURE redpacket.rp_post_restore() IS
    'After a restore into this database: clears redpacket.restoring for the database and the session, records the restored positions of the sequences (redpacket.id_marks), then fully checks every activity, one transaction each. CALL it outside a transaction block.';

-- Repairing stripes that no longer match the ledger (src/repair.c), and the
-- check rp_unfreeze makes before it lifts a reconciler's freeze
-- (src/unfreeze.c).
CREATE FUNCTION redpacket.rp_repair_stripes(activity bigint, reason text)
RETURNS redpacket.reconciliation
AS 'MODULE_PATHNAME', 'rp_repair_stripes'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_repair_stripes(bigint, text) IS
    'Rebuilds every stripe of a frozen, open activity from its ledger and its live claims (balance and packets spread evenly, claim counters from the claims, lucky draws dealt ahead cleared), records it in activity_change (kind repair, with the reason), and returns the full check that must then pass (nothing is written otherwise). The activity stays frozen until rp_unfreeze.';
REVOKE ALL ON FUNCTION redpacket.rp_repair_stripes(bigint, text) FROM PUBLIC;
COMMENT ON FUNCTION redpacket.rp_unfreeze(bigint) IS
    'Lifts an operator or reconciliation freeze. An activity the reconciler froze, or whose last check failed, is unfrozen only when a full check passes at that moment (SQLSTATE 55000 naming the failed check otherwise).';

-- What an application may read about a user without claiming (src/lookup.c).
CREATE FUNCTION redpacket.rp_user_claims(activity bigint, user_id text)
RETURNS TABLE (claim_id bigint, amount numeric, claimed_at timestamptz, request_id text)
AS 'MODULE_PATHNAME', 'rp_user_claims'
LANGUAGE C STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1;
COMMENT ON FUNCTION redpacket.rp_user_claims(bigint, text) IS
    'Read-only, for applications: the claims a user holds in an activity (claim_id, amount, claimed_at, request_id), oldest first, found with one index probe; a reversed claim is not held and not listed; no row when none; errors for bad ids as rp_claim. Granted by rp_grant_app.';
REVOKE ALL ON FUNCTION redpacket.rp_user_claims(bigint, text) FROM PUBLIC;

INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('app', 'EXECUTE ON FUNCTION redpacket.rp_user_claims(bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_user_claims(bigint, text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_repair_stripes(bigint, text)');

-- Roles granted under an older version lack what 1.4 adds to their kind.
-- GRANTs run by an extension script become the extension's initial
-- privileges, which pg_dump leaves out (a restore would lose them), so the
-- update does not grant them itself: the owner runs rp_regrant() after it.
CREATE FUNCTION redpacket.rp_regrant() RETURNS TABLE (role regrole, kind text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A role is of a kind when it holds, in its own grants (not through a
    -- role it belongs to), USAGE on the schema and every marker of the kind:
    -- what each version's helper of the kind granted that no update made
    -- again.  rp_grant_app: rp_claim and rp_claim_batch; rp_grant_operator:
    -- close, freeze, unfreeze, reconcile and SELECT on the tables and
    -- activity_status; rp_grant_wallet (1.4): rp_credited,
    -- rp_pending_credits and SELECT on the published tables;
    -- rp_grant_sender (1.5): all it grants.  An operator holds the sender's
    -- markers too and stays an operator.  A role granted some of them by
    -- hand is left as it is.
    FOR role, kind IN
        WITH marker (kind, is_fn, obj) AS (VALUES
            ('app', true, 'redpacket.rp_claim(bigint, text, numeric, text)'),
            ('app', true, 'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])'),
            ('operator', true, 'redpacket.rp_reconcile(bigint, boolean)'),
            ('operator', true, 'redpacket.rp_close_activity(bigint)'),
            ('operator', true, 'redpacket.rp_freeze(bigint, text)'),
            ('operator', true, 'redpacket.rp_unfreeze(bigint)'),
            ('operator', false, 'redpacket.activity'), ('operator', false, 'redpacket.stripe'),
            ('operator', false, 'redpacket.claim'), ('operator', false, 'redpacket.ledger'),
            ('operator', false, 'redpacket.reconcile_state'), ('operator', false, 'redpacket.reconciliation'),
            ('operator', false, 'redpacket.activity_status'),
            ('wallet', true, 'redpacket.rp_credited(bigint, bigint[], text)'),
            ('wallet', true, 'redpacket.rp_pending_credits(bigint, interval)'),
            ('wallet', false, 'redpacket.claim'), ('wallet', false, 'redpacket.ledger'),
            ('wallet', false, 'redpacket.activity_change'), ('wallet', false, 'redpacket.claim_settlement'),
            ('sender', true, 'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean)'),
            ('sender', true, 'redpacket.rp_top_up(bigint, numeric, integer, text)'),
            ('sender', true, 'redpacket.rp_allow(bigint, text[])'),
            ('sender', true, 'redpacket.rp_disallow(bigint, text[])'),
            ('sender', true, 'redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'),
            ('sender', true, 'redpacket.rp_close_activity(bigint)'),
            ('sender', true, 'redpacket.rp_activity_info(bigint, text)'),
            ('sender', true, 'redpacket.rp_best_luck(bigint)'),
            ('sender', true, 'redpacket.rp_user_claims(bigint, text)')),
        m AS (SELECT x.kind, CASE WHEN x.is_fn THEN x.obj::pg_catalog.regprocedure::pg_catalog.oid
                                  ELSE x.obj::pg_catalog.regclass::pg_catalog.oid END AS oid
                FROM marker x),
        held AS (SELECT a.grantee, p.oid FROM pg_catalog.pg_proc p,
                        pg_catalog.aclexplode(p.proacl) a
                  WHERE p.pronamespace OPERATOR(pg_catalog.=) 'redpacket'::pg_catalog.regnamespace
                    AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
                 UNION ALL
                 SELECT a.grantee, c.oid FROM pg_catalog.pg_class c,
                        pg_catalog.aclexplode(c.relacl) a
                  WHERE c.relnamespace OPERATOR(pg_catalog.=) 'redpacket'::pg_catalog.regnamespace
                    AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'),
        users AS (SELECT a.grantee FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
                   WHERE n.nspname OPERATOR(pg_catalog.=) 'redpacket'
                     AND a.privilege_type OPERATOR(pg_catalog.=) 'USAGE'
                     AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
                     AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner),
        kinds AS (SELECT u.grantee, k.kind
                    FROM users u CROSS JOIN (SELECT DISTINCT x.kind FROM m x) k
                   WHERE NOT EXISTS (SELECT FROM m x
                                      WHERE x.kind OPERATOR(pg_catalog.=) k.kind
                                        AND NOT EXISTS (SELECT FROM held h
                                                         WHERE h.grantee OPERATOR(pg_catalog.=) u.grantee
                                                           AND h.oid OPERATOR(pg_catalog.=) x.oid)))
        SELECT DISTINCT k.grantee::pg_catalog.regrole, k.kind FROM kinds k
         WHERE k.kind OPERATOR(pg_catalog.<>) 'sender'
            OR NOT EXISTS (SELECT FROM kinds o WHERE o.grantee OPERATOR(pg_catalog.=) k.grantee
                              AND o.kind OPERATOR(pg_catalog.=) 'operator')
         ORDER BY 2, 1
    LOOP
        PERFORM redpacket.rp_grant_role(role, kind);
        RETURN NEXT;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_regrant() IS
    'After ALTER EXTENSION redpacket UPDATE: gives every role that a helper granted what that helper grants now, and returns them. A role counts as granted by rp_grant_app, rp_grant_operator, rp_grant_wallet or rp_grant_sender when it holds in its own grants (not through a role it belongs to) USAGE on the schema and everything every version''s helper of that kind gave (app: rp_claim, rp_claim_batch; operator: close, freeze, unfreeze, reconcile and SELECT on the tables and activity_status; wallet: rp_credited, rp_pending_credits and SELECT on the published tables; sender: all it grants, unless it is an operator). A role granted only some of these by hand is left as it is. For the extension owner.';
REVOKE ALL ON FUNCTION redpacket.rp_regrant() FROM PUBLIC;

SELECT redpacket.rp_keep_ids(true);

-- [citus] Scale-out -----------------------------------------------------------
-- 1.4: redpacket.activity_change is keyed by activity like the other tables
-- (distributed with them; its sequence confined to the node's range like
-- theirs).  On a cluster distributed under 1.3, call rp_distribute() again
-- on the coordinator after the update: it distributes what is not yet.
CREATE OR REPLACE FUNCTION redpacket.rp_node_sequences() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    grp  bigint;
    seq  text;
    top  bigint;
    last bigint;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'citus is not installed in this database',
            HINT = 'Run CREATE EXTENSION citus on every node first.';
    END IF;
    EXECUTE 'SELECT groupid FROM pg_catalog.pg_dist_local_group' INTO grp;
    IF grp IS NULL OR grp OPERATOR(pg_catalog.<) 0 OR grp OPERATOR(pg_catalog.>) 32766 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = pg_catalog.format('this node has no usable Citus group id (%s)', grp),
            HINT = 'Add the node to the cluster with citus_add_node() on the coordinator first.';
    END IF;
    -- Node group g hands out ids in [g * 2^48 + 1, (g + 1) * 2^48 - 1].
    top := ((grp OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.<<) 48) OPERATOR(pg_catalog.-) 1;
    FOREACH seq IN ARRAY ARRAY['activity_id_seq', 'claim_id_seq', 'ledger_entry_id_seq',
                               'reconciliation_pass_id_seq', 'activity_change_id_seq',
                               'claim_settlement_id_seq'] LOOP
        last := GREATEST(
            pg_catalog.pg_sequence_last_value(pg_catalog.format('redpacket.%I', seq)::pg_catalog.regclass),
            grp OPERATOR(pg_catalog.<<) 48);
        IF last OPERATOR(pg_catalog.>=) top THEN
            RAISE EXCEPTION USING
                ERRCODE = 'sequence_generator_limit_exceeded',
                MESSAGE = pg_catalog.format('sequence redpacket.%I is beyond the range of node group %s', seq, grp);
        END IF;
        EXECUTE pg_catalog.format('ALTER SEQUENCE redpacket.%I MAXVALUE %s', seq, top);
        -- setval, not RESTART: the sequence then reports its last value, which
        -- the reconciler's completeness check compares ids against.
        IF last OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.setval(pg_catalog.format('redpacket.%I', seq)::pg_catalog.regclass, last, true);
        END IF;
    END LOOP;
END;
$$;
CREATE OR REPLACE FUNCTION redpacket.rp_distribute(shard_count integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t      record;
    f      text;
    r      record;
    mine   text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'citus is not installed in this database',
            DETAIL = 'rp_distribute() distributes redpacket''s tables with Citus.',
            HINT = 'Preload citus before redpacket on every node, CREATE EXTENSION citus, add the workers, then call rp_distribute() on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'rp_distribute() must run on the Citus coordinator',
            HINT = 'Connect to the coordinator, or call citus_set_coordinator_host() there first.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node n
                    WHERE n.groupid OPERATOR(pg_catalog.<>) 0 AND n.isactive) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'the Citus cluster has no worker node',
            HINT = 'Add the workers with citus_add_node() first.';
    END IF;
    -- Every worker must have the same redpacket (its functions run there).
    SELECT e.extversion INTO mine FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'redpacket';
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 $q$SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'redpacket'$q$) LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM mine THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('worker %s:%s does not have redpacket %s', r.nodename, r.nodeport, mine),
                DETAIL = pg_catalog.format('It answered: %s.', COALESCE(NULLIF(r.result, ''), 'not installed')),
                HINT = 'Install the same redpacket on every node (shared_preload_libraries = ''citus,redpacket'', CREATE EXTENSION redpacket), then retry.';
        END IF;
    END LOOP;

    -- No reconciliation pass (worker or rp_reconcile) may run while the tables
    -- move: it would read half-moved data.  These locks make every pass on
    -- this node wait until this transaction commits (create_distributed_table
    -- takes them too, but one at a time; here all of them come first, in one
    -- order).  The workers' passes: see the end.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_change,
               redpacket.eligible, redpacket.reconcile_problem, redpacket.claim_settlement,
               redpacket.settlement_state, redpacket.settlement_gap
          IN ACCESS EXCLUSIVE MODE;

    PERFORM pg_catalog.set_config('citus.shard_replication_factor', '1', true);
    -- The append-only triggers must hold on every shard.
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    IF shard_count IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.shard_count', shard_count::text, true);
    END IF;

    -- Every table is keyed by activity first; all colocated with activity, so
    -- one activity's rows sit on one node.  No reference table: nothing is
    -- shared between activities.
    FOR t IN SELECT * FROM (VALUES (1, 'redpacket.activity', 'id'),
                                   (2, 'redpacket.stripe', 'activity_id'),
                                   (3, 'redpacket.claim', 'activity_id'),
                                   (4, 'redpacket.ledger', 'activity_id'),
                                   (5, 'redpacket.reconcile_state', 'activity_id'),
                                   (6, 'redpacket.reconciliation', 'activity_id'),
                                   (7, 'redpacket.activity_change', 'activity_id'),
                                   (8, 'redpacket.eligible', 'activity_id'),
                                   (9, 'redpacket.reconcile_problem', 'activity_id'),
                                   (10, 'redpacket.claim_settlement', 'activity_id'),
                                   (11, 'redpacket.settlement_state', 'activity_id'),
                                   (12, 'redpacket.settlement_gap', 'activity_id')) v(n, rel, col)
             ORDER BY n LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
                               WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.rel::pg_catalog.regclass);
        -- On a shard the guard of the rows only the extension changes cannot
        -- tell the coordinator's statements from a stranger's: a distributed
        -- table does not keep it (the checks still report what they cover).
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS guard ON %s', t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.create_distributed_table(t.rel::pg_catalog.regclass, t.col,
            colocate_with => CASE WHEN t.n OPERATOR(pg_catalog.=) 1 THEN 'none' ELSE 'redpacket.activity' END);
        -- The rows now live in the shards; drop the invisible local copy
        -- (the append-only guard must not fire for that: replica role).
        PERFORM pg_catalog.set_config('session_replication_role', 'replica', true);
        PERFORM pg_catalog.truncate_local_data_after_distributing_table(t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.set_config('session_replication_role', 'origin', true);
    END LOOP;

    -- Every function that takes our locks runs on the node holding the
    -- activity, also inside an explicit transaction (force_delegation).
    FOREACH f IN ARRAY ARRAY['redpacket.rp_claim(bigint, text, numeric, text)',
                             'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])',
                             'redpacket.rp_close_activity(bigint)',
                             'redpacket.rp_freeze(bigint, text)',
                             'redpacket.rp_unfreeze(bigint)',
                             'redpacket.rp_repair_stripes(bigint, text)',
                             'redpacket.rp_reverse(bigint, bigint, text)',
                             'redpacket.rp_credited(bigint, bigint[], text)',
                             'redpacket.rp_allow(bigint, text[])',
                             'redpacket.rp_disallow(bigint, text[])',
                             'redpacket.rp_top_up(bigint, numeric, integer, text)',
                             'redpacket.rp_withdraw(bigint, numeric, text)',
                             'redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'] LOOP
        PERFORM pg_catalog.create_distributed_function(f::pg_catalog.regprocedure, distribution_arg_name => 'activity',
            colocate_with => 'redpacket.activity', force_delegation => true);
    END LOOP;
    -- rp_reconcile(NULL) lists every activity: forced delegation would refuse
    -- that query, so it is delegated only when called on its own.
    PERFORM pg_catalog.create_distributed_function('redpacket.rp_reconcile(bigint, boolean)'::pg_catalog.regprocedure,
        distribution_arg_name => 'activity', colocate_with => 'redpacket.activity');

    -- Disjoint id ranges per node.
    PERFORM redpacket.rp_node_sequences();
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 'SELECT redpacket.rp_node_sequences()') LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('could not set the sequences of worker %s:%s', r.nodename, r.nodeport),
                DETAIL = r.result;
        END IF;
    END LOOP;

    -- The lock above holds this node's passes only.  A worker's own pass
    -- reads its copy of the tables, which Citus turns into distributed
    -- tables when this transaction commits there: a pass planning its query
    -- at that moment sees them change under it and fails.  The tables are
    -- distributed now, so the same LOCK goes to every worker, inside this
    -- transaction: their passes wait until the commit, or it waits for them.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_change,
               redpacket.eligible, redpacket.reconcile_problem, redpacket.claim_settlement,
               redpacket.settlement_state, redpacket.settlement_gap
          IN ACCESS EXCLUSIVE MODE;
END;
$$;

-- [pg18] PostgreSQL 18 ---------------------------------------------------------
-- PostgreSQL 18's pg_dump also writes the publication's tables (ALTER
-- PUBLICATION redpacket_events ADD TABLE ONLY redpacket.claim, ... after the
-- CREATE PUBLICATION, which the keeper has completed already): before such a
-- command the keeper drops the table from the publication when the keeper
-- put it there (no column list, no row filter), and the command adds it.
CREATE EVENT TRIGGER redpacket_publication_alter ON ddl_command_start
    WHEN TAG IN ('ALTER PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
COMMENT ON EVENT TRIGGER redpacket_publication_alter IS
    'Before ALTER PUBLICATION redpacket_events ADD TABLE redpacket.claim or redpacket.ledger (from a dump): drops the table from the publication if it is in it without a column list or row filter, so that the command adds it instead of failing.';
COMMENT ON FUNCTION redpacket.rp_publication_keeper() IS
    'Event trigger function: when CREATE PUBLICATION redpacket_events runs (a restored dump), replaces the one the extension made and puts claim and ledger into it; before ALTER PUBLICATION redpacket_events ADD TABLE of claim or ledger, takes out the copy it put in.';

-- 1.5 ------------------------------------------------------------------------
-- (After the 1.4 part's columns of reconciler, as the update adds it.)
-- Each pass also probes the next activity ids, in turn, for an activity
-- that lost its reconcile_state row.
ALTER TABLE redpacket.reconciler ADD COLUMN probed_through bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.reconciler.probed_through IS
    'The last activity id the latest pass over all probed for a lost reconcile_state row; the next pass probes the ids after it (0: from the start).';

-- A sender's role: what a service that sends group packets needs and no
-- more.  It creates activities, tops them up, lists who may claim, moves
-- their window, closes them, and reads what an application may show; it
-- withdraws, reverses, freezes, repairs and reads tables not at all.
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_top_up(bigint, numeric, integer, text)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_allow(bigint, text[])'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_disallow(bigint, text[])'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_close_activity(bigint)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_activity_info(bigint, text)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_best_luck(bigint)'),
    ('sender', 'EXECUTE ON FUNCTION redpacket.rp_user_claims(bigint, text)');
CREATE FUNCTION redpacket.rp_grant_sender(role regrole) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT redpacket.rp_grant_role(role, 'sender');
END;
COMMENT ON FUNCTION redpacket.rp_grant_sender(regrole) IS
    'Grants a sending service''s role USAGE on the schema and what redpacket.role_grant lists for sender: rp_create_activity, rp_top_up, rp_allow, rp_disallow, rp_set_window, rp_close_activity and the lookups an application has (rp_activity_info, rp_best_luck, rp_user_claims); no withdrawal, reversal, freeze, repair or table. It acts on every activity of the database.';
REVOKE ALL ON FUNCTION redpacket.rp_grant_sender(regrole) FROM PUBLIC;

-- The claims a wallet acknowledged under one reference: how a wallet that
-- keeps no inbox recovers a batch it acknowledged and may not have paid
-- (it notes the reference before rp_credited, pays what this returns).
CREATE INDEX claim_settlement_reference ON redpacket.claim_settlement (reference)
    WHERE reference IS NOT NULL;
COMMENT ON INDEX redpacket.claim_settlement_reference IS
    'Credits by the wallet''s reference: what rp_credits reads.';
CREATE FUNCTION redpacket.rp_credits(reference text)
RETURNS TABLE (activity_id bigint, claim_id bigint, user_id text, amount numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF reference IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'reference must not be NULL';
    END IF;
    RETURN QUERY
    SELECT s.activity_id, s.claim_id, c.user_id, c.amount
      FROM redpacket.claim_settlement s
      JOIN redpacket.claim c ON c.activity_id OPERATOR(pg_catalog.=) s.activity_id
                            AND c.claim_id OPERATOR(pg_catalog.=) s.claim_id
     WHERE s.reference OPERATOR(pg_catalog.=) rp_credits.reference
       AND s.state OPERATOR(pg_catalog.=) 'credited'
     ORDER BY s.activity_id, s.claim_id;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_credits(text) IS
    'The claims rp_credited recorded as credited under this reference (activity_id, claim_id, user_id, amount), by activity and claim: what a wallet that noted the reference before acknowledging pays after a crash. No row for an unknown reference; 22004 for NULL. Granted by rp_grant_wallet and rp_grant_operator.';
REVOKE ALL ON FUNCTION redpacket.rp_credits(text) FROM PUBLIC;
INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_credits(text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_credits(text)');

-- The uncredited alert: the passes look for claims neither credited nor
-- reversed longer than redpacket.credit_deadline, a window of activities a
-- pass, in turn from reconciler.credit_probed_through, and report them as
-- the problem uncredited (never a freeze: the money is in the claims).
ALTER TABLE redpacket.reconciler ADD COLUMN credit_probed_through bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.reconciler.credit_probed_through IS
    'The last activity id the latest pass looked at for claims uncredited past redpacket.credit_deadline; the next pass looks at the ids after it (0: from the start).';
CREATE OR REPLACE VIEW redpacket.activity_status AS
SELECT a.id,
       a.name,
       CASE
           WHEN a.frozen_reason IS NOT NULL THEN 'frozen'
           WHEN a.closed_at IS NOT NULL
                OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'ended'
           WHEN a.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'scheduled'
           WHEN s.balance OPERATOR(pg_catalog.=) 0
                OR s.packets OPERATOR(pg_catalog.=) 0 THEN 'exhausted'
           ELSE 'active'
       END AS state,
       a.scale,
       l.funded AS total,
       l.funded OPERATOR(pg_catalog.-) l.returned
                OPERATOR(pg_catalog.-) s.remaining AS claimed_amount,
       s.claims AS claimed_count,
       s.remaining AS remaining_amount,
       s.packets AS remaining_packets,
       a.stripes,
       a.starts_at,
       a.ends_at,
       p.checked_at AS last_reconciled_at,
       p.ok AS last_reconcile_ok,
       a.frozen_reason,
       (SELECT rs.last_full_check_at FROM redpacket.reconcile_state rs
         WHERE rs.activity_id OPERATOR(pg_catalog.=) a.id) AS last_full_check_at,
       (a.packets OPERATOR(pg_catalog.+) l.added_packets)::pg_catalog.int8 AS packets,
       a.restricted,
       u.since AS unchecked_since,
       u.error AS last_check_error,
       (SELECT q.since FROM redpacket.reconcile_problem q
         WHERE q.activity_id OPERATOR(pg_catalog.=) a.id
           AND q.problem OPERATOR(pg_catalog.=) 'uncredited') AS uncredited_since
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT pg_catalog.sum(st.balance) AS balance,
           pg_catalog.sum(st.packets) AS packets,
           pg_catalog.sum(st.claims) AS claims,
           pg_catalog.round(pg_catalog.sum(st.balance)::numeric
                            OPERATOR(pg_catalog./) (10::numeric OPERATOR(pg_catalog.^) a.scale),
                            a.scale) AS remaining
    FROM redpacket.stripe st
    WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s
CROSS JOIN LATERAL (
    SELECT COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}')), 0)
           OPERATOR(pg_catalog.-)
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded,
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{return,refund}')), 0) AS returned,
           COALESCE(pg_catalog.sum(g.packets) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'top_up'), 0) AS added_packets
    FROM redpacket.ledger g
    WHERE g.activity_id OPERATOR(pg_catalog.=) a.id) l
LEFT JOIN LATERAL (
    SELECT rc.checked_at, rc.ok, rc.pass_id
    FROM redpacket.reconciliation rc
    WHERE rc.activity_id OPERATOR(pg_catalog.=) a.id
      AND NOT COALESCE(rc.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[], false)
    ORDER BY rc.pass_id DESC
    LIMIT 1) p ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.min(e.checked_at) AS since,
           (pg_catalog.array_agg(e.error ORDER BY e.pass_id DESC))[1] AS error
    FROM redpacket.reconciliation e
    WHERE e.activity_id OPERATOR(pg_catalog.=) a.id
      AND e.pass_id OPERATOR(pg_catalog.>) COALESCE(p.pass_id, 0)
      AND e.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[]) u ON true;
COMMENT ON COLUMN redpacket.activity_status.uncredited_since IS 'Since when claims of this activity stay neither credited nor reversed longer than redpacket.credit_deadline (the problem uncredited); NULL when none, or when the deadline is off.';
CREATE OR REPLACE VIEW redpacket.reconciler_status AS
SELECT pg_catalog.current_database() AS database,
       r.last_pass_started_at,
       r.last_pass_finished_at,
       pg_catalog.round(r.last_pass_ms, 3) AS last_pass_ms,
       r.activities_checked,
       r.failures,
       COALESCE(r.last_pass_finished_at, r.installed_at) OPERATOR(pg_catalog.+) i.every AS next_due_at,
       f.last_full_check_at,
       pg_catalog.now() OPERATOR(pg_catalog.>)
           (COALESCE(r.last_pass_finished_at, r.installed_at)
            OPERATOR(pg_catalog.+) (i.every OPERATOR(pg_catalog.*) 2::pg_catalog.float8)) AS overdue,
       i.every AS expected_every,
       redpacket.rp_launcher_running() AS launcher_running,
       r.passes,
       r.checks,
       r.mismatches,
       r.unchecked,
       r.settlements,
       r.last_pass_mismatches,
       r.last_pass_unchecked,
       (SELECT pg_catalog.count(*) FROM redpacket.reconcile_state s WHERE NOT s.last_ok) AS failing,
       (SELECT pg_catalog.count(*) FROM redpacket.reconcile_problem p
         WHERE p.problem OPERATOR(pg_catalog.=) 'incomplete') AS incomplete,
       (SELECT pg_catalog.count(*) FROM redpacket.reconcile_problem p
         WHERE p.problem OPERATOR(pg_catalog.=) 'uncredited') AS uncredited
FROM (SELECT CASE WHEN s.every OPERATOR(pg_catalog.>) '0'::pg_catalog.interval THEN s.every
                  ELSE '60 s'::pg_catalog.interval END AS every
        FROM (SELECT COALESCE(pg_catalog.current_setting('redpacket.reconcile_interval', true),
                              '60')::pg_catalog.interval AS every) s) i
LEFT JOIN redpacket.reconciler r ON true
CROSS JOIN (SELECT pg_catalog.min(s.last_full_check_at) AS last_full_check_at
              FROM redpacket.reconcile_state s) f;
COMMENT ON COLUMN redpacket.reconciler_status.uncredited IS 'Activities with claims neither credited nor reversed longer than redpacket.credit_deadline (reconcile_problem).';

-- [guard] Rows only the extension changes -------------------------------------
-- Activities, stripes, reconciliation state, settlement progress, the
-- eligibility lists, open problems and the reconciler's row change only
-- through the redpacket functions: an UPDATE or DELETE that is not one of the
-- extension's own statements (or of its scripts), and any TRUNCATE, is
-- refused (42501).  An INSERT into a table pg_dump writes out is let through
-- for pg_restore, and the checks report a row that does not belong; the
-- tables that are not dumped (derived or per-database state) refuse it too.
-- With session_replication_role = replica no trigger fires: the checks
-- report what changed then.
CREATE FUNCTION redpacket.rp_guard() RETURNS trigger
AS 'MODULE_PATHNAME', 'rp_guard'
LANGUAGE C;
COMMENT ON FUNCTION redpacket.rp_guard() IS
    'Trigger function that refuses a change of a table whose rows only the extension changes (UPDATE, DELETE, TRUNCATE, and INSERT where the trigger fires on it), unless the statement is one of the extension''s own or of its scripts; TRUNCATE always.';
REVOKE ALL ON FUNCTION redpacket.rp_guard() FROM PUBLIC;
-- A table Citus already distributes (a cluster distributed under 1.4) does
-- not get the guard, as rp_distribute drops it on the tables it distributes.
DO $guard$
DECLARE
    t text;
    inserts boolean;
    distributed boolean;
BEGIN
    FOR t, inserts IN SELECT * FROM (VALUES
            ('activity', false), ('stripe', false), ('reconcile_state', false), ('eligible', false),
            ('reconciler', true), ('role_grant', true), ('settlement_state', true),
            ('settlement_gap', true), ('reconcile_problem', true)) g LOOP
        distributed := false;
        IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
            EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
                    ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
               INTO distributed USING pg_catalog.format('redpacket.%I', t)::pg_catalog.regclass;
        END IF;
        CONTINUE WHEN distributed;
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER guard BEFORE %sUPDATE OR DELETE OR TRUNCATE ON redpacket.%I'
            ' FOR EACH STATEMENT EXECUTE FUNCTION redpacket.rp_guard()',
            CASE WHEN inserts THEN 'INSERT OR ' ELSE '' END, t);
    END LOOP;
END
$guard$;

-- ============================================================================
-- 1.6: the changes of redpacket--1.5--1.6.sql.
-- ============================================================================

-- [send] The split, the funder and the sender's request id ---------------------
-- How an activity's packets are split is one of its terms, fixed at
-- creation: lucky (the server draws every amount), equal (every packet
-- total / packets) or caller (every claim names its amount); any is what
-- 1.5 and earlier did (a claim naming an amount is paid it, one without
-- draws), kept for the activities created before and for callers that do
-- not say.  The funder is who sent the packet and gets back what is left;
-- with a request id, a retried creation returns the activity it made.
ALTER TABLE redpacket.activity
    ADD COLUMN split text NOT NULL DEFAULT 'any'
        CONSTRAINT activity_split_check CHECK (split IN ('any', 'lucky', 'equal', 'caller')),
    ADD COLUMN funder text COLLATE "C",
    ADD COLUMN request_id text COLLATE "C";
COMMENT ON COLUMN redpacket.activity.split IS
    'How claims are paid: lucky (the server draws each amount; a claim naming one is refused), equal (every packet is total / packets; a claim naming an amount is refused), caller (every claim names its amount) or any (an amount named is paid, none draws: what activities created before 1.6 or without a split do).';
COMMENT ON COLUMN redpacket.activity.funder IS
    'Who funded the activity (the sender''s own id, opaque), to whom its remainder, withdrawals and refunds go back; NULL when not given.';
COMMENT ON COLUMN redpacket.activity.request_id IS
    'The sender''s id of the creation request: a rp_create_activity retried with the same funder and request_id returns this activity and funds nothing; NULL when not given.';
CREATE INDEX activity_request ON redpacket.activity (funder, request_id)
    WHERE request_id IS NOT NULL;
COMMENT ON INDEX redpacket.activity_request IS
    'Activities by the funder and request id of their creation: how a retried rp_create_activity finds the activity it made.';

ALTER TABLE redpacket.ledger ADD COLUMN funder text COLLATE "C";
COMMENT ON COLUMN redpacket.ledger.funder IS
    'The activity''s funder, from whom (fund, top_up) or to whom (withdraw, return, refund) the money moved; NULL when the activity has none, and on entries written before 1.6.';

-- rp_create_activity gains the split, the funder and the request id, and
-- rp_activity_info shows the split and the funder: new functions replace the
-- 1.5 ones.  The roles granted them get the new ones from rp_regrant() after
-- the update (a grant made by an update script is an initial privilege of
-- the extension, which pg_dump leaves out).
DROP FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean);
CREATE FUNCTION redpacket.rp_create_activity(
    total          numeric,
    packets        integer DEFAULT NULL,
    starts_at      timestamptz DEFAULT pg_catalog.now(),
    ends_at        timestamptz DEFAULT NULL,
    stripes        integer DEFAULT NULL,
    name           text DEFAULT NULL,
    scale          integer DEFAULT 2,
    per_user_limit integer DEFAULT 1,
    restricted     boolean DEFAULT false,
    split          text DEFAULT NULL,
    funder         text DEFAULT NULL,
    request_id     text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_create_activity'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text) IS
    'Funds a new activity with total (split over stripes sub-balances) and returns its id; packets caps the number of claims; split is lucky, equal or caller (NULL: any, an amount named is paid and none draws); restricted pays only the users rp_allow lists; funder is who sent it; a retry with the same funder and request_id returns the same activity and funds nothing (other terms: 23505).';
REVOKE ALL ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text) FROM PUBLIC;

CREATE OR REPLACE VIEW redpacket.activity_status AS
SELECT a.id,
       a.name,
       CASE
           WHEN a.frozen_reason IS NOT NULL THEN 'frozen'
           WHEN a.closed_at IS NOT NULL
                OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'ended'
           WHEN a.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'scheduled'
           WHEN s.balance OPERATOR(pg_catalog.=) 0
                OR s.packets OPERATOR(pg_catalog.=) 0 THEN 'exhausted'
           ELSE 'active'
       END AS state,
       a.scale,
       l.funded AS total,
       l.funded OPERATOR(pg_catalog.-) l.returned
                OPERATOR(pg_catalog.-) s.remaining AS claimed_amount,
       s.claims AS claimed_count,
       s.remaining AS remaining_amount,
       s.packets AS remaining_packets,
       a.stripes,
       a.starts_at,
       a.ends_at,
       p.checked_at AS last_reconciled_at,
       p.ok AS last_reconcile_ok,
       a.frozen_reason,
       (SELECT rs.last_full_check_at FROM redpacket.reconcile_state rs
         WHERE rs.activity_id OPERATOR(pg_catalog.=) a.id) AS last_full_check_at,
       (a.packets OPERATOR(pg_catalog.+) l.added_packets)::pg_catalog.int8 AS packets,
       a.restricted,
       u.since AS unchecked_since,
       u.error AS last_check_error,
       (SELECT q.since FROM redpacket.reconcile_problem q
         WHERE q.activity_id OPERATOR(pg_catalog.=) a.id
           AND q.problem OPERATOR(pg_catalog.=) 'uncredited') AS uncredited_since,
       a.split,
       a.funder
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT pg_catalog.sum(st.balance) AS balance,
           pg_catalog.sum(st.packets) AS packets,
           pg_catalog.sum(st.claims) AS claims,
           pg_catalog.round(pg_catalog.sum(st.balance)::numeric
                            OPERATOR(pg_catalog./) (10::numeric OPERATOR(pg_catalog.^) a.scale),
                            a.scale) AS remaining
    FROM redpacket.stripe st
    WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s
CROSS JOIN LATERAL (
    SELECT COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}')), 0)
           OPERATOR(pg_catalog.-)
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded,
           COALESCE(pg_catalog.sum(g.amount) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) ANY ('{return,refund}')), 0) AS returned,
           COALESCE(pg_catalog.sum(g.packets) FILTER
                        (WHERE g.kind OPERATOR(pg_catalog.=) 'top_up'), 0) AS added_packets
    FROM redpacket.ledger g
    WHERE g.activity_id OPERATOR(pg_catalog.=) a.id) l
LEFT JOIN LATERAL (
    SELECT rc.checked_at, rc.ok, rc.pass_id
    FROM redpacket.reconciliation rc
    WHERE rc.activity_id OPERATOR(pg_catalog.=) a.id
      AND NOT COALESCE(rc.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[], false)
    ORDER BY rc.pass_id DESC
    LIMIT 1) p ON true
LEFT JOIN LATERAL (
    SELECT pg_catalog.min(e.checked_at) AS since,
           (pg_catalog.array_agg(e.error ORDER BY e.pass_id DESC))[1] AS error
    FROM redpacket.reconciliation e
    WHERE e.activity_id OPERATOR(pg_catalog.=) a.id
      AND e.pass_id OPERATOR(pg_catalog.>) COALESCE(p.pass_id, 0)
      AND e.problems OPERATOR(pg_catalog.@>) '{error}'::pg_catalog.text[]) u ON true;
COMMENT ON COLUMN redpacket.activity_status.split IS 'How claims are paid: lucky, equal, caller or any (redpacket.activity.split).';
COMMENT ON COLUMN redpacket.activity_status.funder IS 'Who funded the activity; NULL when not given.';

DROP FUNCTION redpacket.rp_activity_info(bigint, text);
CREATE FUNCTION redpacket.rp_activity_info(activity bigint, user_id text DEFAULT NULL)
RETURNS TABLE (state text, remaining_amount numeric, remaining_packets bigint,
               starts_at timestamptz, ends_at timestamptz, total numeric, packets bigint,
               eligible boolean, split text, funder text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF activity IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'activity must not be NULL';
    END IF;
    IF pg_catalog.octet_length(user_id) OPERATOR(pg_catalog.=) 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'user_id must not be empty';
    END IF;
    IF pg_catalog.octet_length(user_id) OPERATOR(pg_catalog.>) 256 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'user_id is too long',
            DETAIL = pg_catalog.format('A user_id has at most 256 bytes; this one has %s.',
                                       pg_catalog.octet_length(user_id));
    END IF;
    RETURN QUERY
        SELECT s.state, s.remaining_amount, s.remaining_packets, s.starts_at, s.ends_at,
               s.total, s.packets,
               CASE WHEN rp_activity_info.user_id IS NULL THEN NULL
                    WHEN NOT s.restricted THEN true
                    ELSE EXISTS (SELECT FROM redpacket.eligible e
                                  WHERE e.activity_id OPERATOR(pg_catalog.=) s.id
                                    AND e.user_id OPERATOR(pg_catalog.=) rp_activity_info.user_id)
               END,
               s.split, s.funder
          FROM redpacket.activity_status s
         WHERE s.id OPERATOR(pg_catalog.=) rp_activity_info.activity;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found',
            MESSAGE = pg_catalog.format('activity %s does not exist', activity);
    END IF;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_activity_info(bigint, text) IS
    'Read-only view of one activity for applications: its state (scheduled, active, exhausted, ended, frozen), remaining amount and packets, start and end, funded total and packet cap today, with a user_id whether that user is eligible (unrestricted, or on the list; NULL without a user), how claims are paid (split) and who funded it. Granted by rp_grant_app.';
REVOKE ALL ON FUNCTION redpacket.rp_activity_info(bigint, text) FROM PUBLIC;

UPDATE redpacket.role_grant
   SET privilege = 'EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text)'
 WHERE privilege OPERATOR(pg_catalog.=) 'EXECUTE ON FUNCTION redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean)';

-- rp_regrant finds the roles of each kind by what the update did not make again.
CREATE OR REPLACE FUNCTION redpacket.rp_regrant() RETURNS TABLE (role regrole, kind text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A role is of a kind when it holds, in its own grants (not through a
    -- role it belongs to), USAGE on the schema and every marker of the kind:
    -- what each version's helper of the kind granted that no update made
    -- again.  rp_grant_app: rp_claim and rp_claim_batch; rp_grant_operator:
    -- close, freeze, unfreeze, reconcile and SELECT on the tables and
    -- activity_status; rp_grant_wallet (1.4): rp_credited,
    -- rp_pending_credits and SELECT on the published tables;
    -- rp_grant_sender (1.5): all it grants but rp_create_activity and
    -- rp_activity_info, which 1.6 made again.  An operator holds the sender's
    -- markers too and stays an operator.  A role granted some of them by
    -- hand is left as it is.
    FOR role, kind IN
        WITH marker (kind, is_fn, obj) AS (VALUES
            ('app', true, 'redpacket.rp_claim(bigint, text, numeric, text)'),
            ('app', true, 'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])'),
            ('operator', true, 'redpacket.rp_reconcile(bigint, boolean)'),
            ('operator', true, 'redpacket.rp_close_activity(bigint)'),
            ('operator', true, 'redpacket.rp_freeze(bigint, text)'),
            ('operator', true, 'redpacket.rp_unfreeze(bigint)'),
            ('operator', false, 'redpacket.activity'), ('operator', false, 'redpacket.stripe'),
            ('operator', false, 'redpacket.claim'), ('operator', false, 'redpacket.ledger'),
            ('operator', false, 'redpacket.reconcile_state'), ('operator', false, 'redpacket.reconciliation'),
            ('operator', false, 'redpacket.activity_status'),
            ('wallet', true, 'redpacket.rp_credited(bigint, bigint[], text)'),
            ('wallet', true, 'redpacket.rp_pending_credits(bigint, interval)'),
            ('wallet', false, 'redpacket.claim'), ('wallet', false, 'redpacket.ledger'),
            ('wallet', false, 'redpacket.activity_change'), ('wallet', false, 'redpacket.claim_settlement'),
            ('sender', true, 'redpacket.rp_top_up(bigint, numeric, integer, text)'),
            ('sender', true, 'redpacket.rp_allow(bigint, text[])'),
            ('sender', true, 'redpacket.rp_disallow(bigint, text[])'),
            ('sender', true, 'redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'),
            ('sender', true, 'redpacket.rp_close_activity(bigint)'),
            ('sender', true, 'redpacket.rp_best_luck(bigint)'),
            ('sender', true, 'redpacket.rp_user_claims(bigint, text)')),
        m AS (SELECT x.kind, CASE WHEN x.is_fn THEN x.obj::pg_catalog.regprocedure::pg_catalog.oid
                                  ELSE x.obj::pg_catalog.regclass::pg_catalog.oid END AS oid
                FROM marker x),
        held AS (SELECT a.grantee, p.oid FROM pg_catalog.pg_proc p,
                        pg_catalog.aclexplode(p.proacl) a
                  WHERE p.pronamespace OPERATOR(pg_catalog.=) 'redpacket'::pg_catalog.regnamespace
                    AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
                 UNION ALL
                 SELECT a.grantee, c.oid FROM pg_catalog.pg_class c,
                        pg_catalog.aclexplode(c.relacl) a
                  WHERE c.relnamespace OPERATOR(pg_catalog.=) 'redpacket'::pg_catalog.regnamespace
                    AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'),
        users AS (SELECT a.grantee FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
                   WHERE n.nspname OPERATOR(pg_catalog.=) 'redpacket'
                     AND a.privilege_type OPERATOR(pg_catalog.=) 'USAGE'
                     AND a.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
                     AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner),
        kinds AS (SELECT u.grantee, k.kind
                    FROM users u CROSS JOIN (SELECT DISTINCT x.kind FROM m x) k
                   WHERE NOT EXISTS (SELECT FROM m x
                                      WHERE x.kind OPERATOR(pg_catalog.=) k.kind
                                        AND NOT EXISTS (SELECT FROM held h
                                                         WHERE h.grantee OPERATOR(pg_catalog.=) u.grantee
                                                           AND h.oid OPERATOR(pg_catalog.=) x.oid)))
        SELECT DISTINCT k.grantee::pg_catalog.regrole, k.kind FROM kinds k
         WHERE k.kind OPERATOR(pg_catalog.<>) 'sender'
            OR NOT EXISTS (SELECT FROM kinds o WHERE o.grantee OPERATOR(pg_catalog.=) k.grantee
                              AND o.kind OPERATOR(pg_catalog.=) 'operator')
         ORDER BY 2, 1
    LOOP
        PERFORM redpacket.rp_grant_role(role, kind);
        RETURN NEXT;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_regrant() IS
    'After ALTER EXTENSION redpacket UPDATE: gives every role that a helper granted what that helper grants now, and returns them. A role counts as granted by rp_grant_app, rp_grant_operator, rp_grant_wallet or rp_grant_sender when it holds in its own grants (not through a role it belongs to) USAGE on the schema and everything every version''s helper of that kind gave (app: rp_claim, rp_claim_batch; operator: close, freeze, unfreeze, reconcile and SELECT on the tables and activity_status; wallet: rp_credited, rp_pending_credits and SELECT on the published tables; sender: all it grants, unless it is an operator). A role granted only some of these by hand is left as it is. For the extension owner.';

COMMENT ON FUNCTION redpacket.rp_claim(bigint, text, numeric, text) IS
    'Claims from an activity: records the claim and decrements a stripe in the caller''s transaction. amount is named on a caller activity, NULL on a lucky one (the server draws) or an equal one (the equal share); on an any activity NULL draws. Business outcomes are statuses, bad input is an error.';

-- [refund] What goes back to funders, acknowledged once ----------------------
-- A withdrawal, a return and a refund after settlement are money the funder
-- is owed.  Each such ledger entry (amount above zero) gets a refund row in
-- the same transaction; the wallet lists the unacknowledged ones
-- (rp_pending_refunds) and acknowledges them once (rp_refunded), as it does
-- with claims.  The partial index holds only what is pending, so listing it
-- costs what is owed now, not every refund ever made.
CREATE TABLE redpacket.refund (
    activity_id bigint NOT NULL,
    entry_id    bigint NOT NULL,
    refunded_at timestamptz,
    refunded_by name,
    reference   text,
    PRIMARY KEY (activity_id, entry_id),
    CHECK ((refunded_at IS NULL) = (refunded_by IS NULL)),
    CHECK (refunded_at IS NOT NULL OR reference IS NULL)
);
CREATE INDEX refund_pending ON redpacket.refund (activity_id, entry_id)
    WHERE refunded_at IS NULL;
CREATE INDEX refund_reference ON redpacket.refund (reference)
    WHERE reference IS NOT NULL;
COMMENT ON TABLE redpacket.refund IS
    'One row per ledger entry that owes money back to the activity''s funder (withdraw, return or refund with an amount above zero), written with the entry; pending until the wallet acknowledges it (rp_refunded). Changes only through the redpacket functions.';
COMMENT ON COLUMN redpacket.refund.activity_id IS 'The activity.';
COMMENT ON COLUMN redpacket.refund.entry_id IS 'The ledger entry owed back (redpacket.ledger.entry_id).';
COMMENT ON COLUMN redpacket.refund.refunded_at IS 'When the wallet acknowledged paying it back (its transaction''s start); NULL while pending.';
COMMENT ON COLUMN redpacket.refund.refunded_by IS 'Session user who acknowledged it; NULL while pending.';
COMMENT ON COLUMN redpacket.refund.reference IS 'The wallet''s reference given to rp_refunded, if any.';
COMMENT ON INDEX redpacket.refund_pending IS
    'The refunds not yet acknowledged: what rp_pending_refunds reads.';
COMMENT ON INDEX redpacket.refund_reference IS
    'Acknowledged refunds by the wallet''s reference.';
CREATE TRIGGER guard BEFORE UPDATE OR DELETE OR TRUNCATE ON redpacket.refund
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.rp_guard();
REVOKE ALL ON redpacket.refund FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('redpacket.refund', '');
-- What the funders were owed before this version was settled by hand: the
-- entries written before the update are recorded as paid back then.
INSERT INTO redpacket.refund (activity_id, entry_id, refunded_at, refunded_by, reference)
SELECT l.activity_id, l.entry_id, pg_catalog.now(), pg_catalog.session_user(), 'before refund tracking'
  FROM redpacket.ledger l
 WHERE l.kind OPERATOR(pg_catalog.=) ANY ('{withdraw,return,refund}')
   AND l.amount OPERATOR(pg_catalog.>) 0;

CREATE FUNCTION redpacket.rp_pending_refunds(activity bigint DEFAULT NULL)
RETURNS TABLE (activity_id bigint, entry_id bigint, funder text, kind text, amount numeric,
               recorded_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- PL/pgSQL, not SQL: Citus cannot plan the parameters of a SQL function
    RETURN QUERY
    SELECT r.activity_id, r.entry_id, l.funder, l.kind, l.amount, l.created_at
      FROM redpacket.refund r
      JOIN redpacket.ledger l ON l.activity_id OPERATOR(pg_catalog.=) r.activity_id
                             AND l.entry_id OPERATOR(pg_catalog.=) r.entry_id
     WHERE r.refunded_at IS NULL
       AND (rp_pending_refunds.activity IS NULL
            OR r.activity_id OPERATOR(pg_catalog.=) rp_pending_refunds.activity)
     ORDER BY l.created_at, r.entry_id;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_pending_refunds(bigint) IS
    'What is owed back to funders and not yet acknowledged (rp_refunded), of one activity or (NULL) of all, oldest first: the ledger entry, its funder, kind (withdraw, return or refund), amount and when it was recorded. Granted by rp_grant_wallet and rp_grant_operator.';
REVOKE ALL ON FUNCTION redpacket.rp_pending_refunds(bigint) FROM PUBLIC;

CREATE FUNCTION redpacket.rp_refunded(activity bigint, entry_ids bigint[], reference text DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_refunded'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_refunded(bigint, bigint[], text) IS
    'The wallet acknowledges ledger entries of one activity it paid back to the funder: records each as refunded (with reference), skips those acknowledged before, returns how many it newly acknowledged. All or nothing: an entry that owes the funder nothing is an error naming it (P0002). Granted by rp_grant_wallet.';
REVOKE ALL ON FUNCTION redpacket.rp_refunded(bigint, bigint[], text) FROM PUBLIC;

CREATE FUNCTION redpacket.rp_refunds(reference text)
RETURNS TABLE (activity_id bigint, entry_id bigint, funder text, amount numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF reference IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'reference must not be NULL';
    END IF;
    RETURN QUERY
    SELECT r.activity_id, r.entry_id, l.funder, l.amount
      FROM redpacket.refund r
      JOIN redpacket.ledger l ON l.activity_id OPERATOR(pg_catalog.=) r.activity_id
                             AND l.entry_id OPERATOR(pg_catalog.=) r.entry_id
     WHERE r.reference OPERATOR(pg_catalog.=) rp_refunds.reference
     ORDER BY r.activity_id, r.entry_id;
END;
$$;
COMMENT ON FUNCTION redpacket.rp_refunds(text) IS
    'The ledger entries rp_refunded acknowledged under this reference (activity_id, entry_id, funder, amount): what a wallet that noted the reference before acknowledging pays back after a crash. No row for an unknown reference; 22004 for NULL. Granted by rp_grant_wallet and rp_grant_operator.';
REVOKE ALL ON FUNCTION redpacket.rp_refunds(text) FROM PUBLIC;

-- [track] Claims from before settlement tracking ------------------------------
-- Settlement tracking came with 1.4: after an update from 1.3 or earlier the
-- claims already made were paid by whatever paid them then, and must not
-- turn into pending credits.  When this update runs in the same transaction
-- as the one to 1.4 (the reconciler row was made now), each activity's claims
-- so far are recorded here; rp_pending_credits, the uncredited alert and
-- the checks leave them out until rp_track_claims brings them in.
CREATE TABLE redpacket.settlement_start (
    activity_id       bigint PRIMARY KEY,
    untracked_through bigint NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE redpacket.settlement_start IS
    'Per activity, the claims made before settlement tracking existed (an update from 1.3 or earlier): those with claim_id up to untracked_through are not pending credits. Written by the update; removed by rp_track_claims. Changes only through the redpacket functions.';
COMMENT ON COLUMN redpacket.settlement_start.activity_id IS 'The activity.';
COMMENT ON COLUMN redpacket.settlement_start.untracked_through IS 'The activity''s last claim when tracking began; claims up to it are left out of the pending credits.';
COMMENT ON COLUMN redpacket.settlement_start.recorded_at IS 'When tracking began (the update); every claim up to untracked_through is older.';
CREATE TRIGGER guard BEFORE UPDATE OR DELETE OR TRUNCATE ON redpacket.settlement_start
    FOR EACH STATEMENT EXECUTE FUNCTION redpacket.rp_guard();
REVOKE ALL ON redpacket.settlement_start FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('redpacket.settlement_start', '');
INSERT INTO redpacket.settlement_start (activity_id, untracked_through)
SELECT c.activity_id, pg_catalog.max(c.claim_id)
  FROM redpacket.claim c
 WHERE (SELECT r.installed_at FROM redpacket.reconciler r) OPERATOR(pg_catalog.=) pg_catalog.now()
 GROUP BY c.activity_id;

CREATE FUNCTION redpacket.rp_track_claims(activity bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'rp_track_claims'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_track_claims(bigint) IS
    'Brings the claims made before settlement tracking (settlement_start) of one activity or (NULL) of all into it: from now on those not credited or reversed are pending credits. Returns how many claims it brought in. For an operator whose old wallet did not pay them.';
REVOKE ALL ON FUNCTION redpacket.rp_track_claims(bigint) FROM PUBLIC;

INSERT INTO redpacket.role_grant (role_kind, privilege) VALUES
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_pending_refunds(bigint)'),
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_refunded(bigint, bigint[], text)'),
    ('wallet', 'EXECUTE ON FUNCTION redpacket.rp_refunds(text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_pending_refunds(bigint)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_refunds(text)'),
    ('operator', 'EXECUTE ON FUNCTION redpacket.rp_track_claims(bigint)'),
    ('operator', 'SELECT ON redpacket.refund'),
    ('operator', 'SELECT ON redpacket.settlement_start');

-- [citus] rp_distribute() also distributes the refunds and the settlement
-- start, colocated with the activities.  A cluster distributed under 1.5
-- calls it again after the update (it skips what is distributed already).
CREATE OR REPLACE FUNCTION redpacket.rp_distribute(shard_count integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t      record;
    f      text;
    r      record;
    mine   text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension e
                    WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'citus is not installed in this database',
            DETAIL = 'rp_distribute() distributes redpacket''s tables with Citus.',
            HINT = 'Preload citus before redpacket on every node, CREATE EXTENSION citus, add the workers, then call rp_distribute() on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'rp_distribute() must run on the Citus coordinator',
            HINT = 'Connect to the coordinator, or call citus_set_coordinator_host() there first.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node n
                    WHERE n.groupid OPERATOR(pg_catalog.<>) 0 AND n.isactive) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'the Citus cluster has no worker node',
            HINT = 'Add the workers with citus_add_node() first.';
    END IF;
    -- Every worker must have the same redpacket (its functions run there).
    SELECT e.extversion INTO mine FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'redpacket';
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 $q$SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'redpacket'$q$) LOOP
        IF NOT r.success OR r.result IS DISTINCT FROM mine THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('worker %s:%s does not have redpacket %s', r.nodename, r.nodeport, mine),
                DETAIL = pg_catalog.format('It answered: %s.', COALESCE(NULLIF(r.result, ''), 'not installed')),
                HINT = 'Install the same redpacket on every node (shared_preload_libraries = ''citus,redpacket'', CREATE EXTENSION redpacket), then retry.';
        END IF;
    END LOOP;

    -- No reconciliation pass (worker or rp_reconcile) may run while the tables
    -- move: it would read half-moved data.  These locks make every pass on
    -- this node wait until this transaction commits (create_distributed_table
    -- takes them too, but one at a time; here all of them come first, in one
    -- order).  The workers' passes: see the end.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_change,
               redpacket.eligible, redpacket.reconcile_problem, redpacket.claim_settlement,
               redpacket.settlement_state, redpacket.settlement_gap, redpacket.refund,
               redpacket.settlement_start
          IN ACCESS EXCLUSIVE MODE;

    PERFORM pg_catalog.set_config('citus.shard_replication_factor', '1', true);
    -- The append-only triggers must hold on every shard.
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    IF shard_count IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.shard_count', shard_count::text, true);
    END IF;

    -- Every table is keyed by activity first; all colocated with activity, so
    -- one activity's rows sit on one node.  No reference table: nothing is
    -- shared between activities.
    FOR t IN SELECT * FROM (VALUES (1, 'redpacket.activity', 'id'),
                                   (2, 'redpacket.stripe', 'activity_id'),
                                   (3, 'redpacket.claim', 'activity_id'),
                                   (4, 'redpacket.ledger', 'activity_id'),
                                   (5, 'redpacket.reconcile_state', 'activity_id'),
                                   (6, 'redpacket.reconciliation', 'activity_id'),
                                   (7, 'redpacket.activity_change', 'activity_id'),
                                   (8, 'redpacket.eligible', 'activity_id'),
                                   (9, 'redpacket.reconcile_problem', 'activity_id'),
                                   (10, 'redpacket.claim_settlement', 'activity_id'),
                                   (11, 'redpacket.settlement_state', 'activity_id'),
                                   (12, 'redpacket.settlement_gap', 'activity_id'),
                                   (13, 'redpacket.refund', 'activity_id'),
                                   (14, 'redpacket.settlement_start', 'activity_id')) v(n, rel, col)
             ORDER BY n LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
                               WHERE p.logicalrelid OPERATOR(pg_catalog.=) t.rel::pg_catalog.regclass);
        -- On a shard the guard of the rows only the extension changes cannot
        -- tell the coordinator's statements from a stranger's: a distributed
        -- table does not keep it (the checks still report what they cover).
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS guard ON %s', t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.create_distributed_table(t.rel::pg_catalog.regclass, t.col,
            colocate_with => CASE WHEN t.n OPERATOR(pg_catalog.=) 1 THEN 'none' ELSE 'redpacket.activity' END);
        -- The rows now live in the shards; drop the invisible local copy
        -- (the append-only guard must not fire for that: replica role).
        PERFORM pg_catalog.set_config('session_replication_role', 'replica', true);
        PERFORM pg_catalog.truncate_local_data_after_distributing_table(t.rel::pg_catalog.regclass);
        PERFORM pg_catalog.set_config('session_replication_role', 'origin', true);
    END LOOP;

    -- Every function that takes our locks runs on the node holding the
    -- activity, also inside an explicit transaction (force_delegation).
    FOREACH f IN ARRAY ARRAY['redpacket.rp_claim(bigint, text, numeric, text)',
                             'redpacket.rp_claim_batch(bigint, text[], numeric[], text[])',
                             'redpacket.rp_close_activity(bigint)',
                             'redpacket.rp_freeze(bigint, text)',
                             'redpacket.rp_unfreeze(bigint)',
                             'redpacket.rp_repair_stripes(bigint, text)',
                             'redpacket.rp_reverse(bigint, bigint, text)',
                             'redpacket.rp_credited(bigint, bigint[], text)',
                             'redpacket.rp_refunded(bigint, bigint[], text)',
                             'redpacket.rp_allow(bigint, text[])',
                             'redpacket.rp_disallow(bigint, text[])',
                             'redpacket.rp_top_up(bigint, numeric, integer, text)',
                             'redpacket.rp_withdraw(bigint, numeric, text)',
                             'redpacket.rp_set_window(bigint, timestamptz, timestamptz, text)'] LOOP
        PERFORM pg_catalog.create_distributed_function(f::pg_catalog.regprocedure, distribution_arg_name => 'activity',
            colocate_with => 'redpacket.activity', force_delegation => true);
    END LOOP;
    -- rp_reconcile(NULL) lists every activity: forced delegation would refuse
    -- that query, so it is delegated only when called on its own.
    PERFORM pg_catalog.create_distributed_function('redpacket.rp_reconcile(bigint, boolean)'::pg_catalog.regprocedure,
        distribution_arg_name => 'activity', colocate_with => 'redpacket.activity');

    -- Disjoint id ranges per node.
    PERFORM redpacket.rp_node_sequences();
    FOR r IN SELECT * FROM pg_catalog.run_command_on_workers(
                 'SELECT redpacket.rp_node_sequences()') LOOP
        IF NOT r.success THEN
            RAISE EXCEPTION USING
                ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = pg_catalog.format('could not set the sequences of worker %s:%s', r.nodename, r.nodeport),
                DETAIL = r.result;
        END IF;
    END LOOP;

    -- The lock above holds this node's passes only.  A worker's own pass
    -- reads its copy of the tables, which Citus turns into distributed
    -- tables when this transaction commits there: a pass planning its query
    -- at that moment sees them change under it and fails.  The tables are
    -- distributed now, so the same LOCK goes to every worker, inside this
    -- transaction: their passes wait until the commit, or it waits for them.
    LOCK TABLE redpacket.activity, redpacket.stripe, redpacket.claim, redpacket.ledger,
               redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_change,
               redpacket.eligible, redpacket.reconcile_problem, redpacket.claim_settlement,
               redpacket.settlement_state, redpacket.settlement_gap, redpacket.refund,
               redpacket.settlement_start
          IN ACCESS EXCLUSIVE MODE;
END;
$$;

-- ============================================================================
-- 1.7: the changes of redpacket--1.6--1.7.sql.
-- ============================================================================

-- [track] When the untracked claims were read ----------------------------------
-- The update that records the claims of before settlement tracking dated
-- them by its transaction's start: a claim that committed after the
-- transaction began, but before the update held the activities, is untracked
-- yet later than that date, and the full check took it for a copy.  The date
-- is now the clock once the update holds the activities (the first update
-- script locks redpacket.activity, so no claim of the old catalog commits
-- after that).  And when the extension was created in the transaction that
-- updates it, no old wallet ever paid its claims: the rows recorded for it
-- are removed and its claims are pending like any other.  Both look only at
-- the rows this transaction wrote (in any of its subtransactions), so a
-- database updated to 1.6 before keeps what its update recorded.
COMMENT ON COLUMN redpacket.settlement_start.recorded_at IS
    'When the update read the claims up to untracked_through, holding the activities: every one of them is older.';
CREATE FUNCTION redpacket.rp_written_now(pg_catalog.xid) RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'rp_written_now'
LANGUAGE C STRICT;
DO $$
DECLARE
    distributed pg_catalog.bool := false;
BEGIN
    -- a distributed table was distributed after the update that filled it
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
             || ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) ''redpacket.settlement_start''::pg_catalog.regclass)'
           INTO distributed;
    END IF;
    IF distributed THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_depend m
                WHERE m.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                  AND m.objid OPERATOR(pg_catalog.=) 'redpacket.claim'::pg_catalog.regclass
                  AND m.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND m.deptype OPERATOR(pg_catalog.=) 'e'
                  AND redpacket.rp_written_now(m.xmin)) THEN
        DELETE FROM redpacket.settlement_start u WHERE redpacket.rp_written_now(u.xmin);
    ELSE
        UPDATE redpacket.settlement_start u SET recorded_at = pg_catalog.clock_timestamp()
         WHERE redpacket.rp_written_now(u.xmin);
    END IF;
END;
$$;
DROP FUNCTION redpacket.rp_written_now(pg_catalog.xid);
