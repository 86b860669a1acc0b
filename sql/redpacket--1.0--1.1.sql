-- redpacket 1.0 -> 1.1.  Every change here is also in redpacket--1.1.sql, and
-- test/t/010_upgrade.pl proves that an upgraded database equals a fresh 1.1.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.1'" to load this file. \quit

-- [rec] Reconciler 1.1 (see the same block in redpacket--1.1.sql). ------------
ALTER TABLE redpacket.reconciliation
    ALTER COLUMN expected DROP NOT NULL,
    ALTER COLUMN actual DROP NOT NULL,
    ALTER COLUMN drift DROP NOT NULL,
    ALTER COLUMN expected_claims DROP NOT NULL,
    ALTER COLUMN actual_claims DROP NOT NULL,
    ALTER COLUMN negative_stripes DROP NOT NULL,
    ALTER COLUMN new_claims DROP NOT NULL,
    ADD COLUMN problems text[],
    ADD COLUMN error text;
ALTER TABLE redpacket.reconcile_state ADD COLUMN last_full_check_at timestamptz;

-- 1.1 settlement zeroes the packet counts of a closed activity's stripes too
-- (a closed activity must be empty); do the same for activities 1.0 settled,
-- where the return was recorded and every balance is already 0.
UPDATE redpacket.stripe s SET packets = 0
  FROM redpacket.activity a
 WHERE a.id OPERATOR(pg_catalog.=) s.activity_id
   AND a.closed_at IS NOT NULL
   AND s.packets OPERATOR(pg_catalog.<>) 0
   AND EXISTS (SELECT FROM redpacket.ledger l
                WHERE l.activity_id OPERATOR(pg_catalog.=) a.id
                  AND l.kind OPERATOR(pg_catalog.=) 'return')
   AND NOT EXISTS (SELECT FROM redpacket.stripe z
                    WHERE z.activity_id OPERATOR(pg_catalog.=) a.id
                      AND z.balance OPERATOR(pg_catalog.<>) 0);

-- [rec] Reconciler 1.1: failed checks by name, error rows, full-check times,
-- the reconciler's own status. ----------------------------------------------

COMMENT ON COLUMN redpacket.reconciliation.expected IS
    'funded - returned - sum of claims, in currency units; NULL when the check could not run (error).';
COMMENT ON COLUMN redpacket.reconciliation.actual IS
    'Sum of the stripe balances, in currency units; NULL when the check could not run (error).';
COMMENT ON COLUMN redpacket.reconciliation.drift IS 'actual - expected.';
COMMENT ON COLUMN redpacket.reconciliation.expected_packets IS
    'Packets that should remain: packets - claims while open, 0 once closed; NULL without a packet cap.';
COMMENT ON COLUMN redpacket.reconciliation.actual_packets IS 'Sum of the stripe packet counts.';
COMMENT ON COLUMN redpacket.reconciliation.expected_claims IS 'Claims in the claim table.';
COMMENT ON COLUMN redpacket.reconciliation.actual_claims IS 'Sum of the stripe claim counters.';
COMMENT ON COLUMN redpacket.reconciliation.negative_stripes IS 'Stripes with a negative balance or packet count.';
COMMENT ON COLUMN redpacket.reconciliation.new_claims IS 'Claims this check read past the watermark (all of them for a full check).';
COMMENT ON COLUMN redpacket.reconciliation.ok IS 'True when every check passed.';
COMMENT ON COLUMN redpacket.reconciliation.full_check IS 'True when every claim was re-summed, not only those past the watermark.';
COMMENT ON COLUMN redpacket.reconciliation.checked_at IS 'When the check ran.';
COMMENT ON COLUMN redpacket.reconciliation.pass_id IS 'Id of this check, from reconciliation_pass_id_seq.';
COMMENT ON COLUMN redpacket.reconciliation.activity_id IS 'The activity checked.';
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
