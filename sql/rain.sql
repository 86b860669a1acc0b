-- Red-packet rain: per_user_limit > 1.  Each claim needs a request_id, the
-- idempotency key is (activity, user, request_id), a retry returns the
-- original claim, and a user never holds more than per_user_limit claims.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

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
