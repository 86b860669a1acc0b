#!/usr/bin/env bash
# The full test run of redpacket (what .ci/run calls):
#   1. test/setup.sh: packages (as root), build, install;
#   2. a copy of the tree (without .git) in a fresh temporary directory, owned
#      by postgres when run as root (initdb refuses root, and the clone may sit
#      where postgres cannot read), else by the calling user;
#   3. there, the checksums of the released SQL scripts, the allocator's own tests (`make alloc-test`), the
#      lock protocol's model (test/model/locks_model.py), then `make
#      installcheck` one suite at a time (pg_regress, isolation, TAP; each
#      starts its own temporary instance), then the concurrency
#      stress run (test/stress/run.sh);
#   4. PostgreSQL 18: test/pg18/build.sh builds it from its release source
#      (cached in test/pg18/build/), a second copy of the tree builds and
#      installs redpacket into a copy of that installation, and the
#      regression, isolation and TAP suites run there too, on both claim
#      paths, and the stress run on the direct path (the one whose executor
#      calls differ between the majors), with the pg_upgrade test from
#      PostgreSQL 15; the TAP tests that need Citus or pg_cron are left out,
#      named, since neither has a build for 18 here;
#   5. diffs and logs of whatever failed, and a last line "N passed, M failed"
#      counting suites (each named after the major it ran on, e.g.
#      regress-15, regress-18).  Exits non-zero when any suite failed.
#
#   bash test/run_all.sh            as root (CI), or as a user with sudo
#
# Environment: PG_CONFIG (the main major, default PostgreSQL 15's);
# REDPACKET_SKIP_SETUP=1 (the extension is already built and installed);
# REDPACKET_KEEP_WORK=1 (keep the copies even on success); REDPACKET_NO_PG18=1
# (skip step 4); PG18_SRC, PG18_BUILD_DIR (test/pg18/build.sh).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG
unset PGHOST PGPORT PGUSER PGDATABASE PGSERVICE PGPASSWORD PGOPTIONS

passed=0
failed=0
failed_names=()
WORK=
WORK18=
LOGS=           # each suite's output (set once the copy is made)
TREE=           # the copy the current suites run in ($WORK, then $WORK18)
SUITE_PG_CONFIG=$PG_CONFIG

# The major version of a pg_config's PostgreSQL, e.g. 15.
pg_major() { "$1" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/'; }
MAJOR=$(pg_major "$PG_CONFIG" 2>/dev/null || echo 15)

summary() {
    local name
    echo
    echo "== summary"
    if [ "$failed" -gt 0 ]; then
        # What each failed suite reported, again, where the end of a long
        # log shows it: its failing tests and the lines that say why.
        for name in "${failed_names[@]}"; do
            [ -n "$LOGS" ] && [ -s "$LOGS/$name.out" ] || continue
            echo "---- $name: what failed (all of it: $LOGS/$name.out) ----"
            grep -E '^not ok|^# +Failed test|^# +(got|expected):|Dubious|Parse errors|FAILED|^test/t/.*\.\. *$|^t/.*\.\. *$|Non-zero exit|Failed [0-9]+/|No plan found|timed out' \
                "$LOGS/$name.out" | head -n 60
        done
        echo "failed: ${failed_names[*]}"
        [ -z "$WORK" ] || echo "the test tree with all logs is kept in $WORK"
        [ -z "$LOGS" ] || echo "each suite's output (and a failed TAP suite's logs) is kept in $LOGS"
        [ -z "$WORK18" ] || echo "the PostgreSQL 18 test tree is kept in $WORK18"
    elif [ "${REDPACKET_KEEP_WORK:-0}" != 1 ]; then
        [ -z "$WORK" ] || rm -rf "$WORK"
        [ -z "$WORK18" ] || rm -rf "$WORK18"
        [ -z "$LOGS" ] || rm -rf "$LOGS"
    fi
    echo "$passed passed, $failed failed"
}

# Print a file (at most N lines of its end) under a heading.
show() {
    local file=$1 lines=${2:-400}
    [ -s "$file" ] || return 0
    echo "---- ${file#"$TREE"/} (last $lines lines) ----"
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
# A copy of the tree (without .git, build caches and test output) in a new
# temporary directory, owned by the test user; prints its path.
copy_tree() {
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-test$1.XXXXXX")
    tar -C "$ROOT" --exclude=./.git --exclude=./tmp_check --exclude=./tmp_check_iso \
        --exclude=./results --exclude=./test/output_iso --exclude=./log \
        --exclude=./test/citus/build --exclude=./test/pg18/build -cf - . |
        tar -C "$dir" -xf -
    chmod 755 "$dir"
    [ "$(id -u)" -ne 0 ] || chown -R postgres: "$dir"
    echo "$dir"
}
WORK=$(copy_tree "")
TREE=$WORK
# Each suite's whole output, kept for the summary (outside the copies, which
# a later suite's `make installcheck` may clean).
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-logs.XXXXXX")
echo "== testing a copy in $WORK as $OWNER"

# Run a command in the current copy as the test user, under a time limit.
in_work() {
    local limit=$1
    shift
    timeout --kill-after=60 "$limit" "${RUNAS[@]}" env HOME="$TREE" \
        bash -c 'cd "$1" && shift && exec "$@"' _ "$TREE" "$@"
}

# suite NAME LIMIT DIAGNOSE COMMAND...: run one suite, count it, and on
# failure call DIAGNOSE to print what it left.
suite() {
    local name=$1 limit=$2 diagnose=$3 start rc
    shift 3
    echo
    echo "== $name"
    start=$(date +%s)
    in_work "$limit" "$@" 2>&1 | tee "$LOGS/$name.out"
    rc=${PIPESTATUS[0]}
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
    show "$TREE/regression.diffs" 1000
    show "$TREE/tmp_check/log/postmaster.log" 100
}
diag_isolation() {
    show "$TREE/test/output_iso/regression.diffs" 1000
    show "$TREE/tmp_check_iso/log/postmaster.log" 100
}
diag_tap() {
    local f
    for f in "$TREE"/tmp_check/log/*; do
        [ -f "$f" ] && show "$f" 300
    done
    # the next TAP suite starts with a fresh tmp_check: keep these logs
    [ ! -d "$TREE/tmp_check/log" ] || cp -a "$TREE/tmp_check/log" "$LOGS/$name.tap-logs"
}
diag_none() { :; }

# Stop any server a killed or failed suite left running in the copy.
reap() {
    local pidfile
    while IFS= read -r pidfile; do
        echo "stopping a server left behind in ${pidfile%/postmaster.pid}"
        "${RUNAS[@]}" env LD_LIBRARY_PATH="${SUITE_LD_PATH:-}" \
            "$("$SUITE_PG_CONFIG" --bindir)/pg_ctl" -D "${pidfile%/postmaster.pid}" \
            -m immediate -w stop >/dev/null 2>&1 || true
    done < <(find "$TREE" -name postmaster.pid 2>/dev/null)
}

MAKE_ARGS=(PG_CONFIG="$PG_CONFIG")

# 3. The suites -----------------------------------------------------------------
# `make installcheck` runs pg_regress, isolation and TAP in one go and stops at
# the first that fails; one suite per call runs (and counts) each of them.
# Released install and upgrade scripts never change (README "Upgrading and dropping").
suite released-scripts 1m diag_none sha256sum --check --strict test/released.sha256
suite allocator 5m diag_none make alloc-test "${MAKE_ARGS[@]}"
# The lock protocol's model (test/model/README.md): every interleaving of the
# new protocol passes, the old one and queued single claims are found broken,
# broken programs are caught.
suite lock-model 5m diag_none bash -c 'python3 test/model/locks_model.py &&
    python3 test/model/locks_model.py --old && python3 test/model/locks_model.py --queued &&
    python3 test/model/locks_model.py --selftest'
if compgen -G "$WORK/sql/*.sql" | grep -qv '/redpacket--'; then
    suite "regress-$MAJOR" 10m diag_regress make installcheck "${MAKE_ARGS[@]}" ISOLATION= TAP_TESTS=
else
    echo "== regress: no sql/*.sql tests, skipped"
fi
if compgen -G "$WORK/test/specs/*.spec" >/dev/null; then
    suite "isolation-$MAJOR" 10m diag_isolation make installcheck "${MAKE_ARGS[@]}" REGRESS= TAP_TESTS=
else
    echo "== isolation: no test/specs/*.spec, skipped"
fi
if compgen -G "$WORK/test/t/*.pl" >/dev/null; then
    suite "tap-$MAJOR" 30m diag_tap make installcheck "${MAKE_ARGS[@]}" REGRESS= ISOLATION=
else
    echo "== tap: no test/t/*.pl, skipped"
fi
suite "stress-$MAJOR" 10m diag_none bash test/stress/run.sh
# Again with two busy loops competing for the CPU: waits stretch and cross.
suite "stress-hogs-$MAJOR" 10m diag_none env STRESS_HOGS=2 bash test/stress/run.sh

# The claim suites again with rp_claim's fast path forced through its SQL
# statement (redpacket.direct_claims = off, test/spi_path.conf): the
# executor-direct path (src/claim/direct.c) is the default everywhere above, and
# both paths must pass.  TEMP_CONFIG reaches pg_regress and isolation
# (Makefile), PostgreSQL::Test::Cluster and the stress cluster (test/lib/cluster.sh).
SPI_TAP="test/t/013_wallet_cdc.pl test/t/101_crash.pl test/t/105_isolation_levels.pl test/t/106_claim_load.pl"
SPI=(env TEMP_CONFIG="$WORK/test/spi_path.conf")
suite "regress-spi-$MAJOR" 10m diag_regress "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" ISOLATION= TAP_TESTS=
suite "isolation-spi-$MAJOR" 10m diag_isolation "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" REGRESS= TAP_TESTS=
suite "tap-spi-$MAJOR" 15m diag_tap "${SPI[@]}" make installcheck "${MAKE_ARGS[@]}" REGRESS= ISOLATION= \
    PROVE_TESTS="$SPI_TAP"
suite "stress-spi-$MAJOR" 10m diag_none "${SPI[@]}" bash test/stress/run.sh

# 4. PostgreSQL 18 ----------------------------------------------------------------
# The same suites on PostgreSQL 18, which Debian 12 does not package:
# test/pg18/build.sh builds 18.6 from its release source once (about 3.5
# minutes on 2 cores; cached in test/pg18/build/, keyed by the tarball) and
# installs it into test/pg18/build/install.  The installation is copied into
# a second copy of the tree, owned by the test user (the clone may sit where
# that user cannot read), with LD_LIBRARY_PATH pointing its programs at the
# copy's libpq; redpacket is built there with -Werror and installed into it.
# Citus and pg_cron have no build for 18 here: their TAP tests are named and
# left out.  test/t/025_pg_upgrade.pl upgrades a PostgreSQL 15 cluster
# (PG_CONFIG's, where step 1 installed the same redpacket) to 18.
PG18_NO_TAP=(
    "test/t/005_pg_cron.pl:pg_cron (Debian's postgresql-15-cron) has no build for PostgreSQL 18 here"
    "test/t/201_citus.pl:Citus 13.2 (test/citus/build.sh) supports PostgreSQL 15 to 17, not 18"
)
run_pg18() {
    local out start rc p18 entry t tap18=()
    echo
    echo "== build-pg18"
    start=$(date +%s)
    out=$(bash "$ROOT/test/pg18/build.sh" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        failed_names+=(build-pg18)
        echo "== build-pg18: FAIL, exit $rc ($(( $(date +%s) - start )) s)"
        return
    fi
    if grep -q '^pg18: skipped' <<<"$out"; then
        echo "== PostgreSQL 18: not tested (no source; see test/pg18/build.sh)"
        return
    fi
    passed=$((passed + 1))
    echo "== build-pg18: PASS ($(( $(date +%s) - start )) s)"

    WORK18=$(copy_tree 18)
    cp -a "${PG18_BUILD_DIR:-$ROOT/test/pg18/build}/install" "$WORK18/.pg18"
    [ "$(id -u)" -ne 0 ] || chown -R postgres: "$WORK18/.pg18"
    TREE=$WORK18
    p18=$WORK18/.pg18/bin/pg_config
    SUITE_PG_CONFIG=$p18
    SUITE_LD_PATH=$WORK18/.pg18/lib
    echo "== testing PostgreSQL 18 in a copy in $WORK18 as $OWNER"

    local env18=(env PG_CONFIG="$p18" LD_LIBRARY_PATH="$SUITE_LD_PATH")
    local make18=(PG_CONFIG="$p18")
    suite build-18 10m diag_none "${env18[@]}" bash -c \
        'make -s clean && make -s -j"$(nproc 2>/dev/null || echo 2)" "$@" && make -s install "$@"' \
        _ "${make18[@]}"
    for t in "$WORK18"/test/t/*.pl; do
        t=${t#"$WORK18"/}
        for entry in "${PG18_NO_TAP[@]}"; do
            [ "$t" != "${entry%%:*}" ] || continue 2
        done
        tap18+=("$t")
    done
    echo
    for entry in "${PG18_NO_TAP[@]}"; do
        echo "== tap-18: not run: ${entry%%:*}: ${entry#*:}"
    done
    suite regress-18 10m diag_regress "${env18[@]}" make installcheck "${make18[@]}" ISOLATION= TAP_TESTS=
    suite isolation-18 10m diag_isolation "${env18[@]}" make installcheck "${make18[@]}" REGRESS= TAP_TESTS=
    suite tap-18 30m diag_tap "${env18[@]}" REDPACKET_UPGRADE_FROM="$PG_CONFIG" \
        make installcheck "${make18[@]}" REGRESS= ISOLATION= PROVE_TESTS="${tap18[*]}"
    suite stress-18 10m diag_none "${env18[@]}" bash test/stress/run.sh
    local spi18=("${env18[@]}" TEMP_CONFIG="$WORK18/test/spi_path.conf")
    suite regress-spi-18 10m diag_regress "${spi18[@]}" make installcheck "${make18[@]}" ISOLATION= TAP_TESTS=
    suite isolation-spi-18 10m diag_isolation "${spi18[@]}" make installcheck "${make18[@]}" REGRESS= TAP_TESTS=
    suite tap-spi-18 15m diag_tap "${spi18[@]}" make installcheck "${make18[@]}" REGRESS= ISOLATION= \
        PROVE_TESTS="$SPI_TAP"
}
if [ "$MAJOR" = 18 ]; then
    echo "== PostgreSQL 18 is the main major here (PG_CONFIG): no second run"
elif [ "${REDPACKET_NO_PG18:-0}" = 1 ]; then
    echo "== PostgreSQL 18: skipped (REDPACKET_NO_PG18=1)"
else
    run_pg18
fi

summary
[ "$failed" -eq 0 ]
