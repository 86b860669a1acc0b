# A walker that waits a long time for a transaction that keeps a claim,
# and then that transaction claims again, needing a stripe it does not
# hold.  A close waits for the activity holding nothing of it, so the
# transaction's second claim is served, not a deadlock victim (40P01), and
# the close completes once the transaction commits.
#
# Two stripes of 1.00.  T (BEGIN) claims 1.00 from stripe 1 and keeps it.
# C closes the activity and waits for T.  After 2 s (forty deadlock
# timeouts), T claims 0.50: stripe 1 is empty, so T needs stripe 0.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(sleep);

my $node = RedpacketTest::node('walk_holder', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = 50ms
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'walk holder')");
	my $t = $node->background_psql('postgres', on_error_stop => 0);
	ok(RedpacketTest::claim_on($t, $act, 't1', 1.00, 1),
		"direct_claims $path: T's first claim holds stripe 1");

	my $c = $node->background_psql('postgres', on_error_stop => 0);
	$c->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_close_activity($act) AS closed;
});
	ok(defined RedpacketTest::waits_for_lock($node, "%rp_close_activity($act)%"),
		"direct_claims $path: the close waits");
	# far longer than any deadlock_timeout-based look of the close
	sleep 2;
	is($node->safe_psql('postgres',
			"SELECT closed_at IS NULL FROM redpacket.activity WHERE id = $act"),
		't', "direct_claims $path: the close is still waiting");

	my $second = $t->query("SELECT status FROM redpacket.rp_claim($act, 't2', 0.50)");
	is($second, 'claimed', "direct_claims $path: T's second claim, closing the cycle late, is served");
	unlike($t->{stderr}, qr/ERROR/, "direct_claims $path: T got no error (no deadlock)");
	RedpacketTest::close_after_commit($node, $t, $c, $act, "direct_claims $path");
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act"),
		't1:1.00,t2:0.50', "direct_claims $path: both of T's claims are paid");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
});

$node->stop;
done_testing();
