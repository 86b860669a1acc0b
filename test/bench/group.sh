#!/usr/bin/env bash
# Group red packets (make bench-group; also the last part of make bench):
# many small activities, each created, claimed out and expired within
# seconds, and the reconciler keeping up with them.
#
# On a throwaway cluster (the benchmark's durable settings), first the
# sustained run: GROUP_SUSTAIN seconds of group_redpacket (below) at
# GROUP_SUSTAIN_CLIENTS clients with redpacket.reconcile_interval =
# GROUP_INTERVAL, sampling every GROUP_SAMPLE seconds the activities created
# more than GROUP_LAG seconds earlier and never checked, and those that ended
# more than GROUP_LAG seconds earlier and are still unsettled; after the
# load, how long until both are 0, and a full rp_reconcile.  Then, with the
# reconciler paused so that these compare the claim engine and the plain SQL
# only, side by side, GROUP_CLIENTS clients, GROUP_SECONDS each (after a
# warm-up of GROUP_WARMUP seconds):
#   group_redpacket   a pgbench transaction creates a 10-packet lucky draw of
#                     20.00 ending 20 s later (rp_create_activity) and makes
#                     its 10 claims (rp_claim, new users)
#   group_plain       the same in plain SQL: INSERT a packet row, then 10
#                     conditional UPDATE ... RETURNING feeding an INSERT of
#                     the claim (bench.packet, bench.claim)
#   create_redpacket  rp_create_activity of a 10-packet lucky draw alone
#   create_plain      the INSERT of a packet row alone
# Each pair runs a warm-up round (not counted: the first run on a new
# cluster pays for touching its shared memory), then GROUP_ROUNDS rounds
# alternating which goes first; a workload's figure is its median round, so
# that a burst of autovacuum or a neighbour's load in one run does not
# decide the ratio.  Every run is checked: every packet paid out, its money
# adding up.
#
# Targets: group_redpacket >= 0.9x group_plain packets/s; both lag counts 0
# at every sample after the first GROUP_LAG seconds; create_redpacket within
# 2x create_plain.  Writes test/bench/results/{group.csv,group_lag.csv,
# group_meta.csv} and re-renders results.md unless BENCH_NO_REPORT=1.
#
# Environment: GROUP_CLIENTS (32), GROUP_SECONDS (15), GROUP_WARMUP (3),
# GROUP_ROUNDS (3; 1 with BENCH_QUICK=1),
# GROUP_SUSTAIN (60), GROUP_SUSTAIN_CLIENTS (16), GROUP_INTERVAL (5),
# GROUP_SAMPLE (5), GROUP_LAG (10), GROUP_ONLY ("throughput sustain": one of
# them), BENCH_QUICK=1 (5 s runs, a 30 s sustained run), BENCH_KEEP=1,
# BENCH_JOBS.  Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail

BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BENCH_GIT_REV=${BENCH_GIT_REV:-$(git -C "$BENCH_HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)}
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root group.sh "$@"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    SECS=${GROUP_SECONDS:-5}
    SUSTAIN=${GROUP_SUSTAIN:-30}
    ROUNDS=${GROUP_ROUNDS:-1}
else
    SECS=${GROUP_SECONDS:-15}
    SUSTAIN=${GROUP_SUSTAIN:-60}
    ROUNDS=${GROUP_ROUNDS:-3}
fi
CLIENTS=${GROUP_CLIENTS:-32}
WARM=${GROUP_WARMUP:-3}
SCLIENTS=${GROUP_SUSTAIN_CLIENTS:-16}
INTERVAL=${GROUP_INTERVAL:-5}
SAMPLE=${GROUP_SAMPLE:-5}
LAG=${GROUP_LAG:-10}
ONLY=" ${GROUP_ONLY:-throughput sustain} "
JOBS=${BENCH_JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$JOBS" -le "$CLIENTS" ] || JOBS=$CLIENTS
want() { [[ "$ONLY" == *" $1 "* ]]; }

mkdir -p "$BENCH_RESULTS"
echo "== group red packets: $CLIENTS clients x ${SECS} s a run; sustained $SCLIENTS clients x ${SUSTAIN} s," \
     "reconcile_interval $INTERVAL, lag counted past ${LAG} s"
bench_cluster_start group
mkdir -p "$BENCH_DIR/log"
bench_psql -f "$BENCH_HERE/setup.sql"
bench_psql <<'EOF'
-- The plain-SQL group packet: one row holds what is left; each claim is a
-- conditional UPDATE of it (double-mean lucky amount, at least 0.01 a
-- packet) whose RETURNING feeds the INSERT of the claim.
CREATE TABLE bench.packet (
    id           bigserial PRIMARY KEY,
    total        numeric NOT NULL,
    remaining    numeric NOT NULL,
    packets_left integer NOT NULL,
    ends_at      timestamptz NOT NULL,
    last_draw    numeric,
    created_at   timestamptz NOT NULL DEFAULT now()
);
EOF

FAILS=0
CHECKS=0
pass() { CHECKS=$((CHECKS + 1)); echo "    PASS  $*"; }
fail() { CHECKS=$((CHECKS + 1)); FAILS=$((FAILS + 1)); echo "    FAIL  $*"; }

# The scripts: :n numbers a client's transactions, so user ids are new.
cat >"$BENCH_DIR/group_redpacket.pgbench" <<'EOF'
\set n :n + 1
BEGIN;
SELECT redpacket.rp_create_activity(20.00, 10, ends_at => now() + interval '20 s') AS act \gset
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-1');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-2');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-3');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-4');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-5');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-6');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-7');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-8');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-9');
SELECT status FROM redpacket.rp_claim(:act, 'g' || :client_id || '-' || :n || '-10');
COMMIT;
EOF
{
    echo '\set n :n + 1'
    echo 'BEGIN;'
    echo "INSERT INTO bench.packet (total, remaining, packets_left, ends_at) VALUES (20.00, 20.00, 10, now() + interval '20 s') RETURNING id AS act \\gset"
    for k in 1 2 3 4 5 6 7 8 9 10; do
        echo '\set r random(1, 1000000)'
        # the draw, from the row before the update: the last packet takes
        # what is left; others up to twice the mean, leaving 0.01 a packet
        echo "WITH u AS (UPDATE bench.packet SET"
        echo "      last_draw = CASE WHEN packets_left = 1 THEN remaining ELSE greatest(0.01, least(remaining - (packets_left - 1) * 0.01, trunc(2 * remaining / packets_left * :r / 1000000, 2))) END,"
        echo "      remaining = remaining - CASE WHEN packets_left = 1 THEN remaining ELSE greatest(0.01, least(remaining - (packets_left - 1) * 0.01, trunc(2 * remaining / packets_left * :r / 1000000, 2))) END,"
        echo "      packets_left = packets_left - 1"
        echo "    WHERE id = :act AND packets_left > 0 AND ends_at > now() RETURNING id, last_draw)"
        echo "INSERT INTO bench.claim (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
        echo "SELECT id, 'g' || :client_id || '-' || :n || '-$k', NULL, '', last_draw, 0, now() FROM u;"
    done
    echo 'COMMIT;'
} >"$BENCH_DIR/group_plain.pgbench"
cat >"$BENCH_DIR/create_redpacket.pgbench" <<'EOF'
SELECT redpacket.rp_create_activity(20.00, 10, ends_at => now() + interval '20 s');
EOF
cat >"$BENCH_DIR/create_plain.pgbench" <<'EOF'
INSERT INTO bench.packet (total, remaining, packets_left, ends_at) VALUES (20.00, 20.00, 10, now() + interval '20 s');
EOF

# Transactions started in the measured window (the last SECS seconds after
# WARM), from pgbench's per-transaction log on stdin: "count p50_ms p99_ms".
window() {
    awk -v secs="$SECS" -v warm="$WARM" '
        { s = $5 + $6 / 1e6 - $3 / 1e6; st[NR] = s; l[NR] = $3
          if (NR == 1 || s < smin) smin = s }
        END { lo = smin + warm; hi = lo + secs
              for (i = 1; i <= NR; i++) if (st[i] >= lo && st[i] < hi) print l[i] }' |
        sort -g | awk '{ v[++n] = $1 }
            END { if (n == 0) { print "0 NA NA"; exit }
                  i50 = int(n * 0.50 + 0.999999); i99 = int(n * 0.99 + 0.999999)
                  printf "%d %.3f %.3f\n", n, v[i50] / 1000, v[i99] / 1000 }'
}

declare -A RATE=() ROUND_LINES=() FAILED=()
# run WORKLOAD PACKETS_PER_TRANSACTION ROUND: one timed run, its line kept
# as "rate transactions p50 p99"
run() {
    local w=$1 per=$2 round=$3 log="$BENCH_DIR/log/$1.$3" rc=0 n p50 p99 rate
    bench_psql -c CHECKPOINT
    "$PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j "$JOBS" -T $((SECS + WARM + 2)) -D n=$((round * 100000000)) \
        -f "$BENCH_DIR/$w.pgbench" --log --log-prefix="$log" >"$log.out" 2>&1 || rc=$?
    read -r n p50 p99 < <(cat "$log".[0-9]* 2>/dev/null | window)
    rm -f "$log".[0-9]*
    rate=$(awk -v n="$n" -v k="$per" -v s="$SECS" 'BEGIN { printf "%.0f", n * k / s }')
    printf '%-17s clients %-3s %7s packets/s  p50 %8s ms  p99 %8s ms  (%s transactions measured; round %s)\n' \
        "$w" "$CLIENTS" "$rate" "$p50" "$p99" "$n" "$round"
    if [ "$rc" -ne 0 ] || grep -q 'aborted\|^number of failed transactions: [1-9]' "$log.out"; then
        fail "pgbench $w: exit $rc"
        grep -v '^progress' "$log.out" | tail -n 10 | sed 's/^/        /'
        FAILED[$w]=1
    fi
    [ "$round" -eq 0 ] || ROUND_LINES[$w]+="$rate $n $p50 $p99"$'\n'
}

# pair A B PER: a warm-up round (round 0, not counted: the first run on a
# new cluster pays for touching its shared memory), then ROUNDS rounds of A
# and B, alternating which runs first
pair() {
    local r
    for r in $(seq 0 "$ROUNDS"); do
        if [ $((r % 2)) -eq 0 ]; then run "$1" "$3" "$r"; run "$2" "$3" "$r"
        else run "$2" "$3" "$r"; run "$1" "$3" "$r"; fi
    done
}

# the median round of each workload into RATE and group.csv
medians() {
    local w rate n p50 p99
    for w in "$@"; do
        read -r rate n p50 p99 < <(printf '%s' "${ROUND_LINES[$w]}" | sort -n |
                                   awk '{ l[NR] = $0 } END { print l[int((NR + 1) / 2)] }')
        RATE[$w]=$rate
        [ "$ROUNDS" -eq 1 ] ||
            printf '%-17s median of %s rounds: %s packets/s\n' "$w" "$ROUNDS" "$rate"
        echo "$w,$CLIENTS,$SECS,$n,$rate,$p50,$p99,$([ -n "${FAILED[$w]:-}" ] && echo FAIL || echo PASS)" \
            >>"$BENCH_DIR/group.csv"
    done
}

echo "workload,clients,seconds,transactions,packets_per_s,p50_ms,p99_ms,invariants" >"$BENCH_DIR/group.csv"
echo "second,activities,never_checked,expired_unsettled,last_pass_s_ago,last_pass_activities,last_pass_ms" >"$BENCH_DIR/group_lag.csv"
if want sustain; then
    echo
    echo "-- sustained: $SCLIENTS clients x ${SUSTAIN} s, reconcile_interval = $INTERVAL"
    bench_psql -c "ALTER SYSTEM SET redpacket.reconcile_interval = $INTERVAL" -c "SELECT pg_reload_conf()" >/dev/null
    # a clean start: anything open checked and settled, the counts from now
    # (it runs first, so that the side-by-side runs leave it no backlog)
    bench_psql -At -c "SELECT pg_sleep(GREATEST(0, extract(epoch FROM max(ends_at) - now())) + 1)
                         FROM redpacket.activity WHERE closed_at IS NULL" >/dev/null
    bench_psql -c "CALL redpacket.rp_reconcile_strict(false, '5 min')" >/dev/null
    bench_psql -c "SELECT redpacket.rp_stats_reset()" >/dev/null
    lag_q="SELECT count(*),
                  count(*) FILTER (WHERE r.last_pass_at IS NULL AND a.created_at < now() - interval '$LAG s'),
                  count(*) FILTER (WHERE a.closed_at IS NULL AND a.ends_at < now() - interval '$LAG s')
             FROM redpacket.activity a LEFT JOIN redpacket.reconcile_state r ON r.activity_id = a.id
            WHERE a.created_at > '$(bench_psql -At -c 'SELECT now()')'"
    t0=$(date +%s)
    "$PGBIN/pgbench" -n -M prepared -c "$SCLIENTS" -j "$JOBS" -T "$SUSTAIN" -D n=0 \
        -f "$BENCH_DIR/group_redpacket.pgbench" >"$BENCH_DIR/log/sustain.out" 2>&1 &
    pb=$!
    late=0
    while kill -0 "$pb" 2>/dev/null; do
        sleep "$SAMPLE"
        s=$(($(date +%s) - t0))
        IFS='|' read -r acts never unsettled < <(bench_psql -At -F'|' -c "$lag_q")
        IFS='|' read -r pass_ago pass_ms pass_n < <(bench_psql -At -F'|' -c "
            SELECT round(extract(epoch FROM now() - last_pass_finished_at)), round(last_pass_ms), activities_checked
              FROM redpacket.reconciler")
        printf '  %4s s: %7s activities, %6s never checked, %6s expired and unsettled (older than %s s); last pass %s s ago: %s in %s ms\n' \
            "$s" "$acts" "$never" "$unsettled" "$LAG" "$pass_ago" "$pass_n" "$pass_ms"
        echo "$s,$acts,$never,$unsettled,$pass_ago,$pass_n,$pass_ms" >>"$BENCH_DIR/group_lag.csv"
        if [ "$s" -gt "$LAG" ] && { [ "$never" != 0 ] || [ "$unsettled" != 0 ]; }; then
            late=$((late + 1))
        fi
    done
    rc=0
    wait "$pb" || rc=$?
    sust=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$BENCH_DIR/log/sustain.out")
    echo "  $((${sust:-0} * 10 / SUSTAIN)) packets/s over the sustained run"
    [ "$rc" -eq 0 ] || fail "sustained pgbench: exit $rc"
    # after the load: until everything ended is settled
    t1=$(date +%s)
    while true; do
        IFS='|' read -r acts never unsettled < <(bench_psql -At -F'|' -c "
            SELECT count(*), count(*) FILTER (WHERE r.last_pass_at IS NULL),
                   count(*) FILTER (WHERE a.closed_at IS NULL)
              FROM redpacket.activity a LEFT JOIN redpacket.reconcile_state r ON r.activity_id = a.id")
        [ "$never" != 0 ] || [ "$unsettled" != 0 ] || break
        [ $(($(date +%s) - t1)) -lt 300 ] || break
        sleep 1
    done
    drain=$(($(date +%s) - t1))
    echo "  after the load: $never never checked, $unsettled unsettled after $drain s"
    bench_psql -At -c "SELECT last_pass_started_at, last_pass_ms, activities_checked FROM redpacket.reconciler" |
        sed 's/^/  last pass: /'
    if [ "$late" -eq 0 ]; then
        pass "no activity waited more than $LAG s for its first check or its settlement (every sample after the first $LAG s)"
    else
        fail "$late samples after the first $LAG s had activities waiting more than $LAG s"
    fi
    bad=$(bench_psql -At -c "SELECT count(*) FROM redpacket.rp_reconcile(NULL, true) WHERE NOT ok")
    if [ "$bad" = 0 ]; then pass "a full rp_reconcile afterwards: every check ok"; else fail "a full rp_reconcile: $bad checks not ok"; fi
    n_bad=$(bench_psql -At -c "SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok")
    [ "$n_bad" = 0 ] && pass "no check of the worker failed" || fail "$n_bad checks of the worker failed"
    # the side-by-side runs compare the claim engine and plain SQL alone
    bench_psql -c "ALTER SYSTEM SET redpacket.reconcile_interval = 0" -c "SELECT pg_reload_conf()" >/dev/null
fi

if want throughput; then
    echo
    echo "-- side by side, reconciler paused, $ROUNDS round(s) alternating"
    pair group_redpacket group_plain 10
    medians group_redpacket group_plain
    out=$(bench_psql -At -F'|' -c "
        SELECT count(*), count(*) FILTER (WHERE s.claims <> 10 OR s.packets <> 0 OR s.balance <> 0),
               count(*) FILTER (WHERE c.n <> 10 OR c.amount <> 20.00)
          FROM redpacket.activity a
         CROSS JOIN LATERAL (SELECT sum(claims) AS claims, sum(packets) AS packets, sum(balance) AS balance
                               FROM redpacket.stripe x WHERE x.activity_id = a.id) s
         CROSS JOIN LATERAL (SELECT count(*) AS n, sum(amount) AS amount
                               FROM redpacket.claim x WHERE x.activity_id = a.id) c")
    IFS='|' read -r acts bad_stripes bad_claims <<<"$out"
    if [ "$bad_stripes" = 0 ] && [ "$bad_claims" = 0 ] && [ "$acts" -gt 0 ]; then
        pass "group_redpacket: $acts activities, each 10 claims adding up to 20.00, every stripe empty"
    else
        fail "group_redpacket: of $acts activities, $bad_stripes with stripes not empty, $bad_claims with claims not 10 adding up to 20.00"
    fi
    out=$(bench_psql -At -F'|' -c "
        SELECT count(*), count(*) FILTER (WHERE p.packets_left <> 0 OR p.remaining <> 0 OR c.n <> 10 OR c.amount <> 20.00)
          FROM bench.packet p
         CROSS JOIN LATERAL (SELECT count(*) AS n, sum(amount) AS amount
                               FROM bench.claim x WHERE x.activity_id = p.id) c")
    IFS='|' read -r acts bad <<<"$out"
    if [ "$bad" = 0 ] && [ "$acts" -gt 0 ]; then
        pass "group_plain: $acts packets, each 10 claims adding up to 20.00"
    else
        fail "group_plain: $bad of $acts packets do not add up"
    fi
    pair create_redpacket create_plain 1
    medians create_redpacket create_plain
fi

CHECKS=$((CHECKS + 1))
problems=$(bench_server_problems)
if [ -z "$problems" ]; then
    echo "    PASS  server log: no WARNING, ERROR, FATAL or PANIC"
else
    echo "    FAIL  server log: $(printf '%s\n' "$problems" | wc -l) lines at WARNING or worse, e.g.:"
    printf '%s\n' "$problems" | head -n 5 | cut -c1-200 | sed 's/^/        /'
    FAILS=$((FAILS + 1))
fi

cp "$BENCH_DIR/group.csv" "$BENCH_DIR/group_lag.csv" "$BENCH_RESULTS/"
{
    echo "key,value"
    echo "date,$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "git,$BENCH_GIT_REV"
    echo "clients,$CLIENTS"
    echo "seconds,$SECS"
    echo "rounds,$ROUNDS"
    echo "sustain_clients,$SCLIENTS"
    echo "sustain_seconds,$SUSTAIN"
    echo "interval,$INTERVAL"
    echo "lag,$LAG"
    echo "load_at_end,$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$BENCH_RESULTS/group_meta.csv"
bench_cleanup

echo
ratio() { awk -v a="${RATE[$1]:-0}" -v b="${RATE[$2]:-0}" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }
if want throughput; then
    r=$(ratio group_redpacket group_plain)
    if awk -v r="$r" 'BEGIN { exit !(r >= 0.9) }'; then pass "group packets/s, redpacket / plain SQL: ${r}x (target >= 0.9x)"
    else fail "group packets/s, redpacket / plain SQL: ${r}x (target >= 0.9x)"; fi
    r=$(ratio create_plain create_redpacket)
    if awk -v r="$r" 'BEGIN { exit !(r <= 2) }'; then pass "creation cost, rp_create_activity / a plain insert: ${r}x (target <= 2x)"
    else fail "creation cost, rp_create_activity / a plain insert: ${r}x (target <= 2x)"; fi
fi
if [ "${BENCH_NO_REPORT:-0}" != 1 ]; then
    bash "$BENCH_HERE/report.sh" "$BENCH_RESULTS" >/dev/null
    echo "wrote ${BENCH_RESULTS_SHOWN:-$BENCH_RESULTS}/group.csv, group_lag.csv and results.md"
fi
[ "$FAILS" -eq 0 ]
