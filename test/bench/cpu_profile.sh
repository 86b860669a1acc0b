#!/usr/bin/env bash
# perf profile of one backend making CPU_OPS rp_claim calls (direct path),
# then of one making as many ceiling inserts, on a throwaway cluster with
# cpu_paths.sh's settings (synchronous_commit off in the session).  Prints,
# for each, the share of the backend's samples under the functions that
# make up a claim (inclusive, perf report --children), and keeps the
# perf.data files in CPU_PROFILE_DIR.  Needs linux-perf; run as root (perf
# attaches to the backend; the cluster runs as postgres).
#
# Environment: CPU_OPS (100000), CPU_STRIPES (64, the redpacket.stripes
# default), CPU_PROFILE_DIR (/tmp/redpacket-cpu-profile).
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "run as root (perf attaches to a postgres backend)" >&2; exit 1; }

OPS=${CPU_OPS:-100000}
STRIPES=${CPU_STRIPES:-64}
OUT=${CPU_PROFILE_DIR:-/tmp/redpacket-cpu-profile}
ANCHORS="PortalRun ExecMakeTableFunctionResult fmgr_security_definer ProcessGUCArray AtEOXact_GUC
rp_claim RpClaimOne RpLockUser RpAmountToUnits RpStatsCount RpTake RpDirectTake FetchByKey
heap_page_prune_opt heap_update heap_insert ExecInsertIndexTuples nextval_internal OpenTarget
standard_ExecutorStart ExecInitModifyTable CommitTransactionCommand LockReleaseAll"
mkdir -p "$OUT"
chmod 755 "$OUT"

as_pg() { runuser -u postgres --preserve-environment -- "$@"; }
RP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-cpu_profile.XXXXXX")
chown postgres: "$RP_DIR"
trap 'as_pg "$PGBIN/pg_ctl" -D "$RP_DIR/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$RP_DIR"' EXIT
as_pg "$PGBIN/initdb" -D "$RP_DIR/data" -A trust -E UTF8 --locale=C >/dev/null
PGPORT=$(bench_free_port)
export PGHOST=$RP_DIR PGPORT PGDATABASE=postgres PGUSER=postgres
printf '%s\n' "port = $PGPORT" "unix_socket_directories = '$RP_DIR'" "listen_addresses = ''" \
    "shared_preload_libraries = 'redpacket'" "redpacket.reconcile_interval = 0" \
    "shared_buffers = 1GB" "max_wal_size = 16GB" "checkpoint_timeout = 1h" >>"$RP_DIR/data/postgresql.conf"
as_pg "$PGBIN/pg_ctl" -D "$RP_DIR/data" -l "$RP_DIR/log" -w start >/dev/null
as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -f "$BENCH_HERE/setup.sql" -f "$BENCH_HERE/cpu.sql" >/dev/null

profile() {   # profile KIND ACT
    local kind=$1 act=$2 pg pid
    as_pg "$PGBIN/psql" -X -q -c CHECKPOINT
    PGOPTIONS="-c synchronous_commit=off" as_pg "$PGBIN/pgbench" -n -M prepared -c 1 -t "$OPS" \
        -D act="$act" -D n=0 -D step="$OPS" -f "$BENCH_HERE/cpu_$kind.pgbench" >"$OUT/$kind.pgbench.out" 2>&1 &
    pg=$!
    sleep 0.5
    pid=$(as_pg "$PGBIN/psql" -X -At -c "SELECT pid FROM pg_stat_activity
            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    perf record -g -o "$OUT/$kind.data" -p "$pid" >/dev/null 2>&1 &
    wait "$pg"
    sleep 1
    echo "== $kind x $OPS: % of the backend's samples under each function (inclusive)"
    perf report -i "$OUT/$kind.data" --children -g none --sort symbol 2>/dev/null |
        awk -v list="$ANCHORS" 'BEGIN { n = split(list, a, /[ \n]+/); for (i = 1; i <= n; i++) want[a[i]] = 1 }
            /^#/ && /Samples/ { print "  " $0 }
            !/^#/ && ($4 in want) { printf "  %7s  %s\n", $1, $4 }'
}
profile rp_claim "$(as_pg "$PGBIN/psql" -X -At -c "SELECT redpacket.rp_create_activity(1000000000000, stripes => $STRIPES)")"
profile ceiling "$(as_pg "$PGBIN/psql" -X -At -c "SELECT bench.new_run(1000000000000)")"
echo "perf data: $OUT/rp_claim.data $OUT/ceiling.data (perf report -i FILE --no-children)"
