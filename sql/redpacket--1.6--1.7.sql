-- redpacket 1.6 -> 1.7.  Every change here is also in redpacket--1.7.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from any earlier
-- version equals a fresh 1.7.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.7'" to load this file. \quit

-- [track] When the untracked claims were read ----------------------------------
-- The update that records the claims of before settlement tracking dated
-- them by its transaction's start: a claim that committed after the
-- transaction began, but before the update held the activities, is untracked
-- yet later than that date, and the full check took it for a copy.  The date
-- is now the clock once the update holds the activities (the first update
-- script locks redpacket.activity, so no claim of the old catalog commits
-- after that).  And when the extension was created in the transaction that
-- updates it, no old wallet ever paid its claims: the rows recorded for it
-- are removed and its claims are pending like any other.  Both look only at
-- the rows this transaction wrote (in any of its subtransactions), so a
-- database updated to 1.6 before keeps what its update recorded.
COMMENT ON COLUMN redpacket.settlement_start.recorded_at IS
    'When the update read the claims up to untracked_through, holding the activities: every one of them is older.';
CREATE FUNCTION redpacket.rp_written_now(pg_catalog.xid) RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'rp_written_now'
LANGUAGE C STRICT;
DO $$
DECLARE
    distributed pg_catalog.bool := false;
BEGIN
    -- a distributed table was distributed after the update that filled it
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
             || ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) ''redpacket.settlement_start''::pg_catalog.regclass)'
           INTO distributed;
    END IF;
    IF distributed THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_depend m
                WHERE m.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                  AND m.objid OPERATOR(pg_catalog.=) 'redpacket.claim'::pg_catalog.regclass
                  AND m.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND m.deptype OPERATOR(pg_catalog.=) 'e'
                  AND redpacket.rp_written_now(m.xmin)) THEN
        DELETE FROM redpacket.settlement_start u WHERE redpacket.rp_written_now(u.xmin);
    ELSE
        UPDATE redpacket.settlement_start u SET recorded_at = pg_catalog.clock_timestamp()
         WHERE redpacket.rp_written_now(u.xmin);
    END IF;
END;
$$;
DROP FUNCTION redpacket.rp_written_now(pg_catalog.xid);
