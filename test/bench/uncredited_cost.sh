#!/usr/bin/env bash
# What the uncredited alert's look costs a pass, against the settled history
# it must not read: three sets of 256 activities (a pass's window): without
# claims, with UNCREDITED_CLAIMS / 10 claims each and with UNCREDITED_CLAIMS
# claims each, all credited.  For each set, the look's query (every
# activity's claims that rp_pending_credits lists as older than a deadline):
# once to move the settlement frontiers (the first look after the claims),
# then UNCREDITED_REPS times, alternating the sets; prints the median
# milliseconds of each and the ratio large/small (1.0: the settled history
# costs nothing).  One session, no concurrency.
#
# Environment: UNCREDITED_CLAIMS (2000), UNCREDITED_REPS (15).
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root uncredited_cost.sh "$@"

CLAIMS=${UNCREDITED_CLAIMS:-2000}
REPS=${UNCREDITED_REPS:-15}

bench_cluster_start uncredited_cost "redpacket.reconcile_interval = 0"
bench_psql -q -c "CREATE EXTENSION redpacket" >/dev/null
SMALL=$((CLAIMS / 10))
echo "== setup: 256 activities without claims, 256 with $SMALL and 256 with $CLAIMS credited claims each"
bench_psql -q <<SQL >/dev/null
CREATE TABLE cost (set_name text, ms numeric);
CREATE TABLE sets (set_name text, id bigint, n int);
INSERT INTO sets SELECT 'empty', redpacket.rp_create_activity(1.00, stripes => 1), 0 FROM generate_series(1, 256);
INSERT INTO sets SELECT 'small', redpacket.rp_create_activity($SMALL * 0.01, stripes => 4), $SMALL FROM generate_series(1, 256);
INSERT INTO sets SELECT 'large', redpacket.rp_create_activity($CLAIMS * 0.01, stripes => 4), $CLAIMS FROM generate_series(1, 256);
SELECT count(*) FROM sets s, LATERAL redpacket.rp_claim_batch(s.id,
         array(SELECT 'u' || g FROM generate_series(1, s.n) g), array_fill(0.01, ARRAY[s.n]))
 WHERE s.n > 0;
SELECT redpacket.rp_credited(s.id, array(SELECT claim_id FROM redpacket.claim c WHERE c.activity_id = s.id))
  FROM sets s WHERE s.n > 0;
CREATE FUNCTION look(p_set text, p_record boolean DEFAULT true) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM w.id, count(c.claim_id)
       FROM sets w LEFT JOIN LATERAL redpacket.rp_pending_credits(w.id, '1 s') c ON true
      WHERE w.set_name = p_set GROUP BY w.id;
    INSERT INTO cost SELECT p_set, extract(epoch FROM clock_timestamp() - t0) * 1000 WHERE p_record;
END \$\$;
SQL
first=$(bench_psql -At -c "SELECT look('large')" -c "SELECT round(ms, 1) FROM cost" -c "TRUNCATE cost")
echo "first look at the large set (moves the frontiers past $((256 * CLAIMS)) claims): $first ms"
bench_psql -q -c "SELECT look('small')" -c "TRUNCATE cost" >/dev/null
# each session first warms up untimed (its first call loads caches and plans)
for _ in $(seq 1 "$REPS"); do
    bench_psql -q -c "SELECT look('empty', false)" \
        -c "SELECT look('empty')" -c "SELECT look('small')" -c "SELECT look('large')" >/dev/null
    bench_psql -q -c "SELECT look('empty', false)" \
        -c "SELECT look('large')" -c "SELECT look('small')" -c "SELECT look('empty')" >/dev/null
done
bench_psql -c "
    WITH m AS (SELECT set_name, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS ms FROM cost GROUP BY set_name)
    SELECT round((SELECT ms FROM m WHERE set_name = 'empty')::numeric, 2) AS empty_ms,
           round((SELECT ms FROM m WHERE set_name = 'small')::numeric, 2) AS small_ms,
           round((SELECT ms FROM m WHERE set_name = 'large')::numeric, 2) AS large_ms,
           round(((SELECT ms FROM m WHERE set_name = 'large') / (SELECT ms FROM m WHERE set_name = 'small'))::numeric, 3) AS large_over_small"
bench_cleanup
