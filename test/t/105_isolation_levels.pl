# rp_claim inside REPEATABLE READ and SERIALIZABLE caller transactions.
# Such a transaction reads with a snapshot that may predate claims, freezes
# and closes committed by others, so rp_claim must either see through it or
# fail with 40001 (serialization failure) that a retry of the transaction
# resolves; it must never pay a user over per_user_limit, a second claim for
# one idempotency key, a claim on a frozen or closed activity, or more than
# the budget.
#   Part 1 pins interleavings with two psql sessions: a claim that waits
#   for another session's claim of the same user (rain and classic), for
#   the last cent, and a claim whose snapshot predates a claim, a freeze or
#   a close.
#   Part 2 runs pgbench with READ COMMITTED, REPEATABLE READ and
#   SERIALIZABLE transactions mixed on the same activities and users,
#   retrying serialization failures (--max-tries); every transaction must
#   end committed and the books must balance.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use RedpacketTest;

my $node = PostgreSQL::Test::Cluster->new('isolation');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
max_connections = 30
max_locks_per_transaction = 256
max_pred_locks_per_transaction = 256
log_line_prefix = '%m [%p] %e '
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

sub session
{
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	$s->set_query_timer_restart();
	$s->query_safe('\set VERBOSITY sqlstate');
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	$s->{rp_pid} = $pid;
	return $s;
}

# Run SQL in a session and wait for it: its output, or 'ERROR <sqlstate>'.
sub run_sql
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	return $s->{stderr} =~ /ERROR:\s+([0-9A-Z]{5})/ ? "ERROR $1" : $out;
}

# Send SQL without waiting for it.
sub send_sql
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	$s->{stdout} = '';
	$s->{stdin} .= "$sql;\n";
	# IPC::Run takes what it has written off the input string.
	for (1 .. 1000)
	{
		$s->{run}->pump_nb;
		last if $s->{stdin} eq '';
		usleep(1000);
	}
}

# Wait for SQL sent with send_sql: its output, or 'ERROR <sqlstate>'.
sub collect
{
	my ($s) = @_;
	my $out = $s->query('\echo');
	$out =~ s/^\s+|\s+$//g;
	return $s->{stderr} =~ /ERROR:\s+([0-9A-Z]{5})/ ? "ERROR $1" : $out;
}

my $monitor;

# Wait (up to 10 s) until the session waits on a lock; false if it never did.
sub wait_blocked
{
	my ($s) = @_;
	for (1 .. 200)
	{
		return 1
		  if run_sql($monitor,
			"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $s->{rp_pid}") eq 't';
		usleep(50_000);
	}
	return 0;
}

my $a_s = session();
my $b_s = session();
$monitor = session();

sub create
{
	my ($args) = @_;
	return $node->safe_psql('postgres', "SELECT redpacket.rp_create_activity($args)");
}

my $claim_cols = 'SELECT status FROM redpacket.rp_claim';

# Session B claims and holds its transaction open; session A's claim, in
# $a_level, waits for B's locks; B commits (or rolls back); A's outcome is
# returned, then A commits.  When A got 40001 the whole transaction is retried
# once, alone, and the retry's outcome is returned too.
sub a_waits_for_b
{
	my (%o) = @_;
	run_sql($b_s, "BEGIN ISOLATION LEVEL $o{b_level}");
	my $b_out = run_sql($b_s, $o{b_sql});
	run_sql($a_s, "BEGIN ISOLATION LEVEL $o{a_level}");
	send_sql($a_s, $o{a_sql});
	ok(wait_blocked($a_s), "A waits for B's locks: $o{a_sql}");
	run_sql($b_s, $o{b_end} // 'COMMIT');
	my $first = collect($a_s);
	my $commit = run_sql($a_s, 'COMMIT');
	$first = 'ERROR 40001' if $commit =~ /ERROR 40001/;
	my $retry = '';
	if ($first eq 'ERROR 40001')
	{
		run_sql($a_s, 'ROLLBACK');
		run_sql($a_s, "BEGIN ISOLATION LEVEL $o{a_level}");
		$retry = run_sql($a_s, $o{a_sql});
		run_sql($a_s, 'COMMIT');
	}
	return ($b_out, $first, $retry);
}

# Session A takes its snapshot first (BEGIN; SELECT 1), then B runs and
# commits $b_sql in autocommit, then A claims; as above otherwise.
sub a_snapshot_first
{
	my (%o) = @_;
	run_sql($a_s, "BEGIN ISOLATION LEVEL $o{a_level}");
	run_sql($a_s, 'SELECT 1');
	my $b_out = run_sql($b_s, $o{b_sql});
	my $first = run_sql($a_s, $o{a_sql});
	my $commit = run_sql($a_s, 'COMMIT');
	$first = 'ERROR 40001' if $commit =~ /ERROR 40001/;
	my $retry = '';
	if ($first eq 'ERROR 40001')
	{
		run_sql($a_s, 'ROLLBACK');
		run_sql($a_s, "BEGIN ISOLATION LEVEL $o{a_level}");
		$retry = run_sql($a_s, $o{a_sql});
		run_sql($a_s, 'COMMIT');
	}
	return ($b_out, $first, $retry);
}

sub outcome_ok
{
	my ($name, $first, $retry, $want) = @_;
	my $ok = $first eq $want || ($first eq 'ERROR 40001' && $retry eq $want);
	ok($ok, "$name: $want" . ($first eq 'ERROR 40001' ? ' after a 40001 and a retry' : '')
		  . " (got $first" . ($retry ne '' ? ", retry $retry" : '') . ')');
}

sub user_claims
{
	my ($act, $user) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM redpacket.claim WHERE activity_id = $act AND user_id = '$user'");
}

# --- Part 1: pinned interleavings -------------------------------------------------

# A red-packet rain (per_user_limit 2): the user holds r0; B catches r1
# while A, in a snapshot transaction, tries r2 and has to wait for B.
for my $case (
	[ 'REPEATABLE READ', 'READ COMMITTED' ],
	[ 'SERIALIZABLE', 'READ COMMITTED' ],
	[ 'REPEATABLE READ', 'REPEATABLE READ' ],
	[ 'SERIALIZABLE', 'SERIALIZABLE' ])
{
	my ($al, $bl) = @$case;
	my $act = create("100.00, stripes => 8, per_user_limit => 2");
	$node->safe_psql('postgres', "SELECT redpacket.rp_claim($act, 'w', 1.00, 'r0')");
	my ($b, $first, $retry) = a_waits_for_b(
		b_level => $bl, b_sql => "$claim_cols($act, 'w', 1.00, 'r1')",
		a_level => $al, a_sql => "$claim_cols($act, 'w', 1.00, 'r2')");
	is($b, 'claimed', "rain, A $al waits for B $bl: B claims its second packet");
	outcome_ok("rain, A $al waits for B $bl: A", $first, $retry, 'user_limit');
	is(user_claims($act, 'w'), 2, "rain, A $al waits for B $bl: the user holds 2 claims (the limit)");
}

# The same without waiting: A's snapshot predates B's whole claim.
for my $al ('REPEATABLE READ', 'SERIALIZABLE')
{
	my $act = create("100.00, stripes => 8, per_user_limit => 2");
	$node->safe_psql('postgres', "SELECT redpacket.rp_claim($act, 'w', 1.00, 'r0')");
	my ($b, $first, $retry) = a_snapshot_first(
		b_sql => "$claim_cols($act, 'w', 1.00, 'r1')",
		a_level => $al, a_sql => "$claim_cols($act, 'w', 1.00, 'r2')");
	is($b, 'claimed', "rain, A $al snapshot before B's claim: B claims");
	outcome_ok("rain, A $al snapshot before B's claim: A", $first, $retry, 'user_limit');
	is(user_claims($act, 'w'), 2, "rain, A $al snapshot before B's claim: the user holds 2 claims");
}

# A classic red packet (per_user_limit 1): the same user from two sessions.
for my $al ('REPEATABLE READ', 'SERIALIZABLE')
{
	my $act = create("100.00, stripes => 8");
	my ($b, $first, $retry) = a_waits_for_b(
		b_level => 'READ COMMITTED', b_sql => "$claim_cols($act, 'c', 1.00)",
		a_level => $al, a_sql => "$claim_cols($act, 'c', 2.00)");
	outcome_ok("same user, A $al waits for B", $first, $retry, 'duplicate');
	is(user_claims($act, 'c'), 1, "same user, A $al waits for B: one claim");
	is($node->safe_psql('postgres', "SELECT amount FROM redpacket.claim WHERE activity_id = $act"),
		'1.00', "same user, A $al: the claim is B's");

	# and when B rolls back, A's claim goes through
	$act = create("100.00, stripes => 8");
	($b, $first, $retry) = a_waits_for_b(
		b_level => 'READ COMMITTED', b_sql => "$claim_cols($act, 'c', 1.00)", b_end => 'ROLLBACK',
		a_level => $al, a_sql => "$claim_cols($act, 'c', 2.00)");
	outcome_ok("same user, A $al waits for B who rolls back", $first, $retry, 'claimed');
	is($node->safe_psql('postgres', "SELECT string_agg(amount::text, ',') FROM redpacket.claim WHERE activity_id = $act"),
		'2.00', "same user, A $al, B rolled back: only A's claim");
}

# The last cent: B takes the whole budget while A, another user, waits.
for my $stripes (1, 2)
{
	for my $al ('REPEATABLE READ', 'SERIALIZABLE')
	{
		my $act = create("0.05, stripes => $stripes");
		my ($b, $first, $retry) = a_waits_for_b(
			b_level => $al, b_sql => "$claim_cols($act, 'b', 0.05)",
			a_level => $al, a_sql => "$claim_cols($act, 'a', 0.05)");
		is($b, 'claimed', "last cent ($stripes stripes), both $al: B claims");
		outcome_ok("last cent ($stripes stripes), both $al: A", $first, $retry, 'exhausted');
		is( $node->safe_psql(
				'postgres',
				"SELECT count(*) || ' ' || (SELECT sum(balance) FROM redpacket.stripe WHERE activity_id = $act)"
				  . " FROM redpacket.claim WHERE activity_id = $act"),
			'1 0',
			"last cent ($stripes stripes), both $al: one claim, nothing left");
	}
}

# A freeze or a close committed after A's snapshot was taken.
for my $al ('REPEATABLE READ', 'SERIALIZABLE')
{
	my $act = create("100.00, stripes => 4");
	my ($b, $first, $retry) = a_snapshot_first(
		b_sql => "SELECT redpacket.rp_freeze($act, 'hold')",
		a_level => $al, a_sql => "$claim_cols($act, 'f', 1.00)");
	outcome_ok("A $al snapshot before a freeze", $first, $retry, 'frozen');
	is(user_claims($act, 'f'), 0, "A $al snapshot before a freeze: no claim on the frozen activity");

	$act = create("100.00, stripes => 4");
	$node->safe_psql('postgres', "SELECT redpacket.rp_claim($act, 'x', 1.00)");
	($b, $first, $retry) = a_snapshot_first(
		b_sql => "SELECT redpacket.rp_close_activity($act)",
		a_level => $al, a_sql => "$claim_cols($act, 'f', 1.00)");
	is($b, '99.00', "A $al snapshot before a close: the close returns 99.00");
	outcome_ok("A $al snapshot before a close", $first, $retry, 'ended');
	is(user_claims($act, 'f'), 0, "A $al snapshot before a close: no claim on the closed activity");
}

$a_s->quit;
$b_s->quit;
$monitor->quit;

# --- Part 2: mixed isolation levels under pgbench ------------------------------------

my %act;
$act{rain} = create("500.00, stripes => 4, per_user_limit => 2, name => 'rain'");
$act{fixed} = create("100000.00, stripes => 8, name => 'fixed'");
$act{runout} = create("20.00, stripes => 4, name => 'runs out'");
$act{lucky} = create("300.00, packets => 300, stripes => 4, name => 'lucky'");

my $tmp = PostgreSQL::Test::Utils::tempdir;
my %script;
for my $level ('READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE')
{
	(my $tag = lc $level) =~ s/ /_/g;
	$script{"rain_$tag"} = qq{\\set u random(1, 40)
\\set r random(1, 4)
BEGIN ISOLATION LEVEL $level;
SELECT redpacket.rp_claim($act{rain}, 'w' || :u, 0.10, 'r' || :r);
COMMIT;
};
	$script{"pair_$tag"} = qq{\\set u random(1, 3000)
BEGIN ISOLATION LEVEL $level;
SELECT redpacket.rp_claim($act{fixed}, 'p' || :u, 0.05);
SELECT redpacket.rp_claim($act{runout}, 'p' || :u, 0.05);
SELECT redpacket.rp_claim($act{lucky}, 'p' || (:u % 500));
COMMIT;
};
}
my @files;
for my $name (sort keys %script)
{
	open(my $fh, '>', "$tmp/$name.pgbench") or die;
	print $fh $script{$name};
	close $fh;
	push @files, '-f', "$tmp/$name.pgbench";
}
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[   $node->installed_command('pgbench'), '-n', '-c', '8', '-j', '2', '-t', '250',
		'--max-tries=1000', '--failures-detailed', '--random-seed', '105', @files,
		$node->connstr('postgres') ],
	'>', \$out, '2>', \$err);
ok($ok, 'pgbench with mixed isolation levels exited 0') or diag("$out\n$err");
like($out, qr/number of transactions actually processed: 2000\/2000/, 'every transaction committed');
like($out, qr/number of failed transactions: 0 /, 'no transaction failed for good');
my ($retried) = $out =~ /number of transactions retried: (\d+)/;
my ($serial) = $out =~ /number of serialization failures: (\d+)/;
note('pgbench: ' . ($retried // 0) . ' transactions retried after serialization failures ('
	  . ($serial // 0) . ' serialization failures)');

my $checks = $node->safe_psql(
	'postgres', RedpacketTest::books_view() . qq{
WITH b AS (SELECT *, n_claims AS n FROM rp_books)
SELECT 'unbalanced', count(*) FILTER (WHERE NOT balanced)::text FROM b
UNION ALL
SELECT 'over limit', coalesce(string_agg(user_id || ':' || n, ' '), '') FROM (
    SELECT c.user_id, count(*) n FROM redpacket.claim c JOIN redpacket.activity a ON a.id = c.activity_id
     WHERE a.id IN ($act{rain}, $act{fixed}, $act{runout}, $act{lucky})
     GROUP BY c.activity_id, c.user_id, a.per_user_limit HAVING count(*) > a.per_user_limit) x
UNION ALL
SELECT 'runout', (SELECT n || ' ' || round(remaining, 2) FROM b WHERE id = $act{runout})
UNION ALL
SELECT 'lucky', (SELECT n || ' ' || packets_left FROM b WHERE id = $act{lucky})
UNION ALL
SELECT 'rain', (SELECT n || ' claims, ' || count(DISTINCT user_id) || ' users' FROM redpacket.claim c, b
                WHERE c.activity_id = $act{rain} AND b.id = $act{rain} GROUP BY n)
UNION ALL
SELECT 'not ok', count(*) FILTER (WHERE NOT ok) || '/' || count(*) FROM redpacket.rp_reconcile(NULL, true)});
my %c = map { split /\|/, $_, 2 } split /\n/, $checks;
is($c{unbalanced}, '0', 'every activity: funded = claims + remaining + returned, counts agree');
is($c{'over limit'}, '', 'pgbench run: no user holds more than per_user_limit claims');
is($c{runout}, '400 0.00', 'the activity that ran out paid exactly 400 claims of 0.05');
is($c{lucky}, '300 0', 'every lucky packet was drawn exactly once');
note("rain: $c{rain}");
like($c{'not ok'}, qr{^0/}, 'rp_reconcile(NULL, true) is ok for every activity');
ok(!$node->log_contains(qr/terminated by signal|PANIC|TRAP:/), 'no backend crashed');

$node->stop;
done_testing();
