# shellcheck shell=bash
# Sourced by the benchmark scripts (run.sh, reconcile_cost.sh, shed.sh, ...): the throwaway
# cluster of test/lib/cluster.sh with durable settings (BENCH_DIR is its
# directory, which also holds the pgbench logs), plus the root-to-postgres
# hand-over that copies the results back (initdb refuses root).

# shellcheck source=test/lib/cluster.sh
source "$BENCH_HERE/../lib/cluster.sh"

# Durable, as in production: every commit waits for its WAL flush; no
# checkpoint in the middle of a timed run (one is forced between runs).
# Shared memory in huge pages when the host has them (BENCH_HUGE_PAGES, set by
# the root hand-over below): with 4 kB pages every backend maps each page of
# shared_buffers it touches, and on this project's virtual machines those
# page-table updates made 256 clients cost 2-3 times the CPU a transaction
# that 16 clients cost (the ceiling fell to 0.37x of its 16-client rate; with
# huge pages 1.1x).  Production PostgreSQL with many connections runs so.
RP_CONF=("redpacket.reconcile_interval = 0" "max_connections = 400" "shared_buffers = 1GB"
         "fsync = on" "synchronous_commit = on" "full_page_writes = on"
         "max_wal_size = 16GB" "checkpoint_timeout = 1h" "huge_pages = ${BENCH_HUGE_PAGES:-try}")
[ "${BENCH_KEEP:-0}" != 1 ] || REDPACKET_KEEP_CLUSTER=1

# The committed record of the last run; BENCH_RESULTS overrides it (the root
# hand-over points it at a postgres-owned directory and copies back).
BENCH_RESULTS=${BENCH_RESULTS:-$BENCH_HERE/results}

# As root, unless BENCH_HUGE_PAGES is set already (off, on, try): reserve the
# 2 MB huge pages the cluster's shared memory needs (1 GB shared_buffers and
# the rest: BENCH_HUGE_PAGES_N, 700) if the host has fewer free, and give
# back what was added at exit.  Sets BENCH_HUGE_PAGES to on when they are
# there, else to off (and says why).
bench_huge_pages() {
    local want=${BENCH_HUGE_PAGES_N:-700} total free
    [ -z "${BENCH_HUGE_PAGES:-}" ] || return 0
    BENCH_HUGE_PAGES=off
    total=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null) || return 0
    free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
    if [ "${free:-0}" -lt "$want" ]; then
        BENCH_HUGE_PAGES_RESTORE=$total
        echo $((total + want - free)) >/proc/sys/vm/nr_hugepages 2>/dev/null || true
        free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
    fi
    if [ "${free:-0}" -ge "$want" ]; then
        BENCH_HUGE_PAGES=on
    else
        echo "bench: could not reserve $want huge pages ($free free): shared memory in 4 kB pages" >&2
    fi
}
bench_huge_pages_restore() {
    [ -z "${BENCH_HUGE_PAGES_RESTORE:-}" ] || echo "$BENCH_HUGE_PAGES_RESTORE" >/proc/sys/vm/nr_hugepages
}

# As root: copy test/bench to a temporary directory owned by postgres, run the
# script from there as postgres with its results written to a postgres-owned
# directory, then copy the results back into the repository (owned like the
# repository's test/bench).  Exits with the script's status.
#   bench_drop_root SCRIPT ARGS...
bench_drop_root() {
    local script=$1 tmp rc owner
    shift
    [ "$(id -u)" -eq 0 ] || return 0
    bench_huge_pages
    if ! id postgres >/dev/null 2>&1; then
        echo "running as root and there is no postgres user: run test/setup.sh" >&2
        exit 1
    fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-bench-scripts.XXXXXX")
    cp -a "$BENCH_HERE/." "$tmp/scripts/"
    cp -a "$BENCH_HERE/../lib" "$tmp/lib"
    mkdir -p "$tmp/results"
    if [ -d "$BENCH_RESULTS" ]; then
        # the record so far (report.sh renders results.md from all of it)
        cp -a "$BENCH_RESULTS/." "$tmp/results/"
    fi
    chown -R postgres: "$tmp"
    chmod 755 "$tmp"
    set +e
    (cd "$tmp" && runuser -u postgres -- env HOME="$tmp" PG_CONFIG="$PG_CONFIG" \
        BENCH_PORTS="${BENCH_PORTS:-}" BENCH_HUGE_PAGES="$BENCH_HUGE_PAGES" \
        BENCH_RESULTS="$tmp/results" BENCH_RESULTS_SHOWN="$BENCH_RESULTS" bash "$tmp/scripts/$script" "$@")
    rc=$?
    bench_huge_pages_restore
    set -e
    owner=$(stat -c '%u:%g' "$BENCH_HERE")
    [ -d "$BENCH_RESULTS" ] || { mkdir -p "$BENCH_RESULTS"; chown "$owner" "$BENCH_RESULTS"; }
    # Only the result files these scripts write travel back (never logs, and
    # never files other tools keep in the same directory).
    local f
    for f in bench.csv cpu.csv statements.csv meta.csv reconcile.csv reconcile_meta.csv \
             group.csv group_lag.csv group_meta.csv results.md throughput.png; do
        if [ -f "$tmp/results/$f" ] && ! cmp -s "$tmp/results/$f" "$BENCH_RESULTS/$f"; then
            cp "$tmp/results/$f" "$BENCH_RESULTS/$f"
            chown "$owner" "$BENCH_RESULTS/$f"
        fi
    done
    # ... and a file this run removed (run.sh clears its record) is removed.
    for f in bench.csv cpu.csv statements.csv meta.csv throughput.png; do
        [ -f "$tmp/results/$f" ] || rm -f "$BENCH_RESULTS/$f"
    done
    rm -rf "$tmp"
    exit "$rc"
}

# BENCH_PORTS="LOW-HIGH": take every TCP port (the server's, PgBouncer's,
# Redis's) from that range instead of anywhere in 20000-59999, for a machine
# where each user has a range of its own.
if [ -n "${BENCH_PORTS:-}" ]; then
    rp_free_port() {
        local lo=${BENCH_PORTS%-*} hi=${BENCH_PORTS#*-} p _
        for _ in $(seq 1 50); do
            p=$((lo + RANDOM % (hi - lo + 1)))
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
                echo "$p"
                return 0
            fi
        done
        echo "no free port in $BENCH_PORTS" >&2
        return 1
    }
fi

# The measured window of a run, from pgbench's per-transaction logs on stdin
# (client, xact, latency us, script, end s, end us): the transactions that
# started from WARM seconds after the first start, for SECS seconds (less if
# the run ended sooner: connecting hundreds of clients on a loaded machine
# eats into pgbench's -T; then the last SECS seconds, or all of it).  Every
# transaction started completes, so none is cut off.  Prints
# "calls p50_ms p99_ms window_s start end" (start and end of the window in
# seconds since the epoch, by the clients' clock).
bench_window() {   # bench_window WARM SECS
    awk -v secs="$2" -v warm="$1" '
        { s = $5 + $6 / 1e6 - $3 / 1e6; st[NR] = s; l[NR] = $3
          if (NR == 1 || s < smin) smin = s; if (NR == 1 || s > smax) smax = s }
        END {
            lo = smin + warm
            if (smax - lo < secs / 2) lo = (smax - secs > smin) ? smax - secs : smin
            hi = (lo + secs < smax) ? lo + secs : smax
            if (hi <= lo) hi = lo + 0.001
            printf "W %.3f %.6f %.6f\n", hi - lo, lo, hi
            for (i = 1; i <= NR; i++) if (st[i] >= lo && st[i] < hi) print l[i]
        }' | sort -k1,1 -g | awk '
        $1 == "W" { w = $2; lo = $3; hi = $4; next }
        { v[++n] = $1 }
        END {
            if (n == 0) { printf "0 NA NA %s %s %s\n", (w == "" ? 0 : w), lo + 0, hi + 0; exit }
            i50 = int(n * 0.50 + 0.999999); if (i50 < 1) i50 = 1
            i99 = int(n * 0.99 + 0.999999); if (i99 < 1) i99 = 1
            printf "%d %.3f %.3f %s %s %s\n", n, v[i50] / 1000, v[i99] / 1000, w, lo, hi
        }'
}

# The benchmark scripts' names for the shared library's functions.
bench_psql() { rp_psql "$@"; }
bench_free_port() { rp_free_port; }
bench_cluster_start() { rp_cluster_start "$@" && BENCH_DIR=$RP_DIR; }
bench_cluster_restart() { rp_cluster_restart; }
bench_cleanup() { rp_cluster_stop; BENCH_DIR=; }
bench_server_problems() { rp_server_problems; }
BENCH_DIR=
