# On a streaming standby the workers do nothing: no redpacket launcher or
# reconciler process, nothing in its log, while activity_status shows the primary's
# numbers (passes included) after catch-up and rp_claim fails with SQLSTATE
# 25006 (read-only transaction).  Once the standby is promoted the launcher
# starts there and its reconcilers reconcile.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION redpacket');

my $aid = $primary->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(50.00, 10, stripes => 4, name => 'replicated')"
);
$primary->safe_psql('postgres',
	"SELECT redpacket.rp_claim($aid, 'u' || g, 2.50) FROM generate_series(1, 3) g");
$primary->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND ok AND expected_claims = 3"
) or die 'primary worker did not reconcile';

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->start;

my $worker_q =
  "SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('redpacket launcher', 'redpacket reconciler')";
my $launcher_q =
  "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'redpacket launcher'";

# More claims and passes on the primary while the standby streams.
$primary->safe_psql('postgres', "SELECT redpacket.rp_claim($aid, 'late', 1.00)");
$primary->safe_psql('postgres', "SELECT redpacket.rp_claim($aid, 'lucky')");
$primary->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND expected_claims = 5"
) or die 'primary worker did not reconcile the new claims';

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'standby is in recovery');
is($standby->safe_psql('postgres', "SELECT string_agg(setting, ',' ORDER BY name) FROM pg_settings WHERE name IN ('shared_preload_libraries', 'redpacket.reconcile_interval')"),
	'1,redpacket', 'standby has the same preload and interval');
sleep 3;    # several intervals
is($standby->safe_psql('postgres', $worker_q),
	'0', 'no redpacket launcher or reconciler process on the standby');
is($primary->safe_psql('postgres', $launcher_q),
	'1', 'the primary has its launcher');

# Freeze the primary's passes so both sides can be compared row for row.
$primary->safe_psql('postgres',
	'ALTER SYSTEM SET redpacket.reconcile_interval = 0');
$primary->reload;
sleep 2;
$primary->wait_for_catchup($standby);

my $status_q = qq{
SELECT id, name, state, scale, total, claimed_amount, claimed_count, remaining_amount,
       remaining_packets, stripes, starts_at, ends_at, last_reconciled_at, last_reconcile_ok
  FROM redpacket.activity_status ORDER BY id};
my $on_primary = $primary->safe_psql('postgres', $status_q);
like($on_primary, qr/^$aid\|replicated\|active\|2\|50\.00\|\d+\.\d\d\|5\|\d+\.\d\d\|5\|4\|.*\|t$/,
	'primary activity_status as expected');
is($standby->safe_psql('postgres', $status_q),
	$on_primary, 'standby activity_status has the same numbers as the primary');
is( $standby->safe_psql(
		'postgres', 'SELECT count(*), max(pass_id) FROM redpacket.reconciliation'),
	$primary->safe_psql(
		'postgres', 'SELECT count(*), max(pass_id) FROM redpacket.reconciliation'),
	'standby sees every reconciliation row of the primary, and no more');

# Nothing in the standby's log so far: no reconciler, no error or warning.
my $log_before_claims = -s $standby->logfile;
unlike(slurp_file($standby->logfile),
	qr/(?:ERROR|WARNING|FATAL|PANIC):|redpacket launcher started/,
	'standby log: no reconciler, no error');

# Claims on the standby fail with 25006, and nothing changes.
my ($ret, $out, $err) = $standby->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT redpacket.rp_claim($aid, 'on-standby', 1.00)");
isnt($ret, 0, 'rp_claim on the standby fails');
like($err, qr/ERROR:  25006:/, 'rp_claim on the standby fails with SQLSTATE 25006');
like($err, qr/cannot execute rp_claim\(\) in a read-only transaction/,
	'rp_claim says so up front, naming itself');
unlike($err, qr/CONTEXT:/, 'rp_claim refuses before running any statement of its own');
($ret, $out, $err) = $standby->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT * FROM redpacket.rp_claim_batch($aid, ARRAY['s1', 's2'], ARRAY[1.00, 1.00])");
like($err, qr/ERROR:  25006:/, 'rp_claim_batch on the standby fails with SQLSTATE 25006');
like($err, qr/cannot execute rp_claim_batch\(\) in a read-only transaction/,
	'rp_claim_batch says so up front, naming itself');
unlike($err, qr/CONTEXT:/, 'rp_claim_batch refuses before running any statement of its own');
is($standby->safe_psql('postgres', $status_q),
	$on_primary, 'nothing changed on the standby');

my @errors = slurp_file($standby->logfile, $log_before_claims) =~ /(ERROR|FATAL|PANIC):  (.*)/g;
is(scalar(@errors), 4, 'standby log: just the two refused claims');
like(join(' ', @errors), qr/read-only/, 'standby log: they were refused as read-only');

# Promotion finishes recovery: the worker starts and reconciles there.
$primary->stop('fast');
$standby->promote;
ok($standby->poll_query_until('postgres', "SELECT ($launcher_q) = 1"),
	'after promotion the launcher starts on the new primary');
my $max = $standby->safe_psql('postgres', 'SELECT max(pass_id) FROM redpacket.reconciliation');
is($standby->safe_psql('postgres', "SELECT status FROM redpacket.rp_claim($aid, 'after-promote', 1.00)"),
	'claimed', 'after promotion rp_claim works');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND pass_id > $max AND ok AND expected_claims = 6"
	),
	'after promotion the worker reconciles, ok, with the new claim');

$standby->stop('fast');
done_testing();
