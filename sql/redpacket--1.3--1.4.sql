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
