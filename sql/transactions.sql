-- rp_claim inside the caller's transaction: a rollback (whole or to a
-- savepoint) leaves nothing of a claim; many claims in one transaction all
-- land; no subtransaction per claim; locks are transaction-scoped and kept
-- out of the lock space of applications' pg_advisory_lock keys.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- Advisory locks this backend holds: all of them, and those an application
-- could also take with pg_advisory_lock(bigint) (objsubid 1) or
-- pg_advisory_lock(int, int) (objsubid 2).
CREATE FUNCTION pg_temp.my_locks(OUT advisory bigint, OUT in_app_space bigint)
LANGUAGE sql AS $$
SELECT count(*) FILTER (WHERE locktype IN ('advisory', 'userlock')),
       count(*) FILTER (WHERE locktype = 'advisory' AND objsubid IN (1, 2))
FROM pg_locks WHERE pid = pg_backend_pid()
$$;

SELECT redpacket.rp_create_activity(10.00, stripes => 4) AS a \gset

-- ROLLBACK leaves nothing ----------------------------------------------------
BEGIN;
SELECT pg_temp.claim(:a, 'alice', 1.00);
SELECT pg_temp.claim(:a, 'alice', 1.00);
SELECT * FROM pg_temp.books(:a);
ROLLBACK;
SELECT * FROM pg_temp.books(:a);
SELECT count(*) AS alice_rows FROM redpacket.claim WHERE activity_id = :a AND user_id = 'alice';
-- the rolled-back claim does not count as held: alice claims anew
SELECT pg_temp.claim(:a, 'alice', 1.00);
SELECT * FROM pg_temp.books(:a);

-- an error later in the caller's transaction undoes the claim too
BEGIN;
SELECT pg_temp.claim(:a, 'bob', 2.00);
SELECT 1 / 0;
ROLLBACK;
SELECT * FROM pg_temp.books(:a);

-- ROLLBACK TO SAVEPOINT -------------------------------------------------------
BEGIN;
SELECT pg_temp.claim(:a, 'bob', 2.00);
SAVEPOINT s1;
SELECT pg_temp.claim(:a, 'carol', 3.00);
ROLLBACK TO SAVEPOINT s1;
SELECT pg_temp.claim(:a, 'carol', 0.50);
SELECT pg_temp.claim(:a, 'dave', 0.25);
COMMIT;
SELECT user_id, amount FROM redpacket.claim WHERE activity_id = :a ORDER BY claim_id;
SELECT * FROM pg_temp.books(:a);

-- the last cent, rolled back, is claimable again -------------------------------
SELECT redpacket.rp_create_activity(0.01, stripes => 1) AS c \gset
BEGIN;
SELECT pg_temp.claim(:c, 'alice', 0.01);
SELECT pg_temp.claim(:c, 'bob', 0.01);
ROLLBACK;
SELECT pg_temp.claim(:c, 'bob', 0.01);
SELECT pg_temp.claim(:c, 'alice', 0.01);
SELECT * FROM pg_temp.books(:c);

-- 300 claims in one caller transaction ----------------------------------------
SELECT redpacket.rp_create_activity(100.00, packets => 400, stripes => 16) AS m \gset
BEGIN;
SELECT r.status, count(*), sum(r.amount) AS amount
FROM generate_series(1, 300) g CROSS JOIN LATERAL redpacket.rp_claim(:m, 'user-' || g, 0.13) r
GROUP BY r.status ORDER BY r.status;
-- the same users again in the same transaction: all duplicates of their own claim
SELECT r.status, count(*), bool_and(r.claim_id = c.claim_id AND r.amount = c.amount) AS originals
FROM generate_series(1, 300) g
CROSS JOIN LATERAL redpacket.rp_claim(:m, 'user-' || g, 0.13) r
JOIN redpacket.claim c ON c.activity_id = :m AND c.user_id = 'user-' || g
GROUP BY r.status ORDER BY r.status;
-- no subtransaction per claim: every claim row carries the top-level xid
SELECT count(DISTINCT xmin::text) AS xids,
       min(xmin::text) = (txid_current() % 4294967296)::text AS top_level_xid
FROM redpacket.claim WHERE activity_id = :m;
SELECT advisory > 0 AS holds_advisory_locks, in_app_space AS locks_in_app_key_space
FROM pg_temp.my_locks();
COMMIT;
SELECT * FROM pg_temp.books(:m);
SELECT count(DISTINCT user_id) AS users, min(amount) = 0.13 AND max(amount) = 0.13 AS all_0_13
FROM redpacket.claim WHERE activity_id = :m;

-- 300 claims in one transaction rolled back leave nothing
BEGIN;
SELECT r.status, count(*)
FROM generate_series(301, 600) g CROSS JOIN LATERAL redpacket.rp_claim(:m, 'user-' || g, 0.01) r
GROUP BY r.status ORDER BY r.status;
ROLLBACK;
SELECT * FROM pg_temp.books(:m);

-- locks are gone when the transaction ends --------------------------------------
SELECT * FROM pg_temp.my_locks();
SELECT pg_temp.claim(:a, 'erin', 0.01);
SELECT * FROM pg_temp.my_locks();
BEGIN;
SELECT pg_temp.claim(:a, 'frank', 0.01);
SELECT advisory > 0 AS holds_advisory_locks, in_app_space AS locks_in_app_key_space FROM pg_temp.my_locks();
SELECT redpacket.rp_close_activity(:a) > 0 AS returned_something;
SELECT in_app_space AS locks_in_app_key_space FROM pg_temp.my_locks();
COMMIT;
SELECT * FROM pg_temp.my_locks();
SELECT * FROM pg_temp.books(:a);

-- an application's own advisory locks, held in the same transaction, neither
-- block nor are released by claims
SELECT redpacket.rp_create_activity(10.00, stripes => 4) AS g \gset
BEGIN;
SELECT pg_advisory_xact_lock(:g);
SELECT pg_advisory_xact_lock(0);
SELECT pg_advisory_xact_lock(:g::integer, 0);
SELECT pg_temp.claim(:g, 'alice', 1.00);
SELECT count(*) AS app_locks FROM pg_locks
WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid IN (1, 2);
COMMIT;
SELECT pg_advisory_lock(:g);
SELECT pg_temp.claim(:g, 'bob', 1.00);
SELECT pg_advisory_unlock(:g);
SELECT pg_advisory_unlock_all();
SELECT * FROM pg_temp.my_locks();
SELECT * FROM pg_temp.books(:g);
