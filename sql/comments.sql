-- Every object of the extension has a COMMENT: the schema, each table, view
-- and sequence, every column of a table or view, each function and each
-- type.  Lists any that has none (the expected output is empty).  Members
-- come from pg_depend, so an object added by any later script is checked too.
-- A table's row type and an array type are part of the table or element type
-- that carries the comment: PostgreSQL 18 lists them as members too, 15 does
-- not, and neither is checked.
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'redpacket'),
members AS (
    SELECT d.classid, d.objid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
objs AS (
    SELECT 'schema ' || n.nspname AS object, obj_description(n.oid, 'pg_namespace') AS descr
      FROM pg_namespace n WHERE n.nspname = 'redpacket'
    UNION ALL
    SELECT CASE c.relkind WHEN 'r' THEN 'table ' WHEN 'v' THEN 'view ' WHEN 'S' THEN 'sequence '
                          WHEN 'm' THEN 'materialized view ' ELSE 'relation ' END || c.oid::regclass,
           obj_description(c.oid, 'pg_class')
      FROM members m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    UNION ALL
    SELECT 'column ' || c.oid::regclass || '.' || quote_ident(a.attname), col_description(c.oid, a.attnum)
      FROM members m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure, obj_description(p.oid, 'pg_proc')
      FROM members m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
    UNION ALL
    SELECT 'type ' || t.oid::regtype, obj_description(t.oid, 'pg_type')
      FROM members m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
     WHERE NOT EXISTS (SELECT FROM pg_type e WHERE e.typarray = t.oid)
       AND NOT EXISTS (SELECT FROM pg_class r WHERE r.oid = t.typrelid AND r.relkind <> 'c')
)
SELECT object FROM objs WHERE descr IS NULL OR descr = '' ORDER BY object COLLATE "C";
