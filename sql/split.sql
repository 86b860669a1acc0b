-- How an activity's claims are paid is one of its terms: lucky (the server
-- draws), equal (every packet total / packets) or caller (each claim names
-- its amount); omitted, any (an amount named is paid, none draws).  The
-- funder is kept on the activity and on every entry that moves money from
-- or to it; a creation retried with the same funder and request id returns
-- the activity it made and funds nothing.
SET client_min_messages = warning;
-- an error as its SQLSTATE, message, detail and hint, the activity ids
-- (which depend on the tests before) as N
CREATE FUNCTION pg_temp.try(q text) RETURNS TABLE (code text, message text, detail text, hint text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN QUERY SELECT 'ok', NULL::text, NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN QUERY SELECT code, regexp_replace(message, 'activity [0-9]+', 'activity N', 'g'), detail, hint;
END $$;

-- lucky: a named amount is refused, nothing written
SELECT redpacket.rp_create_activity(1.00, 10, stripes => 2, split => 'lucky', funder => 'alice') AS lucky \gset
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_claim(%s, ''greedy'', 0.95)', :lucky));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_claim_batch(%s, ARRAY[''g1'', ''g2''], ARRAY[NULL, 0.05]::numeric[])', :lucky));
SELECT count(*) AS claims_written FROM redpacket.claim WHERE activity_id = :lucky;
SELECT (redpacket.rp_claim(:lucky, 'm1')).status, (redpacket.rp_claim(:lucky, 'm1')).status AS again;
SELECT state, remaining_packets, split, funder FROM redpacket.activity_status WHERE id = :lucky;
SELECT redpacket.rp_create_activity(1.00, split => 'lucky');

-- equal: every packet the same share; the stripes hold exactly their packets
SELECT redpacket.rp_create_activity(1.00, 3, split => 'equal');
SELECT redpacket.rp_create_activity(1.00, split => 'equal');
SELECT redpacket.rp_create_activity(1.20, 12, stripes => 5, split => 'equal', funder => 'bob') AS equal \gset
SELECT stripe, balance, packets FROM redpacket.stripe WHERE activity_id = :equal ORDER BY stripe;
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_claim(%s, ''e0'', 0.10)', :equal));
SELECT amount, count(*) FROM (SELECT (redpacket.rp_claim(:equal, 'e' || g)).amount
                                FROM generate_series(1, 13) g) c GROUP BY amount ORDER BY amount NULLS LAST;
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_top_up(%s, 0.25, 2)', :equal));
SELECT redpacket.rp_top_up(:equal, 0.20, 2);
SELECT (redpacket.rp_claim(:equal, 'late1')).amount, (redpacket.rp_claim(:equal, 'late2')).amount,
       (redpacket.rp_claim(:equal, 'late3')).status;
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_withdraw(%s, 0.10)', :equal));

-- caller: every claim names its amount
SELECT redpacket.rp_create_activity(5.00, 5, split => 'caller') AS caller \gset
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_claim(%s, ''c1'')', :caller));
SELECT (redpacket.rp_claim(:caller, 'c1', 2.00)).amount;
SELECT redpacket.rp_create_activity(5.00, split => 'bogus');

-- omitted: 1.5's behaviour, any
SELECT redpacket.rp_create_activity(5.00, 5) AS old \gset
SELECT (redpacket.rp_claim(:old, 'o1', 1.00)).amount, (redpacket.rp_claim(:old, 'o2')).status;
SELECT split, funder, request_id FROM redpacket.activity WHERE id = :old;
SELECT split, funder FROM redpacket.rp_activity_info(:lucky);

-- the funder on every entry that moves its money
SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, funder => 'carol') AS f \gset
SELECT redpacket.rp_top_up(:f, 2.00, 2);
SELECT redpacket.rp_withdraw(:f, 1.00);
SELECT (redpacket.rp_claim(:f, 'x', 1.00)).status;
SELECT redpacket.rp_close_activity(:f);
SELECT redpacket.rp_reverse(:f, (SELECT claim_id FROM redpacket.claim WHERE activity_id = :f), 'fraud') IS NOT NULL AS reversed;
SELECT kind, amount, funder FROM redpacket.ledger WHERE activity_id = :f ORDER BY entry_id;

-- a retried creation: the same activity, funded once
SELECT redpacket.rp_create_activity(8.00, 4, funder => 'dave', request_id => 'r-1', split => 'lucky') AS r1 \gset
SELECT redpacket.rp_create_activity(8.00, 4, funder => 'dave', request_id => 'r-1', split => 'lucky',
                                    starts_at => now() + interval '1 second') = :r1 AS same_activity;
SELECT count(*) AS funded_once FROM redpacket.ledger WHERE activity_id = :r1;
SELECT count(*) AS activities FROM redpacket.activity WHERE request_id = 'r-1';
-- other terms under the same key: an error
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_create_activity(9.00, 4, funder => ''dave'', request_id => ''r-1'', split => ''lucky'')'));
SELECT * FROM pg_temp.try(format('SELECT redpacket.rp_create_activity(8.00, 4, funder => ''dave'', request_id => ''r-1'')'));
-- another funder's request of the same id, and a request without a funder
SELECT redpacket.rp_create_activity(8.00, 4, funder => 'erin', request_id => 'r-1', split => 'lucky') <> :r1 AS other_funder;
SELECT redpacket.rp_create_activity(3.00, request_id => 'anon') AS anon \gset
SELECT redpacket.rp_create_activity(3.00, request_id => 'anon') = :anon AS anon_same;
SELECT redpacket.rp_create_activity(3.00, funder => '');
SELECT redpacket.rp_create_activity(3.00, request_id => repeat('x', 257));
SELECT count(*) AS checked, bool_and(ok) AS all_ok FROM redpacket.rp_verify(NULL, true) WHERE activity_id >= :lucky;

-- a retry in a session that has not read the activity's split yet still
-- answers duplicate after the activity ended (reading the split must not
-- lose the claim found)
SELECT redpacket.rp_create_activity(2.00, 2, funder => 'dora') AS r \gset
SELECT (redpacket.rp_claim(:r, 'alice', 1.25)).status;
SELECT redpacket.rp_close_activity(:r);
\c
SELECT status, amount FROM redpacket.rp_claim(:r, 'alice', 1.25);
SELECT status, amount FROM redpacket.rp_claim(:r, 'alice', 1.25);
