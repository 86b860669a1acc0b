#!/usr/bin/env bash
# Load shedding (redpacket.max_waiting): many clients on one hot activity,
# with and without a limit on the claims that wait, side by side.
#
# On the benchmark's throwaway cluster (lib.sh: durable, max_connections
# 400, huge pages when there are), one activity of SHED_STRIPES (16) stripes
# and a budget no run exhausts; pgbench -M prepared, one rp_claim of 0.01
# by a new user per transaction (rp_claim.pgbench), in three runs:
#   few    SHED_FEW (16) clients, no limit
#   many   SHED_MANY (256) clients, no limit
#   shed   SHED_MANY clients with redpacket.max_waiting = SHED_LIMIT (16), set
#          for the clients' sessions (a user setting, as an application or a
#          pooler's connect options would set it)
# Each run lasts a warm-up (2 s at 16 clients or fewer, else 10;
# BENCH_WARMUP) plus BENCH_SECONDS (20) measured; the figures count the
# answers that started in the measured window (pgbench --log, as in
# run.sh): answers/s, p50 and p99 latency of every answer (busy included),
# and claims/s (claims recorded in the window: busy answers write nothing).
# Targets (doc/campaigns.md, shedding load): the p99 of shed within 2x the p99 of few,
# and the claims/s of shed at least 0.9x those of many.  Reports both, met or
# not met, with the books of every run (claims + remaining = funded, one
# claim per user).  A server whose library has no redpacket.max_waiting
# runs few and many and reports shed as not run.
#
# Environment: BENCH_SECONDS (20; BENCH_QUICK=1: 5), BENCH_WARMUP,
# SHED_STRIPES, SHED_FEW, SHED_MANY, SHED_LIMIT, BENCH_JOBS (pgbench
# threads: the cores), BENCH_KEEP=1, BENCH_PORTS, BENCH_HUGE_PAGES (lib.sh).
# Exits non-zero when a run fails or its books do not balance (a missed
# target is reported, not an error).  Run as an ordinary user; as root it
# re-runs itself as postgres.
set -euo pipefail

BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root shed.sh "$@"

if [ "${BENCH_QUICK:-0}" = 1 ]; then SECS=${BENCH_SECONDS:-5}; else SECS=${BENCH_SECONDS:-20}; fi
STRIPES=${SHED_STRIPES:-16}
FEW=${SHED_FEW:-16}
MANY=${SHED_MANY:-256}
LIMIT=${SHED_LIMIT:-16}
JOBS=${BENCH_JOBS:-$(nproc 2>/dev/null || echo 2)}
FUNDED=1000000000000
FAILS=0

ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "== load shedding: one activity of $STRIPES stripes; $FEW clients, $MANY clients," \
     "$MANY clients with redpacket.max_waiting = $LIMIT; ${SECS} s measured a run"
bench_cluster_start shed
mkdir -p "$BENCH_DIR/log"
bench_psql -c "CREATE EXTENSION redpacket"
HAS_LIMIT=$(bench_psql -At -c "SELECT count(*) FROM pg_settings WHERE name = 'redpacket.max_waiting'")

warmup_for() {
    if [ -n "${BENCH_WARMUP:-}" ]; then echo "$BENCH_WARMUP"
    elif [ "$1" -le 16 ]; then echo 2
    else echo 10
    fi
}
# pgbench's -T also counts connecting the clients: measured once per count.
connect_secs() {
    local ms
    echo "SELECT 1;" >"$BENCH_DIR/select1.pgbench"
    ms=$("$PGBIN/pgbench" -n -c "$1" -j "$( [ "$JOBS" -le "$1" ] && echo "$JOBS" || echo "$1")" -t 1 \
             -f "$BENCH_DIR/select1.pgbench" 2>/dev/null |
         sed -n 's/^initial connection time = \([0-9.]*\) ms/\1/p')
    awk -v ms="${ms:-0}" 'BEGIN { printf "%d", ms * 1.5 / 1000 + 1 }'
}

declare -A P50 P99 CPS APS BUSY
# run NAME CLIENTS LIMIT (LIMIT 0: no limit)
run() {
    local name=$1 clients=$2 limit=$3 act log jobs warm rc=0 calls p50 p99 secs lo hi
    local claims total aps cps books opts=()
    act=$(bench_psql -At -c "SELECT redpacket.rp_create_activity($FUNDED, stripes => $STRIPES, name => '$name')")
    log="$BENCH_DIR/log/$name"
    jobs=$JOBS
    [ "$jobs" -le "$clients" ] || jobs=$clients
    warm=$(warmup_for "$clients")
    [ "$limit" -eq 0 ] || opts=(-c "redpacket.max_waiting=$limit")
    bench_psql -c CHECKPOINT
    PGOPTIONS="${opts[*]:-}" "$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$jobs" \
        -T $((SECS + warm + $(connect_secs "$clients"))) -D act="$act" -D n=0 \
        -f "$BENCH_HERE/rp_claim.pgbench" --log --log-prefix="$log" >"$log.out" 2>&1 || rc=$?
    read -r calls p50 p99 secs lo hi < <(cat "$log".[0-9]* 2>/dev/null | bench_window "$warm" "$SECS")
    rm -f "$log".[0-9]*
    if [ "$rc" -ne 0 ] || grep -q 'aborted\|^number of failed transactions: [1-9]' "$log.out"; then
        echo "FAIL  $name: pgbench exit $rc; its output:"
        grep -v '^progress' "$log.out" | tail -n 15 | sed 's/^/        /'
        FAILS=$((FAILS + 1))
    fi
    # claims recorded in the window (claimed_at is the claim's transaction start)
    claims=$(bench_psql -At -c "SELECT count(*) FROM redpacket.claim WHERE activity_id = $act
                                   AND claimed_at >= to_timestamp($lo) AND claimed_at < to_timestamp($hi)")
    total=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log.out")
    books=$(bench_psql -At -F' ' -c "
        SELECT (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $act)
               + (SELECT sum(balance) / 100.0 FROM redpacket.stripe WHERE activity_id = $act) = $FUNDED,
               (SELECT count(*) = count(DISTINCT user_id) FROM redpacket.claim WHERE activity_id = $act),
               (SELECT count(*) FROM redpacket.claim WHERE activity_id = $act)")
    aps=$(awk -v c="$calls" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? c / s : 0) }')
    cps=$(awk -v c="$claims" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? c / s : 0) }')
    P50[$name]=$p50; P99[$name]=$p99; CPS[$name]=$cps; APS[$name]=$aps
    BUSY[$name]=$(awk -v a="$calls" -v c="$claims" 'BEGIN { printf "%.1f", (a > 0 ? 100 * (a - c) / a : 0) }')
    printf '%-5s clients %-4s max_waiting %-3s %7s answers/s %7s claims/s  p50 %8s ms  p99 %8s ms  busy %5s%%  (%s answers in %s s; %s in all)\n' \
        "$name" "$clients" "$limit" "$aps" "$cps" "$p50" "$p99" "${BUSY[$name]}" "$calls" "$secs" "${total:-0}"
    # every claimed answer of the run is a claim, and the books balance
    read -r balanced unique recorded <<<"$books"
    if [ "$balanced" = t ] && [ "$unique" = t ]; then
        echo "      PASS  books: claims + remaining = funded, one claim per user ($recorded claims)"
    else
        echo "      FAIL  books: balanced $balanced, one claim per user $unique"
        FAILS=$((FAILS + 1))
    fi
}

run few "$FEW" 0
run many "$MANY" 0
if [ "$HAS_LIMIT" = 1 ]; then
    run shed "$MANY" "$LIMIT"
else
    echo "shed  not run: this server's redpacket has no redpacket.max_waiting"
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "NA" || b == "NA" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
met() { awk -v r="$1" -v t="$2" -v op="$3" 'BEGIN {
    if (r == "n/a") { print "not measured"; exit }
    print ((op == "le" ? r <= t : r >= t) ? "met" : "NOT met") }'; }

echo
echo "                 answers/s  claims/s    p50 ms    p99 ms   busy"
for n in few many shed; do
    [ -n "${CPS[$n]:-}" ] || continue
    printf '%-15s %10s %9s %9s %9s %5s%%\n' "$n" "${APS[$n]}" "${CPS[$n]}" "${P50[$n]}" "${P99[$n]}" "${BUSY[$n]}"
done
r1=$(ratio "${P99[shed]:-}" "${P99[few]:-}")
r2=$(ratio "${CPS[shed]:-}" "${CPS[many]:-}")
echo "target: p99 of shed / p99 of few = $r1 (<= 2.00): $(met "$r1" 2.00 le)"
echo "target: claims/s of shed / claims/s of many = $r2 (>= 0.90): $(met "$r2" 0.90 ge)"
problems=$(bench_server_problems || true)
if [ -n "$problems" ]; then
    echo "FAIL  the server log has warnings or errors:"
    echo "$problems" | head -n 10 | sed 's/^/        /'
    FAILS=$((FAILS + 1))
fi
exit $((FAILS > 0))
