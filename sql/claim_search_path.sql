-- rp_claim is SECURITY DEFINER without SET search_path (1.3): its C code
-- pins the path (pg_catalog, pg_temp) before it runs a statement or
-- evaluates an expression a user could have written, and gives the caller
-- its own path back when it returns (src/base.c, RpPinSearchPath).  Here the
-- caller's path is rp_path, public, and what runs inside rp_claim records
-- the path it sees: a trigger on redpacket.claim (the SQL path), a CHECK
-- constraint calling a function (the direct path, which stays in use), and
-- the careful path's statements (a lucky draw, a per-user limit).  After a
-- claim, after an error caught in an exception block and after a claim
-- nested in a trigger, the caller's path is its own again.  Each claim sets
-- redpacket.direct_claims itself, so the test means the same when the suite
-- runs with the switch off.
SET client_min_messages = warning;
SET redpacket.direct_claims = on;

SELECT p.prosecdef, p.proconfig, p.prosrc
FROM pg_proc p WHERE p.oid = 'redpacket.rp_claim(bigint,text,numeric,text)'::regprocedure;

CREATE SCHEMA rp_path;
CREATE TABLE rp_path.seen (n serial, what text, path text);
-- Records what ran and the path it ran under; true, so it fits a CHECK.
CREATE FUNCTION rp_path.note(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rp_path.seen (what, path) VALUES (what, current_setting('search_path'));
    RETURN true;
END $$;
CREATE FUNCTION rp_path.note_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rp_path.note('trigger ' || NEW.user_id);
    RETURN NULL;
END $$;
-- A claim, then the path the caller has once rp_claim returned.
CREATE FUNCTION rp_path.claim_then_path(act bigint, u text, amt numeric, req text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
BEGIN
    SELECT r.status::text INTO st FROM redpacket.rp_claim(act, u, amt, req) r;
    RETURN st || ' / ' || current_setting('search_path');
END $$;
-- An error inside rp_claim (unknown activity), caught: the path after it.
CREATE FUNCTION rp_path.fail_then_path() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM redpacket.rp_claim(-1, 'nobody', 1.00);
    EXCEPTION WHEN no_data_found THEN
        RETURN 'caught / ' || current_setting('search_path');
    END;
    RETURN 'no error';
END $$;

SELECT redpacket.rp_create_activity(100.00, stripes => 2) AS fixed \gset
SELECT redpacket.rp_create_activity(10.00, packets => 5) AS lucky \gset
SELECT redpacket.rp_create_activity(10.00, per_user_limit => 3) AS rain \gset
SELECT redpacket.rp_create_activity(10.00) AS nested \gset

SET search_path = rp_path, public;

-- The direct path with a CHECK constraint that calls a user's function: it
-- is still taken, and the function sees the pinned path.
ALTER TABLE redpacket.claim ADD CONSTRAINT rp_path_check CHECK (rp_path.note('check ' || user_id)) NOT VALID;
SET client_min_messages = debug1;
SELECT rp_path.claim_then_path(:fixed, 'c1', 1.00) AS direct_with_check;
SET client_min_messages = warning;
ALTER TABLE redpacket.claim DROP CONSTRAINT rp_path_check;

-- The SQL path: a trigger on claim sees the pinned path.
CREATE TRIGGER rp_path_seen AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION rp_path.note_trigger();
SELECT rp_path.claim_then_path(:fixed, 't1', 1.00) AS sql_path;
-- ... a lucky draw and a per-user limit take the careful path.
SELECT rp_path.claim_then_path(:lucky, 'l1', NULL) AS lucky_draw;
SELECT rp_path.claim_then_path(:rain, 'r1', 1.00, 'q1') AS rain;
SELECT rp_path.claim_then_path(:rain, 'r1', 1.00, 'q2') AS rain_again;
DROP TRIGGER rp_path_seen ON redpacket.claim;

-- An error inside rp_claim, caught: the caller's path is back, and the next
-- claim in the same transaction pins again.
SELECT rp_path.fail_then_path() AS after_error;
CREATE TRIGGER rp_path_seen AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION rp_path.note_trigger();
BEGIN;
SELECT rp_path.fail_then_path() AS after_error;
SELECT rp_path.claim_then_path(:fixed, 't2', 1.00) AS same_transaction;
COMMIT;
DROP TRIGGER rp_path_seen ON redpacket.claim;

-- A claim made by a trigger on claim, inside another claim: both pinned,
-- and the outer claim's caller has its path back.
CREATE TABLE rp_path.nested (id bigint);
INSERT INTO rp_path.nested VALUES (:nested);
CREATE FUNCTION rp_path.claim_more() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inner_act bigint := (SELECT id FROM rp_path.nested);
BEGIN
    IF NEW.activity_id <> inner_act THEN
        PERFORM rp_path.note('outer ' || NEW.user_id);
        PERFORM redpacket.rp_claim(inner_act, NEW.user_id, 1.00);
    ELSE
        PERFORM rp_path.note('inner ' || NEW.user_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER rp_path_more AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION rp_path.claim_more();
SELECT rp_path.claim_then_path(:fixed, 'n1', 1.00) AS nested;
DROP TRIGGER rp_path_more ON redpacket.claim;

RESET search_path;
SELECT what, path FROM rp_path.seen ORDER BY n;
-- Nothing else changed the claims: one for each claimed status above.
SELECT activity_id = :fixed AS fixed, user_id FROM redpacket.claim
WHERE activity_id IN (:fixed, :lucky, :rain, :nested) ORDER BY claim_id;

-- A hostile caller: a role with claim rights (rp_grant_app) whose own
-- schema comes first on its path, with a lower() that raises an error when
-- anyone runs it.  An admin's index on claim uses lower() unqualified, once
-- in a SQL function of an index expression, once in the comparison function
-- of a btree operator class.  The direct path must run neither under the
-- caller's path, also in a later call that does not rebuild its cache:
-- * the expression is built (and the SQL function inlined) by the relcache
--   when the direct path opens the index, here after an ALTER INDEX that
--   invalidated the index alone;
-- * the comparison function is parsed again in each transaction that
--   inserts into the index, with no CHECK or index expression in sight.
CREATE ROLE regress_rp_path_app;
SELECT redpacket.rp_grant_app('regress_rp_path_app');
CREATE SCHEMA rp_path_evil AUTHORIZATION regress_rp_path_app;
SELECT redpacket.rp_create_activity(10.00, stripes => 1) AS evil_act \gset
SET ROLE regress_rp_path_app;
CREATE FUNCTION rp_path_evil.lower(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'the caller''s lower() ran inside rp_claim (as a superuser: %)',
        (SELECT r.rolsuper FROM pg_catalog.pg_roles r
          WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
END $$;
RESET ROLE;
CREATE FUNCTION rp_path.fold(t text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT lower(t)';
CREATE INDEX rp_path_fold ON redpacket.claim (rp_path.fold(user_id));
SET ROLE regress_rp_path_app;
SET search_path = rp_path_evil, pg_catalog;
SELECT status FROM redpacket.rp_claim(:evil_act, 'e1', 1.00);
RESET ROLE;
RESET search_path;
ALTER INDEX redpacket.rp_path_fold SET (fillfactor = 90);
SET ROLE regress_rp_path_app;
SET search_path = rp_path_evil, pg_catalog;
SELECT status FROM redpacket.rp_claim(:evil_act, 'e2', 1.00) AS after_alter_index;
RESET ROLE;
RESET search_path;
DROP INDEX redpacket.rp_path_fold;
CREATE FUNCTION rp_path.fold_cmp(a text, b text) RETURNS integer LANGUAGE sql IMMUTABLE
    AS 'SELECT bttextcmp(lower(a), lower(b))';
CREATE OPERATOR CLASS rp_path.fold_ops FOR TYPE text USING btree AS
    OPERATOR 1 pg_catalog.<, OPERATOR 2 pg_catalog.<=, OPERATOR 3 pg_catalog.=,
    OPERATOR 4 pg_catalog.>=, OPERATOR 5 pg_catalog.>, FUNCTION 1 rp_path.fold_cmp(text, text);
CREATE INDEX rp_path_fold ON redpacket.claim (user_id rp_path.fold_ops);
SET ROLE regress_rp_path_app;
SET search_path = rp_path_evil, pg_catalog;
SELECT status FROM redpacket.rp_claim(:evil_act, 'e3', 1.00);
SELECT status FROM redpacket.rp_claim(:evil_act, 'e4', 1.00) AS opclass_second_call;
SELECT current_setting('search_path') AS callers_path;
RESET ROLE;
RESET search_path;
DROP INDEX redpacket.rp_path_fold;
SELECT user_id FROM redpacket.claim WHERE activity_id = :evil_act ORDER BY claim_id;
DROP OWNED BY regress_rp_path_app;
DROP ROLE regress_rp_path_app;

DROP SCHEMA rp_path CASCADE;
