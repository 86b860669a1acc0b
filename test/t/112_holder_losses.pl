# Two transactions that each keep a claim's stripe and then need the
# other's close a cycle that only PostgreSQL can break: one of them must
# fail.  The older one never does: the one whose transaction began first,
# or, after it lost such a cycle, whose losing streak began first (a caller
# that retries the loser keeps its age until one of its transactions
# commits).  Who began to wait first, and who looks for the cycle first,
# does not decide it.
#
# Two stripes: stripe 0 drained to 0.20, stripe 1 holds 1.00.  X (BEGIN)
# claims 0.10 from stripe 0 and Y (BEGIN) 0.10 from stripe 1, each keeping
# its stripe.  X claims 0.50: only stripe 1 can pay it, so X waits for Y.
# Then Y claims 0.95: stripe 1 (0.90) cannot pay it alone, so Y waits for
# stripe 0, held by X.  X began to wait first and looks first.
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

# One cycle on a new activity, X waiting first and Y closing the cycle
# $delay seconds later; the session named first begins its transaction
# first.  Returns who lost it.
sub cycle
{
	my ($label, $x, $y, $first, $delay) = @_;
	my $second = $first eq $x ? $y : $x;
	$_->{stderr} = '' for values %s;
	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'holder losses')");
	my $drain = $node->background_psql('postgres', on_error_stop => 0);
	ok(RedpacketTest::claim_on($drain, $act, 'drain', 0.80, 0), "$label: stripe 0 drained");
	$drain->query_safe('COMMIT');
	$drain->quit;

	my %stripe = ($x => 0, $y => 1);
	ok(RedpacketTest::claim_on($s{$_}, $act, "${_}1", 0.10, $stripe{$_}),
		"$label: \U$_\E holds stripe $stripe{$_}")
	  for ($first, $second);
	$s{$x}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, '${x}2', 0.50);
});
	ok(defined RedpacketTest::waits_for_stripe($node, $act, 1, "%''${x}2''%"),
		"$label: \U$x\E waits for stripe 1");
	Time::HiRes::sleep($delay);
	$s{$y}->query_until(qr/started/, qq{\\echo started
SELECT status FROM redpacket.rp_claim($act, '${y}2', 0.95);
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
# (Z's transaction rolls back): that wait is served, and A must keep the
# age of its first try in the cycle that follows.  B begins first.
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

is(user_cycle('user locks, first cycle', 0), 'a', 'user locks: A, which began after B, loses');
is(user_cycle('user locks, second cycle', 1), 'b',
	'user locks: after A lost, B loses, though A was served in a wait since');

for my $path ('on', 'off')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
	$node->reload;
	$s{$_}->query('SELECT 1') for qw(a b);	# a commit: no streak
	is(cycle("direct_claims $path, both fresh", 'a', 'b', 'a', $d / 2), 'b',
		"direct_claims $path: A began first and wins, though it waited and looked first");
	# B lost: its streak began before A's next transaction.  B waits
	# first; A, which begins its transaction first, closes the cycle 2.5d
	# later, so it looks well after B does.
	is(cycle("direct_claims $path, a late cycle", 'b', 'a', 'a', 2.5 * $d), 'a',
		"direct_claims $path: B, retried, wins against A, which began after B's first try");
}

$_->quit for values %s;
$node->stop;
done_testing();
