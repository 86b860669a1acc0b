#!/usr/bin/env bash
# make bench-citus: rp_claim throughput on a Citus cluster against a single
# node and against an empty delegated call, side by side in one run.
#
# Starts four servers of the same PostgreSQL build on loopback: a Citus
# coordinator and two workers (citus,redpacket preloaded; rp_distribute()),
# and a plain single node (redpacket only, no Citus).  Then, for ROUNDS
# rounds, each target in turn for SECONDS seconds at CLIENTS clients:
#   coord    SELECT status FROM redpacket.rp_claim(A, user, 0.01) through the
#            coordinator (delegated to the worker holding A)
#   coord2   the same, clients split over two activities, one on each worker
#   worker   the same statement directly on the worker holding A
#   single   the same statement on the single node
#   noop-coord, noop-single: a call of an empty PL/pgSQL function taking the
#            same arguments, distributed like rp_claim (colocated with
#            redpacket.activity, force_delegation), through the coordinator
#            and on the single node: the cost of a delegated call itself,
#            whatever the function does.  noop-coord is the reference line:
#            every target's rate is also given as a ratio to it, round by
#            round (coord / noop-coord is what redpacket's own work costs
#            through Citus).
# Every claim is by a new user; the activities are large enough never to run
# out.  After every run the invariants of its activities are checked (Σ claims
# + Σ stripes + returned = funded, one claim per key, no negative stripe,
# rp_reconcile(activity, true) ok); a violation stops the run.  pgbench
# retries a claim cancelled by a deadlock (up to 20 tries) and reports how
# many it retried; the coordinator's and workers' logs are searched for
# Citus's distributed deadlock detector cancels.
#
# Environment: PG_CONFIG (the build, default the system one), CLIENTS (16),
# SECONDS_PER_RUN (15), ROUNDS (2), STRIPES (64), CITUS_BENCH_PORT (57000:
# uses that port and the next three), CITUS_BENCH_KEEP=1 (leave the servers
# running and print how to reach them), PROTOCOL (pgbench -M: prepared,
# the default, or simple), CITUS_BENCH_OUT (the markdown written, default
# test/bench/results/citus.md).  Run as root or as postgres (initdb refuses
# root).  About 3 minutes with the defaults.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
CLIENTS=${CLIENTS:-16}
SECS=${SECONDS_PER_RUN:-15}
ROUNDS=${ROUNDS:-2}
STRIPES=${STRIPES:-64}
BASE=${CITUS_BENCH_PORT:-57000}
OUT=${CITUS_BENCH_OUT:-$HERE/results/citus.md}
PROTOCOL=${PROTOCOL:-prepared}

if [ "$(id -u)" -eq 0 ]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-bench-citus.XXXXXX")
    cp "${BASH_SOURCE[0]}" "$tmp/citus.sh"
    chown -R postgres: "$tmp"
    rc=0
    runuser -u postgres -- env PG_CONFIG="$PG_CONFIG" CLIENTS="$CLIENTS" SECONDS_PER_RUN="$SECS" \
        ROUNDS="$ROUNDS" STRIPES="$STRIPES" CITUS_BENCH_PORT="$BASE" PROTOCOL="$PROTOCOL" \
        CITUS_BENCH_KEEP="${CITUS_BENCH_KEEP:-0}" CITUS_BENCH_OUT="$tmp/out.md" \
        TMPDIR="$tmp" bash "$tmp/citus.sh" || rc=$?
    if [ -f "$tmp/out.md" ]; then
        cp "$tmp/out.md" "$OUT"
        chown --reference="$HERE" "$OUT" 2>/dev/null || true
        echo "written: $OUT"
    fi
    [ "${CITUS_BENCH_KEEP:-0}" = 1 ] || rm -rf "$tmp"
    exit $rc
fi

BIN=$("$PG_CONFIG" --bindir)
if [ ! -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
    echo "bench-citus: Citus is not installed in $("$PG_CONFIG" --pkglibdir) (run test/citus/build.sh)" >&2
    exit 1
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/rp-citus-bench.XXXXXX")
NAMES=(coord worker1 worker2 single)
port_of() { case $1 in coord) echo $BASE ;; worker1) echo $((BASE + 1)) ;;
            worker2) echo $((BASE + 2)) ;; single) echo $((BASE + 3)) ;; esac; }
q() { "$BIN/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port_of "$1")" -d postgres -c "$2"; }

stop_all() {
    local n
    [ "${CITUS_BENCH_KEEP:-0}" = 1 ] && { echo "kept: servers in $DIR, ports $BASE-$((BASE + 3))" >&2; return; }
    for n in "${NAMES[@]}"; do
        [ -f "$DIR/$n/postmaster.pid" ] && "$BIN/pg_ctl" -D "$DIR/$n" -m fast -w stop >/dev/null 2>&1
    done
    rm -rf "$DIR"
}
trap stop_all EXIT

for n in "${NAMES[@]}"; do
    "$BIN/initdb" -D "$DIR/$n" -A trust -E UTF8 --locale=C >"$DIR/$n.initdb.log" 2>&1
    libs="citus,redpacket"
    [ "$n" = single ] && libs=redpacket
    cat >>"$DIR/$n/postgresql.conf" <<EOF
port = $(port_of "$n")
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
shared_preload_libraries = '$libs'
max_connections = 200
shared_buffers = 256MB
fsync = off
synchronous_commit = off
full_page_writes = off
max_wal_size = 8GB
checkpoint_timeout = 1h
redpacket.reconcile_interval = 0
citus.node_conninfo = 'sslmode=disable'
log_min_messages = warning
EOF
    [ "$n" = single ] && sed -i '/^citus\./d' "$DIR/$n/postgresql.conf"
    "$BIN/pg_ctl" -D "$DIR/$n" -l "$DIR/$n.log" -w start >/dev/null
done
for n in coord worker1 worker2; do
    q $n "CREATE EXTENSION citus; CREATE EXTENSION redpacket;"
done
q single "CREATE EXTENSION redpacket;"
q coord "SELECT citus_set_coordinator_host('127.0.0.1', $BASE)" >/dev/null
q coord "SELECT citus_add_node('127.0.0.1', $((BASE + 1)))" >/dev/null
q coord "SELECT citus_add_node('127.0.0.1', $((BASE + 2)))" >/dev/null
q coord "SELECT redpacket.rp_distribute()" >/dev/null
for _ in $(seq 1 60); do
    [ "$(q coord "SELECT bool_and(metadatasynced) FROM pg_dist_node WHERE groupid <> 0")" = t ] && break
    sleep 1
done

# Activities on the coordinator until one sits on each worker.
holder() {
    q coord "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
              WHERE p.shardid = get_shard_id_for_distribution_column('redpacket.activity', $1)"
}
CREATE="redpacket.rp_create_activity(1000000.00, stripes => $STRIPES)"
A1= A2=
for _ in $(seq 1 40); do
    a=$(q coord "SELECT $CREATE")
    case $(holder "$a") in
        $((BASE + 1))) [ -n "$A1" ] || A1=$a ;;
        $((BASE + 2))) [ -n "$A2" ] || A2=$a ;;
    esac
    [ -n "$A1" ] && [ -n "$A2" ] && break
done
AS=$(q single "SELECT $CREATE")
NOOP="CREATE FUNCTION public.rp_bench_noop(activity bigint, user_id text, amount numeric)
      RETURNS text LANGUAGE plpgsql VOLATILE AS 'BEGIN RETURN ''claimed''; END'"
q coord "$NOOP" >/dev/null
q coord "SELECT create_distributed_function('public.rp_bench_noop(bigint,text,numeric)', '\$1',
           colocate_with := 'redpacket.activity', force_delegation := true)" >/dev/null
q single "$NOOP" >/dev/null
echo "activities: $A1 on worker1, $A2 on worker2, $AS on the single node" >&2

if [ "${CITUS_BENCH_KEEP:-0}" = 1 ] && [ "${CITUS_BENCH_SETUP_ONLY:-0}" = 1 ]; then
    exit 0
fi

# pgbench script: a new user per claim; coord2 splits clients over A1 and A2.
cat >"$DIR/one.pgbench" <<'EOF'
\set n random(1, 2000000000)
SELECT status FROM redpacket.rp_claim(:act, 'c' || :client_id || '-' || :n, 0.01);
EOF
cat >"$DIR/noop.pgbench" <<'EOF'
\set n random(1, 2000000000)
SELECT rp_bench_noop FROM public.rp_bench_noop(:act, 'c' || :client_id || '-' || :n, 0.01);
EOF
cat >"$DIR/two.pgbench" <<'EOF'
\set n random(1, 2000000000)
\set act case when :client_id % 2 = 0 then :a1 else :a2 end
SELECT status FROM redpacket.rp_claim(:act, 'c' || :client_id || '-' || :n, 0.01);
EOF

# Invariants of one activity on a node (coordinator for the Citus ones).
check() {
    local node=$1 aid=$2 r
    r=$(q "$node" "
      SELECT (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = $aid)
           + (SELECT sum(balance) FROM redpacket.stripe s WHERE s.activity_id = $aid)::numeric / 100
           + (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = $aid AND l.kind = 'return')
           = (SELECT sum(amount) FROM redpacket.ledger l WHERE l.activity_id = $aid AND l.kind = 'fund')
       AND NOT EXISTS (SELECT 1 FROM redpacket.claim c WHERE c.activity_id = $aid
                        GROUP BY user_id, idempotency_key HAVING count(*) > 1)
       AND NOT EXISTS (SELECT 1 FROM redpacket.stripe s WHERE s.activity_id = $aid AND s.balance < 0)")
    local rec=''
    for _ in $(seq 1 10); do
        rec=$(q "$node" "SELECT bool_and(ok) FROM redpacket.rp_reconcile($aid, true)")
        [ -n "$rec" ] && break
        sleep 0.5
    done
    if [ "$r" != t ] || [ "$rec" != t ]; then
        echo "INVARIANT VIOLATED on $node, activity $aid (sums/keys/stripes: $r, reconcile: $rec)" >&2
        exit 1
    fi
}

# CPU time of a group of servers so far, in clock ticks: every postmaster's
# own, its exited children's (the backends of a finished run) and its live
# children's (the WAL writer, the checkpointer, ...).
cpu_ticks() {
    local n p c sum=0 f
    for n in "$@"; do
        p=$(head -1 "$DIR/$n/postmaster.pid")
        read -r -a f < <(sed 's/.*) //' "/proc/$p/stat")
        sum=$((sum + f[11] + f[12] + f[13] + f[14]))
        for c in $(pgrep -P "$p"); do
            read -r -a f < <(sed 's/.*) //' "/proc/$c/stat" 2>/dev/null) || continue
            sum=$((sum + f[11] + f[12]))
        done
    done
    echo "$sum"
}

# Busy clock ticks of the whole machine so far (every core), and this
# shell's reaped children's (pgbench) CPU.
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
own_child_ticks() { sed 's/.*) //' "/proc/$$/stat" | awk '{print $14 + $15}'; }

declare -A TPS RETRIED FAILED CPU CPUCO LOADRUN OTHER
run() {
    local label=$1 node=$2 script=$3 vars=$4 out tps retr fail c0 c1 n servers
    local m0 m1 a0 a1 p0 p1 t0 t1
    servers=(coord worker1 worker2)
    [ "$node" = single ] && servers=(single)
    c0=$(cpu_ticks "${servers[@]}")
    k0=$(cpu_ticks coord)
    a0=$(cpu_ticks "${NAMES[@]}") m0=$(machine_ticks) p0=$(own_child_ticks) t0=$(date +%s%N)
    # shellcheck disable=SC2086
    out=$("$BIN/pgbench" -n -M "$PROTOCOL" -c "$CLIENTS" -j 2 -T "$SECS" --max-tries=20 -f "$DIR/$script" $vars \
          -h 127.0.0.1 -p "$(port_of "$node")" postgres 2>&1) || { echo "$out" >&2; exit 1; }
    sleep 1     # let the backends of the run exit and be counted
    c1=$(cpu_ticks "${servers[@]}")
    k1=$(cpu_ticks coord)
    a1=$(cpu_ticks "${NAMES[@]}") m1=$(machine_ticks) p1=$(own_child_ticks) t1=$(date +%s%N)
    # other work on the machine meanwhile: busy ticks not of our servers or pgbench
    OTHER[$label]="${OTHER[$label]:-} $(awk -v b=$((m1 - m0 - (a1 - a0) - (p1 - p0))) \
        -v t="$(getconf CLK_TCK)" -v s=$((t1 - t0)) -v c="$(nproc)" \
        'BEGIN {o = 100 * b / t / (s / 1e9) / c; printf "%.0f", o < 0 ? 0 : o}')"
    n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    CPU[$label]="${CPU[$label]:-} $(awk -v c=$((c1 - c0)) -v t="$(getconf CLK_TCK)" -v n="$n" \
        'BEGIN {printf "%.3f", c * 1000 / t / n}')"
    CPUCO[$label]="${CPUCO[$label]:-} $(awk -v c=$((k1 - k0)) -v t="$(getconf CLK_TCK)" -v n="$n" \
        'BEGIN {printf "%.3f", c * 1000 / t / n}')"
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
    retr=$(sed -n 's/^number of transactions retried: \([0-9]*\).*/\1/p' <<<"$out")
    fail=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
    TPS[$label]="${TPS[$label]:-} $tps"
    LOADRUN[$label]="${LOADRUN[$label]:-} $(cut -d' ' -f1 /proc/loadavg)"
    RETRIED[$label]=$(( ${RETRIED[$label]:-0} + ${retr:-0} ))
    FAILED[$label]=$(( ${FAILED[$label]:-0} + ${fail:-0} ))
    printf '%-7s %10s claims/s  retried %s failed %s  (load %s)\n' "$label" "$tps" "${retr:-0}" \
        "${fail:-0}" "$(cut -d' ' -f1 /proc/loadavg)" >&2
}

LOADS=()
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r" >&2
    LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
    run single single one.pgbench "-D act=$AS";            check single "$AS"
    run coord coord one.pgbench "-D act=$A1";              check coord "$A1"
    run noop-coord coord noop.pgbench "-D act=$A1"
    run worker worker1 one.pgbench "-D act=$A1";           check coord "$A1"
    run coord2 coord two.pgbench "-D a1=$A1 -D a2=$A2";    check coord "$A1"; check coord "$A2"
    run noop-single single noop.pgbench "-D act=$AS"
done

# Citus's distributed deadlock detector cancels, from every node's log.
cancels=0
for n in coord worker1 worker2; do
    c=$(grep -c 'distributed deadlock' "$DIR/$n.log" || true)
    cancels=$((cancels + c))
done
crashes=$(cat "$DIR"/coord.log "$DIR"/worker?.log | grep -c 'terminated by signal\|exited with exit code' || true)

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# The ratio that means something on a shared machine: each target against a
# reference target of the same round (run close by), then the median of those.
ratios() {
    local t=($1) s=($2) i out=''
    for i in "${!t[@]}"; do
        out+=" $(awk -v a="${t[$i]}" -v b="${s[$i]}" 'BEGIN {printf "%.2f", a / b}')"
    done
    echo "$out"
}
{
    echo "# bench-citus run $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "$CLIENTS clients, $SECS s per run, $ROUNDS rounds (order per round: single, coord, noop-coord,"
    echo "worker, coord2, noop-single),"
    echo "one activity of 1,000,000.00 in $STRIPES stripes per target, rp_claim of 0.01 by a new user each,"
    echo "pgbench -M $PROTOCOL, fsync off on every server; $(nproc) cores shared with other work;"
    echo "1-minute load average at each round's start: ${LOADS[*]}."
    echo "Citus $(q coord "SELECT extversion FROM pg_extension WHERE extname = 'citus'"),"
    echo "redpacket $(q coord "SELECT extversion FROM pg_extension WHERE extname = 'redpacket'")."
    echo
    echo "| target | calls/s per round | median calls/s | vs single node, per round | median | vs noop-coord, per round | median | retried | failed |"
    echo "|---|---|---:|---|---:|---|---:|---:|---:|"
    for l in coord coord2 worker single noop-coord noop-single; do
        r=$(ratios "${TPS[$l]}" "${TPS[single]}")
        e=$(ratios "${TPS[$l]}" "${TPS[noop-coord]}")
        printf '| %s | %s | %.0f | %s | %.2fx | %s | %.2fx | %s | %s |\n' "$l" \
            "$(echo ${TPS[$l]} | sed 's/\.[0-9]*//g; s/ /, /g')" "$(median <<<"${TPS[$l]}")" \
            "$(echo $r | sed 's/ /, /g')" "$(median <<<"$r")" \
            "$(echo $e | sed 's/ /, /g')" "$(median <<<"$e")" "${RETRIED[$l]}" "${FAILED[$l]}"
    done
    echo
    echo "Reference line: the empty delegated call (noop-coord), $(median <<<"${TPS[noop-coord]}" | awk '{printf "%.0f", $1}') calls/s; a claim through"
    echo "the coordinator runs at $(median <<<"$(ratios "${TPS[coord]}" "${TPS[noop-coord]}")")x its rate (median of the rounds). On the $(nproc) cores every server"
    echo "and pgbench share, $(awk -v c="$(nproc)" -v r="$(median <<<"${TPS[noop-coord]}")" 'BEGIN {printf "%.3f", c * 1000 / r}') ms of the machine per empty delegated call,"
    echo "$(awk -v c="$(nproc)" -v r="$(median <<<"${TPS[coord]}")" 'BEGIN {printf "%.3f", c * 1000 / r}') ms per claim through the coordinator, $(awk -v c="$(nproc)" -v r="$(median <<<"${TPS[single]}")" 'BEGIN {printf "%.3f", c * 1000 / r}') ms per claim on the single node."
    echo
    echo "Server CPU per claim (all servers of the target: the three Citus nodes, or the single"
    echo "node; includes connection start-up), less sensitive to the other load than claims/s:"
    echo
    echo "| target | ms CPU per claim, per round | median | of which the coordinator | single node / target |"
    echo "|---|---|---:|---:|---:|"
    sc=$(median <<<"${CPU[single]}")
    for l in coord coord2 worker single noop-coord noop-single; do
        m=$(median <<<"${CPU[$l]}")
        printf '| %s | %s | %.3f | %.3f | %.2fx |\n' "$l" "$(echo ${CPU[$l]} | sed 's/ /, /g')" "$m" \
            "$(median <<<"${CPUCO[$l]}")" "$(awk -v a="$sc" -v b="$m" 'BEGIN {print a / b}')"
    done
    ms() { awk -v c="$(nproc)" -v r="$(median <<<"${TPS[$1]}")" 'BEGIN {printf "%.3f", c * 1000 / r}'; }
    echo
    echo "What a claim adds to a call, in machine time per call (cores / calls per second,"
    echo "pgbench included): through the coordinator $(awk -v a="$(ms coord)" -v b="$(ms noop-coord)" 'BEGIN {printf "%.3f", a - b}') ms (coord - noop-coord),"
    echo "on the single node $(awk -v a="$(ms single)" -v b="$(ms noop-single)" 'BEGIN {printf "%.3f", a - b}') ms (single - noop-single)."
    echo "1-minute load average at the end of each run (our servers and pgbench count in it):"
    echo "$(for l in single coord noop-coord worker coord2 noop-single; do printf '%s %s; ' "$l" "${LOADRUN[$l]# }"; done)"
    echo "CPU of other work on the machine during each run, % of its $(nproc) cores (busy time"
    echo "less our four servers' and pgbench's):"
    echo "$(for l in single coord noop-coord worker coord2 noop-single; do printf '%s %s; ' "$l" "${OTHER[$l]# }"; done)"
    echo
    echo "coord: through the coordinator, delegated to worker1; coord2: clients split over two"
    echo "activities, one on each worker; worker: directly on worker1; single: plain PostgreSQL;"
    echo "noop-*: the empty distributed function (no claim), through the coordinator and on the single node."
    echo "Invariants checked after every run: ok. Distributed deadlock cancels in the logs: $cancels."
    echo "Server crashes in the Citus nodes' logs: $crashes."
} >"$OUT"
cat "$OUT"
