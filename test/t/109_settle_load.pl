# Claims, credits and reversals at once, under pgbench: single claims (some
# rolled back) and batches on a fixed-amount and a lucky-draw activity, a
# wallet that acknowledges what rp_pending_credits lists (its frontier moving
# while claims are in flight), an operator reversing claims (some already
# credited: refused), and a third activity closed half-way, whose reversals
# then go to the funder.  At the end: the books of every activity balance
# with the reversed claims counted out, every claim is credited, reversed or
# listed by rp_pending_credits (exactly the unsettled ones, for each
# activity and for all), the frontier's promise holds (every claim up to it
# is settled or a gap), and once the wallet acknowledges the rest nothing is
# pending.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('settle', qq{
max_connections = 40
max_locks_per_transaction = 256
});
sql(q{
CREATE EXTENSION redpacket;
CREATE TABLE settle_log (activity_id bigint, claim_id bigint, what text, n bigint);
-- The wallet: acknowledge up to 200 of the pending claims, oldest first
-- (but the user 'reserved', whose claim the test reverses after the close).
CREATE FUNCTION stress_credit(act bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    n bigint;
BEGIN
    SELECT array_agg(p.claim_id) INTO ids
      FROM (SELECT claim_id FROM redpacket.rp_pending_credits(act)
             WHERE user_id <> 'reserved' LIMIT 200) p;
    IF ids IS NULL THEN
        RETURN 'none';
    END IF;
    n := redpacket.rp_credited(act, ids, 'stress');
    INSERT INTO settle_log VALUES (act, NULL, 'credited', n);
    RETURN 'credited';
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    -- one of them was reversed meanwhile: all or nothing, nothing credited
    INSERT INTO settle_log VALUES (act, NULL, 'credit refused', cardinality(ids));
    RETURN 'refused';
END
$$;
-- The operator: reverse one of the newest claims, settled or not.
CREATE FUNCTION stress_reverse(act bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
    back numeric;
BEGIN
    SELECT k.claim_id INTO c FROM redpacket.claim k
     WHERE k.activity_id = act AND k.user_id <> 'reserved'
     ORDER BY k.claim_id DESC LIMIT 1 OFFSET floor(random() * 20)::int;
    IF c IS NULL THEN
        RETURN 'none';
    END IF;
    back := redpacket.rp_reverse(act, c, 'stress');
    INSERT INTO settle_log VALUES (act, c, CASE WHEN back > 0 THEN 'reversed' ELSE 'reversed again' END, 1);
    RETURN 'reversed';
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    INSERT INTO settle_log VALUES (act, c, 'reverse refused', 1);
    RETURN 'refused';
END
$$;
});
my $fixed = sql("SELECT redpacket.rp_create_activity(100000.00, stripes => 16, name => 'fixed')");
my $lucky = sql("SELECT redpacket.rp_create_activity(5000.00, 4000, stripes => 8, name => 'lucky')");
my $closing = sql("SELECT redpacket.rp_create_activity(3000.00, stripes => 4, name => 'closing')");
my $reserved = sql("SELECT claim_id FROM redpacket.rp_claim($closing, 'reserved', 1.00)");

my $tmp = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$tmp/claim.pgbench", qq{\\set u random(1, 20000)
\\set r random(1, 10)
BEGIN;
SELECT redpacket.rp_claim($fixed, 'f' || :u, 0.25);
SELECT redpacket.rp_claim($lucky, 'l' || :u);
SELECT redpacket.rp_claim($closing, 'c' || :u, 0.10);
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
});
PostgreSQL::Test::Utils::append_to_file("$tmp/batch.pgbench", qq{\\set u random(1, 2000)
SELECT count(*) FROM redpacket.rp_claim_batch($fixed, ARRAY['b' || :u, 'b' || :u + 1, 'b' || :u + 2], ARRAY[0.50, 0.50, 0.50]);
});
PostgreSQL::Test::Utils::append_to_file("$tmp/credit.pgbench",
	"SELECT stress_credit($fixed);\nSELECT stress_credit($lucky);\nSELECT stress_credit($closing);\n");
PostgreSQL::Test::Utils::append_to_file("$tmp/reverse.pgbench",
	"SELECT stress_reverse($fixed);\nSELECT stress_reverse($lucky);\nSELECT stress_reverse($closing);\n");

my $connstr = $node->connstr . ' dbname=postgres';
my @runs;
for my $job ([ 'claim', 5 ], [ 'batch', 1 ], [ 'credit', 2 ], [ 'reverse', 1 ])
{
	my ($script, $clients) = @$job;
	my ($out, $err) = ('', '');
	push @runs,
	  [ $script, \$out, \$err,
		IPC::Run::start(
			[   $node->installed_command('pgbench'), '-n', '-c', $clients, '-T', '12',
				'--max-tries', '20', '-f', "$tmp/$script.pgbench", $connstr ],
			'>', \$out, '2>', \$err) ];
}
sleep 6;
my $returned = sql("SELECT redpacket.rp_close_activity($closing)");
note("closed 'closing' half-way, returned $returned");
is(sql("SELECT redpacket.rp_reverse($closing, $reserved, 'after the close')"),
	'1.00', 'a claim reversed after the close, under load, returns its amount');
for my $r (@runs)
{
	my ($script, $out, $err, $h) = @$r;
	$h->finish;
	like($$out, qr/number of transactions actually processed: [1-9]/, "pgbench $script ran")
	  or diag($$err);
	like($$out, qr/number of failed transactions: 0 /, "pgbench $script: no transaction failed")
	  or diag($$out . $$err);
}

my %log = map { split /\|/ } split /\n/,
  sql("SELECT what, sum(n) FROM settle_log GROUP BY what");
note(join(', ', map { "$_ $log{$_}" } sort keys %log));
cmp_ok($log{reversed} // 0, '>', 0, 'claims were reversed');
cmp_ok($log{credited} // 0, '>', 0, 'claims were credited');
cmp_ok(sql("SELECT count(*) FROM redpacket.ledger WHERE activity_id = $closing AND kind = 'refund'"),
	'>', 0, 'reversals after the close refunded the funder');
is( sql(
		"SELECT count(*) FROM settle_log l WHERE l.what = 'reversed' AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = l.activity_id AND s.claim_id = l.claim_id AND s.state = 'reversed')"
	),
	'0', 'every reversal that returned money is recorded as reversed');
is( sql(
		"SELECT count(*) FROM settle_log l WHERE l.what = 'reverse refused' AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = l.activity_id AND s.claim_id = l.claim_id AND s.state = 'credited')"
	),
	'0', 'every refused reversal was of a credited claim');

# --- The books and the settlements -----------------------------------------
is(RedpacketTest::unbalanced($node), '0', 'the books of every activity balance, reversed claims counted out');
my $unsettled_q = q{
SELECT string_agg(k.activity_id || ':' || k.claim_id, ',' ORDER BY k.activity_id, k.claim_id)
  FROM redpacket.claim k
 WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id)};
my $unsettled = sql($unsettled_q);
for my $a ($fixed, $lucky, $closing)
{
	is( sql(
			"SELECT string_agg(activity_id || ':' || claim_id, ',' ORDER BY activity_id, claim_id) FROM redpacket.rp_pending_credits($a)"
		),
		sql("$unsettled_q AND k.activity_id = $a"),
		"activity $a: rp_pending_credits lists exactly its unsettled claims");
}
is( sql(
		"SELECT string_agg(activity_id || ':' || claim_id, ',' ORDER BY activity_id, claim_id) FROM redpacket.rp_pending_credits()"
	),
	$unsettled, 'rp_pending_credits() lists exactly the unsettled claims of all');
is( sql(q{
SELECT count(*) FROM redpacket.claim k JOIN redpacket.settlement_state f USING (activity_id)
 WHERE k.claim_id <= f.settled_through
   AND NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id)
   AND NOT EXISTS (SELECT FROM redpacket.settlement_gap g WHERE g.activity_id = k.activity_id AND g.claim_id = k.claim_id)}),
	'0', 'every claim up to the frontier is settled or listed as a gap');
cmp_ok(sql("SELECT count(*) FROM redpacket.settlement_state WHERE settled_through > 0"),
	'>', 0, 'the frontiers moved under load');

# The wallet acknowledges the rest: then every claim is settled.
for my $a ($fixed, $lucky, $closing)
{
	sql("SELECT redpacket.rp_credited($a, ARRAY(SELECT claim_id FROM redpacket.rp_pending_credits($a)))");
}
is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()'), '0', 'nothing is pending once the wallet acknowledged the rest');
is( sql(
		"SELECT count(*) FROM redpacket.claim k WHERE NOT EXISTS (SELECT FROM redpacket.claim_settlement s WHERE s.activity_id = k.activity_id AND s.claim_id = k.claim_id)"
	),
	'0', 'every claim is credited or reversed');
is(RedpacketTest::unbalanced($node), '0', 'and the books still balance');

$node->stop;
done_testing();
