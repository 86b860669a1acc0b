-- redpacket 1.3 -> 1.4.  Every change here is also in redpacket--1.4.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0, 1.1, 1.2 or
-- 1.3 equals a fresh 1.4.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.4'" to load this file. \quit

-- [pg18] Restoring a dump of PostgreSQL 18's pg_dump ----------------------------
-- That pg_dump also writes the publication's tables (ALTER PUBLICATION
-- redpacket_events ADD TABLE ONLY redpacket.claim, ... after the CREATE
-- PUBLICATION, which the keeper has completed already): before such a
-- command the keeper drops the table from the publication when the keeper
-- put it there (no column list, no row filter), and the command adds it.
CREATE EVENT TRIGGER redpacket_publication_alter ON ddl_command_start
    WHEN TAG IN ('ALTER PUBLICATION')
    EXECUTE FUNCTION redpacket.rp_publication_keeper();
COMMENT ON EVENT TRIGGER redpacket_publication_alter IS
    'Before ALTER PUBLICATION redpacket_events ADD TABLE redpacket.claim or redpacket.ledger (from a dump): drops the table from the publication if it is in it without a column list or row filter, so that the command adds it instead of failing.';
COMMENT ON FUNCTION redpacket.rp_publication_keeper() IS
    'Event trigger function: when CREATE PUBLICATION redpacket_events runs (a restored dump), replaces the one the extension made and puts claim and ledger into it; before ALTER PUBLICATION redpacket_events ADD TABLE of claim or ledger, takes out the copy it put in.';
