#!/usr/bin/env bash
# CPU per claim with something on and off, side by side in one run, in one
# backend: a single pgbench client makes CLAIMS single-claim transactions on
# one activity, switching it on and off every BLOCK claims, so that load
# from anything else on the machine falls on both modes alike.  At each
# switch the backend samples its own CPU time (/proc/self/stat utime +
# stime).  Prints microseconds of backend CPU per claim for each mode and the
# ratio on/off; the goal is a ratio within 1.05.  What is switched
# (COST_OF):
#   stats  the activity counters (SET redpacket.track_stats), the default
#   guard  the trigger that refuses hand-made changes of stripe (ALTER TABLE
#          ... ENABLE/DISABLE TRIGGER guard), on the path where it fires:
#          redpacket.direct_claims = off (the direct path fires no trigger)
#
#   bash test/bench/stats_cost.sh        as an ordinary user (initdb refuses root)
#
# Environment: PG_CONFIG, COST_OF (stats), STATS_CLAIMS (60000), STATS_BLOCK
# (1000), STATS_PORT (a free TCP port, 24050 by default).
set -euo pipefail

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PGBIN=$("$PG_CONFIG" --bindir)
CLAIMS=${STATS_CLAIMS:-60000}
COST_OF=${COST_OF:-stats}
case $COST_OF in
    stats) ON='SET redpacket.track_stats = on;'; OFF='SET redpacket.track_stats = off;'; SESSION='' ;;
    guard) ON='ALTER TABLE redpacket.stripe ENABLE TRIGGER guard;'
           OFF='ALTER TABLE redpacket.stripe DISABLE TRIGGER guard;'
           SESSION='SET redpacket.direct_claims = off;' ;;
    *) echo "COST_OF is stats or guard" >&2; exit 2 ;;
esac
BLOCK=${STATS_BLOCK:-1000}
export PGPORT=${STATS_PORT:-24050} PGDATABASE=postgres PGUSER=$(id -un)
unset PGSERVICE PGPASSWORD PGOPTIONS
DIR=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-stats-cost.XXXXXX")
export PGHOST=$DIR
trap '"$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

"$PGBIN/initdb" -D "$DIR/data" -A trust -E UTF8 --locale=C >"$DIR/initdb.log"
cat >>"$DIR/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$DIR'
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
shared_buffers = 256MB
synchronous_commit = off
max_wal_size = 4GB
CONF
"$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -o "-p $PGPORT" start >/dev/null

psql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
psql <<'SQL'
CREATE EXTENSION redpacket;
CREATE TABLE cpu_sample (block int, ticks bigint);
CREATE FUNCTION cpu_sample(p_block int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    stat text := pg_read_file('/proc/self/stat');
    f text[] := regexp_split_to_array(substr(stat, strpos(stat, ') ') + 2), ' ');
BEGIN
    INSERT INTO cpu_sample VALUES (p_block, f[12]::bigint + f[13]::bigint);
END;
$$;
SQL
# block b (0, 1, ...) runs with the counters on when b is odd; block 0 (the
# warm-up: plans prepared, caches filled) is left out of the comparison
cat >"$DIR/claim.pgbench" <<PGB
\\set n :n + 1
\\if :n = 1
$SESSION
\\endif
\\if :n % :block = 1
\\set b :n / :block
SELECT cpu_sample(:b);
\\if :b % 2 = 1
$ON
\\else
$OFF
\\endif
\\endif
SELECT status FROM redpacket.rp_claim(:act, 'u' || :n, 0.01);
\if :n = :total
SELECT cpu_sample(:n / :block);
\endif
PGB

TICK_US=$((1000000 / $(getconf CLK_TCK)))
act=$(psql -c "SELECT redpacket.rp_create_activity(1000000.00)")
"$PGBIN/pgbench" -n -c 1 -t "$CLAIMS" -D n=0 -D total="$CLAIMS" -D block="$BLOCK" -D act="$act" \
    -f "$DIR/claim.pgbench" >"$DIR/pgbench.log" 2>&1 || { cat "$DIR/pgbench.log"; exit 1; }

[ "$COST_OF" != stats ] ||
    psql -c "SELECT 'claims counted (blocks with counters on): ' || coalesce(sum(claimed), 0) FROM redpacket.activity_stats"
psql <<SQL
WITH blocks AS (
    SELECT block, block % 2 AS mode,
           lead(ticks) OVER (ORDER BY block) - ticks AS ticks
      FROM cpu_sample),
per AS (
    SELECT mode, count(*) AS blocks, sum(ticks) * $TICK_US / (count(*) * $BLOCK)::numeric AS us
      FROM blocks WHERE ticks IS NOT NULL AND block > 0 GROUP BY mode)
SELECT format('$COST_OF: %s claims in blocks of %s alternating on/off (%s blocks on, %s off); backend CPU us/claim: on %s, off %s; ratio on/off %s',
              $CLAIMS, $BLOCK, on_.blocks, off_.blocks,
              round(on_.us, 2), round(off_.us, 2), round(on_.us / off_.us, 3))
  FROM per on_, per off_ WHERE on_.mode = 1 AND off_.mode = 0;
SQL
