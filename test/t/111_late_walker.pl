# A walk that closes a cycle late: after the transaction it waits for has
# been waiting for some time.  A freeze (like a close, a reconciliation
# pass or a gathering claim) takes an activity's stripes in order inside a
# subtransaction, and gives way when it finds itself in a cycle, one
# deadlock_timeout (d) after its wait began.  A transaction that made a
# claim and keeps its stripe looks for a cycle 3d after its own wait began.
# When the walk reaches that transaction's stripe more than 2d after the
# transaction began to wait, the transaction looks first: it must still be
# served (the walk gives way), not fail with 40P01.
#
# Four stripes of 1.00; stripes 1 and 2 are drained to 0.10.  H (BEGIN)
# claims 0.90 from stripe 3 and keeps it; X and Y (BEGIN) each claim 0.05,
# from stripes 1 and 2, and keep them.  F freezes the activity: it takes
# stripe 0 and waits for stripe 1.  Then H claims 0.50: only stripe 0 can
# pay it, so H waits for F.  X commits 1.5d after F began to wait, Y 1.5d
# later: F takes stripes 1 and 2 (each wait shorter than the 2d that ends
# a walk's wait) and waits for stripe 3, held by H, 2.5d after H began to
# wait.  H looks at 3d, F at 4d.
#
# H must be served without giving way itself: a holder that gives way
# leaves its place in the lock queue, and walks queued behind it meanwhile
# (here two more freezes, G and K, which start while H waits) get ahead of
# it; under a stream of walks its waits add up past the ten deadlock_timeouts
# after which the claims queued behind it look for a cycle and fail.  So F,
# reaching H's stripe while H waits, gives way at once, and G and K give way
# instead of waiting while H waits.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(sleep time);

my $d = 0.6;					# deadlock_timeout, seconds
my $node = PostgreSQL::Test::Cluster->new('late_walker');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = ${\ ($d * 1000)}ms
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

sub sleep_until { my $t = shift() - time; sleep $t if $t > 0; }

for my $path ('on', 'off')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
	$node->reload;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(4.00, stripes => 4, name => 'late walker')");
	my $drain = $node->background_psql('postgres', on_error_stop => 0);
	for my $stripe (1, 2)
	{
		ok(RedpacketTest::claim_on($drain, $act, "drain$stripe", 0.90, $stripe),
			"direct_claims $path: stripe $stripe drained");
		$drain->query_safe('COMMIT');
	}
	$drain->quit;

	my %s = map { $_ => $node->background_psql('postgres', on_error_stop => 0) } qw(h x y);
	ok(RedpacketTest::claim_on($s{h}, $act, 'h1', 0.90, 3), "direct_claims $path: H holds stripe 3");
	ok(RedpacketTest::claim_on($s{x}, $act, 'x1', 0.05, 1), "direct_claims $path: X holds stripe 1");
	ok(RedpacketTest::claim_on($s{y}, $act, 'y1', 0.05, 2), "direct_claims $path: Y holds stripe 2");

	my $f = $node->background_psql('postgres', on_error_stop => 0);
	$f->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_freeze($act, 'late walker');
});
	my $t0 = RedpacketTest::waits_for_stripe($node, $act, 1, "%rp_freeze($act,%");
	ok(defined $t0, "direct_claims $path: the freeze holds stripe 0 and waits for stripe 1");
	$t0 //= time;

	$s{h}->query_safe('SET client_min_messages = debug1');
	$s{h}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'h2', 0.50);
});
	ok(defined RedpacketTest::waits_for_stripe($node, $act, 0, "%''h2''%"), "direct_claims $path: H waits for stripe 0");
	my %w = map { $_ => $node->background_psql('postgres', on_error_stop => 0) } qw(g k);
	for my $name (sort keys %w)
	{
		$w{$name}->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_freeze($act, 'late walker');
});
	}
	sleep_until($t0 + 1.5 * $d);
	$s{x}->query_safe('COMMIT');
	sleep_until($t0 + 3.0 * $d);
	$s{y}->query_safe('COMMIT');

	# H's answer: a line with its status, or an error
	my $second = $s{h}->query('SELECT 1 AS answered');
	like($second, qr/claimed/, "direct_claims $path: H's second claim, waited past the walk's arrival, is served");
	unlike($s{h}->{stderr}, qr/deadlock/, "direct_claims $path: H was not a deadlock victim");
	unlike($s{h}->{stderr}, qr/closed a cycle with a restartable walk/,
		"direct_claims $path: H did not have to give way (the walks gave way first)");
	$s{h}->query('COMMIT');
	$_->quit for values %s;

	ok( $node->poll_query_until(
			'postgres',
			"SELECT frozen_reason = 'late walker' FROM redpacket.activity WHERE id = $act"),
		"direct_claims $path: the freeze is done once H commits");
	for my $walk ($f, values %w)
	{
		$walk->query('SELECT 1');
		unlike($walk->{stderr}, qr/ERROR/, "direct_claims $path: every freeze ended without an error");
		$walk->quit;
	}
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act AND user_id LIKE 'h%'"),
		'h1:0.90,h2:0.50', "direct_claims $path: both of H's claims are paid");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
}

$node->stop;
done_testing();
