#!/usr/bin/env bash
# Side-by-side comparison of two builds of redpacket on one machine, so that
# the load of the moment hits both alike: an OLD source tree (default: the
# main branch, exported with git archive) and this tree.  Rounds alternate
# old, new, new, old, ...; each round installs its build, restarts a
# private server and measures
#   cpu_claim    backend CPU (utime + stime) per rp_claim, one claim per
#                transaction, one backend (a procedure that COMMITs per claim)
#   cpu_batch    backend CPU per rp_claim_batch call of 100 claims
#   tps_claim    pgbench, CLIENTS clients, DURATION s, rp_claim.pgbench
#   p99_claim    the 99th percentile of that run's latencies, milliseconds
#   tps_batch    pgbench, CLIENTS clients, DURATION s, rp_claim_batch.pgbench
#   cpu_lucky    backend CPU per lucky draw (rp_claim, amount NULL), one a
#                transaction, on an activity of LUCKY_PACKETS packets
#   tps_lucky    lucky draws claimed per second on a hot activity of
#                LUCKY_PACKETS packets (default stripes), LUCKY_CLIENTS
#                clients, rp_claim_lucky.pgbench: the claims counted over
#                the span of their claimed_at, so that an activity drained
#                before the end is not mistaken for a fast one
# and prints every round and the new/old ratio of the medians.
#
#   sudo bash test/bench/compare.sh            (as root: it installs builds)
#
# Environment: PG_CONFIG; PORT (22000); ROUNDS (4); CLIENTS (16); DURATION (15 s);
# CLAIMS (20000); LUCKY_PACKETS (100000); LUCKY_CLIENTS (64); OLD_SRC (a
# tree to compare against) or OLD_REV (a revision of this repository to
# export, default main); OUT (a file for the summary).  Writes to WORK
# (/tmp/redpacket-compare) and leaves the last build installed: reinstall
# the one you want afterwards.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NEW_SRC=$(cd "$HERE/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BIN=$("$PG_CONFIG" --bindir)
PORT=${PORT:-22000}
ROUNDS=${ROUNDS:-4}
CLIENTS=${CLIENTS:-16}
DURATION=${DURATION:-15}
CLAIMS=${CLAIMS:-20000}
LUCKY_PACKETS=${LUCKY_PACKETS:-100000}
LUCKY_CLIENTS=${LUCKY_CLIENTS:-64}
WORK=${WORK:-/tmp/redpacket-compare}
OLD_SRC=${OLD_SRC:-}
OLD_REV=${OLD_REV:-main}
OUT=${OUT:-}

rm -rf "$WORK"
mkdir -p "$WORK"
if [ -z "$OLD_SRC" ]; then
    OLD_SRC="$WORK/old"
    mkdir -p "$OLD_SRC"
    git -C "$NEW_SRC" archive "$OLD_REV" | tar -C "$OLD_SRC" -xf -
fi
for src in "$OLD_SRC" "$NEW_SRC"; do
    make -s -C "$src" -j2 PG_CONFIG="$PG_CONFIG" >/dev/null
done
chown -R postgres: "$WORK"

as_pg() { runuser -u postgres -- "$@"; }
psql_() { as_pg "$BIN/psql" -X -q -At -p "$PORT" -h /tmp -d postgres "$@"; }

as_pg "$BIN/initdb" -D "$WORK/data" -A trust >/dev/null
cat >>"$WORK/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '/tmp'
shared_buffers = 256MB
synchronous_commit = off
max_connections = $((LUCKY_CLIENTS + 20))
CONF

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# One round: install the build in $2, restart, measure; append "kind value" lines.
round() {
    local label=$1 src=$2 act tps
    # drop with the build that created it (its drop guard lives in its library)
    psql_ -c "SET redpacket.allow_drop = on" -c "DROP EXTENSION IF EXISTS redpacket CASCADE" \
        >/dev/null 2>&1 || true
    make -s -C "$src" install PG_CONFIG="$PG_CONFIG" >/dev/null
    as_pg "$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w restart >/dev/null 2>&1 ||
        as_pg "$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w start >/dev/null
    psql_ -c "CREATE EXTENSION redpacket" >/dev/null
    psql_ >/dev/null <<'SQL'
CREATE OR REPLACE FUNCTION public.cpu_ticks() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    stat text := pg_read_file('/proc/self/stat');
    f text[] := regexp_split_to_array(substr(stat, strpos(stat, ') ') + 2), ' ');
BEGIN
    RETURN f[12]::bigint + f[13]::bigint;
END $$;
CREATE OR REPLACE PROCEDURE public.claims(act bigint, n integer, batch integer) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        IF batch = 0 THEN
            PERFORM redpacket.rp_claim(act, 'p' || i, 0.01);
        ELSIF batch < 0 THEN
            PERFORM redpacket.rp_claim(act, 'p' || i, NULL);
        ELSE
            PERFORM count(*) FROM redpacket.rp_claim_batch(act,
                ARRAY(SELECT 'p' || i || '-' || g FROM generate_series(1, batch) g),
                array_fill(0.01::numeric, ARRAY[batch]));
        END IF;
        COMMIT;
    END LOOP;
END $$;
SQL
    for kind in claim batch lucky; do
        local n=$CLAIMS batch=0
        [ "$kind" = batch ] && { n=$((CLAIMS / 100)); batch=100; }
        [ "$kind" = lucky ] && batch=-1
        if [ "$kind" = lucky ]; then
            act=$(psql_ -c "SELECT redpacket.rp_create_activity(1000000.00, packets => $LUCKY_PACKETS)")
        else
            act=$(psql_ -c "SELECT redpacket.rp_create_activity(100000000.00, stripes => 16)")
        fi
        # ticks are 1/100 s: print microseconds of CPU per call
        psql_ <<SQL | sed "s/^/$label /" >>"$WORK/results"
SELECT public.cpu_ticks() AS t0 \gset
CALL public.claims($act, $n, $batch);
SELECT 'cpu_$kind ' || round((public.cpu_ticks() - :t0) * 10000.0 / $n, 1);
SQL
    done
    for kind in claim batch; do
        act=$(psql_ -c "SELECT redpacket.rp_create_activity(100000000.00, stripes => 16)")
        rm -f "$WORK/lat".*
        tps=$(as_pg "$BIN/pgbench" -n -h /tmp -p "$PORT" -c "$CLIENTS" -j 2 -T "$DURATION" \
                  -l --log-prefix="$WORK/lat" \
                  -D act="$act" -D batch=100 -D n=0 -f "$HERE/$([ $kind = claim ] && echo rp_claim || echo rp_claim_batch).pgbench" postgres 2>&1 |
              tee -a "$WORK/pgbench.log" | sed -n "s/^tps = \([0-9.]*\).*/\1/p")
        echo "$label tps_$kind $tps" >>"$WORK/results"
        if [ "$kind" = claim ]; then
            cat "$WORK/lat".* | awk '{print $3 / 1000}' | sort -g |
                awk -v l="$label" '{a[NR] = $1} END {print l " p99_claim " a[int(NR * 0.99)]}' \
                >>"$WORK/results"
        fi
    done
    act=$(psql_ -c "SELECT redpacket.rp_create_activity(1000000.00, packets => $LUCKY_PACKETS)")
    as_pg "$BIN/pgbench" -n -h /tmp -p "$PORT" -c "$LUCKY_CLIENTS" -j 2 -T "$DURATION" \
        -D act="$act" -D n=0 -f "$HERE/rp_claim_lucky.pgbench" postgres >>"$WORK/pgbench.log" 2>&1
    psql_ -c "SELECT '$label tps_lucky ' || round(count(*) / extract(epoch FROM max(claimed_at) - min(claimed_at)), 1)
                FROM redpacket.claim WHERE activity_id = $act" >>"$WORK/results"
    grep "^$label " "$WORK/results" | tail -7 | tr '\n' ' '
    echo
}

: >"$WORK/results"
for ((r = 0; r < ROUNDS; r++)); do
    if [ $((r % 2)) -eq 0 ]; then round old "$OLD_SRC"; round new "$NEW_SRC"
    else round new "$NEW_SRC"; round old "$OLD_SRC"; fi
done
as_pg "$BIN/pg_ctl" -D "$WORK/data" -w stop >/dev/null

summary() {
    echo "median of $ROUNDS rounds each (cpu: microseconds per call; tps: calls per second; p99: ms)"
    for kind in cpu_claim cpu_batch cpu_lucky tps_claim p99_claim tps_batch tps_lucky; do
        o=$(awk -v k=$kind '$1 == "old" && $2 == k {print $3}' "$WORK/results" | median)
        n=$(awk -v k=$kind '$1 == "new" && $2 == k {print $3}' "$WORK/results" | median)
        awk -v k=$kind -v o="$o" -v n="$n" 'BEGIN {printf "%-10s old %10.1f  new %10.1f  new/old %.3f\n", k, o, n, n / o}'
    done
}
summary
# A tree's name in the summary: its git revision, the revision it was
# exported from, or its path.
tree_name() {   # tree_name DIR EXPORTED_REV
    git -C "$1" rev-parse --short HEAD 2>/dev/null ||
        { [ "$1" = "$WORK/old" ] && echo "$2"; } || echo "$1"
}
if [ -n "$OUT" ]; then
    {
        echo "# Two builds side by side (test/bench/compare.sh)"
        echo
        echo "old: $(tree_name "$OLD_SRC" "$OLD_REV"), new: $(tree_name "$NEW_SRC" "");" \
             "$ROUNDS rounds each, alternating;" \
             "$CLIENTS clients ($LUCKY_CLIENTS for the lucky draws, $LUCKY_PACKETS packets), $DURATION s a run;" \
             "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)."
        echo
        echo '```'
        summary
        echo
        cat "$WORK/results"
        echo '```'
    } >"$OUT"
fi
