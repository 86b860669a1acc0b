-- redpacket.activity_change: one row per change of an activity after its
-- creation, in the transaction that made it, whoever made it: freeze,
-- unfreeze and close by an operator, settle by the reconciler (an expired
-- activity), top_up, withdraw, set_window, allow and disallow (their own
-- tests show those).  A call that changes nothing records nothing; a change
-- rolled back leaves no row; the table is append-only.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(6.00, packets => 3, starts_at => '2020-01-01', stripes => 2,
                                    name => 'changes') AS a \gset
SELECT count(*) AS at_creation FROM redpacket.activity_change WHERE activity_id = :a;
SELECT pg_temp.claim(:a, 'u1', 1.00);
SELECT redpacket.rp_freeze(:a, 'first look');
SELECT redpacket.rp_freeze(:a, 'second look');
SELECT redpacket.rp_freeze(:a, 'second look');
SELECT redpacket.rp_unfreeze(:a);
SELECT redpacket.rp_unfreeze(:a);
-- rolled back: no row
BEGIN;
SELECT redpacket.rp_freeze(:a, 'never');
ROLLBACK;
SELECT redpacket.rp_close_activity(:a) AS returned;
SELECT redpacket.rp_close_activity(:a) AS returned_again;
SELECT kind, before, after - 'closed_at' AS after, (after ->> 'closed_at') IS NOT NULL AS closed,
       reason, changed_by = session_user AS by_me
  FROM redpacket.activity_change WHERE activity_id = :a ORDER BY change_id;
SELECT c.changed_at = a.closed_at AS close_at_closed_at
  FROM redpacket.activity_change c JOIN redpacket.activity a ON a.id = c.activity_id
 WHERE c.activity_id = :a AND c.kind = 'close';

-- the reconciler settles an expired activity: a settle, by whoever ran the pass
SELECT redpacket.rp_create_activity(2.00, starts_at => '2020-01-01', ends_at => '2020-02-01',
                                    stripes => 2, name => 'expired') AS e \gset
SELECT count(*) FILTER (WHERE ok) AS ok_passes FROM redpacket.rp_reconcile(:e);
SELECT kind, before, after - 'closed_at' AS after, reason, changed_by = session_user AS by_me
  FROM redpacket.activity_change WHERE activity_id = :e ORDER BY change_id;
SELECT count(*) FILTER (WHERE ok) AS ok_passes FROM redpacket.rp_reconcile(:e);
SELECT count(*) AS settles FROM redpacket.activity_change WHERE activity_id = :e;

-- append-only (security.sql: nobody but the owner may write it)
\set VERBOSITY terse
UPDATE redpacket.activity_change SET reason = 'edited' WHERE activity_id = :a;
DELETE FROM redpacket.activity_change WHERE activity_id = :a;
TRUNCATE redpacket.activity_change;
\set VERBOSITY default
SELECT count(*) AS rows_kept FROM redpacket.activity_change WHERE activity_id = :a;
