# A transaction's second claim that can only be paid by gathering every
# stripe, while other clients keep claiming in short transactions.  The
# transaction keeps the stripe of its first claim; its second claim must
# take the others, each of them held, again and again, for a moment by the
# other clients.  It must be served in bounded time, not give back what it
# took and start over for as long as the load lasts.
#
# Eight stripes of 0.50.  Four sessions loop (inside the server, so they
# come back for a stripe at once): claim 0.01, keep it 20 ms, roll back (so
# the activity never runs dry).  The session claims 0.10 (BEGIN), then
# 2.50: no stripe can pay that alone, the activity can (3.90 left), so the
# claim gathers, and must answer claimed within 20 s (statement_timeout
# ends a claim that never does).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = RedpacketTest::node('second_gathers', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
deadlock_timeout = 20ms
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket; CREATE TABLE stop_loops (path text)');

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(4.00, stripes => 8, name => 'second gathers')");
	# the other clients: short claims until told to stop (60 s at most)
	my @loops;
	for my $i (1 .. 4)
	{
		my $l = $node->background_psql('postgres', on_error_stop => 0);
		$l->query_until(qr/started/, qq{\\echo started
DO \$\$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '60 s';
BEGIN
    FOR n IN 1 .. 1000000 LOOP
        EXIT WHEN clock_timestamp() > deadline
               OR EXISTS (SELECT FROM stop_loops WHERE path = '$path');
        PERFORM redpacket.rp_claim($act, 'o$i-' || n, 0.01);
        PERFORM pg_sleep(0.02);
        ROLLBACK;
    END LOOP;
END
\$\$;
});
		push @loops, $l;
	}
	sleep 1;

	my $s = $node->background_psql('postgres', on_error_stop => 0);
	$s->query_safe("SET statement_timeout = '20s'");
	$s->query_safe('BEGIN');
	is($s->query_safe("SELECT status FROM redpacket.rp_claim($act, 's1', 0.10)"),
		'claimed', "direct_claims $path: the first claim is served");
	my $t0 = time;
	my $second = $s->query("SELECT status FROM redpacket.rp_claim($act, 's2', 2.50)");
	my $secs = time - $t0;
	is($second, 'claimed', "direct_claims $path: the gathering second claim is served under load");
	unlike($s->{stderr}, qr/ERROR/, "direct_claims $path: it got no error (no statement timeout)");
	cmp_ok($secs, '<', 20, sprintf("direct_claims $path: within 20 s (%.2f s)", $secs));
	$s->query('COMMIT');
	$s->quit;

	$node->safe_psql('postgres', "INSERT INTO stop_loops VALUES ('$path')");
	for my $l (@loops)
	{
		$l->query('SELECT 1');
		unlike($l->{stderr}, qr/ERROR/, "direct_claims $path: a claiming loop ran without an error");
		$l->quit;
	}
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(user_id || ':' || amount, ',' ORDER BY claim_id) FROM redpacket.claim WHERE activity_id = $act"),
		$second eq 'claimed' ? 's1:0.10,s2:2.50' : '',
		"direct_claims $path: the session's claims are paid (or none, if it failed), the loops' rolled back");
	is(RedpacketTest::unbalanced($node), '0', "direct_claims $path: the books balance");
});

$node->stop;
done_testing();
