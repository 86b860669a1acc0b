# A cycle of waits that closes after the restartable waiter's one look for
# it.  A close, a freeze or a reconciliation pass (which hold nothing from
# earlier) and a gathering claim wait for an activity's stripes in order,
# inside a subtransaction they can give back, and look for a deadlock
# after deadlock_timeout; PostgreSQL looks once a wait.  A transaction that
# made a claim and keeps its stripe, and then needs a stripe the waiter
# took, closes the cycle later: then it must still be served (the waiter
# gives way), not fail with 40P01.
#
# Two stripes of 1.00.  Session A (BEGIN) claims 0.90 from stripe 1 and
# keeps it.  Session F freezes the activity: it takes stripe 0 and waits
# for stripe 1.  After more than twice deadlock_timeout, A claims 0.20:
# stripe 1 has 0.10 left, so A waits for stripe 0, held by F.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('late_cycle');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = 200ms
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

for my $path ('on', 'off')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
	$node->reload;

	# where a claim starts depends on the backend and on how many it made:
	# A makes first claims on new activities until one is on stripe 1
	my $a = $node->background_psql('postgres', on_error_stop => 0);
	my ($act, $stripe);
	for my $try (1 .. 50)
	{
		$act = $node->safe_psql('postgres',
			"SELECT redpacket.rp_create_activity(2.00, stripes => 2, name => 'late cycle')");
		$a->query_safe('BEGIN');
		my $cid = $a->query_safe("SELECT claim_id FROM redpacket.rp_claim($act, 'a1', 0.90)");
		$stripe = $a->query_safe(
			"SELECT stripe FROM redpacket.claim WHERE activity_id = $act AND claim_id = $cid");
		last if $stripe eq '1';
		$a->query_safe('ROLLBACK');
	}
	is($stripe, '1', "direct_claims $path: A's first claim holds stripe 1");

	my $f = $node->background_psql('postgres', on_error_stop => 0);
	$f->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_freeze($act, 'late cycle');
});
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
 WHERE NOT l.granted AND l.locktype = 'advisory' AND l.objsubid = 20993
   AND s.query LIKE '%rp_freeze($act,%'}),
		"direct_claims $path: the freeze waits for stripe 1");
	# its look for a deadlock (after deadlock_timeout) found none
	select(undef, undef, undef, 0.6);

	my $second = $a->query("SELECT status FROM redpacket.rp_claim($act, 'a2', 0.20)");
	is($second, 'claimed', "direct_claims $path: A's second claim, closing the cycle, is served");
	unlike($a->{stderr}, qr/deadlock/, "direct_claims $path: A was not a deadlock victim");
	$a->query_safe('COMMIT');
	$a->quit;

	ok( $node->poll_query_until(
			'postgres',
			"SELECT frozen_reason = 'late cycle' FROM redpacket.activity WHERE id = $act"),
		"direct_claims $path: the freeze is done once A commits");
	$f->quit;
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act"),
		'a1:0.90,a2:0.20', "direct_claims $path: both of A's claims are paid");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
}

$node->stop;
done_testing();
