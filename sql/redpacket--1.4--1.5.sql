-- redpacket 1.4 -> 1.5.  Every change here is also in redpacket--1.5.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from any earlier
-- version equals a fresh 1.5.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.5'" to load this file. \quit

-- A failed check names the copies it compares too.
COMMENT ON COLUMN redpacket.reconciliation.problems IS
    'Names of the failed checks: money, packets, claims, negative, not_empty (closed but stripes not empty or return wrong), dealt (what was dealt to a stripe does not add up), copies (a stripe''s halted or revision, the activity''s total, cap, creation time or creator, a settlement''s amount, the settlement frontier, the reconciliation state or the length of an eligibility list disagrees with what it copies), incomplete, error; empty when ok; NULL on rows written by 1.0.';

-- Each pass also probes the next activity ids, in turn, for an activity
-- that lost its reconcile_state row.
ALTER TABLE redpacket.reconciler ADD COLUMN probed_through bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.reconciler.probed_through IS
    'The last activity id the latest pass over all probed for a lost reconcile_state row; the next pass probes the ids after it (0: from the start).';

-- The counters split the errors a caller retries (contention) from the
-- others.  The OUT columns of rp_activity_stats change, so it and its view
-- are made again (rp_regrant() gives them back to the operator roles after
-- the update).
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

-- The reconciler's status reads whether the launcher runs from shared
-- memory, the same for every role that reads the view.
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

-- The strict pass also fails while an activity is still wrong from an
-- earlier check (its latest check failed, a check froze it, or it has an
-- open problem), so a scheduler's job stays red until the books are
-- repaired.  The same arguments: CREATE OR REPLACE keeps the grants (a
-- REVOKE here would record them as the extension's initial privileges,
-- which pg_dump leaves out).
CREATE OR REPLACE PROCEDURE redpacket.rp_reconcile_strict(full_check boolean DEFAULT false,
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

-- rp_distribute drops the guard of the tables it distributes (below).
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

-- Best luck skips reversed claims, its final is never NULL, and a NULL or
-- unknown activity is an error (CREATE OR REPLACE keeps the grants).
CREATE OR REPLACE FUNCTION redpacket.rp_best_luck(activity bigint)
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

-- rp_user_claims lists only the claims the user holds (not reversed).
COMMENT ON FUNCTION redpacket.rp_user_claims(bigint, text) IS
    'Read-only, for applications: the claims a user holds in an activity (claim_id, amount, claimed_at, request_id), oldest first, found with one index probe; a reversed claim is not held and not listed; no row when none; errors for bad ids as rp_claim. Granted by rp_grant_app.';

-- rp_regrant takes a role for an application or an operator role only when
-- it holds what the helper of that kind granted, not one function of it.
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

-- The sender kind of role.
ALTER TABLE redpacket.role_grant DROP CONSTRAINT role_grant_role_kind_check,
    ADD CONSTRAINT role_grant_role_kind_check CHECK (role_kind IN ('app', 'operator', 'wallet', 'sender'));
COMMENT ON COLUMN redpacket.role_grant.role_kind IS 'app (rp_grant_app), operator (rp_grant_operator), wallet (rp_grant_wallet) or sender (rp_grant_sender).';
COMMENT ON FUNCTION redpacket.rp_grant_role(regrole, text) IS
    'Grants a role USAGE on the schema and every privilege redpacket.role_grant lists for its kind (app, operator, wallet, sender). Used by the rp_grant_* helpers; for the extension owner.';
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
