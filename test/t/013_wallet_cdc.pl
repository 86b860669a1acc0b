# Settling with a wallet over logical replication: the example wallet
# service (examples/wallet: subscriber.sql on a second cluster, consumer.py)
# subscribes to the publication redpacket_events, pays every claim into a
# wallet exactly once and acknowledges it with rp_credited, as a role that
# has only rp_grant_wallet (plus REPLICATION).  Claims (fixed, lucky,
# batch), claims rolled back, an operator reversing recent claims while the
# wallet acknowledges them, the consumer killed (SIGKILL) between its
# acknowledgement and its payment, after a payment, and at random under
# load, an immediate restart of the subscriber, and messages lost for good
# (the subscription dropped and made again without copying) that the
# consumer re-drives from rp_pending_credits.  At the end: every claim not
# reversed is paid exactly once and credited, no reversed claim is paid,
# every wallet equals its user's live claims, nothing is pending, the books
# balance.  The publication lists its four tables after CREATE EXTENSION,
# after pg_dump/pg_restore and after DROP/CREATE EXTENSION, and a role that
# does not own it cannot replace it.
use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $example = abs_path(dirname(__FILE__) . '/../../examples/wallet');

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->start;
$pub->safe_psql('postgres', 'CREATE EXTENSION redpacket');
my $tables_q =
  "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'redpacket_events'";
is($pub->safe_psql('postgres', $tables_q), 'activity_change,claim,claim_settlement,ledger',
	'CREATE EXTENSION makes publication redpacket_events over claim, ledger, activity_change and claim_settlement');

# A role that may create publications but does not own this one cannot
# make the publication keeper replace it.
$pub->safe_psql('postgres', 'CREATE ROLE mallory LOGIN; GRANT CREATE ON DATABASE postgres TO mallory');
my ($ret, $o, $e) = $pub->psql('postgres', 'SET ROLE mallory; CREATE PUBLICATION redpacket_events');
isnt($ret, 0, 'a non-superuser cannot replace redpacket_events');
like($e, qr/must be owner of publication redpacket_events/, 'for want of owning it');
is( $pub->safe_psql('postgres',
		"SELECT pubowner::regrole || ':' || string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables t JOIN pg_publication p USING (pubname) WHERE pubname = 'redpacket_events' GROUP BY pubowner"),
	'postgres:activity_change,claim,claim_settlement,ledger', 'the publication is unchanged');

# The wallet service's role: what rp_grant_wallet gives, and REPLICATION
# for the subscription.  The operator reverses claims.
$pub->safe_psql(
	'postgres', q{
CREATE ROLE wallet_svc LOGIN REPLICATION;
SELECT redpacket.rp_grant_wallet('wallet_svc');
CREATE ROLE ops LOGIN;
SELECT redpacket.rp_grant_operator('ops');
-- the operator's risk control: reverse one of the newest claims nobody
-- settled yet; the wallet may acknowledge it first (55000)
CREATE TABLE reverse_log (activity_id bigint, claim_id bigint, outcome text);
GRANT INSERT ON reverse_log TO ops;
CREATE FUNCTION reverse_one(act bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
BEGIN
    SELECT k.claim_id INTO c FROM redpacket.claim k
     WHERE k.activity_id = act
       AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s
                        WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id)
     ORDER BY k.claim_id DESC LIMIT 1 OFFSET floor(random() * 3)::int;
    IF c IS NULL THEN
        RETURN 'none';
    END IF;
    PERFORM redpacket.rp_reverse(act, c, 'risk control');
    INSERT INTO reverse_log VALUES (act, c, 'reversed');
    RETURN 'reversed';
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    INSERT INTO reverse_log VALUES (act, c, 'credited first');
    RETURN 'credited first';
END
$$;
});

my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->start;
$sub->safe_psql('postgres', "\\i $example/subscriber.sql");
my $pubconn = $pub->connstr . ' dbname=postgres';
sub subscribe
{
	my ($name, $with) = @_;
	$sub->safe_psql('postgres',
		"CREATE SUBSCRIPTION $name CONNECTION '$pubconn user=wallet_svc' PUBLICATION redpacket_events $with"
	);
	$sub->wait_for_subscription_sync($pub, $name);
}
subscribe('wallet', '');

my $wallet_dsn = $sub->connstr . ' dbname=postgres';
my $rp_dsn = "$pubconn user=wallet_svc";

# Run the consumer to its end; returns its JSON summary.
sub consumer
{
	my ($what, @opts) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'python3', "$example/consumer.py", $wallet_dsn, $rp_dsn, @opts ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(180));
	note("consumer @opts: $out");
	diag($err) if $err ne '';
	my ($last) = grep { /^\{/ } reverse split /\n/, $out;
	return decode_json($last // '{}');
}

sub start_consumer
{
	my ($out, $err) = ('', '');
	return IPC::Run::start(
		[   'python3', "$example/consumer.py", $wallet_dsn, $rp_dsn,
			'--poll', '0.05', '--redrive-every', '2', '--older-than', '5' ],
		'>', \$out, '2>', \$err);
}

# The promises, checked against the publisher's books.
sub settled_exactly_once
{
	my ($what) = @_;
	my $live_q = q{
SELECT k.activity_id, k.claim_id, k.user_id, k.amount FROM redpacket.claim k
 WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id
                      AND s.claim_id = k.claim_id AND s.state = 'reversed')
 ORDER BY 1, 2};
	my $paid_q = 'SELECT activity_id, claim_id, user_id, amount FROM wallet_credit ORDER BY 1, 2';
	is($sub->safe_psql('postgres', $paid_q), $pub->safe_psql('postgres', $live_q),
		"$what: every claim not reversed is paid, with its user and amount, once");
	is( $pub->safe_psql('postgres',
			"SELECT string_agg(activity_id || ':' || claim_id, ',' ORDER BY activity_id, claim_id) FROM redpacket.claim_settlement WHERE state = 'credited'"),
		$sub->safe_psql('postgres',
			"SELECT string_agg(activity_id || ':' || claim_id, ',' ORDER BY activity_id, claim_id) FROM wallet_credit"),
		"$what: exactly the paid claims are credited");
	is( $pub->safe_psql('postgres',
			"SELECT string_agg(user_id || ':' || s, ',' ORDER BY user_id) FROM (SELECT k.user_id, sum(k.amount) AS s FROM redpacket.claim k WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement x WHERE x.activity_id = k.activity_id AND x.claim_id = k.claim_id AND x.state = 'reversed') GROUP BY k.user_id) c"
		),
		$sub->safe_psql('postgres', "SELECT string_agg(user_id || ':' || balance, ',' ORDER BY user_id) FROM wallet"),
		"$what: every wallet equals its user's live claims");
	is($pub->safe_psql('postgres', 'SELECT count(*) FROM redpacket.rp_pending_credits()'),
		'0', "$what: nothing is pending");
	is(RedpacketTest::unbalanced($pub), '0', "$what: the books balance, reversed claims counted out");
}

my $fixed = $pub->safe_psql('postgres', "SELECT redpacket.rp_create_activity(100000.00, stripes => 4)");
my $lucky = $pub->safe_psql('postgres', "SELECT redpacket.rp_create_activity(2000.00, 10000, stripes => 4)");
$pub->safe_psql(
	'postgres', qq{
SELECT redpacket.rp_claim($fixed, 'u' || g, 1.25) FROM generate_series(1, 100) g;
SELECT redpacket.rp_claim($lucky, 'u' || g) FROM generate_series(1, 100) g;
SELECT count(*) FROM redpacket.rp_claim_batch($fixed, ARRAY(SELECT 'b' || g FROM generate_series(1, 50) g),
                                              ARRAY(SELECT 0.50 FROM generate_series(1, 50) g));
BEGIN;
SELECT redpacket.rp_claim($fixed, 'rolledback' || g, 2.00) FROM generate_series(1, 20) g;
ROLLBACK;
});
$pub->wait_for_catchup('wallet');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM wallet_inbox'), '250',
	'the 250 committed claims arrived in the inbox, none rolled back');

# --- Killed between acknowledging and paying, and after paying ---------------

my $s = consumer('die after ack', '--batch', '40', '--older-than', '0', '--die-after', 'ack');
is($s->{died_after}, 'ack', 'the consumer killed itself after acknowledging its first batch');
is($pub->safe_psql('postgres', "SELECT count(*) FROM redpacket.claim_settlement WHERE state = 'credited'"),
	'40', 'the batch is credited in redpacket');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM wallet_credit'), '0', 'and not paid yet');
# A reversal of an acknowledged claim is refused: the wallet will pay it.
my ($rc, $ro, $re) = $pub->psql('postgres',
	"SELECT redpacket.rp_reverse(activity_id, claim_id, 'too late') FROM redpacket.claim_settlement WHERE state = 'credited' LIMIT 1",
	extra_params => [ '-U', 'ops' ]);
like($re, qr/was credited/, 'an acknowledged claim cannot be reversed');
# The operator reverses a claim the wallet has not acknowledged, and the
# stream is held up so that the wallet does not hear of it before it
# acknowledges: rp_credited refuses the batch (55000), the consumer leaves
# the reversed claim out and acknowledges the others.
$sub->safe_psql('postgres', 'ALTER SUBSCRIPTION wallet DISABLE');
my $victim = $pub->safe_psql('postgres',
	"SELECT claim_id FROM redpacket.claim k WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id) ORDER BY activity_id, claim_id LIMIT 1"
);
$pub->safe_psql('postgres',
	"SELECT redpacket.rp_reverse(activity_id, claim_id, 'risk control') FROM redpacket.claim WHERE claim_id = $victim",
	extra_params => [ '-U', 'ops' ]);
$s = consumer('die after pay', '--batch', '40', '--older-than', '0', '--die-after', 'pay');
is($s->{died_after}, 'pay', 'the restarted consumer killed itself after its first payment');
is($s->{acknowledged}, 0, 'it acknowledged the first batch again, crediting nothing new');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM wallet_credit'), '40', 'and paid it, once');
$s = consumer('drain', '--until-idle', '--older-than', '0');
is($s->{reversed_skipped}, 1, 'the next run finds the reversed claim refused and leaves it out');
is($s->{paid}, 209, 'and pays the other 209');
is($sub->safe_psql('postgres', "SELECT reversed FROM wallet_inbox WHERE claim_id = $victim"),
	't', 'the reversed claim stays in the inbox, marked, unpaid');
$sub->safe_psql('postgres', 'ALTER SUBSCRIPTION wallet ENABLE');
$pub->wait_for_catchup('wallet');
settled_exactly_once('after the crashes');

# --- Under load: claims, reversals, the consumer killed, the subscriber restarted

my $tmp = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$tmp/claims.pgbench", qq{\\set u random(1, 5000)
BEGIN;
SELECT redpacket.rp_claim($fixed, 'pb' || :u, 0.75);
SELECT redpacket.rp_claim($lucky, 'pb' || :u);
END;
BEGIN;
SELECT redpacket.rp_claim($fixed, 'rolledback-pb' || :u, 0.10);
ROLLBACK;
});
PostgreSQL::Test::Utils::append_to_file("$tmp/reverse.pgbench",
	"SELECT reverse_one($fixed);\nSELECT reverse_one($lucky);\n");
my ($pb_out, $pb_err, $rv_out, $rv_err) = ('', '', '', '');
my $pgbench = IPC::Run::start(
	[ $pub->installed_command('pgbench'), '-n', '-c', '2', '-T', '10', '-f', "$tmp/claims.pgbench", $pubconn ],
	'>', \$pb_out, '2>', \$pb_err);
my $reverser = IPC::Run::start(
	[   $pub->installed_command('pgbench'), '-n', '-c', '1', '-T', '10', '-R', '20',
		'-f', "$tmp/reverse.pgbench", "$pubconn user=ops" ],
	'>', \$rv_out, '2>', \$rv_err);
my $c = start_consumer();
for my $round (1 .. 3)
{
	sleep 2;
	$c->signal('KILL');
	eval { $c->finish };
	if ($round == 2)
	{
		$sub->stop('immediate');
		$sub->start;
	}
	$c = start_consumer();
}
$pgbench->finish;
$reverser->finish;
like($pb_out, qr/number of transactions actually processed: [1-9]/, 'claims ran while the consumer was killed')
  or diag($pb_err);
like($rv_out, qr/number of transactions actually processed: [1-9]/, 'the operator reversed claims meanwhile')
  or diag($rv_err);
$c->signal('TERM');
eval { $c->finish };
$pub->wait_for_catchup('wallet');
consumer('drain after load', '--until-idle', '--older-than', '0');
cmp_ok($pub->safe_psql('postgres', "SELECT count(*) FROM reverse_log WHERE outcome = 'reversed'"),
	'>', 0, 'claims were reversed under load');
note('reverse outcomes: '
	  . $pub->safe_psql('postgres', "SELECT string_agg(outcome || ' ' || n, ', ') FROM (SELECT outcome, count(*) AS n FROM reverse_log GROUP BY 1) x"));
is( $sub->safe_psql('postgres',
		'SELECT count(*) FROM wallet_credit c JOIN redpacket.claim_settlement s USING (activity_id, claim_id) WHERE s.state = \'reversed\''),
	'0', 'no reversed claim was paid');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM wallet_inbox WHERE NOT reversed'),
	'0', 'the inbox holds only reversed claims');
cmp_ok($sub->safe_psql('postgres', 'SELECT count(*) FROM wallet_inbox WHERE reversed'),
	'>', 1, 'reversals arrived through the stream and kept their claims from being paid');
settled_exactly_once('after the load');

# --- Messages lost for good: re-driven from rp_pending_credits -----------------

$sub->safe_psql('postgres',
	'ALTER SUBSCRIPTION wallet DISABLE; ALTER SUBSCRIPTION wallet SET (slot_name = NONE); DROP SUBSCRIPTION wallet'
);
$pub->poll_query_until('postgres', "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'wallet'")
  or die 'the slot of the dropped subscription stays active';
$pub->safe_psql('postgres', "SELECT pg_drop_replication_slot('wallet')");
$pub->safe_psql('postgres', "SELECT redpacket.rp_claim($fixed, 'lost' || g, 3.00) FROM generate_series(1, 30) g");
subscribe('wallet2', 'WITH (copy_data = false)');
$pub->safe_psql('postgres', "SELECT redpacket.rp_claim($fixed, 'after' || g, 4.00) FROM generate_series(1, 10) g");
$pub->wait_for_catchup('wallet2');
is( $sub->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE user_id LIKE 'lost%'), count(*) FILTER (WHERE user_id LIKE 'after%') FROM redpacket.claim"),
	'0|10', 'the 30 claims made without a subscription never arrive');
$s = consumer('re-drive', '--until-idle', '--older-than', '0');
is($s->{redriven}, 30, 'the consumer re-drives the 30 lost claims from rp_pending_credits');
is($s->{paid}, 40, 'and pays them with the 10 that arrived');
settled_exactly_once('after the lost messages');

# --- The publication survives dump/restore and DROP/CREATE EXTENSION ---------

my $n = $pub->safe_psql('postgres', 'SELECT count(*) FROM redpacket.claim_settlement');
$pub->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/pub.dump", '-d', $pubconn ], 'pg_dump of the publisher');
$pub->safe_psql('postgres', 'CREATE DATABASE restored');
$pub->command_ok([ 'pg_restore', '-d', $pub->connstr('restored'), "$tmp/pub.dump" ],
	'pg_restore of the publisher exits 0');
is($pub->safe_psql('restored', $tables_q), 'activity_change,claim,claim_settlement,ledger',
	'after dump/restore the publication lists its four tables');
is($pub->safe_psql('restored', 'SELECT count(*) FROM redpacket.claim_settlement'), $n,
	'and the settlements are there');
is($pub->safe_psql('restored', 'SELECT count(*) FROM redpacket.rp_pending_credits()'), '0',
	'and nothing is pending there either');

$pub->safe_psql('restored', 'SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
is($pub->safe_psql('restored', $tables_q), '', 'DROP EXTENSION leaves the publication empty');
$pub->safe_psql('restored', 'CREATE EXTENSION redpacket');
is($pub->safe_psql('restored', $tables_q), 'activity_change,claim,claim_settlement,ledger',
	'after DROP/CREATE EXTENSION the publication lists its four tables again');

$sub->stop;
$pub->stop;
done_testing();
