-- Red-packet rain: per_user_limit > 1.  Each claim needs a request_id, the
-- idempotency key is (activity, user, request_id), a retry returns the
-- original claim, and a user never holds more than per_user_limit claims.
-- Run q and show its SQLSTATE and message; activity ids in messages are
-- masked, as they depend on what ran before.
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN others THEN
    RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'activity -?[0-9]+', 'activity N', 'g');
END $$;

-- Claims made so far, to name the claim a duplicate points at.
CREATE TEMP TABLE seen (claim_id bigint PRIMARY KEY, shown text NOT NULL);

-- Claim and describe the outcome, checking the result against the claim row.
CREATE FUNCTION pg_temp.claim(aid bigint, uid text, amt numeric DEFAULT NULL, req text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r redpacket.claim_result;
    c redpacket.claim;
    lim integer;
BEGIN
    r := redpacket.rp_claim(aid, uid, amt, req);
    IF r.status IS NULL THEN
        RETURN 'NULL status';
    END IF;
    IF r.status NOT IN ('claimed', 'duplicate') THEN
        IF r.claim_id IS NOT NULL OR r.amount IS NOT NULL OR r.claimed_at IS NOT NULL THEN
            RETURN r.status || ' with a claim_id, amount or claimed_at';
        END IF;
        RETURN r.status::text;
    END IF;
    SELECT * INTO c FROM redpacket.claim WHERE activity_id = aid AND claim_id = r.claim_id;
    IF NOT FOUND THEN
        RETURN r.status || ' without a claim row';
    END IF;
    SELECT per_user_limit INTO lim FROM redpacket.activity WHERE id = aid;
    IF c.user_id IS DISTINCT FROM uid OR c.amount IS DISTINCT FROM r.amount
       OR c.claimed_at IS DISTINCT FROM r.claimed_at
       OR (lim > 1 AND c.request_id IS DISTINCT FROM req) THEN
        RETURN r.status || ' but the claim row differs from the result';
    END IF;
    IF r.status = 'claimed' THEN
        IF amt IS NOT NULL AND r.amount <> amt THEN
            RETURN 'claimed a different amount';
        END IF;
        INSERT INTO seen VALUES (r.claim_id,
            uid || coalesce('/' || req, '') || ' ' || CASE WHEN amt IS NULL THEN 'lucky' ELSE r.amount::text END);
        RETURN 'claimed ' || CASE WHEN amt IS NULL THEN 'lucky' ELSE r.amount::text END;
    END IF;
    RETURN 'duplicate of ' || coalesce((SELECT shown FROM seen s WHERE s.claim_id = r.claim_id), 'an unseen claim');
END $$;

-- The books of one activity: claims + stripe balances + returned = funded = total.
CREATE FUNCTION pg_temp.books(aid bigint)
RETURNS TABLE (claims bigint, claimed numeric, remaining numeric, remaining_packets numeric,
               returned numeric, balanced boolean)
LANGUAGE sql AS $$
SELECT c.n,
       round(c.s, a.scale),
       round(st.b / 10::numeric ^ a.scale, a.scale),
       st.p,
       round(l.ret, a.scale),
       c.s + st.b / 10::numeric ^ a.scale + l.ret = a.total
         AND l.fund = a.total
         AND c.whole
         AND (a.packets IS NULL OR c.n + st.p = a.packets)
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT count(*) AS n, coalesce(sum(cl.amount), 0) AS s,
           coalesce(bool_and(cl.amount * 10::numeric ^ a.scale
                             = trunc(cl.amount * 10::numeric ^ a.scale)), true) AS whole
    FROM redpacket.claim cl WHERE cl.activity_id = a.id) c
CROSS JOIN LATERAL (
    SELECT coalesce(sum(s.balance), 0)::numeric AS b, sum(s.packets) AS p
    FROM redpacket.stripe s WHERE s.activity_id = a.id) st
CROSS JOIN LATERAL (
    SELECT coalesce(sum(le.amount) FILTER (WHERE le.kind = 'return'), 0) AS ret,
           coalesce(sum(le.amount) FILTER (WHERE le.kind = 'fund'), 0) AS fund
    FROM redpacket.ledger le WHERE le.activity_id = a.id) l
WHERE a.id = aid
$$;


-- fixed amounts, per_user_limit 3 ------------------------------------------
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 3, stripes => 4) AS a \gset
SELECT pg_temp.claim(:a, 'alice', 1.00, 'r1');
SELECT pg_temp.claim(:a, 'alice', 1.10, 'r2');
SELECT pg_temp.claim(:a, 'alice', 1.20, 'r3');
SELECT pg_temp.claim(:a, 'alice', 1.10, 'r2');        -- retry
SELECT pg_temp.claim(:a, 'alice', 5.00, 'r1');        -- retry with another amount
SELECT pg_temp.claim(:a, 'alice', 1.00, 'r4');        -- a 4th distinct request
SELECT pg_temp.claim(:a, 'alice', 1.00, 'r5');
SELECT pg_temp.claim(:a, 'alice', 1.20, 'r3');        -- retries still work at the limit
SELECT pg_temp.claim(:a, 'bob', 0.50, 'r1');          -- same request id, other user
SELECT pg_temp.claim(:a, 'bob', 0.50, 'r4');
SELECT pg_temp.claim(:a, 'bob', 0.50, 'R4');          -- request ids are case sensitive
SELECT pg_temp.claim(:a, 'bob', 0.50, 'r5');
SELECT pg_temp.claim(:a, 'bob', 0.50, 'r1');
SELECT pg_temp.err(format('SELECT redpacket.rp_claim(%s, %L, 1.00)', :a, 'carol'));
SELECT pg_temp.err(format('SELECT redpacket.rp_claim(%s, %L, 1.00, NULL)', :a, 'alice'));
SELECT user_id, request_id, amount FROM redpacket.claim WHERE activity_id = :a ORDER BY claim_id;
SELECT user_id, count(*) FROM redpacket.claim WHERE activity_id = :a GROUP BY user_id ORDER BY user_id;
SELECT * FROM pg_temp.books(:a);
-- budget left: 10.00 - 3.30 - 1.50 = 5.20
SELECT pg_temp.claim(:a, 'carol', 5.00, 'x');
SELECT pg_temp.claim(:a, 'carol', 0.21, 'y');
SELECT pg_temp.claim(:a, 'alice', 0.01, 'r6');        -- user_limit before exhausted
SELECT pg_temp.claim(:a, 'carol', 0.20, 'y');
SELECT pg_temp.claim(:a, 'carol', 0.01, 'z');
SELECT pg_temp.claim(:a, 'carol', 0.01, 'x');         -- duplicate before exhausted
SELECT * FROM pg_temp.books(:a);

-- lucky rain: packets, amount NULL, per_user_limit 3 --------------------------
SELECT redpacket.rp_create_activity(20.00, packets => 10, per_user_limit => 3, stripes => 2) AS l \gset
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-1');
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-2');
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-3');
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-2');
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-4');
-- bob catches drops until the packets run out: 3 for him, the rest for others
SELECT r.status, count(*)
FROM generate_series(1, 5) g CROSS JOIN LATERAL redpacket.rp_claim(:l, 'bob', NULL, 'drop-' || g) r
GROUP BY r.status ORDER BY r.status;
SELECT r.status, count(*)
FROM generate_series(1, 6) g CROSS JOIN LATERAL redpacket.rp_claim(:l, 'user-' || g, NULL, 'drop-1') r
GROUP BY r.status ORDER BY r.status;
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-5');    -- user_limit before exhausted
SELECT pg_temp.claim(:l, 'carol', NULL, 'drop-1');
SELECT pg_temp.claim(:l, 'alice', NULL, 'drop-3');
SELECT count(*) AS claims, count(DISTINCT (user_id, request_id)) AS keys,
       max(per_user) AS max_per_user, sum(amount) = 20.00 AS all_drawn, min(amount) >= 0.01 AS min_unit
FROM (SELECT user_id, request_id, amount, count(*) OVER (PARTITION BY user_id) AS per_user
      FROM redpacket.claim WHERE activity_id = :l) c;
SELECT * FROM pg_temp.books(:l);

-- a retry after close returns the original; new requests are ended -----------
SELECT redpacket.rp_close_activity(:a) = 0 AS nothing_left;
SELECT pg_temp.claim(:a, 'alice', 1.00, 'r1');
SELECT pg_temp.claim(:a, 'dave', 1.00, 'r1');
SELECT pg_temp.claim(:a, 'alice', 1.00, 'r9');
SELECT * FROM pg_temp.books(:a);

-- per_user_limit 2 in one transaction, with a savepoint rolled back ----------
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 2, stripes => 2) AS t \gset
BEGIN;
SELECT pg_temp.claim(:t, 'alice', 1.00, 'a');
SAVEPOINT s;
SELECT pg_temp.claim(:t, 'alice', 1.00, 'b');
SELECT pg_temp.claim(:t, 'alice', 1.00, 'c');
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.claim(:t, 'alice', 2.00, 'c');
SELECT pg_temp.claim(:t, 'alice', 1.00, 'b');
COMMIT;
SELECT request_id, amount FROM redpacket.claim WHERE activity_id = :t ORDER BY claim_id;
SELECT * FROM pg_temp.books(:t);

-- many users, many drops, one statement: never more than the limit each ------
SELECT redpacket.rp_create_activity(50.00, per_user_limit => 3, stripes => 8) AS m \gset
SELECT r.status, count(*)
FROM generate_series(1, 20) u, generate_series(1, 5) d
CROSS JOIN LATERAL redpacket.rp_claim(:m, 'user-' || u, 0.50, 'drop-' || d) r
GROUP BY r.status ORDER BY r.status;
SELECT max(n) AS max_per_user, count(*) AS users FROM
  (SELECT user_id, count(*) AS n FROM redpacket.claim WHERE activity_id = :m GROUP BY user_id) c;
SELECT * FROM pg_temp.books(:m);
