#!/usr/bin/env bash
# Build and install PostgreSQL 18 for redpacket's PostgreSQL 18 suites
# (test/run_all.sh) and for `make ... PG_CONFIG=<18's pg_config>`.
#
#   bash test/pg18/build.sh          prints the pg_config path on its last line
#
# Debian 12 packages only PostgreSQL 15, so 18 is built from the release
# tarball in PG18_SRC (postgresql-18_18.6.orig.tar.bz2, as Debian ships it).
# The script unpacks, configures and builds it in test/pg18/build/ (gitignored)
# and installs it into the prefix test/pg18/build/install.  The built tree is
# kept, keyed by the tarball's checksum and the configure options: a second
# run only reinstalls (seconds), and does nothing when that build is already
# installed.  About 3.5 minutes of wall time for a fresh build on 2 cores.
# The installation is relocatable: copy the prefix anywhere and use its
# bin/pg_config (test/run_all.sh does, for a copy the test user owns).
#
# Environment:
#   PG18_SRC        directory holding the tarball (default: shared/postgresql
#                   beside the repository, or beside its main work tree)
#   PG18_BUILD_DIR  where to keep the built tree (default test/pg18/build)
#   PG18_CONFIGURE  extra configure options, e.g. "--enable-cassert --enable-debug"
#                   (part of the cache key; the default is a release build, like
#                   Debian's, so that benchmarks compare like with like)
#   REDPACKET_SETUP_NO_APT=1  never touch packages
#
# As root it first installs the Debian packages the build needs.  Exits 0
# with "pg18: skipped: ..." when there is no source; non-zero only when a
# build fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TARBALL=postgresql-18_18.6.orig.tar.bz2
BUILD=${PG18_BUILD_DIR:-$ROOT/test/pg18/build}
PREFIX=$BUILD/install
EXTRA=${PG18_CONFIGURE:-}
PACKAGES=(bison flex liblz4-dev libzstd-dev libipc-run-perl zlib1g-dev pkg-config make gcc)

say() { printf 'pg18: %s\n' "$*"; }

# The source: PG18_SRC, else shared/postgresql beside this clone, else beside
# the main work tree when this is a git worktree.
if [ -z "${PG18_SRC:-}" ]; then
    PG18_SRC=$ROOT/../shared/postgresql
    if [ ! -f "$PG18_SRC/$TARBALL" ] &&
       common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
        PG18_SRC=$(dirname "$(dirname "$common")")/shared/postgresql
    fi
fi
if [ ! -f "$PG18_SRC/$TARBALL" ]; then
    say "skipped: no $TARBALL in $PG18_SRC (set PG18_SRC)"
    exit 0
fi

KEY=$(sha256sum "$PG18_SRC/$TARBALL" | cut -c1-16)-$(printf '%s' "$EXTRA" | sha256sum | cut -c1-8)
STAMP=$BUILD/.built-$KEY
INSTALLED=$PREFIX/.redpacket-build

if [ -f "$STAMP" ] && [ -x "$PREFIX/bin/pg_config" ] &&
   [ "$(cat "$INSTALLED" 2>/dev/null)" = "$KEY" ]; then
    say "build $KEY already installed in $PREFIX (nothing to do)"
    echo "$PREFIX/bin/pg_config"
    exit 0
fi

# Packages: bison and flex (a release tarball since 17 ships no generated
# parsers), the compression libraries, IPC::Run for --enable-tap-tests.
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
        missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ] && [ "${REDPACKET_SETUP_NO_APT:-0}" != 1 ] &&
   command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        say "installing packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }
    else
        say "missing packages (as root: apt-get install -y ${missing[*]})" >&2
    fi
fi

LOG=$BUILD/build.log
mkdir -p "$BUILD"
start=$(date +%s)

# Run a command with its output in the log; on failure show the log and stop.
logged() {
    if ! "$@" >>"$LOG" 2>&1; then
        say "FAILED: $*" >&2
        tail -n 60 "$LOG" >&2
        exit 1
    fi
}

JOBS=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$STAMP" ]; then
    say "building PostgreSQL from $PG18_SRC/$TARBALL in $BUILD (log: $LOG)"
    rm -rf "$BUILD/src" "$PREFIX" "$BUILD"/.built-*
    : >"$LOG"
    mkdir -p "$BUILD/src"
    logged tar -xjf "$PG18_SRC/$TARBALL" -C "$BUILD/src" --strip-components=1
    # shellcheck disable=SC2086 # EXTRA is a list of options
    (cd "$BUILD/src" && logged ./configure --prefix="$PREFIX" --without-icu \
        --without-readline --with-lz4 --with-zstd --enable-tap-tests $EXTRA)
    logged make -C "$BUILD/src" -j"$JOBS" world-bin
    touch "$STAMP"
    say "built in $(( $(date +%s) - start )) s"
else
    say "reusing the build in $BUILD"
fi

rm -rf "$PREFIX"
logged make -C "$BUILD/src" install-world-bin
printf '%s\n' "$KEY" >"$INSTALLED"
say "installed into $PREFIX ($(( $(date +%s) - start )) s in all)"
echo "$PREFIX/bin/pg_config"
