# The drop guard: while any claim or ledger entry exists, DROP EXTENSION
# redpacket (with or without CASCADE, alone or in a list), DROP SCHEMA
# redpacket CASCADE and DROP OWNED BY the extension's owner are refused with
# an error that counts the records and says how to dump them, in a fresh
# session that has not loaded the library (no preloading here), and the
# refusal leaves every row and the extension intact.  A non-superuser cannot
# turn redpacket.allow_drop on; a superuser can, and then the drop goes
# through.  With no money records at all the extension drops without it, and
# other DROP commands (another schema, another extension) are not affected.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('drop_guard');

# Run one statement in a fresh session; returns its stderr.
sub refused
{
	my ($stmt, $db) = @_;
	my ($ret, $out, $err) = $node->psql($db // 'postgres', $stmt);
	isnt($ret, 0, "refused: $stmt");
	return $err;
}

# An empty extension drops without the setting.
sql('CREATE EXTENSION redpacket');
sql('DROP EXTENSION redpacket');
is(sql("SELECT count(*) FROM pg_extension WHERE extname = 'redpacket'"),
	'0', 'with no money records DROP EXTENSION needs no setting');

sql('CREATE EXTENSION redpacket');
my $aid = sql("SELECT redpacket.rp_create_activity(10.00, stripes => 2)");
sql("SELECT redpacket.rp_claim($aid, 'u' || g, 1.00) FROM generate_series(1, 3) g");
my $state_q = q{
SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'redpacket'),
       (SELECT count(*) FROM redpacket.claim), (SELECT count(*) FROM redpacket.ledger),
       (SELECT sum(balance) FROM redpacket.stripe)};
my $before = sql($state_q);
is($before, '1|3|1|700', 'three claims and the funding entry');

my $err = refused('DROP EXTENSION redpacket');
like($err, qr/ERROR:  DROP EXTENSION would delete 3 claims and 1 ledger entries of extension redpacket/,
	'the error counts the records');
like($err, qr/HINT:  Dump them first, e\.g\. pg_dump -Fc -n redpacket -e redpacket -f redpacket\.dump postgres; then SET redpacket\.allow_drop = on/,
	'the hint says how to dump them and how to drop anyway');
like(refused('DROP EXTENSION redpacket CASCADE'), qr/would delete 3 claims/, 'CASCADE too');
like(refused('DROP EXTENSION IF EXISTS plpgsql_no_such, redpacket'), qr/would delete 3 claims/,
	'in a list');
like(refused('DROP SCHEMA redpacket CASCADE'), qr/DROP SCHEMA would delete 3 claims/,
	'DROP SCHEMA redpacket CASCADE');
like(refused('BEGIN; SELECT redpacket.rp_claim(' . $aid . ", 'in-tx', 1.00); DROP EXTENSION redpacket; COMMIT;"),
	qr/would delete 4 claims/, 'counts the claims of its own transaction, which then rolls back');

# DROP OWNED BY the owner would take the extension with it.
$node->safe_psql('postgres', 'CREATE ROLE rpadmin SUPERUSER; CREATE DATABASE owned OWNER rpadmin');
$node->safe_psql('owned', "SET ROLE rpadmin; CREATE EXTENSION redpacket; SELECT redpacket.rp_create_activity(1.00)");
like(refused('DROP OWNED BY rpadmin', 'owned'), qr/DROP OWNED would delete 0 claims and 1 ledger entries/,
	'DROP OWNED BY the extension owner');
is($node->safe_psql('owned', "SELECT count(*) FROM redpacket.ledger"), '1', 'the owned database keeps its ledger');

is(sql($state_q), $before, 'every refusal left the extension and every row intact');
is(sql("SELECT count(*), bool_and(ok) FROM redpacket.rp_reconcile(NULL, true)"),
	'1|t', 'the books still reconcile');
is(sql("SELECT status FROM redpacket.rp_claim($aid, 'after', 1.00)"), 'claimed', 'claims continue');

# Unrelated drops pass.
sql('CREATE SCHEMA other; CREATE TABLE other.t (x int); DROP SCHEMA other CASCADE');
sql('CREATE EXTENSION pg_prewarm; DROP EXTENSION pg_prewarm');
pass('other DROP SCHEMA / DROP EXTENSION commands are not affected');

# Only a superuser can allow it.
sql('CREATE ROLE plain LOGIN');
like(refused("LOAD 'redpacket'; SET ROLE plain; SET redpacket.allow_drop = on"),
	qr/permission denied to set parameter "redpacket.allow_drop"/,
	'a non-superuser cannot set redpacket.allow_drop');

sql('SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
is(sql("SELECT count(*) FROM pg_extension WHERE extname = 'redpacket'"),
	'0', 'with redpacket.allow_drop = on the drop goes through');
$node->safe_psql('owned', 'SET redpacket.allow_drop = on; DROP OWNED BY rpadmin');
is($node->safe_psql('owned', "SELECT count(*) FROM pg_extension WHERE extname = 'redpacket'"),
	'0', 'DROP OWNED too');

$node->stop;
done_testing();
