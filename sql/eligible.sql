-- Eligibility lists: a restricted activity pays only the users rp_allow put
-- on its list; anyone else gets not_eligible (after ended, before
-- user_limit) and nothing is written.  rp_allow and rp_disallow return how
-- many users they added or removed; removing a user never touches a claim
-- already made.  rp_activity_info answers eligible for one user.  Errors of
-- every function, and what an unrestricted activity does (the default).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- the default: unrestricted, everyone may claim ------------------------------
SELECT redpacket.rp_create_activity(5.00, stripes => 2, name => 'open') AS o \gset
SELECT restricted FROM redpacket.activity WHERE id = :o;
SELECT pg_temp.claim(:o, 'anyone', 1.00);
SELECT eligible FROM redpacket.rp_activity_info(:o, 'someone else');
SELECT eligible IS NULL AS no_user_no_answer FROM redpacket.rp_activity_info(:o);

-- a restricted activity with an empty list pays nobody ------------------------
SELECT redpacket.rp_create_activity(10.00, packets => 6, stripes => 2, name => 'vip',
                                    restricted => true) AS v \gset
SELECT restricted FROM redpacket.activity WHERE id = :v;
SELECT pg_temp.claim(:v, 'alice', 1.00);
SELECT pg_temp.claim(:v, 'alice');
SELECT count(*) AS claims FROM redpacket.claim WHERE activity_id = :v;

-- rp_allow: how many were added; listed ones and repeats are skipped ----------
SELECT redpacket.rp_allow(:v, ARRAY['alice', 'bob', 'bob', 'carol']) AS added;
SELECT redpacket.rp_allow(:v, ARRAY['alice', 'dave']) AS added;
SELECT redpacket.rp_allow(:v, ARRAY[]::text[]) AS added_none;
SELECT user_id, added_by = session_user AS by_me FROM redpacket.eligible
 WHERE activity_id = :v ORDER BY user_id;
SELECT u, eligible FROM unnest(ARRAY['alice', 'erin']) u, LATERAL redpacket.rp_activity_info(:v, u)
 ORDER BY u;

-- claims: listed users claim, others get not_eligible -------------------------
SELECT pg_temp.claim(:v, 'alice', 1.00);
SELECT pg_temp.claim(:v, 'erin', 1.00);
SELECT pg_temp.claim(:v, 'bob');
SELECT ord, user_id, status, claim_id IS NOT NULL AS has_claim
FROM redpacket.rp_claim_batch(:v, ARRAY['carol', 'erin', 'alice', 'frank', 'dave'],
                              ARRAY[0.50, 0.50, 0.50, 0.50, 0.50]);

-- rp_disallow: how many were removed; their claims stay -----------------------
SELECT redpacket.rp_disallow(:v, ARRAY['alice', 'dave', 'nobody']) AS removed;
SELECT redpacket.rp_disallow(:v, ARRAY['alice']) AS removed_again;
SELECT pg_temp.claim(:v, 'alice', 1.00);
SELECT pg_temp.claim(:v, 'dave', 0.50);
SELECT eligible FROM redpacket.rp_activity_info(:v, 'alice');
-- listed again, alice still holds her one claim
SELECT redpacket.rp_allow(:v, ARRAY['alice']) AS added;
SELECT pg_temp.claim(:v, 'alice', 2.00);
SELECT claims, remaining_packets, balanced FROM pg_temp.books(:v);

-- the order of statuses: duplicate, frozen, not_started, ended before
-- not_eligible; not_eligible before user_limit and exhausted
SELECT redpacket.rp_create_activity(1.00, stripes => 1, per_user_limit => 2, name => 'order',
                                    restricted => true) AS r \gset
SELECT redpacket.rp_allow(:r, ARRAY['gina']) AS added;
SELECT pg_temp.claim(:r, 'gina', 0.60, 'r1');
SELECT pg_temp.claim(:r, 'gina', 0.60, 'r2');
SELECT pg_temp.claim(:r, 'hank', 0.60, 'r1');
SELECT pg_temp.claim(:r, 'gina', 0.10, 'r3');
SELECT pg_temp.claim(:r, 'hank', 0.10, 'r3');
SELECT redpacket.rp_freeze(:r, 'check');
SELECT pg_temp.claim(:r, 'hank', 0.10, 'r4');
SELECT pg_temp.claim(:r, 'gina', 0.60, 'r1');
SELECT redpacket.rp_unfreeze(:r);
-- gina holds her two claims: off the list she is not_eligible, on it user_limit
SELECT redpacket.rp_disallow(:r, ARRAY['gina']) AS removed;
SELECT pg_temp.claim(:r, 'gina', 0.10, 'r6');
SELECT redpacket.rp_allow(:r, ARRAY['gina']) AS added;
SELECT pg_temp.claim(:r, 'gina', 0.10, 'r6');
SELECT redpacket.rp_create_activity(1.00, starts_at => now() + interval '1 day', stripes => 1,
                                    name => 'later', restricted => true) AS l \gset
SELECT pg_temp.claim(:l, 'hank', 0.10);
SELECT redpacket.rp_close_activity(:r) AS returned;
SELECT pg_temp.claim(:r, 'hank', 0.10, 'r5');

-- an exclusive packet: one user, one packet --------------------------------------
SELECT redpacket.rp_create_activity(88.88, packets => 1, stripes => 1, name => 'for ivy',
                                    restricted => true) AS x \gset
SELECT redpacket.rp_allow(:x, ARRAY['ivy']) AS added;
SELECT pg_temp.claim(:x, 'jack');
SELECT pg_temp.claim(:x, 'ivy');
SELECT pg_temp.claim(:x, 'ivy');
SELECT state, remaining_amount, eligible FROM redpacket.rp_activity_info(:x, 'ivy');

-- the record: one row per call that changed the list, counts only ------------
SELECT kind, after, reason FROM redpacket.activity_change
 WHERE activity_id = :v ORDER BY change_id;

-- errors ------------------------------------------------------------------------
-- NULL arguments and elements (22004), bad ids as in rp_claim (22023), more
-- than one dimension (2202E), unknown activity (P0002), unrestricted or
-- settled activity (55000); nothing is written for any of them
SELECT count(*) AS before_errors FROM redpacket.eligible \gset
SELECT what, pg_temp.err(q) FROM (VALUES
    ('allow: NULL activity', format('SELECT redpacket.rp_allow(NULL, ARRAY[%L])', 'a')),
    ('allow: NULL list', format('SELECT redpacket.rp_allow(%s, NULL)', :v)),
    ('allow: a NULL user', format('SELECT redpacket.rp_allow(%s, ARRAY[%L, NULL])', :v, 'kim')),
    ('allow: an empty user', format('SELECT redpacket.rp_allow(%s, ARRAY[%L, %L])', :v, 'kim', '')),
    ('allow: 257 bytes', format('SELECT redpacket.rp_allow(%s, ARRAY[%L, repeat(%L, 257)])', :v, 'kim', 'x')),
    ('allow: two dimensions', format('SELECT redpacket.rp_allow(%s, ARRAY[[%L], [%L]])', :v, 'kim', 'lee')),
    ('allow: unknown activity', format('SELECT redpacket.rp_allow(%s, ARRAY[%L])', -1, 'kim')),
    ('allow: unrestricted', format('SELECT redpacket.rp_allow(%s, ARRAY[%L])', :o, 'kim')),
    ('allow: settled', format('SELECT redpacket.rp_allow(%s, ARRAY[%L])', :r, 'kim')),
    ('disallow: NULL activity', format('SELECT redpacket.rp_disallow(NULL, ARRAY[%L])', 'a')),
    ('disallow: NULL list', format('SELECT redpacket.rp_disallow(%s, NULL)', :v)),
    ('disallow: a NULL user', format('SELECT redpacket.rp_disallow(%s, ARRAY[NULL::text])', :v)),
    ('disallow: an empty user', format('SELECT redpacket.rp_disallow(%s, ARRAY[%L])', :v, '')),
    ('disallow: unknown activity', format('SELECT redpacket.rp_disallow(%s, ARRAY[%L])', -1, 'kim')),
    ('disallow: unrestricted', format('SELECT redpacket.rp_disallow(%s, ARRAY[%L])', :o, 'anyone')),
    ('disallow: settled', format('SELECT redpacket.rp_disallow(%s, ARRAY[%L])', :r, 'gina')),
    ('info: an empty user', format('SELECT * FROM redpacket.rp_activity_info(%s, %L)', :v, '')),
    ('info: 257 bytes', format('SELECT * FROM redpacket.rp_activity_info(%s, repeat(%L, 257))', :v, 'x')),
    ('info: unknown activity', format('SELECT * FROM redpacket.rp_activity_info(%s, %L)', -1, 'kim')),
    ('create: NULL restricted', 'SELECT redpacket.rp_create_activity(1.00, restricted => NULL)')) t(what, q);
SELECT count(*) = :before_errors AS nothing_written FROM redpacket.eligible;
SELECT count(*) AS lists_of_settled FROM redpacket.eligible WHERE activity_id = :r;

-- the list needs no more than one lock per user bucket (64), and the activity's --
SELECT redpacket.rp_create_activity(100.00, name => 'many', restricted => true) AS m \gset
BEGIN;
SELECT redpacket.rp_allow(:m, ARRAY(SELECT 'user-' || g FROM generate_series(1, 5000) g)) AS added;
SELECT count(*) AS our_locks, count(*) FILTER (WHERE mode = 'ExclusiveLock') AS exclusive
  FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 20996;
COMMIT;
BEGIN;
SELECT redpacket.rp_disallow(:m, ARRAY(SELECT 'user-' || g FROM generate_series(1, 5000, 2) g)) AS removed;
SELECT count(*) AS our_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid BETWEEN 20992 AND 21247;
COMMIT;
-- one user: one bucket, and the activity
BEGIN;
SELECT redpacket.rp_allow(:m, ARRAY['solo']) AS added;
SELECT count(*) AS our_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid BETWEEN 20992 AND 21247;
COMMIT;
SELECT count(*) AS listed FROM redpacket.eligible WHERE activity_id = :m;
