# rp_reconcile_strict while a claim keeps a stripe of an activity it must
# check.  The caller's lock_timeout (3 s) bounds how long the pass waits
# for that activity: the procedure ends within a few seconds of starting,
# with a lock timeout (55P03) or reporting the activity as not checked
# (55000), not after trying it again and again.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(time);

my $node = RedpacketTest::node('strict_bound', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(10.00, stripes => 4, name => 'strict bound')");
	# a committed claim, so the activity has something to check
	$node->safe_psql('postgres', "SELECT redpacket.rp_claim($act, 'done', 0.50)");
	my $h = $node->background_psql('postgres', on_error_stop => 0);
	$h->query_safe('BEGIN');
	is($h->query_safe("SELECT status FROM redpacket.rp_claim($act, 'holder', 0.50)"),
		'claimed', "direct_claims $path: a claim keeps its stripe in an open transaction");

	my $t0 = time;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET statement_timeout = '60s'; SET lock_timeout = '3s'; \\set VERBOSITY verbose\nCALL redpacket.rp_reconcile_strict();");
	my $secs = time - $t0;
	note("direct_claims $path: rp_reconcile_strict: $err");
	cmp_ok($secs, '<', 10, sprintf("direct_claims $path: rp_reconcile_strict ended within 10 s (%.1f s)", $secs));
	like($err, qr/ERROR:  (55P03|55000):/,
		"direct_claims $path: with a lock timeout or the activity reported as not checked");
	unlike($err, qr/statement timeout/, "direct_claims $path: not cut off by statement_timeout");
	like($err, qr/lock timeout|not checked: .*\b$act\b/,
		"direct_claims $path: the error says why (a lock timeout, or the activity not checked)")
	  if $err =~ /55000/;

	$h->query_safe('COMMIT');
	$h->quit;
	my ($r2, $o2, $e2) = $node->psql('postgres', 'CALL redpacket.rp_reconcile_strict()');
	is($e2, '', "direct_claims $path: once the claim commits, rp_reconcile_strict checks everything");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
});

$node->stop;
done_testing();
