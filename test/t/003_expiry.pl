# Expiry settlement by the worker: an activity whose ends_at passes is
# settled exactly once by the next pass: one 'return' ledger entry with the
# unclaimed remainder, closed_at set, every stripe at zero, later claims
# 'ended' (a retry still gets its 'duplicate'), and later passes, an operator
# close or a full check change nothing.  An open-ended activity beside it and
# one ending later are left alone; an activity drained before it ends
# returns nothing.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;
use Time::HiRes qw(time);

my $node = RedpacketTest::node(
	'expiry', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

# Money of one activity: "returns|returned|stripe balance|closed".
sub money
{
	my ($aid) = @_;
	return sql(
		qq{SELECT (SELECT count(*) FROM redpacket.ledger WHERE activity_id = $aid AND kind = 'return'),
		          (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger WHERE activity_id = $aid AND kind = 'return'),
		          (SELECT sum(balance) FROM redpacket.stripe WHERE activity_id = $aid),
		          (SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $aid)});
}

# A claim on a ticker activity, waited for until a worker pass counts it:
# proof that a whole pass ran after this point.
my $ticker = sql("SELECT redpacket.rp_create_activity(1000.00, stripes => 1, name => 'ticker')");
my $ticks = 0;
sub tick
{
	$ticks++;
	my $cid = sql("SELECT claim_id FROM redpacket.rp_claim($ticker, 'tick$ticks', 0.01)");
	return $node->poll_query_until('postgres',
		"SELECT last_claim_id >= $cid FROM redpacket.reconcile_state WHERE activity_id = $ticker");
}

# 10.00 in 5 packets over 3 stripes, two claims made; it is made to end
# once everything before expiry is done (however slow the machine).
my $expiring = sql(
	q{SELECT redpacket.rp_create_activity(10.00, 5, ends_at => clock_timestamp() + interval '1 hour',
	                                       stripes => 3, name => 'expiring')});
is(sql("SELECT status FROM redpacket.rp_claim($expiring, 'alice', 1.25)"),
	'claimed', 'claim before expiry');
is(sql("SELECT status FROM redpacket.rp_claim($expiring, 'bob')"),
	'claimed', 'lucky claim before expiry');
my $claimed = sql("SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $expiring");

# Open-ended, ending much later, and drained before it ends.
my $open = sql("SELECT redpacket.rp_create_activity(10.00, 5, stripes => 3, name => 'open')");
my $later = sql(
	q{SELECT redpacket.rp_create_activity(10.00, 5, ends_at => now() + interval '1 hour', stripes => 3)});
my $drained = sql(
	q{SELECT redpacket.rp_create_activity(2.00, 2, ends_at => clock_timestamp() + interval '1 hour', stripes => 2)});
sql("SELECT redpacket.rp_claim($open, 'alice', 1.00)");
sql("SELECT redpacket.rp_claim($later, 'alice', 1.00)");
sql("SELECT redpacket.rp_claim($drained, u, 1.00) FROM unnest(ARRAY['x', 'y']) u");
is(money($expiring), "0|0|" . sprintf('%d', 1000 - $claimed * 100 + 0.5) . "|f",
	'before expiry: no return, stripes hold the remainder');
my $ends_at = sql(qq{SET session_replication_role = replica;
                      UPDATE redpacket.activity SET ends_at = clock_timestamp() + interval '1 s'
                      WHERE id IN ($expiring, $drained) RETURNING ends_at});
$ends_at = (split /\n/, $ends_at)[0];

# The worker settles it within two intervals of ends_at.
ok( $node->poll_query_until(
		'postgres',
		"SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $expiring"),
	'the worker closed the expired activity');
my $late = sql(
	"SELECT extract(epoch FROM closed_at - ends_at) < 5 FROM redpacket.activity WHERE id = $expiring");
is($late, 't', 'settled within a few seconds of ends_at');

my $remainder = sprintf('%.2f', 10 - $claimed);
is(money($expiring), "1|$remainder|0|t",
	"settled once: one return of the remainder $remainder, stripes zero, closed");
is( sql(qq{SELECT count(*), bool_and(balance = 0)
             FROM redpacket.stripe WHERE activity_id = $expiring}),
	'3|t', 'every stripe is at zero balance');
is( sql(qq{SELECT closed_at >= ends_at FROM redpacket.activity WHERE id = $expiring}),
	't', 'closed_at is not before ends_at');
is( sql(qq{SELECT (SELECT amount FROM redpacket.ledger WHERE activity_id = $expiring AND kind = 'fund')
                 - (SELECT amount FROM redpacket.ledger WHERE activity_id = $expiring AND kind = 'return')
                 - (SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $expiring)}),
	'0.00', 'funded - returned - claimed = 0');
is( sql(qq{SELECT state, claimed_amount, claimed_count, remaining_amount, last_reconcile_ok
             FROM redpacket.activity_status WHERE id = $expiring}),
	"ended|$claimed|2|0.00|t",
	'activity_status: ended, claimed amount kept, nothing remaining, last pass ok');
is( sql(qq{SELECT ok, expected, actual FROM redpacket.reconciliation
            WHERE activity_id = $expiring ORDER BY pass_id DESC LIMIT 1}),
	't|0.00|0.00', 'the settling pass is recorded ok with expected = actual = 0');

is(sql("SELECT status FROM redpacket.rp_claim($expiring, 'carol', 1.00)"),
	'ended', 'a new claim after expiry gets ended');
is(sql("SELECT status, amount FROM redpacket.rp_claim($expiring, 'alice', 1.25)"),
	'duplicate|1.25', 'a retry after expiry still gets its duplicate');

# Later passes change nothing.
ok(tick() && tick(), 'two more worker passes ran');
is(money($expiring), "1|$remainder|0|t",
	'after more passes: still one return row, sums unchanged');
is( sql(qq{SELECT count(*) FILTER (WHERE NOT ok) FROM redpacket.reconciliation
            WHERE activity_id = $expiring}),
	'0', 'no pass of the settled activity is not ok');

# An operator close and a full check after settlement change nothing either.
is(sql("SELECT redpacket.rp_close_activity($expiring)"),
	'0.00', 'rp_close_activity after settlement returns 0');
my $full = '';
for (1 .. 100)
{
	$full = sql(
		"SELECT ok, expected, actual, expected_claims FROM redpacket.rp_reconcile($expiring, full_check => true)"
	);
	last if $full ne '';
	select(undef, undef, undef, 0.1);
}
is($full, 't|0.00|0.00|2', 'full check after settlement is ok');
is(money($expiring), "1|$remainder|0|t", 'still exactly one return row');
is( sql(qq{SELECT count(*), sum(amount) FROM redpacket.ledger WHERE activity_id = $expiring}),
	"2|" . sprintf('%.2f', 10 + $remainder), 'ledger holds only the funding and the one return');

# The activity drained before expiry: settled with nothing to return.
ok( $node->poll_query_until(
		'postgres',
		"SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $drained"),
	'the drained activity is closed at expiry too');
like(money($drained), qr/^[01]\|0(\.00)?\|0\|t$/,
	'drained activity: at most one return, of nothing');
is( sql(qq{SELECT count(*) FILTER (WHERE NOT ok) FROM redpacket.reconciliation
            WHERE activity_id = $drained}),
	'0', 'drained activity: every pass ok');

# The others are left alone.
is(money($open), '0|0|900|f', 'open-ended activity untouched');
is(money($later), '0|0|900|f', 'activity ending later untouched');
is(sql("SELECT status FROM redpacket.rp_claim($open, 'dave', 1.00)"),
	'claimed', 'open-ended activity still claimable');
is(sql("SELECT status FROM redpacket.rp_claim($later, 'dave', 1.00)"),
	'claimed', 'activity ending later still claimable');

ok(!$node->log_contains(qr/ERROR|WARNING|PANIC|terminated by signal/, 0),
	'no error or warning in the server log');

# Race: 20 activities expire together while operators close them and claims
# keep coming; each is settled exactly once, whoever gets there first.
my ($first, $last) = split /\|/, sql(q{
WITH a AS (SELECT redpacket.rp_create_activity(10.00, 10, ends_at => clock_timestamp() + interval '2 s',
                                               stripes => 2) AS id
             FROM generate_series(1, 20))
SELECT min(id), max(id) FROM a});
$node->pgbench(
	'--no-vacuum --client=3 --jobs=2 --time=4',
	0,
	[qr{processed: [1-9]}],
	[qr{^$}],
	'closes and claims race the worker settling expired activities',
	{
		'003_close@1' => qq{
\\set id random($first, $last)
SELECT redpacket.rp_close_activity(:id);
},
		'003_claim@3' => qq{
\\set id random($first, $last)
\\set u random(1, 1000000)
SELECT redpacket.rp_claim(:id, :client_id || '-' || :u, 0.10);
}
	});
ok( $node->poll_query_until(
		'postgres',
		"SELECT bool_and(closed_at IS NOT NULL) FROM redpacket.activity WHERE id BETWEEN $first AND $last"
	),
	'all raced activities are closed');
is( sql(qq{
SELECT count(*) FILTER (WHERE returns <> 1), count(*) FILTER (WHERE fund - returned - claimed <> 0),
       count(*) FILTER (WHERE stripes <> 0)
  FROM (SELECT a.id,
               (SELECT count(*) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'return') AS returns,
               (SELECT sum(amount) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'fund') AS fund,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'return') AS returned,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = a.id) AS claimed,
               (SELECT sum(balance) FROM redpacket.stripe s WHERE s.activity_id = a.id) AS stripes
          FROM redpacket.activity a WHERE a.id BETWEEN $first AND $last) x}),
	'0|0|0',
	'raced activities: exactly one return each, money balances, stripes zero');
ok(tick() && tick(), 'two more worker passes ran');
is( sql(qq{SELECT count(*) FILTER (WHERE NOT ok) FROM redpacket.reconciliation
            WHERE activity_id BETWEEN $first AND $last}),
	'0', 'raced activities: every pass ok');
is(sql("SELECT count(*) FROM redpacket.activity_status WHERE state = 'frozen'"),
	'0', 'nothing frozen');

$node->stop('fast');
done_testing();
