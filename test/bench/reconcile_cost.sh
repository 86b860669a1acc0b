#!/usr/bin/env bash
# Cost of one incremental reconciliation pass against the size of the claim
# history: it must not grow with it (the requirement: a pass's cost must not
# grow with the claim history).
#
# On a throwaway cluster (the benchmark's settings, worker paused): one
# activity, 16 stripes; claim history bulk-loaded as superuser straight into
# redpacket.claim with the matching stripe decrements (the ledger identity
# stays true, and a first pass proves it and moves the watermark); then, REPS
# times, 10,000 new claims through rp_claim_batch (100 transactions of 100)
# followed by one timed rp_reconcile(id) (server-side clock around the call).
# All repetitions of one size run in one session, after an untimed warm-up
# pass, so plan caching is what a long-lived worker sees (the generic plan
# after five executions included).  Done at 1M and at 5M claims of history,
# with one full check (rp_reconcile(id, true)) at each for the record.
# Target: the median incremental pass at 5M within 1.5x of the one at 1M.
#
# Writes test/bench/results/reconcile.csv and re-renders results.md; exits
# non-zero when a pass is not ok or the target is missed.
#
# Environment: RECONCILE_SIZES ("1000000 5000000"; BENCH_QUICK=1:
# "100000 500000"), RECONCILE_NEW (10000), RECONCILE_REPS (11),
# RECONCILE_TARGET (1.5), BENCH_KEEP=1.  Run as an ordinary user; as root it
# re-runs itself as postgres.  About 3 minutes on two cores.
set -euo pipefail

BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BENCH_GIT_REV=${BENCH_GIT_REV:-$(git -C "$BENCH_HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)}
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root reconcile_cost.sh "$@"

if [ "${BENCH_QUICK:-0}" = 1 ]; then
    read -r -a SIZES <<<"${RECONCILE_SIZES:-100000 500000}"
else
    read -r -a SIZES <<<"${RECONCILE_SIZES:-1000000 5000000}"
fi
NEW=${RECONCILE_NEW:-10000}
REPS=${RECONCILE_REPS:-11}
TARGET=${RECONCILE_TARGET:-1.5}
median() {
    printf '%s\n' "$@" | sort -n |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
if [ $((NEW % 100)) -ne 0 ]; then
    echo "RECONCILE_NEW must be a multiple of 100" >&2
    exit 2
fi

echo "== reconciliation cost: $NEW new claims a pass, $REPS passes at each of ${SIZES[*]} claims of history"
bench_cluster_start reconcile "shared_preload_libraries = 'redpacket, pg_stat_statements'" \
    "pg_stat_statements.track = 'all'"
mkdir -p "$BENCH_RESULTS"

bench_psql <<'EOF'
CREATE EXTENSION redpacket;
CREATE EXTENSION pg_stat_statements;
CREATE SCHEMA rc;

-- p_n claims by new users, 100 per rp_claim_batch call, one transaction a call
CREATE PROCEDURE rc.add_claims(p_act bigint, p_tag text, p_n int) LANGUAGE plpgsql AS $$
DECLARE
    got bigint;
    total bigint := 0;
BEGIN
    FOR b IN 1 .. p_n / 100 LOOP
        SELECT count(*) FILTER (WHERE status = 'claimed') INTO got
          FROM redpacket.rp_claim_batch(p_act,
                 ARRAY(SELECT p_tag || '-' || b || '-' || g FROM generate_series(1, 100) g),
                 array_fill(0.01::numeric, ARRAY[100]));
        total := total + got;
        COMMIT;
    END LOOP;
    IF total <> p_n THEN
        RAISE EXCEPTION 'only % of % claims were claimed', total, p_n;
    END IF;
END;
$$;

-- one pass, timed by the server's clock
CREATE FUNCTION rc.timed_pass(p_act bigint, p_full boolean)
RETURNS TABLE (ms numeric, ok boolean, new_claims bigint, actual_claims bigint)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    r record;
BEGIN
    SELECT * INTO r FROM redpacket.rp_reconcile(p_act, p_full);
    ms := round(extract(epoch FROM clock_timestamp() - t0)::numeric * 1000, 3);
    ok := r.ok;
    new_claims := r.new_claims;
    actual_claims := r.actual_claims;
    RETURN NEXT;
END;
$$;
EOF

ACT=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(1000000000000, stripes => 16)")
NSTRIPES=$(bench_psql -At -c "SELECT stripes FROM redpacket.activity WHERE id = $ACT")
bench_psql -At -c "SELECT ok FROM redpacket.rp_reconcile($ACT)" >/dev/null

CSV_TMP="$BENCH_DIR/reconcile.csv"
echo "history,mode,rep,claims_before,new_claims,ms,buffers,ok" >"$CSV_TMP"
FAILS=0
loaded=0
declare -A MEDIAN=() BUFFERS=()

for size in "${SIZES[@]}"; do
    have=$(bench_psql -At -c "SELECT count(*) FROM redpacket.claim WHERE activity_id = $ACT")
    if [ "$have" -lt "$size" ]; then
        from=$((loaded + 1))
        to=$((loaded + size - have))
        t0=$(date +%s.%N)
        # History straight into the table, and the same amounts off the
        # stripes, in one transaction: the ledger identity stays true.
        bench_psql <<EOF
BEGIN;
SET LOCAL session_replication_role = replica;
INSERT INTO redpacket.claim (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)
SELECT $ACT, 'h' || g, NULL, '', 0.01, g % $NSTRIPES, now() - interval '1 day'
  FROM generate_series($from, $to) g;
UPDATE redpacket.stripe s SET balance = s.balance - x.n, claims = s.claims + x.n
  FROM (SELECT g % $NSTRIPES AS stripe, count(*) AS n FROM generate_series($from, $to) g GROUP BY 1) x
 WHERE s.activity_id = $ACT AND s.stripe = x.stripe;
COMMIT;
VACUUM (ANALYZE) redpacket.claim;
CHECKPOINT;
EOF
        loaded=$to
        ok=$(bench_psql -At -c "SELECT ok FROM redpacket.rp_reconcile($ACT)")
        t1=$(date +%s.%N)
        printf 'loaded %s claims of history in %.0f s (watermark pass ok: %s)\n' \
            "$((to - from + 1))" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$ok"
        if [ "$ok" != t ]; then
            echo "FAIL  the bulk-loaded history does not reconcile"
            FAILS=$((FAILS + 1))
        fi
    fi

    # One session: warm-up pass, then REPS x (NEW claims, timed pass), then a
    # timed full check.
    # pg_stat_statements (track = all) counts the buffers each pass touches:
    # a figure the machine's noise does not move.
    script="$BENCH_DIR/size-$size.sql"
    blocks="SELECT 'blocks', coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements
             WHERE query LIKE '%redpacket.rp_reconcile(p_act, p_full)%';"
    {
        echo "SELECT 'warmup', * FROM rc.timed_pass($ACT, false);"
        for rep in $(seq 1 "$REPS") full; do
            echo "SELECT 'before', sum(claims) FROM redpacket.stripe WHERE activity_id = $ACT;"
            [ "$rep" = full ] || echo "CALL rc.add_claims($ACT, 'n$size-$rep', $NEW);"
            echo "SELECT 'reset' FROM pg_stat_statements_reset();"
            if [ "$rep" = full ]; then
                echo "SELECT 'full', * FROM rc.timed_pass($ACT, true);"
            else
                echo "SELECT 'pass', * FROM rc.timed_pass($ACT, false);"
            fi
            echo "$blocks"
        done
    } >"$script"
    rep=0
    before=0
    times=()
    nblocks=()
    while IFS='|' read -r what a b c d; do
        case $what in
            before) before=$a ;;
            pass|full) got=("$what" "$a" "$b" "$c" "$d") ;;
            blocks)
                if [ "${got[0]}" = pass ]; then
                    rep=$((rep + 1))
                    times+=("${got[1]}")
                    nblocks+=("$a")
                    echo "$size,incremental,$rep,$before,${got[3]},${got[1]},$a,${got[2]}" >>"$CSV_TMP"
                    if [ "${got[2]}" != t ] || [ "${got[3]}" != "$NEW" ]; then
                        echo "FAIL  pass $rep at $size: ok=${got[2]}, new_claims=${got[3]} (expected $NEW)"
                        FAILS=$((FAILS + 1))
                    fi
                else
                    echo "$size,full,1,$before,${got[3]},${got[1]},$a,${got[2]}" >>"$CSV_TMP"
                    printf '%9s claims: full check %10.1f ms, %8s buffers (ok %s)\n' \
                        "$before" "${got[1]}" "$a" "${got[2]}"
                    if [ "${got[2]}" != t ]; then
                        echo "FAIL  full check at $size: not ok"
                        FAILS=$((FAILS + 1))
                    fi
                fi ;;
        esac
    done < <(bench_psql -At -F'|' -f "$script")
    if [ "${#times[@]}" -eq 0 ]; then
        echo "FAIL  no pass was timed at $size"
        FAILS=$((FAILS + 1))
        MEDIAN[$size]=0
        continue
    fi
    MEDIAN[$size]=$(median "${times[@]}")
    BUFFERS[$size]=$(median "${nblocks[@]}")
    printf '%9s claims: incremental pass over %s new claims: median %.2f ms, min %.2f ms, median %s buffers (ms each: %s)\n' \
        "$size" "$NEW" "${MEDIAN[$size]}" "$(printf '%s\n' "${times[@]}" | sort -n | head -n 1)" \
        "$(median "${nblocks[@]}")" "${times[*]}"
done

cp "$CSV_TMP" "$BENCH_RESULTS/reconcile.csv"
{
    echo "key,value"
    echo "date,$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "git,$BENCH_GIT_REV"
    echo "new_claims,$NEW"
    echo "load_at_end,$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$BENCH_RESULTS/reconcile_meta.csv"
bench_cleanup

first=${SIZES[0]}
last=${SIZES[${#SIZES[@]}-1]}
ratio=$(awk -v a="${MEDIAN[$first]}" -v b="${MEDIAN[$last]}" 'BEGIN { printf "%.2f", (a > 0) ? b / a : 0 }')
bratio=$(awk -v a="${BUFFERS[$first]:-0}" -v b="${BUFFERS[$last]:-0}" 'BEGIN { printf "%.2f", (a > 0) ? b / a : 0 }')
# Wall time is the target; buffers touched is the same question without the
# machine's noise, so a time-only failure says which it probably was.
if awk -v r="$bratio" -v t="$TARGET" 'BEGIN { exit !(r > 0 && r <= t) }'; then
    echo "PASS  buffers touched by an incremental pass at $last / at $first claims of history: ${bratio}x (target <= ${TARGET}x)"
else
    echo "FAIL  buffers touched by an incremental pass at $last / at $first claims of history: ${bratio}x (target <= ${TARGET}x)"
    FAILS=$((FAILS + 1))
fi
if awk -v r="$ratio" -v t="$TARGET" 'BEGIN { exit !(r > 0 && r <= t) }'; then
    echo "PASS  median time of an incremental pass at $last / at $first claims of history: ${ratio}x (target <= ${TARGET}x)"
else
    echo "FAIL  median time of an incremental pass at $last / at $first claims of history: ${ratio}x (target <= ${TARGET}x)"
    if awk -v r="$bratio" -v t="$TARGET" 'BEGIN { exit !(r > 0 && r <= t) }'; then
        echo "      (it touched the same buffers at both sizes: probably the machine's noise; rerun on a quiet machine)"
    fi
    FAILS=$((FAILS + 1))
fi

if [ "${BENCH_NO_REPORT:-0}" != 1 ]; then
    bash "$BENCH_HERE/report.sh" "$BENCH_RESULTS" >/dev/null
    echo "wrote ${BENCH_RESULTS_SHOWN:-$BENCH_RESULTS}/reconcile.csv and results.md"
fi
[ "$FAILS" -eq 0 ]
