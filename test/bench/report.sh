#!/usr/bin/env bash
# Renders the benchmark record from the CSV files of the last run:
#   results.md      tables, the performance targets' ratios, CPU/memory, the
#                   pg_stat_statements breakdown and the reconciliation cost
#   throughput.png  claims/s against clients, one line per workload (log-log)
# and prints the throughput table and the ratios.  Called by run.sh and
# reconcile_cost.sh; can be re-run by hand:  bash test/bench/report.sh [DIR]
# (DIR defaults to test/bench/results).  Missing CSV files skip their section.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${1:-$HERE/results}
CSV=$DIR/bench.csv
MD=$DIR/results.md
TMP=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-report.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

meta() { [ -f "$DIR/meta.csv" ] && awk -F, -v k="$1" '$1 == k { print $2 }' "$DIR/meta.csv" || true; }

# Client counts present, ascending; the reference count for the ratios is 64
# when it was run, else the largest below it, else the smallest.
clients=""
ref=""
maxc=""
HAVE_BENCH=0
if [ -f "$CSV" ] && [ "$(wc -l <"$CSV")" -gt 1 ]; then
    HAVE_BENCH=1
    clients=$(awk -F, 'NR > 1 { print $3 }' "$CSV" | sort -n -u | tr '\n' ' ')
    for c in $clients; do
        [ -n "$ref" ] || ref=$c
        [ "$c" -gt 64 ] || ref=$c
        maxc=$c
    done
fi

# Rows: workload (+stripes, +via) in order of first appearance; columns: clients.
label_awk='
function label(w, s, v) {
    l = w
    if (w == "rp_claim") l = l " (" s " stripe" (s == 1 ? "" : "s") ")"
    if (w == "rp_claim_default") l = "rp_claim (default: " s " stripe" (s == 1 ? "" : "s") ")"
    if (w == "rp_claim_batch") l = l " (" s " stripes)"
    if (v != "direct") l = l " via " v
    return l
}
# rows in a fixed order: baselines, the default, the stripe sweep, batches,
# pooled runs, Redis
function rank(w, s, v,    r) {
    r = (w == "ceiling") ? 1 : (w == "cond_update") ? 2 : (w == "for_update") ? 3 : \
        (w == "rp_claim_default") ? 4 : (w == "rp_claim") ? 5 : (w == "rp_claim_batch") ? 6 : \
        (w == "redis_lua") ? 8 : 7
    if (v != "direct") r = 7
    return r * 100000 + s
}
function add(k, rk) {      # insert k into order[1..nk], sorted by rank
    if (k in seen) return
    seen[k] = 1; nk++; j = nk
    while (j > 1 && rnk[order[j - 1]] > rk) { order[j] = order[j - 1]; j-- }
    order[j] = k; rnk[k] = rk
}'

throughput_table() {   # markdown pivot of claims/s (p50 / p99 ms)
    awk -F, -v clients="$clients" "$label_awk"'
        NR == 1 { next }
        {
            k = label($1, $2, $4)
            add(k, rank($1, $2, $4))
            cell[k, $3] = sprintf("%s <sub>%s / %s</sub>%s", $9, $10, $11, $12 == "PASS" ? "" : " **FAIL**")
        }
        END {
            nc = split(clients, cs, " ")
            printf "| workload |"
            for (j = 1; j <= nc; j++) printf " %s client%s |", cs[j], (cs[j] == 1 ? "" : "s")
            printf "\n|---|"
            for (j = 1; j <= nc; j++) printf "---:|"
            printf "\n"
            for (i = 1; i <= nk; i++) {
                printf "| %s |", order[i]
                for (j = 1; j <= nc; j++) {
                    v = ((order[i], cs[j]) in cell) ? cell[order[i], cs[j]] : ""
                    printf " %s |", v
                }
                printf "\n"
            }
        }' "$CSV"
}

throughput_text() {    # the same, for the terminal
    awk -F, -v clients="$clients" "$label_awk"'
        NR == 1 { next }
        {
            k = label($1, $2, $4)
            add(k, rank($1, $2, $4))
            cell[k, $3] = $9 ($12 == "PASS" ? "" : "!")
            p99[k, $3] = $11
        }
        END {
            nc = split(clients, cs, " ")
            printf "%-34s", "claims/s (p99 ms)    clients:"
            for (j = 1; j <= nc; j++) printf " %18s", cs[j]
            printf "\n"
            for (i = 1; i <= nk; i++) {
                printf "%-34s", order[i]
                for (j = 1; j <= nc; j++) {
                    if ((order[i], cs[j]) in cell)
                        printf " %18s", cell[order[i], cs[j]] " (" p99[order[i], cs[j]] ")"
                    else
                        printf " %18s", ""
                }
                printf "\n"
            }
        }' "$CSV"
}

# The ratios the targets are stated in, and others for comparison, as "name|value|detail" lines.
ratios() {
    awk -F, -v ref="$ref" -v maxc="$maxc" '
        NR == 1 { next }
        { cps[$1, $2, $3, $4] = $9; p99[$1, $2, $3, $4] = $11 }
        $1 == "rp_claim" && $4 == "direct" && $3 == ref && $9 + 0 > best + 0 { best = $9; bests = $2 }
        $1 == "rp_claim_default" { dst = $2 }
        $1 == "rp_claim_batch" && $4 == "direct" && $9 + 0 > bbest + 0 { bbest = $9; bbestc = $3; bbests = $2 }
        $1 == "redis_lua" && $9 + 0 > rbest + 0 { rbest = $9; rbestc = $3 }
        function r(a, b) { return (b + 0 > 0 && a != "") ? sprintf("%.2f", a / b) : "n/a" }
        function show(name, a, b, detail) { printf "%s|%s|%s\n", name, r(a, b), detail }
        END {
            ceil = cps["ceiling", 0, ref, "direct"]
            rpd = cps["rp_claim_default", dst, ref, "direct"]
            show("rp_claim (default: " dst " stripes) / ceiling, " ref " clients", rpd, ceil, rpd " / " ceil " claims/s")
            if (bests != "")
                show("rp_claim (best: " bests " stripes) / ceiling, " ref " clients", best, ceil, best " / " ceil " claims/s")
            c = cps["cond_update", 1, ref, "direct"]
            show("seed 004 conditional UPDATE / ceiling, " ref " clients", c, ceil, c " / " ceil " claims/s")
            f = cps["for_update", 1, ref, "direct"]
            show("seed 004 SELECT FOR UPDATE / ceiling, " ref " clients", f, ceil, f " / " ceil " claims/s")
            a = p99["rp_claim_default", dst, ref, "direct"]; b = p99["ceiling", 0, ref, "direct"]
            show("rp_claim (default) p99 / ceiling p99, " ref " clients", a, b, a " / " b " ms")
            if (("rp_claim_default", dst, maxc, "pgbouncer") in cps) {
                a = cps["rp_claim_default", dst, maxc, "pgbouncer"]; b = cps["rp_claim_default", dst, maxc, "direct"]
                show("rp_claim (default) via PgBouncer / direct, " maxc " clients", a, b, a " / " b " claims/s")
                b = cps["ceiling", 0, maxc, "pgbouncer"]
                show("rp_claim (default) / ceiling, both via PgBouncer, " maxc " clients", a, b, a " / " b " claims/s")
            }
            if (("ceiling", 0, maxc, "pgbouncer") in cps) {
                a = cps["ceiling", 0, maxc, "pgbouncer"]; b = cps["ceiling", 0, maxc, "direct"]
                show("ceiling via PgBouncer / direct, " maxc " clients", a, b, a " / " b " claims/s")
            }
            if (bbest != "") {
                printf "rp_claim_batch claims/s (best: %s clients)|%s|%s claims a second\n", bbestc, bbest, bbest
                a = cps["rp_claim_batch", bbests, maxc, "direct"]
                show("rp_claim_batch " maxc " callers / best", a, bbest, a " / " bbest " claims/s")
                if (("rp_claim_batch", bbests, maxc, "pgbouncer") in cps) {
                    a = cps["rp_claim_batch", bbests, maxc, "pgbouncer"]
                    show("rp_claim_batch " maxc " callers via PgBouncer / best", a, bbest, a " / " bbest " claims/s")
                }
                if (rbest != "") {
                    show("rp_claim_batch best / Redis Lua best", bbest, rbest,
                         bbest " (" bbestc " clients) / " rbest " (" rbestc " clients) claims/s")
                    a = cps["rp_claim_batch", bbests, ref, "direct"]; b = cps["redis_lua", 0, ref, "direct"]
                    show("rp_claim_batch / Redis Lua, " ref " clients", a, b, a " / " b " claims/s")
                }
            }
        }' "$CSV"
}

# The performance targets (the bounds below), each from this one run, as
# "target|value|bound|met or not met|from" lines (value n/a, verdict "not
# run", when the run lacks the workloads).
targets() {
    local cpu_line=""
    [ -f "$DIR/cpu.csv" ] && cpu_line=$(cpu_summary | awk -F'|' '
        { us[$1] = $4; a[$1] = $5; c[$1] = $6 }
        END { printf "%s|%s|%s|%s", us["rp_claim"], us["ceiling"], a["rp_claim"], c["rp_claim"] }')
    awk -F, -v ref="$ref" -v maxc="$maxc" -v cpu="$cpu_line" '
        NR == 1 { next }
        { cps[$1, $3, $4] = $9; p99[$1, $3, $4] = $11; st[$1, $3, $4] = $2 }
        $1 == "rp_claim_batch" && $4 == "direct" && $9 + 0 > bbest + 0 { bbest = $9; bbestc = $3 }
        $1 == "redis_lua" && $9 + 0 > rbest + 0 { rbest = $9; rbestc = $3 }
        function ratio(a, b) { return (a != "" && b != "" && b + 0 > 0) ? a / b : "" }
        # line(target, a, b, op, bound, detail): met when a/b op bound
        function line(t, a, b, op, bound, detail,    v, ok) {
            v = ratio(a, b)
            if (v == "") { printf "%s|n/a|%s %s|not run|%s\n", t, op, bound, detail; return }
            ok = (op == ">=") ? (v + 0 >= bound + 0) : (v + 0 <= bound + 0)
            printf "%s|%.2f|%s %s|%s|%s\n", t, v, op, bound, ok ? "met" : "NOT MET", detail
        }
        function info(t, a, b, detail,    v) {
            v = ratio(a, b)
            printf "%s|%s|-|for comparison|%s\n", t, (v == "" ? "n/a" : sprintf("%.2f", v)), detail
        }
        END {
            ceil = cps["ceiling", ref, "direct"]; cp99 = p99["ceiling", ref, "direct"]
            d = cps["rp_claim_default", ref, "direct"]; dp99 = p99["rp_claim_default", ref, "direct"]
            ds = st["rp_claim_default", ref, "direct"]
            line("rp_claim (default settings, " ds " stripes) / insert-only ceiling, claims/s, " ref " clients",
                 d, ceil, ">=", "0.9", d " / " ceil " claims/s")
            line("rp_claim (default settings) p99 / ceiling p99, " ref " clients",
                 dp99, cp99, "<=", "1.5", dp99 " / " cp99 " ms")
            split(cpu, u, "|")
            line("CPU per claim / CPU per ceiling insert, one backend (default settings)",
                 u[1], u[2], "<=", "1.3", u[1] " / " u[2] " us")
            # memory flat: Anonymous and memory contexts grow by at most 5% from half-way to the end
            if (u[3] != "") {
                split(u[3], an, " / "); split(u[4], cx, " / ")
                g = (an[3] - an[2]) / an[2]; h = (cx[3] - cx[2]) / cx[2]; m = (g > h) ? g : h
                printf "memory of the claiming backend, half-way to end (Anonymous, memory contexts)|%+.1f%%|<= +5%%|%s|Anonymous %s kB, contexts %s kB (after 1000 / half-way / end)\n",
                    100 * m, (m <= 0.05 ? "met" : "NOT MET"), u[3], u[4]
            } else
                printf "memory of the claiming backend, half-way to end|n/a|<= +5%%|not run|\n"
            b = cps["rp_claim_batch", maxc, "direct"]
            line("rp_claim_batch at " maxc " callers / best rp_claim_batch (" bbestc " callers)",
                 b, bbest, ">=", "0.8", b " / " bbest " claims/s")
            x = cps["rp_claim_batch", maxc, "pgbouncer"]
            info("rp_claim_batch at " maxc " callers via PgBouncer (pool of 32) / best rp_claim_batch", x, bbest,
                 x " / " bbest " claims/s")
            a = cps["rp_claim_default", maxc, "pgbouncer"]; c = cps["ceiling", maxc, "pgbouncer"]
            line("rp_claim (default settings) / ceiling, both via PgBouncer, " maxc " clients",
                 a, c, ">=", "0.8", a " / " c " claims/s")
            x = cps["cond_update", ref, "direct"]
            info("seed 004 conditional UPDATE / ceiling, " ref " clients", x, ceil, x " / " ceil " claims/s")
            x = cps["for_update", ref, "direct"]
            info("seed 004 SELECT FOR UPDATE / ceiling, " ref " clients", x, ceil, x " / " ceil " claims/s")
            x = cps["redis_lua", ref, "direct"]
            info("Redis Lua (appendfsync always) / ceiling, " ref " clients", x, ceil, x " / " ceil " claims/s")
            info("rp_claim (default settings) / Redis Lua, " ref " clients", d, x, d " / " x " claims/s")
            if (bbest != "" && rbest != "")
                info("rp_claim_batch best / Redis Lua best", bbest, rbest,
                     bbest " (" bbestc " callers) / " rbest " (" rbestc " clients) claims/s")
        }' "$CSV"
}

cpu_summary() {        # "kind|ops|us_wall|us_cpu|anon start/mid/end|ctx start/mid/end|rss end"
    awk -F, '
        NR == 1 { next }
        { k = $1; n[k]++; ops[k, n[k]] = $2; sec[k, n[k]] = $3; cpu[k, n[k]] = $4
          rss[k, n[k]] = $5; anon[k, n[k]] = $7; ctx[k, n[k]] = $8
          if (!(k in seen)) { seen[k] = 1; order[++nk] = k } }
        END {
            for (i = 1; i <= nk; i++) {
                k = order[i]; last = n[k]; w = 0; mid = 0
                for (j = 1; j <= last; j++) {
                    if (ops[k, j] == 1000) w = j
                    if (mid == 0 && ops[k, j] >= ops[k, last] / 2) mid = j
                }
                if (w == 0) w = 1
                d = ops[k, last] - ops[k, w]
                printf "%s|%d|%.1f|%.1f|%d / %d / %d|%d / %d / %d|%d / %d / %d\n", k, ops[k, last],
                    (d > 0 ? (sec[k, last] - sec[k, w]) / d * 1e6 : 0),
                    (d > 0 ? (cpu[k, last] - cpu[k, w]) / d * 1e6 : 0),
                    anon[k, w], anon[k, mid], anon[k, last],
                    ctx[k, w] / 1024, ctx[k, mid] / 1024, ctx[k, last] / 1024, rss[k, w], rss[k, mid], rss[k, last]
            }
        }' "$DIR/cpu.csv"
}

reconcile_summary() {  # "history|median_ms|min_ms|median_buffers|reps|full_ms|full_buffers"
    awk -F, '
        function median(a, k,    x, y, v) {   # sorts a[1..k] in place
            for (x = 2; x <= k; x++) { v = a[x]; y = x - 1
                while (y >= 1 && a[y] + 0 > v + 0) { a[y + 1] = a[y]; y-- }
                a[y + 1] = v }
            return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        NR == 1 { next }
        $2 == "incremental" { h = $1; if (!(h in seen)) { seen[h] = 1; order[++nh] = h }
                              cnt[h]++; ms[h, cnt[h]] = $6; bl[h, cnt[h]] = $7 }
        $2 == "full" { full[$1] = $6; fullb[$1] = $7 }
        END {
            for (i = 1; i <= nh; i++) {
                h = order[i]; k = cnt[h]
                for (j = 1; j <= k; j++) { t[j] = ms[h, j]; b[j] = bl[h, j] }
                m = median(t, k); mb = median(b, k)
                printf "%s|%.2f|%.2f|%d|%d|%s|%s\n", h, m, t[1], mb, k,
                    ((h in full) ? full[h] : "n/a"), ((h in fullb) ? fullb[h] : "n/a")
            }
        }' "$DIR/reconcile.csv"
}

plot() {
    command -v gnuplot >/dev/null 2>&1 || { echo "report: no gnuplot, no plot" >&2; return 0; }
    local plots=() f title style
    awk -F, -v tmp="$TMP" "$label_awk"'
        NR == 1 { next }
        $9 + 0 > 0 {
            k = label($1, $2, $4)
            if (!(k in seen)) { seen[k] = ++nk; print k > (tmp "/series" nk ".title") }
            print $3, $9 > (tmp "/series" seen[k] ".dat")
        }' "$CSV"
    local colors=(black '#1f77b4' '#ff7f0e' '#2ca02c' '#d62728' '#9467bd' '#8c564b' '#e377c2'
                  '#7f7f7f' '#bcbd22' '#17becf' '#393b79' '#637939' '#8c6d31' '#843c39')
    local i=0
    for f in $(ls "$TMP"/series*.dat | sort -V); do
        title=$(cat "${f%.dat}.title")
        style="linespoints lw 2 pt 7 ps 1.2"
        case $title in *via*) style="points ps 2.5 pt 9" ;; esac
        plots+=("'$f' using 1:2 with $style lc rgb '${colors[$((i % ${#colors[@]}))]}' title '$title'")
        i=$((i + 1))
    done
    [ "${#plots[@]}" -gt 0 ] || return 0
    {
        if gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo; then
            echo "set terminal pngcairo size 960,600 noenhanced font ',10'"
        else
            echo "set terminal png size 960,600 noenhanced"
        fi
        echo "set output '$DIR/throughput.png'"
        echo "set title 'redpacket: claims/s against clients (durable commits; $(meta date), $(meta cores) cores$( [ "$(meta quick)" = 1 ] && echo ', QUICK run'))'"
        echo "set logscale x 2"
        echo "set logscale y 10"
        echo "set xlabel 'clients'"
        echo "set ylabel 'claims/s (log)'"
        echo "set xtics ($(echo "$clients" | sed 's/ *$//; s/ /, /g'))"
        echo "set xrange [$(echo "$clients" | awk '{ printf "%g:%g", $1 / 1.5, $NF * 1.5 }')]"
        echo "set grid"
        echo "set key outside right top"
        echo "plot $(IFS=,; echo "${plots[*]}")"
    } >"$TMP/plot.gp"
    if ! gnuplot "$TMP/plot.gp" 2>"$TMP/plot.err"; then
        echo "report: gnuplot failed:" >&2
        cat "$TMP/plot.err" >&2
    fi
}

{
    echo "# redpacket benchmark results"
    echo
    if [ -f "$DIR/meta.csv" ]; then
        echo "Last run: $(meta date), git $(meta git), $(meta cores) cores, $(meta memory_gb) GB," \
             "PostgreSQL $(meta postgresql), Redis $(meta redis), PgBouncer $(meta pgbouncer);" \
             "$(meta seconds_per_run) s a run$( [ "$(meta quick)" = 1 ] && echo ' (**BENCH_QUICK smoke run**)');" \
             "huge_pages $(meta huge_pages);" \
             "load average at the end $(meta load_at_end); checks: $(meta fails) of $(meta checks) failed."
        echo "Durable commits (fsync on, synchronous_commit on), shared_buffers 1GB, pgbench -M prepared"
        echo "(-M extended through PgBouncer), one activity per run, every user new; regenerate with"
        echo "\`make bench\` (\`BENCH_QUICK=1\` for a smoke run). Figures from a shared machine are noisy."
        echo
    fi
    if [ "$HAVE_BENCH" = 1 ]; then
        echo "## Targets, from this run"
        echo
        echo "\"default settings\" = an activity created without a stripes argument (the"
        echo "redpacket.stripes default$( [ -n "$(meta default_stripes)" ] && echo ", $(meta default_stripes) on this run")); the ceiling is one claim-shaped"
        echo "row inserted per transaction; throughput counts the last $(meta seconds_per_run) s of each run, after a"
        echo "warm-up of $(meta warmup) s (at 16 / 64 / 256 clients)."
        echo
        echo "| target | value | bound | verdict | from |"
        echo "|---|---:|---:|---|---|"
        targets | awk -F'|' '{ v = $4; if (v == "met" || v == "NOT MET") v = "**" v "**"
                              printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, v, $5 }'
        echo
        echo "## Throughput"
        echo
        echo "claims/s <sub>p50 / p99 latency in ms</sub> (rp_claim_batch: latency of a call of $(meta batch) claims)"
        echo
        throughput_table
        echo
        echo "![claims/s against clients](throughput.png)"
        echo
        echo "## Where the backends wait"
        echo
        echo "Wait events of the active client backends, sampled every 100 ms during each run (CPU = no"
        echo "wait event: running or runnable), the three most frequent:"
        echo
        echo "| workload | clients | waits |"
        echo "|---|---:|---|"
        awk -F, -v ref="$ref" -v maxc="$maxc" "$label_awk"'
            NR > 1 && $13 != "" && ($3 == ref || $3 == maxc) { printf "| %s | %s | %s |\n", label($1, $2, $4), $3, $13 }' "$CSV"
        echo
        echo "## Ratios"
        echo
        echo "| ratio | value | from |"
        echo "|---|---:|---|"
        ratios | awk -F'|' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }'
        echo
    fi
    if [ -f "$DIR/cpu.csv" ]; then
        echo "## CPU and memory of one backend"
        echo
        echo "One backend (pgbench -c 1 -t N -M prepared) making N claims in a row (rp_claim, default settings)"
        echo "and, at the same time, another as many ceiling inserts, one transaction each, both paced at"
        echo "$(meta cpu_rate) a second (pgbench -R, so the wall time per operation is the pace), synchronous_commit off;"
        echo "CPU = the backend's utime + stime; per operation after the first 1000; memory after"
        echo "1000 operations / half-way / at the end (Anonymous = private memory; RSS also counts the"
        echo "shared buffers the backend has touched so far, so it grows with the pages it visits;"
        echo "contexts = pg_backend_memory_contexts)."
        echo
        echo "| operation | count | wall µs/op | backend CPU µs/op | Anonymous kB | memory contexts kB | RSS kB |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        cpu_summary | awk -F'|' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
        echo
        if [ -f "$DIR/statements.csv" ]; then
            echo "Statements by total time, pg_stat_statements with track = all (a tenth as many calls):"
            echo
            echo "| calls | mean µs | statement |"
            echo "|---:|---:|---|"
            awk 'NR > 1 {
                    i = index($0, ","); calls = substr($0, 1, i - 1); rest = substr($0, i + 1)
                    j = index(rest, ","); us = substr(rest, 1, j - 1); q = substr(rest, j + 1)
                    gsub(/^"|"$/, "", q); gsub(/""/, "\"", q); gsub(/\|/, "\\|", q)
                    printf "| %s | %s | `%s` |\n", calls, us, q }' "$DIR/statements.csv"
            echo
        fi
    fi
    if [ -f "$DIR/reconcile.csv" ]; then
        echo "## Reconciliation cost (test/bench/reconcile_cost.sh)"
        echo
        rmeta() { awk -F, -v k="$1" '$1 == k { print $2 }' "$DIR/reconcile_meta.csv" 2>/dev/null || true; }
        echo "One incremental rp_reconcile(id) pass over $(rmeta new_claims) new claims (rp_claim_batch) on top of"
        echo "the claim history, in one session (plans cached as in the worker), and one full check"
        echo "(rp_reconcile(id, true)) for the record; buffers = shared blocks hit or read by the pass"
        echo "(pg_stat_statements). Run $(rmeta date), git $(rmeta git), load average at the end $(rmeta load_at_end)."
        echo
        echo "| claims of history | incremental pass: median ms | min ms | median buffers | passes | full check: ms | buffers |"
        echo "|---:|---:|---:|---:|---:|---:|---:|"
        reconcile_summary | awk -F'|' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
        reconcile_summary | awk -F'|' 'NR == 1 { a = $2; ab = $4; ha = $1 } END { if (NR > 1 && a > 0 && ab > 0)
            printf "\nIncremental pass at %s / at %s claims of history: %.2f× in median time (target: within 1.5×), %.2f× in buffers touched.\n", $1, ha, $2 / a, $4 / ab }'
        echo
    fi
    if [ -f "$DIR/group.csv" ]; then
        gmeta() { awk -F, -v k="$1" '$1 == k { print $2 }' "$DIR/group_meta.csv" 2>/dev/null || true; }
        echo "## Group red packets (test/bench/group.sh, make bench-group)"
        echo
        echo "Many small activities: a pgbench transaction creates a 10-packet lucky draw of 20.00"
        echo "ending 20 s later and makes its 10 claims, against the same in plain SQL (a packet"
        echo "row, 10 conditional UPDATE ... RETURNING feeding an INSERT), $(gmeta clients) clients,"
        echo "$(gmeta seconds) s each, reconciler paused; creation alone against a plain insert; each"
        echo "figure the median of $(gmeta rounds) rounds alternating which side runs first, after a warm-up round."
        echo "Run $(gmeta date), git $(gmeta git), load average at the end $(gmeta load_at_end)."
        echo
        echo "| workload | clients | packets/s (creations/s) | p50 ms | p99 ms | checked |"
        echo "|---|---:|---:|---:|---:|---|"
        awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $5, $6, $7, $8 }' "$DIR/group.csv"
        awk -F, 'NR > 1 { r[$1] = $5 } END {
            if (r["group_plain"] > 0) printf "\nredpacket / plain SQL packets/s: %.2f× (target >= 0.9×).", r["group_redpacket"] / r["group_plain"]
            if (r["create_redpacket"] > 0) printf " rp_create_activity / a plain insert, time per creation: %.2f× (target <= 2×).", r["create_plain"] / r["create_redpacket"]
            printf "\n" }' "$DIR/group.csv"
        echo
        if [ -f "$DIR/group_lag.csv" ] && [ "$(wc -l <"$DIR/group_lag.csv")" -gt 1 ]; then
            echo "Sustained: $(gmeta sustain_clients) clients, $(gmeta sustain_seconds) s, redpacket.reconcile_interval = $(gmeta interval);"
            echo "every few seconds, the activities created more than $(gmeta lag) s earlier and never checked, and those"
            echo "ended more than $(gmeta lag) s earlier and not settled (target: 0 at every sample after $(gmeta lag) s)."
            echo
            echo "| second | activities | never checked | expired, unsettled | last pass: s ago | activities | ms |"
            echo "|---:|---:|---:|---:|---:|---:|---:|"
            awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$DIR/group_lag.csv"
            echo
        fi
    fi
} >"$MD"

if [ "$HAVE_BENCH" = 1 ]; then
    plot
    throughput_text
    echo
    echo "targets:"
    targets | awk -F'|' '{ printf "  %-9s %-84s %7s  (%s %s; %s)\n", $4, $1, $2, "bound", $3, $5 }'
    echo
    echo "ratios:"
    ratios | awk -F'|' '{ printf "  %-62s %8s   (%s)\n", $1, $2, $3 }'
fi
if [ -f "$DIR/cpu.csv" ]; then
    echo
    echo "one backend:  operation | count | wall us/op | CPU us/op | Anonymous kB 1000/mid/end | contexts kB | RSS kB"
    cpu_summary | sed 's/^/  /; s/|/ | /g'
fi
if [ -f "$DIR/reconcile.csv" ]; then
    echo
    echo "reconcile: history | incremental: median ms | min ms | median buffers | passes | full check: ms | buffers"
    reconcile_summary | sed 's/^/  /; s/|/ | /g'
fi
if [ -f "$DIR/group.csv" ]; then
    echo
    echo "group: workload | clients | seconds | transactions | packets/s | p50 ms | p99 ms | checked"
    tail -n +2 "$DIR/group.csv" | sed 's/^/  /; s/,/ | /g'
fi
echo
echo "wrote ${BENCH_RESULTS_SHOWN:-$DIR}/results.md"
