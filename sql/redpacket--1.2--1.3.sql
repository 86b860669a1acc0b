-- redpacket 1.2 -> 1.3.  Every change here is also in redpacket--1.3.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0, 1.1 or 1.2
-- equals a fresh 1.3.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.3'" to load this file. \quit

-- rp_claim keeps SECURITY DEFINER but loses its SET search_path: the C code
-- pins the path itself, at a GUC nest level of its own, before it runs any
-- statement or evaluates any user-defined expression (src/base.c,
-- RpPinSearchPath), and pops it when the call returns.  The fast path, which
-- does neither, no longer pays for the SET (about 4% of its CPU).
ALTER FUNCTION redpacket.rp_claim(bigint, text, numeric, text) RESET search_path;
