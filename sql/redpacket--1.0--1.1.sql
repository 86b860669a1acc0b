-- redpacket 1.0 -> 1.1.  Every change here is also in redpacket--1.1.sql, and
-- test/t/010_upgrade.pl proves that an upgraded database equals a fresh 1.1.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.1'" to load this file. \quit
