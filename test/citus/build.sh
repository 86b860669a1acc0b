#!/usr/bin/env bash
# Build and install Citus for the scale-out tests (test/t/201_citus.pl).
#
#   bash test/citus/build.sh
#
# Citus is not a Debian package here: its source release and a small patch for
# PostgreSQL 15.20 sit in CITUS_SRC (citus-13.2.2.tar.gz + pg15.20.patch).  The
# script unpacks, patches, configures and builds it in test/citus/build/
# (gitignored) and installs it into the PostgreSQL of PG_CONFIG.  The built
# tree is kept, keyed by the tarball, the patch and pg_config: a second run
# only reinstalls (a few seconds), and does nothing at all when that build is
# already installed.  About 35 s of wall time for a fresh build on 2 cores.
#
# Environment:
#   PG_CONFIG   pg_config of the PostgreSQL to install into
#               (default /usr/lib/postgresql/15/bin/pg_config)
#   CITUS_SRC   directory holding the tarball and the patch
#               (default: ../shared/citus relative to the repository root)
#   CITUS_BUILD_DIR  where to keep the built tree (default test/citus/build)
#
# Exits 0 with "citus: skipped: ..." when there is no source and no installed
# Citus (the TAP test then skips too); non-zero only when a build fails.
# Run as root, or as a user who can write into PG_CONFIG's directories.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
CITUS_SRC=${CITUS_SRC:-$ROOT/../shared/citus}
BUILD=${CITUS_BUILD_DIR:-$ROOT/test/citus/build}
TARBALL=citus-13.2.2.tar.gz
PATCH=pg15.20.patch

say() { printf 'citus: %s\n' "$*"; }

if [ ! -x "$PG_CONFIG" ]; then
    say "skipped: no pg_config at $PG_CONFIG"
    exit 0
fi
PKGLIB=$("$PG_CONFIG" --pkglibdir)
SHARE=$("$PG_CONFIG" --sharedir)

if [ ! -f "$CITUS_SRC/$TARBALL" ] || [ ! -f "$CITUS_SRC/$PATCH" ]; then
    if [ -f "$PKGLIB/citus.so" ]; then
        say "no source in $CITUS_SRC; using the Citus installed in $PKGLIB"
    else
        say "skipped: no $TARBALL + $PATCH in $CITUS_SRC and no Citus installed" \
            "(set CITUS_SRC)"
    fi
    exit 0
fi

# The cache key: what was built, against which server.
KEY=$(cat "$CITUS_SRC/$TARBALL" "$CITUS_SRC/$PATCH" | sha256sum | cut -c1-16)-$(
    "$PG_CONFIG" --version --configure | sha256sum | cut -c1-16)
STAMP=$BUILD/.built-$KEY
INSTALLED=$PKGLIB/citus.redpacket-build

if [ -f "$STAMP" ] && [ -f "$PKGLIB/citus.so" ] &&
   [ "$(cat "$INSTALLED" 2>/dev/null)" = "$KEY" ]; then
    say "build $KEY already installed in $PKGLIB (nothing to do)"
    exit 0
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

if [ ! -f "$STAMP" ]; then
    say "building Citus from $CITUS_SRC/$TARBALL in $BUILD (log: $LOG)"
    rm -rf "$BUILD/src" "$BUILD"/.built-*
    : >"$LOG"
    mkdir -p "$BUILD/src"
    logged tar -xzf "$CITUS_SRC/$TARBALL" -C "$BUILD/src" --strip-components=1
    logged patch -d "$BUILD/src" -p1 -i "$CITUS_SRC/$PATCH"
    (cd "$BUILD/src" && logged ./configure PG_CONFIG="$PG_CONFIG" --without-libcurl)
    logged make -C "$BUILD/src" -j"$(nproc 2>/dev/null || echo 2)" with_llvm=no
    touch "$STAMP"
    say "built in $(( $(date +%s) - start )) s"
else
    say "reusing the build in $BUILD"
fi

# Install as make install in test/setup.sh does: directly when we may write
# there, else through sudo.
SUDO=()
if [ ! -w "$PKGLIB" ] || [ ! -w "$SHARE/extension" ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        say "skipped: built, but cannot write $PKGLIB (run as root)"
        exit 0
    fi
fi
logged "${SUDO[@]}" make -C "$BUILD/src" with_llvm=no install
printf '%s\n' "$KEY" | "${SUDO[@]}" tee "$INSTALLED" >/dev/null
say "installed into $PKGLIB and $SHARE/extension ($(( $(date +%s) - start )) s in all)"
