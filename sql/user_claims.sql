-- rp_user_claims: what a user holds in an activity, read without claiming,
-- for the application role (rp_grant_app); one probe of the claim's unique
-- index; bad ids are errors with rp_claim's SQLSTATEs; nothing is written.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'one each') AS a \gset
SELECT redpacket.rp_create_activity(10.00, 20, stripes => 2, per_user_limit => 3, name => 'rain') AS r \gset
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset
SELECT status FROM redpacket.rp_claim(:a, 'alice', 1.50);
SELECT status FROM redpacket.rp_claim(:r, 'bob', 0.25, 'drop-2');
SELECT status FROM redpacket.rp_claim(:r, 'bob', 0.50, 'drop-1');
SELECT status FROM redpacket.rp_claim(:r, 'carol', 0.75, 'drop-1');

-- The user's claims, oldest first, as the claim rows have them.
SELECT u.claim_id = c.claim_id AS same_id, u.amount, u.claimed_at = c.claimed_at AS same_time,
       u.request_id
  FROM redpacket.rp_user_claims(:a, 'alice') u
  JOIN redpacket.claim c ON c.activity_id = :a AND c.user_id = 'alice';
SELECT amount, request_id FROM redpacket.rp_user_claims(:r, 'bob');
SELECT array_agg(claim_id ORDER BY claim_id) = array_agg(claim_id) AS oldest_first
  FROM redpacket.rp_user_claims(:r, 'bob');
-- byte-wise, as user ids are: no case folding, no prefix match
SELECT count(*) FROM redpacket.rp_user_claims(:r, 'Bob');
SELECT count(*) FROM redpacket.rp_user_claims(:r, 'bo');
-- none yet: no row, no error
SELECT count(*) FROM redpacket.rp_user_claims(:a, 'dave');
-- a reversed claim is not held: not listed
SELECT (redpacket.rp_claim(:a, 'erin', 0.10)).claim_id AS erin \gset
SELECT redpacket.rp_reverse(:a, :erin, 'sent by mistake') AS reversed;
SELECT count(*) FROM redpacket.rp_user_claims(:a, 'erin');

-- Bad ids, as rp_claim's.
SELECT pg_temp.err('SELECT * FROM redpacket.rp_user_claims(NULL, ''alice'')');
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_user_claims(%s, NULL)', :a));
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_user_claims(%s, '''')', :a));
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_user_claims(%s, repeat(''x'', 257))', :a));
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_user_claims(%s, ''alice'')', :unknown));

-- Read-only: it runs in a read-only transaction and writes nothing.
BEGIN READ ONLY;
SELECT count(*) FROM redpacket.rp_user_claims(:r, 'bob');
COMMIT;

-- One probe of the claim's unique index, whatever the statistics say: no
-- sequential scan of the claim table, one index scan.
SELECT pg_stat_force_next_flush();
SELECT seq_scan AS seq0, idx_scan AS idx0 FROM pg_stat_user_tables
 WHERE relid = 'redpacket.claim'::regclass \gset
SELECT idx_scan AS uniq0 FROM pg_stat_user_indexes
 WHERE indexrelid = 'redpacket.claim_activity_id_user_id_idempotency_key_key'::regclass \gset
SELECT count(*) FROM redpacket.rp_user_claims(:r, 'carol');
SELECT pg_stat_force_next_flush();
SELECT t.seq_scan - :seq0 AS seq_scans, t.idx_scan - :idx0 AS index_scans,
       i.idx_scan - :uniq0 AS unique_index_scans
  FROM pg_stat_user_tables t, pg_stat_user_indexes i
 WHERE t.relid = 'redpacket.claim'::regclass
   AND i.indexrelid = 'redpacket.claim_activity_id_user_id_idempotency_key_key'::regclass;

-- The application role gets it from rp_grant_app, and still no table.
CREATE ROLE regress_rp_lookup_app;
SELECT redpacket.rp_grant_app('regress_rp_lookup_app');
SET ROLE regress_rp_lookup_app;
SELECT amount FROM redpacket.rp_user_claims(:a, 'alice');
SELECT pg_temp.err('SELECT count(*) FROM redpacket.claim');
RESET ROLE;
CREATE ROLE regress_rp_lookup_nobody;
SET ROLE regress_rp_lookup_nobody;
SELECT pg_temp.err(format('SELECT * FROM redpacket.rp_user_claims(%s, ''alice'')', :a));
RESET ROLE;
DROP OWNED BY regress_rp_lookup_app;
DROP ROLE regress_rp_lookup_app, regress_rp_lookup_nobody;
