#!/usr/bin/env bash
# CPU per claim of rp_claim's two fast paths against the ceiling insert, in
# one backend each (test/bench/cpu.sql samples the backend's own CPU time):
#   direct   the executor-direct path (src/claim/direct.c, the default)
#   spi      the fast path's SQL statement (redpacket.direct_claims = off)
#   ceiling  one INSERT into bench.claim a transaction
# alternating, ROUNDS times, on one throwaway cluster with the benchmark's
# settings (synchronous_commit off in the measuring session, as in
# run.sh's CPU run).  Prints µs of CPU per operation for each round, the
# median of each kind, the ratios to the ceiling, and the growth of the
# backend's private memory (Anonymous kB) from the 1000th operation to the
# last.  A noisy machine inflates every kind alike: read the ratios.
#
# Environment: CPU_OPS (100000 a run), CPU_ROUNDS (3), CPU_STRIPES (16; a
# list such as "16 64" measures the direct path at each stripe count in the
# same rounds, e.g. make bench's default of 64 against 16; the SPI path runs
# at the first), CPU_UNPINNED=1 (also the direct path with rp_claim's
# SET search_path reset, kind "unpinned": what the pin costs a claim; the
# setting is put back after each run).
# Run as an ordinary user; as root it re-runs itself as postgres.
set -euo pipefail
BENCH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=test/bench/lib.sh
source "$BENCH_HERE/lib.sh"
bench_drop_root cpu_paths.sh "$@"

OPS=${CPU_OPS:-100000}
ROUNDS=${CPU_ROUNDS:-3}
read -r -a STRIPES <<<"${CPU_STRIPES:-16}"
HZ=$(getconf CLK_TCK)

bench_cluster_start cpu_paths "redpacket.reconcile_interval = 0" "shared_buffers = 1GB"
bench_psql -q -f "$BENCH_HERE/setup.sql" -f "$BENCH_HERE/cpu.sql" >/dev/null

one() {   # one KIND LABEL STRIPES [PGOPTIONS] -> "µs_per_op anon_growth_kb"
    local kind=$1 label=$2 stripes=$3 opts=${4:-} act
    if [ "$kind" = ceiling ]; then
        act=$(bench_psql -At -c "SELECT bench.new_run(1000000000000)")
    else
        act=$(bench_psql -At -c "SELECT redpacket.rp_create_activity(1000000000000, stripes => $stripes)")
    fi
    bench_psql -q -c "DELETE FROM bench.cpu_sample" -c CHECKPOINT
    PGOPTIONS="-c synchronous_commit=off $opts" "$PGBIN/pgbench" -n -M prepared -c 1 -t "$OPS" \
        -D act="$act" -D n=0 -D step="$OPS" -f "$BENCH_HERE/cpu_$kind.pgbench" >"$BENCH_DIR/$label.out" 2>&1 ||
        { cat "$BENCH_DIR/$label.out" >&2; exit 1; }
    bench_psql -At -F' ' -c "
        SELECT round((max(cpu_ticks) FILTER (WHERE ops = $OPS) -
                      max(cpu_ticks) FILTER (WHERE ops = 0)) * 1e6 / $HZ / $OPS, 1),
               max(anon_kb) FILTER (WHERE ops = $OPS) - max(anon_kb) FILTER (WHERE ops = 1000)
          FROM bench.cpu_sample"
}

KINDS=()
for st in "${STRIPES[@]}"; do KINDS+=("direct$st"); done
[ "${CPU_UNPINNED:-0}" != 1 ] || KINDS+=(unpinned)
KINDS+=("spi${STRIPES[0]}" ceiling)
CLAIM_FN="redpacket.rp_claim(bigint, text, numeric, text)"
unpinned() {   # the direct path, rp_claim without its SET search_path
    bench_psql -q -c "ALTER FUNCTION $CLAIM_FN RESET search_path"
    one rp_claim unpinned "${STRIPES[0]}" "-c redpacket.direct_claims=on"
    bench_psql -q -c "ALTER FUNCTION $CLAIM_FN SET search_path = pg_catalog, pg_temp"
}
declare -A ALL=()
for r in $(seq 1 "$ROUNDS"); do
    for k in "${KINDS[@]}"; do
        case $k in
            direct*) out=$(one rp_claim "$k" "${k#direct}" "-c redpacket.direct_claims=on") ;;
            unpinned) out=$(unpinned) ;;
            spi*) out=$(one rp_claim "$k" "${k#spi}" "-c redpacket.direct_claims=off") ;;
            ceiling) out=$(one ceiling ceiling 0) ;;
        esac
        read -r us grow <<<"$out"
        ALL[$k]="${ALL[$k]:-} $us"
        printf 'round %d  %-10s %8s us CPU/op  anon growth %s kB\n' "$r" "$k" "$us" "${grow:-?}"
    done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
c=$(median <<<"${ALL[ceiling]}")
line="median us CPU/op:"
ratios="ratio to ceiling (median of each kind):"
for k in "${KINDS[@]}"; do
    m=$(median <<<"${ALL[$k]}")
    line="$line $k $m "
    [ "$k" = ceiling ] || ratios="$ratios $(awk -v k="$k" -v m="$m" -v c="$c" 'BEGIN { printf "%s %.2fx ", k, m / c }')"
done
echo "$line"
echo "$ratios"
bench_cleanup
