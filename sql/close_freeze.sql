-- rp_close_activity returns the unclaimed remainder and records it in the
-- ledger, once; later claims get ended (or duplicate).  rp_freeze and
-- rp_unfreeze hold and release an activity without moving money.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

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
