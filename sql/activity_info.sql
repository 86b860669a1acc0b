-- rp_activity_info: what an application may read about one activity (state,
-- remaining amount and packets, schedule, today's funded total and packet
-- cap, and with a user whether that user is eligible), granted by
-- rp_grant_app, and the counters' behaviour on a server that did not
-- preload redpacket (this one): activity_stats is empty and rp_stats_reset
-- forgets nothing.
SET client_min_messages = warning;

SELECT redpacket.rp_create_activity(10.00, 4, starts_at => '2020-01-01', stripes => 2, name => 'info') AS a \gset
SELECT * FROM redpacket.rp_activity_info(:a);
SELECT (redpacket.rp_claim(:a, 'u1', 2.50)).status;
SELECT state, remaining_amount, remaining_packets FROM redpacket.rp_activity_info(:a);
SELECT (redpacket.rp_claim(:a, 'u' || g, 0.01)).status FROM generate_series(2, 4) g;
SELECT state, remaining_amount, remaining_packets FROM redpacket.rp_activity_info(:a);
SELECT redpacket.rp_freeze(:a, 'check');
SELECT state FROM redpacket.rp_activity_info(:a);
SELECT redpacket.rp_create_activity(5.00, starts_at => now() + interval '1 day') AS later \gset
SELECT state, remaining_amount, remaining_packets IS NULL AS no_cap FROM redpacket.rp_activity_info(:later);
SELECT redpacket.rp_close_activity(:later);
SELECT state, remaining_amount FROM redpacket.rp_activity_info(:later);

-- errors: unknown activity (P0002), NULL
\set VERBOSITY sqlstate
SELECT * FROM redpacket.rp_activity_info(-1);
SELECT * FROM redpacket.rp_activity_info(NULL);
\set VERBOSITY default

-- an application role gets it through rp_grant_app, and still no table
CREATE ROLE regress_rp_info_app;
SELECT redpacket.rp_grant_app('regress_rp_info_app');
SET ROLE regress_rp_info_app;
SELECT state, remaining_amount, remaining_packets FROM redpacket.rp_activity_info(:a);
SELECT eligible FROM redpacket.rp_activity_info(:a, 'u1');
\set VERBOSITY sqlstate
SELECT count(*) FROM redpacket.activity;
SELECT count(*) FROM redpacket.activity_stats;
\set VERBOSITY default
RESET ROLE;
SELECT has_function_privilege('regress_rp_info_app', 'redpacket.rp_activity_info(bigint, text)', 'EXECUTE') AS app_info,
       has_function_privilege('regress_rp_info_app', 'redpacket.rp_stats_reset(bigint)', 'EXECUTE') AS app_reset,
       has_function_privilege('public', 'redpacket.rp_activity_info(bigint, text)', 'EXECUTE') AS public_info;

-- an operator role gets the counters
CREATE ROLE regress_rp_info_op;
SELECT redpacket.rp_grant_operator('regress_rp_info_op');
SET ROLE regress_rp_info_op;
SELECT count(*) FROM redpacket.activity_stats;
SELECT redpacket.rp_stats_reset();
RESET ROLE;

-- not preloaded: claims above were answered, yet nothing is counted
SHOW shared_preload_libraries;
SELECT count(*) FROM redpacket.activity_stats;
SELECT redpacket.rp_stats_reset(:a);

DROP OWNED BY regress_rp_info_app, regress_rp_info_op;
DROP ROLE regress_rp_info_app, regress_rp_info_op;
