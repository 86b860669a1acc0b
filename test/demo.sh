#!/usr/bin/env bash
# redpacket demo (make demo): sets the machine up, starts a throwaway
# PostgreSQL 15 cluster with redpacket preloaded, and shows
#   (a) the seed scenario: an activity of 200.00 and 20 users who each claim
#       50.00 at the same moment: 4 are paid, 16 are told it is exhausted;
#       and, for contrast, the same race against a naive check-then-pay table;
#   (b) a larger run: 64 concurrent clients, 10,000 users (many retrying), an
#       activity that runs out part-way, then the books checked.
# The cluster is stopped and removed at the end.  Run as root (it sets up the
# machine, then runs the cluster as postgres) or as a user with sudo.
# REDPACKET_SKIP_SETUP=1 skips test/setup.sh (the extension is installed).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "${REDPACKET_SKIP_SETUP:-0}" != 1 ]; then
    echo "== setting up (test/setup.sh)"
    bash "$HERE/setup.sh"
fi
# shellcheck source=test/stress/cluster.sh
source "$HERE/stress/cluster.sh"
rp_drop_root "$HERE" demo.sh "$@"

echo "== starting a throwaway PostgreSQL 15 cluster with shared_preload_libraries = 'redpacket'"
rp_cluster_start demo
echo "   data, socket and log in $RP_DIR, port $PGPORT; removed on exit"
rp_psql -c "CREATE EXTENSION redpacket"
W=$RP_DIR/work
mkdir -p "$W"

# A start gate: the clients queue on an advisory lock that one session holds
# until all of them are waiting, then they all go at once.
GATE=4242
# gate_close WAITERS: returns once the gate is shut; it opens by itself as
# soon as WAITERS sessions queue on it (or after 20 s).
gate_close() {
    local waiters=$1 i
    rp_psql -c "SELECT pg_advisory_lock($GATE)" -c "
        DO \$\$
        BEGIN
            FOR i IN 1 .. 400 LOOP
                EXIT WHEN (SELECT count(*) FROM pg_locks
                           WHERE locktype = 'advisory' AND objid = $GATE AND NOT granted) >= $waiters;
                PERFORM pg_sleep(0.05);
            END LOOP;
        END
        \$\$" >/dev/null &
    GATE_PID=$!
    for i in $(seq 1 200); do
        [ "$(rp_psql -At -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                             AND objid = $GATE AND granted")" = 0 ] || return 0
        sleep 0.05
    done
    echo "the start gate did not close" >&2
    return 1
}

# (a) The seed scenario ---------------------------------------------------
echo
echo "== (a) an activity of 200.00; 20 users each claim 50.00 at the same moment"
SEED_ACT=$(rp_psql -At -c "
    CREATE TABLE seed_outcome (user_id text, status text, claim_id bigint, amount numeric);
    CREATE TABLE naive_budget (balance numeric NOT NULL);
    INSERT INTO naive_budget VALUES (200.00);
    CREATE TABLE naive_paid (user_id text, amount numeric);
    -- The naive way: read the balance, and if it covers the claim, pay it.
    CREATE FUNCTION naive_claim(u text, amt numeric) RETURNS text LANGUAGE plpgsql AS \$\$
    BEGIN
        IF (SELECT balance FROM naive_budget) >= amt THEN
            PERFORM pg_sleep(0.05);   -- the application does something in between
            UPDATE naive_budget SET balance = balance - amt;
            INSERT INTO naive_paid VALUES (u, amt);
            RETURN 'paid';
        END IF;
        RETURN 'refused';
    END
    \$\$;
    SELECT redpacket.rp_create_activity(200.00, name => 'seed: 200.00, 20 x 50.00')")
cat >"$W/seed.pgbench" <<EOF
\set uid :client_id + 1
SELECT pg_advisory_lock_shared($GATE);
SELECT pg_advisory_unlock_shared($GATE);
INSERT INTO seed_outcome SELECT 'user' || lpad(:uid::text, 2, '0'), r.status, r.claim_id, r.amount
FROM redpacket.rp_claim($SEED_ACT, 'user' || lpad(:uid::text, 2, '0'), 50.00) AS r;
EOF
cat >"$W/naive.pgbench" <<EOF
\set uid :client_id + 1
SELECT pg_advisory_lock_shared($GATE);
SELECT pg_advisory_unlock_shared($GATE);
SELECT naive_claim('user' || lpad(:uid::text, 2, '0'), 50.00);
EOF

gate_close 20
"$PGBIN/pgbench" -n -c 20 -j 2 -t 1 -f "$W/seed.pgbench" >"$W/seed.log" 2>&1 ||
    { cat "$W/seed.log"; exit 1; }
wait "$GATE_PID"
rp_psql -At -c "
    SELECT string_agg(rpad(user_id || ' ' || status || coalesce(' ' || amount, ''), 22), '' ORDER BY user_id)
    FROM (SELECT *, (row_number() OVER (ORDER BY user_id) - 1) / 4 AS line FROM seed_outcome) o
    GROUP BY line ORDER BY line" | sed 's/^/   /'
rp_psql -At -c "
    SELECT format('   %s claimed, %s exhausted, remaining %s',
                  count(*) FILTER (WHERE o.status = 'claimed'),
                  count(*) FILTER (WHERE o.status = 'exhausted'),
                  (SELECT remaining_amount FROM redpacket.activity_status WHERE id = $SEED_ACT))
    FROM seed_outcome o"
extra=$(rp_psql -At -c "SELECT count(*) FROM seed_outcome WHERE status NOT IN ('claimed', 'exhausted')")
[ "$extra" = 0 ] || echo "   (and $extra other outcomes)"

gate_close 20
"$PGBIN/pgbench" -n -c 20 -j 2 -t 1 -f "$W/naive.pgbench" >"$W/naive.log" 2>&1 ||
    { cat "$W/naive.log"; exit 1; }
wait "$GATE_PID"
rp_psql -At -c "
    SELECT format('   for contrast, read-then-pay on a plain table, same race: %s paid, %s out of 200.00, balance %s',
                  count(*), coalesce(sum(amount), 0), (SELECT balance FROM naive_budget))
    FROM naive_paid"

# (b) A larger concurrent run ---------------------------------------------
CLIENTS=${DEMO_CLIENTS:-64}
TX=${DEMO_TX:-250}
USERS=10000
echo
echo "== (b) $CLIENTS clients make $((CLIENTS * TX)) claim calls for $USERS users (many try twice or more)"
echo "   on an activity of 10,000.00 in 16 stripes, 0.01 to 5.00 a claim, at most 5,000 packets"
BIG_ACT=$(rp_psql -At -c "
    CREATE TABLE big_outcome (id bigserial, user_id text, status redpacket.claim_status, claim_id bigint, amount numeric);
    SELECT redpacket.rp_create_activity(10000.00, packets => 5000, stripes => 16, name => 'demo: big run')")
cat >"$W/big.pgbench" <<EOF
\set uid random(1, $USERS)
\set cents random(1, 500)
INSERT INTO big_outcome (user_id, status, claim_id, amount) SELECT 'user' || :uid::text, r.status, r.claim_id, r.amount
FROM redpacket.rp_claim($BIG_ACT, 'user' || :uid::text, :cents::int * 0.01) AS r;
EOF
start=$(date +%s.%N)
rc=0
"$PGBIN/pgbench" -n -M prepared -c "$CLIENTS" -j "$(nproc 2>/dev/null || echo 2)" -t "$TX" \
    -f "$W/big.pgbench" >"$W/big.log" 2>&1 || rc=$?
end=$(date +%s.%N)
failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$W/big.log")
awk -v a="$start" -v b="$end" -v n="$((CLIENTS * TX))" \
    'BEGIN { printf "   %d calls in %.1f s (%.0f calls/s)\n", n, b - a, n / (b - a) }'
rp_psql -At -c "
    SELECT '   ' || string_agg(format('%s %s', n, status), ', ' ORDER BY status DESC)
    FROM (SELECT status, count(*) AS n FROM big_outcome GROUP BY status) s"
rp_psql -At -c "
    SELECT format('   it ran out after %s claims; the first exhausted came at call %s of %s',
                  count(*) FILTER (WHERE status = 'claimed'),
                  (SELECT count(*) FROM big_outcome b2
                    WHERE b2.id <= (SELECT min(id) FROM big_outcome WHERE status = 'exhausted')),
                  count(*))
    FROM big_outcome"
returned=$(rp_psql -At -c "SELECT redpacket.rp_close_activity($BIG_ACT)")
echo "   closed: $returned returned to the funder"

echo
echo "== invariants"
fails=0
while IFS='|' read -r ok text; do
    if [ "$ok" = t ]; then
        echo "   PASS  $text"
    else
        echo "   FAIL  $text"
        fails=$((fails + 1))
    fi
done < <(rp_psql -At -F'|' -c "
    WITH a AS (
        SELECT a.total, a.packets, a.scale,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.claim WHERE activity_id = a.id) AS claimed,
               (SELECT count(*) FROM redpacket.claim WHERE activity_id = a.id) AS claims,
               (SELECT sum(balance) FROM redpacket.stripe WHERE activity_id = a.id)
                   / round(10::numeric ^ a.scale) AS remaining,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger
                 WHERE activity_id = a.id AND kind = 'return') AS returned,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger
                 WHERE activity_id = a.id AND kind = 'fund') AS funded,
               (SELECT count(*) FROM redpacket.stripe
                 WHERE activity_id = a.id AND (balance < 0 OR packets < 0)) AS negative,
               (SELECT max(n) FROM (SELECT count(*) AS n FROM redpacket.claim
                                    WHERE activity_id = a.id GROUP BY user_id) u) AS per_user
        FROM redpacket.activity a WHERE a.id = $BIG_ACT)
    SELECT claimed + remaining + returned = funded,
           format('claims %s + remaining %s + returned %s = funded %s',
                  claimed, round(remaining, scale), returned, funded) FROM a
    UNION ALL
    SELECT per_user = 1, format('one claim per user (most held by one user: %s)', per_user) FROM a
    UNION ALL
    SELECT negative = 0, format('no negative stripe (%s negative)', negative) FROM a
    UNION ALL
    SELECT claims <= packets, format('claims <= packets (%s <= %s)', claims, packets) FROM a
    UNION ALL
    SELECT (SELECT count(*) FROM big_outcome WHERE status = 'claimed') = claims,
           format('every claimed answer is a claim row (%s answers, %s rows)',
                  (SELECT count(*) FROM big_outcome WHERE status = 'claimed'), claims) FROM a
    UNION ALL
    SELECT coalesce(bool_and(ok), false),
           format('rp_reconcile agrees (drift %s)', coalesce(max(drift)::text, 'none: no pass ran'))
    FROM redpacket.rp_reconcile($BIG_ACT, true)")
if [ "$rc" -ne 0 ] || [ "${failed:-0}" -ne 0 ]; then
    echo "   FAIL  every call answered: pgbench exit $rc, ${failed:-?} failed transactions"
    fails=$((fails + 1))
else
    echo "   PASS  every call answered with a status, none with an error"
fi

echo
if [ "$fails" -eq 0 ]; then
    echo "demo: all checks PASS"
else
    echo "demo: $fails checks FAIL"
    exit 1
fi
