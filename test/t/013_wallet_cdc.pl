# Crediting wallets through logical replication: a second cluster subscribes
# to the extension's publication redpacket_events (claim and ledger); there,
# an ENABLE ALWAYS trigger on the replicated claim table credits a wallet,
# idempotent on (activity_id, claim_id).  Claims (fixed, lucky, batch),
# claims rolled back, and an immediate-mode restart of the subscriber while
# claims are running: every committed claim is credited exactly once (the
# trigger ran once per claim, every wallet equals the user's claims), and
# nothing rolled back arrives.  The publication still lists its tables after
# pg_dump/pg_restore of the publisher and after DROP/CREATE EXTENSION, and a
# role that does not own it cannot replace it.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->start;
$pub->safe_psql('postgres', 'CREATE EXTENSION redpacket');
is( $pub->safe_psql('postgres',
		"SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'redpacket_events'"),
	'redpacket.claim,redpacket.ledger',
	'CREATE EXTENSION makes publication redpacket_events over claim and ledger');

# A role that may create publications but does not own this one cannot
# make the publication keeper replace it.
$pub->safe_psql('postgres', 'CREATE ROLE mallory LOGIN; GRANT CREATE ON DATABASE postgres TO mallory');
my ($ret, $o, $e) = $pub->psql('postgres', 'SET ROLE mallory; CREATE PUBLICATION redpacket_events');
isnt($ret, 0, 'a non-superuser cannot replace redpacket_events');
like($e, qr/must be owner of publication redpacket_events/, 'for want of owning it');
is( $pub->safe_psql('postgres',
		"SELECT pubowner::regrole || ':' || string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables t JOIN pg_publication p USING (pubname) WHERE pubname = 'redpacket_events' GROUP BY pubowner"),
	'postgres:claim,ledger', 'the publication is unchanged');

my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->start;
$sub->safe_psql(
	'postgres', q{
CREATE SCHEMA redpacket;
CREATE TABLE redpacket.claim (
    activity_id bigint, claim_id bigint, user_id text, request_id text,
    idempotency_key text, amount numeric, stripe integer, claimed_at timestamptz,
    PRIMARY KEY (activity_id, claim_id));
CREATE TABLE redpacket.ledger (
    activity_id bigint, entry_id bigint, kind text, amount numeric, reason text,
    created_at timestamptz, created_by name, packets integer,
    PRIMARY KEY (activity_id, entry_id));
CREATE TABLE wallet (user_id text PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE wallet_credit (
    activity_id bigint, claim_id bigint, user_id text NOT NULL, amount numeric NOT NULL,
    PRIMARY KEY (activity_id, claim_id));
CREATE TABLE trigger_calls (activity_id bigint, claim_id bigint);
CREATE FUNCTION credit_wallet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.trigger_calls VALUES (NEW.activity_id, NEW.claim_id);
    INSERT INTO public.wallet_credit VALUES (NEW.activity_id, NEW.claim_id, NEW.user_id, NEW.amount)
        ON CONFLICT (activity_id, claim_id) DO NOTHING;
    IF FOUND THEN
        INSERT INTO public.wallet VALUES (NEW.user_id, NEW.amount)
            ON CONFLICT (user_id) DO UPDATE SET balance = wallet.balance + EXCLUDED.balance;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER credit_wallet AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION credit_wallet();
ALTER TABLE redpacket.claim ENABLE ALWAYS TRIGGER credit_wallet;
});
my $connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION wallet CONNECTION '$connstr' PUBLICATION redpacket_events");
$sub->wait_for_subscription_sync($pub, 'wallet');

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

# Claims keep coming (some rolled back) while the subscriber is killed and
# started again.
my $tmp = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$tmp/claims.pgbench") or die;
print $fh qq{\\set u random(1, 5000)
BEGIN;
SELECT redpacket.rp_claim($fixed, 'pb' || :u, 0.75);
SELECT redpacket.rp_claim($lucky, 'pb' || :u);
END;
BEGIN;
SELECT redpacket.rp_claim($fixed, 'rolledback-pb' || :u, 0.10);
ROLLBACK;
};
close $fh;
my ($pb_out, $pb_err) = ('', '');
my $pgbench = IPC::Run::start(
	[   $pub->installed_command('pgbench'), '-n', '-c', '2', '-T', '8',
		'-f', "$tmp/claims.pgbench", $connstr ],
	'>', \$pb_out, '2>', \$pb_err);
sleep 2;
$sub->stop('immediate');
sleep 2;
$sub->start;
$pgbench->finish;
like($pb_out, qr/number of transactions actually processed: [1-9]/, 'claims ran across the subscriber restart')
  or diag($pb_err);

$pub->wait_for_catchup('wallet');

my $claims_q = 'SELECT activity_id, claim_id, user_id, amount FROM redpacket.claim ORDER BY 1, 2';
my $claims = $pub->safe_psql('postgres', $claims_q);
my $n = $pub->safe_psql('postgres', 'SELECT count(*) FROM redpacket.claim');
cmp_ok($n, '>', 250, "the publisher holds $n claims");
is($sub->safe_psql('postgres', 'SELECT activity_id, claim_id, user_id, amount FROM wallet_credit ORDER BY 1, 2'),
	$claims, 'every committed claim is credited, with its user and amount');
is($sub->safe_psql('postgres', 'SELECT count(*), count(DISTINCT (activity_id, claim_id)) FROM trigger_calls'),
	"$n|$n", 'the trigger ran exactly once per claim, across the restart');
is( $sub->safe_psql('postgres', "SELECT string_agg(user_id || ':' || balance, ',' ORDER BY user_id) FROM wallet"),
	$pub->safe_psql('postgres',
		"SELECT string_agg(user_id || ':' || s, ',' ORDER BY user_id) FROM (SELECT user_id, sum(amount) AS s FROM redpacket.claim GROUP BY user_id) c"),
	'every wallet equals the sum of its claims');
is( $sub->safe_psql('postgres',
		"SELECT (SELECT count(*) FROM redpacket.claim WHERE user_id LIKE 'rolledback%') + (SELECT count(*) FROM wallet WHERE user_id LIKE 'rolledback%')"),
	'0', 'nothing rolled back arrived');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM redpacket.ledger'),
	$pub->safe_psql('postgres', 'SELECT count(*) FROM redpacket.ledger'), 'the ledger is replicated too');

# --- The publication survives dump/restore and DROP/CREATE EXTENSION ---------

my $tables_q =
  "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'redpacket_events'";
$pub->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/pub.dump", '-d', $connstr ], 'pg_dump of the publisher');
$pub->safe_psql('postgres', 'CREATE DATABASE restored');
$pub->command_ok([ 'pg_restore', '-d', $pub->connstr('restored'), "$tmp/pub.dump" ],
	'pg_restore of the publisher exits 0');
is($pub->safe_psql('restored', $tables_q), 'claim,ledger',
	'after dump/restore the publication still lists claim and ledger');
is($pub->safe_psql('restored', 'SELECT count(*) FROM redpacket.claim'), $n, 'and the claims are there');

$pub->safe_psql('restored', 'SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
$pub->safe_psql('restored', 'CREATE EXTENSION redpacket');
is($pub->safe_psql('restored', $tables_q), 'claim,ledger',
	'after DROP/CREATE EXTENSION the publication lists claim and ledger again');

$sub->stop;
$pub->stop;
done_testing();
