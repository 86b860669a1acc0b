# Crash safety: 16 clients claim continuously (fixed amounts, lucky draws, a
# red-packet rain with per_user_limit 3, a small budget that runs out,
# batches, multi-claim transactions, rolled-back claims, retries of earlier
# claims) while the reconciliation worker passes every second, and the whole
# server is killed with SIGKILL mid-load, three times.  Each client is a psql
# process in autocommit that prints every result it receives, so the test
# knows exactly which claims were acknowledged.  After every restart:
#   - every acknowledged claim is there, with its user, request and amount;
#   - a retry of an acknowledged claim returns it (duplicate, same id and amount);
#   - rolled-back claims left nothing, and a multi-claim transaction left all
#     or nothing of its claims;
#   - for each activity funded = claims + stripe balances + returned, the
#     claim and packet counts agree, no stripe is negative, no user holds
#     more than per_user_limit claims, an acknowledged `exhausted` was true;
#   - rp_reconcile(id, true) is ok, and no pass of the worker ever failed.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use RedpacketTest;
use Time::HiRes qw(time usleep);

my $CLIENTS = 16;
my $ROUNDS = 3;
my $STATEMENTS = 10000;    # per client and round (a few thousand run before the crash)
srand(101);

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
max_connections = 64
max_locks_per_transaction = 256
log_line_prefix = '%m [%p] %e '
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

my %act;
$act{fixed} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(1000000.00, stripes => 16, name => 'crash fixed')");
$act{lucky} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(3000.00, packets => 2500, stripes => 8, name => 'crash lucky')");
$act{rain} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(1000000.00, stripes => 4, per_user_limit => 3, name => 'crash rain')");
$act{cent7} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(50.00, stripes => 2, name => 'crash 0.07')");
my $all_acts = join(',', map { $act{$_} } sort keys %act);

# What the clients saw, loaded after each restart.  tag: ACK (an autocommit
# statement's result), NOACK (inside a transaction that rolls back), TXN (in
# a transaction whose COMMIT is acknowledged by the TXNOK row of its group).
$node->safe_psql(
	'postgres', q{
CREATE TABLE acks (tag text, round int, client int, grp text, kind text, activity_id bigint,
                   user_id text, request_id text, asked numeric,
                   status redpacket.claim_status, claim_id bigint, amount numeric);
CREATE INDEX ON acks (grp);
CREATE INDEX ON acks (activity_id, user_id);
});

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $psql = $node->installed_command('psql');

sub q_lit { my ($s) = @_; return defined $s ? "'$s'" : 'NULL'; }

# One rp_claim whose result row is printed with the given tag.
sub claim_stmt
{
	my ($tag, $r, $c, $grp, $kind, $aid, $user, $req, $amt) = @_;
	my $a = defined $amt ? $amt : 'NULL';
	my $rq = q_lit($req);
	return "SELECT '$tag', $r, $c, '$grp', '$kind', ${aid}::bigint, '$user', ${rq}::text, "
	  . "${a}::numeric, x.status, x.claim_id, x.amount "
	  . "FROM redpacket.rp_claim($aid, '$user', ${a}::numeric, ${rq}::text) x;\n";
}

sub cents { return sprintf('%.2f', (1 + int(rand($_[0]))) / 100); }

# A client's script for one round.  @$earlier holds acknowledged claims of
# earlier rounds to retry.
sub client_script
{
	my ($r, $c, $earlier) = @_;
	my $sql = '';
	my $n = 0;
	for my $i (1 .. $STATEMENTS)
	{
		my $p = rand();
		my $u = "r${r}c${c}n$i";
		if ($p < 0.35)
		{
			$sql .= claim_stmt('ACK', $r, $c, '', 'fixed', $act{fixed}, $u, undef, cents(300));
		}
		elsif ($p < 0.50)
		{
			$sql .= claim_stmt('ACK', $r, $c, '', 'lucky', $act{lucky}, $u, undef, undef);
		}
		elsif ($p < 0.62)
		{
			# four catches of one user: the fourth is over the limit
			$sql .= claim_stmt('ACK', $r, $c, '', 'rain', $act{rain}, $u, "q$_", cents(100))
			  for 1 .. 4;
		}
		elsif ($p < 0.74)
		{
			$sql .= claim_stmt('ACK', $r, $c, '', 'cent7', $act{cent7}, $u, undef, '0.07');
		}
		elsif ($p < 0.79)
		{
			my @u = map { "${u}b$_" } 1 .. 3;
			my @a = map { cents(300) } 1 .. 3;
			my $ua = join(',', map {"'$_'"} @u);
			my $aa = join(',', @a);
			$sql .=
			    "SELECT 'ACK', $r, $c, '', 'batch', $act{fixed}::bigint, b.user_id, NULL::text, "
			  . "(ARRAY[$aa]::numeric[])[b.ord], b.status, b.claim_id, b.amount "
			  . "FROM redpacket.rp_claim_batch($act{fixed}, ARRAY[$ua], ARRAY[$aa]::numeric[]) b;\n";
		}
		elsif ($p < 0.84)
		{
			$sql .= "BEGIN;\n"
			  . claim_stmt('NOACK', $r, $c, '', 'fixed', $act{fixed}, "${u}x", undef, cents(300))
			  . claim_stmt('NOACK', $r, $c, '', 'rain', $act{rain}, "${u}x", 'q1', cents(300))
			  . "ROLLBACK;\n";
		}
		elsif ($p < 0.90)
		{
			my $g = "r${r}c${c}g$i";
			$sql .= "BEGIN;\n"
			  . claim_stmt('TXN', $r, $c, $g, 'fixed', $act{fixed}, "${u}t", undef, cents(300))
			  . claim_stmt('TXN', $r, $c, $g, 'rain', $act{rain}, "${u}t", 'q1', cents(300))
			  . claim_stmt('TXN', $r, $c, $g, 'lucky', $act{lucky}, "${u}t", undef, undef)
			  . "COMMIT;\n"
			  . "SELECT 'TXNOK', $r, $c, '$g', 'txn', NULL, NULL, NULL, NULL, NULL, NULL, NULL;\n";
		}
		elsif (@$earlier)
		{
			# a retry of an acknowledged claim, asking for another amount
			my $e = $earlier->[ int(rand(@$earlier)) ];
			my ($kind, $aid, $user, $req, $asked) = @$e;
			my $amt = $kind eq 'lucky' ? undef : ($asked eq '0.07' ? '0.07' : cents(300));
			$sql .= claim_stmt('ACK', $r, $c, '', "dup-$kind", $aid, $user, $req eq '' ? undef : $req, $amt);
		}
	}
	return $sql;
}

# Pids whose parent is $ppid, from /proc.
sub children_of
{
	my ($ppid) = @_;
	my @kids;
	opendir(my $dh, '/proc') or die "cannot read /proc: $!";
	for my $d (readdir $dh)
	{
		next unless $d =~ /^\d+$/;
		open(my $fh, '<', "/proc/$d/stat") or next;
		my $stat = <$fh>;
		close $fh;
		next unless defined $stat && $stat =~ /\)\s+(\S)\s+(\d+)/;
		push @kids, $d if $2 == $ppid && $1 ne 'Z';
	}
	closedir $dh;
	return @kids;
}

sub alive
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return 0;
	my $stat = <$fh>;
	close $fh;
	return 0 unless defined $stat && $stat =~ /\)\s+(\S)/;
	return $1 ne 'Z';
}

# Kill the postmaster and every server process at once with SIGKILL, like a
# machine losing power, and wait until they are gone.
sub crash_server
{
	my $pidfile = $node->data_dir . '/postmaster.pid';
	open(my $fh, '<', $pidfile) or die "no $pidfile: $!";
	my $pm = <$fh>;
	close $fh;
	chomp $pm;
	my @kids = children_of($pm);
	kill 'KILL', @kids, $pm;
	$node->kill9;    # forget the pid (it is already dead)
	my $deadline = time() + 30;
	usleep(50_000) while (grep { alive($_) } ($pm, @kids)) && time() < $deadline;
	die "server processes survived SIGKILL" if grep { alive($_) } ($pm, @kids);
	# An init that does not reap orphans leaves the postmaster a zombie,
	# which the next postmaster would take for a running one: remove its
	# lock files as an operator would.
	if (-e "/proc/$pm")
	{
		unlink $pidfile;
		unlink $node->host . '/.s.PGSQL.' . $node->port . '.lock';
	}
	return scalar(@kids);
}

my $checks = RedpacketTest::books_view() . q{
ANALYZE acks;
CREATE TEMP TABLE acked AS
SELECT k.* FROM acks k
WHERE k.tag = 'ACK'
   OR (k.tag = 'TXN' AND k.grp IN (SELECT o.grp FROM acks o WHERE o.tag = 'TXNOK'));
CREATE INDEX ON acked (claim_id);
ANALYZE acked;
CREATE TEMP TABLE books AS SELECT * FROM rp_books;
SELECT 'lost acknowledged claims', count(*) FROM acked k
 WHERE k.status IN ('claimed', 'duplicate')
   AND NOT EXISTS (SELECT 1 FROM redpacket.claim c
                   WHERE c.activity_id = k.activity_id AND c.claim_id = k.claim_id
                     AND c.user_id = k.user_id AND c.amount = k.amount
                     AND c.request_id IS NOT DISTINCT FROM k.request_id)
UNION ALL
SELECT 'retries not answered with the original claim', count(*) FROM acked k
 WHERE k.kind LIKE 'dup-%'
   AND (k.status <> 'duplicate'
        OR NOT EXISTS (SELECT 1 FROM acked o WHERE o.kind NOT LIKE 'dup-%' AND o.status = 'claimed'
                       AND o.claim_id = k.claim_id AND o.amount = k.amount))
UNION ALL
SELECT 'rolled-back claims present', count(*) FROM acks k
  JOIN redpacket.claim c ON c.activity_id = k.activity_id AND c.user_id = k.user_id
 WHERE k.tag = 'NOACK'
UNION ALL
SELECT 'transactions partly present', count(*) FROM (
    SELECT t.grp FROM acks t
     WHERE t.tag = 'TXN' AND t.status = 'claimed'
     GROUP BY t.grp
    HAVING count(*) FILTER (WHERE EXISTS (SELECT 1 FROM redpacket.claim c
                                          WHERE c.activity_id = t.activity_id AND c.claim_id = t.claim_id))
           NOT IN (0, count(*))) x
UNION ALL
SELECT 'unexpected statuses', count(*) FROM acks k
 WHERE k.tag <> 'TXNOK'
   AND (k.status IS NULL OR k.status IN ('frozen', 'not_started', 'ended')
        OR (k.kind IN ('fixed', 'batch') AND k.status <> 'claimed')
        OR (k.kind = 'rain' AND k.request_id = 'q4' AND k.status <> 'user_limit')
        OR (k.kind = 'rain' AND k.request_id <> 'q4' AND k.status <> 'claimed'))
UNION ALL
SELECT 'false exhaustion', count(*) FROM acked k JOIN books b ON b.id = k.activity_id
 WHERE k.status = 'exhausted'
   AND ((k.asked IS NOT NULL AND b.remaining >= k.asked) OR (k.asked IS NULL AND b.packets_left > 0))
UNION ALL
SELECT 'books out of balance', count(*) FROM books WHERE NOT balanced
UNION ALL
SELECT 'users over their limit', count(*) FROM (
    SELECT 1 FROM redpacket.claim c JOIN redpacket.activity a ON a.id = c.activity_id
     GROUP BY c.activity_id, c.user_id, a.per_user_limit HAVING count(*) > a.per_user_limit) x
UNION ALL
SELECT 'frozen activities', count(*) FROM redpacket.activity WHERE frozen_reason IS NOT NULL
UNION ALL
SELECT 'failed reconciliation passes (worker or ours)', count(*) FROM redpacket.reconciliation WHERE NOT ok
UNION ALL
SELECT 'rp_reconcile(id, true) not ok', count(*)
  FROM redpacket.activity a, LATERAL redpacket.rp_reconcile(a.id, true) r WHERE NOT r.ok;
};

my $start_time = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my @earlier;
my %total = (acked => 0, in_flight => 0, killed => 0);

for my $round (1 .. $ROUNDS)
{
	my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM redpacket.claim');
	my @clients;
	for my $c (1 .. $CLIENTS)
	{
		my $script = "$tmp/r${round}c$c.sql";
		open(my $fh, '>', $script) or die;
		print $fh client_script($round, $c, \@earlier);
		close $fh;
		my @cmd = (
			$psql, '-X', '-q', '-At', '-F', '|', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres'), '-f', $script);
		push @clients,
		  IPC::Run::start(\@cmd, '>', "$tmp/r${round}c$c.out", '2>', "$tmp/r${round}c$c.err");
	}

	# Let the load build up, then pull the plug at a random moment.
	usleep(1_500_000 + int(rand(1_500_000)));
	my $log_offset = -s $node->logfile;
	$total{killed} += crash_server();

	# Clients see the connection drop and stop: psql exits with 2 when it
	# loses the server, or with 3 when the dying connection's last message
	# reached it as the failure of a statement (ON_ERROR_STOP; which of the
	# two depends on timing, and any ERROR before the crash is caught
	# below).  0 would mean it ran out of statements first.
	$_->finish for @clients;
	my @codes = map { $_->result(0) } @clients;
	is(join(',', grep { $_ != 2 && $_ != 3 } @codes), '',
		"round $round: all $CLIENTS clients were claiming when the server died and lost their connection");
	my $client_errors = '';
	for my $c (1 .. $CLIENTS)
	{
		my $err = slurp_file("$tmp/r${round}c$c.err");
		$client_errors .= "client $c: $1\n" while $err =~ /^(.*ERROR:.*)$/mg;
	}
	is($client_errors, '', "round $round: no client saw an error before the crash");

	$node->start;
	ok($node->log_contains(qr/database system was interrupted|not properly shut down/, $log_offset),
		"round $round: the server went through crash recovery");

	# Load what the clients saw.
	my $copy = '';
	for my $c (1 .. $CLIENTS)
	{
		$copy .= "\\copy acks from '$tmp/r${round}c$c.out' with (format text, delimiter '|', null '')\n";
	}
	$node->safe_psql('postgres', $copy);
	my ($acked, $in_db) = split /\|/, $node->safe_psql(
		'postgres', qq{
SELECT (SELECT count(*) FROM acks k WHERE round = $round AND status = 'claimed'
           AND (tag = 'ACK' OR (tag = 'TXN' AND EXISTS (SELECT 1 FROM acks o WHERE o.tag = 'TXNOK' AND o.grp = k.grp)))),
       (SELECT count(*) FROM redpacket.claim) - $before});
	my $txns = $node->safe_psql('postgres', "SELECT count(*) FROM acks WHERE round = $round AND tag = 'TXNOK'");
	note("round $round: $acked claims acknowledged as claimed ($txns transactions), "
		  . "$in_db new claim rows after recovery");
	cmp_ok($acked, '>', 500, "round $round: clients were acknowledged a good number of claims");

	my $t0 = time();
	my $res = $node->safe_psql('postgres', $checks);
	note(sprintf("round %d: checks took %.1f s", $round, time() - $t0));
	for my $line (split /\n/, $res)
	{
		my ($what, $n) = split /\|/, $line;
		is($n, 0, "round $round: $what: none");
	}
	$total{acked} += $acked;
	$total{in_flight} += $in_db - $acked;

	# Claims acknowledged so far, for the next round's retries.
	@earlier = map { [ split /\|/, $_, -1 ] } split /\n/, $node->safe_psql(
		'postgres', q{
SELECT kind, activity_id, user_id, coalesce(request_id, ''), coalesce(asked::text, '')
FROM acks WHERE tag = 'ACK' AND status = 'claimed' AND kind IN ('fixed', 'lucky', 'rain', 'cent7')
ORDER BY random() LIMIT 2000});
}

isnt($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$start_time, 'the server was restarted');
my $summary = $node->safe_psql(
	'postgres', q{
SELECT string_agg(format('%s %s: %s', kind, status, n), ', ' ORDER BY kind, status)
FROM (SELECT kind, status, count(*) n FROM acks k
      WHERE tag = 'ACK' OR (tag = 'TXN' AND grp IN (SELECT grp FROM acks WHERE tag = 'TXNOK'))
      GROUP BY 1, 2) x});
note("acknowledged results by kind and status: $summary");
note("over $ROUNDS crashes: $total{acked} acknowledged claims, $total{in_flight} claims committed "
	  . "without the client seeing the result, $total{killed} server processes killed");
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE NOT ok) FROM redpacket.rp_reconcile(NULL, true)"),
	0,
	'a full reconciliation pass over every activity is ok at the end');
ok(!$node->log_contains(qr/terminated by signal (?!9)|PANIC|TRAP:/),
	'no backend crashed on its own (only our SIGKILLs)');

$node->stop;
done_testing();
