-- Every SECURITY DEFINER function of the extension, rp_claim and
-- rp_claim_batch included, pins search_path in its definition (SET
-- search_path = pg_catalog, pg_temp), so nothing that runs inside it --
-- our statements, a trigger, an index expression or predicate, an operator
-- class's operators, an exclusion operator, a CHECK constraint, a column
-- default -- resolves a name through a schema its caller can write.
--
-- An application role (rp_grant_app only) owns a schema with twins of
-- lower(text), abs(bigint) and abs(integer) that, run by a superuser, make
-- the role a superuser; it puts that schema first on its search_path and
-- claims.  An admin has added, one at a time, objects written the ordinary
-- careless way, calling lower() or abs() unqualified: BRIN indexes on claim
-- and on stripe whose operators are SQL functions, a GiST exclusion
-- constraint whose operator is an SQL function, an expression index, a
-- partial index, a CHECK constraint and a column default.  After each round
-- of claims the role is still not a superuser and no twin ran as anyone but
-- the role itself.  The suite runs this file on both claim paths (the
-- executor-direct one and, with redpacket.direct_claims = off, the SQL one).
SET client_min_messages = warning;

-- The pin is in every definition.
SELECT p.oid::regprocedure AS unpinned_security_definer
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redpacket'
WHERE p.prosecdef AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);

CREATE ROLE regress_rp_mallory;
SELECT redpacket.rp_grant_app('regress_rp_mallory');
CREATE SCHEMA rp_evil AUTHORIZATION regress_rp_mallory;
SET ROLE regress_rp_mallory;
CREATE TABLE rp_evil.ran (what text, who name, as_super boolean);
GRANT INSERT ON rp_evil.ran TO PUBLIC;
CREATE FUNCTION rp_evil.spring(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rp_evil.ran
    SELECT what, r.rolname, r.rolsuper FROM pg_catalog.pg_roles r
     WHERE r.rolname OPERATOR(pg_catalog.=) current_user;
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r
         WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        EXECUTE 'ALTER ROLE regress_rp_mallory SUPERUSER';
    END IF;
END $$;
CREATE FUNCTION rp_evil.lower(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM rp_evil.spring('lower');
    RETURN pg_catalog.lower(t);
END $$;
CREATE FUNCTION rp_evil.abs(v bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM rp_evil.spring('abs');
    RETURN pg_catalog.abs(v);
END $$;
CREATE FUNCTION rp_evil.abs(v integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM rp_evil.spring('abs');
    RETURN pg_catalog.abs(v);
END $$;
-- The twins are live: run by the role itself on its own path.
SET search_path = rp_evil, pg_catalog;
SELECT lower('LIVE') AS live, abs(-2::bigint) AS live_abs;
RESET search_path;
RESET ROLE;

-- The admin's careless SQL functions (unqualified lower and abs).
CREATE FUNCTION public.rp_fold(t text) RETURNS text LANGUAGE sql IMMUTABLE
    AS 'SELECT lower(t)';
CREATE FUNCTION public.rp_keep(t text) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS 'SELECT lower(t) <> ''nobody''';
CREATE FUNCTION public.rp_sane(t text) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS 'SELECT length(lower(t)) > 0';
CREATE FUNCTION public.rp_label() RETURNS text LANGUAGE sql STABLE
    AS 'SELECT lower(''Claimed'')';
CREATE FUNCTION public.rp_tlt(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT lower(a) < lower(b)';
CREATE FUNCTION public.rp_tle(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT lower(a) <= lower(b)';
CREATE FUNCTION public.rp_teq(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT lower(a) = lower(b)';
CREATE FUNCTION public.rp_tge(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT lower(a) >= lower(b)';
CREATE FUNCTION public.rp_tgt(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT lower(a) > lower(b)';
CREATE OPERATOR public.<~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rp_tlt);
CREATE OPERATOR public.<=~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rp_tle);
CREATE OPERATOR public.=~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rp_teq);
CREATE OPERATOR public.>=~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rp_tge);
CREATE OPERATOR public.>~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.rp_tgt);
CREATE OPERATOR CLASS public.rp_fold_brin FOR TYPE text USING brin AS
    OPERATOR 1 public.<~, OPERATOR 2 public.<=~, OPERATOR 3 public.=~,
    OPERATOR 4 public.>=~, OPERATOR 5 public.>~,
    FUNCTION 1 brin_minmax_opcinfo(internal),
    FUNCTION 2 brin_minmax_add_value(internal, internal, internal, internal),
    FUNCTION 3 brin_minmax_consistent(internal, internal, internal),
    FUNCTION 4 brin_minmax_union(internal, internal, internal);
CREATE FUNCTION public.rp_ilt(a bigint, b bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT abs(a) < abs(b)';
CREATE FUNCTION public.rp_ile(a bigint, b bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT abs(a) <= abs(b)';
CREATE FUNCTION public.rp_ieq(a bigint, b bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT abs(a) = abs(b)';
CREATE FUNCTION public.rp_ige(a bigint, b bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT abs(a) >= abs(b)';
CREATE FUNCTION public.rp_igt(a bigint, b bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT abs(a) > abs(b)';
CREATE OPERATOR public.<~ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.rp_ilt);
CREATE OPERATOR public.<=~ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.rp_ile);
CREATE OPERATOR public.=~ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.rp_ieq);
CREATE OPERATOR public.>=~ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.rp_ige);
CREATE OPERATOR public.>~ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.rp_igt);
CREATE OPERATOR CLASS public.rp_abs_brin FOR TYPE bigint USING brin AS
    OPERATOR 1 public.<~, OPERATOR 2 public.<=~, OPERATOR 3 public.=~,
    OPERATOR 4 public.>=~, OPERATOR 5 public.>~,
    FUNCTION 1 brin_minmax_opcinfo(internal),
    FUNCTION 2 brin_minmax_add_value(internal, internal, internal, internal),
    FUNCTION 3 brin_minmax_consistent(internal, internal, internal),
    FUNCTION 4 brin_minmax_union(internal, internal, internal);
-- An exclusion operator for GiST's polygon opclass: "overlaps", as far as
-- the (lossy) index is concerned, but its SQL function, which the
-- constraint check calls for every candidate the index finds, calls abs()
-- and lets everything through.
CREATE FUNCTION public.rp_never(a polygon, b polygon) RETURNS boolean LANGUAGE sql IMMUTABLE
    AS 'SELECT abs(0) < 0 AND a && b';
CREATE OPERATOR public.&&~ (LEFTARG = polygon, RIGHTARG = polygon,
                            FUNCTION = public.rp_never, COMMUTATOR = OPERATOR(public.&&~));
CREATE OPERATOR CLASS public.rp_never_gist FOR TYPE polygon USING gist AS
    STORAGE box,
    OPERATOR 3 public.&&~,
    FUNCTION 1 gist_poly_consistent(internal, polygon, smallint, oid, internal),
    FUNCTION 2 gist_box_union(internal, internal),
    FUNCTION 3 gist_poly_compress(internal),
    FUNCTION 5 gist_box_penalty(internal, internal, internal),
    FUNCTION 6 gist_box_picksplit(internal, internal),
    FUNCTION 7 gist_box_same(box, box, internal);

-- What the role's claims did: one row per claim (status), then nothing of
-- the twins ran as a superuser, and the role is not one.
CREATE FUNCTION public.rp_attack(what text, act bigint, users text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    answers text;
BEGIN
    SET LOCAL ROLE regress_rp_mallory;
    SET LOCAL search_path = rp_evil, pg_catalog;
    SELECT string_agg(r.status::text, ',' ORDER BY u.n) INTO answers
      FROM unnest(users) WITH ORDINALITY u(id, n),
           LATERAL redpacket.rp_claim(act, u.id, 1.00) r;
    -- a batch too
    SELECT answers || ' | ' || string_agg(b.status::text, ',' ORDER BY b.ord) INTO answers
      FROM redpacket.rp_claim_batch(act, ARRAY[users[1] || 'b', users[2] || 'b'],
                                    ARRAY[1.00, 1.00]) b;
    -- the caller's path is its own again
    answers := answers || ' | ' || current_setting('search_path');
    RESET ROLE;
    RETURN what || ': ' || answers;
END $$;
CREATE FUNCTION public.rp_damage() RETURNS text LANGUAGE sql AS $$
    SELECT 'superuser: ' || (SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rp_mallory')
        || ', twins run as a superuser: '
        || (SELECT count(*) FROM rp_evil.ran WHERE as_super OR who <> 'regress_rp_mallory')
$$;

SELECT redpacket.rp_create_activity(1000.00, stripes => 2) AS act \gset

CREATE INDEX rp_brin_claim ON redpacket.claim USING brin (user_id public.rp_fold_brin);
SELECT public.rp_attack('brin on claim', :act, ARRAY['b1', 'b2', 'b3']);
SELECT public.rp_damage();
DROP INDEX redpacket.rp_brin_claim;

CREATE INDEX rp_brin_stripe ON redpacket.stripe USING brin (balance public.rp_abs_brin);
SELECT public.rp_attack('brin on stripe', :act, ARRAY['s1', 's2', 's3']);
SELECT public.rp_damage();
DROP INDEX redpacket.rp_brin_stripe;

ALTER TABLE redpacket.claim ADD CONSTRAINT rp_never_overlap
    EXCLUDE USING gist (polygon(box(point(activity_id, 0), point(activity_id, 1))) public.rp_never_gist
            WITH public.&&~) WHERE (activity_id = :act);
SELECT public.rp_attack('gist exclusion', :act, ARRAY['g1', 'g2', 'g3']);
SELECT public.rp_damage();
ALTER TABLE redpacket.claim DROP CONSTRAINT rp_never_overlap;

CREATE INDEX rp_expr ON redpacket.claim (public.rp_fold(user_id));
SELECT public.rp_attack('expression index', :act, ARRAY['x1', 'x2', 'x3']);
-- an index invalidated on its own is opened anew by the next claim
ALTER INDEX redpacket.rp_expr SET (fillfactor = 90);
SELECT public.rp_attack('expression index after alter index', :act, ARRAY['x4', 'x5', 'x6']);
SELECT public.rp_damage();
DROP INDEX redpacket.rp_expr;

CREATE INDEX rp_partial ON redpacket.claim (claim_id) WHERE public.rp_keep(user_id);
SELECT public.rp_attack('partial index', :act, ARRAY['p1', 'p2', 'p3']);
SELECT public.rp_damage();
DROP INDEX redpacket.rp_partial;

ALTER TABLE redpacket.claim ADD CONSTRAINT rp_sane CHECK (public.rp_sane(user_id)) NOT VALID;
SELECT public.rp_attack('check constraint', :act, ARRAY['c1', 'c2', 'c3']);
SELECT public.rp_damage();
ALTER TABLE redpacket.claim DROP CONSTRAINT rp_sane;

ALTER TABLE redpacket.claim ADD COLUMN rp_label text DEFAULT public.rp_label();
SELECT public.rp_attack('column default', :act, ARRAY['d1', 'd2', 'd3']);
SELECT public.rp_damage();
SELECT count(*) AS labelled FROM redpacket.claim WHERE activity_id = :act AND rp_label = 'claimed';
ALTER TABLE redpacket.claim DROP COLUMN rp_label;

-- The caller's path comes back after an error inside rp_claim (caught), and
-- after a savepoint rolled back over a claim.
SET search_path = rp_evil, pg_catalog;
SET client_min_messages = notice;
DO $$
BEGIN
    BEGIN
        PERFORM redpacket.rp_claim(-1, 'nobody', 1.00);
    EXCEPTION WHEN no_data_found THEN
        RAISE NOTICE 'after a caught error: %', current_setting('search_path');
    END;
END $$ LANGUAGE plpgsql;
SET client_min_messages = warning;
BEGIN;
SAVEPOINT s;
SELECT status FROM redpacket.rp_claim(:act, 'sp1', 1.00);
ROLLBACK TO SAVEPOINT s;
SELECT current_setting('search_path') AS after_rollback_to_savepoint;
SELECT status FROM redpacket.rp_claim(:act, 'sp2', 1.00);
SELECT current_setting('search_path') AS after_claim;
COMMIT;
RESET search_path;

SELECT public.rp_damage() AS finally;
SELECT what, who, as_super FROM rp_evil.ran GROUP BY 1, 2, 3 ORDER BY 1;

DROP FUNCTION public.rp_attack(text, bigint, text[]), public.rp_damage();
DROP OPERATOR FAMILY public.rp_fold_brin USING brin;
DROP OPERATOR FAMILY public.rp_abs_brin USING brin;
DROP OPERATOR FAMILY public.rp_never_gist USING gist;
DROP OPERATOR public.&&~ (polygon, polygon);
DROP FUNCTION public.rp_never(polygon, polygon);
DROP OPERATOR public.<~ (text, text), public.<=~ (text, text), public.=~ (text, text),
    public.>=~ (text, text), public.>~ (text, text),
    public.<~ (bigint, bigint), public.<=~ (bigint, bigint), public.=~ (bigint, bigint),
    public.>=~ (bigint, bigint), public.>~ (bigint, bigint);
DROP FUNCTION public.rp_tlt(text, text), public.rp_tle(text, text), public.rp_teq(text, text),
    public.rp_tge(text, text), public.rp_tgt(text, text),
    public.rp_ilt(bigint, bigint), public.rp_ile(bigint, bigint), public.rp_ieq(bigint, bigint),
    public.rp_ige(bigint, bigint), public.rp_igt(bigint, bigint),
    public.rp_fold(text), public.rp_keep(text), public.rp_sane(text), public.rp_label();
DROP OWNED BY regress_rp_mallory;
DROP ROLE regress_rp_mallory;
