#!/usr/bin/env bash
# What the split costs a claim: four activities of 10,000,000 packets, one
# per way of paying, claimed by new users from SPLIT_CLIENTS pgbench
# clients for SPLIT_SECS seconds each, in SPLIT_ROUNDS rounds that take
# the four in turn (side by side: the machine's drift falls on all four).
# "any draw" and "any fixed" are how 1.5 paid (no split: amount NULL draws,
# 1.00 is paid 1.00); "lucky" and "equal" are the 1.6 splits, whose claims
# name no amount.  Prints the median claims per second of each and the
# ratios lucky / any draw and equal / any fixed (1.0: the split is free).
#
# Environment: SPLIT_CLIENTS (8), SPLIT_SECS (10), SPLIT_ROUNDS (3).
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root split_cost.sh "$@"

CLIENTS=${SPLIT_CLIENTS:-8}
SECS=${SPLIT_SECS:-10}
ROUNDS=${SPLIT_ROUNDS:-3}

bench_cluster_start split_cost "redpacket.reconcile_interval = 0"
bench_psql -q -c "CREATE EXTENSION redpacket" >/dev/null
declare -A ACT AMOUNT
ACT[any_draw]=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(10000000.00, 10000000, stripes => 16)")
ACT[lucky]=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(10000000.00, 10000000, stripes => 16, split => 'lucky')")
ACT[any_fixed]=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(10000000.00, 10000000, stripes => 16)")
ACT[equal]=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(10000000.00, 10000000, stripes => 16, split => 'equal')")
AMOUNT=([any_draw]="" [lucky]="" [any_fixed]=", 1.00" [equal]="")
dir=$(mktemp -d "${TMPDIR:-/tmp}/split_cost.XXXXXX")
for v in any_draw lucky any_fixed equal; do
    printf '%s\n' '\set n random(1, 2000000000)' \
        "SELECT status FROM redpacket.rp_claim(:act, 'u' || :round || '-' || :client_id || '-' || :n${AMOUNT[$v]});" \
        > "$dir/$v.pgbench"
done
bench_psql -q -c "CREATE TABLE rate (variant text, tps numeric)"
for round in $(seq 1 "$ROUNDS"); do
    for v in any_draw lucky any_fixed equal; do
        tps=$("$PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$dir/$v.pgbench" \
                  -D act="${ACT[$v]}" -D round="$round" |
              awk '/^tps = / { print $3 }')
        echo "round $round $v: $tps claims/s"
        bench_psql -q -c "INSERT INTO rate VALUES ('$v', $tps)"
    done
done
bench_psql -c "
    WITH m AS (SELECT variant, percentile_cont(0.5) WITHIN GROUP (ORDER BY tps) AS tps FROM rate GROUP BY variant)
    SELECT round((SELECT tps FROM m WHERE variant = 'any_draw')::numeric, 0) AS any_draw,
           round((SELECT tps FROM m WHERE variant = 'lucky')::numeric, 0) AS lucky,
           round(((SELECT tps FROM m WHERE variant = 'lucky') / (SELECT tps FROM m WHERE variant = 'any_draw'))::numeric, 3) AS lucky_ratio,
           round((SELECT tps FROM m WHERE variant = 'any_fixed')::numeric, 0) AS any_fixed,
           round((SELECT tps FROM m WHERE variant = 'equal')::numeric, 0) AS equal,
           round(((SELECT tps FROM m WHERE variant = 'equal') / (SELECT tps FROM m WHERE variant = 'any_fixed'))::numeric, 3) AS equal_ratio"
bench_psql -c "SELECT a.split, count(c.*) AS claims, sum(c.amount) AS paid, bool_and(r.ok) AS books_ok
                 FROM redpacket.activity a LEFT JOIN redpacket.claim c ON c.activity_id = a.id
                 CROSS JOIN LATERAL (SELECT bool_and(ok) AS ok FROM redpacket.rp_verify(a.id, true)) r
                GROUP BY a.id, a.split ORDER BY a.id"
rm -rf "$dir"
bench_cleanup
