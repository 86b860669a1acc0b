\set ECHO none
-- Helpers shared by the regression tests.  A test includes this file near its
-- top with
--     \getenv abs_srcdir PG_ABS_SRCDIR
--     \i :abs_srcdir/test/sql/helpers.sql
-- as PostgreSQL's own tests do (pg_regress sets PG_ABS_SRCDIR).  It is not a test itself: the Makefile
-- runs only sql/*.sql.  Echo is off while it runs, so the expected outputs
-- show the include line and not these definitions; any error still shows.
-- The last line turns echo back on, as pg_regress runs psql -a.
--
-- pg_temp.err(q)        run q, return 'ok' or its SQLSTATE and masked message
-- seen                  claims pg_temp.claim made, to name a duplicate's original
-- pg_temp.claim(...)    rp_claim, checked against the claim row, described
-- pg_temp.books(aid)    the ledger identity of one activity
-- pg_temp.draws(aid)    a lucky-draw activity's amounts in the order they were drawn

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

-- The books of one activity (the view rp_books, test/sql/books.sql).
\i :abs_srcdir/test/sql/books.sql
CREATE FUNCTION pg_temp.books(aid bigint)
RETURNS TABLE (claims bigint, claimed numeric, remaining numeric, remaining_packets numeric,
               returned numeric, balanced boolean)
LANGUAGE sql AS $$
SELECT b.n_claims, round(b.claimed, b.scale), round(b.remaining, b.scale), b.packets_left,
       round(b.returned, b.scale), b.balanced
FROM rp_books b WHERE b.id = aid
$$;

-- A drained lucky-draw activity's amounts (in minor units) in the order they
-- were drawn, with the units r and packets p the activity had left before
-- each draw.  Claims made one after the other take the amounts in the order
-- they were drawn, whatever the stripe count (one stripe: each claim draws;
-- more: the pool deals blocks to the stripes in spread order, the claims go
-- on in spread order, and the next deal comes when nothing dealt is left),
-- so that order is the claims'.  The claims must have been lucky draws only
-- (a fixed claim changes the deals).
CREATE FUNCTION pg_temp.draws(aid bigint)
RETURNS TABLE (j bigint, u numeric, r numeric, p bigint) LANGUAGE sql AS $$
    WITH a AS (SELECT x.packets, x.total * 10::numeric ^ x.scale AS units,
                      10::numeric ^ x.scale AS unit
                 FROM redpacket.activity x WHERE x.id = aid),
    o AS (SELECT cl.amount * a.unit AS u,
                 row_number() OVER (ORDER BY cl.claim_id) - 1 AS j
            FROM redpacket.claim cl, a WHERE cl.activity_id = aid)
    SELECT o.j, o.u,
           a.units - coalesce(sum(o.u) OVER (ORDER BY o.j ROWS BETWEEN UNBOUNDED PRECEDING
                                             AND 1 PRECEDING), 0),
           a.packets - o.j
      FROM o, a ORDER BY o.j
$$;

\set ECHO all
