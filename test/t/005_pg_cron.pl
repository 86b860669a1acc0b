# rp_reconcile scheduled by pg_cron, with the worker paused so that only
# cron runs the pass: in cron's own database, and, with the README's
# statements as written (cron.schedule_in_database), in another database,
# where a plain cron.schedule would fail; passes never overlap: while one
# session holds a pass open, a second caller waits for it (lock_timeout at
# most, then 55P03) and never returns an empty success; and the strict job
# stays failed at every run from a tamper to its repair, then succeeds.
#
# pg_cron runs a job at the next minute boundary, so this test can take
# about four minutes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
my $pkglibdir = $node->config_data('--pkglibdir');
plan skip_all => 'pg_cron is not installed (Debian: postgresql-15-cron)'
  unless -e "$pkglibdir/pg_cron.so";

my $host = $node->host;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pg_cron,redpacket'
cron.database_name = 'postgres'
cron.host = '$host'
redpacket.reconcile_interval = 0
});
$node->start;

RedpacketTest::use_node($node);

sql('CREATE EXTENSION redpacket');
my $aid = sql("SELECT redpacket.rp_create_activity(20.00, 10, stripes => 2, name => 'cron')");
sql("SELECT redpacket.rp_claim($aid, 'u' || g, 1.00) FROM generate_series(1, 3) g");

is( sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'redpacket launcher'"),
	'1', 'the launcher is there, paused (interval 0)');
sleep 3;
is(sql('SELECT count(*) FROM redpacket.reconciliation'),
	'0', 'the paused worker ran no pass');

# --- Passes never overlap ------------------------------------------------------

my $holder = $node->background_psql('postgres');
my $held = $holder->query_safe(
	'BEGIN; SELECT count(*) FROM redpacket.rp_reconcile()');
is($held, '1', 'first session: its pass checked the activity (transaction left open)');

foreach my $call ('rp_reconcile()', "rp_reconcile($aid)", "rp_reconcile($aid, full_check => true)")
{
	my $t0 = time;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET lock_timeout = '1s'; SET statement_timeout = '20s'; SELECT count(*) FROM redpacket.$call");
	like($err, qr/ERROR:  another redpacket reconciliation pass kept running for 1000 ms/,
		"second caller: $call fails with 55P03 after lock_timeout, no empty success");
	cmp_ok(time - $t0, '>=', 0.9, "$call waited for the running pass");
}
is(sql("SELECT count(*) FROM redpacket.reconciliation"),
	'0', 'the open pass is not visible yet, and the second callers wrote nothing');

# A caller that waits gets its pass once the running one ends.
my $waiter = $node->background_psql('postgres');
$waiter->query_until(qr/go/, qq{\\echo go
SELECT count(*) AS waited FROM redpacket.rp_reconcile($aid, full_check => true);
});
ok(RedpacketTest::waits_for_lock($node, '%rp_reconcile(%full_check%'),
	'a third caller (default lock_timeout 0: a minute at most) waits for the pass');

# A claim is not blocked by the open pass (it released the stripes).
is(sql("SET statement_timeout = '10s'; SELECT status FROM redpacket.rp_claim($aid, 'during', 1.00)"),
	'claimed', 'a claim goes through while the pass is open');

$holder->query_safe('COMMIT');
$holder->quit;
$waiter->query_safe('SELECT 1');    # returns once the waiting pass ended
$waiter->quit;
is(sql('SELECT count(*) FROM redpacket.reconciliation'),
	'2', 'the first pass and the waiting full check recorded a row each');
is(sql("SELECT ok FROM redpacket.rp_reconcile($aid)"),
	't', 'after they ended a new pass runs');

# --- pg_cron runs the pass --------------------------------------------------------

my $log_offset = -s $node->logfile;    # the errors above were expected
my $before = sql('SELECT max(pass_id) FROM redpacket.reconciliation');
sql('CREATE EXTENSION pg_cron');
my $job = sql(
	"SELECT cron.schedule('redpacket-reconcile', '* * * * *', 'SELECT redpacket.rp_reconcile()')");
like($job, qr/^\d+$/, 'scheduled the reconciliation with pg_cron');
sql("SELECT redpacket.rp_claim($aid, 'before-cron', 1.00)");

# The README's pg_cron statements, as written, for a database other than
# cron's (cron.database_name is postgres here): its jobs must run there.
my ($readme_sql) = RedpacketTest::repo_file('README.md') =~ /```sql\n((?:(?!```).)*cron\.schedule_in_database(?:(?!```).)*)```/s;
ok($readme_sql, 'the README schedules the pass with cron.schedule_in_database');
my @readme_jobs = grep { /\S/ } map { s/^\s*--.*$//mgr } split /;\s*\n/, $readme_sql // '';
is(scalar(@readme_jobs), 2, 'two statements: the pass and the nightly full check');
sql('CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION redpacket');
my $shop_aid = $node->safe_psql('shop', "SELECT redpacket.rp_create_activity(5.00, stripes => 2)");
$node->safe_psql('shop', "SELECT redpacket.rp_claim($shop_aid, 'u' || g, 1.00) FROM generate_series(1, 2) g");
sql(s/\bapp\b/shop/gr) for @readme_jobs;
is( sql("SELECT string_agg(jobname || ':' || database, ',' ORDER BY jobname) FROM cron.job WHERE jobname LIKE '%-shop'"),
	'redpacket-full-check-shop:shop,redpacket-reconcile-shop:shop',
	'the README\'s jobs are scheduled in that database');

# The first run comes at the next minute boundary: make sure the poll waits
# well past a minute even when PG_TEST_TIMEOUT_DEFAULT is set low.
$PostgreSQL::Test::Utils::timeout_default = 150
  if $PostgreSQL::Test::Utils::timeout_default < 150;
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM cron.job_run_details WHERE jobid = $job AND status = 'succeeded'"
	),
	'pg_cron ran the job and it succeeded');
is( sql("SELECT count(*) FROM cron.job_run_details WHERE jobid = $job AND status = 'failed'"),
	'0', 'no failed run');
is( sql(qq{SELECT count(*) > 0, bool_and(ok), max(new_claims), max(expected_claims)
             FROM redpacket.reconciliation WHERE activity_id = $aid AND pass_id > $before}),
	't|t|1|5', 'the cron pass recorded a new ok row counting the new claim');
is( sql("SELECT last_reconcile_ok FROM redpacket.activity_status WHERE id = $aid"),
	't', 'activity_status shows the cron pass');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
 WHERE j.jobname = 'redpacket-reconcile-shop' AND d.status IN ('succeeded', 'failed')}),
	'the README\'s job ran');
is( sql(q{SELECT string_agg(DISTINCT d.status, ',') || ':' || string_agg(DISTINCT coalesce(d.return_message, ''), ',')
            FROM cron.job_run_details d JOIN cron.job j USING (jobid)
           WHERE j.jobname = 'redpacket-reconcile-shop'}),
	'succeeded:CALL', 'the README\'s job succeeds in the other database');
is( $node->safe_psql('shop', "SELECT count(*) > 0, bool_and(ok), max(expected_claims) FROM redpacket.reconciliation WHERE activity_id = $shop_aid"),
	't|t|2', 'and its pass checked that database\'s activity');
sql(q{SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE '%-shop'});

ok(!$node->log_contains(qr/(?:ERROR|FATAL|PANIC):/, $log_offset), 'no error in the server log');
sql("SELECT cron.unschedule($job)");

# --- The strict form: pg_cron sees a failed check ---------------------------------
# rp_reconcile() succeeds whatever it finds; CALL rp_reconcile_strict() commits
# the pass and then raises, so cron.job_run_details says failed.

sql(qq{SET session_replication_role = replica;
        UPDATE redpacket.stripe SET balance = balance - 1
        WHERE activity_id = $aid AND stripe = 0});
my $strict = sql(
	"SELECT cron.schedule('redpacket-strict', '* * * * *', 'CALL redpacket.rp_reconcile_strict()')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM cron.job_run_details WHERE jobid = $strict AND status = 'failed'"),
	'pg_cron records the strict run as failed');
like(
	sql("SELECT return_message FROM cron.job_run_details WHERE jobid = $strict AND status = 'failed' LIMIT 1"),
	qr/redpacket reconciliation failed for 1 of 1 activities/,
	'the failed run says how many activities failed');
is( sql(qq{SELECT ok, problems FROM redpacket.reconciliation
            WHERE activity_id = $aid ORDER BY pass_id DESC LIMIT 1}),
	'f|{money}', 'the failed check was committed before the error');
is(sql("SELECT state FROM redpacket.activity_status WHERE id = $aid"),
	'frozen', 'and the freeze too');

# The next runs check nothing new (the frozen activity did not change): the
# job must stay failed, naming the activity, until the books are repaired.
my $first_failed = sql("SELECT max(runid) FROM cron.job_run_details WHERE jobid = $strict");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM cron.job_run_details WHERE jobid = $strict AND runid > $first_failed AND status IN ('succeeded', 'failed')"),
	'the strict job ran again');
like(
	sql("SELECT status || ': ' || return_message FROM cron.job_run_details WHERE jobid = $strict AND runid > $first_failed ORDER BY runid LIMIT 1"),
	qr/^failed: .*redpacket books of 1 activities are still wrong/,
	'the next run fails too: the frozen books are still wrong');

# A refused unfreeze is the same incident: no second mismatch line to alert on.
my ($ret, $out, $err) = $node->psql('postgres', "SELECT redpacket.rp_unfreeze($aid)");
like($err, qr/ERROR:  activity $aid cannot be \w+: its books do not balance/,
	'rp_unfreeze is refused while the books are wrong');
my $log = slurp_file($node->logfile);
# (lines of the server's own prefix: pg_cron also copies a job's messages)
my $told = () = $log =~ /^\S+ \S+ UTC \[\d+\] .*WARNING:  redpacket reconciliation of activity $aid failed/mg;
is($told, 1, 'the mismatch was told once, by the run that found it');

my $repaired_at = sql(qq{SELECT now() FROM redpacket.rp_repair_stripes($aid, 'cron test')});
sql("SELECT redpacket.rp_unfreeze($aid)");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM cron.job_run_details WHERE jobid = $strict AND start_time > '$repaired_at' AND status = 'succeeded'"),
	'after repair and unfreeze the strict job succeeds');
is( sql(qq{SELECT count(*) FROM cron.job_run_details
            WHERE jobid = $strict AND start_time < '$repaired_at' AND status <> 'failed'}),
	'0', 'every run between the tamper and the repair failed');
sql("SELECT cron.unschedule($strict)");
$node->stop('fast');
done_testing();
