#!/usr/bin/env bash
# Lucky-draw fairness figures and histogram for redpacket.
#
# Funds HIST_ACTIVITIES activities of HIST_TOTAL in HIST_PACKETS packets (on
# HIST_STRIPES stripes), drains each with lucky draws (rp_claim with amount
# NULL, users claiming one after the other), replays every stripe's draws in
# claim id order and prints, per draw position (within its stripe):
#   n, mean, std, min, max of the drawn amounts, next to the theory (exact
#   dynamic programming over the remaining balance of the double-mean process:
#   uniform on 1..min(floor(2R/P), R-(P-1)) units, last packet = remainder;
#   one stripe only: with several, a position mixes stripes of different
#   sizes), and the share of draws above twice the mean remaining per packet
#   (must be 0);
# and overall: the same figures, draws leaving a later packet less than one
# unit, last packets not taking the exact remainder, activities not summing to
# their total (all must be 0), the spread of the position means, and a z score
# of "every non-last draw is uniform on 1..m" (|z| of a few is normal).
# Exits non-zero when a hard bound of the double-mean draw is violated.
#
# Writes test/bench/results/lucky_hist.png (histogram of drawn amounts, with
# last packets apart, and the mean per position) and
# test/bench/results/lucky_fairness.md (the figures table).
#
#   bash test/bench/lucky_hist.sh
#
# Server: a throwaway PostgreSQL 15 cluster (fsync off, socket only, the
# installed extension preloaded with its worker paused) in a mktemp
# directory, removed on exit; or, when
# PGHOST or PGPORT is set, that running server: a scratch database
# redpacket_hist_<pid> is created there (needs CREATEDB and the extension
# installed on that server) and dropped at the end.
# As root it re-runs itself as postgres (initdb refuses root) and copies the
# results back.
#
# Environment:
#   HIST_ACTIVITIES  activities (2000)
#   HIST_PACKETS     packets per activity (20)
#   HIST_TOTAL       total of each activity (200.00)
#   HIST_STRIPES     stripes per activity (1)
#   HIST_BIN         histogram bin width in currency units (0.50)
#   HIST_RESULTS     output directory (test/bench/results)
#   HIST_KEEP=1      keep the scratch directory
#   PG_CONFIG        pg_config of the server to start (PostgreSQL 15's)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${HIST_RESULTS:-$HERE/results}
ACTIVITIES=${HIST_ACTIVITIES:-2000}
PACKETS=${HIST_PACKETS:-20}
TOTAL=${HIST_TOTAL:-200.00}
STRIPES=${HIST_STRIPES:-1}
BIN=${HIST_BIN:-0.50}
REUSE=0
if [ -n "${PGHOST:-}" ] || [ -n "${PGPORT:-}" ]; then
    REUSE=1
fi

say() { printf 'lucky_hist: %s\n' "$*" >&2; }

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
[ -x "$PG_CONFIG" ] || PG_CONFIG=$(command -v pg_config || true)
if [ -z "$PG_CONFIG" ]; then
    say "no pg_config found: install PostgreSQL 15 (test/setup.sh)"
    exit 1
fi
PGBIN=$("$PG_CONFIG" --bindir)

for v in ACTIVITIES PACKETS STRIPES; do
    case ${!v} in
        '' | *[!0-9]*) say "HIST_$v must be a positive integer"; exit 1 ;;
    esac
done
case $TOTAL$BIN in
    *[!0-9.]*) say "HIST_TOTAL and HIST_BIN must be plain decimals"; exit 1 ;;
esac

# Root, with a cluster to create: run this script again as postgres from a
# postgres-owned copy, then bring the result files back.
if [ "$(id -u)" -eq 0 ] && [ "$REUSE" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        say "running as root and there is no postgres user to run the server as"
        exit 1
    fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-hist-root.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/results"
    cp "${BASH_SOURCE[0]}" "$tmp/lucky_hist.sh"
    chown -R postgres: "$tmp"
    chmod 755 "$tmp"
    set +e
    (cd "$tmp" && runuser -u postgres -- env HOME="$tmp" TMPDIR="$tmp" PG_CONFIG="$PG_CONFIG" \
        HIST_ACTIVITIES="$ACTIVITIES" HIST_PACKETS="$PACKETS" HIST_TOTAL="$TOTAL" \
        HIST_STRIPES="$STRIPES" HIST_BIN="$BIN" HIST_KEEP="${HIST_KEEP:-0}" \
        HIST_RESULTS="$tmp/results" HIST_RESULTS_SHOWN="$RESULTS" \
        bash "$tmp/lucky_hist.sh")
    rc=$?
    set -e
    mkdir -p "$RESULTS"
    for f in lucky_hist.png lucky_fairness.md; do
        if [ -f "$tmp/results/$f" ]; then
            cp "$tmp/results/$f" "$RESULTS/$f"
            chown "$(stat -c '%u:%g' "$RESULTS")" "$RESULTS/$f"
        fi
    done
    [ "${HIST_KEEP:-0}" = 1 ] && say "HIST_KEEP=1: the scratch cluster was under $tmp (removed with it)"
    exit "$rc"
fi
SHOWN=${HIST_RESULTS_SHOWN:-$RESULTS}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-hist.XXXXXX")
DB=
ADMIN_DB=${PGDATABASE:-postgres}
cleanup() {
    if [ "$REUSE" = 1 ] && [ -n "$DB" ]; then
        "$PGBIN/psql" -X -q -d "$ADMIN_DB" -c "DROP DATABASE IF EXISTS $DB" \
            >/dev/null 2>&1 || say "could not drop scratch database $DB"
    fi
    if [ -f "$WORK/data/postmaster.pid" ]; then
        "$PGBIN/pg_ctl" -D "$WORK/data" -m fast -w -t 60 stop >/dev/null 2>&1 ||
            "$PGBIN/pg_ctl" -D "$WORK/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ "${HIST_KEEP:-0}" = 1 ]; then
        say "kept scratch directory $WORK (server stopped)"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$REUSE" = 1 ]; then
    DB=redpacket_hist_$$
    say "using the running server (PGHOST=${PGHOST:-default} PGPORT=${PGPORT:-default}), scratch database $DB"
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$ADMIN_DB" -c "CREATE DATABASE $DB" >/dev/null
    export PGDATABASE=$DB
else
    say "starting a throwaway cluster in $WORK"
    if ! "$PGBIN/initdb" -D "$WORK/data" -A trust -E UTF8 --locale=C >"$WORK/initdb.log" 2>&1; then
        cat "$WORK/initdb.log" >&2
        exit 1
    fi
    {
        echo "listen_addresses = ''"
        # Preloaded as in production; its reconciliation worker paused.
        echo "shared_preload_libraries = 'redpacket'"
        echo "redpacket.reconcile_interval = 0"
        echo "unix_socket_directories = '$WORK'"
        echo "fsync = off"
        echo "synchronous_commit = off"
        echo "full_page_writes = off"
        echo "max_locks_per_transaction = 256"
        echo "timezone = 'UTC'"
    } >>"$WORK/data/postgresql.conf"
    if ! "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 120 -o "-p 5432" start \
            >/dev/null 2>&1; then
        say "server did not start; its log:"
        tail -n 50 "$WORK/server.log" >&2
        exit 1
    fi
    PGUSER=$(id -un)
    export PGHOST=$WORK PGPORT=5432 PGDATABASE=postgres PGUSER
fi
unset PGSERVICE PGOPTIONS

psql_() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# Theory for one stripe of B units in P packets, by exact dynamic programming
# over the remaining balance R: per position k the mean and std of the draw.
theory() {
    awk -v B="$1" -v P="$2" 'BEGIN {
        for (r = 0; r <= B; r++) d[r] = 0
        d[B] = 1
        for (k = 1; k <= P; k++) {
            left = P - k + 1
            for (i = 0; i <= B + 1; i++) { xd[i] = 0; nd[i] = 0 }
            if (left == 1) {
                for (r = 0; r <= B; r++) x[r] = d[r]
            } else {
                for (r = 0; r <= B; r++) {
                    if (d[r] == 0) continue
                    m = int(2 * r / left); if (m > r - (left - 1)) m = r - (left - 1); if (m < 1) m = 1
                    q = d[r] / m
                    xd[1] += q; xd[m + 1] -= q
                    nd[r - m] += q; nd[r] -= q
                }
                acc = 0; for (i = 0; i <= B; i++) { acc += xd[i]; x[i] = acc }
                acc = 0; for (i = 0; i <= B; i++) { acc += nd[i]; d[i] = acc }
            }
            mu = 0; for (i = 0; i <= B; i++) mu += i * x[i]
            v = 0; for (i = 0; i <= B; i++) v += (i - mu) * (i - mu) * x[i]
            printf "%d\t%.3f\t%.3f\n", k, mu, sqrt(v)
        }
    }'
}

say "$ACTIVITIES activities of $TOTAL in $PACKETS packets, $STRIPES stripe(s): drawing"
psql_ -v total="$TOTAL" -v packets="$PACKETS" -v stripes="$STRIPES" -v n="$ACTIVITIES" <<'SQL'
CREATE EXTENSION IF NOT EXISTS redpacket;
SET client_min_messages = warning;
DROP TABLE IF EXISTS hist_act, hist_start, hist_draw, hist_theory;
CREATE TABLE hist_act AS
SELECT g AS n, redpacket.rp_create_activity(:'total'::numeric, packets => :packets,
                                            stripes => :stripes) AS aid
  FROM generate_series(1, :n) g;
CREATE TABLE hist_start AS
SELECT s.activity_id, s.stripe, s.balance, s.packets, a.scale
  FROM redpacket.stripe s JOIN redpacket.activity a ON a.id = s.activity_id
 WHERE s.activity_id IN (SELECT aid FROM hist_act);
-- One claim per user, in user order, within each activity; about 1000
-- claims a transaction, so that their transaction-scoped locks stay well
-- within the lock table of a server with default settings.
DO $$
DECLARE
    packets integer := (SELECT max(act.packets) FROM redpacket.activity act
                         WHERE act.id IN (SELECT aid FROM hist_act));
    chunk integer := greatest(1, 1000 / packets);
    lo integer := 1;
    hi integer := (SELECT max(n) FROM hist_act);
BEGIN
    WHILE lo <= hi LOOP
        PERFORM r.status
           FROM hist_act a
           CROSS JOIN generate_series(1, packets) g
           CROSS JOIN LATERAL redpacket.rp_claim(a.aid, 'user-' || g, NULL) r
          WHERE a.n BETWEEN lo AND lo + chunk - 1;
        COMMIT;
        lo := lo + chunk;
    END LOOP;
END $$;
-- Replay each stripe in claim id order: R units and P packets before a draw.
CREATE TABLE hist_draw AS
SELECT d.*, greatest(1, least(2 * d.r / d.p, d.r - (d.p - 1))) AS m
  FROM (SELECT c.activity_id, c.stripe,
               row_number() OVER w AS pos,
               (c.amount * 10::numeric ^ s.scale)::bigint AS u,
               s.balance - coalesce(sum((c.amount * 10::numeric ^ s.scale)::bigint)
                                    OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS r,
               s.packets - row_number() OVER w + 1 AS p,
               s.scale
          FROM redpacket.claim c
          JOIN hist_start s ON s.activity_id = c.activity_id AND s.stripe = c.stripe
        WINDOW w AS (PARTITION BY c.activity_id, c.stripe ORDER BY c.claim_id)) d;
CREATE TABLE hist_theory (pos integer, mu numeric, sigma numeric);
SQL

# Theory only when every activity is one stripe (else stripes differ).
read -r one_stripe B P < <(psql_ -At -F ' ' -c \
    "SELECT count(DISTINCT (balance, packets)) = 1 AND max(stripe) = 0, max(balance), max(packets)
       FROM hist_start")
if [ "$one_stripe" = t ]; then
    theory "$B" "$P" >"$WORK/theory.tsv"
    psql_ -c "\\copy hist_theory FROM '$WORK/theory.tsv'"
fi

# Figures per position, and overall (amounts in currency units).
FIG_SQL=$(cat <<'SQL'
WITH f AS (
    SELECT d.pos::text AS pos, count(*) AS n,
           avg(d.u) AS mean, stddev_samp(d.u) AS sd, min(d.u) AS lo, max(d.u) AS hi,
           count(*) FILTER (WHERE d.u * d.p > 2 * d.r) AS above,
           max(t.mu) AS mu, max(t.sigma) AS sigma, max(d.scale) AS scale, d.pos AS ord
      FROM hist_draw d LEFT JOIN hist_theory t ON t.pos = d.pos
     GROUP BY d.pos
    UNION ALL
    SELECT 'all', count(*), avg(u), stddev_samp(u), min(u), max(u),
           count(*) FILTER (WHERE u * p > 2 * r), NULL, NULL, max(scale), 1e9
      FROM hist_draw)
SELECT pos, n,
       round(mean / 10::numeric ^ scale, scale + 2) AS mean,
       round(mu / 10::numeric ^ scale, scale + 2) AS theory_mean,
       round(sd::numeric / 10::numeric ^ scale, scale + 2) AS std,
       round(sigma / 10::numeric ^ scale, scale + 2) AS theory_std,
       round(lo / 10::numeric ^ scale, scale) AS min,
       round(hi / 10::numeric ^ scale, scale) AS max,
       above AS above_2x_mean,
       round(100.0 * above / n, 2) AS "above_2x_mean_%"
  FROM f ORDER BY ord
SQL
)
SUMMARY_SQL=$(cat <<'SQL'
SELECT count(*) AS draws,
       count(DISTINCT activity_id) AS activities,
       count(*) FILTER (WHERE u < 1) AS below_one_unit,
       count(*) FILTER (WHERE u * p > 2 * r) AS above_2x_mean,
       count(*) FILTER (WHERE r - u < p - 1) AS starves_later,
       count(*) FILTER (WHERE p = 1 AND u <> r) AS last_not_rest,
       (SELECT count(*) FROM hist_act a JOIN redpacket.activity act ON act.id = a.aid
         WHERE act.total IS DISTINCT FROM (SELECT sum(c.amount) FROM redpacket.claim c
                                            WHERE c.activity_id = a.aid)
            OR act.packets <> (SELECT count(*) FROM redpacket.claim c
                                WHERE c.activity_id = a.aid)) AS sum_not_total,
       (SELECT round((max(mean) - min(mean)) / 10::numeric ^ max(scale), max(scale) + 2)
          FROM (SELECT avg(u) AS mean, max(scale) AS scale FROM hist_draw GROUP BY pos) x)
           AS position_mean_spread,
       (SELECT round(sum(u - (m + 1) / 2.0) / sqrt(sum((m * m - 1) / 12.0)), 2)
          FROM hist_draw WHERE p > 1) AS uniform_z
  FROM hist_draw
SQL
)

echo
echo "Lucky draws: $ACTIVITIES activities of $TOTAL in $PACKETS packets, $STRIPES stripe(s) asked"
psql_ -P footer=off -c "$FIG_SQL"
psql_ -P footer=off -x -c "$SUMMARY_SQL"

read -r draws above starves notrest notsum below < <(psql_ -At -F ' ' -c \
    "SELECT count(*), count(*) FILTER (WHERE u * p > 2 * r), count(*) FILTER (WHERE r - u < p - 1),
            count(*) FILTER (WHERE p = 1 AND u <> r),
            (SELECT count(*) FROM (SELECT activity_id FROM hist_draw GROUP BY activity_id
                                   HAVING sum(u) <> (SELECT sum(balance) FROM hist_start s
                                                      WHERE s.activity_id = hist_draw.activity_id)) x),
            count(*) FILTER (WHERE u < 1)
       FROM hist_draw")

# Histogram data: bins of BIN currency units; non-last and last packets apart.
psql_ -c "\\copy (SELECT round((floor(u / 10::numeric ^ scale / $BIN) + 0.5) * $BIN, 4), count(*) FILTER (WHERE p > 1), count(*) FILTER (WHERE p = 1) FROM hist_draw GROUP BY 1 ORDER BY 1) TO '$WORK/hist.dat' WITH (DELIMITER ' ')"
psql_ -c "\\copy (SELECT pos, avg(u) / 10::numeric ^ max(scale), stddev_samp(u) / sqrt(count(*)) / 10::numeric ^ max(scale) FROM hist_draw GROUP BY pos ORDER BY pos) TO '$WORK/pos.dat' WITH (DELIMITER ' ')"
MEAN=$(psql_ -At -c "SELECT round(avg(u) / 10::numeric ^ max(scale), 4) FROM hist_draw")

mkdir -p "$RESULTS"
if command -v gnuplot >/dev/null 2>&1; then
    {
        if gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo; then
            echo "set terminal pngcairo size 1200,540 noenhanced font ',10'"
        else
            echo "set terminal png size 1200,540 noenhanced"
        fi
        echo "set output '$RESULTS/lucky_hist.png'"
        echo "set multiplot layout 1,2 title 'redpacket lucky draws: $ACTIVITIES activities of $TOTAL in $PACKETS packets, $STRIPES stripe(s); $draws draws, $above above twice the mean remaining'"
        echo "set style fill solid 0.6 border -1"
        echo "set style histogram rowstacked"
        echo "set boxwidth $BIN * 0.9"
        echo "set grid ytics"
        echo "set key top right"
        echo "set title 'drawn amounts (bins of $BIN)'"
        echo "set xrange [0:*]"
        echo "set xlabel 'amount'"
        echo "set ylabel 'draws'"
        echo "set arrow from $MEAN, graph 0 to $MEAN, graph 1 nohead dt 2 lc rgb 'black'"
        echo "set arrow from 2 * $MEAN, graph 0 to 2 * $MEAN, graph 1 nohead dt 3 lc rgb 'red'"
        echo "plot '$WORK/hist.dat' using 1:(\$2+\$3) with boxes lc rgb '#d62728' title 'last packet of its stripe', \\"
        echo "     '' using 1:2 with boxes lc rgb '#1f77b4' title 'other draws'"
        echo "unset arrow"
        echo "set title 'mean per draw position (error bars: 3 standard errors)'"
        echo "set xlabel 'position of the draw in its stripe'"
        echo "set ylabel 'mean amount'"
        echo "set xrange [0:$PACKETS + 1]"
        echo "set yrange [$MEAN * 0.8:$MEAN * 1.2]"
        echo "plot '$WORK/pos.dat' using 1:2:(3 * \$3) with yerrorbars pt 7 lc rgb '#1f77b4' title 'measured', \\"
        echo "     $MEAN with lines dt 2 lc rgb 'black' title 'total / packets'"
        echo "unset multiplot"
    } >"$WORK/plot.gp"
    if gnuplot "$WORK/plot.gp" 2>"$WORK/plot.err"; then
        say "wrote $SHOWN/lucky_hist.png"
    else
        say "gnuplot failed:"
        cat "$WORK/plot.err" >&2
    fi
else
    say "no gnuplot (Debian: gnuplot-nox): no histogram"
fi

{
    echo "# Lucky-draw fairness"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $(psql_ -At -c 'SHOW server_version'):" \
         "$ACTIVITIES activities of $TOTAL in $PACKETS packets, $STRIPES stripe(s) asked," \
         "each drained by lucky draws (\`rp_claim\` with amount NULL), one user after another."
    echo "Regenerate with \`bash test/bench/lucky_hist.sh\` (HIST_ACTIVITIES, HIST_PACKETS,"
    echo "HIST_TOTAL, HIST_STRIPES); the histogram is \`lucky_hist.png\` beside this file."
    echo
    echo "Per draw position within its stripe (amounts in currency units). *theory*: exact"
    echo "dynamic programming over the remaining balance of the double-mean draw (uniform on"
    echo "1..min(floor(2R/P), R-(P-1)) minor units, the last packet takes the remainder), one"
    echo "stripe only. *above 2x mean*: draws above twice the mean remaining per packet of the"
    echo "stripe before the draw; the draw allows none."
    echo
    psql_ -At -F '|' -c "$FIG_SQL" | awk -F'|' '
        BEGIN { print "| position | n | mean | theory mean | std | theory std | min | max | above 2x mean | share above 2x mean |"
                print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" }
        { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s%% |\n", $1, $2, $3, ($4 == "" ? "-" : $4), $5, ($6 == "" ? "-" : $6), $7, $8, $9, $10 }'
    echo
    echo "Overall checks (the five counts from *below one minor unit* to *do not sum* must be 0):"
    echo
    psql_ -At -F '|' -c "$SUMMARY_SQL" | awk -F'|' '{
        print "| figure | value |"; print "|---|---:|"
        print "| draws | " $1 " |"
        print "| activities | " $2 " |"
        print "| draws below one minor unit | " $3 " |"
        print "| draws above twice the mean remaining per packet | " $4 " |"
        print "| draws leaving a later packet less than one unit | " $5 " |"
        print "| last packets not taking the exact remainder | " $6 " |"
        print "| activities whose claims do not sum to the total / packets | " $7 " |"
        print "| spread of the position means (max - min) | " $8 " |"
        print "| z of \"every non-last draw uniform on 1..m\" (normal: \\|z\\| < 3) | " $9 " |" }'
} >"$RESULTS/lucky_fairness.md"
say "wrote $SHOWN/lucky_fairness.md"

if [ "$above" != 0 ] || [ "$starves" != 0 ] || [ "$notrest" != 0 ] || [ "$notsum" != 0 ] ||
        [ "$below" != 0 ]; then
    say "FAIL: a bound of the draw violated (above 2x mean $above, starving $starves, last not remainder $notrest, sums off $notsum, below one unit $below)"
    exit 1
fi
say "PASS: $draws draws within the draw's bounds"
