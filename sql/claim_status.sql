-- rp_claim statuses and their precedence: duplicate, frozen, not_started,
-- ended, user_limit, exhausted, claimed.  A status other than claimed and
-- duplicate carries no claim id, amount or time, and writes nothing.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

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
