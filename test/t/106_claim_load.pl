# Claims that need many locks, under load:
#   1. a claim that needs several stripes (more than any one holds) is paid
#      in bounded time while other clients keep claiming: it waits for the
#      stripes in order instead of trying to catch them all free at once;
#   2. a batch of thousands of users takes a bounded number of locks, so on
#      a server with the default lock table it neither fails with 53200
#      nor, held open, makes unrelated sessions fail.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(time);

my $LOAD_SECONDS = 25;
my $GATHER_LIMIT = 12;    # seconds a gathering claim may take at most

# the default lock table: max_locks_per_transaction = 64
my $node = RedpacketTest::node('load', "max_connections = 40\n");
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

# 1. Gathering under load -----------------------------------------------------
# 8 stripes of 125.00; 16 clients claim 0.01 each, new users every time,
# and hold their stripe a few milliseconds (as an application does that
# writes more in the same transaction), so some stripe is always busy.
my $act = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(1000.00, stripes => 8, name => 'load')");
my $tmp = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$tmp/claim.pgbench") or die;
print $fh "\\set u random(1, 1000000000)\n";
print $fh "BEGIN;\n";
print $fh "SELECT status FROM redpacket.rp_claim($act, 'load-' || :u || '-' || :client_id, 0.01);\n";
print $fh "SELECT pg_sleep(0.005);\n";
print $fh "COMMIT;\n";
close $fh;
my ($pb_out, $pb_err);
my $load_start = time;
my $pgbench = IPC::Run::start(
	[   $node->installed_command('pgbench'), '-n', '-c', '16', '-j', '2',
		'-T', $LOAD_SECONDS, '-f', "$tmp/claim.pgbench", $node->connstr('postgres') ],
	'>', \$pb_out, '2>', \$pb_err);
$node->poll_query_until('postgres',
	"SELECT count(*) > 100 FROM redpacket.claim WHERE activity_id = $act") or die;

# three claims of 200.00 each need at least two stripes
for my $i (1 .. 3)
{
	my $t0 = time;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '${GATHER_LIMIT}s'; "
		  . "SELECT status FROM redpacket.rp_claim($act, 'big-$i', 200.00)");
	my $took = time - $t0;
	is($out, 'claimed', "gathering claim $i is paid under load")
	  or diag("rc $rc, stderr: $err");
	note(sprintf('gathering claim %d took %.2f s', $i, $took));
	ok(time - $load_start < $LOAD_SECONDS - 1,
		"gathering claim $i finished while the load was still running");
}
$pgbench->finish;
is($pgbench->result(0), 0, 'the load ran without error') or diag($pb_err);
is( $node->safe_psql(
		'postgres', "SELECT bool_and(ok) FROM redpacket.rp_reconcile($act, true)"),
	't',
	'the books balance after the load');

# 2. A batch of many users ------------------------------------------------------
my $big = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(1000.00, stripes => 4, name => 'big batch')");
my $batch = "SELECT status, count(*) FROM redpacket.rp_claim_batch($big, "
  . "ARRAY(SELECT 'u' || g FROM generate_series(1, 9500) g), "
  . "array_fill(0.01::numeric, ARRAY[9500])) GROUP BY status";
my ($rc, $out, $err) = $node->psql('postgres', $batch);
is($out, 'claimed|9500', 'a batch of 9,500 users is claimed') or diag($err);

# held open: other sessions still get locks
my $held = $node->background_psql('postgres');
$held->query_safe("BEGIN; "
	  . "SELECT count(*) FROM redpacket.rp_claim_batch($big, "
	  . "ARRAY(SELECT 'v' || g FROM generate_series(1, 9500) g), "
	  . "array_fill(0.01::numeric, ARRAY[9500]))");
($rc, $out, $err) = $node->psql('postgres',
	'CREATE TEMP TABLE t AS SELECT g FROM generate_series(1, 10) g; SELECT count(*) FROM t');
is($out, '10', 'an unrelated session creates a temporary table meanwhile') or diag($err);
$held->query_safe('COMMIT');
$held->quit;

($rc, $out, $err) = $node->psql('postgres',
	"SELECT count(*) FROM redpacket.rp_claim_batch($big, "
	  . "ARRAY(SELECT 'w' || g FROM generate_series(1, 10001) g))");
like($err, qr/a batch of 10001 claims is too large/, 'a batch over the limit is refused');
is( $node->safe_psql(
		'postgres', "SELECT bool_and(ok) FROM redpacket.rp_reconcile($big, true)"),
	't',
	'the books balance after the batches');

$node->stop;
done_testing();
