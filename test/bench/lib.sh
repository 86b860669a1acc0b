# shellcheck shell=bash
# Sourced by test/bench/run.sh and test/bench/reconcile_cost.sh: the throwaway
# cluster of test/lib/cluster.sh with durable settings (BENCH_DIR is its
# directory, which also holds the pgbench logs), plus the root-to-postgres
# hand-over that copies the results back (initdb refuses root).

# shellcheck source=test/lib/cluster.sh
source "$BENCH_HERE/../lib/cluster.sh"

# Durable, as in production: every commit waits for its WAL flush; no
# checkpoint in the middle of a timed run (one is forced between runs).
RP_CONF=("redpacket.reconcile_interval = 0" "max_connections = 400" "shared_buffers = 1GB"
         "fsync = on" "synchronous_commit = on" "full_page_writes = on"
         "max_wal_size = 16GB" "checkpoint_timeout = 1h")
[ "${BENCH_KEEP:-0}" != 1 ] || REDPACKET_KEEP_CLUSTER=1

# The committed record of the last run; BENCH_RESULTS overrides it (the root
# hand-over points it at a postgres-owned directory and copies back).
BENCH_RESULTS=${BENCH_RESULTS:-$BENCH_HERE/results}

# As root: copy test/bench to a temporary directory owned by postgres, run the
# script from there as postgres with its results written to a postgres-owned
# directory, then copy the results back into the repository (owned like the
# repository's test/bench).  Exits with the script's status.
#   bench_drop_root SCRIPT ARGS...
bench_drop_root() {
    local script=$1 tmp rc owner
    shift
    [ "$(id -u)" -eq 0 ] || return 0
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
        BENCH_PORTS="${BENCH_PORTS:-}" BENCH_RESULTS="$tmp/results" BENCH_RESULTS_SHOWN="$BENCH_RESULTS" bash "$tmp/scripts/$script" "$@")
    rc=$?
    set -e
    owner=$(stat -c '%u:%g' "$BENCH_HERE")
    [ -d "$BENCH_RESULTS" ] || { mkdir -p "$BENCH_RESULTS"; chown "$owner" "$BENCH_RESULTS"; }
    # Only the result files these scripts write travel back (never logs, and
    # never files other tools keep in the same directory).
    local f
    for f in bench.csv cpu.csv statements.csv meta.csv reconcile.csv reconcile_meta.csv \
             results.md throughput.png; do
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

# The benchmark scripts' names for the shared library's functions.
bench_psql() { rp_psql "$@"; }
bench_free_port() { rp_free_port; }
bench_cluster_start() { rp_cluster_start "$@" && BENCH_DIR=$RP_DIR; }
bench_cluster_restart() { rp_cluster_restart; }
bench_cleanup() { rp_cluster_stop; BENCH_DIR=; }
bench_server_problems() { rp_server_problems; }
BENCH_DIR=
