-- rp_claim's SPI path looks up the caller's claims on claim (activity_id,
-- user_id, ...) with an index probe whatever the statistics say: the
-- lookup, the duplicate check inside the stripe update and the per-user
-- count.  An activity newer than the last ANALYZE is estimated to hold one
-- claim; a custom plan (a backend's first five executions) then scanned
-- claim_pkey by activity_id alone, filtering on the user: every claim of
-- the activity read for one claim.  pg_stat_xact_user_tables counts the
-- claims fetched through an index.  The SPI path is taken with
-- redpacket.direct_claims off, and always when per_user_limit is above 1.
CREATE TEMP TABLE cp_old AS
    SELECT redpacket.rp_create_activity(1000.00, stripes => 4, name => 'cp-old') AS id;
SELECT count(*) FROM redpacket.rp_claim_batch((SELECT id FROM cp_old),
    ARRAY(SELECT 'old-' || g FROM generate_series(1, 200) g), array_fill(0.01, ARRAY[200]));
ANALYZE redpacket.claim;
-- created after the ANALYZE: the statistics do not know them; long user
-- ids make the (activity_id, user_id, idempotency_key) index a level deeper
-- than claim_pkey
CREATE TEMP TABLE cp_new AS
    SELECT redpacket.rp_create_activity(1000.00, stripes => 4, name => 'cp-one') AS one,
           redpacket.rp_create_activity(1000.00, stripes => 4, name => 'cp-three',
                                        per_user_limit => 3) AS three;
SELECT count(*) FROM redpacket.rp_claim_batch((SELECT one FROM cp_new),
    ARRAY(SELECT 'n-' || g || repeat('x', 200) FROM generate_series(1, 8000) g),
    array_fill(0.01, ARRAY[8000]));
SELECT count(*) FROM redpacket.rp_claim_batch((SELECT three FROM cp_new),
    ARRAY(SELECT 'n-' || g || repeat('x', 200) FROM generate_series(1, 8000) g),
    array_fill(0.01, ARRAY[8000]), ARRAY(SELECT 'r-' || g FROM generate_series(1, 8000) g));
-- one claim per user, on the SPI path
SET redpacket.direct_claims = off;
BEGIN;
SELECT (redpacket.rp_claim((SELECT one FROM cp_new), 'm-' || g, 0.01)).status
  FROM generate_series(1, 3) g;
SELECT idx_tup_fetch < 1000 AS claims_read_few_claims
  FROM pg_stat_xact_user_tables WHERE relid = 'redpacket.claim'::regclass;
COMMIT;
RESET redpacket.direct_claims;
-- three claims per user: always the SPI path
BEGIN;
SELECT (redpacket.rp_claim((SELECT three FROM cp_new), 'm-' || g, 0.01, 'q-' || g)).status
  FROM generate_series(1, 3) g;
SELECT idx_tup_fetch < 1000 AS claims_read_few_claims
  FROM pg_stat_xact_user_tables WHERE relid = 'redpacket.claim'::regclass;
COMMIT;
-- the claims already held are still found: a duplicate, a user at the limit
SET redpacket.direct_claims = off;
SELECT (redpacket.rp_claim((SELECT one FROM cp_new), 'n-7' || repeat('x', 200), 0.01)).status;
RESET redpacket.direct_claims;
SELECT (redpacket.rp_claim((SELECT three FROM cp_new), 'n-7' || repeat('x', 200), 0.01, 'r-7')).status;
SELECT (redpacket.rp_claim((SELECT three FROM cp_new), 'n-7' || repeat('x', 200), 0.01, 'q-' || g)).status
  FROM generate_series(1, 3) g;
DROP TABLE cp_old, cp_new;
