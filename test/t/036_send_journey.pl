# A group packet from sending to the last refund, through the documented
# roles only.  A chat service (sender role) sends a restricted lucky packet
# and retries the creation after a timeout; members claim through the
# application role, some retrying, and a stranger is refused; the sender
# tops the packet up and lets it expire; the wallet service pays the claims
# with the example poller, killed after each of its steps; the operator
# reverses one claim after the packet settled, which is refunded to the
# funder; the wallet pays back what is owed to the funder (noting a
# reference, acknowledging with rp_refunded, paying from rp_refunds),
# stopped after each step too.  In the end every claim not reversed is paid
# once, every amount owed to the funder is paid back once, and together
# they are what was funded.
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
my $node = RedpacketTest::node('send_journey', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});

sql(q{
CREATE EXTENSION redpacket;
CREATE ROLE chat_sender LOGIN;
SELECT redpacket.rp_grant_sender('chat_sender');
CREATE ROLE chat_app LOGIN;
SELECT redpacket.rp_grant_app('chat_app');
CREATE ROLE wallet_svc LOGIN;
SELECT redpacket.rp_grant_wallet('wallet_svc');
CREATE ROLE ops LOGIN;
SELECT redpacket.rp_grant_operator('ops');
CREATE DATABASE wallet;
});
$node->safe_psql('wallet', "\\i $example/poller.sql");
# what the wallet paid back to funders, once per ledger entry
$node->safe_psql('wallet', q{
CREATE TABLE refund_batch (reference text PRIMARY KEY, paid boolean NOT NULL DEFAULT false);
CREATE TABLE refund_payment (activity_id bigint, entry_id bigint, funder text NOT NULL,
                             amount numeric NOT NULL, PRIMARY KEY (activity_id, entry_id));
});

# Run q as role in the redpacket database; returns (stdout, stderr).
sub as
{
	my ($role, $q) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $q, extra_params => [ '-U', $role ]);
	return ($out, $err);
}
sub wallet { return $node->safe_psql('wallet', $_[0]); }

# --- Send, retried -------------------------------------------------------------
my $send = q{SELECT redpacket.rp_create_activity(10.00, 10, ends_at => now() + interval '1 hour',
                                                 stripes => 2, restricted => true, split => 'lucky',
                                                 funder => 'alice', request_id => 'chat-42:msg-7')};
my ($g, $err) = as('chat_sender', $send);
is($err, '', 'the sender sends the packet');
my ($again) = as('chat_sender', $send);
is($again, $g, 'a retried send returns the same packet');
is(sql("SELECT count(*) FROM redpacket.ledger WHERE activity_id = $g"), '1', 'funded once');
my @members = map { "m$_" } 1 .. 8;
my ($allowed) = as('chat_sender', "SELECT redpacket.rp_allow($g, ARRAY['" . join("','", @members) . "'])");
is($allowed, '8', 'the sender lists the group');
(undef, $err) = as('chat_sender', "SELECT redpacket.rp_reverse($g, 1, 'no')");
like($err, qr/permission denied/, 'the sender cannot reverse');

# --- Claims, some retried, a stranger refused ---------------------------------
my %got;
for my $m (@members[0 .. 5])
{
	my ($r) = as('chat_app', "SELECT status || ',' || amount FROM redpacket.rp_claim($g, '$m')");
	$got{$m} = $r;
}
is(scalar(grep { /^claimed,/ } values %got), 6, 'six members claim a lucky draw');
for my $m (@members[0 .. 1])
{
	my ($r) = as('chat_app', "SELECT status || ',' || amount FROM redpacket.rp_claim($g, '$m')");
	(my $want = $got{$m}) =~ s/^claimed/duplicate/;
	is($r, $want, "$m retries and gets the same amount");
}
my ($stranger) = as('chat_app', "SELECT status FROM redpacket.rp_claim($g, 'stranger')");
is($stranger, 'not_eligible', 'a stranger is refused');
(undef, $err) = as('chat_app', "SELECT redpacket.rp_claim($g, 'm7', 0.95)");
like($err, qr/amount must be NULL/, 'nobody names the amount of a lucky draw');

# --- Top up, expire ------------------------------------------------------------
my ($funded) = as('chat_sender', "SELECT redpacket.rp_top_up($g, 2.00, 2, 'more')");
is($funded, '12.00', 'the sender tops the packet up');
my ($r7) = as('chat_app', "SELECT status FROM redpacket.rp_claim($g, 'm7')");
is($r7, 'claimed', 'another member claims');
(undef, $err) = as('chat_sender',
	"SELECT redpacket.rp_set_window($g, now() - interval '1 hour', clock_timestamp() + interval '1 s', 'ends')");
is($err, '', 'the sender ends the packet a second from now');
ok($node->poll_query_until('postgres', "SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $g"),
	'the reconciler settles the expired packet');
my ($late) = as('chat_app', "SELECT status FROM redpacket.rp_claim($g, 'm8')");
is($late, 'ended', 'a claim after expiry is ended');

# --- The operator reverses a claim after settlement -----------------------------
my ($victim, $vamount) = split /\|/, sql(
	"SELECT claim_id, amount FROM redpacket.claim WHERE activity_id = $g AND user_id = 'm3'");
my ($rev) = as('ops', "SELECT redpacket.rp_reverse($g, $victim, 'risk control')");
is($rev, $vamount, 'the operator reverses one claim; it is owed to the funder now');

# --- The wallet pays the claims, killed after each step --------------------------
my $wallet_dsn = $node->connstr('wallet');
my $rp_dsn = $node->connstr('postgres') . ' user=wallet_svc';
sub poller
{
	my (@opts) = @_;
	my ($out, $perr) = ('', '');
	IPC::Run::run([ 'python3', "$example/poller.py", $wallet_dsn, $rp_dsn, '--batch', '2', @opts ],
		'>', \$out, '2>', \$perr, IPC::Run::timeout(180));
	note("poller @opts: $out");
	my ($last) = grep { /^\{/ } reverse split /\n/, $out;
	return decode_json($last // '{}');
}
is(poller('--die-after', $_)->{died_after}, $_, "the poller is killed after it $_") for qw(note ack pay);
poller('--until-idle');
is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()'), '0', 'no claim is pending');

# --- The wallet pays the funder back, stopped after each step ------------------
# One step of paying back: note a reference, acknowledge under it, pay what
# rp_refunds returns for it; $stop ends the run after that step, as a crash.
my $batches = 0;
sub pay_back
{
	my ($reference) = @_;
	my ($rows) = as('wallet_svc',
		"SELECT activity_id || ',' || entry_id || ',' || funder || ',' || amount FROM redpacket.rp_refunds('$reference')");
	for my $row (grep { $_ ne '' } split /\n/, $rows // '')
	{
		my ($a, $e, $f, $m) = split /,/, $row;
		wallet("INSERT INTO refund_payment VALUES ($a, $e, '$f', $m) ON CONFLICT DO NOTHING");
	}
	wallet("UPDATE refund_batch SET paid = true WHERE reference = '$reference'");
}
sub refund_run
{
	my ($stop) = @_;
	pay_back($_) for split /\n/, wallet('SELECT reference FROM refund_batch WHERE NOT paid ORDER BY 1');
	my ($owed) = as('wallet_svc',
		"SELECT string_agg(entry_id::text, ',') FROM redpacket.rp_pending_refunds($g)");
	return 0 if ($owed // '') eq '';
	my $reference = 'refund-' . ++$batches;
	wallet("INSERT INTO refund_batch VALUES ('$reference')");
	return 1 if ($stop // '') eq 'note';
	my ($n, $aerr) = as('wallet_svc', "SELECT redpacket.rp_refunded($g, ARRAY[$owed]::bigint[], '$reference')");
	is($aerr, '', "refunds acknowledged under $reference");
	return 1 if ($stop // '') eq 'ack';
	pay_back($reference);
	return 1;
}
refund_run('note');
is(sql("SELECT count(*) FROM redpacket.refund WHERE activity_id = $g AND refunded_at IS NOT NULL"),
	'0', 'stopped after noting: nothing acknowledged');
refund_run('ack');
is(wallet('SELECT count(*) FROM refund_payment'), '0', 'stopped after acknowledging: nothing paid yet');
is(sql("SELECT count(*) FROM redpacket.rp_pending_refunds($g)"), '0', 'and nothing owed any more');
refund_run('pay');
refund_run();
is(wallet('SELECT count(*) FROM refund_batch WHERE NOT paid'), '0', 'every noted batch is paid');
my ($twice) = as('wallet_svc', "SELECT redpacket.rp_refunded($g, ARRAY(SELECT 0::bigint WHERE false), 'x')");
is($twice, '0', 'an empty acknowledgement changes nothing');

# --- Every amount paid and refunded exactly once ----------------------------------
my $live_q = qq{
SELECT k.claim_id, k.user_id, k.amount FROM redpacket.claim k
 WHERE k.activity_id = $g
   AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id
                      AND s.claim_id = k.claim_id AND s.state = 'reversed')
 ORDER BY 1};
is(wallet("SELECT claim_id, user_id, amount FROM poller_payment WHERE activity_id = $g ORDER BY 1"),
	sql($live_q), 'every claim not reversed is paid once, to its member');
is( wallet("SELECT string_agg(entry_id || ':' || funder || ':' || amount, ',' ORDER BY entry_id) FROM refund_payment"),
	sql(qq{SELECT string_agg(entry_id || ':' || funder || ':' || amount, ',' ORDER BY entry_id)
	         FROM redpacket.ledger WHERE activity_id = $g AND kind IN ('withdraw', 'return', 'refund')
	          AND amount > 0}),
	'every amount owed to the funder is paid back once, to alice');
my $paid = wallet("SELECT sum(amount) FROM poller_payment WHERE activity_id = $g");
my $back = wallet('SELECT sum(amount) FROM refund_payment');
is(sprintf('%.2f', $paid + $back), '12.00', 'the members and the funder got exactly what was funded');
is(sql("SELECT bool_and(ok) FROM redpacket.rp_verify($g, true)"), 't', 'the books are right');

$node->stop;
done_testing();
