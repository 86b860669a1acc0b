-- CPU per claim and memory of one backend.  cpu_rp_claim.pgbench and
-- cpu_ceiling.pgbench (pgbench -c 1 -t N) make N claims, or N ceiling
-- inserts, in a row, one transaction each, and call bench.cpu_sample from
-- time to time: the backend samples itself, as top-level statements (a
-- plpgsql loop with COMMIT would add memory of its own to what is measured):
-- its CPU time (/proc/self/stat utime + stime, in clock ticks), its memory
-- (/proc/self/smaps_rollup: Rss, Pss, and Anonymous = private memory, which
-- leaves out the shared buffers it touched) and the total of its memory
-- contexts.  Needs superuser (pg_read_file of /proc).
CREATE TABLE bench.cpu_sample (
    kind      text NOT NULL,
    ops       bigint NOT NULL,
    at        timestamptz NOT NULL,
    cpu_ticks bigint NOT NULL,
    rss_kb    bigint NOT NULL,
    pss_kb    bigint NOT NULL,
    anon_kb   bigint NOT NULL,
    ctx_bytes bigint NOT NULL
);

CREATE FUNCTION bench.proc_kb(p_text text, p_field text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (regexp_match(p_text, '(?:^|\n)' || p_field || ':\s+(\d+) kB'))[1]::bigint
$$;

CREATE FUNCTION bench.cpu_sample(p_kind text, p_ops bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    smaps text := pg_read_file('/proc/self/smaps_rollup');
    stat text := pg_read_file('/proc/self/stat');
    f text[];
BEGIN
    -- after "pid (comm) ", field 3 (state) is f[1]: utime (14) is f[12],
    -- stime (15) is f[13]
    f := regexp_split_to_array(substr(stat, strpos(stat, ') ') + 2), ' ');
    INSERT INTO bench.cpu_sample
    SELECT p_kind, p_ops, clock_timestamp(), f[12]::bigint + f[13]::bigint,
           bench.proc_kb(smaps, 'Rss'), bench.proc_kb(smaps, 'Pss'),
           bench.proc_kb(smaps, 'Anonymous'),
           (SELECT sum(total_bytes) FROM pg_backend_memory_contexts);
END;
$$;
