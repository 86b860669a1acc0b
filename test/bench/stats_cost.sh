#!/usr/bin/env bash
# CPU per claim with the activity counters (redpacket.track_stats) on and
# off, side by side in one run.  On a throwaway preloaded cluster: ROUNDS
# rounds, each running CLAIMS single-claim transactions (pgbench -c 1 -t,
# each on a fresh activity) once with the counters on and once off, the
# order alternating between rounds.  The backend samples its own CPU time
# (/proc/self/stat utime + stime) before the first and after the last claim.
# Prints microseconds of backend CPU per claim for each mode (sum over the
# rounds) and the ratio on/off; the goal is a ratio within 1.05.
#
#   bash test/bench/stats_cost.sh        as an ordinary user (initdb refuses root)
#
# Environment: PG_CONFIG, STATS_CLAIMS (20000), STATS_ROUNDS (4),
# STATS_PORT (a free TCP port on 127.0.0.1, 24050 by default).
set -euo pipefail

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PGBIN=$("$PG_CONFIG" --bindir)
CLAIMS=${STATS_CLAIMS:-20000}
ROUNDS=${STATS_ROUNDS:-4}
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
CREATE TABLE cpu_sample (mode int, round int, at_end boolean, ticks bigint);
CREATE FUNCTION cpu_sample(p_mode int, p_round int, p_end boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    stat text := pg_read_file('/proc/self/stat');
    f text[] := regexp_split_to_array(substr(stat, strpos(stat, ') ') + 2), ' ');
BEGIN
    INSERT INTO cpu_sample VALUES (p_mode, p_round, p_end, f[12]::bigint + f[13]::bigint);
END;
$$;
SQL
cat >"$DIR/claim.pgbench" <<'PGB'
\set n :n + 1
\if :n = 1
SELECT cpu_sample(:mode, :round, false);
\endif
SELECT status FROM redpacket.rp_claim(:act, 'u' || :n, 0.01);
\if :n = :total
SELECT cpu_sample(:mode, :round, true);
\endif
PGB

TICK_US=$((1000000 / $(getconf CLK_TCK)))
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then modes="on off"; else modes="off on"; fi
    for mode in $modes; do
        act=$(psql -c "SELECT redpacket.rp_create_activity(1000000.00)")
        PGOPTIONS="-c redpacket.track_stats=$mode" "$PGBIN/pgbench" -n -c 1 -t "$CLAIMS" \
            -D n=0 -D total="$CLAIMS" -D act="$act" -D mode="$([ "$mode" = on ] && echo 1 || echo 0)" -D round="$round" \
            -f "$DIR/claim.pgbench" >"$DIR/pgbench.log" 2>&1 || { cat "$DIR/pgbench.log"; exit 1; }
    done
done

psql -c "SELECT 'counted claims (counters on): ' || coalesce(sum(claimed), 0) FROM redpacket.activity_stats"
psql <<SQL
WITH runs AS (
    SELECT mode, round, max(ticks) FILTER (WHERE at_end) - max(ticks) FILTER (WHERE NOT at_end) AS ticks
      FROM cpu_sample GROUP BY mode, round),
per AS (
    SELECT mode, sum(ticks) * $TICK_US / ($CLAIMS * $ROUNDS)::numeric AS us,
           string_agg(ticks::text, ' ' ORDER BY round) AS ticks_by_round
      FROM runs GROUP BY mode)
SELECT format('claims per mode: %s (%s rounds of %s); backend CPU us/claim: on %s, off %s; ratio on/off %s; ticks by round: on [%s] off [%s]',
              $CLAIMS * $ROUNDS, $ROUNDS, $CLAIMS,
              round(on_.us, 2), round(off_.us, 2), round(on_.us / off_.us, 3),
              on_.ticks_by_round, off_.ticks_by_round)
  FROM per on_, per off_ WHERE on_.mode = 1 AND off_.mode = 0;
SQL
