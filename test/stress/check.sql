-- Stress run invariants.  Input: stress_activity, stress_log (one row per
-- rp_claim call or rp_claim_batch element) and psql variable :txns (how many
-- transactions pgbench was told to make).  Each check writes one row per activity (or one global row) into chk;
-- the output is one line per invariant, "PASS|invariant|detail" or
-- "FAIL|invariant|detail" (the failing activities' details), and with
-- psql variable :verbose set to 1, every row as "ROW|invariant|label: detail".
-- The last part closes two activities per round and checks the books again.
SET client_min_messages = warning;

CREATE TEMP TABLE chk (
    n      serial,
    inv    text NOT NULL,       -- the invariant
    label  text,                -- activity, NULL for a global check
    ok     boolean NOT NULL,
    detail text
);

CREATE INDEX ON stress_log (activity_id, status);
CREATE INDEX ON stress_log (activity_id, claim_id);
ANALYZE stress_log;

-- the books of every activity: the view rp_books
\ir ../sql/books.sql
CREATE TEMP VIEW act AS
SELECT sa.id AS ord, sa.label, sa.kind, b.id, b.total, b.packets, b.scale, b.per_user_limit,
       round(10::numeric ^ b.scale) AS unit, b.funded, b.returned,
       b.claimed AS claimed_sum, b.n_claims AS claimed_n,
       b.remaining * round(10::numeric ^ b.scale) AS bal_units, b.packets_left AS pk_left,
       b.negative AS neg_stripes, b.balanced,
       (SELECT count(*) FROM redpacket.stripe s WHERE s.activity_id = b.id) AS n_stripes
FROM stress_activity sa JOIN rp_books b ON b.id = sa.id;

-- Every pgbench transaction made it into the log, with one row per call (an
-- rp_claim_batch call logs four, a two-claim transaction two): no client
-- error, no lost transaction.
INSERT INTO chk (inv, ok, detail)
SELECT 'every call answered and logged', t.n = :txns AND t.bad = 0,
       format('%s of %s transactions logged, %s calls; %s transactions with a wrong row count',
              t.n, :txns, t.calls, t.bad)
FROM (SELECT count(*) AS n, sum(rows) AS calls,
             count(*) FILTER (WHERE rows <> expected) AS bad
      FROM (SELECT txid, count(*) AS rows, min(txn_calls) AS expected
            FROM stress_log GROUP BY txid) x) t;

-- While the run lasted nothing was frozen, closed or not yet started, and
-- with per_user_limit 1 a returning user is a duplicate, never user_limit.
INSERT INTO chk (inv, ok, detail)
SELECT 'no unexpected status',
       count(*) FILTER (WHERE l.status IS NULL OR l.status IN ('frozen', 'not_started', 'ended')
                        OR (l.status = 'user_limit' AND a.per_user_limit = 1)) = 0,
       format('frozen %s, not_started %s, ended %s, NULL %s, user_limit at limit 1: %s',
              count(*) FILTER (WHERE l.status = 'frozen'), count(*) FILTER (WHERE l.status = 'not_started'),
              count(*) FILTER (WHERE l.status = 'ended'), count(*) FILTER (WHERE l.status IS NULL),
              count(*) FILTER (WHERE l.status = 'user_limit' AND a.per_user_limit = 1))
FROM stress_log l JOIN redpacket.activity a ON a.id = l.activity_id;

-- The books balance: funded = claims + remaining + returned, exactly.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'claims + remaining + returned = funded', label,
       balanced,
       format('%s + %s + %s = %s (funded %s)', claimed_sum, round(bal_units / unit, scale),
              returned, claimed_sum + round(bal_units / unit, scale) + returned, funded)
FROM act ORDER BY ord;

-- Packets: claims never exceed them, and the stripes count what is left.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'claims <= packets, stripes hold packets - claims', label,
       claimed_n <= packets AND pk_left = packets - claimed_n,
       format('%s claims of %s packets, %s left in stripes', claimed_n, packets, pk_left)
FROM act WHERE packets IS NOT NULL ORDER BY ord;

-- One claim per idempotency key, never more than per_user_limit per user.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'one claim per key, at most per_user_limit per user', a.label,
       coalesce(max_per_key, 0) <= 1 AND coalesce(max_per_user, 0) <= a.per_user_limit,
       format('max %s per key, max %s per user (limit %s), %s users',
              coalesce(max_per_key, 0), coalesce(max_per_user, 0), a.per_user_limit, users)
FROM act a
CROSS JOIN LATERAL (
    SELECT max(n) AS max_per_key FROM (
        SELECT count(*) AS n FROM redpacket.claim c
        WHERE c.activity_id = a.id
        GROUP BY c.user_id, CASE WHEN a.per_user_limit = 1 THEN '' ELSE c.request_id END) k) k
CROSS JOIN LATERAL (
    SELECT max(n) AS max_per_user, count(*) AS users FROM (
        SELECT count(*) AS n FROM redpacket.claim c
        WHERE c.activity_id = a.id GROUP BY c.user_id) u) u
ORDER BY a.ord;

-- No stripe ever below zero.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'no negative stripe', label, neg_stripes = 0,
       format('%s of %s stripes negative', neg_stripes, n_stripes)
FROM act ORDER BY ord;

-- Every `exhausted` was true: right after it, under the claim's locks, what
-- was left (all stripes together) could not cover the amount, or no packet
-- was left.  The activity must also really have run out during the run.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'ran out mid-run, every exhausted justified', a.label,
       e.n > 0 AND e.bad = 0,
       format('%s exhausted (first at call %s of %s), %s unjustified%s', e.n, e.first_at, e.calls, e.bad,
              CASE WHEN e.bad > 0 THEN format(' (e.g. asked %s with %s left, %s packets left)',
                                              ex.req_amount, round(ex.seen_balance / a.unit, a.scale),
                                              ex.seen_packets) ELSE '' END)
FROM act a
CROSS JOIN LATERAL (
    SELECT min(y.id) AS first_id FROM stress_log y
    WHERE y.activity_id = a.id AND y.status = 'exhausted') f
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE x.status = 'exhausted') AS n,
           count(*) AS calls,
           count(*) FILTER (WHERE x.id <= f.first_id) AS first_at,
           count(*) FILTER (WHERE x.status = 'exhausted'
                            AND coalesce(x.seen_packets, 1) > 0
                            AND (x.req_amount IS NULL OR x.seen_balance >= x.req_amount * a.unit)) AS bad
    FROM stress_log x WHERE x.activity_id = a.id) e
LEFT JOIN LATERAL (
    SELECT x.* FROM stress_log x
    WHERE x.activity_id = a.id AND x.status = 'exhausted'
      AND coalesce(x.seen_packets, 1) > 0
      AND (x.req_amount IS NULL OR x.seen_balance >= x.req_amount * a.unit)
    ORDER BY x.id LIMIT 1) ex ON true
ORDER BY a.ord;

-- Every `claimed` in the log is in redpacket.claim with the same user,
-- request, amount and time, and redpacket.claim holds nothing else.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'every claimed call is a claim row with the same amount, and no other rows', a.label,
       logged = stored AND matched = logged AND distinct_ids = logged,
       format('%s claimed in log, %s claim rows, %s matching, %s distinct ids',
              logged, stored, matched, distinct_ids)
FROM act a
CROSS JOIN LATERAL (
    SELECT count(*) AS logged, count(DISTINCT l.claim_id) AS distinct_ids,
           count(c.claim_id) FILTER (WHERE c.user_id = l.user_id AND c.amount = l.amount
                                     AND (a.per_user_limit = 1 OR c.request_id = l.request_id)
                                     AND c.claimed_at = l.claimed_at) AS matched
    FROM stress_log l
    LEFT JOIN redpacket.claim c ON c.activity_id = l.activity_id AND c.claim_id = l.claim_id
    WHERE l.activity_id = a.id AND l.status = 'claimed' AND NOT l.rolled_back) l
CROSS JOIN LATERAL (
    SELECT count(*) AS stored FROM redpacket.claim c WHERE c.activity_id = a.id) c
ORDER BY a.ord;

-- A duplicate hands back the original claim: the same id, amount and time,
-- belonging to the same user (and request, when per_user_limit > 1), logged
-- as claimed before the duplicate was.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'duplicates returned the original claim', a.label,
       bad = 0 AND (dups > 0 OR a.kind = 'cent7'),
       format('%s duplicates, %s not matching their original', dups, bad)
FROM act a
CROSS JOIN LATERAL (
    SELECT count(*) AS dups,
           count(*) FILTER (WHERE c.claim_id IS NULL OR o.claim_id IS NULL
                            OR c.user_id <> l.user_id
                            OR c.amount IS DISTINCT FROM l.amount
                            OR c.claimed_at IS DISTINCT FROM l.claimed_at
                            OR (a.per_user_limit > 1 AND c.request_id IS DISTINCT FROM l.request_id)
                            OR o.id > l.id) AS bad
    FROM stress_log l
    LEFT JOIN redpacket.claim c ON c.activity_id = l.activity_id AND c.claim_id = l.claim_id
    LEFT JOIN stress_log o ON o.activity_id = l.activity_id AND o.claim_id = l.claim_id
                          AND o.status = 'claimed' AND NOT o.rolled_back
    WHERE l.activity_id = a.id AND l.status = 'duplicate') d
ORDER BY a.ord;

-- user_limit only for a user who already holds per_user_limit claims, none of
-- them under this request id.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'every user_limit justified', a.label, u.n > 0 AND u.bad = 0,
       format('%s user_limit, %s unjustified', u.n, u.bad)
FROM act a
CROSS JOIN LATERAL (
    SELECT count(*) AS n, count(*) FILTER (WHERE h.held <> a.per_user_limit OR h.same_key > 0) AS bad
    FROM stress_log l
    CROSS JOIN LATERAL (
        SELECT count(*) AS held,
               count(*) FILTER (WHERE c.request_id = l.request_id) AS same_key
        FROM redpacket.claim c WHERE c.activity_id = a.id AND c.user_id = l.user_id) h
    WHERE l.activity_id = a.id AND l.status = 'user_limit') u
WHERE a.per_user_limit > 1
ORDER BY a.ord;

-- Callers that rolled back did get claims inside their own transactions, and
-- nothing of those remains: no claim row, and their users never see
-- `duplicate`.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'rolled-back claims left nothing behind', a.label,
       r.claimed > 0 AND r.dup = 0 AND c.left_rows = 0,
       format('%s calls rolled back (%s had claimed, %s exhausted), %s duplicate, %s claim rows left',
              r.n, r.claimed, r.exh, r.dup, c.left_rows)
FROM act a
CROSS JOIN LATERAL (
    SELECT count(*) AS n, count(*) FILTER (WHERE l.status = 'claimed') AS claimed,
           count(*) FILTER (WHERE l.status = 'exhausted') AS exh,
           count(*) FILTER (WHERE l.status = 'duplicate') AS dup
    FROM stress_log l WHERE l.activity_id = a.id AND l.rolled_back) r
CROSS JOIN LATERAL (
    SELECT count(*) AS left_rows FROM redpacket.claim c
    WHERE c.activity_id = a.id AND c.user_id LIKE 'rb%') c
WHERE a.kind = 'fixed'
ORDER BY a.ord;

-- No false exhaustion (the README's example): 100.00 at 0.07 a time is
-- exactly 1428 claims, leaving 0.04.
INSERT INTO chk (inv, label, ok, detail)
SELECT '100.00 at 0.07 a time: exactly 1428 claims, 0.04 left', label,
       claimed_n = 1428 AND bal_units / unit = 0.04,
       format('%s claims, %s left', claimed_n, round(bal_units / unit, scale))
FROM act WHERE kind = 'cent7' ORDER BY ord;

-- Lucky draws: whole minor units, at least one each; the packets that are
-- left can each still get a minor unit; no packet left means no money left.
INSERT INTO chk (inv, label, ok, detail)
SELECT 'lucky draws >= 0.01 in whole cents, all money claimable', a.label,
       bad = 0 AND bal_units >= pk_left AND (pk_left > 0 OR bal_units = 0),
       format('%s draws from %s to %s, %s outside; %s left for %s packets',
              n, lo, hi, bad, round(bal_units / unit, scale), pk_left)
FROM act a
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(c.amount) AS lo, max(c.amount) AS hi,
           count(*) FILTER (WHERE c.amount < 1 / a.unit OR c.amount <> round(c.amount, a.scale)) AS bad
    FROM redpacket.claim c WHERE c.activity_id = a.id) c
WHERE a.kind = 'lucky'
ORDER BY a.ord;

-- Reconciliation: every pass the background worker made during the run was
-- clean, and a full pass over each activity now agrees.
CREATE TEMP TABLE recon AS SELECT * FROM redpacket.reconciliation WHERE false;
DO $$
DECLARE
    a record;
    n bigint;
BEGIN
    FOR a IN SELECT id FROM stress_activity ORDER BY id LOOP
        -- A pass already running elsewhere makes rp_reconcile return nothing.
        FOR i IN 1 .. 100 LOOP
            INSERT INTO recon SELECT * FROM redpacket.rp_reconcile(a.id, true);
            GET DIAGNOSTICS n = ROW_COUNT;
            EXIT WHEN n > 0;
            PERFORM pg_sleep(0.1);
        END LOOP;
    END LOOP;
END
$$;
INSERT INTO chk (inv, ok, detail)
SELECT 'background worker reconciled during the run, every pass ok',
       count(*) > 0 AND count(*) FILTER (WHERE NOT r.ok) = 0,
       format('%s passes over these activities, %s not ok', count(*), count(*) FILTER (WHERE NOT r.ok))
FROM redpacket.reconciliation r
WHERE r.activity_id IN (SELECT id FROM stress_activity)
  AND r.pass_id NOT IN (SELECT pass_id FROM recon);
INSERT INTO chk (inv, label, ok, detail)
SELECT 'full reconciliation pass ok', a.label, r.ok IS TRUE,
       CASE WHEN r.activity_id IS NULL THEN 'no pass ran'
            ELSE format('expected %s, actual %s, drift %s, claims %s/%s, negative stripes %s',
                        r.expected, r.actual, r.drift, r.expected_claims, r.actual_claims,
                        r.negative_stripes) END
FROM stress_activity a LEFT JOIN recon r ON r.activity_id = a.id
ORDER BY a.id;
INSERT INTO chk (inv, label, ok, detail)
SELECT 'no activity frozen', sa.label, a.frozen_reason IS NULL,
       coalesce('frozen: ' || a.frozen_reason, 'not frozen')
FROM stress_activity sa JOIN redpacket.activity a ON a.id = sa.id
ORDER BY sa.id;

-- Close fixed and rain: the remainder goes back to the funder, the books
-- still balance, and later calls get ended (new users) or duplicate.
CREATE TEMP TABLE before_close AS SELECT label, kind, id, bal_units / unit AS remaining, scale FROM act;
CREATE TEMP TABLE closed AS
SELECT b.label, b.kind, b.id, b.remaining, redpacket.rp_close_activity(b.id) AS returned
FROM before_close b WHERE b.kind IN ('fixed', 'rain') ORDER BY b.id;
INSERT INTO chk (inv, label, ok, detail)
SELECT 'close returns the remainder, books still balance', c.label,
       c.returned = c.remaining AND a.returned = c.remaining AND a.bal_units = 0
       AND a.funded = a.claimed_sum + a.bal_units / a.unit + a.returned,
       format('returned %s (remaining was %s, ledger says %s), stripes now %s; %s + %s = %s',
              c.returned, round(c.remaining, a.scale), a.returned, round(a.bal_units / a.unit, a.scale),
              a.claimed_sum, a.returned, a.funded)
FROM closed c JOIN act a ON a.id = c.id ORDER BY a.ord;
INSERT INTO chk (inv, label, ok, detail)
SELECT 'after close: new user ended, old claimant duplicate', c.label,
       (n).status = 'ended' AND (o).status = 'duplicate' AND (o).claim_id = orig.claim_id,
       format('new user: %s; claimant %s: %s (claim %s, original %s)',
              (n).status, orig.user_id, (o).status, (o).claim_id, orig.claim_id)
FROM closed c
CROSS JOIN LATERAL (
    SELECT cl.user_id, cl.request_id, cl.claim_id FROM redpacket.claim cl
    WHERE cl.activity_id = c.id ORDER BY cl.claim_id LIMIT 1) orig
CROSS JOIN LATERAL (
    SELECT redpacket.rp_claim(c.id, 'after-close', 1.00,
                              CASE WHEN c.kind = 'rain' THEN 'r1' END) AS n,
           redpacket.rp_claim(c.id, orig.user_id, 1.00, orig.request_id) AS o) r
ORDER BY c.id;

-- Report: one line per invariant; for a global check its detail, for a
-- per-activity one how many activities and one example, or what failed.
SELECT CASE WHEN bool_and(ok) THEN 'PASS' ELSE 'FAIL' END,
       inv,
       CASE WHEN count(label) = 0 THEN string_agg(detail, '; ' ORDER BY n)
            WHEN bool_and(ok) THEN format('%s activities, e.g. %s',
                                          count(*), (array_agg(label || ': ' || detail ORDER BY n))[1])
            ELSE string_agg(label || ': ' || detail, '; ' ORDER BY n) FILTER (WHERE NOT ok)
       END
FROM chk GROUP BY inv ORDER BY min(n);

\if :{?verbose}
SELECT 'ROW', inv, coalesce(label || ': ', '') || detail || CASE WHEN ok THEN '' ELSE '  <-- FAIL' END
FROM chk ORDER BY n;
\endif
