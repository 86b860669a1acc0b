-- The stripe locks a transaction keeps for the activities its passes settle
-- or freeze stay within a constant (1,024), also when a query reconciles
-- activities one by one: the call that would go past it is refused (54000)
-- instead of filling the server's lock table.  Ten expired activities of 128
-- stripes need 1,280 kept locks: the ninth call is refused, and a call in a
-- transaction of its own goes through.
\set VERBOSITY terse
CREATE TEMP TABLE budget_act AS
SELECT g AS n, redpacket.rp_create_activity(12.80, stripes => 128,
           starts_at => now() - interval '2 hours', ends_at => now() - interval '1 hour') AS id
FROM generate_series(1, 10) g;
SELECT count(*) AS expired FROM budget_act a JOIN redpacket.activity x ON x.id = a.id
 WHERE x.ends_at < now() AND x.stripes = 128;

-- one by one in one transaction: refused past the budget
BEGIN;
SELECT r.activity_id IS NOT NULL AS settled
  FROM budget_act a, redpacket.rp_reconcile(a.id) r
 WHERE a.n <= 8 ORDER BY a.n LIMIT 1;
SELECT count(*) AS stripe_locks_kept
  FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
   AND objsubid = 20993;  -- 0x5201, redpacket's stripe locks
SELECT * FROM redpacket.rp_reconcile((SELECT id FROM budget_act WHERE n = 9));
ROLLBACK;

-- each in a transaction of its own: every one settles
SELECT count(*) FILTER (WHERE r.ok) AS settled_ok
  FROM budget_act a, LATERAL (SELECT * FROM redpacket.rp_reconcile(a.id)) r
 WHERE a.n = 9;
SELECT count(*) FILTER (WHERE r.ok) AS settled_ok
  FROM budget_act a, LATERAL (SELECT * FROM redpacket.rp_reconcile(a.id)) r
 WHERE a.n = 10;
-- the pass over all activities (rolled back above) settles what is left
SELECT count(*) AS checked FROM redpacket.rp_reconcile();
SELECT count(*) AS checked FROM redpacket.rp_reconcile();
SELECT count(*) AS closed FROM budget_act a JOIN redpacket.activity x ON x.id = a.id
 WHERE x.closed_at IS NOT NULL;
