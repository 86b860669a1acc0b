#!/usr/bin/env bash
# Machine set-up for redpacket, safe to run any number of times: installs the
# Debian packages the build, the tests, the demo and the benchmarks need, then
# builds the extension and installs it into PostgreSQL 15.
#
#   bash test/setup.sh
#
# As root it uses apt-get directly; as an ordinary user it skips the packages
# (it only says which are missing) and installs the extension with sudo.
# Environment:
#   PG_CONFIG                   pg_config to build against (default: PostgreSQL 15's)
#   REDPACKET_SETUP_FORCE_APT=1 run apt-get even when every package is present
#   REDPACKET_SETUP_NO_APT=1    never touch packages
#   DESTDIR                     staging directory for make install (packaging, dry runs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron libipc-run-perl
          pgbouncer redis-server gnuplot-nox sqlsmith postgresql-contrib make gcc
          python3 python3-psycopg2 libkrb5-dev liblz4-dev libzstd-dev)  # the last three: Citus (test/citus/build.sh)

LOG=$(mktemp "${TMPDIR:-/tmp}/redpacket-setup.XXXXXX")
trap 'rm -f "$LOG"' EXIT

say() { printf 'setup: %s\n' "$*"; }

# Run a command with its output in the log; on failure show the log and stop.
logged() {
    if ! "$@" >>"$LOG" 2>&1; then
        say "FAILED: $*" >&2
        tail -n 200 "$LOG" >&2
        exit 1
    fi
}

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
            printf '%s\n' "$p"
        fi
    done
}

# 1. Packages ---------------------------------------------------------------
if [ "${REDPACKET_SETUP_NO_APT:-0}" = 1 ]; then
    say "skipping packages (REDPACKET_SETUP_NO_APT=1)"
elif ! command -v dpkg-query >/dev/null 2>&1; then
    say "not a Debian system: install PostgreSQL 15 with its server headers yourself"
else
    mapfile -t missing < <(missing_packages)
    if [ "$(id -u)" -eq 0 ]; then
        if [ "${#missing[@]}" -eq 0 ] && [ "${REDPACKET_SETUP_FORCE_APT:-0}" != 1 ]; then
            say "all ${#PACKAGES[@]} packages already installed"
        else
            say "installing packages${missing[*]:+ (missing: ${missing[*]})}"
            export DEBIAN_FRONTEND=noninteractive
            logged apt-get update -q
            logged apt-get install -y -q "${PACKAGES[@]}"
        fi
    elif [ "${#missing[@]}" -gt 0 ]; then
        say "not root, so not installing packages; missing: ${missing[*]}" >&2
        say "as root: apt-get install -y ${missing[*]}" >&2
    fi
fi

if [ ! -x "$PG_CONFIG" ]; then
    say "no pg_config at $PG_CONFIG (install postgresql-server-dev-15)" >&2
    exit 1
fi

# 2. Build and install --------------------------------------------------------
JOBS=$(nproc 2>/dev/null || echo 2)
say "building in $ROOT"
logged make -C "$ROOT" -j"$JOBS" PG_CONFIG="$PG_CONFIG"

if [ "$(id -u)" -eq 0 ] || [ -n "${DESTDIR:-}" ]; then
    logged make -C "$ROOT" install PG_CONFIG="$PG_CONFIG"
elif command -v sudo >/dev/null 2>&1; then
    logged sudo make -C "$ROOT" install PG_CONFIG="$PG_CONFIG"
elif [ -w "$("$PG_CONFIG" --pkglibdir)" ] && [ -w "$("$PG_CONFIG" --sharedir)/extension" ]; then
    logged make -C "$ROOT" install PG_CONFIG="$PG_CONFIG"
else
    say "cannot install: not root, no sudo, and $("$PG_CONFIG" --pkglibdir) is not writable" >&2
    say "run this script as root, or 'make install PG_CONFIG=$PG_CONFIG' as root" >&2
    exit 1
fi
say "installed redpacket into ${DESTDIR:-}$("$PG_CONFIG" --pkglibdir)"
