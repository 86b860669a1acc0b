-- redpacket 1.0 -> 1.1.  Every change here is also in redpacket--1.1.sql, and
-- test/t/010_upgrade.pl proves that an upgraded database equals a fresh 1.1.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.1'" to load this file. \quit

-- [life] Drop guard -------------------------------------------------------------
-- DROP EXTENSION redpacket (or DROP SCHEMA redpacket CASCADE, or DROP OWNED BY
-- its owner) would delete every claim and ledger entry with the tables; the
-- guard refuses that unless redpacket.allow_drop is on.  An event trigger the
-- extension owns: pg_dump leaves it to CREATE EXTENSION, and calling its
-- function loads the library in any session.

CREATE FUNCTION redpacket.rp_drop_guard() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'rp_drop_guard'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_drop_guard() IS
    'Event trigger function: refuses DROP EXTENSION redpacket, DROP SCHEMA redpacket CASCADE and DROP OWNED BY the extension owner while claims or ledger entries exist, unless redpacket.allow_drop is on.';
REVOKE ALL ON FUNCTION redpacket.rp_drop_guard() FROM PUBLIC;

CREATE EVENT TRIGGER redpacket_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION redpacket.rp_drop_guard();
-- also under session_replication_role = replica
ALTER EVENT TRIGGER redpacket_drop_guard ENABLE ALWAYS;
COMMENT ON EVENT TRIGGER redpacket_drop_guard IS
    'Refuses to drop redpacket''s tables while they hold money records (see redpacket.allow_drop).';

-- [life] Publication for wallets and CDC ------------------------------------------
-- Claims and ledger entries as a logical-replication stream for a wallet
-- service or a Debezium-style consumer (README "Crediting wallets").  Made
-- here, or completed when it survived a DROP EXTENSION.  PostgreSQL 15 cannot
-- make a publication an extension member, so the publication keeper (event
-- triggers below, src/guard.c) puts claim and ledger back into it when a
-- dump recreates it.  It needs wal_level = logical only when someone
-- subscribes; PostgreSQL's warning about that is silenced here and
-- documented instead.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication
                    WHERE pubname OPERATOR(pg_catalog.=) 'redpacket_events') THEN
        SET LOCAL client_min_messages = error;
        CREATE PUBLICATION redpacket_events FOR TABLE redpacket.claim, redpacket.ledger;
    ELSE
        ALTER PUBLICATION redpacket_events ADD TABLE redpacket.claim, redpacket.ledger;
    END IF;
END
$$;
COMMENT ON PUBLICATION redpacket_events IS
    'Every claim and ledger entry, for subscribers that credit wallets; consumers are idempotent on (activity_id, claim_id) for claims and (activity_id, entry_id) for ledger entries. Kept by the redpacket_publication_* event triggers.';

CREATE FUNCTION redpacket.rp_publication_keeper() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'rp_publication_keeper'
LANGUAGE C SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION redpacket.rp_publication_keeper() IS
    'Event trigger function: when CREATE PUBLICATION redpacket_events runs (a restored dump), replaces the one the extension made and puts claim and ledger into it.';
REVOKE ALL ON FUNCTION redpacket.rp_publication_keeper() FROM PUBLIC;

CREATE EVENT TRIGGER redpacket_publication_start ON ddl_command_start
    WHEN TAG IN ('CREATE PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
CREATE EVENT TRIGGER redpacket_publication_end ON ddl_command_end
    WHEN TAG IN ('CREATE PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
COMMENT ON EVENT TRIGGER redpacket_publication_start IS
    'Before CREATE PUBLICATION redpacket_events (from a dump): drops the one CREATE EXTENSION made.';
COMMENT ON EVENT TRIGGER redpacket_publication_end IS
    'After CREATE PUBLICATION redpacket_events (from a dump): puts redpacket.claim and redpacket.ledger into it.';
