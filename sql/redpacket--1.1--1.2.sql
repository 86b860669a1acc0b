-- redpacket 1.1 -> 1.2.  Every change here is also in redpacket--1.2.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0 or from 1.1
-- equals a fresh 1.2.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.2'" to load this file. \quit
