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
