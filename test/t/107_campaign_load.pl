# Claims, top-ups, withdrawals and list changes at once, ending in exact
# books.  For 15 seconds, 8 pgbench clients claim fixed amounts, lucky draws
# and batches while others top up and withdraw from the same activities
# (the withdrawals sometimes asking for more than is left: an error that
# writes nothing) and change the list of a restricted one.  Then:
#   - no client failed, every top-up and withdrawal is one ledger entry and
#     one activity_change row, every list change that changed something one row;
#   - the books of every activity balance (test/sql/books.sql: funded =
#     fund + top-ups - withdrawals = claims + stripes + returned, packets);
#   - every remaining packet of the capped activity keeps a minor unit;
#   - on the restricted activity only users that were ever listed hold claims;
#   - after closing all three, the books still balance and the remainder
#     went back once each.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $SECONDS = 15;

my $node = RedpacketTest::node('campaign_load', "max_connections = 40\n");

sql('CREATE EXTENSION redpacket');
my $fixed = sql("SELECT redpacket.rp_create_activity(20.00, stripes => 8, name => 'fixed')");
my $lucky = sql("SELECT redpacket.rp_create_activity(10.00, 200, stripes => 4, name => 'lucky')");
my $list = sql(
	"SELECT redpacket.rp_create_activity(50.00, stripes => 4, name => 'list', restricted => true)");
# even users 2..400 may ever be listed; odd ones never are
sql("SELECT redpacket.rp_allow($list, ARRAY(SELECT 'r' || g FROM generate_series(2, 400, 2) g))");
# a withdrawal that finds too little is an error; count it instead
sql(q{
CREATE FUNCTION try_withdraw(a bigint, amt numeric) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN redpacket.rp_withdraw(a, amt)::text;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN 'refused';
END $$});

my $tmp = PostgreSQL::Test::Utils::tempdir;
my %scripts = (
	'claim_fixed@6' => qq{\\set u random(1, 1000000000)
\\set c random(1, 9)
SELECT status FROM redpacket.rp_claim($fixed, 'f' || :u, :c / 100.0);
},
	'claim_lucky@4' => qq{\\set u random(1, 1000000000)
SELECT status FROM redpacket.rp_claim($lucky, 'l' || :u);
},
	'batch@1' => qq{\\set u random(1, 1000000000)
SELECT count(*) FROM redpacket.rp_claim_batch($fixed,
    ARRAY(SELECT 'b' || :u || '-' || g FROM generate_series(1, 20) g),
    array_fill(0.05::numeric, ARRAY[20]));
},
	'claim_list@3' => qq{\\set u random(1, 400)
SELECT status FROM redpacket.rp_claim($list, 'r' || :u, 0.10);
},
	'top_up@1' => qq{\\set which random(0, 1)
\\if :which
SELECT redpacket.rp_top_up($fixed, 0.50, reason => 'load');
\\else
SELECT redpacket.rp_top_up($lucky, 0.30, 20, 'load');
\\endif
},
	'withdraw@1' => qq{\\set which random(0, 1)
\\if :which
SELECT try_withdraw($fixed, 0.40);
\\else
SELECT try_withdraw($lucky, 0.25);
\\endif
},
	'list@1' => qq{\\set lo random(1, 190)
\\set which random(0, 1)
\\if :which
SELECT redpacket.rp_allow($list, ARRAY(SELECT 'r' || g FROM generate_series(:lo * 2, :lo * 2 + 20, 2) g));
\\else
SELECT redpacket.rp_disallow($list, ARRAY(SELECT 'r' || g FROM generate_series(:lo * 2, :lo * 2 + 20, 2) g));
\\endif
});
my @files;
for my $name (sort keys %scripts)
{
	my ($base, $weight) = split /@/, $name;
	PostgreSQL::Test::Utils::append_to_file("$tmp/$base.pgbench", $scripts{$name});
	push @files, '-f', "$tmp/$base.pgbench\@$weight";
}
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[   $node->installed_command('pgbench'), '-n', '-c', '8', '-j', '2', '-T', $SECONDS,
		@files, $node->connstr('postgres') ],
	'>', \$out, '2>', \$err);
ok($ok, 'pgbench ran') or diag($err);
like($out, qr/number of failed transactions: 0 /, 'no transaction failed') or diag($out);
unlike($err, qr/ERROR|aborted/, 'no client error') or diag($err);

my $moved = sql(qq{
SELECT count(*) FILTER (WHERE kind = 'top_up') || '|' || count(*) FILTER (WHERE kind = 'withdraw')
  FROM redpacket.ledger WHERE activity_id IN ($fixed, $lucky)});
my ($top_ups, $withdrawals) = split /\|/, $moved;
cmp_ok($top_ups, '>', 0, "top-ups ran ($top_ups)");
cmp_ok($withdrawals, '>', 0, "withdrawals ran ($withdrawals)");
is( sql(qq{
SELECT count(*) FILTER (WHERE kind = 'top_up') || '|' || count(*) FILTER (WHERE kind = 'withdraw')
  FROM redpacket.activity_change WHERE activity_id IN ($fixed, $lucky)}),
	$moved, 'one activity_change row per top-up and withdrawal');
is( sql(qq{
SELECT count(*) FROM redpacket.ledger l
  LEFT JOIN redpacket.activity_change c
    ON c.activity_id = l.activity_id AND c.kind = l.kind AND c.changed_at = l.created_at
 WHERE l.activity_id IN ($fixed, $lucky) AND l.kind IN ('top_up', 'withdraw') AND c.change_id IS NULL}),
	'0', 'each entry has its change, made in the same transaction');
cmp_ok(sql("SELECT count(*) FROM redpacket.activity_change WHERE activity_id = $list"),
	'>', 0, 'list changes were recorded');
cmp_ok(sql("SELECT count(*) FROM redpacket.claim WHERE activity_id IN ($fixed, $lucky, $list)"),
	'>', 100, 'claims were made meanwhile');

is(RedpacketTest::unbalanced($node), '0', 'the books of every activity balance');
is( sql(qq{
SELECT sum(balance - dealt_units) >= sum(packets - dealt_count)
  FROM redpacket.stripe WHERE activity_id = $lucky}),
	't', 'every remaining packet of the capped activity keeps a minor unit');
is( sql(qq{
SELECT count(*) FROM redpacket.claim
 WHERE activity_id = $list AND substr(user_id, 2)::int % 2 = 1}),
	'0', 'nobody who was never listed holds a claim on the restricted activity');

for my $a ($fixed, $lucky, $list)
{
	sql("SELECT redpacket.rp_close_activity($a)");
}
is(RedpacketTest::unbalanced($node), '0', 'after closing them, the books still balance');
is( sql(qq{
SELECT count(*) FROM redpacket.activity a
 WHERE a.id IN ($fixed, $lucky, $list)
   AND (SELECT count(*) FROM redpacket.ledger l WHERE l.activity_id = a.id AND l.kind = 'return') = 1
   AND (SELECT count(*) FROM redpacket.activity_change c WHERE c.activity_id = a.id AND c.kind = 'close') = 1}),
	'3', 'each remainder went back once, with its change row');

$node->stop;
done_testing();
