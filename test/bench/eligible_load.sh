#!/usr/bin/env bash
# Loading an eligibility list in bulk: ELIGIBLE_USERS users (1,000,000) onto
# one restricted activity through rp_allow in calls of ELIGIBLE_CALL (10,000),
# each call its own transaction, as an operator's script would; then all of
# them removed again through rp_disallow in calls of the same size.  Side by
# side, on the same cluster, the least the database can do for the same rows,
# into tables shaped like redpacket.eligible (same key, same collation): an
# INSERT ... ON CONFLICT DO NOTHING of each batch (what rp_allow must do: skip
# who is listed already), a plain INSERT (which could not skip them), and a
# DELETE of each batch.  Also, inside one rp_allow call of
# ELIGIBLE_CALL users, how many locks of redpacket's lock space it holds (at
# most the 64 user buckets of the activity, whatever the call's size), and
# that claims keep working on the activity meanwhile (a listed user claims,
# an unlisted one does not).
#
# Target: the whole list well under a minute on the CI machine; here
# it fails when loading takes longer than ELIGIBLE_TARGET_S (30) seconds, or
# a call holds more than 64 of redpacket's locks.
#
# Environment: ELIGIBLE_USERS (1000000; BENCH_QUICK=1: 100000),
# ELIGIBLE_CALL (10000), ELIGIBLE_TARGET_S (30), BENCH_KEEP=1, BENCH_PORTS
# (lib.sh).  Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail

BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root eligible_load.sh "$@"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    USERS=${ELIGIBLE_USERS:-100000}
else
    USERS=${ELIGIBLE_USERS:-1000000}
fi
CALL=${ELIGIBLE_CALL:-10000}
TARGET=${ELIGIBLE_TARGET_S:-30}
CALLS=$(( (USERS + CALL - 1) / CALL ))
FAILS=0

echo "== eligibility list: $USERS users in $CALLS calls of $CALL (rp_allow, then rp_disallow)"
bench_cluster_start eligible
bench_psql <<'EOF'
CREATE EXTENSION redpacket;
CREATE SCHEMA el;
-- shaped like redpacket.eligible: the baseline of a plain bulk insert
CREATE TABLE el.plain (
    activity_id bigint NOT NULL,
    user_id     text COLLATE "C" NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now(),
    added_by    name NOT NULL DEFAULT session_user,
    PRIMARY KEY (activity_id, user_id)
);
CREATE TABLE el.skip (LIKE el.plain INCLUDING ALL);
EOF
ACT=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(1000000.00, restricted => true, name => 'eligible')")

# calls TEMPLATE...: for each call, one statement of each template, each in
# its own transaction (psql autocommit), the templates taking turns so that
# a shared machine's load falls on them alike; @LO@ and @HI@ are the call's
# user numbers.  Prints the seconds each template took in all (psql's
# \timing: the statement's round trip).
calls() {
    local lo hi t
    for ((c = 0; c < CALLS; c++)); do
        lo=$((c * CALL + 1))
        hi=$(( (c + 1) * CALL < USERS ? (c + 1) * CALL : USERS ))
        for t in "$@"; do
            echo "$t" | sed "s/@LO@/$lo/g; s/@HI@/$hi/g"
        done
    done | bench_psql -At -c '\timing on' -f - |
        awk -v k=$# '/^Time: / { n++; s[(n - 1) % k] += $2 }
                     END { for (i = 0; i < k; i++) printf "%s%.2f", (i ? " " : ""), s[i] / 1000; print "" }'
}
users="ARRAY(SELECT 'user-' || g FROM generate_series(@LO@, @HI@) g)"

read -r allow_s skip_s plain_s < <(calls "SELECT redpacket.rp_allow($ACT, $users);" \
    "INSERT INTO el.skip (activity_id, user_id) SELECT $ACT, u FROM unnest($users) u ON CONFLICT DO NOTHING;" \
    "INSERT INTO el.plain (activity_id, user_id) SELECT $ACT, u FROM unnest($users) u;")
listed=$(bench_psql -At -c "SELECT count(*) FROM redpacket.eligible WHERE activity_id = $ACT")
read -r again_s < <(calls "SELECT redpacket.rp_allow($ACT, $users);")

# One call's locks, counted before it commits: the locks of redpacket's lock
# space (advisory, field4 0x52xx) this backend holds.
locks=$(bench_psql -At <<EOF
BEGIN;
SELECT redpacket.rp_allow($ACT, ARRAY(SELECT 'extra-' || g FROM generate_series(1, $CALL) g));
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid BETWEEN 20992 AND 21247;
ROLLBACK;
EOF
)
locks=$(echo "$locks" | tail -n 1)
claims=$(bench_psql -At -c "SELECT string_agg(c.status::text, ',' ORDER BY k.n) FROM unnest(ARRAY['user-1', 'stranger']) WITH ORDINALITY k(u, n), LATERAL redpacket.rp_claim($ACT, k.u, 1.00) c")

read -r disallow_s pdelete_s < <(calls "SELECT redpacket.rp_disallow($ACT, $users);" \
    "DELETE FROM el.plain WHERE activity_id = $ACT AND user_id = ANY ($users);")
left=$(bench_psql -At -c "SELECT count(*) FROM redpacket.eligible WHERE activity_id = $ACT")
changes=$(bench_psql -At -c "SELECT count(*) FILTER (WHERE kind = 'allow') || ' allow, ' || count(*) FILTER (WHERE kind = 'disallow') || ' disallow' FROM redpacket.activity_change WHERE activity_id = $ACT")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
rate() { awk -v n="$USERS" -v s="$1" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }'; }
printf '%-34s %8s s  %9s users/s\n' "rp_allow, new users" "$allow_s" "$(rate "$allow_s")"
printf '%-34s %8s s  %9s users/s  (rp_allow / this %s)\n' "INSERT ON CONFLICT DO NOTHING" "$skip_s" "$(rate "$skip_s")" "$(ratio "$allow_s" "$skip_s")"
printf '%-34s %8s s  %9s users/s  (rp_allow / this %s)\n' "plain INSERT, same rows" "$plain_s" "$(rate "$plain_s")" "$(ratio "$allow_s" "$plain_s")"
printf '%-34s %8s s  %9s users/s\n' "rp_allow, all already listed" "$again_s" "$(rate "$again_s")"
printf '%-34s %8s s  %9s users/s\n' "rp_disallow" "$disallow_s" "$(rate "$disallow_s")"
printf '%-34s %8s s  %9s users/s  (rp_disallow / plain %s)\n' "plain DELETE, same rows" "$pdelete_s" "$(rate "$pdelete_s")" "$(ratio "$disallow_s" "$pdelete_s")"
printf '%-34s %s\n' "activity_change rows" "$changes"

check() {   # check OK TEXT
    if [ "$1" = 1 ]; then echo "PASS  $2"; else echo "FAIL  $2"; FAILS=$((FAILS + 1)); fi
}
check "$([ "$listed" = "$USERS" ] && echo 1)" "rp_allow listed every user once: $listed of $USERS"
check "$(awk -v s="$allow_s" -v t="$TARGET" 'BEGIN { print (s <= t) ? 1 : 0 }')" \
    "the list loads within $TARGET s: $allow_s s"
check "$([ "$locks" -le 64 ] && echo 1)" "one call of $CALL users holds $locks of redpacket's locks (at most 64)"
check "$([ "$claims" = "claimed,not_eligible" ] && echo 1)" "a listed user claims, a stranger does not: $claims"
check "$([ "$left" = 0 ] && echo 1)" "rp_disallow removed every user: $left left"
check "$([ "$changes" = "$CALLS allow, $CALLS disallow" ] && echo 1)" \
    "one activity_change row per call that changed the list: $changes"
problems=$(bench_server_problems || true)
check "$([ -z "$problems" ] && echo 1)" "no warning or error in the server log${problems:+: $problems}"
exit $((FAILS > 0))
