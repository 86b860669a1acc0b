# Claims by one user through the Citus coordinator, while another claim of
# the same user is in flight: inside and outside transaction blocks, the
# second answers duplicate (or user_limit), never an error, and no user gets
# more than the activity allows.
#
# The second call's statement starts (and takes its snapshot) before the
# first one's transaction commits, then waits for the user's lock on the
# worker that holds the activity.  The fast path on the shard tables looked
# for the user's claims with that statement's snapshot, missed the claim
# committed meanwhile and failed on the unique index (23505); under a
# per-user limit it claimed once more than the limit.  Both ways of the fast
# path are tested: direct.c's (the default) and the statements on the shard
# tables (redpacket.direct_claims off, and any per-user limit above one).
#
# Needs Citus (test/citus/build.sh); skips without it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use RedpacketTest;

my ($coord, @workers) = RedpacketTest::citus_cluster();
my %node_of = map { $_->port => $_ } @workers;

sub q_coord { return $coord->safe_psql('postgres', $_[0]); }

# Two sessions on the coordinator: the first keeps its transaction open.
my ($first, $second);

sub sessions
{
	$_->quit for grep { defined } ($first, $second);
	$first = $coord->background_psql('postgres', on_error_stop => 0);
	$second = $coord->background_psql('postgres', on_error_stop => 0);
	return;
}

# $second runs $sql, which must wait for the user's lock that $first holds
# on $holder; then $first runs $release.  Returns $second's output and
# errors.
sub behind
{
	my ($holder, $sql, $release) = @_;
	$second->{stderr} = '';
	$second->query_until(qr/sent\n/, "\\echo sent\n$sql\n");
	my $waiting = $holder->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
		  . " WHERE NOT l.granted AND a.query LIKE '%rp_claim(%'");
	my ($out) = $first->query($release);
	($out) = $second->query("SELECT 'end'");
	$out =~ s/\n?end$//;
	return ($waiting, $out, $second->{stderr});
}

# redpacket.direct_claims on every worker ('on' is the default), seen by
# the worker connections of new coordinator sessions.
sub direct_claims
{
	my ($on) = @_;
	for my $w (@workers)
	{
		$w->safe_psql('postgres',
			$on eq 'on'
			? 'ALTER SYSTEM RESET redpacket.direct_claims'
			: "ALTER SYSTEM SET redpacket.direct_claims = $on");
		$w->safe_psql('postgres', 'SELECT pg_reload_conf()');
		$w->poll_query_until('postgres', 'SHOW redpacket.direct_claims', $on)
		  or die "redpacket.direct_claims not $on";
	}
	sessions();
	return;
}

for my $case (
	[ 'autocommit',          '%s',                 'on' ],
	[ 'a transaction block', 'BEGIN; %s COMMIT;', 'on' ],
	[ 'autocommit, direct_claims off', '%s', 'off' ],
	[ 'a transaction block, direct_claims off', 'BEGIN; %s COMMIT;', 'off' ])
{
	my ($name, $wrap, $direct) = @$case;
	direct_claims($direct);
	my ($act) = RedpacketTest::citus_placed($coord, [ $workers[0] ],
		'redpacket.rp_create_activity(7.00, stripes => 2)');
	my $holder = $node_of{ RedpacketTest::citus_holder($coord, $act) };
	my $claim = "SELECT status FROM redpacket.rp_claim($act, 'u1', 0.07);";
	is(($first->query("BEGIN; $claim"))[0], 'claimed', "$name: the first claim, transaction open");
	my ($waiting, $out, $err) = behind($holder, sprintf($wrap, $claim), 'COMMIT');
	ok($waiting, "$name: the same user's second claim waits for the first");
	is($out, 'duplicate', "$name: it answers duplicate once the first commits");
	is($err, '', "$name: and raises no error");
	is(q_coord("SELECT count(*) FROM redpacket.claim WHERE activity_id = $act"),
		'1', "$name: one claim recorded");
}

# Per-user limit 2 with request ids: the second request in flight, a third.
direct_claims('on');
{
	my ($act) = RedpacketTest::citus_placed($coord, [ $workers[1] ],
		'redpacket.rp_create_activity(20.00, stripes => 2, per_user_limit => 2)');
	my $holder = $node_of{ RedpacketTest::citus_holder($coord, $act) };
	my $claim = "SELECT status FROM redpacket.rp_claim($act, 'r1', 1, 'q%d');";
	is(q_coord(sprintf($claim, 1)), 'claimed', 'limit 2: the first request');
	is(($first->query('BEGIN; ' . sprintf($claim, 2)))[0],
		'claimed', 'limit 2: the second request, transaction open');
	my ($waiting, $out, $err) = behind($holder, sprintf($claim, 3), 'COMMIT');
	ok($waiting, 'limit 2: a third request waits for the second');
	is($out, 'user_limit', 'limit 2: it answers user_limit once the second commits');
	is($err, '', 'limit 2: and raises no error');
	is(q_coord("SELECT count(*) FROM redpacket.claim WHERE activity_id = $act AND user_id = 'r1'"),
		'2', 'limit 2: the user holds two claims');
}
$first->quit;
$second->quit;

# 16 clients, users drawn from 3,000 (some collide), every fifth claim in
# BEGIN ... COMMIT: 2,400 calls, not one error.
{
	my ($act) = RedpacketTest::citus_placed($coord, [ $workers[0] ],
		'redpacket.rp_create_activity(1000.00, stripes => 16)');
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my $claim = "SELECT status FROM redpacket.rp_claim($act, 'p' || :u, 0.01);\n";
	open my $fh, '>', "$dir/same_user.pgbench" or die $!;
	print $fh "\\set u random(1, 3000)\n$claim";
	close $fh;
	open $fh, '>', "$dir/same_user_xact.pgbench" or die $!;
	print $fh "\\set u random(1, 3000)\nBEGIN;\n$claim" . "COMMIT;\n";
	close $fh;
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			'pgbench', '-n', '-c', '16', '-j', '2', '-t', '150',
			'-f', "$dir/same_user.pgbench\@4", '-f', "$dir/same_user_xact.pgbench\@1",
			'-h', $coord->host, '-p', $coord->port, 'postgres'
		],
		'>', \$out, '2>', \$err);
	like($out, qr/number of transactions actually processed: 2400\/2400/,
		'16 clients, 2,400 claims by colliding users: all processed');
	unlike($err, qr/ERROR|duplicate key/, 'no claim failed') or diag $err;
	is( q_coord(
			"SELECT count(*) = count(DISTINCT user_id) FROM redpacket.claim WHERE activity_id = $act"),
		't', 'one claim per user');
	is( q_coord(
			"SELECT (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $act)"
			  . " + (SELECT sum(balance) FROM redpacket.stripe WHERE activity_id = $act)::numeric / 100"
			  . " = 1000"),
		't', 'claims + stripes = funded');
}

done_testing();
