-- rp_claim statuses and their precedence: duplicate, frozen, not_started,
-- ended, user_limit, exhausted, claimed.  A status other than claimed and
-- duplicate carries no claim id, amount or time, and writes nothing.
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

-- The enum holds exactly the statuses, in check order.
SELECT enum_range(NULL::redpacket.claim_status);

-- claimed, duplicate, exhausted -------------------------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 4) AS a \gset
SELECT pg_temp.claim(:a, 'alice', 1.00);
SELECT pg_temp.claim(:a, 'alice', 1.00);             -- retry
SELECT pg_temp.claim(:a, 'alice', 2.00);             -- second grab, other amount: the original
SELECT pg_temp.claim(:a, 'alice', 1.00, 'req-1');    -- per_user_limit 1: request_id is not the key
SELECT pg_temp.claim(:a, 'bob', 8.50);
SELECT pg_temp.claim(:a, 'carol', 0.51);             -- 0.50 left
SELECT pg_temp.claim(:a, 'carol', 0.50);             -- exhausted wrote nothing: carol may claim
SELECT pg_temp.claim(:a, 'dave', 0.01);
SELECT pg_temp.claim(:a, 'alice', 0.01);             -- duplicate before exhausted
SELECT pg_temp.claim(:a, 'Alice', 0.01);             -- user ids are case sensitive
SELECT * FROM pg_temp.books(:a);
SELECT user_id, amount, request_id IS NULL AS no_request_id FROM redpacket.claim
WHERE activity_id = :a ORDER BY claim_id;
-- The duplicate handed back the very same claim, time included.
SELECT count(*) AS rows, count(DISTINCT claim_id) AS ids FROM redpacket.claim WHERE activity_id = :a AND user_id = 'alice';

-- exhausted by packets, with budget left ------------------------------------
SELECT redpacket.rp_create_activity(10.00, packets => 2, stripes => 2) AS p \gset
SELECT pg_temp.claim(:p, 'alice', 1.00);
SELECT pg_temp.claim(:p, 'bob', 1.00);
SELECT pg_temp.claim(:p, 'carol', 1.00);
SELECT pg_temp.claim(:p, 'carol', NULL);
SELECT pg_temp.claim(:p, 'bob', 1.00);               -- duplicate before exhausted
SELECT * FROM pg_temp.books(:p);

-- exhausted when the amount is larger than everything left ------------------
SELECT redpacket.rp_create_activity(1.00, stripes => 2) AS x \gset
SELECT pg_temp.claim(:x, 'alice', 1.01);
SELECT pg_temp.claim(:x, 'alice', 1.00);             -- the whole budget at once
SELECT pg_temp.claim(:x, 'bob', 0.01);
SELECT * FROM pg_temp.books(:x);

-- frozen: after duplicate, before everything else ---------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 2) AS f \gset
SELECT pg_temp.claim(:f, 'alice', 1.00);
SELECT redpacket.rp_freeze(:f, 'status test');
SELECT pg_temp.claim(:f, 'alice', 1.00);             -- duplicate before frozen
SELECT pg_temp.claim(:f, 'bob', 1.00);
SELECT pg_temp.claim(:f, 'carol', 100.00);           -- frozen before exhausted
SELECT * FROM pg_temp.books(:f);
SELECT redpacket.rp_unfreeze(:f);
SELECT pg_temp.claim(:f, 'bob', 1.00);
SELECT * FROM pg_temp.books(:f);

-- not_started: after frozen, before ended -----------------------------------
SELECT redpacket.rp_create_activity(10.00, starts_at => now() + interval '1 hour', stripes => 2) AS ns \gset
SELECT pg_temp.claim(:ns, 'alice', 1.00);
SELECT pg_temp.claim(:ns, 'alice', 100.00);          -- not_started before exhausted
SELECT redpacket.rp_freeze(:ns, 'status test');
SELECT pg_temp.claim(:ns, 'alice', 1.00);            -- frozen before not_started
SELECT redpacket.rp_unfreeze(:ns);
SELECT pg_temp.claim(:ns, 'alice', 1.00);
SELECT redpacket.rp_close_activity(:ns) = 10.00 AS closed_with_all_returned;
SELECT pg_temp.claim(:ns, 'alice', 1.00);            -- not_started before ended (closed)
SELECT * FROM pg_temp.books(:ns);

-- ended: by ends_at in the past, and by close -------------------------------
SELECT redpacket.rp_create_activity(10.00, starts_at => now() - interval '2 hours',
       ends_at => now() - interval '1 hour', stripes => 2) AS e \gset
SELECT pg_temp.claim(:e, 'alice', 1.00);
SELECT pg_temp.claim(:e, 'alice', 100.00);           -- ended before exhausted
SELECT redpacket.rp_freeze(:e, 'status test');
SELECT pg_temp.claim(:e, 'alice', 1.00);             -- frozen before ended
SELECT redpacket.rp_unfreeze(:e);
SELECT pg_temp.claim(:e, 'alice', 1.00);
SELECT * FROM pg_temp.books(:e);
-- ends_at in the future is still open
SELECT redpacket.rp_create_activity(10.00, ends_at => now() + interval '1 hour', stripes => 2) AS e2 \gset
SELECT pg_temp.claim(:e2, 'alice', 1.00);
SELECT * FROM pg_temp.books(:e2);

-- user_limit: after ended, before exhausted (per_user_limit 2) ---------------
SELECT redpacket.rp_create_activity(5.00, per_user_limit => 2, stripes => 2) AS u \gset
SELECT pg_temp.claim(:u, 'alice', 1.00, 'r1');
SELECT pg_temp.claim(:u, 'alice', 1.00, 'r2');
SELECT pg_temp.claim(:u, 'alice', 1.00, 'r3');
SELECT pg_temp.claim(:u, 'alice', 1.00, 'r1');       -- duplicate before user_limit
SELECT pg_temp.claim(:u, 'bob', 2.00, 'r1');
SELECT pg_temp.claim(:u, 'bob', 1.00, 'r2');         -- budget now 0.00
SELECT pg_temp.claim(:u, 'carol', 0.01, 'r1');
SELECT pg_temp.claim(:u, 'alice', 0.01, 'r3');       -- user_limit before exhausted
SELECT pg_temp.claim(:u, 'bob', 0.01, 'r2');         -- duplicate before everything
SELECT redpacket.rp_close_activity(:u) = 0 AS nothing_to_return;
SELECT pg_temp.claim(:u, 'alice', 0.01, 'r3');       -- ended before user_limit
SELECT pg_temp.claim(:u, 'alice', 0.01, 'r2');       -- duplicate before ended
SELECT redpacket.rp_freeze(:u, 'status test');
SELECT pg_temp.claim(:u, 'alice', 0.01, 'r3');       -- frozen before ended
SELECT pg_temp.claim(:u, 'bob', 0.01, 'r1');         -- duplicate before frozen
SELECT * FROM pg_temp.books(:u);
SELECT user_id, request_id, amount FROM redpacket.claim WHERE activity_id = :u ORDER BY claim_id;

-- Nothing but claimed ever added a claim row, in any activity above.
SELECT count(*) AS claim_rows, (SELECT count(*) FROM seen) AS claimed_results
FROM redpacket.claim c WHERE c.claim_id IN (SELECT claim_id FROM seen)
   OR c.activity_id IN (:a, :p, :x, :f, :ns, :e, :e2, :u);
