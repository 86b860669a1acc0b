# Two transactions that each keep a claim's stripe and then need the
# other's close a cycle that only PostgreSQL can break: it fails whichever
# looks first.  A caller that retries the loser must not lose every time:
# a backend whose holder wait lost looks later until one of its
# transactions commits, so the other transaction loses instead, even when
# the retried transaction was served in a short wait before the cycle.
#
# Two stripes: stripe 0 drained to 0.20, stripe 1 holds 1.00.  A (BEGIN)
# claims 0.10 from stripe 0 and B (BEGIN) 0.10 from stripe 1, each keeping
# its stripe.  A claims 0.50: only stripe 1 can pay it, so A waits for B.
# Then B claims 0.95: stripe 1 (0.90) cannot pay it alone, so B waits for
# stripe 0, held by A.  A began to wait first and looks first: A loses.
# The same again on a new activity, A waiting first again: now A looks
# later, and B loses.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes ();

my $d = 0.6;					# deadlock_timeout, seconds
my $node = RedpacketTest::node('holder_losses', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = ${\ ($d * 1000)}ms
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

my %s = map { $_ => $node->background_psql('postgres', on_error_stop => 0) } qw(a b);

# One cycle of A and B on a new activity: who lost it.
sub cycle
{
	my ($label) = @_;
	$_->{stderr} = '' for values %s;
	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'holder losses')");
	my $drain = $node->background_psql('postgres', on_error_stop => 0);
	ok(RedpacketTest::claim_on($drain, $act, 'drain', 0.80, 0), "$label: stripe 0 drained");
	$drain->query_safe('COMMIT');
	$drain->quit;

	ok(RedpacketTest::claim_on($s{a}, $act, 'a1', 0.10, 0), "$label: A holds stripe 0");
	ok(RedpacketTest::claim_on($s{b}, $act, 'b1', 0.10, 1), "$label: B holds stripe 1");
	$s{a}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'a2', 0.50);
});
	ok(defined RedpacketTest::waits_for_stripe($node, $act, 1, "%''a2''%"),
		"$label: A waits for stripe 1");
	$s{b}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'b2', 0.95);
});
	my %answer = map { $_ => scalar $s{$_}->query('SELECT 1 AS answered') } qw(a b);
	my %lost = map { $_ => scalar($s{$_}->{stderr} =~ /deadlock detected/) } qw(a b);
	for my $who (qw(a b))
	{
		like($answer{$who}, qr/claimed/, "$label: \U$who\E's second claim is served")
		  unless $lost{$who};
		$s{$who}->query($lost{$who} ? 'ROLLBACK' : 'COMMIT');
	}
	is(RedpacketTest::unbalanced($node), '0', "$label: the books balance");
	return join(',', grep { $lost{$_} } qw(a b));
}

# The same with user locks, and a served wait before the cycle: A and B
# each claim for a user of their own, then for the other's user.  In the
# second cycle A first claims for a user whose lock Z holds for a moment
# (Z's transaction rolls back): that wait is served, and A must still look
# later in the cycle that follows.
sub user_cycle
{
	my ($label, $served_wait) = @_;
	$_->{stderr} = '' for values %s;
	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(100.00, stripes => 8, name => 'holder losses')");
	$s{b}->query_safe('BEGIN');
	$s{b}->query_safe("SELECT status FROM redpacket.rp_claim($act, 'ub', 1)");
	$s{a}->query_safe('BEGIN');
	$s{a}->query_safe("SELECT status FROM redpacket.rp_claim($act, 'ua', 1)");
	if ($served_wait)
	{
		my $z = $node->background_psql('postgres', on_error_stop => 0);
		$z->query_safe('BEGIN');
		$z->query_safe("SELECT status FROM redpacket.rp_claim($act, 'uz', 1)");
		$s{a}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'uz', 1);
});
		Time::HiRes::sleep($d / 2);
		$z->query_safe('ROLLBACK');
		$z->quit;
		like($s{a}->query('SELECT 1 AS answered'), qr/claimed/,
			"$label: A's claim that waited for Z is served");
	}
	$s{a}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'ub', 1);
});
	Time::HiRes::sleep($d / 4);
	$s{b}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, 'ua', 1);
});
	$s{$_}->query('SELECT 1 AS answered') for qw(a b);
	my %lost = map { $_ => scalar($s{$_}->{stderr} =~ /deadlock detected/) } qw(a b);
	$s{$_}->query($lost{$_} ? 'ROLLBACK' : 'COMMIT') for qw(a b);
	return join(',', grep { $lost{$_} } qw(a b));
}

is(user_cycle('user locks, first cycle', 0), 'a', 'user locks: A, which waited first, loses');
is(user_cycle('user locks, second cycle', 1), 'b',
	'user locks: after A lost, B loses, though A was served in a wait since');

for my $path ('on', 'off')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
	$node->reload;
	is(cycle("direct_claims $path, first cycle"), 'a',
		"direct_claims $path: A, which waited first, loses the first cycle");
	is(cycle("direct_claims $path, second cycle"), 'b',
		"direct_claims $path: after A lost, B loses the same cycle");
}

$_->quit for values %s;
$node->stop;
done_testing();
