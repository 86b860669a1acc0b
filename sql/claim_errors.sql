-- rp_claim bad input: each is an error with its SQLSTATE, and nothing is
-- written.  Business outcomes are statuses; bad input never is.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'plain') AS a \gset
SELECT redpacket.rp_create_activity(10.00, packets => 5, stripes => 2, name => 'packets') AS p \gset
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 3, stripes => 2, name => 'rain') AS r \gset
SELECT redpacket.rp_create_activity(100, scale => 0, stripes => 2, name => 'scale 0') AS s0 \gset
SELECT redpacket.rp_create_activity(1.0000, scale => 4, stripes => 2, name => 'scale 4') AS s4 \gset
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset

CREATE TEMP TABLE bad (n serial, label text, q text);
INSERT INTO bad (label, q) VALUES
  ('activity NULL',          'SELECT redpacket.rp_claim(NULL, ''u1'', 1.00)'),
  ('user_id NULL',           format('SELECT redpacket.rp_claim(%s, NULL, 1.00)', :a)),
  ('both NULL',              'SELECT redpacket.rp_claim(NULL, NULL, 1.00)'),
  ('user_id empty',          format('SELECT redpacket.rp_claim(%s, '''', 1.00)', :a)),
  ('user_id 257 bytes',      format('SELECT redpacket.rp_claim(%s, repeat(''x'', 257), 1.00)', :a)),
  ('user_id 1000 bytes',     format('SELECT redpacket.rp_claim(%s, repeat(''x'', 1000), 1.00)', :a)),
  ('user_id 129 x 2 bytes',  format('SELECT redpacket.rp_claim(%s, repeat(''é'', 129), 1.00)', :a)),
  ('user_id 128 x 2 + 1',    format('SELECT redpacket.rp_claim(%s, repeat(''é'', 128) || ''x'', 1.00)', :a)),
  ('user_id 86 x 3 bytes',   format('SELECT redpacket.rp_claim(%s, repeat(''红'', 86), 1.00)', :a)),
  ('amount NaN',             format('SELECT redpacket.rp_claim(%s, ''u1'', ''NaN'')', :a)),
  ('amount Infinity',        format('SELECT redpacket.rp_claim(%s, ''u1'', ''Infinity'')', :a)),
  ('amount -Infinity',       format('SELECT redpacket.rp_claim(%s, ''u1'', ''-Infinity'')', :a)),
  ('amount 0',               format('SELECT redpacket.rp_claim(%s, ''u1'', 0)', :a)),
  ('amount 0.00',            format('SELECT redpacket.rp_claim(%s, ''u1'', 0.00)', :a)),
  ('amount -0.01',           format('SELECT redpacket.rp_claim(%s, ''u1'', -0.01)', :a)),
  ('amount -5',              format('SELECT redpacket.rp_claim(%s, ''u1'', -5)', :a)),
  ('amount 0.001 scale 2',   format('SELECT redpacket.rp_claim(%s, ''u1'', 0.001)', :a)),
  ('amount 1.005 scale 2',   format('SELECT redpacket.rp_claim(%s, ''u1'', 1.005)', :a)),
  ('amount 0.5 scale 0',     format('SELECT redpacket.rp_claim(%s, ''u1'', 0.5)', :s0)),
  ('amount 1.5 scale 0',     format('SELECT redpacket.rp_claim(%s, ''u1'', 1.5)', :s0)),
  ('amount 0.00001 scale 4', format('SELECT redpacket.rp_claim(%s, ''u1'', 0.00001)', :s4)),
  ('amount > int64 scale 2', format('SELECT redpacket.rp_claim(%s, ''u1'', 92233720368547758.08)', :a)),
  ('amount > int64 scale 0', format('SELECT redpacket.rp_claim(%s, ''u1'', 9223372036854775808)', :s0)),
  ('amount > int64 scale 4', format('SELECT redpacket.rp_claim(%s, ''u1'', 922337203685477.5808)', :s4)),
  ('amount 1e30',            format('SELECT redpacket.rp_claim(%s, ''u1'', 1e30)', :a)),
  ('unknown activity',       format('SELECT redpacket.rp_claim(%s, ''u1'', 1.00)', :unknown)),
  ('activity 0',             'SELECT redpacket.rp_claim(0, ''u1'', 1.00)'),
  ('activity -1',            'SELECT redpacket.rp_claim(-1, ''u1'', 1.00)'),
  ('lucky without packets',  format('SELECT redpacket.rp_claim(%s, ''u1'', NULL)', :a)),
  ('lucky, default amount',  format('SELECT redpacket.rp_claim(%s, ''u1'')', :a)),
  ('no request_id, rain',    format('SELECT redpacket.rp_claim(%s, ''u1'', 1.00)', :r)),
  ('NULL request_id, rain',  format('SELECT redpacket.rp_claim(%s, ''u1'', 1.00, NULL)', :r)),
  ('bad amount, packets',    format('SELECT redpacket.rp_claim(%s, ''u1'', 0.001)', :p));
SELECT n, label, pg_temp.err(q) AS result FROM bad ORDER BY n;

-- Nothing was written anywhere.
SELECT a.name, b.* FROM redpacket.activity a, pg_temp.books(a.id) b
WHERE a.id IN (:a, :p, :r, :s0, :s4) ORDER BY a.id;
SELECT count(*) AS claim_rows FROM redpacket.claim WHERE activity_id IN (:a, :p, :r, :s0, :s4, :unknown);

-- The same errors at top level, outside any exception block.
SELECT redpacket.rp_claim(:a, '', 1.00);
SELECT redpacket.rp_claim(:a, 'u1', 0.001);
SELECT redpacket.rp_claim(:a, 'u1', 'NaN');
SELECT * FROM pg_temp.books(:a);

-- The edges that are fine: 256 bytes of user id, however many characters;
-- an amount written with more digits than the scale but the same value;
-- amounts in range of int64 but above the budget are exhausted, not errors.
SELECT status, amount = 1.50 AS amount_ok FROM redpacket.rp_claim(:a, repeat('x', 256), 1.500);
SELECT status, amount = 1.00 AS amount_ok FROM redpacket.rp_claim(:a, repeat('é', 128), 1.00);
SELECT status, amount = 1.00 AS amount_ok FROM redpacket.rp_claim(:a, repeat('红', 85) || 'x', 1.00);
SELECT status, amount = 0.01 AS amount_ok FROM redpacket.rp_claim(:a, 'u', 0.01);
SELECT status FROM redpacket.rp_claim(:a, 'big', 92233720368547758.07);
SELECT status FROM redpacket.rp_claim(:s0, 'big', 9223372036854775807);
SELECT status, amount = 7 AS amount_ok FROM redpacket.rp_claim(:s0, 'u', 7.000);
SELECT status, amount = 0.0001 AS amount_ok FROM redpacket.rp_claim(:s4, 'u', 0.0001);
SELECT status, amount = 1.00 AS amount_ok FROM redpacket.rp_claim(:r, 'u1', 1.00, 'req-1');
SELECT octet_length(user_id) AS bytes, char_length(user_id) AS chars, amount
FROM redpacket.claim WHERE activity_id = :a ORDER BY claim_id;
SELECT a.name, b.* FROM redpacket.activity a, pg_temp.books(a.id) b
WHERE a.id IN (:a, :p, :r, :s0, :s4) ORDER BY a.id;

-- A bad request does not disturb what is there: the claims above still hold.
SELECT n, label, pg_temp.err(q) AS result FROM bad WHERE n IN (4, 10, 17, 22) ORDER BY n;
SELECT a.name, b.* FROM redpacket.activity a, pg_temp.books(a.id) b WHERE a.id = :a;
