# Sourced by test/demo.sh and test/stress/run.sh: a throwaway PostgreSQL 15
# cluster with redpacket preloaded, living in one mktemp directory (data, unix
# socket, server log) and removed on exit.  initdb refuses root, so the scripts
# call rp_drop_root first, which re-runs them as the postgres user.
#
# After rp_cluster_start: PGHOST (the socket directory), PGPORT, PGDATABASE and
# PGUSER are exported, so psql and pgbench need no connection options.

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

# As root, copy the directory tree that holds the scripts (the clone may sit in
# a root-only place) to a temporary directory owned by postgres and run the
# script from there as postgres; returns the script's exit status.
#   rp_drop_root TREE SCRIPT_RELATIVE_TO_TREE ARGS...
rp_drop_root() {
    local tree=$1 script=$2 tmp rc
    shift 2
    [ "$(id -u)" -eq 0 ] || return 0
    if ! id postgres >/dev/null 2>&1; then
        echo "running as root and there is no postgres user: run test/setup.sh" >&2
        exit 1
    fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-scripts.XXXXXX")
    cp -a "$tree/." "$tmp/"
    chown -R postgres: "$tmp"
    chmod 755 "$tmp"
    set +e
    (cd "$tmp" && runuser -u postgres -- env HOME="$tmp" PG_CONFIG="$PG_CONFIG" \
        REDPACKET_SKIP_SETUP=1 bash "$tmp/$script" "$@")
    rc=$?
    set -e
    if [ "$rc" -ne 0 ] && [ -d "$tmp/$(dirname "$script")/out" ]; then
        echo "(kept $tmp)" >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}

rp_psql() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# A TCP port on 127.0.0.1 that nothing listens on.
rp_free_port() {
    local p i
    for i in $(seq 1 50); do
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
rp_cluster_stop() {
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
    if ! "$PGBIN/initdb" -D "$RP_DIR/data" -A trust -E UTF8 --locale=C --no-sync \
            >"$RP_DIR/initdb.log" 2>&1; then
        cat "$RP_DIR/initdb.log" >&2
        return 1
    fi
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$RP_DIR'"
        echo "shared_preload_libraries = 'redpacket'"
        echo "max_connections = 200"
        echo "max_locks_per_transaction = 256"
        echo "shared_buffers = 256MB"
        echo "timezone = 'UTC'"
        # Throwaway data: durability costs time and proves nothing here.
        echo "fsync = off"
        echo "synchronous_commit = off"
        echo "full_page_writes = off"
        echo "log_min_messages = warning"
        echo "log_line_prefix = '%m [%p] '"
        for line in "$@"; do
            echo "$line"
        done
    } >>"$RP_DIR/data/postgresql.conf"
    for try in 1 2 3 4 5; do
        PGPORT=$(rp_free_port)
        if "$PGBIN/pg_ctl" -D "$RP_DIR/data" -l "$RP_DIR/server.log" -w -t 60 \
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

# Lines of the server log at WARNING or worse (PANIC, FATAL, ERROR, WARNING),
# minus the ones a clean stop writes.
rp_server_problems() {
    grep -E '(WARNING|ERROR|FATAL|PANIC):' "$RP_DIR/server.log" |
        grep -v -E 'terminating (background worker|connection) .* due to administrator command' || true
}
