# The reconciliation background workers: the launcher starts when redpacket
# is in shared_preload_libraries, waits quietly while the extension is
# absent, and every redpacket.reconcile_interval seconds has a short-lived
# reconciler run a pass over what changed (new claims get ok rows,
# activity_status shows them; an unchanged activity is left alone; no busy
# loop).  The postmaster restarts the launcher after pg_terminate_backend;
# interval 0 pauses it and a reload resumes it (a reload also cuts a long
# sleep short).  Claims running beside the passes, including one that
# commits after a later claim id, never cause a false mismatch, whatever
# default_transaction_isolation says.  It survives DROP/CREATE EXTENSION,
# ignores the obsolete redpacket.database (every database with the
# extension is reconciled), and shuts down cleanly.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = RedpacketTest::node(
	'worker', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});

my $worker_q =
  "SELECT pid FROM pg_stat_activity WHERE backend_type = 'redpacket launcher'";

# The pid of the one launcher, waiting for it to be (back) up; dies on timeout.
sub worker_pid
{
	my ($not_pid) = @_;
	my $cond = defined $not_pid ? " AND pid <> $not_pid" : '';
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity"
		  . " WHERE backend_type = 'redpacket launcher'$cond")
	  or die "redpacket launcher did not show up";
	return $node->safe_psql('postgres', $worker_q);
}

# Rows recorded for an activity so far.
sub passes
{
	my ($aid) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM redpacket.reconciliation WHERE activity_id = $aid");
}

# --- Before CREATE EXTENSION: the worker runs and skips quietly -----------

my $pid = worker_pid();
like($pid, qr/^\d+$/, 'launcher is running with only shared_preload_libraries');
is( $node->safe_psql(
		'postgres',
		"SELECT datname IS NULL, application_name FROM pg_stat_activity WHERE pid = $pid"),
	't|redpacket launcher',
	'the launcher is connected to no database');

my $log_offset = -s $node->logfile;
sleep 3;
is($node->safe_psql('postgres', $worker_q),
	$pid, 'without the extension the launcher stays up (not restarted)');
ok( !$node->log_contains(qr/ERROR|FATAL|PANIC/, 0),
	'without the extension the launcher and its reconcilers log no error');

# --- Healthy activity gets ok rows ------------------------------------------

$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');
my $aid = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(100.00, 10, stripes => 4, name => 'healthy')"
);
$node->safe_psql(
	'postgres', qq{
SELECT redpacket.rp_claim($aid, 'u' || g, 1.50) FROM generate_series(1, 3) g;
SELECT redpacket.rp_claim($aid, 'lucky');
});

ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND expected_claims = 4"
	),
	'worker recorded a pass for the new activity');
is( $node->safe_psql(
		'postgres', qq{
SELECT bool_and(ok), count(*) FILTER (WHERE drift <> 0), bool_and(expected = actual)
  FROM redpacket.reconciliation WHERE activity_id = $aid}),
	't|0|t',
	'every pass of the healthy activity is ok, no drift');

my $claimed = $node->safe_psql('postgres',
	"SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $aid");
is( $node->safe_psql(
		'postgres', qq{
SELECT expected = 100.00 - $claimed, actual = expected, expected_claims, actual_claims
  FROM redpacket.reconciliation WHERE activity_id = $aid
 ORDER BY pass_id DESC LIMIT 1}),
	't|t|4|4',
	'the pass checks funded - claimed = stripe balances, and the claim count');

is( $node->safe_psql(
		'postgres', qq{
SELECT state, last_reconciled_at IS NOT NULL, last_reconcile_ok
  FROM redpacket.activity_status WHERE id = $aid}),
	'active|t|t',
	'activity_status shows last_reconciled_at and last_reconcile_ok');

# Make a claim and return its id.
sub claim
{
	my ($act, $user) = @_;
	return $node->safe_psql('postgres',
		"SELECT claim_id FROM redpacket.rp_claim($act, '$user', 0.10)");
}

# Has a pass counted this claim (moved the activity's watermark past it)?
sub counted_q
{
	my ($act, $claim_id) = @_;
	return "SELECT last_claim_id >= $claim_id FROM redpacket.reconcile_state WHERE activity_id = $act";
}

# Interval 1 s: each new claim is counted by the next pass, about a second
# later, by exactly one ok pass.
for my $i (1 .. 3)
{
	my $cid = claim($aid, "tick$i");
	my $t0 = time;
	$node->poll_query_until('postgres', counted_q($aid, $cid))
	  or die "claim $cid never reconciled";
	my $secs = time - $t0;
	cmp_ok($secs, '<=', 4,
		sprintf('claim %d counted by the worker within two intervals (%.1f s)', $i, $secs));
	sleep 1 if $i < 3;
}
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*), sum(new_claims), bool_and(ok) FROM redpacket.reconciliation
 WHERE activity_id = $aid AND expected_claims > 4}),
	'3|3|t',
	'one ok pass per new claim, each counting it once');

# An activity that did not change is not checked again (passes are over
# what changed), and between passes the worker sleeps: no busy loop.
sub cpu_ticks
{
	my ($p) = @_;
	my @f = split ' ', slurp_file("/proc/$p/stat") =~ s/^.*\) //sr;
	return $f[11] + $f[12];    # utime + stime
}
my $n0 = passes($aid);
my $ticks = cpu_ticks($pid);
sleep 5;
is(passes($aid), $n0, 'an unchanged activity gets no new pass');
cmp_ok(cpu_ticks($pid) - $ticks, '<', 50,
	'the launcher used little CPU over 5 s (sleeps on its latch)');

# --- pg_terminate_backend: the postmaster restarts the launcher ------------

$log_offset = -s $node->logfile;
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"),
	't', 'terminated the launcher');
my $t0 = time;
my $new_pid = worker_pid($pid);
my $restart_s = time - $t0;
isnt($new_pid, $pid, 'launcher came back with a new pid');
cmp_ok($restart_s, '<', 15,
	sprintf('launcher back within a few seconds (%.1f s)', $restart_s));
ok( !$node->log_contains(qr/terminated by signal|server process .* was terminated/,
		$log_offset),
	'terminating the launcher is not a crash');
$pid = $new_pid;

my $cid = claim($aid, 'after-restart');
ok($node->poll_query_until('postgres', counted_q($aid, $cid)),
	'restarted launcher resumes passes');

# --- interval 0 pauses, reload with 1 resumes ------------------------------

$node->safe_psql('postgres',
	'ALTER SYSTEM SET redpacket.reconcile_interval = 0');
$node->reload;
sleep 2;    # let a pass in flight finish and the worker see the reload
$n0 = passes($aid);
$cid = claim($aid, 'paused');
sleep 5;
is($node->safe_psql('postgres', counted_q($aid, $cid)),
	'f', 'interval 0: a new claim is not reconciled over 5 seconds');
is(passes($aid), $n0, 'interval 0: no pass at all');
is($node->safe_psql('postgres', $worker_q),
	$pid, 'interval 0: the launcher is still there (same pid)');

$node->safe_psql('postgres',
	'ALTER SYSTEM SET redpacket.reconcile_interval = 1');
$node->reload;
$t0 = time;
ok($node->poll_query_until('postgres', counted_q($aid, $cid)),
	'reload with interval 1 resumes the passes');
cmp_ok(time - $t0, '<', 10, 'resumed within a few seconds');
is($node->safe_psql('postgres', $worker_q),
	$pid, 'resume needed no restart');

# A long interval is cut short by a reload: the worker sleeps on its latch,
# which SIGHUP sets, so it need not wait out the old interval.
$node->safe_psql('postgres',
	'ALTER SYSTEM SET redpacket.reconcile_interval = 600');
$node->reload;
sleep 2;
$cid = claim($aid, 'long-interval');
sleep 3;
is($node->safe_psql('postgres', counted_q($aid, $cid)),
	'f', 'interval 600: a new claim waits for the next pass');
$node->safe_psql('postgres',
	'ALTER SYSTEM SET redpacket.reconcile_interval = 1');
$node->reload;
$t0 = time;
ok($node->poll_query_until('postgres', counted_q($aid, $cid)),
	'interval 600 -> 1: passes resume');
cmp_ok(time - $t0, '<', 5,
	'the reload woke the launcher (it did not sleep out the 600 s interval)');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE NOT ok) FROM redpacket.reconciliation WHERE activity_id = $aid"
	),
	'0',
	'every pass of the healthy activity was ok');

# --- No false alarm from claims running beside the worker --------------------

# Concurrent claims of every kind (fixed, lucky, rain, batch, and transactions that
# hold a stripe for a while) during passes at interval 1: every pass is ok.
my $fixed = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(100000.00, stripes => 8)");
my $lucky = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(5000.00, 20000, stripes => 8)");
my $rain = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(5000.00, stripes => 4, per_user_limit => 5)");
$n0 = $node->safe_psql('postgres',
	'SELECT coalesce(max(pass_id), 0) FROM redpacket.reconciliation');
$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --time=6',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'claims run beside the worker',
	{
		'001_claims@5' => qq{
\\set u random(1, 100000000)
SELECT redpacket.rp_claim($fixed, :client_id || '-' || :u, 0.07);
SELECT redpacket.rp_claim($lucky, :client_id || '-' || :u);
SELECT redpacket.rp_claim($rain, (:u % 50)::text, 0.01, :client_id || '-' || :u);
},
		'001_batch@2' => qq{
\\set u random(1, 100000000)
SELECT count(*) FROM redpacket.rp_claim_batch($fixed,
       ARRAY['b' || :client_id || '-' || :u || '-1', 'b' || :client_id || '-' || :u || '-2'],
       ARRAY[0.03, 0.04]);
SELECT count(*) FROM redpacket.rp_claim_batch($lucky,
       ARRAY['b' || :client_id || '-' || :u || '-1', 'b' || :client_id || '-' || :u || '-2']);
},
		'001_held@1' => qq{
\\set u random(1, 100000000)
BEGIN;
SELECT redpacket.rp_claim($fixed, 'h' || :client_id || '-' || :u, 0.05);
SELECT pg_sleep(0.05);
SELECT redpacket.rp_claim($lucky, 'h' || :client_id || '-' || :u);
COMMIT;
}
	});
ok( $node->poll_query_until(
		'postgres', qq{
SELECT count(DISTINCT activity_id) = 3 FROM redpacket.reconciliation r
  JOIN redpacket.reconcile_state s USING (activity_id)
 WHERE activity_id IN ($fixed, $lucky, $rain) AND s.last_claim_id >= (
       SELECT coalesce(max(claim_id), 0) FROM redpacket.claim c
        WHERE c.activity_id = r.activity_id)}),
	'the worker caught up with every claim of the load');
is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FILTER (WHERE NOT ok), count(*) > 3
  FROM redpacket.reconciliation
 WHERE activity_id IN ($fixed, $lucky, $rain) AND pass_id > $n0}),
	'0|t',
	'under concurrent claims every pass is ok');
is( $node->safe_psql(
		'postgres', qq{
SELECT string_agg(DISTINCT state, ',') FROM redpacket.activity_status
 WHERE id IN ($fixed, $lucky, $rain)}),
	'active',
	'under concurrent claims nothing is frozen');
is( $node->safe_psql(
		'postgres', qq{
SELECT bool_and(c.n = s.claim_count)
  FROM redpacket.reconcile_state s
  JOIN (SELECT activity_id, count(*) AS n FROM redpacket.claim GROUP BY 1) c USING (activity_id)
 WHERE activity_id IN ($fixed, $lucky, $rain)}),
	't',
	'the incremental watermark counted every claim exactly once');

# A claim that took its claim id first but commits last, while a pass waits
# for its stripe: the pass must not move its watermark past that claim.  It
# must hold under the server's default isolation level, whatever an
# operator configured (default_transaction_isolation applies to the worker
# too).
for my $iso ('read committed', 'repeatable read')
{
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET default_transaction_isolation = '$iso'");
	$node->reload;
	sleep 2;    # the worker reloads on its next wake-up

	# no packet cap: a claim of an amount takes one stripe (a lucky draw's
	# money is dealt, so a claim of an amount there gathers every stripe)
	my $act = $node->safe_psql('postgres',
		"SELECT redpacket.rp_create_activity(100.00, stripes => 4)");
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $act"
	) or die;

	my $held = $node->background_psql('postgres');
	$held->query_safe(
		"BEGIN ISOLATION LEVEL READ COMMITTED; SELECT redpacket.rp_claim($act, 'held', 1.00)");
	$node->safe_psql('postgres', "SELECT redpacket.rp_claim($act, 'quick', 1.00)");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE backend_type = 'redpacket reconciler'"
		),
		"$iso: a pass waits for the stripe of the claim in flight");
	$held->query_safe('COMMIT');
	$held->quit;

	# one more claim, and wait for a pass to count it (no claim_id means
	# the activity got frozen already: then just give the worker a pass)
	my $final = claim($act, 'final');
	if ($final ne '')
	{
		$node->poll_query_until('postgres', counted_q($act, $final)) or die;
	}
	else
	{
		sleep 2;
	}
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FILTER (WHERE NOT ok), max(expected_claims), max(actual_claims)
  FROM redpacket.reconciliation WHERE activity_id = $act}),
		'0|3|3',
		"$iso: no false mismatch for a claim that committed out of id order");
	is( $node->safe_psql(
			'postgres', "SELECT state FROM redpacket.activity_status WHERE id = $act"),
		'active', "$iso: the healthy activity is not frozen");
}
$node->safe_psql('postgres', 'ALTER SYSTEM RESET default_transaction_isolation');
$node->reload;

# --- DROP / CREATE EXTENSION under a running worker -------------------------

$log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
sleep 3;
is($node->safe_psql('postgres', $worker_q),
	$pid, 'launcher stays up after DROP EXTENSION');
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');
$aid = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(5.00, 5, stripes => 2)");
$node->safe_psql('postgres', "SELECT redpacket.rp_claim($aid, 'again')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 AND bool_and(ok) FROM redpacket.reconciliation WHERE activity_id = $aid"
	),
	'after DROP and CREATE EXTENSION the worker reconciles the new schema');
is($node->safe_psql('postgres', $worker_q),
	$pid, 'no launcher restart across DROP/CREATE EXTENSION');
ok(!$node->log_contains(qr/ERROR|FATAL|PANIC/, $log_offset),
	'no error in the log across DROP/CREATE EXTENSION');

# --- redpacket.database is obsolete: every database is served (restart) ------

$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('appdb', 'CREATE EXTENSION redpacket');
$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.database = 'appdb'");
$log_offset = -s $node->logfile;
$node->restart;
$pid = worker_pid();
ok( $node->wait_for_log(
		qr/LOG:  redpacket.database is obsolete and ignored/, $log_offset),
	'redpacket.database set: the launcher says it is ignored');
my $app_aid = $node->safe_psql('appdb',
	"SELECT redpacket.rp_create_activity(5.00, 5, stripes => 2)");
$node->safe_psql('appdb', "SELECT redpacket.rp_claim($app_aid, 'x', 1.00)");
ok( $node->poll_query_until(
		'appdb',
		"SELECT count(*) > 0 AND bool_and(ok) FROM redpacket.reconciliation WHERE activity_id = $app_aid AND expected_claims = 1"
	),
	'the reconcilers serve the activities of appdb');
my $pg_claim = claim($aid, 'also-in-postgres');
ok($node->poll_query_until('postgres', counted_q($aid, $pg_claim)),
	'and still those of postgres');

# --- fast shutdown is clean --------------------------------------------------

$log_offset = -s $node->logfile;
$node->stop('fast');
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/terminated by signal/, 'fast shutdown: no worker killed by a signal');
unlike($log, qr/PANIC|server process .* was terminated/,
	'fast shutdown: no crash');
like($log, qr/database system is shut down/, 'fast shutdown completed');

done_testing();
