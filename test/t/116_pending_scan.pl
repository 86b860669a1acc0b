# rp_pending_credits over a large backlog of pending claims, while other
# claims on the activity go on.  The scan must not hold the activity's
# stripes for its whole length: claims made while it runs, each with
# lock_timeout 300 ms, are all served.
#
# An activity with a backlog of 500,000 pending claims of which only the
# last is credited, so that the scan reads all of them to move the
# activity's frontier (about a second); one session scans it, another
# claims again and again, each claim in its own transaction, until the
# scan is done.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = RedpacketTest::node('pending_scan', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

my $backlog = 500_000;

# A new activity with $backlog pending claims but its last one credited:
# the next rp_pending_credits moves the activity's frontier past all of
# them (listing the others as gaps), reading every one.
sub backlog
{
	my ($path) = @_;
	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(100000.00, stripes => 16, name => 'pending scan $path')");
	my $t0 = time;
	$node->safe_psql('postgres', qq{
DO \$\$
BEGIN
    FOR b IN 1 .. $backlog / 10000 LOOP
        PERFORM count(*) FROM redpacket.rp_claim_batch($act,
            ARRAY(SELECT 'b' || b || '-' || g FROM generate_series(1, 10000) g),
            array_fill(0.01::numeric, ARRAY[10000]));
        COMMIT;
    END LOOP;
END
\$\$});
	is($node->safe_psql('postgres', qq{
SELECT redpacket.rp_credited($act, ARRAY[(SELECT max(claim_id) FROM redpacket.claim
                                           WHERE activity_id = $act)], 'last one')}),
		'1', "direct_claims $path: the last claim of the backlog is credited");
	note(sprintf('direct_claims %s: the backlog of %d claims was made in %.1f s',
		$path, $backlog, time - $t0));
	return $act;
}

RedpacketTest::on_both_paths($node, sub {
	my ($path) = @_;

	my $act = backlog($path);
	my $scan = $node->background_psql('postgres', on_error_stop => 0);
	my $scan_pid = $scan->query_safe('SELECT pg_backend_pid()');
	my $c = $node->background_psql('postgres', on_error_stop => 0);
	$c->query_safe("SET lock_timeout = '300ms'");
	$c->query_safe('CREATE TEMP TABLE made (n int)');

	my $t0 = time;
	$scan->query_until(qr/started/, qq{\\echo started
SELECT count(*) AS pending FROM redpacket.rp_pending_credits($act);
\\echo scanned
});
	ok( $node->poll_query_until(
			'postgres',
			"SELECT state = 'active' FROM pg_stat_activity WHERE pid = $scan_pid"),
		"direct_claims $path: the scan runs");
	# claims while the scan runs (20 s at most), each its own transaction
	$c->query(qq{
DO \$\$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '20 s';
BEGIN
    FOR n IN 1 .. 100000 LOOP
        EXIT WHEN clock_timestamp() > deadline
               OR NOT EXISTS (SELECT FROM pg_stat_activity
                               WHERE pid = $scan_pid AND state = 'active');
        PERFORM redpacket.rp_claim($act, 'during-$path-' || n, 0.01);
        INSERT INTO made VALUES (n);
        COMMIT;
        PERFORM pg_sleep(0.02);
    END LOOP;
END
\$\$});
	my $claims_err = $c->{stderr};
	my $scanned = $scan->query('SELECT 1 AS done');
	my $secs = time - $t0;
	note(sprintf('direct_claims %s: the scan and the claims took %.2f s', $path, $secs));
	like($scanned, qr/^\d{6}/, "direct_claims $path: the scan found the backlog");
	unlike($scan->{stderr}, qr/ERROR/, "direct_claims $path: the scan got no error");
	unlike($claims_err, qr/ERROR/,
		"direct_claims $path: every claim made during the scan was served (no lock timeout)");
	cmp_ok($c->query('SELECT count(*) FROM made'), '>', 0,
		"direct_claims $path: claims were made while the scan ran");
	$c->quit;
	$scan->quit;
});
is(RedpacketTest::unbalanced($node), '0', 'the books balance');

$node->stop;
done_testing();
