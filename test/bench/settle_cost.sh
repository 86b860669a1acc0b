#!/usr/bin/env bash
# What settling with a wallet costs, side by side in one run:
#  1. rp_credited of 10,000 claims a call against a plain INSERT ... SELECT of
#     the same 10,000 claims into a table shaped like claim_settlement (same
#     columns, defaults and indexes, no trigger), each in a transaction of
#     its own, alternating which goes first, SETTLE_ROUNDS rounds: wall time
#     (commit included) and backend CPU per call, and the ratio;
#  2. rp_pending_credits on an activity with SETTLE_CLAIMS claims, all
#     credited but five scattered ones (the wallet skipped them) and the last
#     100 (not acknowledged yet): the first call (its frontier reads the
#     claims once), then a steady-state call, with the plans and buffers of
#     the statements it runs (auto_explain), and the plain anti-join of
#     claims and settlements for comparison.
# Writes test/bench/results/settle_cost.md (SETTLE_RESULTS overrides).
#
#   bash test/bench/settle_cost.sh        as an ordinary user (initdb refuses root)
#
# Environment: PG_CONFIG, SETTLE_ROUNDS (20), SETTLE_CLAIMS (2000000),
# SETTLE_PORT (a free TCP port, 24060 by default).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PGBIN=$("$PG_CONFIG" --bindir)
ROUNDS=${SETTLE_ROUNDS:-20}
CLAIMS=${SETTLE_CLAIMS:-2000000}
OUT=${SETTLE_RESULTS:-$HERE/results/settle_cost.md}
export PGPORT=${SETTLE_PORT:-24060} PGDATABASE=postgres PGUSER=$(id -un)
unset PGSERVICE PGPASSWORD PGOPTIONS
DIR=$(mktemp -d "${TMPDIR:-/tmp}/redpacket-settle-cost.XXXXXX")
export PGHOST=$DIR
trap '"$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

"$PGBIN/initdb" -D "$DIR/data" -A trust -E UTF8 --locale=C >"$DIR/initdb.log"
# durable, as in production: every commit waits for its WAL flush
cat >>"$DIR/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$DIR'
redpacket.reconcile_interval = 0
shared_buffers = 512MB
max_wal_size = 8GB
checkpoint_timeout = 1h
CONF
"$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -o "-p $PGPORT" start >/dev/null

psql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

echo "== setup: $((ROUNDS * 10000)) claims to credit, $CLAIMS on the pending activity"
psql <<SQL
CREATE EXTENSION redpacket;
-- the baseline's table: claim_settlement's columns, defaults and indexes
CREATE TABLE plain_settlement (LIKE redpacket.claim_settlement INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE FUNCTION cpu_ticks() RETURNS bigint LANGUAGE plpgsql AS \$\$
DECLARE
    stat text := pg_read_file('/proc/self/stat');
    f text[] := regexp_split_to_array(substr(stat, strpos(stat, ') ') + 2), ' ');
BEGIN
    RETURN f[12]::bigint + f[13]::bigint;
END
\$\$;
-- n claims on the activity, 10,000 a batch
CREATE PROCEDURE claim_many(act bigint, n int, prefix text) LANGUAGE plpgsql AS \$\$
BEGIN
    FOR b IN 0 .. (n - 1) / 10000 LOOP
        PERFORM count(*) FROM redpacket.rp_claim_batch(act,
            ARRAY(SELECT prefix || g FROM generate_series(b * 10000 + 1, least(n, (b + 1) * 10000)) g),
            array_fill(0.01, ARRAY[least(n, (b + 1) * 10000) - b * 10000]));
        COMMIT;
    END LOOP;
END
\$\$;
CREATE TABLE timing (round int, what text, us numeric, ticks bigint);
CREATE TABLE round_ids (round int PRIMARY KEY, ids bigint[]);
SELECT redpacket.rp_create_activity(1000000000.00, stripes => 16, name => 'credit') AS c \gset
SELECT redpacket.rp_create_activity(1000000000.00, stripes => 16, name => 'pending') AS p \gset
CALL claim_many(:c, $ROUNDS * 10000, 'c');
INSERT INTO round_ids
SELECT (n - 1) / 10000 + 1, array_agg(claim_id ORDER BY claim_id)
  FROM (SELECT claim_id, row_number() OVER (ORDER BY claim_id) AS n
          FROM redpacket.claim WHERE activity_id = :c) x
 GROUP BY 1;
CALL claim_many(:p, $CLAIMS, 'p');
VACUUM ANALYZE;
-- the same claims, one call of each a round, in transactions of their own
CREATE PROCEDURE bench(act bigint, rounds int) LANGUAGE plpgsql AS \$\$
DECLARE
    ids bigint[];
    t0 timestamptz;
    c0 bigint;
    what text;
BEGIN
    FOR r IN 1 .. rounds LOOP
        SELECT i.ids INTO ids FROM round_ids i WHERE i.round = r;
        FOR k IN 0 .. 1 LOOP
            what := CASE WHEN (r + k) % 2 = 0 THEN 'rp_credited' ELSE 'INSERT ... SELECT' END;
            COMMIT;
            t0 := clock_timestamp();
            c0 := cpu_ticks();
            IF what = 'rp_credited' THEN
                PERFORM redpacket.rp_credited(act, ids, 'bench');
            ELSE
                INSERT INTO plain_settlement (activity_id, claim_id, state, amount, reference)
                SELECT cl.activity_id, cl.claim_id, 'credited', cl.amount, 'bench'
                  FROM redpacket.claim cl
                 WHERE cl.activity_id = act AND cl.claim_id IN (SELECT unnest(ids));
            END IF;
            COMMIT;
            INSERT INTO timing VALUES (r, what, extract(epoch FROM clock_timestamp() - t0) * 1e6,
                                       cpu_ticks() - c0);
        END LOOP;
    END LOOP;
    COMMIT;
END
\$\$;
SQL
c=$(psql -c "SELECT id FROM redpacket.activity WHERE name = 'credit'")
p=$(psql -c "SELECT id FROM redpacket.activity WHERE name = 'pending'")

echo "== 1. rp_credited vs INSERT ... SELECT, $ROUNDS rounds of 10,000"
psql -c "CALL bench($c, $ROUNDS)"
TICK_US=$((1000000 / $(getconf CLK_TCK)))
credit_table=$(psql -F ' | ' <<SQL
SELECT '| ' || what || ' | ' || count(*) || ' | ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY us))::numeric / 1000, 1)
       || ' | ' || round(avg(us) / 1000, 1) || ' | ' || round(sum(ticks) * $TICK_US / count(*) / 1000.0, 1) || ' |'
  FROM timing WHERE round > 1 GROUP BY what ORDER BY what DESC;
SQL
)
credit_ratio=$(psql <<SQL
WITH m AS (SELECT what, (percentile_cont(0.5) WITHIN GROUP (ORDER BY us))::numeric AS med, sum(ticks) AS t
             FROM timing WHERE round > 1 GROUP BY what)
SELECT round(c.med / i.med, 2) || ' (wall, median) and ' || round(c.t::numeric / nullif(i.t, 0), 2) || ' (backend CPU)'
  FROM m c, m i WHERE c.what = 'rp_credited' AND i.what <> 'rp_credited';
SQL
)
credited_ok=$(psql -c "SELECT count(*) = $ROUNDS * 10000 FROM redpacket.claim_settlement WHERE activity_id = $c")
echo "$credit_table"
echo "ratio rp_credited / INSERT ... SELECT: $credit_ratio; every claim credited: $credited_ok"

echo "== 2. rp_pending_credits on $CLAIMS claims"
# credit all but five scattered claims and the last 100, 10,000 a call
psql <<SQL
CREATE TABLE p_ids AS
SELECT claim_id, row_number() OVER (ORDER BY claim_id) AS n FROM redpacket.claim WHERE activity_id = $p;
CREATE INDEX ON p_ids (n);
CREATE PROCEDURE credit_all_but(act bigint) LANGUAGE plpgsql AS \$\$
DECLARE
    ids bigint[];
BEGIN
    FOR b IN 0 .. ($CLAIMS - 101) / 10000 LOOP
        SELECT array_agg(claim_id) INTO ids FROM p_ids
         WHERE n > b * 10000 AND n <= least($CLAIMS - 100, (b + 1) * 10000)
           AND n NOT IN (17, $CLAIMS / 7, $CLAIMS / 2, $CLAIMS - 5000, $CLAIMS - 101);
        PERFORM redpacket.rp_credited(act, ids);
        COMMIT;
    END LOOP;
END
\$\$;
CALL credit_all_but($p);
VACUUM ANALYZE;
SQL
first=$(psql <<SQL
\timing on
SELECT count(*) FROM redpacket.rp_pending_credits($p);
SQL
)
steady=$(psql <<SQL 2>&1
\timing on
SELECT count(*) FROM redpacket.rp_pending_credits($p);
SQL
)
plans=$(psql <<SQL 2>&1
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_timing = off;
SET auto_explain.log_nested_statements = on;
SET client_min_messages = log;
SELECT count(*) FROM redpacket.rp_pending_credits($p);
SQL
)
naive=$(psql <<SQL
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF)
SELECT count(*) FROM redpacket.claim c
 WHERE c.activity_id = $p
   AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s
                    WHERE s.activity_id = c.activity_id AND s.claim_id = c.claim_id);
SQL
)
frontier=$(psql -c "SELECT settled_through - (SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = $p) + 1 || ' claims behind the frontier, ' || (SELECT count(*) FROM redpacket.settlement_gap WHERE activity_id = $p) || ' gaps' FROM redpacket.settlement_state WHERE activity_id = $p")
echo "first call: $first"
echo "steady call: $steady"
echo "frontier: $frontier"

version=$(psql -c "SELECT current_setting('server_version')")
load=$(cut -d' ' -f1-3 /proc/loadavg)
{
    echo "# Settling with a wallet: what it costs ($(date -u +%Y-%m-%d))"
    echo
    echo "\`bash test/bench/settle_cost.sh\` (PostgreSQL $version, $(nproc) cores, load average $load"
    echo "at the end; durable commits)."
    echo
    echo "## rp_credited of 10,000 claims vs a plain INSERT ... SELECT of the same 10,000"
    echo
    echo "Each call in a transaction of its own (commit included), alternating which goes"
    echo "first; the first round left out. The baseline inserts the same claims' rows into a"
    echo "table with claim_settlement's columns, defaults and indexes (no ON CONFLICT, no"
    echo "check, no trigger)."
    echo
    echo "| call | rounds | ms per call (median) | ms (mean) | ms backend CPU per call |"
    echo "|---|---|---|---|---|"
    echo "$credit_table"
    echo
    echo "Ratio rp_credited / INSERT ... SELECT: $credit_ratio. Every claim credited: $credited_ok."
    echo
    echo "## rp_pending_credits on an activity with $CLAIMS claims"
    echo
    echo "All credited but five scattered claims (gaps) and the last 100. The first call moves"
    echo "the activity's frontier over every claim once; later calls read only the gaps and"
    echo "the claims after the frontier ($frontier)."
    echo
    echo '```'
    echo "first call:  $(echo "$first" | tr '\n' ' ')"
    echo "steady call: $(echo "$steady" | tr '\n' ' ')"
    echo '```'
    echo
    echo "The statements of a steady call (auto_explain, buffers):"
    echo
    echo '```'
    echo "$plans" | grep -v '^LOAD\|^SET' | sed 's/^psql:<stdin>:[0-9]*: //'
    echo '```'
    echo
    echo "The plain anti-join of claims and settlements, for comparison:"
    echo
    echo '```'
    echo "$naive"
    echo '```'
} >"$OUT"
echo "wrote $OUT"
