-- rp_claim_batch looks up the claims its users already hold with one probe
-- per element on claim (activity_id, user_id, idempotency_key), whatever
-- the statistics say.  An activity newer than the last ANALYZE
-- is estimated to hold one claim; a custom plan then scanned claim_pkey by
-- activity_id alone, filtering on the user: every claim of the activity
-- read for every element.  pg_stat_xact_user_tables counts the claims the
-- batch fetched through an index: none of its new users has a claim.
CREATE TEMP TABLE probe_old AS
    SELECT redpacket.rp_create_activity(1000.00, stripes => 4, name => 'probe-old') AS id;
SELECT count(*) FROM redpacket.rp_claim_batch((SELECT id FROM probe_old),
    ARRAY(SELECT 'old-' || g FROM generate_series(1, 200) g), array_fill(0.01, ARRAY[200]));
ANALYZE redpacket.claim;
-- created after the ANALYZE: the statistics do not know it; long user ids
-- make the (activity_id, user_id, idempotency_key) index a level deeper
-- than claim_pkey, which made the one-column scan the cheaper-looking plan
CREATE TEMP TABLE probe_new AS
    SELECT redpacket.rp_create_activity(1000.00, stripes => 4, name => 'probe-new') AS id;
SELECT count(*) FROM redpacket.rp_claim_batch((SELECT id FROM probe_new),
    ARRAY(SELECT 'n-' || g || repeat('x', 200) FROM generate_series(1, 8000) g),
    array_fill(0.01, ARRAY[8000]));
BEGIN;
SELECT count(*) FILTER (WHERE status = 'claimed') AS claimed
  FROM redpacket.rp_claim_batch((SELECT id FROM probe_new),
    ARRAY(SELECT 'm-' || g FROM generate_series(1, 100) g), array_fill(0.01, ARRAY[100]));
SELECT idx_tup_fetch < 1000 AS probes_read_few_claims, idx_tup_fetch < 100000 AS not_one_scan_per_element
  FROM pg_stat_xact_user_tables WHERE relid = 'redpacket.claim'::regclass;
COMMIT;
-- users already holding a claim are still found
SELECT count(*) FILTER (WHERE status = 'duplicate') AS duplicates
  FROM redpacket.rp_claim_batch((SELECT id FROM probe_new),
    ARRAY(SELECT 'n-' || g || repeat('x', 200) FROM generate_series(1, 100) g),
    array_fill(0.01, ARRAY[100]));
DROP TABLE probe_old, probe_new;
