# The superuser reconciler cannot be stopped or held up from outside its pass:
# database settings of a non-superuser owner (default_transaction_read_only,
# default_transaction_isolation, lock_timeout, statement_timeout) do not apply
# to it; a long pass gives way to DROP DATABASE and CREATE DATABASE ...
# TEMPLATE (which PostgreSQL 15 does not signal to background workers); and
# with redpacket.max_workers = 1, a claim transaction left open in one
# database costs its activity one check (an 'error' after the reconciler's
# 5 s lock timeout, which is not a failed check: activity_status and the
# reconciler's counters tell it apart from a mismatch), not the reconciling
# of every other database; tables locked longer than that timeout cost a
# pass, logged, not the worker.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;
use Time::HiRes qw(usleep);

my $node = RedpacketTest::node(
	'guard', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
redpacket.max_workers = 1
max_locks_per_transaction = 256
});

# poll for at most $secs seconds (the defects make the default 180 s wait)
sub within
{
	my ($db, $sql, $secs) = @_;
	my $until = time() + $secs;
	while (time() < $until)
	{
		return 1 if $node->safe_psql($db, $sql) eq 't';
		usleep(200_000);
	}
	return 0;
}

my $settled = q{SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = };

# --- database settings of the owner do not apply to the reconciler ----------

$node->safe_psql('postgres', 'CREATE ROLE dbowner LOGIN');
$node->safe_psql('postgres', 'CREATE DATABASE ro OWNER dbowner');
$node->safe_psql('ro', 'CREATE EXTENSION redpacket');
my $ro = $node->safe_psql('ro',
	"SELECT redpacket.rp_create_activity(10.00, 5, now() - interval '1 hour', now() + interval '1 s', stripes => 2)");
$node->safe_psql('ro', qq{
SET ROLE dbowner;
ALTER DATABASE ro SET default_transaction_read_only = on;
ALTER DATABASE ro SET default_transaction_isolation = 'serializable';
ALTER DATABASE ro SET lock_timeout = '1ms';
});
ok(within('ro', "$settled$ro", 30),
	'default_transaction_read_only of the database does not stop settlement');
ok(within('ro', "SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $ro AND ok", 10),
	'the pass recorded an ok check');
$node->safe_psql('postgres', 'DROP DATABASE ro');

# --- a long pass gives way to CREATE DATABASE ... TEMPLATE and DROP DATABASE --

# every recorded check sleeps 0.5 s: a pass over 40 activities lasts 20 s,
# longer than the 5 s those commands wait for other sessions to leave
$node->safe_psql('postgres', 'CREATE DATABASE big');
$node->safe_psql('big', q{
CREATE EXTENSION redpacket;
CREATE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql
  AS 'BEGIN PERFORM pg_catalog.pg_sleep(0.5); RETURN NULL; END';
CREATE TRIGGER slow AFTER INSERT ON redpacket.reconciliation
  FOR EACH ROW EXECUTE FUNCTION public.slow();
SELECT count(redpacket.rp_claim(redpacket.rp_create_activity(5.00, 5, stripes => 1), 'u', 1.00))
  FROM generate_series(1, 40);
});
my $in_pass = q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'redpacket reconciler' AND datname = 'big' AND wait_event = 'PgSleep'};
ok(within('postgres', $in_pass, 30), 'a slow pass runs in big');
my ($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE copy TEMPLATE big');
is($ret, 0, 'CREATE DATABASE ... TEMPLATE succeeds during a long pass') or diag $err;
$node->safe_psql('postgres', 'DROP DATABASE IF EXISTS copy');
ok(within('postgres', $in_pass, 30), 'the pass goes on afterwards');
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE big');
is($ret, 0, 'DROP DATABASE succeeds during a long pass') or diag $err;

# --- one open claim transaction does not stop other databases ---------------

$node->safe_psql('postgres', 'CREATE DATABASE a');
$node->safe_psql('a', 'CREATE EXTENSION redpacket');
# (no packet cap: a claim of an amount takes one stripe, where in a lucky
# draw, whose money is dealt, it would gather every stripe)
my $held_act = $node->safe_psql('a', "SELECT redpacket.rp_create_activity(100.00, stripes => 4)");
# a claim in flight holds a stripe; a committed claim (on another stripe)
# makes the pass check this activity, so a's reconciler waits for the stripe
my $held = $node->background_psql('a');
$held->query_safe("BEGIN; SELECT redpacket.rp_claim($held_act, 'held', 1.00)");
$node->safe_psql('a', "SELECT redpacket.rp_claim($held_act, 'first', 1.00)");
ok(within('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'redpacket reconciler' AND datname = 'a' AND wait_event_type = 'Lock'}, 30),
	"a's reconciler waits for the held stripe");

$node->safe_psql('postgres', 'CREATE DATABASE b');
$node->safe_psql('b', 'CREATE EXTENSION redpacket');
my $b = $node->safe_psql('b',
	"SELECT redpacket.rp_create_activity(10.00, 5, now() - interval '1 hour', now() + interval '1 s', stripes => 1)");
ok(within('b', "$settled$b", 40),
	'max_workers = 1: b is settled while a claim transaction in a stays open');
ok( within('a', qq{SELECT count(*) > 0 FROM redpacket.reconciliation
 WHERE activity_id = $held_act AND NOT ok AND problems OPERATOR(pg_catalog.@>) ARRAY['error']}, 20),
	"the lock timeout is recorded as an 'error' check of a's activity");
is($node->safe_psql('a', "SELECT frozen_at IS NULL FROM redpacket.activity WHERE id = $held_act"),
	't', 'the lock timeout does not freeze the activity');
# a check that could not run is not a failed one: nothing says the books
# are wrong, everything says it could not check
is( $node->safe_psql(
		'a', qq{
SELECT last_reconcile_ok IS DISTINCT FROM false, unchecked_since IS NOT NULL,
       last_check_error LIKE '%lock timeout%'
  FROM redpacket.activity_status WHERE id = $held_act}),
	't|t|t',
	'activity_status: no check says the books are wrong; unchecked since the timeout, and why');
is( $node->safe_psql(
		'a', 'SELECT mismatches, unchecked > 0, failing FROM redpacket.reconciler_status'),
	'0|t|0', 'reconciler_status: no mismatch, no activity failing, the unchecked counted apart');
ok($node->log_contains(qr/canceling statement due to lock timeout/), 'the log says why');
$held->query_safe('COMMIT');
$held->quit;
ok(within('a', qq{SELECT count(*) > 0 FROM redpacket.reconciliation
 WHERE activity_id = $held_act AND ok AND expected_claims = 2}, 40),
	"once the claim commits, a's activity is checked ok");
is( $node->safe_psql(
		'a', "SELECT last_reconcile_ok, unchecked_since IS NULL FROM redpacket.activity_status WHERE id = $held_act"),
	't|t', 'and it is not unchecked any more');

# --- tables locked longer than the lock timeout: the pass is skipped --------

# DDL, or rp_distribute() converting the tables on a Citus cluster, holds
# them in ACCESS EXCLUSIVE mode: the listing of a pass times out after 5 s.
# That used to end the reconciler with an error (exit code 1) on every pass.
my $from = -s $node->logfile;
my $ddl = $node->background_psql('a');
$ddl->query_safe('BEGIN; LOCK TABLE redpacket.activity IN ACCESS EXCLUSIVE MODE');
my $skipped = 0;
for (1 .. 150)
{
	last if ($skipped = $node->log_contains(qr/redpacket reconciler skipped a pass/, $from));
	usleep(200_000);
}
ok($skipped, 'a pass that cannot list for the lock timeout is skipped and logged');
$ddl->query_safe('COMMIT');
$ddl->quit;
ok(!$node->log_contains(qr/"redpacket reconciler" \(PID \d+\) exited with exit code [1-9]/, $from),
	'the reconciler does not fail on locked tables');
$node->safe_psql('a', "SELECT redpacket.rp_claim($held_act, 'after_ddl', 1.00)");
ok(within('a', qq{SELECT count(*) > 0 FROM redpacket.reconciliation
 WHERE activity_id = $held_act AND ok AND expected_claims = 3}, 40),
	'the next pass checks the activity');

ok(!$node->log_contains(qr/PANIC|terminated by signal/), 'no crash');
$node->stop('fast');
done_testing();
