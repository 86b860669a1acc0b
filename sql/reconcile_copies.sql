-- What the rows copy from each other (the copies check).  With the triggers
-- firing nothing but the extension changes these rows; with
-- session_replication_role = replica (a superuser, a restore with triggers
-- off) no trigger fires, and the check is what reports a copy gone wrong:
-- a stripe's halted and revision against its activity, the activity's
-- total, cap, creation time and creator against its funding entry, and in
-- full checks the settlements, the settlement frontier, the reconciliation
-- state and the length of an eligibility list.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/test/sql/helpers.sql
SET client_min_messages = error;

-- A stripe un-halted on a frozen activity: a fast-path claim would pay
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'unhalted') AS h \gset
SELECT status FROM redpacket.rp_claim(:h, 'u1', 1.00);
SELECT redpacket.rp_freeze(:h, 'hold');
SELECT ok, problems FROM redpacket.rp_verify(:h, true);
SET session_replication_role = replica;
UPDATE redpacket.stripe SET halted = false WHERE activity_id = :h AND stripe = 0;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:h);
SELECT ok, problems FROM redpacket.rp_verify(:h, true);
-- the repair halts every stripe again; then the activity unfreezes and pays
SELECT ok, problems FROM redpacket.rp_repair_stripes(:h, 'stripe 0 un-halted by hand');
SELECT bool_and(halted) AS halted FROM redpacket.stripe WHERE activity_id = :h;
SELECT redpacket.rp_unfreeze(:h);
SELECT status FROM redpacket.rp_claim(:h, 'u2', 1.00);

-- A stripe at another revision than its activity: every claim on it would
-- fail; the check names it, the repair brings it back
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 1, name => 'revision') AS r \gset
SET session_replication_role = replica;
UPDATE redpacket.stripe SET revision = revision + 7 WHERE activity_id = :r;
RESET session_replication_role;
SELECT pg_temp.err(format('SELECT redpacket.rp_claim(%s, ''u1'', 1.00)', :r)) AS claim;
SELECT ok, problems FROM redpacket.rp_reconcile(:r);
SELECT ok FROM redpacket.rp_repair_stripes(:r, 'revision moved by hand');
SELECT redpacket.rp_unfreeze(:r);
SELECT status FROM redpacket.rp_claim(:r, 'u1', 1.00);

-- The activity's own row against its funding entry: total, cap, creation
-- time and creator; the repair takes them back from the entry
SELECT redpacket.rp_create_activity(6.00, 3, stripes => 1, name => 'terms') AS t \gset
CREATE TEMP TABLE terms_before AS
SELECT total, packets, created_at, created_by FROM redpacket.activity WHERE id = :t;
SET session_replication_role = replica;
UPDATE redpacket.activity SET total = 60.00, packets = 30, created_at = created_at - interval '1 day',
       created_by = 'someone' WHERE id = :t;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_reconcile(:t);
SELECT ok FROM redpacket.rp_repair_stripes(:t, 'terms edited by hand');
SELECT (a.total, a.packets, a.created_at, a.created_by) = (b.total, b.packets, b.created_at, b.created_by)
       AS terms_back
  FROM redpacket.activity a, terms_before b WHERE a.id = :t;

-- The settlement frontier moved past a claim no one credited: that claim
-- drops out of rp_pending_credits unpaid; a full check says so
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 1, name => 'frontier') AS f \gset
SELECT count(*) AS claimed FROM generate_series(1, 3) g, redpacket.rp_claim(:f, 'u' || g, 1.00) c
 WHERE c.status = 'claimed';
SELECT redpacket.rp_credited(:f, array_agg(claim_id), 'paid')
  FROM redpacket.claim WHERE activity_id = :f AND user_id = 'u1';
SELECT count(*) AS pending FROM redpacket.rp_pending_credits(:f);
SELECT ok, problems FROM redpacket.rp_verify(:f, true);
SET session_replication_role = replica;
UPDATE redpacket.settlement_state
   SET settled_through = (SELECT max(claim_id) FROM redpacket.claim WHERE activity_id = :f)
 WHERE activity_id = :f;
RESET session_replication_role;
SELECT count(*) AS pending_now FROM redpacket.rp_pending_credits(:f);
SELECT ok, problems FROM redpacket.rp_verify(:f);
SELECT ok, problems FROM redpacket.rp_verify(:f, true);
-- a settlement whose amount is not its claim's
SET session_replication_role = replica;
UPDATE redpacket.settlement_state SET settled_through = 0 WHERE activity_id = :f;
UPDATE redpacket.claim_settlement SET amount = 9.00 WHERE activity_id = :f;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:f, true);
SET session_replication_role = replica;
UPDATE redpacket.claim_settlement SET amount = 1.00 WHERE activity_id = :f;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:f, true);

-- A user slipped into a restricted activity's list, which pg_restore's
-- COPY would also write (so INSERT is not refused): the list is longer
-- than its recorded changes made it
SELECT redpacket.rp_create_activity(5.00, 5, stripes => 1, name => 'list', restricted => true) AS l \gset
SELECT redpacket.rp_allow(:l, ARRAY['a1', 'a2']) AS allowed;
SELECT ok, problems FROM redpacket.rp_verify(:l, true);
INSERT INTO redpacket.eligible (activity_id, user_id) VALUES (:l, 'intruder');
SELECT ok, problems FROM redpacket.rp_verify(:l, true);
SELECT pg_temp.err(format('DELETE FROM redpacket.eligible WHERE activity_id = %s AND user_id = ''intruder''', :l)) AS delete;
SET session_replication_role = replica;
DELETE FROM redpacket.eligible WHERE activity_id = :l AND user_id = 'intruder';
DELETE FROM redpacket.eligible WHERE activity_id = :l AND user_id = 'a1';
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:l, true);
INSERT INTO redpacket.eligible (activity_id, user_id) VALUES (:l, 'a1');
SELECT ok, problems FROM redpacket.rp_verify(:l, true);

-- Reconciliation state settled while the activity is open: it would leave
-- the passes' list (a time in it is not compared with the clock, which can
-- be stepped back)
SELECT redpacket.rp_create_activity(5.00, 5, stripes => 1, name => 'state') AS s \gset
SELECT ok FROM redpacket.rp_reconcile(:s);
SET session_replication_role = replica;
UPDATE redpacket.reconcile_state SET settled = true WHERE activity_id = :s;
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:s, true);
-- a recorded check writes the state as it is; the next one passes
SELECT ok, problems FROM redpacket.rp_reconcile(:s, true);
SELECT ok, problems FROM redpacket.rp_reconcile(:s, true);

-- A claim moved to another stripe: the money and the claim count still add
-- up, but each stripe's counter no longer counts the live claims naming it
-- (a reversed claim counts on no stripe); a full check says so, and the
-- repair recounts the stripes from the claims
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'moved') AS m \gset
SELECT count(*) AS claimed FROM generate_series(1, 4) g, redpacket.rp_claim(:m, 'u' || g, 1.00) c
 WHERE c.status = 'claimed';
SELECT redpacket.rp_reverse(:m, (SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = :m),
                            'wallet refused') AS reversed;
SELECT ok, problems FROM redpacket.rp_verify(:m, true);
SET session_replication_role = replica;
UPDATE redpacket.claim SET stripe = 1 - stripe
 WHERE claim_id = (SELECT max(claim_id) FROM redpacket.claim WHERE activity_id = :m);
RESET session_replication_role;
SELECT ok, problems FROM redpacket.rp_verify(:m);
SELECT ok, problems FROM redpacket.rp_verify(:m, true);
SELECT redpacket.rp_freeze(:m, 'claim moved');
SELECT ok FROM redpacket.rp_repair_stripes(:m, 'claim moved by hand');
SELECT stripe, claims FROM redpacket.stripe WHERE activity_id = :m ORDER BY stripe;
SELECT redpacket.rp_unfreeze(:m);
SELECT ok, problems FROM redpacket.rp_verify(:m, true);
