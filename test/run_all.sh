#!/usr/bin/env bash
# The full test run of redpacket (what .ci/run calls):
#   1. test/setup.sh: packages (as root), build, install;
#   2. a copy of the tree (without .git) in a fresh temporary directory, owned
#      by postgres when run as root (initdb refuses root, and the clone may sit
#      where postgres cannot read), else by the calling user;
#   3. there, the checksums of the released SQL scripts, the allocator's own tests (`make alloc-test`), then `make
#      installcheck` one suite at a time (pg_regress, isolation, TAP; each
#      starts its own temporary instance), then the concurrency
#      stress run (test/stress/run.sh);
#   4. diffs and logs of whatever failed, and a last line "N passed, M failed"
#      counting suites.  Exits non-zero when any suite failed.
#
#   bash test/run_all.sh            as root (CI), or as a user with sudo
#
# Environment: PG_CONFIG; REDPACKET_SKIP_SETUP=1 (the extension is already
# built and installed); REDPACKET_KEEP_WORK=1 (keep the copy even on success).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG
unset PGHOST PGPORT PGUSER PGDATABASE PGSERVICE PGPASSWORD PGOPTIONS

passed=0
failed=0
failed_names=()
WORK=

summary() {
    echo
    echo "== summary"
    if [ "$failed" -gt 0 ]; then
        echo "failed: ${failed_names[*]}"
        [ -z "$WORK" ] || echo "the test tree with all logs is kept in $WORK"
    elif [ -n "$WORK" ] && [ "${REDPACKET_KEEP_WORK:-0}" != 1 ]; then
        rm -rf "$WORK"
    fi
    echo "$passed passed, $failed failed"
}

# Print a file (at most N lines of its end) under a heading.
show() {
    local file=$1 lines=${2:-400}
    [ -s "$file" ] || return 0
    echo "---- ${file#"$WORK"/} (last $lines lines) ----"
    tail -n "$lines" "$file"
}

# 1. Set-up -------------------------------------------------------------------
echo "== set-up"
if [ "${REDPACKET_SKIP_SETUP:-0}" = 1 ]; then
    echo "skipped (REDPACKET_SKIP_SETUP=1)"
elif ! bash "$ROOT/test/setup.sh"; then
    failed=1
    failed_names+=(setup)
    summary
    exit 1
fi

# Citus for the scale-out TAP tests (test/t/201_citus.pl and 202_citus_same_user.pl
# skip without it):
# built once from CITUS_SRC and cached in test/citus/build/.
if ! bash "$ROOT/test/citus/build.sh"; then
    failed=$((failed + 1))
    failed_names+=(citus-build)
fi

# 2. The copy, and who runs the tests ----------------------------------------
if [ "$(id -u)" -eq 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        echo "no postgres user: is postgresql-15 installed?" >&2
        failed=1
        failed_names+=(setup)
        summary
        exit 1
    fi
    RUNAS=(runuser -u postgres --)
    OWNER=postgres
else
    RUNAS=()
    OWNER=$(id -un)
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-test.XXXXXX")
tar -C "$ROOT" --exclude=./.git --exclude=./tmp_check --exclude=./tmp_check_iso \
    --exclude=./results --exclude=./test/output_iso --exclude=./log \
    --exclude=./test/citus/build -cf - . |
    tar -C "$WORK" -xf -
chmod 755 "$WORK"
[ "$(id -u)" -ne 0 ] || chown -R postgres: "$WORK"
echo "== testing a copy in $WORK as $OWNER"

# Run a command in the copy as the test user, under a time limit.
in_work() {
    local limit=$1
    shift
    timeout --kill-after=60 "$limit" "${RUNAS[@]}" env HOME="$WORK" \
        bash -c 'cd "$1" && shift && exec "$@"' _ "$WORK" "$@"
}

# suite NAME LIMIT DIAGNOSE COMMAND...: run one suite, count it, and on
# failure call DIAGNOSE to print what it left.
suite() {
    local name=$1 limit=$2 diagnose=$3 start rc
    shift 3
    echo
    echo "== $name"
    start=$(date +%s)
    in_work "$limit" "$@"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "== $name: PASS ($(( $(date +%s) - start )) s)"
    else
        failed=$((failed + 1))
        failed_names+=("$name")
        [ "$rc" -ne 124 ] || echo "== $name: timed out after $limit"
        "$diagnose"
        reap
        echo "== $name: FAIL, exit $rc ($(( $(date +%s) - start )) s)"
    fi
}

diag_regress() {
    show "$WORK/regression.diffs" 1000
    show "$WORK/tmp_check/log/postmaster.log" 100
}
diag_isolation() {
    show "$WORK/test/output_iso/regression.diffs" 1000
    show "$WORK/tmp_check_iso/log/postmaster.log" 100
}
diag_tap() {
    local f
    for f in "$WORK"/tmp_check/log/*; do
        [ -f "$f" ] && show "$f" 300
    done
}
diag_none() { :; }

# Stop any server a killed or failed suite left running in the copy.
reap() {
    local pidfile
    while IFS= read -r pidfile; do
        echo "stopping a server left behind in ${pidfile%/postmaster.pid}"
        "${RUNAS[@]}" "$("$PG_CONFIG" --bindir)/pg_ctl" -D "${pidfile%/postmaster.pid}" \
            -m immediate -w stop >/dev/null 2>&1 || true
    done < <(find "$WORK" -name postmaster.pid 2>/dev/null)
}

MAKE_ARGS=(PG_CONFIG="$PG_CONFIG")

# 3. The suites -----------------------------------------------------------------
# `make installcheck` runs pg_regress, isolation and TAP in one go and stops at
# the first that fails; one suite per call runs (and counts) each of them.
# Released install and upgrade scripts never change (README "Upgrading").
suite released-scripts 1m diag_none sha256sum --check --strict test/released.sha256
suite allocator 5m diag_none make alloc-test "${MAKE_ARGS[@]}"
if compgen -G "$WORK/sql/*.sql" | grep -qv '/redpacket--'; then
    suite regress 10m diag_regress make installcheck "${MAKE_ARGS[@]}" ISOLATION= TAP_TESTS=
else
    echo "== regress: no sql/*.sql tests, skipped"
fi
if compgen -G "$WORK/test/specs/*.spec" >/dev/null; then
    suite isolation 10m diag_isolation make installcheck "${MAKE_ARGS[@]}" REGRESS= TAP_TESTS=
else
    echo "== isolation: no test/specs/*.spec, skipped"
fi
if compgen -G "$WORK/test/t/*.pl" >/dev/null; then
    suite tap 30m diag_tap make installcheck "${MAKE_ARGS[@]}" REGRESS= ISOLATION=
else
    echo "== tap: no test/t/*.pl, skipped"
fi
suite stress 10m diag_none bash test/stress/run.sh

# The claim suites again with rp_claim's fast path forced through its SQL
# statement (redpacket.direct_claims = off, test/spi_path.conf): the
# executor-direct path (src/direct.c) is the default everywhere above, and
# both paths must pass.  TEMP_CONFIG reaches pg_regress and isolation
# (Makefile), PostgreSQL::Test::Cluster and the stress cluster (test/lib/cluster.sh).
SPI_TAP="test/t/013_wallet_cdc.pl test/t/101_crash.pl test/t/105_isolation_levels.pl test/t/106_claim_load.pl"
SPI=(env TEMP_CONFIG="$WORK/test/spi_path.conf")
suite regress-spi 10m diag_regress "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" ISOLATION= TAP_TESTS=
suite isolation-spi 10m diag_isolation "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" REGRESS= TAP_TESTS=
suite tap-spi 15m diag_tap "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" REGRESS= ISOLATION= \
    PROVE_TESTS="$SPI_TAP"
suite stress-spi 10m diag_none "${SPI[@]}" bash test/stress/run.sh

summary
[ "$failed" -eq 0 ]
