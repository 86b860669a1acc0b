-- rp_close_activity returns the unclaimed remainder and records it in the
-- ledger, once; later claims get ended (or duplicate).  rp_freeze and
-- rp_unfreeze hold and release an activity without moving money.
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


-- close after some claims -------------------------------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'close') AS a \gset
SELECT pg_temp.claim(:a, 'alice', 3.00);
SELECT pg_temp.claim(:a, 'bob', 2.50);
SELECT redpacket.rp_close_activity(:a) AS returned;
SELECT closed_at IS NOT NULL AS closed, closed_at <= now() AS closed_in_past, frozen_reason
FROM redpacket.activity WHERE id = :a;
SELECT kind, amount, reason IS NOT NULL AS has_reason FROM redpacket.ledger WHERE activity_id = :a ORDER BY entry_id;
SELECT count(*) AS stripes, count(*) FILTER (WHERE balance <> 0) AS non_zero FROM redpacket.stripe WHERE activity_id = :a;
SELECT * FROM pg_temp.books(:a);
-- a second close returns nothing and records nothing more
SELECT redpacket.rp_close_activity(:a) = 0 AS second_close_returns_0;
SELECT kind, amount FROM redpacket.ledger WHERE activity_id = :a ORDER BY entry_id;
-- later claims: the old claims come back as duplicates, new ones are ended
SELECT pg_temp.claim(:a, 'alice', 3.00);
SELECT pg_temp.claim(:a, 'bob', 0.01);
SELECT pg_temp.claim(:a, 'carol', 1.00);
SELECT pg_temp.claim(:a, 'carol', 100.00);
SELECT * FROM pg_temp.books(:a);

-- close with no claims returns everything ------------------------------------
SELECT redpacket.rp_create_activity(7.77, stripes => 3, name => 'untouched') AS b \gset
SELECT redpacket.rp_close_activity(:b) = 7.77 AS all_returned;
SELECT * FROM pg_temp.books(:b);

-- close of an exhausted activity returns 0 -----------------------------------
SELECT redpacket.rp_create_activity(1.00, stripes => 2, name => 'exhausted') AS x \gset
SELECT pg_temp.claim(:x, 'alice', 1.00);
SELECT redpacket.rp_close_activity(:x) = 0 AS nothing_returned;
SELECT count(*) FILTER (WHERE kind = 'return') <= 1 AS at_most_one_return,
       coalesce(sum(amount) FILTER (WHERE kind = 'return'), 0) = 0 AS returned_zero
FROM redpacket.ledger WHERE activity_id = :x;
SELECT * FROM pg_temp.books(:x);

-- close with packets and lucky draws -----------------------------------------
SELECT redpacket.rp_create_activity(10.00, packets => 5, stripes => 2, name => 'lucky') AS l \gset
SELECT pg_temp.claim(:l, 'alice');
SELECT pg_temp.claim(:l, 'bob');
SELECT redpacket.rp_close_activity(:l) = 10.00 - (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = :l)
       AS returned_the_rest;
SELECT pg_temp.claim(:l, 'carol');
SELECT pg_temp.claim(:l, 'alice');
SELECT claims, remaining, remaining_packets, returned = 10.00 - claimed AS returned_the_rest, balanced
FROM pg_temp.books(:l);

-- close of an activity whose ends_at has passed ------------------------------
SELECT redpacket.rp_create_activity(4.00, starts_at => now() - interval '2 hours',
       ends_at => now() - interval '1 hour', stripes => 2, name => 'expired') AS e \gset
SELECT pg_temp.claim(:e, 'alice', 1.00);
SELECT redpacket.rp_close_activity(:e) = 4.00 AS all_returned;
SELECT redpacket.rp_close_activity(:e) = 0 AS second_close_returns_0;
SELECT * FROM pg_temp.books(:e);

-- claim and close in one transaction -----------------------------------------
SELECT redpacket.rp_create_activity(5.00, stripes => 2, name => 'same xact') AS t \gset
BEGIN;
SELECT pg_temp.claim(:t, 'alice', 2.00);
SELECT redpacket.rp_close_activity(:t) = 3.00 AS returned_3;
SELECT pg_temp.claim(:t, 'bob', 1.00);
SELECT pg_temp.claim(:t, 'alice', 2.00);
COMMIT;
SELECT * FROM pg_temp.books(:t);

-- close errors ----------------------------------------------------------------
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset
SELECT pg_temp.err(format('SELECT redpacket.rp_close_activity(%s)', :unknown));
SELECT pg_temp.err('SELECT redpacket.rp_close_activity(NULL)');

-- freeze and unfreeze ----------------------------------------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'freeze') AS f \gset
SELECT pg_temp.claim(:f, 'alice', 1.00);
SELECT redpacket.rp_freeze(:f, 'audit');
SELECT frozen_reason, frozen_at IS NOT NULL AS has_frozen_at, closed_at IS NULL AS still_open
FROM redpacket.activity WHERE id = :f;
SELECT pg_temp.claim(:f, 'bob', 1.00);
SELECT pg_temp.claim(:f, 'alice', 1.00);
SELECT * FROM pg_temp.books(:f);
SELECT redpacket.rp_unfreeze(:f);
SELECT frozen_reason, frozen_at FROM redpacket.activity WHERE id = :f;
SELECT pg_temp.claim(:f, 'bob', 1.00);
-- unfreezing what is not frozen changes nothing
SELECT redpacket.rp_unfreeze(:f);
SELECT pg_temp.claim(:f, 'carol', 1.00);
-- freeze inside a transaction that rolls back leaves it open
BEGIN;
SELECT redpacket.rp_freeze(:f, 'oops');
SELECT pg_temp.claim(:f, 'dave', 1.00);
ROLLBACK;
SELECT frozen_reason FROM redpacket.activity WHERE id = :f;
SELECT pg_temp.claim(:f, 'dave', 1.00);
-- and freezing again after that works the same
SELECT redpacket.rp_freeze(:f, 'before close');
SELECT pg_temp.claim(:f, 'erin', 1.00);
SELECT * FROM pg_temp.books(:f);

-- freeze errors -----------------------------------------------------------------
SELECT pg_temp.err(format('SELECT redpacket.rp_freeze(%s, ''x'')', :unknown));
SELECT pg_temp.err(format('SELECT redpacket.rp_unfreeze(%s)', :unknown));
SELECT pg_temp.err('SELECT redpacket.rp_freeze(NULL, ''x'')');
SELECT pg_temp.err('SELECT redpacket.rp_unfreeze(NULL)');
-- a freeze needs a reason: NULL either fails or freezes, it never leaves the
-- activity open while reporting success
SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'null reason') AS nr \gset
SELECT pg_temp.err(format('SELECT redpacket.rp_freeze(%s, NULL)', :nr)) AS freeze_null_reason;
SELECT pg_temp.claim(:nr, 'alice', 1.00);
