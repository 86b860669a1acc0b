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
