# A reconciler that never runs is visible.  With max_worker_processes too
# small for any reconciler (the launcher takes the only slot), no pass ever
# runs: reconciler_status says overdue once two intervals went by since the
# extension came (next_due_at in the past, seconds_overdue growing, in the
# view and in the shipped Prometheus query), and the log names
# max_worker_processes, not redpacket.max_workers.  Without preloading, a
# session that loads the library sees the same: overdue, and no launcher.
# Once the reconciler runs, it is not overdue any more.
use strict;
use warnings;

use CPAN::Meta::YAML;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $yaml = CPAN::Meta::YAML->read_string(
	RedpacketTest::repo_file('examples/monitoring/redpacket_queries.yaml'))
  or die CPAN::Meta::YAML->errstr;
my $reconciler_q = $yaml->[0]{redpacket_reconciler}{query};

# The shipped Prometheus query's overdue and seconds_overdue.
sub prometheus
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT overdue, seconds_overdue > 0 FROM ($reconciler_q) q");
}

# --- no worker slot for a reconciler --------------------------------------------

my $node = RedpacketTest::node(
	'no_slot', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
max_worker_processes = 1
max_logical_replication_workers = 0
max_parallel_workers = 0
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');
$node->safe_psql('postgres', 'SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2)');

ok( $node->poll_query_until('postgres',
		'SELECT overdue FROM redpacket.reconciler_status'),
	'no worker slot: reconciler_status says overdue after two intervals');
is( $node->safe_psql(
		'postgres', q{
SELECT last_pass_finished_at IS NULL, next_due_at < now(), launcher_running, passes
  FROM redpacket.reconciler_status}),
	't|t|t|0',
	'no pass ever ran: next_due_at is in the past, though the launcher runs');
is(prometheus($node), '1|t', 'the Prometheus query says overdue, seconds_overdue > 0');
my $before = $node->safe_psql('postgres',
	'SELECT extract(epoch FROM now() - next_due_at) FROM redpacket.reconciler_status');
sleep 2;
cmp_ok(
	$node->safe_psql('postgres',
		'SELECT extract(epoch FROM now() - next_due_at) FROM redpacket.reconciler_status'),
	'>', $before, 'and seconds overdue keep growing');
ok( $node->wait_for_log(
		qr/LOG:  redpacket: \d+ database\(s\) waited a whole redpacket.reconcile_interval \(1 s\) for a reconciler: no background worker slot was free\n.*HINT:  Raise max_worker_processes \(1 now/
	),
	'the log names max_worker_processes');
ok(!$node->log_contains(qr/redpacket.max_workers \(\d+\) is too small/),
	'and does not blame redpacket.max_workers');

# a slot for the reconcilers: passes run, and it is not overdue any more
$node->append_conf('postgresql.conf', 'max_worker_processes = 4');
$node->restart;
ok( $node->poll_query_until('postgres',
		'SELECT passes > 0 AND NOT overdue FROM redpacket.reconciler_status'),
	'with a slot the reconciler runs and is not overdue');
is(prometheus($node), '0|f', 'the Prometheus query agrees');
$node->stop;

# --- not preloaded: a session that loads the library -------------------------

my $plain = RedpacketTest::node('not_preloaded', 'redpacket.reconcile_interval = 1');
$plain->safe_psql('postgres', 'CREATE EXTENSION redpacket');
sleep 3;
is( $plain->safe_psql(
		'postgres', q{
SELECT redpacket.rp_create_activity(1.00) > 0;
SELECT overdue, launcher_running, next_due_at IS NOT NULL FROM redpacket.reconciler_status}),
	"t\nt|f|t",
	'not preloaded, in a session that loaded the library: overdue, no launcher');
is( $plain->safe_psql('postgres', 'SELECT overdue FROM redpacket.reconciler_status'),
	't', 'and in a session that did not load it');
# pg_cron-like passes make it current
$plain->safe_psql('postgres', 'SELECT count(*) FROM redpacket.rp_reconcile()');
is( $plain->safe_psql('postgres', 'SELECT overdue FROM redpacket.reconciler_status'),
	'f', 'a pass over all (rp_reconcile) makes it current');
$plain->stop;

done_testing();
