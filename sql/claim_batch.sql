-- rp_claim_batch: element by element in array order, the same outcome as
-- rp_claim for each; bad input anywhere (or arrays of different lengths)
-- makes the whole call an error with nothing written.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql

-- The same script on twin activities: one rp_claim at a time, and one batch.
CREATE TEMP TABLE script (ord integer, user_id text, amount numeric);
INSERT INTO script VALUES
  (1, 'alice', 1.00), (2, 'bob', 2.00), (3, 'alice', 3.00), (4, 'carol', 8.00),
  (5, 'carol', 7.00), (6, 'dave', 0.01), (7, 'bob', 0.01), (8, 'erin', 0.01);
SELECT redpacket.rp_create_activity(10.00, stripes => 4) AS one \gset
SELECT redpacket.rp_create_activity(10.00, stripes => 4) AS many \gset
CREATE TEMP TABLE singles (ord integer, user_id text, r redpacket.claim_result);
SET rp.one = :'one';
DO $$
DECLARE s record;
BEGIN
    FOR s IN SELECT * FROM script ORDER BY ord LOOP
        INSERT INTO singles
        VALUES (s.ord, s.user_id, redpacket.rp_claim(current_setting('rp.one')::bigint, s.user_id, s.amount));
    END LOOP;
END $$;
RESET rp.one;
CREATE TEMP TABLE batch AS
SELECT * FROM redpacket.rp_claim_batch(:many,
    ARRAY(SELECT user_id FROM script ORDER BY ord),
    ARRAY(SELECT amount FROM script ORDER BY ord));
SELECT b.ord, b.user_id, b.status, b.amount,
       (s.r).status = b.status AND (s.r).amount IS NOT DISTINCT FROM b.amount
         AND s.user_id = b.user_id AS same_as_rp_claim,
       (b.claim_id IS NOT NULL) = (b.status IN ('claimed', 'duplicate'))
         AND (b.claimed_at IS NOT NULL) = (b.status IN ('claimed', 'duplicate')) AS fields_ok
FROM batch b JOIN singles s USING (ord) ORDER BY b.ord;
-- the duplicates point at the claims made earlier in the same batch
SELECT d.ord, o.ord AS original_ord, d.claimed_at = o.claimed_at AS same_time
FROM batch d JOIN batch o ON o.claim_id = d.claim_id AND o.status = 'claimed'
WHERE d.status = 'duplicate' ORDER BY d.ord;
-- every claimed row is in the claim table as returned
SELECT count(*) AS claimed_rows,
       bool_and(c.user_id = b.user_id AND c.amount = b.amount AND c.claimed_at = b.claimed_at) AS rows_match
FROM batch b JOIN redpacket.claim c ON c.activity_id = :many AND c.claim_id = b.claim_id
WHERE b.status = 'claimed';
SELECT * FROM pg_temp.books(:one);
SELECT * FROM pg_temp.books(:many);

-- lucky draws: a NULL element, or amounts NULL ---------------------------------
SELECT redpacket.rp_create_activity(10.00, packets => 5, stripes => 2) AS l \gset
SELECT ord, status, CASE WHEN ord = 1 THEN amount END AS fixed_amount, amount >= 0.01 AS min_unit
FROM redpacket.rp_claim_batch(:l, ARRAY['f', 'u1', 'u2'], ARRAY[1.50, NULL, NULL])
ORDER BY ord;
SELECT ord, status, amount >= 0.01 AS min_unit
FROM redpacket.rp_claim_batch(:l, ARRAY['u3', 'u1', 'u4', 'u5'])
ORDER BY ord;
-- the last packet took the exact rest
SELECT * FROM pg_temp.books(:l);

-- rain: request ids --------------------------------------------------------
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 2, stripes => 2) AS r \gset
SELECT ord, user_id, status, amount
FROM redpacket.rp_claim_batch(:r, ARRAY['a', 'a', 'a', 'a', 'b'], ARRAY[1.00, 2.00, 3.00, 4.00, 5.00],
                              ARRAY['r1', 'r2', 'r1', 'r3', 'r1'])
ORDER BY ord;
SELECT * FROM pg_temp.books(:r);

-- statuses other than claimed: frozen, ended, not_started ---------------------
SELECT redpacket.rp_freeze(:r, 'batch test');
SELECT ord, status, amount FROM redpacket.rp_claim_batch(:r, ARRAY['a', 'c'], ARRAY[1.00, 1.00], ARRAY['r2', 'r1'])
ORDER BY ord;
SELECT redpacket.rp_unfreeze(:r);
SELECT redpacket.rp_close_activity(:r) = 2.00 AS returned_2;
SELECT ord, status, amount FROM redpacket.rp_claim_batch(:r, ARRAY['a', 'c'], ARRAY[1.00, 1.00], ARRAY['r2', 'r1'])
ORDER BY ord;
SELECT redpacket.rp_create_activity(10.00, starts_at => now() + interval '1 hour', stripes => 2) AS ns \gset
SELECT ord, status FROM redpacket.rp_claim_batch(:ns, ARRAY['a', 'b'], ARRAY[1.00, 1.00]) ORDER BY ord;
SELECT * FROM pg_temp.books(:r);

-- no false exhaustion through a batch: 100.00 by 0.07 over 1024 stripes ------
SELECT redpacket.rp_create_activity(100.00, stripes => 1024) AS big \gset
SELECT status, count(*), sum(amount) AS amount
FROM redpacket.rp_claim_batch(:big, ARRAY(SELECT 'user-' || g FROM generate_series(1, 1430) g),
                              array_fill(0.07, ARRAY[1430]))
GROUP BY status ORDER BY status;
SELECT ord, status FROM redpacket.rp_claim_batch(:big, ARRAY['x', 'y', 'z'], ARRAY[0.05, 0.04, 0.01]) ORDER BY ord;
SELECT * FROM pg_temp.books(:big);

-- empty batch ------------------------------------------------------------------
SELECT count(*) AS rows FROM redpacket.rp_claim_batch(:big, '{}');

-- bad input anywhere: an error, and nothing written ------------------------------
SELECT redpacket.rp_create_activity(10.00, stripes => 2) AS e \gset
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 3, stripes => 2) AS er \gset
SELECT max(id) + 1000 AS unknown FROM redpacket.activity \gset
CREATE TEMP TABLE bad (n serial, label text, q text);
INSERT INTO bad (label, q) VALUES
  ('amounts shorter',       format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b'', ''c''], ARRAY[1.00, 1.00])', :e)),
  ('amounts longer',        format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a''], ARRAY[1.00, 1.00])', :e)),
  ('request_ids shorter',   format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 1.00], ARRAY[''r1''])', :er)),
  ('user_ids 2-D',          format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[[''a''], [''b'']], ARRAY[1.00, 1.00])', :e)),
  ('last user_id NULL',     format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', NULL], ARRAY[1.00, 1.00])', :e)),
  ('last user_id empty',    format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''''], ARRAY[1.00, 1.00])', :e)),
  ('last user_id too long', format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', repeat(''x'', 257)], ARRAY[1.00, 1.00])', :e)),
  ('last amount 0.001',     format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 0.001])', :e)),
  ('last amount NaN',       format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, ''NaN''])', :e)),
  ('last amount 0',         format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 0])', :e)),
  ('last amount > int64',   format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 92233720368547758.08])', :e)),
  ('amount NULL, no packets', format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, NULL])', :e)),
  ('amounts NULL, no packets', format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''])', :e)),
  ('request_ids NULL, rain', format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 1.00])', :er)),
  ('last request_id NULL',  format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a'', ''b''], ARRAY[1.00, 1.00], ARRAY[''r1'', NULL])', :er)),
  ('activity NULL',         'SELECT * FROM redpacket.rp_claim_batch(NULL, ARRAY[''a''], ARRAY[1.00])'),
  ('user_ids NULL',         format('SELECT * FROM redpacket.rp_claim_batch(%s, NULL, ARRAY[1.00])', :e)),
  ('unknown activity',      format('SELECT * FROM redpacket.rp_claim_batch(%s, ARRAY[''a''], ARRAY[1.00])', :unknown));
SELECT n, label, pg_temp.err(q) AS result FROM bad ORDER BY n;
SELECT * FROM pg_temp.books(:e);
SELECT * FROM pg_temp.books(:er);
-- the same activity still takes a good batch afterwards
SELECT ord, status, amount FROM redpacket.rp_claim_batch(:e, ARRAY['a', 'b'], ARRAY[1.00, 2.00]) ORDER BY ord;
SELECT * FROM pg_temp.books(:e);
