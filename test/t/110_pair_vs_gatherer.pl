# A transaction that already claimed never loses a deadlock to a gatherer,
# even when it closes the cycle after the gatherer's deadlock check.
#
# Two stripes of 1.00; a first claim of 0.70 leaves one of them at 0.30.
# Session A (BEGIN) claims 0.90, which only the full stripe can pay, and
# keeps it; the test makes activities until that stripe is stripe 1.
# Session G claims 0.35: no stripe it can see pays that, so it gathers,
# takes stripe 0 and waits for stripe 1 (A's).  After twice
# deadlock_timeout, G's one look for a cycle has found none.  Then A claims
# 0.20: stripe 1 has 0.10 left, so A waits for stripe 0 (G's) and closes
# the cycle.  A must be served (G gives way: it rolls back what it took
# and starts over), not fail with 40P01; after A commits, G finds 0.20
# left and answers exhausted.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('pair_vs_gatherer');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = 200ms
log_line_prefix = '%m [%p] '
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

for my $path ('on', 'off')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
	$node->reload;
	# the first claim must leave stripe 0 at 0.30 (stripe 1 full): where a
	# claim starts depends on the backend and on how many it made, so one
	# session makes first claims on new activities until one does
	my ($act, $pre, $first);
	my $p = $node->background_psql('postgres');
	for my $try (1 .. 50)
	{
		$act = $node->safe_psql('postgres',
			"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'pair-vs-gatherer')");
		$p->query_safe("SELECT redpacket.rp_claim($act, 'pre$try', 0.70)");
		$pre = $node->safe_psql('postgres',
			"SELECT stripe FROM redpacket.claim WHERE activity_id = $act AND user_id = 'pre$try'");
		$first = "pre$try";
		last if $pre eq '0';
	}
	$p->quit;
	is($pre, '0', "direct_claims $path: the first claim took stripe 0");

	my $a = $node->background_psql('postgres', on_error_stop => 0);
	$a->query_safe('BEGIN');
	my $cid = $a->query_safe("SELECT claim_id FROM redpacket.rp_claim($act, 'a1', 0.90)");
	my $stripe = $a->query_safe(
		"SELECT stripe FROM redpacket.claim WHERE activity_id = $act AND claim_id = $cid");
	is($stripe, '1', "direct_claims $path: A holds stripe 1 (the full one) after its first claim");

	my $g = $node->background_psql('postgres', on_error_stop => 0);
	$g->query_until(qr/started/, q{\echo started
SELECT status FROM redpacket.rp_claim(} . $act . q{, 'g', 0.35);
});
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
 WHERE NOT l.granted AND l.locktype = 'advisory' AND l.objsubid = 20993
   AND s.query LIKE '%''g'', 0.35%'}),
		"direct_claims $path: G waits for a stripe");
	# G's deadlock check (at deadlock_timeout) has run and found no cycle
	select(undef, undef, undef, 0.5);

	my $second = $a->query("SELECT status FROM redpacket.rp_claim($act, 'a2', 0.20)");
	is($second, 'claimed', "direct_claims $path: A's second claim, closing the cycle, is served");
	unlike($a->{stderr}, qr/deadlock/, "direct_claims $path: A was not a deadlock victim");
	$a->query_safe('COMMIT');
	$a->quit;

	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 0 FROM pg_stat_activity WHERE query LIKE '%''g'', 0.35%' AND state = 'active'"),
		"direct_claims $path: G's claim is done once A commits");
	$g->quit;
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act"
		),
		"$first:0.70,a1:0.90,a2:0.20",
		"direct_claims $path: A's two claims and the first are paid, G's is not");
	is( $node->safe_psql(
			'postgres',
			"SELECT bool_and(ok) FROM redpacket.rp_reconcile($act, true)"),
		't', "direct_claims $path: the books balance");
}

$node->stop;
done_testing();
