#!/usr/bin/env bash
# What listing the refunds owed costs as the refunds paid back pile up:
# REFUND_PENDING refunds stay owed while the acknowledged ones grow to
# each of REFUND_SETTLED (activities each withdrawn from, paid back and
# acknowledged).  At each step, the mean of 200 calls of
# rp_pending_refunds() (every activity) and of rp_pending_refunds(a) (one
# activity with a pending refund).  Flat columns: the cost follows what is
# owed, not the history.
#
# Environment: REFUND_PENDING (10), REFUND_SETTLED ("0 5000 50000").
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root refund_cost.sh "$@"

PENDING=${REFUND_PENDING:-10}
SETTLED=${REFUND_SETTLED:-0 5000 50000}

bench_cluster_start refund_cost "redpacket.reconcile_interval = 0"
bench_psql -q -c "CREATE EXTENSION redpacket" >/dev/null
bench_psql -q <<SQL
CREATE PROCEDURE owe(n integer, acknowledge boolean) LANGUAGE plpgsql AS \$\$
DECLARE a bigint;
BEGIN
    FOR i IN 1..n LOOP
        a := redpacket.rp_create_activity(2.00, funder => 'f' || i);
        PERFORM redpacket.rp_withdraw(a, 1.00, 'back');
        IF acknowledge THEN
            PERFORM redpacket.rp_refunded(a, ARRAY(SELECT entry_id FROM redpacket.ledger
                                                    WHERE activity_id = a AND kind = 'withdraw'));
        END IF;
        IF i % 100 = 0 THEN
            COMMIT;    -- each activity's locks end with its transaction
        END IF;
    END LOOP;
END \$\$;
CREATE FUNCTION mean_ms(one bigint) RETURNS numeric LANGUAGE plpgsql AS \$\$
DECLARE t0 timestamptz := clock_timestamp(); n bigint;
BEGIN
    FOR i IN 1..200 LOOP
        SELECT count(*) INTO n FROM redpacket.rp_pending_refunds(one);
    END LOOP;
    RETURN round(extract(epoch FROM clock_timestamp() - t0) * 1000 / 200, 3);
END \$\$;
CALL owe($PENDING, false);
CREATE TABLE cost (settled bigint, all_ms numeric, one_ms numeric, owed bigint);
SQL
one=$(bench_psql -At -c "SELECT min(activity_id) FROM redpacket.rp_pending_refunds()")
done_so_far=0
for target in $SETTLED; do
    if [ "$target" -gt "$done_so_far" ]; then
        bench_psql -q -c "CALL owe($((target - done_so_far)), true)" >/dev/null
        done_so_far=$target
    fi
    bench_psql -q -c "VACUUM ANALYZE redpacket.refund" -c "VACUUM ANALYZE redpacket.ledger"
    bench_psql -q -c "INSERT INTO cost SELECT $target, mean_ms(NULL), mean_ms($one),
                             (SELECT count(*) FROM redpacket.rp_pending_refunds())"
done
bench_psql -c "SELECT settled, owed, all_ms, one_ms,
                      round(all_ms / first_value(all_ms) OVER (ORDER BY settled), 2) AS all_ratio,
                      round(one_ms / first_value(one_ms) OVER (ORDER BY settled), 2) AS one_ratio
                 FROM cost ORDER BY settled"
bench_cleanup
