-- rp_create_activity: what a new activity looks like (activity row, stripes,
-- funding in the ledger), the redpacket.stripes GUC, and every validation
-- error, each of which must leave nothing behind.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- Everything an activity consists of, checked against its own row.
CREATE FUNCTION pg_temp.shape(aid bigint)
RETURNS TABLE (stripe_rows bigint, stripe_ids_distinct boolean, funded_units numeric,
               stripe_packets bigint, stripe_claims numeric, ledger_rows bigint,
               funded numeric, fund_ok boolean)
LANGUAGE sql AS $$
SELECT s.n, s.d = s.n, s.b, s.p, s.c, l.n, l.fund,
       s.n = a.stripes AND s.b = a.total * 10::numeric ^ a.scale AND l.fund = a.total
FROM redpacket.activity a
CROSS JOIN LATERAL (
    SELECT count(*) AS n, count(DISTINCT st.stripe) AS d,
           sum(st.balance)::numeric AS b, sum(st.packets) AS p, sum(st.claims) AS c
    FROM redpacket.stripe st WHERE st.activity_id = a.id) s
CROSS JOIN LATERAL (
    SELECT count(*) AS n, sum(le.amount) FILTER (WHERE le.kind = 'fund') AS fund
    FROM redpacket.ledger le WHERE le.activity_id = a.id) l
WHERE a.id = aid
$$;

-- Defaults: the stripes of redpacket.stripes (16 in test/regress.conf; its
-- boot default is 64), scale 2, per_user_limit 1, starts now, no end, no
-- packet cap.
SELECT redpacket.rp_create_activity(100.00) AS a1 \gset
SHOW redpacket.stripes;
SELECT boot_val AS stripes_boot_default FROM pg_settings WHERE name = 'redpacket.stripes';
SELECT name, total, packets, scale, stripes, per_user_limit,
       starts_at = created_at AS starts_at_is_now, ends_at, closed_at, frozen_reason
FROM redpacket.activity WHERE id = :a1;
SELECT * FROM pg_temp.shape(:a1);
SELECT kind, amount, reason IS NOT NULL AS has_reason FROM redpacket.ledger WHERE activity_id = :a1;
-- ids increase
SELECT redpacket.rp_create_activity(1.00, name => 'second') AS a2 \gset
SELECT :a2 > :a1 AS ids_increase;

-- Named arguments, all of them.
SELECT redpacket.rp_create_activity(total => 50.00, packets => 10,
       starts_at => now() - interval '1 hour', ends_at => now() + interval '1 day',
       stripes => 4, name => 'full', scale => 2, per_user_limit => 3) AS a3 \gset
SELECT name, total, packets, scale, stripes, per_user_limit,
       ends_at - starts_at AS duration, closed_at, frozen_reason
FROM redpacket.activity WHERE id = :a3;
SELECT * FROM pg_temp.shape(:a3);

-- A schedule entirely in the past is allowed (the activity is simply ended).
SELECT redpacket.rp_create_activity(5.00, starts_at => now() - interval '2 hours',
       ends_at => now() - interval '1 hour', name => 'past') AS a4 \gset
SELECT name, ends_at > starts_at AS ordered FROM redpacket.activity WHERE id = :a4;

-- Scales 0..4, each funded exactly in its own minor units.
SELECT redpacket.rp_create_activity(100, scale => 0, stripes => 4, name => 'scale0') AS s0 \gset
SELECT redpacket.rp_create_activity(1.2345, scale => 4, stripes => 4, name => 'scale4') AS s4 \gset
SELECT redpacket.rp_create_activity(12.5, scale => 1, stripes => 1, name => 'scale1') AS s1 \gset
SELECT redpacket.rp_create_activity(9.999, scale => 3, stripes => 3, name => 'scale3') AS s3 \gset
SELECT a.name, a.scale, a.total, s.funded_units, s.fund_ok
FROM redpacket.activity a, pg_temp.shape(a.id) s
WHERE a.id IN (:s0, :s1, :s3, :s4) ORDER BY a.scale;

-- A total written with more digits than the scale but the same value is fine.
SELECT redpacket.rp_create_activity(1.500, name => 'trailing zeros') AS tz \gset
SELECT s.funded_units, s.fund_ok FROM pg_temp.shape(:tz) s;

-- The largest total that fits int64 minor units.
SELECT redpacket.rp_create_activity(92233720368547758.07, stripes => 2, name => 'max') AS mx \gset
SELECT s.stripe_rows, s.funded_units, s.fund_ok FROM pg_temp.shape(:mx) s;
SELECT redpacket.rp_create_activity(9223372036854775807, scale => 0, stripes => 1, name => 'max0') AS mx0 \gset
SELECT s.funded_units, s.fund_ok FROM pg_temp.shape(:mx0) s;

-- Stripe bounds 1 and 1024; packets per stripe add up to packets.
SELECT redpacket.rp_create_activity(100.00, stripes => 1, name => 'one stripe') AS st1 \gset
SELECT redpacket.rp_create_activity(100.00, stripes => 1024, name => 'max stripes') AS st1024 \gset
SELECT redpacket.rp_create_activity(100.00, packets => 5000, stripes => 64, name => 'packets') AS stp \gset
SELECT a.name, a.stripes, s.stripe_rows, s.stripe_ids_distinct, s.stripe_packets, s.fund_ok
FROM redpacket.activity a, pg_temp.shape(a.id) s
WHERE a.id IN (:st1, :st1024, :stp) ORDER BY a.id;
-- No stripe starts empty-handed below zero, and a small budget or packet
-- count may get fewer stripes than asked, never more.
SELECT redpacket.rp_create_activity(0.05, packets => 5, stripes => 16, name => 'tiny') AS tiny \gset
SELECT a.stripes BETWEEN 1 AND 16 AS stripes_in_range, s.stripe_rows = a.stripes AS rows_match,
       s.funded_units, s.stripe_packets, s.fund_ok,
       (SELECT min(balance) >= 0 AND min(packets) >= 0 FROM redpacket.stripe WHERE activity_id = :tiny) AS non_negative
FROM redpacket.activity a, pg_temp.shape(a.id) s WHERE a.id = :tiny;
-- total = packets minor units exactly is allowed
SELECT redpacket.rp_create_activity(1, packets => 1, scale => 0, name => 'one unit') AS ou \gset
SELECT s.stripe_rows, s.funded_units, s.stripe_packets, s.fund_ok FROM pg_temp.shape(:ou) s;

-- The redpacket.stripes GUC gives the default stripe count.
SET redpacket.stripes = 4;
SELECT redpacket.rp_create_activity(100.00, name => 'guc 4') AS g4 \gset
SELECT stripes FROM redpacket.activity WHERE id = :g4;
-- NULL stripes means the GUC too
SELECT redpacket.rp_create_activity(100.00, stripes => NULL, name => 'guc null') AS gn \gset
SELECT stripes FROM redpacket.activity WHERE id = :gn;
SELECT pg_temp.err('SET redpacket.stripes = 0');
SELECT pg_temp.err('SET redpacket.stripes = 1025');
SHOW redpacket.stripes;
RESET redpacket.stripes;
SELECT redpacket.rp_create_activity(100.00, name => 'guc reset') AS gr \gset
SELECT stripes FROM redpacket.activity WHERE id = :gr;

-- Validation errors.  Count what exists first: none of them may write.
CREATE TEMP TABLE before AS
SELECT (SELECT count(*) FROM redpacket.activity) AS activities,
       (SELECT count(*) FROM redpacket.stripe) AS stripes,
       (SELECT count(*) FROM redpacket.ledger) AS ledger;

CREATE TEMP TABLE bad (n serial, label text, q text);
INSERT INTO bad (label, q) VALUES
  ('total NULL',             'SELECT redpacket.rp_create_activity(NULL)'),
  ('total NaN',              'SELECT redpacket.rp_create_activity(''NaN'')'),
  ('total Infinity',         'SELECT redpacket.rp_create_activity(''Infinity'')'),
  ('total -Infinity',        'SELECT redpacket.rp_create_activity(''-Infinity'')'),
  ('total 0',                'SELECT redpacket.rp_create_activity(0)'),
  ('total 0.00',             'SELECT redpacket.rp_create_activity(0.00)'),
  ('total -1.00',            'SELECT redpacket.rp_create_activity(-1.00)'),
  ('total 1.001 scale 2',    'SELECT redpacket.rp_create_activity(1.001)'),
  ('total 0.001 scale 2',    'SELECT redpacket.rp_create_activity(0.001)'),
  ('total 100.5 scale 0',    'SELECT redpacket.rp_create_activity(100.5, scale => 0)'),
  ('total 1.23456 scale 4',  'SELECT redpacket.rp_create_activity(1.23456, scale => 4)'),
  ('total > int64 scale 2',  'SELECT redpacket.rp_create_activity(92233720368547758.08)'),
  ('total > int64 scale 0',  'SELECT redpacket.rp_create_activity(9223372036854775808, scale => 0)'),
  ('total > int64 scale 4',  'SELECT redpacket.rp_create_activity(922337203685477.5808, scale => 4)'),
  ('total 1e30',             'SELECT redpacket.rp_create_activity(1e30)'),
  ('scale -1',               'SELECT redpacket.rp_create_activity(100, scale => -1)'),
  ('scale 5',                'SELECT redpacket.rp_create_activity(100, scale => 5)'),
  ('scale NULL',             'SELECT redpacket.rp_create_activity(100, scale => NULL)'),
  ('stripes 0',              'SELECT redpacket.rp_create_activity(100.00, stripes => 0)'),
  ('stripes -1',             'SELECT redpacket.rp_create_activity(100.00, stripes => -1)'),
  ('stripes 1025',           'SELECT redpacket.rp_create_activity(100.00, stripes => 1025)'),
  ('packets 0',              'SELECT redpacket.rp_create_activity(100.00, packets => 0)'),
  ('packets -5',             'SELECT redpacket.rp_create_activity(100.00, packets => -5)'),
  ('packets > minor units',  'SELECT redpacket.rp_create_activity(0.05, packets => 6)'),
  ('packets > units scale 0','SELECT redpacket.rp_create_activity(3, packets => 4, scale => 0)'),
  ('per_user_limit 0',       'SELECT redpacket.rp_create_activity(100.00, per_user_limit => 0)'),
  ('per_user_limit -1',      'SELECT redpacket.rp_create_activity(100.00, per_user_limit => -1)'),
  ('per_user_limit NULL',    'SELECT redpacket.rp_create_activity(100.00, per_user_limit => NULL)'),
  ('starts_at NULL',         'SELECT redpacket.rp_create_activity(100.00, starts_at => NULL)'),
  ('ends_at = starts_at',    'SELECT redpacket.rp_create_activity(100.00, starts_at => ''2030-01-01 00:00+00'', ends_at => ''2030-01-01 00:00+00'')'),
  ('ends_at < starts_at',    'SELECT redpacket.rp_create_activity(100.00, starts_at => ''2030-01-02 00:00+00'', ends_at => ''2030-01-01 00:00+00'')'),
  ('ends_at < now()',        'SELECT redpacket.rp_create_activity(100.00, ends_at => now() - interval ''1 second'')');
SELECT n, label, pg_temp.err(q) AS result FROM bad ORDER BY n;

SELECT (SELECT count(*) FROM redpacket.activity) = b.activities AS no_activity,
       (SELECT count(*) FROM redpacket.stripe) = b.stripes AS no_stripe,
       (SELECT count(*) FROM redpacket.ledger) = b.ledger AS no_ledger
FROM before b;

-- Every activity made above is funded exactly once, with its stripes holding
-- exactly the total.
SELECT count(*) AS activities,
       bool_and(s.fund_ok) AS all_funded_exactly,
       bool_and(s.ledger_rows = 1) AS one_ledger_row_each,
       bool_and(s.stripe_claims = 0) AS no_claims
FROM redpacket.activity a, pg_temp.shape(a.id) s WHERE a.id >= :a1;
