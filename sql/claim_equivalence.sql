-- rp_claim_batch answers as rp_claim does, element by element.  Random
-- sequences of operations (fixed amounts, lucky draws, rain with request
-- ids, duplicates, freeze, unfreeze and close in between) are applied to
-- twin activities: each group of claims once as rp_claim calls, once as one
-- rp_claim_batch call.  Statuses must be equal, fixed amounts equal, and the
-- books of the twins equal (lucky amounts are random: for lucky draws the
-- claim and packet counts are compared, and each twin's books must balance).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT setseed(0.1001);

CREATE FUNCTION pg_temp.twins(shape text, ops integer)
RETURNS TABLE (shape_ text, operations integer, elements integer, mismatches integer,
               statuses text, books_equal boolean, balanced boolean)
LANGUAGE plpgsql AS $$
DECLARE
    npk integer := CASE WHEN shape IN ('lucky', 'packets') THEN 40 END;
    lim integer := CASE WHEN shape = 'rain' THEN 3 ELSE 1 END;
    nst integer := 1 + floor(random() * 4)::integer;
    single bigint;
    batch bigint;
    users text[];
    amts numeric[];
    reqs text[];
    k integer;
    r redpacket.claim_result;
    b record;
    seen text[] := '{}';
    roll double precision;
BEGIN
    single := redpacket.rp_create_activity(20.00, packets => npk, stripes => nst, per_user_limit => lim);
    batch := redpacket.rp_create_activity(20.00, packets => npk, stripes => nst, per_user_limit => lim);
    shape_ := shape;
    operations := ops;
    elements := 0;
    mismatches := 0;
    FOR op IN 1 .. ops LOOP
        roll := random();
        IF roll < 0.02 THEN
            PERFORM redpacket.rp_freeze(single, 'twin'), redpacket.rp_freeze(batch, 'twin');
            CONTINUE;
        ELSIF roll < 0.06 THEN
            PERFORM redpacket.rp_unfreeze(single), redpacket.rp_unfreeze(batch);
            CONTINUE;
        ELSIF roll < 0.09 AND op > ops * 3 / 4 THEN
            PERFORM redpacket.rp_close_activity(single), redpacket.rp_close_activity(batch);
            CONTINUE;
        END IF;
        k := 1 + floor(random() * 6)::integer;
        users := ARRAY(SELECT 'u' || floor(random() * 60)::integer FROM generate_series(1, k));
        amts := ARRAY(SELECT CASE WHEN shape = 'lucky' THEN NULL
                                  ELSE (1 + floor(random() * 150)::integer) * 0.01 END
                        FROM generate_series(1, k));
        reqs := ARRAY(SELECT CASE WHEN lim > 1 THEN 'r' || floor(random() * 5)::integer END
                        FROM generate_series(1, k));
        FOR b IN SELECT * FROM redpacket.rp_claim_batch(batch, users, amts, reqs) LOOP
            r := redpacket.rp_claim(single, users[b.ord], amts[b.ord], reqs[b.ord]);
            elements := elements + 1;
            seen := seen || r.status::text;
            IF r.status IS DISTINCT FROM b.status
               OR (shape <> 'lucky' AND r.amount IS DISTINCT FROM b.amount) THEN
                mismatches := mismatches + 1;
                RAISE NOTICE 'op % element %: rp_claim % %, batch % %', op, b.ord,
                    r.status, r.amount, b.status, b.amount;
            END IF;
        END LOOP;
    END LOOP;
    SELECT string_agg(DISTINCT s, ' ' ORDER BY s) INTO statuses FROM unnest(seen) s;
    SELECT x.claims = y.claims AND x.remaining_packets IS NOT DISTINCT FROM y.remaining_packets
           AND (shape = 'lucky' OR (x.claimed = y.claimed AND x.remaining = y.remaining
                                    AND x.returned = y.returned)),
           x.balanced AND y.balanced
      INTO books_equal, balanced
      FROM pg_temp.books(single) x, pg_temp.books(batch) y;
    RETURN NEXT;
END $$;

CREATE TEMP TABLE eq AS
SELECT t.*
  FROM (VALUES ('fixed'), ('packets'), ('lucky'), ('rain')) v(shape)
  CROSS JOIN generate_series(1, 4) g
  CROSS JOIN LATERAL pg_temp.twins(v.shape, 200 + 0 * g) t;

SELECT shape_ AS shape, count(*) AS runs, sum(operations) AS operations,
       sum(mismatches) AS mismatches, bool_and(books_equal) AS books_equal,
       bool_and(balanced) AS balanced,
       (SELECT string_agg(DISTINCT s, ' ' ORDER BY s)
          FROM eq e2, regexp_split_to_table(e2.statuses, ' ') s
         WHERE e2.shape_ = eq.shape_) AS statuses
  FROM eq GROUP BY shape_ ORDER BY shape_;

SELECT sum(operations) AS operations, sum(elements) > 5000 AS over_5000_claims,
       sum(mismatches) AS mismatches
  FROM eq;
