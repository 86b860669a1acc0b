# Sourced by test/demo.sh and test/stress/run.sh: the throwaway cluster of
# test/lib/cluster.sh with settings for speed (no durability), and the
# root-to-postgres hand-over: initdb refuses root, so the scripts call
# rp_drop_root first, which re-runs them as the postgres user.

# shellcheck source=test/lib/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cluster.sh"

# Throwaway data: durability costs time and proves nothing here.
RP_CONF=("max_connections = 200" "shared_buffers = 256MB"
         "fsync = off" "synchronous_commit = off" "full_page_writes = off")
RP_INITDB_OPTS=(--no-sync)

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
