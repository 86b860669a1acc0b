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

# In session $s, inside an open transaction, claim $amount for $user until
# the claim lands on $want (rolling back the others); false if it never did.
sub claim_on
{
	my ($s, $act, $user, $amount, $want) = @_;
	for my $try (1 .. 40)
	{
		$s->query_safe('BEGIN');
		my $cid = $s->query_safe(
			"SELECT claim_id FROM redpacket.rp_claim($act, '$user', $amount)");
		my $stripe = $s->query_safe(
			"SELECT stripe FROM redpacket.claim WHERE activity_id = $act AND claim_id = $cid");
		return 1 if $stripe eq $want;
		$s->query_safe('ROLLBACK');
	}
	return 0;
}

# Wait (polling tightly) until the backend running $pattern waits for
# stripe $stripe of $act; returns the time it was seen.
sub waits_for_stripe
{
	my ($act, $stripe, $pattern) = @_;
	for (1 .. 500)
	{
		return time if $node->safe_psql('postgres', qq{
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
 WHERE NOT l.granted AND l.locktype = 'advisory' AND l.objsubid = 20993
   AND l.classid = $act AND l.objid = $stripe AND s.query LIKE '$pattern'}) > 0;
		sleep 0.01;
	}
	return undef;
}

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
		ok(claim_on($drain, $act, "drain$stripe", 0.90, $stripe),
			"direct_claims $path: stripe $stripe drained");
		$drain->query_safe('COMMIT');
	}
	$drain->quit;

	my %s = map { $_ => $node->background_psql('postgres', on_error_stop => 0) } qw(h x y);
	ok(claim_on($s{h}, $act, 'h1', 0.90, 3), "direct_claims $path: H holds stripe 3");
	ok(claim_on($s{x}, $act, 'x1', 0.05, 1), "direct_claims $path: X holds stripe 1");
	ok(claim_on($s{y}, $act, 'y1', 0.05, 2), "direct_claims $path: Y holds stripe 2");

	my $f = $node->background_psql('postgres', on_error_stop => 0);
	$f->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_freeze($act, 'late walker');
});
	my $t0 = waits_for_stripe($act, 1, "%rp_freeze($act,%");
	ok(defined $t0, "direct_claims $path: the freeze holds stripe 0 and waits for stripe 1");
	$t0 //= time;

	$s{h}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'h2', 0.50);
});
	ok(defined waits_for_stripe($act, 0, "%''h2''%"), "direct_claims $path: H waits for stripe 0");
	sleep_until($t0 + 1.5 * $d);
	$s{x}->query_safe('COMMIT');
	sleep_until($t0 + 3.0 * $d);
	$s{y}->query_safe('COMMIT');

	# H's answer: a line with its status, or an error
	my $second = $s{h}->query('SELECT 1 AS answered');
	like($second, qr/claimed/, "direct_claims $path: H's second claim, waited past the walk's arrival, is served");
	unlike($s{h}->{stderr}, qr/deadlock/, "direct_claims $path: H was not a deadlock victim");
	$s{h}->query('COMMIT');
	$_->quit for values %s;

	ok( $node->poll_query_until(
			'postgres',
			"SELECT frozen_reason = 'late walker' FROM redpacket.activity WHERE id = $act"),
		"direct_claims $path: the freeze is done once H commits");
	$f->quit;
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act AND user_id LIKE 'h%'"),
		'h1:0.90,h2:0.50', "direct_claims $path: both of H's claims are paid");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
}

$node->stop;
done_testing();
