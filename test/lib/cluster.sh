# shellcheck shell=bash
# Shell library shared by the scripts that run a throwaway PostgreSQL 15
# cluster with redpacket preloaded (test/stress/cluster.sh for the stress run
# and the demo, test/bench/lib.sh for the benchmarks): one mktemp directory
# holds the data, the unix socket and the server log, and is removed on exit.
#
#   RP_CONF=(lines...)            postgresql.conf lines of the caller's profile
#   RP_INITDB_OPTS=(options...)   extra initdb options
#   rp_cluster_start NAME [lines...]   start it (lines after the profile's)
#   rp_cluster_restart / rp_cluster_stop
#   RP_CLEANUP+=("command")       run on stop (pgbouncer, redis, ...)
#   rp_psql, rp_free_port, rp_server_problems
#
# After rp_cluster_start: RP_DIR is the directory; PGHOST (the socket
# directory), PGPORT, PGDATABASE and PGUSER are exported, so psql and pgbench
# need no connection options.  REDPACKET_KEEP_CLUSTER=1 keeps the directory.

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

rp_psql() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# A TCP port on 127.0.0.1 that nothing listens on.
rp_free_port() {
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

RP_DIR=
RP_CLEANUP=()
[ -n "${RP_CONF+x}" ] || RP_CONF=()
[ -n "${RP_INITDB_OPTS+x}" ] || RP_INITDB_OPTS=()

rp_cluster_stop() {
    local c
    for c in "${RP_CLEANUP[@]}"; do
        eval "$c" >/dev/null 2>&1 || true
    done
    RP_CLEANUP=()
    [ -n "$RP_DIR" ] || return 0
    if [ -f "$RP_DIR/data/postmaster.pid" ]; then
        "$PGBIN/pg_ctl" -D "$RP_DIR/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
            "$PGBIN/pg_ctl" -D "$RP_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ "${REDPACKET_KEEP_CLUSTER:-0}" = 1 ]; then
        echo "kept cluster directory $RP_DIR (server stopped)" >&2
    else
        rm -rf "$RP_DIR"
    fi
    RP_DIR=
}

# rp_cluster_start NAME [extra postgresql.conf lines...]
rp_cluster_start() {
    local name=$1 try line
    shift
    RP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-$name.XXXXXX")
    trap 'rp_cluster_stop' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if ! "$PGBIN/initdb" -D "$RP_DIR/data" -A trust -E UTF8 --locale=C "${RP_INITDB_OPTS[@]}" \
            >"$RP_DIR/initdb.log" 2>&1; then
        cat "$RP_DIR/initdb.log" >&2
        return 1
    fi
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$RP_DIR'"
        echo "shared_preload_libraries = 'redpacket'"
        echo "max_locks_per_transaction = 256"
        echo "timezone = 'UTC'"
        echo "log_min_messages = warning"
        echo "log_line_prefix = '%m [%p] '"
        for line in "${RP_CONF[@]}" "$@"; do
            echo "$line"
        done
        # extra settings, as PostgreSQL's own test clusters take them
        [ -z "${TEMP_CONFIG:-}" ] || cat "$TEMP_CONFIG"
    } >>"$RP_DIR/data/postgresql.conf"
    for try in 1 2 3 4 5; do
        PGPORT=$(rp_free_port)
        if "$PGBIN/pg_ctl" -D "$RP_DIR/data" -l "$RP_DIR/server.log" -w -t 120 \
                -o "-p $PGPORT" start >/dev/null 2>&1; then
            break
        fi
        if [ "$try" = 5 ] || ! grep -q 'could not bind\|already in use' "$RP_DIR/server.log"; then
            echo "server did not start; its log:" >&2
            tail -n 50 "$RP_DIR/server.log" >&2
            return 1
        fi
    done
    PGHOST=$RP_DIR
    PGDATABASE=postgres
    PGUSER=$(id -un)
    export PGHOST PGPORT PGDATABASE PGUSER
    unset PGSERVICE PGPASSWORD PGOPTIONS
}

rp_cluster_restart() {
    "$PGBIN/pg_ctl" -D "$RP_DIR/data" -l "$RP_DIR/server.log" -w -t 120 -m fast \
        -o "-p $PGPORT" restart >/dev/null
}

# Lines of the server log at WARNING or worse (PANIC, FATAL, ERROR, WARNING),
# minus the ones a clean stop or an intended disconnect writes.
rp_server_problems() {
    grep -E '(WARNING|ERROR|FATAL|PANIC):' "$RP_DIR/server.log" |
        grep -v -E 'terminating (background worker|connection) .* due to administrator command' || true
}
