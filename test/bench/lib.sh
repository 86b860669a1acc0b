# shellcheck shell=bash
# Sourced by test/bench/run.sh and test/bench/reconcile_cost.sh: a throwaway
# PostgreSQL 15 cluster with redpacket preloaded and durable settings, living
# in one mktemp directory (data, unix socket, server log, pgbench logs) that is
# removed on exit, plus the root-to-postgres hand-over (initdb refuses root).
#
# After bench_cluster_start: PGHOST (the socket directory), PGPORT, PGDATABASE
# and PGUSER are exported, so psql and pgbench need no connection options.

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
if [ ! -x "$PG_CONFIG" ]; then
    PG_CONFIG=$(command -v pg_config || true)
fi
if [ -z "$PG_CONFIG" ]; then
    echo "no pg_config found: run test/setup.sh (as root) first" >&2
    exit 1
fi
PGBIN=$("$PG_CONFIG" --bindir)
export PG_CONFIG PGBIN

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
    mkdir -p "$tmp/results"
    if [ -d "$BENCH_RESULTS" ]; then
        # the record so far (report.sh renders results.md from all of it)
        cp -a "$BENCH_RESULTS/." "$tmp/results/"
    fi
    chown -R postgres: "$tmp"
    chmod 755 "$tmp"
    set +e
    (cd "$tmp" && runuser -u postgres -- env HOME="$tmp" PG_CONFIG="$PG_CONFIG" \
        BENCH_RESULTS="$tmp/results" BENCH_RESULTS_SHOWN="$BENCH_RESULTS" bash "$tmp/scripts/$script" "$@")
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

bench_psql() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# A TCP port on 127.0.0.1 that nothing listens on.
bench_free_port() {
    local p _
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    echo "no free port found" >&2
    return 1
}

BENCH_DIR=
BENCH_CLEANUP=()    # extra commands run on exit (stopping pgbouncer, redis)
bench_cleanup() {
    local c
    for c in "${BENCH_CLEANUP[@]}"; do
        eval "$c" >/dev/null 2>&1 || true
    done
    BENCH_CLEANUP=()
    [ -n "$BENCH_DIR" ] || return 0
    if [ -f "$BENCH_DIR/data/postmaster.pid" ]; then
        "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
            "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        echo "kept scratch directory $BENCH_DIR (server stopped)" >&2
    else
        rm -rf "$BENCH_DIR"
    fi
    BENCH_DIR=
}

# bench_cluster_start NAME [extra postgresql.conf lines...]
bench_cluster_start() {
    local name=$1 try line
    shift
    BENCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-$name.XXXXXX")
    trap 'bench_cleanup' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if ! "$PGBIN/initdb" -D "$BENCH_DIR/data" -A trust -E UTF8 --locale=C \
            >"$BENCH_DIR/initdb.log" 2>&1; then
        cat "$BENCH_DIR/initdb.log" >&2
        return 1
    fi
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$BENCH_DIR'"
        echo "shared_preload_libraries = 'redpacket'"
        echo "redpacket.reconcile_interval = 0"
        echo "max_connections = 400"
        echo "max_locks_per_transaction = 256"
        echo "shared_buffers = 1GB"
        echo "timezone = 'UTC'"
        # Durable, as in production: every commit waits for its WAL flush.
        echo "fsync = on"
        echo "synchronous_commit = on"
        echo "full_page_writes = on"
        # No checkpoint in the middle of a timed run (one is forced between runs).
        echo "max_wal_size = 16GB"
        echo "checkpoint_timeout = 1h"
        echo "log_min_messages = warning"
        echo "log_line_prefix = '%m [%p] '"
        for line in "$@"; do
            echo "$line"
        done
    } >>"$BENCH_DIR/data/postgresql.conf"
    for try in 1 2 3 4 5; do
        PGPORT=$(bench_free_port)
        if "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -l "$BENCH_DIR/server.log" -w -t 120 \
                -o "-p $PGPORT" start >/dev/null 2>&1; then
            break
        fi
        if [ "$try" = 5 ] || ! grep -q 'could not bind\|already in use' "$BENCH_DIR/server.log"; then
            echo "server did not start; its log:" >&2
            tail -n 50 "$BENCH_DIR/server.log" >&2
            return 1
        fi
    done
    PGHOST=$BENCH_DIR
    PGDATABASE=postgres
    PGUSER=$(id -un)
    export PGHOST PGPORT PGDATABASE PGUSER
    unset PGSERVICE PGPASSWORD PGOPTIONS
}

bench_cluster_restart() {
    "$PGBIN/pg_ctl" -D "$BENCH_DIR/data" -l "$BENCH_DIR/server.log" -w -t 120 -m fast \
        -o "-p $PGPORT" restart >/dev/null
}

# Lines of the server log at WARNING or worse, minus the ones a clean stop or
# an intended pgbench disconnect writes.
bench_server_problems() {
    grep -E '(WARNING|ERROR|FATAL|PANIC):' "$BENCH_DIR/server.log" |
        grep -v -E 'terminating (background worker|connection) .* due to administrator command' || true
}
