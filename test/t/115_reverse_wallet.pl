# A reversal that waits for the wallet's credit of the same claim.  The
# wallet's transaction has recorded the claim as credited and not yet
# committed; an operator reverses the claim, and waits for it.  While it
# waits, other claims on the activity go on (a claim with lock_timeout 2 s
# is served); once the wallet commits, the reversal is refused (SQLSTATE
# 55000, the claim was credited) and the books balance.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node('reverse_wallet', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'reverse wallet')");
	my $cid = $node->safe_psql('postgres',
		"SELECT claim_id FROM redpacket.rp_claim($act, 'paid', 1.00)");

	my $w = $node->background_psql('postgres', on_error_stop => 0);
	$w->query_safe('BEGIN');
	is($w->query_safe("SELECT redpacket.rp_credited($act, ARRAY[$cid], 'wallet batch 1')"),
		'1', "direct_claims $path: the wallet credits the claim (not committed yet)");

	my $op = $node->background_psql('postgres', on_error_stop => 0);
	$op->query_safe('\\set VERBOSITY verbose');
	$op->query_until(qr/started/, qq{\\echo started
SELECT redpacket.rp_reverse($act, $cid, 'risk control') AS reversed;
});
	ok( $node->poll_query_until(
			'postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE query LIKE '%rp_reverse(%' AND query NOT LIKE '%pg_stat_activity%'
   AND wait_event_type = 'Lock'}),
		"direct_claims $path: the reversal waits for the wallet's transaction");

	my ($ret, $out, $err) = $node->psql('postgres',
		"SET lock_timeout = '2s'; SELECT status FROM redpacket.rp_claim($act, 'other', 0.50)");
	is($out, 'claimed', "direct_claims $path: another claim is served while the reversal waits");
	is($err, '', "direct_claims $path: it got no error (no lock timeout)");

	$w->query_safe('COMMIT');
	$w->quit;
	$op->query('SELECT 1');
	like($op->{stderr}, qr/ERROR:  55000: claim $cid of activity $act was credited/,
		"direct_claims $path: the reversal is refused (55000): the claim was credited");
	$op->quit;

	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(claim_id || ':' || state, ',') FROM redpacket.claim_settlement WHERE activity_id = $act"),
		"$cid:credited", "direct_claims $path: the claim is credited, not reversed");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
});

$node->stop;
done_testing();
