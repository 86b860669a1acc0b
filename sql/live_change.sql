-- Changing a live activity: rp_top_up adds money (and packets) spread over
-- the stripes, rp_withdraw gives unclaimed money back to the funder without
-- leaving a remaining packet without its minor unit, rp_set_window moves the
-- schedule and bumps the revisions.  Each is a ledger entry (money) and a row
-- of activity_change; activity.total and activity.packets keep the creation
-- values, activity_status and rp_activity_info show today's.  Errors of each.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql
-- The stripes' balances (/packets), fullest first: which stripe pays a
-- claim depends on the backend.
CREATE FUNCTION pg_temp.stripes(aid bigint) RETURNS text LANGUAGE sql AS $$
SELECT string_agg(balance || coalesce('/' || packets, ''), ' ' ORDER BY balance DESC, packets, stripe)
  FROM redpacket.stripe WHERE activity_id = aid
$$;

-- top-up of an activity without a cap -----------------------------------------
SELECT redpacket.rp_create_activity(1.00, starts_at => '2020-01-01', stripes => 3,
                                    name => 'fixed') AS f \gset
SELECT pg_temp.claim(:f, 'u' || g, 0.30) FROM generate_series(1, 4) g;
SELECT pg_temp.stripes(:f) AS stripes;
SELECT redpacket.rp_top_up(:f, 2.00) AS funded;
SELECT pg_temp.stripes(:f) AS stripes;
SELECT pg_temp.claim(:f, 'u4', 0.30);
SELECT pg_temp.claim(:f, 'u5', 2.00);
SELECT redpacket.rp_top_up(:f, 0.05, reason => 'a little more') AS funded;
SELECT kind, amount, packets, reason FROM redpacket.ledger WHERE activity_id = :f ORDER BY entry_id;
SELECT total AS created_with FROM redpacket.activity WHERE id = :f;
SELECT state, total, claimed_amount, remaining_amount, remaining_packets, packets
  FROM redpacket.activity_status WHERE id = :f;
SELECT state, remaining_amount, total, packets FROM redpacket.rp_activity_info(:f);
SELECT * FROM pg_temp.books(:f);

-- top-up of a capped activity: packets to the cap ------------------------------
SELECT redpacket.rp_create_activity(1.00, packets => 4, starts_at => '2020-01-01', stripes => 2,
                                    name => 'lucky') AS l \gset
SELECT pg_temp.claim(:l, 'u' || g) FROM generate_series(1, 5) g;
SELECT state FROM redpacket.activity_status WHERE id = :l;
SELECT redpacket.rp_top_up(:l, 0.50, 3) AS funded;
SELECT pg_temp.stripes(:l) AS stripes;
SELECT redpacket.rp_top_up(:l, 0.11, 0) AS funded;
SELECT pg_temp.stripes(:l) AS stripes;
-- every packet a top-up adds brings a minor unit of its own: 0.01 cannot
-- add 2 packets, however much the activity holds
SELECT pg_temp.err(format('SELECT redpacket.rp_top_up(%s, 0.01, 2)', :l)) AS too_small_itself;
SELECT pg_temp.claim(:l, 'u' || g) FROM generate_series(5, 9) g;
SELECT packets AS created_with FROM redpacket.activity WHERE id = :l;
SELECT state, total, claimed_count, remaining_packets, packets
  FROM redpacket.activity_status WHERE id = :l;
SELECT kind, amount, packets FROM redpacket.ledger WHERE activity_id = :l ORDER BY entry_id;
SELECT * FROM pg_temp.books(:l);
-- a packet needs a minor unit: 0.02 cannot carry 3 more packets on an empty activity
SELECT pg_temp.err(format('SELECT redpacket.rp_top_up(%s, 0.02, 3)', :l)) AS too_small;
SELECT redpacket.rp_top_up(:l, 0.03, 3) AS funded;

-- withdraw ------------------------------------------------------------------------
SELECT redpacket.rp_create_activity(10.00, starts_at => '2020-01-01', stripes => 4,
                                    name => 'withdraw') AS w \gset
SELECT pg_temp.claim(:w, 'u1', 1.50);
SELECT pg_temp.stripes(:w) AS stripes;
-- taken from the fullest stripes first, leaving them as even as can be
SELECT redpacket.rp_withdraw(:w, 1.00, 'over-funded') AS remaining;
SELECT pg_temp.stripes(:w) AS stripes;
SELECT redpacket.rp_withdraw(:w, 0.03) AS remaining;
SELECT pg_temp.stripes(:w) AS stripes;
-- more than is left: an error, nothing written
SELECT pg_temp.err(format('SELECT redpacket.rp_withdraw(%s, 7.48)', :w)) AS too_much;
SELECT count(*) AS entries FROM redpacket.ledger WHERE activity_id = :w;
-- all of it: the activity is exhausted, claims get exhausted
SELECT redpacket.rp_withdraw(:w, 7.47) AS remaining;
SELECT pg_temp.stripes(:w) AS stripes;
SELECT pg_temp.claim(:w, 'u2', 0.01);
SELECT state, total, claimed_amount, remaining_amount FROM redpacket.activity_status WHERE id = :w;
SELECT kind, amount, reason FROM redpacket.ledger WHERE activity_id = :w ORDER BY entry_id;
SELECT * FROM pg_temp.books(:w);
-- money back in, then a close returns what is left
SELECT redpacket.rp_top_up(:w, 1.00) AS funded;
SELECT redpacket.rp_close_activity(:w) AS returned;
SELECT * FROM pg_temp.books(:w);

-- withdraw from a capped activity: every remaining packet keeps a minor unit ----
SELECT redpacket.rp_create_activity(1.00, packets => 10, starts_at => '2020-01-01', stripes => 2,
                                    name => 'capped') AS c \gset
SELECT pg_temp.err(format('SELECT redpacket.rp_withdraw(%s, 0.91)', :c)) AS below_a_unit_a_packet;
SELECT redpacket.rp_withdraw(:c, 0.90) AS remaining;
SELECT pg_temp.stripes(:c) AS stripes;
SELECT pg_temp.claim(:c, 'u' || g) FROM generate_series(1, 11) g;
SELECT * FROM pg_temp.books(:c);
-- uneven stripes: one has fewer units than packets, the other makes up for
-- it (the same money and packets, moved between the stripes as superuser)
SELECT redpacket.rp_create_activity(1.00, packets => 4, starts_at => '2020-01-01', stripes => 2,
                                    name => 'uneven') AS ue \gset
SET session_replication_role = replica;
UPDATE redpacket.stripe
   SET balance = CASE stripe WHEN 0 THEN 98 ELSE 2 END, packets = CASE stripe WHEN 0 THEN 1 ELSE 3 END,
       dealt = NULL, dealt_units = 0, dealt_count = 0
 WHERE activity_id = :ue;
RESET session_replication_role;
SELECT pg_temp.stripes(:ue) AS stripes;
SELECT pg_temp.err(format('SELECT redpacket.rp_withdraw(%s, 0.97)', :ue)) AS below_a_unit_a_packet;
SELECT redpacket.rp_withdraw(:ue, 0.96) AS remaining;
SELECT pg_temp.stripes(:ue) AS stripes;
SELECT pg_temp.claim(:ue, 'u' || g, 0.01) FROM generate_series(1, 5) g;
SELECT * FROM pg_temp.books(:ue);

-- lucky draws are dealt ahead: the first draw draws amounts for the whole
-- activity and hands them to the stripes (dealt, included in balance and
-- packets; this small activity is dealt whole by its first draw, the
-- dealer's, whose amount x is random).  A top-up adds undealt money and
-- packets; a withdrawal takes undealt money, leaving the dealt amounts as
-- they are, and only when that is not enough puts them back into the pool,
-- to be dealt again by the next lucky draw.
SELECT redpacket.rp_create_activity(1.00, packets => 4, starts_at => '2020-01-01', stripes => 2,
                                    name => 'dealt') AS d \gset
SELECT pg_temp.claim(:d, 'dealer');
SELECT amount AS x FROM redpacket.claim WHERE activity_id = :d \gset
SELECT sum(dealt_count) AS dealt_packets, sum(dealt_units) + :x * 100 AS dealt_units_and_x
  FROM redpacket.stripe WHERE activity_id = :d;
CREATE TEMP TABLE dealt_before AS
SELECT stripe, dealt FROM redpacket.stripe WHERE activity_id = :d;
SELECT redpacket.rp_top_up(:d, 0.10, 2) AS funded;
SELECT sum(balance - dealt_units) AS undealt, sum(packets - dealt_count) AS undealt_packets
  FROM redpacket.stripe WHERE activity_id = :d;
SELECT redpacket.rp_withdraw(:d, 0.08) + :x AS remaining_and_x;
SELECT bool_and(s.dealt = b.dealt) AS dealt_untouched,
       sum(s.balance - s.dealt_units) AS undealt, sum(s.packets - s.dealt_count) AS undealt_packets
  FROM redpacket.stripe s JOIN dealt_before b USING (stripe) WHERE s.activity_id = :d;
-- all but a unit for each of the 5 packets left: the dealt amounts go back
SELECT redpacket.rp_withdraw(:d, 0.97 - :x) AS remaining;
SELECT sum(dealt_count) AS dealt_packets, sum(dealt_units) AS dealt_units,
       sum(balance) AS balance, sum(packets) AS packets
  FROM redpacket.stripe WHERE activity_id = :d;
SELECT pg_temp.err(format('SELECT redpacket.rp_withdraw(%s, 0.01)', :d)) AS below_a_unit_a_packet;
SELECT pg_temp.claim(:d, 'u' || g) FROM generate_series(1, 6) g;
SELECT claims, remaining, remaining_packets, balanced FROM pg_temp.books(:d);

-- set_window ----------------------------------------------------------------------
SELECT redpacket.rp_create_activity(5.00, starts_at => '2020-01-01', stripes => 2,
                                    name => 'window') AS s \gset
SELECT pg_temp.claim(:s, 'early', 1.00);
SELECT revision AS rev0 FROM redpacket.activity WHERE id = :s \gset
-- later start: claims wait for it
SELECT redpacket.rp_set_window(:s, '2999-01-01', NULL, 'moved to later');
SELECT revision = :rev0 + 1 AS bumped,
       (SELECT bool_and(st.revision = a.revision) FROM redpacket.stripe st
         WHERE st.activity_id = a.id) AS stripes_follow
  FROM redpacket.activity a WHERE a.id = :s;
SELECT pg_temp.claim(:s, 'on time', 1.00);
SELECT pg_temp.claim(:s, 'early', 1.00);
SELECT state FROM redpacket.rp_activity_info(:s);
-- an end in the past: ended
SELECT redpacket.rp_set_window(:s, '2020-01-01', '2021-01-01');
SELECT pg_temp.claim(:s, 'late', 1.00);
SELECT state, starts_at, ends_at FROM redpacket.rp_activity_info(:s);
-- open again, with no end
SELECT redpacket.rp_set_window(:s, '2020-01-01', NULL);
SELECT pg_temp.claim(:s, 'late', 1.00);
SELECT revision - :rev0 AS bumps FROM redpacket.activity WHERE id = :s;
-- the same window again changes nothing
SELECT redpacket.rp_set_window(:s, '2020-01-01', NULL);
SELECT revision - :rev0 AS bumps FROM redpacket.activity WHERE id = :s;
SELECT kind, before, after, reason FROM redpacket.activity_change
 WHERE activity_id = :s ORDER BY change_id;
-- parked: a start at infinity and no end
SELECT redpacket.rp_create_activity(1.00, starts_at => '2020-01-01', stripes => 1,
                                    name => 'parked') AS p \gset
SELECT redpacket.rp_set_window(:p, 'infinity', NULL, 'parked');
SELECT state, starts_at, ends_at FROM redpacket.rp_activity_info(:p);
SELECT pg_temp.claim(:p, 'u1', 0.10);
SELECT * FROM pg_temp.books(:s);

-- the record of the money changes ---------------------------------------------------
SELECT kind, before, after, reason, changed_by = session_user AS by_me,
       changed_at = transaction_timestamp() OR changed_at <= now() AS timed
  FROM redpacket.activity_change WHERE activity_id IN (:f, :l) ORDER BY change_id;

-- frozen activities may be changed; closed and settled ones may not --------------
SELECT redpacket.rp_create_activity(3.00, starts_at => '2020-01-01', stripes => 2,
                                    name => 'held') AS h \gset
SELECT redpacket.rp_freeze(:h, 'audit');
SELECT redpacket.rp_top_up(:h, 1.00) AS funded;
SELECT redpacket.rp_withdraw(:h, 2.00) AS remaining;
SELECT redpacket.rp_set_window(:h, '2020-01-02', NULL);
SELECT pg_temp.claim(:h, 'u1', 0.10);
SELECT redpacket.rp_unfreeze(:h);
SELECT redpacket.rp_close_activity(:h) AS returned;
SELECT redpacket.rp_create_activity(3.00, starts_at => '2020-01-01', ends_at => '2020-02-01',
                                    stripes => 2, name => 'expired') AS e \gset
SELECT count(*) AS settled FROM redpacket.rp_reconcile(:e) WHERE ok;

-- errors ------------------------------------------------------------------------------
SELECT count(*) AS entries FROM redpacket.ledger \gset
SELECT count(*) AS changes FROM redpacket.activity_change \gset
SELECT what, pg_temp.err(q) FROM (VALUES
    ('top_up: NULL activity', 'SELECT redpacket.rp_top_up(NULL, 1.00)'),
    ('top_up: NULL amount', format('SELECT redpacket.rp_top_up(%s, NULL)', :f)),
    ('top_up: zero', format('SELECT redpacket.rp_top_up(%s, 0)', :f)),
    ('top_up: negative', format('SELECT redpacket.rp_top_up(%s, -1.00)', :f)),
    ('top_up: NaN', format('SELECT redpacket.rp_top_up(%s, %L::numeric)', :f, 'NaN')),
    ('top_up: infinity', format('SELECT redpacket.rp_top_up(%s, %L::numeric)', :f, 'Infinity')),
    ('top_up: a fraction of a cent', format('SELECT redpacket.rp_top_up(%s, 1.001)', :f)),
    ('top_up: beyond int64', format('SELECT redpacket.rp_top_up(%s, 1e17)', :f)),
    ('top_up: past the range of a budget', format('SELECT redpacket.rp_top_up(%s, 92233720368547758.07)', :f)),
    ('top_up: no packets on a capped one', format('SELECT redpacket.rp_top_up(%s, 1.00)', :l)),
    ('top_up: packets on an uncapped one', format('SELECT redpacket.rp_top_up(%s, 1.00, 1)', :f)),
    ('top_up: negative packets', format('SELECT redpacket.rp_top_up(%s, 1.00, -1)', :l)),
    ('top_up: packets past 2^31 - 1', format('SELECT redpacket.rp_top_up(%s, 90000000.00, 2147483647)', :l)),
    ('top_up: unknown activity', 'SELECT redpacket.rp_top_up(-1, 1.00)'),
    ('top_up: closed', format('SELECT redpacket.rp_top_up(%s, 1.00)', :h)),
    ('top_up: settled', format('SELECT redpacket.rp_top_up(%s, 1.00)', :e)),
    ('withdraw: NULL activity', 'SELECT redpacket.rp_withdraw(NULL, 1.00)'),
    ('withdraw: NULL amount', format('SELECT redpacket.rp_withdraw(%s, NULL)', :f)),
    ('withdraw: zero', format('SELECT redpacket.rp_withdraw(%s, 0.00)', :f)),
    ('withdraw: a fraction of a cent', format('SELECT redpacket.rp_withdraw(%s, 0.001)', :f)),
    ('withdraw: unknown activity', 'SELECT redpacket.rp_withdraw(-1, 1.00)'),
    ('withdraw: closed', format('SELECT redpacket.rp_withdraw(%s, 1.00)', :h)),
    ('withdraw: settled', format('SELECT redpacket.rp_withdraw(%s, 1.00)', :e)),
    ('set_window: NULL activity', 'SELECT redpacket.rp_set_window(NULL, now(), NULL)'),
    ('set_window: NULL start', format('SELECT redpacket.rp_set_window(%s, NULL, NULL)', :s)),
    ('set_window: end before start', format('SELECT redpacket.rp_set_window(%s, %L, %L)', :s, '2020-01-02', '2020-01-01')),
    ('set_window: end at start', format('SELECT redpacket.rp_set_window(%s, %L, %L)', :s, '2020-01-02', '2020-01-02')),
    ('set_window: unknown activity', 'SELECT redpacket.rp_set_window(-1, now(), NULL)'),
    ('set_window: closed', format('SELECT redpacket.rp_set_window(%s, %L, NULL)', :h, '2020-01-01')),
    ('set_window: settled', format('SELECT redpacket.rp_set_window(%s, %L, NULL)', :e, '2020-01-01'))) t(what, q);
SELECT count(*) = :entries AS no_ledger_entry FROM redpacket.ledger;
SELECT count(*) = :changes AS no_change FROM redpacket.activity_change;
