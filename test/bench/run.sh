#!/usr/bin/env bash
# Benchmark suite for redpacket (make bench).
#
# Starts a throwaway PostgreSQL 15 cluster (durable: fsync and
# synchronous_commit on, shared_buffers 1GB, max_connections 400, redpacket
# preloaded with its worker paused) and measures, side by side, claims/s and
# p50/p99 latency (from pgbench's per-transaction logs) of:
#   ceiling         one unique INSERT into a table shaped like redpacket.claim
#   cond_update     seed 004: unique insert + UPDATE balance ... WHERE balance >= amount
#   for_update      seed 004: SELECT balance ... FOR UPDATE, UPDATE, INSERT
#   rp_claim_default  rp_claim on an activity created WITHOUT a stripes
#                   argument, so the redpacket.stripes default applies: the
#                   headline row, what a user gets without tuning
#   rp_claim        the stripe sweep: 1, 4, 16, 64 and 256 stripes (from 16
#                   clients on; at 1 client the stripe count does not matter)
#   rp_claim_batch  100 claims a call on 16 stripes (claims counted, not
#                   calls; latency is per call)
#   redis_lua       EVALSHA of SISMEMBER + balance check + DECRBY + SADD on a
#                   redis-server with appendfsync always (redis-benchmark)
# at 1, 16, 64 and 256 clients, each claiming from ONE activity with new users,
# pgbench -M prepared; the 256-client ceiling, rp_claim at the default
# settings and rp_claim_batch also go through PgBouncer (transaction pooling, pool of 32;
# -M extended, since PgBouncer 1.18 cannot carry named prepared statements
# across transactions).  Each pgbench run lasts BENCH_WARMUP + BENCH_SECONDS;
# the figures count only the transactions that started in the last
# BENCH_SECONDS after the warm-up (from pgbench's per-transaction log), so
# that connecting, preparing plans and faulting in shared memory in hundreds
# of new backends is not measured; every workload is treated alike, and the
# CSV's seconds column is the window actually measured.
# Every run is checked (claims + remaining = funded, one claim per user, every
# call claimed, a full rp_reconcile) and PASS/FAIL printed.  Then one backend
# makes BENCH_CPU_CLAIMS claims in a row and, at the same time and pace,
# another as many ceiling inserts (synchronous_commit off), the claims on an
# activity at the default settings: CPU and wall time per operation, memory
# at the start, middle and end, and a pg_stat_statements breakdown.  report.sh states every performance
# target as a ratio from this one run, met or not met.  Last, unless
# BENCH_RECONCILE=0, test/bench/reconcile_cost.sh, and unless BENCH_GROUP=0,
# test/bench/group.sh (group red packets; alone: make bench-group).
#
# Writes test/bench/results/{bench.csv,cpu.csv,statements.csv,meta.csv,
# results.md,throughput.png}.  Exits non-zero on any FAIL.
#
# Environment:
#   BENCH_SECONDS     seconds per run (20; 5 with BENCH_QUICK=1)
#   BENCH_QUICK=1     smoke test: 5 s runs, clients 1 64 256, stripes 1 16,
#                     100000 CPU claims, reconcile_cost.sh at 1/10 size
#   BENCH_CLIENTS     client counts ("1 16 64 256")
#   BENCH_STRIPES     rp_claim stripe counts ("1 4 16 64 256")
#   BENCH_WARMUP      seconds before the measured window (clients <= 16: 2,
#                     64: 5, more: 10); pgbench's -T adds the time it takes
#                     to connect the clients (measured once per count)
#   BENCH_BATCH       claims per rp_claim_batch call (100)
#   BENCH_BATCH_STRIPES  stripes of the rp_claim_batch activity (16)
#   BENCH_CPU_CLAIMS  claims (and inserts) of the CPU/memory run (1000000)
#   BENCH_CPU_RATE    their pace, per second each (4000: below what one
#                     backend can do, so that both finish together)
#   BENCH_WORKLOADS   subset to run ("ceiling cond_update for_update
#                     rp_claim_default rp_claim rp_claim_batch redis_lua
#                     pgbouncer cpu")
#   BENCH_PORTS       LOW-HIGH: the TCP ports to use (lib.sh)
#   BENCH_RECONCILE=0 skip reconcile_cost.sh
#   BENCH_GROUP=0     skip group.sh (group red packets and the reconciler
#                     keeping up with them; alone: make bench-group)
#   BENCH_JOBS        pgbench threads (number of cores)
#   BENCH_HUGE_PAGES  the server's huge_pages (on, off, try); unset and run as
#                     root, the run reserves 2 MB huge pages for the shared
#                     memory (vm.nr_hugepages, given back at the end) and uses
#                     them (lib.sh)
#   BENCH_KEEP=1      keep the scratch directory (cluster, logs)
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail

BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BENCH_GIT_REV=${BENCH_GIT_REV:-$(git -C "$BENCH_HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)}
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root run.sh "$@"

QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then
    SECS=${BENCH_SECONDS:-5}
    read -r -a CLIENTS <<<"${BENCH_CLIENTS:-1 64 256}"
    read -r -a STRIPES <<<"${BENCH_STRIPES:-1 16}"
    CPU_CLAIMS=${BENCH_CPU_CLAIMS:-100000}
    CPU_RATE=${BENCH_CPU_RATE:-4000}
else
    SECS=${BENCH_SECONDS:-20}
    read -r -a CLIENTS <<<"${BENCH_CLIENTS:-1 16 64 256}"
    read -r -a STRIPES <<<"${BENCH_STRIPES:-1 4 16 64 256}"
    CPU_CLAIMS=${BENCH_CPU_CLAIMS:-1000000}
    CPU_RATE=${BENCH_CPU_RATE:-4000}
fi
BATCH=${BENCH_BATCH:-100}
BATCH_STRIPES=${BENCH_BATCH_STRIPES:-16}
JOBS=${BENCH_JOBS:-$(nproc 2>/dev/null || echo 2)}
WORKLOADS=" ${BENCH_WORKLOADS:-ceiling cond_update for_update rp_claim_default rp_claim rp_claim_batch redis_lua pgbouncer cpu} "
MAXC=0
for c in "${CLIENTS[@]}"; do [ "$c" -le "$MAXC" ] || MAXC=$c; done
# a budget no run can exhaust: 10^12 currency units
FUNDED=1000000000000

want() { [[ "$WORKLOADS" == *" $1 "* ]]; }

ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
mkdir -p "$BENCH_RESULTS"
export BENCH_RESULTS
# This run's record replaces the last one (reconcile.csv only when
# reconcile_cost.sh runs again).
rm -f "$BENCH_RESULTS"/{bench.csv,cpu.csv,statements.csv,meta.csv,throughput.png,group.csv,group_lag.csv,group_meta.csv}

echo "== redpacket benchmark: ${SECS} s measured a run (after a warm-up), clients ${CLIENTS[*]}, rp_claim stripes ${STRIPES[*]}," \
     "batch $BATCH, CPU run $CPU_CLAIMS claims, pgbench threads $JOBS"
bench_cluster_start bench
mkdir -p "$BENCH_DIR/log"
bench_psql -f "$BENCH_HERE/setup.sql"
DEFAULT_STRIPES=$(bench_psql -At -c "SHOW redpacket.stripes")

CSV_TMP="$BENCH_DIR/bench.csv"
echo "workload,stripes,clients,via,protocol,seconds,calls,claims,claims_per_s,p50_ms,p99_ms,invariants,top_waits" >"$CSV_TMP"
FAILS=0
CHECKS=0

# What the active backends wait on during a run: one psql session polls
# pg_stat_activity every 100 ms until the stop file appears (one connection,
# so it costs the run little).  waits_start FILE; waits_stop FILE -> "top 3"
waits_start() {
    rm -f "$1.stop"
    (
        while [ ! -e "$1.stop" ]; do
            echo "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
                   WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid();"
            sleep 0.1
        done | "$PGBIN/psql" -X -q -At >"$1" 2>/dev/null
    ) &
    WAITS_PID=$!
}
waits_stop() {
    touch "$1.stop"
    wait "$WAITS_PID" 2>/dev/null || true
    sort "$1" | uniq -c | sort -rn | awk '{ n[NR] = $1; w[NR] = $2; t += $1 }
        END { for (i = 1; i <= 3 && i <= NR; i++) printf "%s%s %.0f%%", (i > 1 ? "; " : ""), w[i], 100 * n[i] / t }'
}

# check_run KIND ACT EXPECTED_CLAIMS LABEL: prints PASS/FAIL lines, returns 1 on FAIL
check_run() {
    local kind=$1 act=$2 expect=$3 label=$4 name ok detail bad=0 out
    if ! out=$(bench_psql -At -F'|' -c "SELECT name, ok, detail FROM bench.check_run('$kind', $act, $expect)" 2>&1); then
        printf '    FAIL  invariant checks did not run: %s  [%s]\n' "$out" "$label"
        CHECKS=$((CHECKS + 1))
        FAILS=$((FAILS + 1))
        return 1
    fi
    while IFS='|' read -r name ok detail; do
        CHECKS=$((CHECKS + 1))
        if [ "$ok" = t ]; then
            printf '    PASS  %s: %s\n' "$name" "$detail"
        else
            printf '    FAIL  %s: %s  [%s]\n' "$name" "$detail" "$label"
            FAILS=$((FAILS + 1))
            bad=1
        fi
    done <<<"$out"
    return "$bad"
}

new_activity() {   # new_activity STRIPES|default -> id of a redpacket activity
    if [ "$1" = default ]; then
        # no stripes argument: the redpacket.stripes default applies
        bench_psql -At -c "SELECT redpacket.rp_create_activity($FUNDED)"
    else
        bench_psql -At -c "SELECT redpacket.rp_create_activity($FUNDED, stripes => $1)"
    fi
}
stripes_of() {     # stripes_of ACT -> its stripe count
    bench_psql -At -c "SELECT count(*) FROM redpacket.stripe WHERE activity_id = $1"
}
# pgbench's -T also counts the time it takes to connect its clients (many
# seconds for 256 on a loaded machine): measured once per client count with a
# trivial script, and added, with a margin, to every run's -T.
declare -A CONNECT_SECS=()
connect_secs() {   # connect_secs CLIENTS: sets CONNECT_SECS[CLIENTS], whole seconds to allow
    local c=$1 ms
    if [ -z "${CONNECT_SECS[$c]:-}" ]; then
        echo "SELECT 1;" >"$BENCH_DIR/select1.pgbench"
        ms=$("$PGBIN/pgbench" -n -c "$c" -j "$( [ "$JOBS" -le "$c" ] && echo "$JOBS" || echo "$c")" -t 1 \
                 -f "$BENCH_DIR/select1.pgbench" 2>/dev/null |
             sed -n 's/^initial connection time = \([0-9.]*\) ms/\1/p')
        CONNECT_SECS[$c]=$(awk -v ms="${ms:-0}" 'BEGIN { printf "%d", ms * 1.5 / 1000 + 1 }')
    fi
}
warmup_for() {     # warmup_for CLIENTS -> seconds before the measured window
    if [ -n "${BENCH_WARMUP:-}" ]; then echo "$BENCH_WARMUP"
    elif [ "$1" -le 16 ]; then echo 2
    elif [ "$1" -le 64 ]; then echo 5
    else echo 10
    fi
}
new_run() {        # bench.balance row for the baselines
    bench_psql -At -c "SELECT bench.new_run($FUNDED)"
}

# run_pgbench WORKLOAD STRIPES CLIENTS VIA SCRIPT KIND CLAIMS_PER_CALL
# (STRIPES "default": an activity created without a stripes argument)
run_pgbench() {
    local workload=$1 stripes=$2 clients=$3 via=$4 script=$5 kind=$6 per=$7
    local act tag log jobs proto rc=0 calls total claims cps p50 p99 verdict waits warm secs
    local conn=()
    case $kind in
        redpacket) act=$(new_activity "$stripes")
                   [ "$stripes" != default ] || stripes=$(stripes_of "$act") ;;
        *) act=$(new_run) ;;
    esac
    tag="$workload-s$stripes-c$clients-$via"
    log="$BENCH_DIR/log/$tag"
    jobs=$JOBS
    [ "$jobs" -le "$clients" ] || jobs=$clients
    proto=prepared
    if [ "$via" = pgbouncer ]; then
        proto=extended
        conn=(-h 127.0.0.1 -p "$PGB_PORT")
    fi
    warm=$(warmup_for "$clients")
    bench_psql -c CHECKPOINT
    waits_start "$log.waits"
    connect_secs "$clients"
    "$PGBIN/pgbench" -n -M "$proto" -c "$clients" -j "$jobs" -T $((SECS + warm + CONNECT_SECS[$clients])) "${conn[@]}" \
        -D act="$act" -D n=0 -D batch="$BATCH" -f "$BENCH_HERE/$script" \
        --log --log-prefix="$log" >"$log.out" 2>&1 || rc=$?
    waits=$(waits_stop "$log.waits")
    total=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log.out")
    read -r calls p50 p99 secs _ < <(cat "$log".[0-9]* 2>/dev/null | bench_window "$warm" "$SECS")
    rm -f "$log".[0-9]*
    total=${total:-0}
    calls=${calls:-0}
    # every claim made counts for the invariants; the window for the rate
    claims=$((total * per))
    secs=${secs:-0}
    cps=$(awk -v c="$calls" -v k="$per" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? c * k / s : 0) }')
    printf '%-16s stripes %-4s clients %-4s %-9s %7s claims/s  p50 %8s ms  p99 %8s ms  (%s calls in %s s measured, %s in all)\n' \
        "$workload" "${stripes/#0/-}" "$clients" "$via" "$cps" "$p50" "$p99" "$calls" "$secs" "$total"
    printf '    waits: %s\n' "${waits:-none sampled}"
    verdict=PASS
    if [ "$rc" -ne 0 ] || [ "$total" -eq 0 ] || grep -q 'aborted\|^number of failed transactions: [1-9]' "$log.out"; then
        echo "    FAIL  pgbench: exit $rc; its output:"
        grep -v '^progress' "$log.out" | tail -n 15 | sed 's/^/        /'
        FAILS=$((FAILS + 1))
        verdict=FAIL
    fi
    CHECKS=$((CHECKS + 1))
    check_run "$kind" "$act" "$claims" "$tag" || verdict=FAIL
    echo "$workload,$stripes,$clients,$via,$proto,$secs,$calls,$((calls * per)),$cps,$p50,$p99,$verdict,$waits" >>"$CSV_TMP"
}

# --- PostgreSQL workloads, direct ------------------------------------------
for c in "${CLIENTS[@]}"; do
    ! want ceiling || run_pgbench ceiling 0 "$c" direct ceiling.pgbench ceiling 1
    ! want cond_update || run_pgbench cond_update 1 "$c" direct cond_update.pgbench balance 1
    ! want for_update || run_pgbench for_update 1 "$c" direct for_update.pgbench balance 1
    ! want rp_claim_default || run_pgbench rp_claim_default default "$c" direct rp_claim.pgbench redpacket 1
    if want rp_claim && [ "$c" -gt 1 ]; then
        for s in "${STRIPES[@]}"; do
            run_pgbench rp_claim "$s" "$c" direct rp_claim.pgbench redpacket 1
        done
    fi
    ! want rp_claim_batch || run_pgbench rp_claim_batch "$BATCH_STRIPES" "$c" direct rp_claim_batch.pgbench redpacket "$BATCH"
done

# --- Through PgBouncer at the largest client count -------------------------
if want pgbouncer && ! command -v pgbouncer >/dev/null 2>&1; then
    echo "SKIP  pgbouncer: pgbouncer is not installed (test/setup.sh installs it)"
elif want pgbouncer; then
    PGB_DIR="$BENCH_DIR/pgbouncer"
    mkdir -p "$PGB_DIR"
    PGB_PORT=$(bench_free_port)
    printf '"%s" ""\n' "$PGUSER" >"$PGB_DIR/userlist.txt"
    cat >"$PGB_DIR/pgbouncer.ini" <<EOF
[databases]
postgres = host=$BENCH_DIR port=$PGPORT dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
pool_mode = transaction
default_pool_size = 32
max_client_conn = 1000
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
ignore_startup_parameters = extra_float_digits
EOF
    pgbouncer -d -q "$PGB_DIR/pgbouncer.ini"
    RP_CLEANUP+=("kill \$(cat '$PGB_DIR/pgbouncer.pid')")
    for _ in $(seq 1 50); do
        "$PGBIN/psql" -X -q -h 127.0.0.1 -p "$PGB_PORT" -c 'SELECT 1' >/dev/null 2>&1 && break
        sleep 0.1
    done
    run_pgbench ceiling 0 "$MAXC" pgbouncer ceiling.pgbench ceiling 1
    run_pgbench rp_claim_default default "$MAXC" pgbouncer rp_claim.pgbench redpacket 1
    ! want rp_claim_batch ||
        run_pgbench rp_claim_batch "$BATCH_STRIPES" "$MAXC" pgbouncer rp_claim_batch.pgbench redpacket "$BATCH"
    kill "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null || true
fi

# --- Redis Lua --------------------------------------------------------------
if want redis_lua && ! command -v redis-server >/dev/null 2>&1; then
    echo "SKIP  redis_lua: redis-server is not installed (test/setup.sh installs it)"
elif want redis_lua; then
    R_DIR="$BENCH_DIR/redis"
    mkdir -p "$R_DIR"
    R_PORT=$(bench_free_port)
    redis-server --bind 127.0.0.1 --port "$R_PORT" --dir "$R_DIR" --appendonly yes \
        --appendfsync always --save '' --logfile "$R_DIR/redis.log" --daemonize no \
        --protected-mode no --maxclients 1000 --auto-aof-rewrite-percentage 0 &
    R_PID=$!
    RP_CLEANUP+=("kill $R_PID")
    rcli() { redis-cli -p "$R_PORT" "$@"; }
    for _ in $(seq 1 50); do
        [ "$(rcli PING 2>/dev/null)" = PONG ] && break
        sleep 0.1
    done
    SHA=$(rcli SCRIPT LOAD "$(cat "$BENCH_HERE/claim.lua")")
    R_FUNDED=$((FUNDED * 100))     # minor units
    R_VERSION=$(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
    for c in "${CLIENTS[@]}"; do
        # redis-benchmark runs a number of requests, not a duration: size it
        # from a short calibration at this client count.
        rcli DEL bal users >/dev/null
        rcli SET bal "$R_FUNDED" >/dev/null
        cal=$(redis-benchmark -p "$R_PORT" -c "$c" -n $((c * 50 > 500 ? c * 50 : 500)) -r 2000000000 --csv \
                EVALSHA "$SHA" 2 bal users "u__rand_int__" 1 | awk -F'"' 'NR == 2 { print $4 }')
        n=$(awk -v r="${cal:-1000}" -v s="$SECS" 'BEGIN { printf "%d", r * s + 1 }')
        rcli DEL bal users >/dev/null
        rcli SET bal "$R_FUNDED" >/dev/null
        out="$BENCH_DIR/log/redis-c$c.csv"
        rc=0
        redis-benchmark -p "$R_PORT" -c "$c" -n "$n" -r 2000000000 --csv \
            EVALSHA "$SHA" 2 bal users "u__rand_int__" 1 >"$out" 2>&1 || rc=$?
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
        IFS=, read -r _ rps _ _ p50 _ p99 _ < <(sed -n 2p "$out" | tr -d '"')
        claims=$(rcli SCARD users)
        bal=$(rcli GET bal)
        secs=$(awk -v n="$n" -v r="${rps:-0}" 'BEGIN { if (r > 0) printf "%.2f", n / r; else print 0 }')
        cps=$(awk -v c="$claims" -v n="$n" -v r="${rps:-0}" 'BEGIN { printf "%.0f", c * r / n }')
        printf '%-15s stripes %-4s clients %-4s %-9s %7s claims/s  p50 %8s ms  p99 %8s ms  (%s calls, %s s)\n' \
            redis_lua - "$c" direct "$cps" "$p50" "$p99" "$n" "$secs"
        verdict=PASS
        CHECKS=$((CHECKS + 2))
        if [ "$rc" -ne 0 ] || [ -z "${rps:-}" ]; then
            echo "    FAIL  redis-benchmark: exit $rc"; sed 's/^/        /' "$out" | tail -n 5
            FAILS=$((FAILS + 1)); verdict=FAIL
        fi
        if [ $((bal + claims)) -eq "$R_FUNDED" ]; then
            echo "    PASS  claims + remaining = funded: $claims + $bal = $R_FUNDED"
        else
            echo "    FAIL  claims + remaining = funded: $claims + $bal != $R_FUNDED"
            FAILS=$((FAILS + 1)); verdict=FAIL
        fi
        # One claim per user holds by construction (a set); a random user id
        # drawn twice is a duplicate, not a claim: there must be few.
        if [ "$claims" -le "$n" ] && [ $((n - claims)) -le $((n / 1000 + 1)) ]; then
            echo "    PASS  one claim per user: $claims users claimed in $n calls ($((n - claims)) duplicate draws)"
        else
            echo "    FAIL  one claim per user: $claims users claimed in $n calls"
            FAILS=$((FAILS + 1)); verdict=FAIL
        fi
        echo "redis_lua,0,$c,direct,resp,$secs,$n,$claims,$cps,$p50,$p99,$verdict," >>"$CSV_TMP"
    done
    kill "$R_PID" 2>/dev/null || true
    wait "$R_PID" 2>/dev/null || true
fi

cp "$CSV_TMP" "$BENCH_RESULTS/bench.csv"

# --- CPU per claim and memory of one backend --------------------------------
# pgbench -c 1 -t N, synchronous_commit off for the session, the backend
# sampling itself (cpu.sql); then the same on a tenth as many with
# pg_stat_statements tracking the statements inside rp_claim.  The claims
# and the ceiling inserts run at once, each in its own backend and paced at
# the same rate (pgbench -R BENCH_CPU_RATE), so both are measured over the
# same seconds of the machine: one after the other, the ratio also
# compared two windows of a shared machine's load (per 100,000 operations
# the claim measured 47 to 157 us, the insert 32 to 53 us).
cpu_run() {   # cpu_run KIND ACT N [PGOPTIONS [PGBENCH OPTIONS]]: the output file
    local kind=$1 act=$2 n=$3 opts=${4:-} out="$BENCH_DIR/log/cpu-$1-$3.out"
    PGOPTIONS="-c synchronous_commit=off $opts" "$PGBIN/pgbench" -n -M prepared -c 1 -t "$n" ${5:-} \
        -D act="$act" -D n=0 -D step=$((n / 10 > 0 ? n / 10 : 1)) \
        -f "$BENCH_HERE/cpu_$kind.pgbench" >"$out" 2>&1 || echo "exit $?" >>"$out"
}
cpu_check() {   # cpu_check KIND N
    local kind=$1 n=$2 out="$BENCH_DIR/log/cpu-$1-$2.out"
    CHECKS=$((CHECKS + 1))
    if grep -q '^exit [0-9]\|aborted\|^number of failed transactions: [1-9]' "$out"; then
        echo "    FAIL  pgbench ($kind, $n): $(grep -m1 '^exit' "$out" || echo failed)"
        tail -n 15 "$out" | sed 's/^/        /'
        FAILS=$((FAILS + 1))
    else
        printf '    PASS  %s x %s in one backend: %s\n' "$kind" "$n" \
            "$(sed -n 's/^latency average = \(.*\)$/\1 a transaction (client side)/p' "$out")"
    fi
}
if want cpu; then
    echo
    echo "-- one backend: $CPU_CLAIMS claims in a row (default settings) and, at the same time in another, $CPU_CLAIMS ceiling inserts," \
         "each paced at $CPU_RATE a second (synchronous_commit off)"
    {
        echo "shared_preload_libraries = 'redpacket, pg_stat_statements'"
        echo "pg_stat_statements.track = 'none'"
    } >>"$BENCH_DIR/data/postgresql.conf"
    bench_cluster_restart
    bench_psql -c "CREATE EXTENSION pg_stat_statements" -f "$BENCH_HERE/cpu.sql"
    cact=$(new_activity default)
    crun=$(new_run)
    bench_psql -c CHECKPOINT
    cpu_run rp_claim "$cact" "$CPU_CLAIMS" "" "-R $CPU_RATE" &
    cpid=$!
    cpu_run ceiling "$crun" "$CPU_CLAIMS" "" "-R $CPU_RATE"
    wait "$cpid"
    cpu_check rp_claim "$CPU_CLAIMS"
    cpu_check ceiling "$CPU_CLAIMS"
    check_run redpacket "$cact" "$CPU_CLAIMS" cpu-rp_claim || true
    check_run ceiling "$crun" "$CPU_CLAIMS" cpu-ceiling || true
    hz=$(getconf CLK_TCK)
    bench_psql -A -F, -P footer=off -c "
        SELECT kind, ops, round(extract(epoch FROM at - first_value(at) OVER w)::numeric, 3) AS seconds,
               round((cpu_ticks - first_value(cpu_ticks) OVER w) * 1.0 / $hz, 2) AS cpu_seconds,
               rss_kb, pss_kb, anon_kb, ctx_bytes
        FROM bench.cpu_sample
        WINDOW w AS (PARTITION BY kind ORDER BY ops)
        ORDER BY kind DESC, ops" >"$BENCH_RESULTS/cpu.csv"
    brk=$((CPU_CLAIMS / 10))
    bact=$(new_activity default)
    brun=$(new_run)
    bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
    cpu_run rp_claim "$bact" "$brk" "-c pg_stat_statements.track=all"
    cpu_check rp_claim "$brk"
    cpu_run ceiling "$brun" "$brk" "-c pg_stat_statements.track=all"
    cpu_check ceiling "$brk"
    bench_psql -A -F, -P footer=off -c "
        SELECT calls, round((total_exec_time / calls * 1000)::numeric, 1) AS mean_us,
               '\"' || replace(left(regexp_replace(query, '\s+', ' ', 'g'), 110), '\"', '\"\"') || '\"' AS statement
        FROM pg_stat_statements
        WHERE calls >= $((brk / 2)) AND query !~* 'cpu_sample|pg_stat_statements_reset'
        ORDER BY total_exec_time DESC LIMIT 8" >"$BENCH_RESULTS/statements.csv"
fi

# --- Server log ---------------------------------------------------------------
CHECKS=$((CHECKS + 1))
problems=$(bench_server_problems)
if [ -z "$problems" ]; then
    echo "PASS  server log: no WARNING, ERROR, FATAL or PANIC"
else
    echo "FAIL  server log: $(printf '%s\n' "$problems" | wc -l) lines at WARNING or worse, e.g.:"
    printf '%s\n' "$problems" | head -n 5 | cut -c1-200 | sed 's/^/        /'
    FAILS=$((FAILS + 1))
fi

PG_VERSION=$(bench_psql -At -c "SHOW server_version")
bench_cleanup

{
    echo "key,value"
    echo "date,$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "git,$BENCH_GIT_REV"
    echo "quick,$QUICK"
    echo "seconds_per_run,$SECS"
    echo "cores,$(nproc 2>/dev/null || echo ?)"
    echo "memory_gb,$(awk '/MemTotal/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)"
    echo "load_at_end,$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "postgresql,${PG_VERSION%% *}"
    echo "redis,${R_VERSION:-not run}"
    echo "pgbouncer,$(pgbouncer --version 2>/dev/null | sed -n 's/^PgBouncer //p' | head -n 1)"
    echo "batch,$BATCH"
    echo "batch_stripes,$BATCH_STRIPES"
    echo "default_stripes,${DEFAULT_STRIPES:-}"
    echo "huge_pages,${BENCH_HUGE_PAGES:-try}"
    echo "warmup,$(warmup_for 16)/$(warmup_for 64)/$(warmup_for 256)"
    echo "cpu_claims,$CPU_CLAIMS"
    echo "cpu_rate,$CPU_RATE"
    echo "checks,$CHECKS"
    echo "fails,$FAILS"
} >"$BENCH_RESULTS/meta.csv"

# --- Reconciliation cost -------------------------------------------------------
if [ "${BENCH_RECONCILE:-1}" != 0 ]; then
    echo
    if ! BENCH_QUICK="$QUICK" BENCH_NO_REPORT=1 bash "$BENCH_HERE/reconcile_cost.sh"; then
        FAILS=$((FAILS + 1))
    fi
fi

# --- Group red packets -----------------------------------------------------------
if [ "${BENCH_GROUP:-1}" != 0 ]; then
    echo
    if ! BENCH_QUICK="$QUICK" BENCH_NO_REPORT=1 bash "$BENCH_HERE/group.sh"; then
        FAILS=$((FAILS + 1))
    fi
fi

echo
bash "$BENCH_HERE/report.sh" "$BENCH_RESULTS"

echo
if [ "$FAILS" -eq 0 ]; then
    echo "bench: all $CHECKS checks PASS; results in ${BENCH_RESULTS_SHOWN:-$BENCH_RESULTS}"
else
    echo "bench: $FAILS of $CHECKS checks FAIL"
    exit 1
fi
