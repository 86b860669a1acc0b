# A wallet service that keeps no inbox (examples/wallet/poller.py): it polls
# rp_pending_credits, notes a batch's reference, acknowledges the batch
# under it with rp_credited and pays what rp_credits(reference) returns.
# Killed (SIGKILL) after each of the three steps, with the operator
# reversing a pending claim in between, it pays every claim not reversed
# exactly once: a claim it acknowledged and did not pay is paid on
# its next start, one it noted and did not acknowledge comes back pending.
# rp_credits answers for a reference, none for an unknown one, and refuses
# NULL (22004) and roles without rp_grant_wallet.
use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $example = abs_path(dirname(__FILE__) . '/../../examples/wallet');
my $node = RedpacketTest::node('poller');

sql(q{
CREATE EXTENSION redpacket;
CREATE ROLE wallet_svc LOGIN;
SELECT redpacket.rp_grant_wallet('wallet_svc');
CREATE ROLE ops LOGIN;
SELECT redpacket.rp_grant_operator('ops');
CREATE ROLE app LOGIN;
SELECT redpacket.rp_grant_app('app');
CREATE DATABASE wallet;
});
$node->safe_psql('wallet', "\\i $example/poller.sql");

my $fixed = sql("SELECT redpacket.rp_create_activity(1000.00, stripes => 4)");
my $lucky = sql("SELECT redpacket.rp_create_activity(200.00, 1000, stripes => 4)");
sql(qq{
SELECT redpacket.rp_claim($fixed, 'u' || g, 1.25) FROM generate_series(1, 30) g;
SELECT redpacket.rp_claim($lucky, 'u' || g) FROM generate_series(1, 30) g;
});

my $wallet_dsn = $node->connstr('wallet');
my $rp_dsn = $node->connstr('postgres') . ' user=wallet_svc';

# Run the poller to its end; returns its JSON summary.
sub poller
{
	my (@opts) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'python3', "$example/poller.py", $wallet_dsn, $rp_dsn, @opts ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(180));
	note("poller @opts: $out");
	diag($err) if $err ne '';
	my ($last) = grep { /^\{/ } reverse split /\n/, $out;
	return decode_json($last // '{}');
}
sub wallet { return $node->safe_psql('wallet', $_[0]); }
my $credited_q = "SELECT count(*) FROM redpacket.claim_settlement WHERE state = 'credited'";

# --- Killed after noting a batch: nothing acknowledged, nothing lost ----------
my $s = poller('--batch', '10', '--die-after', 'note');
is($s->{died_after}, 'note', 'the poller killed itself after noting its first batch');
is(wallet('SELECT count(*) FROM poller_batch WHERE NOT paid'), '1', 'the batch is noted, unpaid');
is(sql($credited_q), '0', 'nothing is acknowledged');

# --- Killed after acknowledging: the next start pays the batch ----------------
$s = poller('--batch', '10', '--die-after', 'ack');
is($s->{recovered}, 1, 'the restarted poller first paid the noted batch');
is($s->{paid}, 0, 'which had nothing acknowledged under it');
is($s->{acknowledged}, 10, 'then acknowledged a batch of 10 and was killed');
is(sql($credited_q), '10', 'the 10 are credited in redpacket');
is(wallet('SELECT count(*) FROM poller_payment'), '0', 'and not paid yet');
is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()'), '50',
	'nor pending any more: only the note and rp_credits find them');
my $ref = wallet('SELECT reference FROM poller_batch WHERE NOT paid');
is(sql("SELECT count(*) FROM redpacket.rp_credits('$ref')", undef), '10',
	'rp_credits lists the batch acknowledged under its reference');

# The operator reverses the next claim the poller will take.
my $victim = sql(
	"SELECT activity_id || ',' || claim_id FROM redpacket.rp_pending_credits() ORDER BY claimed_at, claim_id LIMIT 1");
my ($va, $vc) = split /,/, $victim;
my ($rc, $ro, $re) = $node->psql('postgres', "SELECT redpacket.rp_reverse($va, $vc, 'risk control')",
	extra_params => [ '-U', 'ops' ]);
is($rc, 0, 'the operator reverses a pending claim') or diag $re;

# --- Killed after paying: the rest is paid by the next run -------------------
$s = poller('--batch', '10', '--die-after', 'pay');
is($s->{recovered}, 1, 'the restarted poller paid the acknowledged batch first');
is($s->{paid}, 20, 'those 10, and the 10 of its new batch');
$s = poller('--until-idle');
is($s->{recovered}, 0, 'a run after a payment has nothing to recover');
is($s->{paid}, 39, 'and pays the 39 left (60 claims, one reversed)');

# --- Every claim not reversed is paid exactly once ---------------------------
my $live_q = q{
SELECT k.activity_id, k.claim_id, k.user_id, k.amount FROM redpacket.claim k
 WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id
                      AND s.claim_id = k.claim_id AND s.state = 'reversed')
 ORDER BY 1, 2};
is(wallet('SELECT activity_id, claim_id, user_id, amount FROM poller_payment ORDER BY 1, 2'),
	sql($live_q), 'every claim not reversed is paid once, with its user and amount');
is(wallet("SELECT count(*) FROM poller_payment WHERE activity_id = $va AND claim_id = $vc"),
	'0', 'the reversed claim is not paid');
is(sql($credited_q), '59', 'exactly the paid claims are credited');
is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()'), '0', 'nothing is pending');
is( wallet(q{SELECT string_agg(user_id || ':' || balance, ',' ORDER BY user_id) FROM poller_wallet}),
	sql(q{SELECT string_agg(user_id || ':' || s, ',' ORDER BY user_id)
	        FROM (SELECT user_id, sum(amount) AS s FROM (} . $live_q . q{) l GROUP BY user_id) c}),
	'every wallet holds its user\'s live claims');
is(wallet('SELECT count(*) FROM poller_batch WHERE NOT paid'), '0', 'every noted batch is settled');

# --- One poller per wallet ------------------------------------------------------
# Its recovery takes any unpaid batch for its own: a second one, started
# while the first has noted a batch and not yet acknowledged it, would mark
# that batch paid with nothing under it.  A second poller refuses to start.
my $holder = $node->background_psql('wallet');
$holder->query_safe("SELECT pg_advisory_lock(hashtext('redpacket wallet poller'))");
my ($pout, $perr) = ('', '');
IPC::Run::run([ 'python3', "$example/poller.py", $wallet_dsn, $rp_dsn, '--until-idle' ],
	'>', \$pout, '2>', \$perr, IPC::Run::timeout(60));
like($perr, qr/another poller runs for this wallet/, 'a second poller refuses to start');
$holder->quit;

# --- rp_credits itself ----------------------------------------------------------
is(sql("SELECT count(*) FROM redpacket.rp_credits('no such batch')"), '0', 'an unknown reference has no claim');
($rc, $ro, $re) = $node->psql('postgres', 'SELECT * FROM redpacket.rp_credits(NULL)',
	extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
like($re, qr/22004/, 'a NULL reference is 22004');
($rc, $ro, $re) = $node->psql('postgres', "SELECT * FROM redpacket.rp_credits('$ref')",
	extra_params => [ '-U', 'app' ]);
like($re, qr/permission denied for function rp_credits/, 'an application role may not read credits');

$node->stop;
done_testing();
