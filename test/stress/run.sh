#!/usr/bin/env bash
# Concurrency stress run for redpacket (make stress).
#
# Starts a throwaway PostgreSQL 15 cluster with redpacket preloaded (the
# reconciliation worker passing every second) and runs rounds of pgbench, one
# per client count (32, 48, 64 by default), each hammering four fresh
# activities with rp_claim:
#   fixed  fixed amounts, 3000 users who keep coming back, 16 stripes; one call
#          in five is made inside a transaction that is then rolled back
#   lucky  lucky draws (amount NULL) on 2000 packets, 16 stripes
#   rain   per_user_limit 3, request ids r1..r5, one stripe (the hottest row)
#   cent7  0.07 at a time from 100.00 over 2 stripes (exactly 1428 fit)
# and, racing the single claims on fixed, rp_claim_batch calls of four users
# and caller transactions that make two claims each.
# Every activity runs out part-way through its round.  Every call is logged
# with its outcome (test/stress/claim_*.pgbench); check.sql then proves the
# invariants and prints PASS/FAIL for each.  Exits non-zero on any FAIL.
# About a minute on two cores.
#
# Environment: STRESS_CLIENTS ("32 48 64": one round per entry),
# STRESS_TXNS pgbench transactions per round (19200), STRESS_JOBS pgbench threads (cores),
# STRESS_SEED, STRESS_VERBOSE=1 (every check's figures for every activity),
# STRESS_HOGS (0: how many busy loops compete for the CPU during the rounds,
# the regime in which a lock protocol's waits stretch and cross),
# REDPACKET_KEEP_CLUSTER=1 (keep the data directory).
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/stress/cluster.sh
source "$HERE/cluster.sh"
rp_drop_root "$HERE/.." stress/run.sh "$@"

ROUNDS=(${STRESS_CLIENTS:-32 48 64})
PER_ROUND=${STRESS_TXNS:-19200}
JOBS=${STRESS_JOBS:-$(nproc 2>/dev/null || echo 2)}
SEED=${STRESS_SEED:-$((RANDOM * 32768 + RANDOM))}
for c in "${ROUNDS[@]}"; do
    if [ "$c" -lt 32 ]; then
        echo "stress: note: $c clients is below the 32 the stress run is meant for" >&2
    fi
done

HOGS=${STRESS_HOGS:-0}
echo "== redpacket stress run: rounds of ${ROUNDS[*]} clients, $PER_ROUND transactions each, seed $SEED, $HOGS CPU hogs"
rp_cluster_start stress "redpacket.reconcile_interval = 1"
rp_psql -f "$HERE/setup.sql"

HOG_PIDS=()
stop_hogs() {
    [ "${#HOG_PIDS[@]}" -eq 0 ] || kill "${HOG_PIDS[@]}" 2>/dev/null || true
    HOG_PIDS=()
}
# stopped with the cluster (a trap of our own would replace the one that stops it)
RP_CLEANUP+=(stop_hogs)
for ((h = 0; h < HOGS; h++)); do
    bash -c 'while :; do :; done' &
    HOG_PIDS+=($!)
done

TXNS=0
FAILED_TX=0
PGBENCH_WHY=()
ELAPSED=0
pgbench_fail=0
round=0
for clients in "${ROUNDS[@]}"; do
    round=$((round + 1))
    tx=$(( (PER_ROUND + clients - 1) / clients ))
    jobs=$JOBS
    [ "$jobs" -le "$clients" ] || jobs=$clients
    declare -A ACT=()
    while IFS='|' read -r kind id; do
        ACT[$kind]=$id
    done < <(rp_psql -At -F'|' -v round="$round" -f "$HERE/round.sql")
    for kind in fixed lucky rain cent7; do
        if [ -z "${ACT[$kind]:-}" ]; then
            echo "stress: round $round did not create activity '$kind'" >&2
            exit 1
        fi
    done
    log="$RP_DIR/pgbench-$round.log"
    start=$(date +%s.%N)
    rc=0
    # --max-tries: a transaction may be a deadlock victim (40P01) where
    # two-claim transactions run (see the check below) and is retried.
    "$PGBIN/pgbench" -n -M prepared -c "$clients" -j "$jobs" -t "$tx" --random-seed="$((SEED + round))" \
        --max-tries=10 -l --log-prefix="$RP_DIR/txlog-$round" \
        -D fixed="${ACT[fixed]}" -D lucky="${ACT[lucky]}" -D rain="${ACT[rain]}" -D cent7="${ACT[cent7]}" \
        -f "$HERE/claim_fixed.pgbench@4" -f "$HERE/claim_rollback.pgbench@1" \
        -f "$HERE/claim_lucky.pgbench@3" -f "$HERE/claim_rain.pgbench@2" \
        -f "$HERE/claim_cent7.pgbench@2" -f "$HERE/claim_batch.pgbench@1" \
        -f "$HERE/claim_pair.pgbench@1" >"$log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    ELAPSED=$(awk -v a="$ELAPSED" -v b="$secs" 'BEGIN { printf "%.2f", a + b }')
    # pgbench's per-script counts are not reliable with several threads; its
    # totals are.
    done_tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\)\/.*/\1/p' "$log")
    failed_tx=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$log")
    TXNS=$((TXNS + clients * tx))
    FAILED_TX=$((FAILED_TX + ${failed_tx:-0}))
    if [ "$rc" -ne 0 ] || [ "${done_tx:-0}" -ne $((clients * tx)) ] || [ "${failed_tx:-0}" -ne 0 ]; then
        pgbench_fail=$((pgbench_fail + 1))
        PGBENCH_WHY+=("round $round: exit $rc, ${done_tx:-?} of $((clients * tx)) transactions succeeded, ${failed_tx:-?} failed")
    fi
    tps=$(sed -n 's/^tps = \([0-9]*\).*/\1/p' "$log" | head -n 1)
    lat=$(sed -n 's/^latency average = \(.*\)$/\1/p' "$log" | head -n 1)
    printf 'round %s: %3s clients x %s transactions in %5.1f s  (%s tps, latency %s)\n' \
        "$round" "$clients" "$tx" "$secs" "${tps:-?}" "${lat:-?}"
    if [ "$rc" -ne 0 ]; then
        echo "  pgbench exited with $rc; its output (last 30 lines):"
        tail -n 30 "$log" | sed 's/^/    /'
    elif [ "${failed_tx:-0}" -ne 0 ]; then
        echo "  $failed_tx transactions failed:" \
            "$(grep -m1 -o 'ERROR: .*\|error: .*\|deadlock detected' "$log" "$RP_DIR/server.log" | head -n 1 | sed 's/^[^:]*://')"
    fi
done
stop_hogs

echo
echo "-- outcomes by activity"
rp_psql -P footer=off -c "
    SELECT sa.label AS activity, sa.descr AS scenario, count(l.*) AS calls,
           count(*) FILTER (WHERE l.status = 'claimed' AND NOT l.rolled_back) AS claimed,
           count(*) FILTER (WHERE l.status = 'duplicate') AS duplicate,
           count(*) FILTER (WHERE l.status = 'exhausted') AS exhausted,
           count(*) FILTER (WHERE l.status = 'user_limit') AS user_limit,
           count(*) FILTER (WHERE l.status = 'claimed' AND l.rolled_back) AS rolled_back,
           count(*) FILTER (WHERE l.batch) AS in_batch,
           count(*) FILTER (WHERE l.txn_calls = 2) AS in_pair,
           count(*) FILTER (WHERE l.status NOT IN ('claimed', 'duplicate', 'exhausted', 'user_limit')
                              OR l.status IS NULL) AS other
    FROM stress_activity sa LEFT JOIN stress_log l ON l.activity_id = sa.id
    GROUP BY sa.id, sa.label, sa.descr ORDER BY sa.id"

echo
echo "-- invariants (each over all activities of all rounds)"
fails=0
checks=0
# Not ON_ERROR_STOP: a check that errors must not hide the others.
verbose=()
[ "${STRESS_VERBOSE:-0}" != 1 ] || verbose=(-v verbose=1)
"$PGBIN/psql" -X -q -At -F'|' -v txns="$TXNS" "${verbose[@]}" -f "$HERE/check.sql" \
    >"$RP_DIR/check.out" 2>"$RP_DIR/check.err" || true
if grep -q 'ERROR\|FATAL\|psql:' "$RP_DIR/check.err"; then
    checks=$((checks + 1))
    fails=$((fails + 1))
    echo "FAIL  check.sql: a check errored (its result is missing below):"
    sed 's/^/        /' "$RP_DIR/check.err" | head -n 20
fi
while IFS='|' read -r verdict name detail; do
    if [ "$verdict" = ROW ]; then
        printf '        %s | %s\n' "$name" "$detail"
        continue
    fi
    checks=$((checks + 1))
    [ "$verdict" = PASS ] || fails=$((fails + 1))
    printf '%s  %s: %s\n' "$verdict" "$name" "$detail"
done <"$RP_DIR/check.out"

checks=$((checks + 1))
if [ "$pgbench_fail" -eq 0 ]; then
    echo "PASS  no call failed with an error: all $TXNS pgbench transactions succeeded"
else
    echo "FAIL  no call failed with an error: $FAILED_TX of $TXNS transactions failed ($(IFS=';'; echo "${PGBENCH_WHY[*]}"))"
    fails=$((fails + 1))
fi

# Deadlock victims, by the statement that was cancelled.  The protocol
# (src/claim/locks.c) leaves one kind of cycle: one a transaction that made an
# earlier claim closes; PostgreSQL's check then fails the waiter that finds
# it, which may be a claim or batch queued on a lock of that cycle.  So a
# victim is a two-claim transaction (its statements name the column
# txn_calls) or a call on the activity they run on (marked "/* fixed */");
# never a call on the other activities, where every transaction makes one
# call, nor the worker or an operator's call.
read -r victims pair_victims beside < <(awk '
    function count() {
        if (text ~ /txn_calls/) pair++
        else if (text ~ /\/\* fixed \*\//) beside++
        stmt = 0
    }
    /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] / {
        if (stmt) count()
        if ($0 ~ /ERROR:  deadlock detected/) { dl = 1; n++ }
        else if (dl && $0 ~ /STATEMENT:/) { stmt = 1; dl = 0; text = "" }
    }
    { if (stmt) text = text $0 }
    END { if (stmt) count(); print n + 0, pair + 0, beside + 0 }' "$RP_DIR/server.log")
checks=$((checks + 1))
if [ "$victims" -eq $((pair_victims + beside)) ]; then
    echo "PASS  deadlock victims only where two-claim transactions run: $victims ($pair_victims two-claim transactions, $beside calls queued beside them; retried by pgbench)"
else
    echo "FAIL  deadlock victims: $victims, of which $pair_victims two-claim transactions and $beside calls on their activity"
    fails=$((fails + 1))
fi

# How often one transaction lost in a row: the retries of each (the last
# field of pgbench's per-transaction log lines).
read -r retried worst < <(cat "$RP_DIR"/txlog-* | awk '
    { r = $NF; if (r > 0) n++; if (r > w) w = r }
    END { print n + 0, w + 0 }')
checks=$((checks + 1))
if [ "$worst" -le 2 ]; then
    echo "PASS  no transaction lost more than twice in a row: $retried retried, at most $worst times"
else
    echo "FAIL  a transaction lost $worst times in a row ($retried transactions retried)"
    fails=$((fails + 1))
fi

checks=$((checks + 1))
problems=$(rp_server_problems | grep -v 'ERROR:  deadlock detected' || true)
if [ -z "$problems" ]; then
    echo "PASS  server log: no WARNING, ERROR, FATAL or PANIC but the deadlocks above"
else
    echo "FAIL  server log: $(printf '%s\n' "$problems" | wc -l) lines at WARNING or worse; by message:"
    printf '%s\n' "$problems" | sed -E 's/^.*\] //' | sort | uniq -c | sort -rn | head -n 10 | sed 's/^/        /'
    echo "      the first one in full:"
    grep -m1 -A6 -E '(WARNING|ERROR|FATAL|PANIC):' "$RP_DIR/server.log" | cut -c1-220 | sed 's/^/        /'
    fails=$((fails + 1))
fi

read -r calls claimed duplicate exhausted user_limit rolled_back < <(rp_psql -At -F' ' -c "
    SELECT count(*), count(*) FILTER (WHERE status = 'claimed' AND NOT rolled_back),
           count(*) FILTER (WHERE status = 'duplicate'), count(*) FILTER (WHERE status = 'exhausted'),
           count(*) FILTER (WHERE status = 'user_limit'), count(*) FILTER (WHERE status = 'claimed' AND rolled_back)
    FROM stress_log")
rate=$(awk -v n="$TXNS" -v t="$ELAPSED" 'BEGIN { printf "%.0f", n / t }')
clients_list=$(IFS=/; echo "${ROUNDS[*]}")

echo
echo "stress figures: clients $clients_list, calls $calls ($TXNS transactions), claimed $claimed, duplicate $duplicate," \
     "exhausted $exhausted, user_limit $user_limit, claimed then rolled back $rolled_back," \
     "elapsed ${ELAPSED} s under load (${rate} transactions/s)"
if [ "$fails" -eq 0 ]; then
    echo "stress: all $checks checks PASS"
else
    echo "stress: $fails of $checks checks FAIL"
    if mkdir -p "$HERE/out" 2>/dev/null; then
        cp "$RP_DIR/server.log" "$RP_DIR"/pgbench-*.log "$RP_DIR/check.out" "$HERE/out/" 2>/dev/null || true
        echo "server log, pgbench output and check results kept in $HERE/out"
    fi
    exit 1
fi
