-- redpacket 1.1 -> 1.2.  Every change here is also in redpacket--1.2.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0 or from 1.1
-- equals a fresh 1.2.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.2'" to load this file. \quit

-- rp_distribute() also holds the workers' copies of the tables until it
-- commits, so a worker's reconciliation pass never sees them become
-- distributed while it plans its query.
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
