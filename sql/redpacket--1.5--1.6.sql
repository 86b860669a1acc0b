-- redpacket 1.5 -> 1.6.  Every change here is also in redpacket--1.6.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from any earlier
-- version equals a fresh 1.6.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.6'" to load this file. \quit

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
