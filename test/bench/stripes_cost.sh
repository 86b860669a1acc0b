#!/usr/bin/env bash
# What the stripe count costs the operations that touch every stripe: for
# each count in STRIPES_COST_COUNTS, REPS fresh activities (1000.00, each
# with 100 claims of 0.01 made first; a first activity in each session
# warms it up untimed) and, per activity, the server-side
# time of one gathering claim (an amount larger than any one stripe holds,
# so it locks and reads every stripe), rp_reconcile(id) (incremental, then
# full), rp_freeze + rp_unfreeze, and rp_close_activity.  Prints the median
# milliseconds of each.  One session, no concurrency: the cost of the
# operation itself, not of waiting for claims in flight.
#
# Environment: STRIPES_COST_COUNTS ("16 64"), STRIPES_COST_REPS (15).
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root stripes_cost.sh "$@"

COUNTS=${STRIPES_COST_COUNTS:-16 64}
REPS=${STRIPES_COST_REPS:-15}

bench_cluster_start stripes_cost "redpacket.reconcile_interval = 0"
bench_psql -q -c "CREATE EXTENSION redpacket" >/dev/null
bench_psql -q <<'SQL' >/dev/null
CREATE TABLE cost (stripes int, op text, ms numeric);
CREATE FUNCTION timed(p_stripes int, p_op text, p_sql text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE p_sql;
    INSERT INTO cost VALUES (p_stripes, p_op,
        extract(epoch FROM clock_timestamp() - t0) * 1000);
END $$;
SQL
for n in $COUNTS; do
    for _ in $(seq 1 "$REPS"); do
        # two activities: the first warms the session up (library, plans), the second is timed
        args=()
        for tag in warm timed; do
            a=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(1000.00, stripes => $n)")
            bench_psql -q -c "SELECT redpacket.rp_claim_batch($a, array(SELECT 'w' || g FROM generate_series(1, 100) g), array_fill(0.01, ARRAY[100]))" >/dev/null
            k=$n
            [ "$tag" = timed ] || k=-$n
            args+=(-c "SELECT timed($k, 'gathering claim', format('SELECT redpacket.rp_claim(%s, %L, %s)', $a, 'big', round(1000.00 / $n + 1, 2)))"
                   -c "SELECT timed($k, 'rp_reconcile incremental', format('SELECT redpacket.rp_reconcile(%s)', $a))"
                   -c "SELECT timed($k, 'rp_reconcile full', format('SELECT redpacket.rp_reconcile(%s, true)', $a))"
                   -c "SELECT timed($k, 'rp_freeze', format('SELECT redpacket.rp_freeze(%s, %L)', $a, 'cost'))"
                   -c "SELECT timed($k, 'rp_unfreeze', format('SELECT redpacket.rp_unfreeze(%s)', $a))"
                   -c "SELECT timed($k, 'rp_close_activity', format('SELECT redpacket.rp_close_activity(%s)', $a))")
        done
        bench_psql -q "${args[@]}" >/dev/null
    done
done
bench_psql -c "
    SELECT op, stripes, round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 3) AS median_ms
      FROM cost WHERE stripes > 0 GROUP BY op, stripes ORDER BY op, stripes"
bench_cleanup
