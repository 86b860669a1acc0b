-- redpacket 1.3 -> 1.4.  Every change here is also in redpacket--1.4.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0, 1.1, 1.2 or
-- 1.3 equals a fresh 1.4.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.4'" to load this file. \quit

-- The two statuses of 1.4, in the order rp_claim checks them.  (ALTER TYPE
-- ... ADD VALUE may run in the update's transaction as long as nothing here
-- uses the new values.)
ALTER TYPE redpacket.claim_status ADD VALUE 'not_eligible' BEFORE 'user_limit';
ALTER TYPE redpacket.claim_status ADD VALUE 'busy' BEFORE 'exhausted';
COMMENT ON TYPE redpacket.claim_status IS
    'Outcome of a claim, in the order rp_claim checks them: duplicate, frozen, not_started, ended, not_eligible, user_limit, busy, exhausted, claimed.';

-- rp_claim pins its search path in its definition again (SET search_path),
-- like every other SECURITY DEFINER function: a pin made in C only where the
-- C code foresaw that user-written code could run missed a case.  Both claim
-- functions are bound to symbols new in 1.4: a backend still running a
-- library older than 1.4 knows neither eligibility lists nor the other 1.4
-- rules, and refuses the call instead of running it.  CREATE OR REPLACE keeps
-- the OIDs, owners, privileges and comments.
CREATE OR REPLACE FUNCTION redpacket.rp_claim(
    activity   bigint,
    user_id    text,
    amount     numeric DEFAULT NULL,
    request_id text DEFAULT NULL)
RETURNS redpacket.claim_result
AS 'MODULE_PATHNAME', 'rp_claim_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION redpacket.rp_claim_batch(
    activity    bigint,
    user_ids    text[],
    amounts     numeric[] DEFAULT NULL,
    request_ids text[] DEFAULT NULL)
RETURNS TABLE (ord integer, user_id text, status redpacket.claim_status,
               claim_id bigint, amount numeric, claimed_at timestamptz)
AS 'MODULE_PATHNAME', 'rp_claim_batch_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100;

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
    role_kind text NOT NULL CHECK (role_kind IN ('app', 'operator', 'wallet')),
    privilege text NOT NULL,
    PRIMARY KEY (role_kind, privilege)
);
COMMENT ON TABLE redpacket.role_grant IS
    'What the rp_grant_* helpers grant: for each kind of role, the GRANT clauses (privilege ON object) it receives besides USAGE on the schema. Part of the extension''s definition; not dumped.';
COMMENT ON COLUMN redpacket.role_grant.role_kind IS 'app (rp_grant_app), operator (rp_grant_operator) or wallet (rp_grant_wallet).';
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
    'Grants a role USAGE on the schema and every privilege redpacket.role_grant lists for its kind (app, operator, wallet). Used by rp_grant_app and rp_grant_operator; for the extension owner.';
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
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.claim_id, c.user_id, c.amount, c.claimed_at,
           (a.closed_at IS NOT NULL
            OR a.ends_at OPERATOR(pg_catalog.<=) pg_catalog.now()
            OR NOT EXISTS (SELECT 1 FROM redpacket.stripe s
                            WHERE s.activity_id OPERATOR(pg_catalog.=) a.id
                              AND s.balance OPERATOR(pg_catalog.>) 0
                              AND (s.packets IS NULL OR s.packets OPERATOR(pg_catalog.>) 0)))
      FROM redpacket.claim c
      JOIN redpacket.activity a ON a.id OPERATOR(pg_catalog.=) c.activity_id
     WHERE c.activity_id OPERATOR(pg_catalog.=) $1
     ORDER BY c.amount DESC, c.claim_id
     LIMIT 1
$$;
COMMENT ON FUNCTION redpacket.rp_best_luck(bigint) IS
    'Best luck (手气最佳): the activity''s largest claim (the earliest of them on a tie), and final: true once the activity has ended or closed or has no money or packet left (a later top-up can make it false again). No row before the first claim. Reads every claim of the activity.';
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

-- The roles that could call the 1.3 functions can call the new ones.  (An
-- update script's GRANTs count as the extension's initial privileges, so
-- pg_dump leaves these out: README "Upgrading".)
DO $$
DECLARE
    f record;
    g record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer)',
         'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean)'),
        ('redpacket.rp_activity_info(bigint)', 'redpacket.rp_activity_info(bigint, text)')) v(old, new)
    LOOP
        FOR g IN SELECT a.grantee, a.is_grantable
                   FROM pg_catalog.pg_proc p
                  CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                  WHERE p.oid OPERATOR(pg_catalog.=) f.old::pg_catalog.regprocedure
                    AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
                    AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', f.new,
                CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                     ELSE g.grantee::pg_catalog.regrole::pg_catalog.text END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f.old);
    END LOOP;
END
$$;

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

-- [recon] The reconciler ------------------------------------------------------

-- [ops] Operating -------------------------------------------------------------

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
                               'reconciliation_pass_id_seq', 'activity_change_id_seq'] LOOP
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
               redpacket.eligible
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
                                   (8, 'redpacket.eligible', 'activity_id')) v(n, rel, col)
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
               redpacket.reconcile_state, redpacket.reconciliation, redpacket.activity_change,
               redpacket.eligible
          IN ACCESS EXCLUSIVE MODE;
END;
$$;
