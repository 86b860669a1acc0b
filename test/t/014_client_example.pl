# The application example examples/app/claim_client.py (psycopg2), run as
# an application role with only rp_grant_app: 200 users claim once each
# from 4 threads under READ COMMITTED, a tenth of them through a simulated
# uncertain commit, which the retry resolves as 'duplicate' with the same
# claim id; under REPEATABLE READ on one stripe (40001 retried when it
# happens); and with lock_timeout while an operator transaction holds every
# stripe (freeze, then rollback) for a second after the application
# connects: the claims fail with 55P03, back off and succeed.  Every user ends with exactly one claim and the books balance.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;
use JSON::PP;
use File::Basename qw(dirname);
use Cwd qw(abs_path);

my $example = abs_path(dirname(__FILE__) . '/../../examples/app/claim_client.py');

my $node = RedpacketTest::node('client');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION redpacket;
CREATE ROLE app LOGIN;
SELECT redpacket.rp_grant_app('app');
});
my $dsn = $node->connstr . ' dbname=postgres user=app';

# Run the example; returns its JSON summary.
sub client
{
	my ($activity, $users, @opts) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'python3', $example, $dsn, $activity, $users, @opts ],
		'>', \$out, '2>', \$err);
	ok($ok, "claim_client.py @opts") or diag($err);
	note($out);
	return decode_json($out);
}

# One claim per user, and the books of the activity balance.
sub check_activity
{
	my ($aid, $users, $what) = @_;
	is( sql(
			"SELECT count(*), count(DISTINCT user_id) FROM redpacket.claim WHERE activity_id = $aid"),
		"$users|$users", "$what: every user holds exactly one claim");
	is( sql(
			"SELECT count(*), bool_and(ok) FROM redpacket.rp_reconcile($aid, true)"),
		'1|t', "$what: the books balance");
}

# --- READ COMMITTED, with uncertain commits ----------------------------------

my $rc = sql("SELECT redpacket.rp_create_activity(1000.00, stripes => 2)");
my $s = client($rc, 200, '--threads', '4', '--amount', '1.00', '--uncertain-every', '10');
is_deeply($s->{errors}, [], 'READ COMMITTED: no error reached the application');
is_deeply($s->{statuses}, { claimed => 180, duplicate => 20 },
	'READ COMMITTED: 180 claimed at once, 20 answered duplicate after an uncertain commit');
is($s->{uncertain_resolved}, 20,
	'each duplicate carries the claim id the uncertain call had written');
is($s->{retries}{uncertain}, 20, 'each uncertain commit was retried once');
check_activity($rc, 200, 'READ COMMITTED');

# --- REPEATABLE READ: 40001 is retried --------------------------------------------

my $rr = sql("SELECT redpacket.rp_create_activity(1000.00, stripes => 1)");
$s = client($rr, 200, '--threads', '4', '--amount', '1.00', '--isolation', 'repeatable_read');
is_deeply($s->{errors}, [], 'REPEATABLE READ: no error reached the application');
is($s->{statuses}{claimed}, 200, 'REPEATABLE READ: every user claimed');
note('REPEATABLE READ retries: ' . encode_json($s->{retries}));
check_activity($rr, 200, 'REPEATABLE READ');

# --- lock_timeout: 55P03 while an operator holds every stripe -----------------------

my $lt = sql("SELECT redpacket.rp_create_activity(100.00, stripes => 2)");
my ($h_out, $h_err) = ('', '');
my $holder = IPC::Run::start(
	[   $node->installed_command('psql'), '-XAtq', '-d', $node->connstr('postgres'),
		'-c', qq{BEGIN; SELECT redpacket.rp_freeze($lt, 'maintenance');
DO \$\$ BEGIN
    -- hold the stripes until the application is connected, then 1 s more
    WHILE NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE usename = 'app')
          AND clock_timestamp() < now() + interval '60 s' LOOP
        PERFORM pg_sleep(0.05);
        PERFORM pg_stat_clear_snapshot();
    END LOOP;
    PERFORM pg_sleep(1);
END \$\$;
ROLLBACK;} ],
	'>', \$h_out, '2>', \$h_err);
$node->poll_query_until('postgres',
	"SELECT count(*) >= 2 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 20993 AND granted")
  or die 'the operator transaction did not take the stripe locks';
$s = client($lt, 10, '--threads', '2', '--amount', '1.00', '--lock-timeout-ms', '200');
$holder->finish;
is_deeply($s->{errors}, [], 'lock_timeout: no error reached the application');
cmp_ok($s->{retries}{'55P03'} // 0, '>', 0, 'claims hit lock_timeout (55P03) and were retried');
is($s->{statuses}{claimed}, 10, 'lock_timeout: every claim went through after the operator rolled back');
check_activity($lt, 10, 'lock_timeout');

$node->stop;
done_testing();
