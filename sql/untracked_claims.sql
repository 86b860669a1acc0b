-- Claims made before settlement tracking existed (an update from 1.3 or
-- earlier records them in settlement_start) are not pending credits: the
-- old wallet paid them.  rp_track_claims brings them in when it did not.
SET client_min_messages = warning;
CREATE FUNCTION pg_temp.try(q text) RETURNS TABLE (code text, message text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN QUERY SELECT 'ok', NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    RETURN QUERY SELECT code, message;
END $$;
CREATE FUNCTION pg_temp.pending(a bigint) RETURNS SETOF text
LANGUAGE sql AS $$
    SELECT p.user_id FROM redpacket.rp_pending_credits(a) p ORDER BY p.claim_id
$$;

SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2) AS a \gset
SELECT (redpacket.rp_claim(:a, 'old' || g, 1.00)).status FROM generate_series(1, 3) g;
SELECT redpacket.rp_credited(:a, ARRAY[(SELECT claim_id FROM redpacket.claim
                                         WHERE activity_id = :a AND user_id = 'old2')]) AS credited;
-- what the update writes (and a restore writes back)
INSERT INTO redpacket.settlement_start (activity_id, untracked_through)
SELECT activity_id, max(claim_id) FROM redpacket.claim WHERE activity_id = :a GROUP BY activity_id;
SELECT (redpacket.rp_claim(:a, 'new' || g, 1.00)).status FROM generate_series(1, 2) g;
SELECT * FROM pg_temp.pending(:a);
SELECT ok, problems FROM redpacket.rp_reconcile(:a, true);
-- a credit moves the frontier past the old claims: still not pending, the books right
SELECT redpacket.rp_credited(:a, ARRAY[(SELECT claim_id FROM redpacket.claim
                                         WHERE activity_id = :a AND user_id = 'new1')]) AS credited;
SELECT * FROM pg_temp.pending(:a);
SELECT ok, problems FROM redpacket.rp_reconcile(:a, true);
-- the uncredited old claims count nowhere else either
SELECT count(*) AS gaps FROM redpacket.settlement_gap WHERE activity_id = :a;

-- only the functions change the rows
SELECT * FROM pg_temp.try('DELETE FROM redpacket.settlement_start');
SELECT * FROM pg_temp.try('UPDATE redpacket.settlement_start SET untracked_through = 0');

-- the old wallet may have paid an untracked claim: reversing it could pay
-- it twice, so it is refused until the claim is brought in
SELECT claim_id AS old3 FROM redpacket.claim WHERE activity_id = :a AND user_id = 'old3' \gset
SELECT code, message = format('claim %s of activity %s was made before settlement tracking', :old3, :a) AS names_it
  FROM pg_temp.try(format('SELECT redpacket.rp_reverse(%s, %s, %L)', :a, :old3, 'never paid'));

-- brought in: the old claims not settled are pending from now on
SELECT redpacket.rp_track_claims(:a) AS brought_in;
SELECT redpacket.rp_track_claims(:a) AS again;
SELECT * FROM pg_temp.pending(:a);
SELECT count(*) AS starts FROM redpacket.settlement_start WHERE activity_id = :a;
SELECT ok, problems FROM redpacket.rp_reconcile(:a, true);
SELECT redpacket.rp_reverse(:a, :old3, 'never paid') AS reversed;
SELECT redpacket.rp_credited(:a, ARRAY(SELECT claim_id FROM redpacket.claim
                                        WHERE activity_id = :a AND user_id IN ('old1', 'old2'))) AS credited;
SELECT * FROM pg_temp.pending(:a);
SELECT ok, problems FROM redpacket.rp_reconcile(:a, true);

-- an activity without a credit yet: its frontier starts after the old claims
SELECT redpacket.rp_create_activity(5.00, 5) AS b \gset
SELECT (redpacket.rp_claim(:b, 'b' || g, 1.00)).status FROM generate_series(1, 2) g;
INSERT INTO redpacket.settlement_start (activity_id, untracked_through)
SELECT activity_id, max(claim_id) FROM redpacket.claim WHERE activity_id = :b GROUP BY activity_id;
SELECT (redpacket.rp_claim(:b, 'b3', 1.00)).status;
SELECT * FROM pg_temp.pending(:b);
SELECT redpacket.rp_track_claims() >= 2 AS brought_in;
SELECT * FROM pg_temp.pending(:b);

-- a start row that hides claims made after it began is reported
SELECT redpacket.rp_create_activity(5.00, 5) AS f \gset
SELECT (redpacket.rp_claim(:f, 'f1', 1.00)).status;
INSERT INTO redpacket.settlement_start (activity_id, untracked_through, recorded_at)
SELECT activity_id, max(claim_id), '2000-01-01' FROM redpacket.claim WHERE activity_id = :f GROUP BY activity_id;
SELECT * FROM pg_temp.pending(:f);
SELECT ok, problems FROM redpacket.rp_verify(:f);
SELECT redpacket.rp_track_claims(:f) AS brought_in;
SELECT ok, problems FROM redpacket.rp_verify(:f);
