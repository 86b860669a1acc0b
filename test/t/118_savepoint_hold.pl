# A savepoint rolled back gives back the locks its claim took, and with
# them the transaction's hold on the activity.  A walk the transaction
# makes afterwards (a freeze) is a first call on the activity: it takes
# the activity lock exclusively, as any walker, and never holds a stripe
# without it.  A close from another session then waits for the activity
# holding nothing of it, the transaction's later claim is answered at once,
# and neither side is a deadlock victim (40P01).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(sleep);

my $node = RedpacketTest::node('savepoint_hold', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = 50ms
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

# The granted locks of the activity a backend holds, as "kind:mode" (kinds
# in hexadecimal: 5205 the activity lock, 5201 a stripe).
sub held_by
{
	my ($pid, $act) = @_;
	return $node->safe_psql('postgres', qq{
SELECT coalesce(string_agg(to_hex(objsubid::int) || ':' || mode, ',' ORDER BY objsubid, objid), '')
  FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND pid = $pid
   AND classid = $act AND objsubid::int BETWEEN x'5201'::int AND x'5207'::int});
}

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'savepoint hold')");
	my $t = $node->background_psql('postgres', on_error_stop => 0);
	my $tpid = $t->query_safe('SELECT pg_backend_pid()');
	$t->query_safe('BEGIN');
	$t->query_safe('SAVEPOINT before_claim');
	is($t->query_safe("SELECT status FROM redpacket.rp_claim($act, 't1', 0.50)"),
		'claimed', "direct_claims $path: T claims inside a savepoint");
	$t->query_safe('ROLLBACK TO SAVEPOINT before_claim');
	is(held_by($tpid, $act), '',
		"direct_claims $path: the rollback to the savepoint gave back every lock of the activity");

	$t->query_safe("SELECT redpacket.rp_freeze($act, 'audit')");
	like(held_by($tpid, $act), qr/(^|,)5205:ExclusiveLock(,|$)/,
		"direct_claims $path: T's freeze, a first call again, holds the activity lock exclusively");

	my $c = $node->background_psql('postgres', on_error_stop => 0);
	my $cpid = $c->query_safe('SELECT pg_backend_pid()');
	$c->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_close_activity($act) AS closed;
});
	ok(defined RedpacketTest::waits_for_lock($node, "%rp_close_activity($act)%"),
		"direct_claims $path: the close waits");
	is(held_by($cpid, $act), '',
		"direct_claims $path: the close waits holding nothing of the activity");
	# ten deadlock timeouts: every check of the close has run
	sleep 0.5;

	is($t->query("SELECT status FROM redpacket.rp_claim($act, 't2', 0.50)"),
		'frozen', "direct_claims $path: T's later claim is answered at once");
	unlike($t->{stderr}, qr/ERROR/, "direct_claims $path: T got no error (no deadlock)");
	RedpacketTest::close_after_commit($node, $t, $c, $act, "direct_claims $path");
	is($node->safe_psql('postgres', "SELECT count(*) FROM redpacket.claim WHERE activity_id = $act"),
		'0', "direct_claims $path: the claim rolled back with its savepoint");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
});

$node->stop;
done_testing();
