-- A batch takes a bounded number of locks whatever its size (its users'
-- locks are bucketed), so a batch of thousands of users does not exhaust
-- the shared lock table (53200); a batch over the documented maximum is
-- refused up front (54000) with nothing written.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(1000.00, stripes => 4) AS aid \gset

-- 9,500 distinct users in one call
SELECT r.status, count(*), sum(r.amount)
  FROM redpacket.rp_claim_batch(:aid,
         ARRAY(SELECT 'u' || g FROM generate_series(1, 9500) g),
         array_fill(0.01::numeric, ARRAY[9500])) r
 GROUP BY r.status;

-- the locks it holds until commit: a handful, not one per user
BEGIN;
SELECT count(*) FROM redpacket.rp_claim_batch(:aid,
         ARRAY(SELECT 'v' || g FROM generate_series(1, 5000) g),
         array_fill(0.01::numeric, ARRAY[5000]));
SELECT count(*) <= 64 + 4 + 1 AS few_locks
  FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;

-- one over the limit: refused, nothing written
SELECT pg_temp.err(format(
    'SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY(SELECT ''w'' || g FROM generate_series(1, 10001) g),'
    ' array_fill(0.01::numeric, ARRAY[10001]))',
    :aid));
SELECT count(*) FROM redpacket.claim WHERE activity_id = :aid AND user_id LIKE 'w%';
SELECT * FROM redpacket.rp_claim_batch(:aid, array_fill('x'::text, ARRAY[10001]),
                                       array_fill(0.01::numeric, ARRAY[10001]));

SELECT * FROM pg_temp.books(:aid);
