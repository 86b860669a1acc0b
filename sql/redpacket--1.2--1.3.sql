-- redpacket 1.2 -> 1.3.  Every change here is also in redpacket--1.3.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0, 1.1 or 1.2
-- equals a fresh 1.3.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.3'" to load this file. \quit

-- rp_claim keeps SECURITY DEFINER but loses its SET search_path: the C code
-- pins the path itself, at a GUC nest level of its own, before it runs any
-- statement or evaluates anything a user wrote (src/base.c,
-- RpPinSearchPath), and pops it when the call returns.  The fast path, which
-- does neither, no longer pays for the SET (about 4% of its CPU).  It is
-- bound to a symbol new in 1.3, rp_claim_v13: a backend that still runs a
-- library older than 1.3 (loaded before the new build was installed) cannot
-- find it and refuses the call instead of running it unpinned.  CREATE OR
-- REPLACE keeps the function's OID, owner, privileges and comment.
CREATE OR REPLACE FUNCTION redpacket.rp_claim(
    activity   bigint,
    user_id    text,
    amount     numeric DEFAULT NULL,
    request_id text DEFAULT NULL)
RETURNS redpacket.claim_result
AS 'MODULE_PATHNAME', 'rp_claim_v13'
LANGUAGE C VOLATILE SECURITY DEFINER;
