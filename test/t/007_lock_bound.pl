# A pass never exhausts the shared lock table, and a restore pauses it.
#
# With the default lock table (max_connections = 100,
# max_locks_per_transaction = 64: about 7,800 entries for the whole server on
# PostgreSQL 15, 8,700 on 18, whose 16 autovacuum worker slots count as
# backends; advisory locks never take 18's larger fast-path slots, which are
# for relation locks), 24 activities of 1024 stripes each expire at the same
# moment.  Settling an
# activity locks all its stripes; a pass that kept them all until its end
# would need 24,576 locks, fail with "out of shared memory" forever, and
# starve every other session.  The worker commits per activity: all 24 are
# settled within a minute, the log has no "out of shared memory", and
# pgbench clients claiming on another activity meanwhile never fail.
#
# Then the restore flag: with ALTER DATABASE ... SET redpacket.restoring =
# on, the worker writes nothing (an expired activity stays unsettled, no
# reconciliation row appears); once it is reset the activity is settled.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;
use Time::HiRes qw(time usleep);

my $node = RedpacketTest::node(
	'lock_bound', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
max_connections = 100
max_locks_per_transaction = 64
});

sql('CREATE EXTENSION redpacket');
is(sql('SHOW max_locks_per_transaction') . '|' . sql('SHOW max_connections'),
	'64|100', 'the default lock table');

# 24 activities of 1024 stripes, a few claims each; they end in 10 minutes
# for now (creating them takes a while), then all at once.
my $ids = sql(q{
SELECT string_agg(redpacket.rp_create_activity(100.00, stripes => 1024,
                  ends_at => now() + interval '10 min', name => 'big ' || g)::text, ',')
  FROM generate_series(1, 24) g});
my @big = split /,/, $ids;
is(scalar @big, 24, '24 activities created');
is(sql("SELECT min(stripes) || '|' || count(*) FROM redpacket.activity WHERE id IN ($ids)"),
	'1024|24', 'each has 1024 stripes');
# (0.05 fits in one stripe of about 0.10: a larger claim would gather,
# locking every stripe of its activity until the statement's transaction ends)
sql(qq{SELECT redpacket.rp_claim(a, 'early' || g, 0.05)
         FROM unnest('{$ids}'::bigint[]) a, generate_series(1, 3) g});

my $busy = sql("SELECT redpacket.rp_create_activity(1000000.00, stripes => 16, name => 'busy')");

# Claimers on another activity, running through the settlement.
my $script = $node->basedir . '/claim.sql';
PostgreSQL::Test::Utils::append_to_file($script, qq{\\set u random(1, 1000000000)
SELECT redpacket.rp_claim($busy, 'p' || :client_id || '-' || :u, 0.01);
});
my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[
		'pgbench', '--no-vacuum', '--client=4', '--jobs=2', '--time=25',
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres'
	],
	'>', \$out, '2>', \$err);
sleep 2;

my $log_offset = -s $node->logfile;
my $expired_at = sql(qq{SET session_replication_role = replica;
                         UPDATE redpacket.activity SET ends_at = clock_timestamp()
                         WHERE id IN ($ids) RETURNING 1});
my $t0 = time;
my $settled = $node->poll_query_until('postgres', qq{
SELECT count(*) = 24 FROM redpacket.activity a
 WHERE a.id IN ($ids) AND a.closed_at IS NOT NULL
   AND EXISTS (SELECT FROM redpacket.ledger l WHERE l.activity_id = a.id AND l.kind = 'return')});
my $secs = time - $t0;
ok($settled, 'all 24 expired activities were settled');
cmp_ok($secs, '<', 60, sprintf('within a minute (%.1f s)', $secs));

$bench->finish;
is($bench->result(0), 0, 'the claimers ran without a failure');
like($out, qr/number of failed transactions: 0 /, 'pgbench: no failed transaction');
is($err, '', 'pgbench: no error');
cmp_ok(
	sql(qq{SELECT count(*) FROM redpacket.claim c, redpacket.activity a
	        WHERE c.activity_id = $busy AND a.id = $big[0]
	          AND c.claimed_at BETWEEN a.ends_at AND a.closed_at}),
	'>', 0, 'claims on another activity went on while the pass settled');

ok(!$node->log_contains(qr/out of shared memory/, 0), 'no "out of shared memory" in the log');
ok(!$node->log_contains(qr/HINT:.*max_locks_per_transaction/, 0), 'no lock table hint in the log');

# The books of the settled activities: stripes empty, the return is what
# was not claimed, and the pass checked each one ok.
is( sql(qq{
SELECT count(*) FROM redpacket.activity a
 CROSS JOIN LATERAL (SELECT sum(balance) AS b, count(*) FILTER (WHERE balance <> 0) AS nz
                       FROM redpacket.stripe s WHERE s.activity_id = a.id) s
 CROSS JOIN LATERAL (SELECT sum(amount) AS r FROM redpacket.ledger l
                      WHERE l.activity_id = a.id AND l.kind = 'return') l
 CROSS JOIN LATERAL (SELECT sum(amount) AS c FROM redpacket.claim c WHERE c.activity_id = a.id) c
 WHERE a.id IN ($ids) AND s.b = 0 AND s.nz = 0 AND l.r = 99.85 AND c.c = 0.15}),
	'24', 'each settled activity returned 99.85 and its stripes are empty');
is( sql(qq{
SELECT count(*) FROM redpacket.activity a
 WHERE a.id IN ($ids)
   AND (SELECT r.ok FROM redpacket.reconciliation r
         WHERE r.activity_id = a.id AND r.checked_at >= a.closed_at
         ORDER BY r.pass_id DESC LIMIT 1)}),
	'24', 'every settled activity was checked ok when settled');
is(sql('SELECT failures FROM redpacket.reconciler_status'), '0',
	'reconciler_status: the last pass had no failure');

# --- The restore flag: the worker writes nothing --------------------------------

sql('ALTER DATABASE postgres SET redpacket.restoring = on');
my $paused = sql(q{SELECT redpacket.rp_create_activity(5.00, stripes => 2,
                   ends_at => clock_timestamp() + interval '1 s', name => 'during restore')});
my $rows = sql('SELECT count(*) FROM redpacket.reconciliation');
my $status = sql('SELECT last_pass_finished_at FROM redpacket.reconciler_status');
sleep 4;
is(sql("SELECT closed_at IS NULL FROM redpacket.activity WHERE id = $paused"),
	't', 'restoring: the expired activity is not settled');
is(sql('SELECT count(*) FROM redpacket.reconciliation'), $rows,
	'restoring: no reconciliation row written');
is(sql('SELECT last_pass_finished_at FROM redpacket.reconciler_status'), $status,
	'restoring: not even the status row');
sql('ALTER DATABASE postgres RESET redpacket.restoring');
ok( $node->poll_query_until('postgres',
		"SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $paused"),
	'after the restore the activity is settled');

$node->stop;
done_testing();
