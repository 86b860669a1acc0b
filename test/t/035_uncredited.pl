# The uncredited alert.  With redpacket.credit_deadline set, the worker's
# passes report an activity whose claims stay neither credited nor reversed
# longer than the deadline: once, as the problem uncredited (WARNING with
# the count and the oldest claim, NOTIFY on redpacket_alert, activity_status
# and reconciler_status), without freezing it; the detail follows the count
# without telling again; crediting the claims clears it (logged once).  An
# activity whose claims are all credited, however many, is not reported;
# the passes look at a window of 256 activities in turn, so one past the
# first window is found too; with the deadline off nothing is reported.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('uncredited', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
redpacket.credit_deadline = 0
});
sql('CREATE EXTENSION redpacket');
sql("CREATE ROLE wallet_svc LOGIN; SELECT redpacket.rp_grant_wallet('wallet_svc')");

# Settled history: an activity whose 2,000 claims are all credited.
my $paid = sql("SELECT redpacket.rp_create_activity(100.00, stripes => 4, name => 'paid')");
sql("SELECT redpacket.rp_claim($paid, 'p' || g, 0.01) FROM generate_series(1, 2000) g");
sql("SELECT redpacket.rp_credited($paid, ARRAY(SELECT claim_id FROM redpacket.claim WHERE activity_id = $paid))");
# 300 empty activities, then one the wallet never paid: past the first window.
sql("SELECT redpacket.rp_create_activity(1.00, stripes => 1) FROM generate_series(1, 300)");
my $late = sql("SELECT redpacket.rp_create_activity(10.00, stripes => 2, name => 'late')");
sql("SELECT redpacket.rp_claim($late, 'u' || g, 1.00) FROM generate_series(1, 3) g");

# The deadline off: passes run, nothing is reported.
my $passes = sql('SELECT passes FROM redpacket.reconciler');
$node->poll_query_until('postgres', "SELECT passes > $passes + 2 FROM redpacket.reconciler")
  or die 'no pass';
is(sql("SELECT count(*) FROM redpacket.reconcile_problem WHERE problem = 'uncredited'"), '0',
	'with redpacket.credit_deadline = 0 nothing is reported');

my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN redpacket_alert');
my $log_from = -s $node->logfile;
sql('ALTER SYSTEM SET redpacket.credit_deadline = 1; SELECT pg_reload_conf()');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM redpacket.reconcile_problem WHERE problem = 'uncredited' AND activity_id = $late"),
	'the activity the wallet never paid is reported uncredited');
is(sql("SELECT count(*) FROM redpacket.reconcile_problem WHERE problem = 'uncredited'"), '1',
	'and only it: the 2,000 credited claims and the empty activities are not');
like(sql("SELECT detail FROM redpacket.reconcile_problem WHERE activity_id = $late"),
	qr/^3 claims neither credited nor reversed/, 'the problem counts its 3 claims');
my $oldest = sql("SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = $late");
my $log = slurp_file($node->logfile, $log_from);
like($log, qr/WARNING:  redpacket: 3 claims of activity $late are neither credited nor reversed after redpacket\.credit_deadline/,
	'a WARNING tells the count');
like($log, qr/DETAIL:  The oldest is claim $oldest, claimed at/, 'and the oldest claim');
my $notified = $listener->query_safe('SELECT 1');
like($notified, qr/"kind":"uncredited","uncredited":3,"oldest_claim":$oldest/,
	'a NOTIFY on redpacket_alert carries the count and the oldest claim');
is(sql("SELECT uncredited_since IS NOT NULL, state FROM redpacket.activity_status WHERE id = $late"),
	't|active', 'activity_status shows it, and the activity is not frozen');
is(sql('SELECT uncredited FROM redpacket.reconciler_status'), '1', 'reconciler_status counts it');

# Not wrong books: the scheduler's strict pass succeeds.
my ($rc, $out, $err) = $node->psql('postgres', 'CALL redpacket.rp_reconcile_strict()');
is($rc, 0, 'rp_reconcile_strict does not take uncredited claims for wrong books') or diag $err;

# A pass in a caller's transaction block does not look (it would hold the
# settlement rows it advances until that transaction ends): a wallet's
# rp_credited of a new claim of the paid activity is not held up by it.
my $open = $node->background_psql('postgres');
sql("SELECT redpacket.rp_claim($paid, 'p-new', 0.01)");
$open->query_safe('BEGIN');
$open->query_safe('SET client_min_messages = error');
$open->query_safe('SELECT count(*) FROM redpacket.rp_reconcile()');
($rc, $out, $err) = $node->psql('postgres',
	"SET lock_timeout = '2s'; SELECT redpacket.rp_credited($paid, ARRAY(SELECT max(claim_id) FROM redpacket.claim WHERE activity_id = $paid))",
	extra_params => [ '-U', 'wallet_svc' ]);
is($rc, 0, 'a credit is not held up by a pass in an open transaction') or diag $err;
$open->query_safe('COMMIT');
$open->quit;

# One more claim: the detail follows, nothing is told again.
sql("SELECT redpacket.rp_claim($late, 'u4', 1.00)");
ok( $node->poll_query_until('postgres',
		"SELECT detail LIKE '4 claims%' FROM redpacket.reconcile_problem WHERE activity_id = $late"),
	'the detail follows the count');
$log = slurp_file($node->logfile, $log_from);
is(scalar(() = $log =~ /claims of activity $late are neither credited nor reversed after/g), 1, 'told once');

# The wallet pays: the problem clears, logged once.
$node->psql('postgres',
	"SELECT redpacket.rp_credited($late, ARRAY(SELECT claim_id FROM redpacket.claim WHERE activity_id = $late))",
	extra_params => [ '-U', 'wallet_svc' ]);
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM redpacket.reconcile_problem WHERE problem = 'uncredited'"),
	'crediting the claims clears the problem');
$log = slurp_file($node->logfile, $log_from);
like($log, qr/LOG:  redpacket: the claims of activity $late are credited again/, 'logged once');
is(sql("SELECT uncredited_since FROM redpacket.activity_status WHERE id = $late"), '',
	'activity_status shows nothing');
is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()'), '0', 'nothing is pending');

$listener->quit;
$node->stop;
done_testing();
