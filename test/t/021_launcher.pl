# The launcher reconciles every database with the extension, with no
# redpacket.database set: two databases both get passes and have their
# expired activity settled; DROP EXTENSION in one stops its reconciling (and
# CREATE EXTENSION starts it again); CREATE DATABASE ... TEMPLATE and DROP
# DATABASE of a served database are never blocked by our workers; with
# redpacket.max_workers = 1 and a pass held up by a lock, the databases left
# waiting are reported by a clear log line.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node(
	'launcher', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
max_locks_per_transaction = 256
});

is($node->safe_psql('postgres', 'SHOW redpacket.database'),
	'', 'redpacket.database is not set');

my %act;
for my $db ('db1', 'db2')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION redpacket');
	# an activity that expires in two seconds, with one claim
	$act{$db} = $node->safe_psql($db,
		"SELECT redpacket.rp_create_activity(90.00, 10, ends_at => now() + interval '2 s', stripes => 2)"
	);
	$node->safe_psql($db, "SELECT redpacket.rp_claim($act{$db}, 'early', 1.00)");
}

# --- both databases get passes and settlements --------------------------------

for my $db ('db1', 'db2')
{
	my $a = $act{$db};
	ok( $node->poll_query_until(
			$db,
			"SELECT count(*) > 0 AND bool_and(ok) FROM redpacket.reconciliation WHERE activity_id = $a"
		),
		"$db: the reconciler recorded ok passes");
	ok( $node->poll_query_until(
			$db, qq{
SELECT a.closed_at IS NOT NULL AND l.amount = 89.00
  FROM redpacket.activity a
  JOIN redpacket.ledger l ON l.activity_id = a.id AND l.kind = 'return'
 WHERE a.id = $a}),
		"$db: the expired activity was settled (89.00 returned)");
}
ok($node->log_contains(qr/redpacket launcher: reconciling database "db1"/),
	'the log names db1 as reconciled');
ok($node->log_contains(qr/redpacket launcher: reconciling database "db2"/),
	'the log names db2 as reconciled');
ok(!$node->log_contains(qr/redpacket launcher: reconciling database "template1"/),
	'no reconciling where the extension is not installed');

# --- DROP EXTENSION stops it, CREATE EXTENSION starts it again --------------

my $log_offset = -s $node->logfile;
$node->safe_psql('db2', 'SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
ok( $node->wait_for_log(
		qr/redpacket launcher: the extension is gone from database "db2": stopped reconciling it/,
		$log_offset),
	'DROP EXTENSION in db2 stops its reconciling');
my $d1 = $node->safe_psql('db1', "SELECT redpacket.rp_create_activity(5.00, 5, stripes => 1)");
$node->safe_psql('db1', "SELECT redpacket.rp_claim($d1, 'still', 1.00)");
ok( $node->poll_query_until(
		'db1',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $d1 AND expected_claims = 1"
	),
	'db1 is still reconciled');
$log_offset = -s $node->logfile;
$node->safe_psql('db2', 'CREATE EXTENSION redpacket');
ok( $node->wait_for_log(
		qr/redpacket launcher: reconciling database "db2"/, $log_offset),
	'CREATE EXTENSION in db2 starts it again');
my $d2 = $node->safe_psql('db2', "SELECT redpacket.rp_create_activity(5.00, 5, stripes => 1)");
$node->safe_psql('db2', "SELECT redpacket.rp_claim($d2, 'again', 1.00)");
ok( $node->poll_query_until(
		'db2',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $d2 AND expected_claims = 1"
	),
	'db2 is reconciled again');

# --- CREATE DATABASE ... TEMPLATE and DROP DATABASE are not blocked ----------

# A reconciler visits each database every second; a worker that stayed
# connected would make these fail ("source database is being accessed by
# other users" after 5 s).  Repeat so that passes are running meanwhile.
for my $i (1 .. 5)
{
	my ($ret, $out, $err) =
	  $node->psql('postgres', "CREATE DATABASE copy$i TEMPLATE db1");
	is($ret, 0, "CREATE DATABASE copy$i TEMPLATE db1 succeeds") or diag $err;
	($ret, $out, $err) = $node->psql('postgres', "DROP DATABASE copy$i");
	is($ret, 0, "DROP DATABASE copy$i succeeds") or diag $err;
}
my ($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE db2');
is($ret, 0, 'DROP DATABASE of a served database succeeds') or diag $err;
is( $node->safe_psql('db1',
		"SELECT count(*) FROM redpacket.reconciliation WHERE activity_id = $act{db1}") > 0,
	1, 'db1 untouched');

# --- max_workers too small -------------------------------------------------------

$node->append_conf('postgresql.conf', 'redpacket.max_workers = 1');
$node->restart;
# (no packet cap: a claim of an amount takes one stripe, where in a lucky
# draw, whose money is dealt, it would gather every stripe)
my $held_act = $node->safe_psql('db1', "SELECT redpacket.rp_create_activity(100.00, stripes => 4)");
$node->poll_query_until('db1',
	"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $held_act")
  or die 'db1 not reconciled after restart';
$log_offset = -s $node->logfile;
# a claim in flight holds a stripe; a committed claim makes the pass
# check this activity, so db1's reconciler waits for the stripe lock
my $held = $node->background_psql('db1');
$held->query_safe("BEGIN; SELECT redpacket.rp_claim($held_act, 'held', 1.00)");
$node->safe_psql('db1', "SELECT redpacket.rp_claim($held_act, 'quick', 1.00)");
ok( $node->poll_query_until(
		'db1',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'redpacket reconciler' AND wait_event_type = 'Lock'"
	),
	'max_workers = 1: the one reconciler waits for a lock');
ok( $node->wait_for_log(
		qr/LOG:  redpacket.max_workers \(1\) is too small: \d+ database\(s\) waited a whole redpacket.reconcile_interval/,
		$log_offset),
	'the databases left waiting are reported');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'redpacket reconciler'"),
	'1', 'never more than redpacket.max_workers reconcilers');
$held->query_safe('COMMIT');
$held->quit;
my $after = $node->safe_psql('db1', "SELECT redpacket.rp_create_activity(5.00, 5, stripes => 1)");
$node->safe_psql('db1', "SELECT redpacket.rp_claim($after, 'later', 1.00)");
ok( $node->poll_query_until(
		'db1',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $after AND expected_claims = 1"
	),
	'once the lock is gone the reconcilers catch up');

ok(!$node->log_contains(qr/PANIC|terminated by signal/), 'no crash');
$node->stop('fast');
done_testing();
