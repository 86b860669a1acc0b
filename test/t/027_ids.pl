# Ids never repeat in a database, across DROP EXTENSION and CREATE EXTENSION
# too, so that the key the README tells a consumer to use, (activity_id,
# claim_id) for claims and (activity_id, entry_id) for ledger entries, names
# one row for the database's whole life.  A real logical consumer (a
# subscriber cluster with plain tables and an ENABLE ALWAYS trigger that
# credits a wallet idempotently on (activity_id, claim_id)) follows the
# publication redpacket_events, which survives the re-create, across:
# - DROP EXTENSION with redpacket.allow_drop (the drop guard records where the
#   sequences stand; the next installation continues after them);
# - DROP EXTENSION with the drop guard disabled (the guard sees nothing; the
#   installation bounds the ids from the WAL written since the marks);
# - a setval jump (the README's cut-over advice) followed by such a drop (the
#   reconciler writes the marks again after the jump);
# Every claim of every installation reaches the wallet once, with its money,
# and the subscriber's apply never hits a duplicate key.  Also: a copy made
# with CREATE DATABASE ... TEMPLATE (which does not copy the setting) gets its
# marks from the reconciler; pg_dump/pg_restore into a new database continues
# after the dump's ids; a rebuilt schema (dump, DROP, CREATE, a data-only
# restore of the older dump) hands out none of the ids made after the dump;
# a refused drop records nothing.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('ids_pub');
$pub->init(allows_streaming => 'logical');
$pub->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});
$pub->start;
RedpacketTest::use_node($pub);

sql('CREATE EXTENSION redpacket');

my $sub = PostgreSQL::Test::Cluster->new('ids_sub');
$sub->init;
$sub->start;
RedpacketTest::subscribe_events($pub, $sub, 'wallet');
# The consumer the README describes: idempotent on (activity_id, claim_id).
$sub->safe_psql(
	'postgres', q{
CREATE TABLE wallet_credit (activity_id bigint, claim_id bigint, user_id text NOT NULL,
                            amount numeric NOT NULL, PRIMARY KEY (activity_id, claim_id));
CREATE FUNCTION credit_wallet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.wallet_credit VALUES (NEW.activity_id, NEW.claim_id, NEW.user_id, NEW.amount)
        ON CONFLICT (activity_id, claim_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER credit_wallet AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION credit_wallet();
ALTER TABLE redpacket.claim ENABLE ALWAYS TRIGGER credit_wallet;
});

# One installation's worth of rows: activities, claims (single, batch,
# lucky), ledger entries, reconciliation passes.
sub life
{
	my ($db, $tag) = @_;
	my $fixed = sql("SELECT redpacket.rp_create_activity(100.00, stripes => 2)", $db);
	my $lucky = sql("SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2)", $db);
	sql(qq{
SELECT redpacket.rp_claim($fixed, '$tag-u' || g, 1.00) FROM generate_series(1, 5) g;
SELECT count(*) FROM redpacket.rp_claim_batch($fixed, ARRAY['$tag-b1', '$tag-b2'], ARRAY[0.50, 0.50]);
SELECT redpacket.rp_claim($lucky, '$tag-l' || g) FROM generate_series(1, 2) g;
SELECT redpacket.rp_close_activity($lucky);
}, $db);
	$pub->poll_query_until($db, "SELECT count(*) > 0 FROM redpacket.rp_reconcile(NULL, true)")
	  or die 'no reconciliation pass';
	return;
}

# The largest id of every kind in this installation's tables.
my $max_q = q{SELECT (SELECT max(id) FROM redpacket.activity) || '|' ||
                     (SELECT max(claim_id) FROM redpacket.claim) || '|' ||
                     (SELECT max(entry_id) FROM redpacket.ledger) || '|' ||
                     (SELECT max(pass_id) FROM redpacket.reconciliation)};
my $min_q = $max_q =~ s/max\(/min(/gr;

# Every id of the new installation is above every id of the old one.
sub above
{
	my ($what, $db, $old_max) = @_;
	my @old = split /\|/, $old_max;
	my @new = split /\|/, sql($min_q, $db);
	my @kinds = qw(activity claim ledger pass);
	my @bad = grep { !($new[$_] > $old[$_]) } 0 .. $#kinds;
	ok(!@bad, "$what: the new installation's first ids (" . join(', ', @new)
		  . ') are above the old one\'s last (' . join(', ', @old) . ')')
	  or diag('not above: ' . join(', ', map { $kinds[$_] } @bad));
}

# The marks the database keeps (redpacket.id_marks), or '' when none.
sub marks
{
	my ($db) = @_;
	return sql(q{SELECT coalesce(min(substr(c, length('redpacket.id_marks=') + 1)), '')
	               FROM pg_db_role_setting s, unnest(s.setconfig) c
	              WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
	                AND s.setrole = 0 AND c LIKE 'redpacket.id_marks=%'}, $db);
}

# The claims and ledger entries of the publisher so far, as the consumer
# must have them at the end (rows of dropped installations included).
my @published_claims;
my @published_ledger;

sub remember
{
	push @published_claims,
	  split /\n/, sql('SELECT activity_id, claim_id, user_id, amount FROM redpacket.claim');
	push @published_ledger,
	  split /\n/, sql('SELECT activity_id, entry_id, kind, amount FROM redpacket.ledger');
}

# The subscriber has every row published so far, exactly once.
sub consumer_has_all
{
	my ($what) = @_;
	my $log_offset = -s $sub->logfile;
	local $PostgreSQL::Test::Utils::timeout_default = 60;
	my $ok = eval { $pub->wait_for_catchup('wallet'); 1 };
	ok($ok, "$what: the subscriber caught up") or diag($@);
	my @claims = (@published_claims,
		split /\n/, sql('SELECT activity_id, claim_id, user_id, amount FROM redpacket.claim'));
	my @ledger = (@published_ledger,
		split /\n/, sql('SELECT activity_id, entry_id, kind, amount FROM redpacket.ledger'));
	is( $sub->safe_psql('postgres',
			'SELECT activity_id, claim_id, user_id, amount FROM wallet_credit ORDER BY 1, 2'),
		join("\n", sort { by_key($a, $b) } @claims),
		"$what: the wallet credited every claim of every installation once, with its amount");
	is( $sub->safe_psql('postgres',
			'SELECT activity_id, entry_id, kind, amount FROM redpacket.ledger ORDER BY 1, 2'),
		join("\n", sort { by_key($a, $b) } @ledger),
		"$what: the subscriber holds every ledger entry of every installation");
	ok(!$sub->log_contains(qr/duplicate key value violates unique constraint/, 0),
		"$what: the apply worker never met a duplicate key");
}

sub by_key
{
	my ($x, $y) = @_;
	my @x = split /\|/, $x;
	my @y = split /\|/, $y;
	return $x[0] <=> $y[0] || $x[1] <=> $y[1];
}

# --- First installation -----------------------------------------------------

life('postgres', 'one');
my $one = sql($max_q);
consumer_has_all('first installation');

# A refused drop records nothing: the marks still say installed.
my ($ret, $out, $err) = $pub->psql('postgres', 'DROP EXTENSION redpacket');
isnt($ret, 0, 'DROP EXTENSION is refused while claims exist');
like(marks('postgres'), qr/^\S+ installed /, 'and the marks are still those of a live installation');

# --- DROP with the guard, CREATE again ---------------------------------------

remember();
sql('SET redpacket.allow_drop = on; DROP EXTENSION redpacket');
like(marks('postgres'), qr/^\S+ dropped .*\bclaim_id_seq=(\d+)/,
	'the drop guard recorded where the sequences stood');
my ($marked_claim) = marks('postgres') =~ /\bclaim_id_seq=(\d+)/;
is($marked_claim, (split /\|/, $one)[1], 'the marked claim position is the last claim id');
is( $pub->safe_psql('postgres',
		"SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'redpacket_events'"),
	'', 'the publication survived the drop, empty');
sql('CREATE EXTENSION redpacket');
life('postgres', 'two');
above('after DROP/CREATE EXTENSION', 'postgres', $one);
is( sql("SELECT min(claim_id) FROM redpacket.claim"), $marked_claim + 1,
	'the claim ids continue right after the marked position');
consumer_has_all('after DROP/CREATE EXTENSION');

# --- A drop the guard does not see ---------------------------------------------

my $two = sql($max_q);
remember();
sql('ALTER EVENT TRIGGER redpacket_drop_guard DISABLE; DROP EXTENSION redpacket');
like(marks('postgres'), qr/^\S+ installed /, 'a drop without the guard leaves the installed marks');
sql('CREATE EXTENSION redpacket');
life('postgres', 'three');
above('after a drop with the guard disabled', 'postgres', $two);
consumer_has_all('after a drop with the guard disabled');

# --- A setval jump, then a drop the guard does not see ---------------------------

my $jumped = sql(
	"SELECT setval('redpacket.claim_id_seq', (SELECT max(claim_id) FROM redpacket.claim) + 1000000)");
ok( $pub->poll_query_until(
		'postgres', qq{
SELECT substring(c from 'claim_id_seq=(\\d+)')::bigint >= $jumped
  FROM pg_db_role_setting s, unnest(s.setconfig) c
 WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND s.setrole = 0 AND c LIKE 'redpacket.id_marks=%'}),
	'after a setval jump the reconciler writes the marks again');
my $three = sql($max_q);
remember();
sql('ALTER EVENT TRIGGER redpacket_drop_guard DISABLE; DROP EXTENSION redpacket');
sql('CREATE EXTENSION redpacket');
life('postgres', 'four');
above('after a jump and an unguarded drop', 'postgres', $three);
cmp_ok(sql('SELECT min(claim_id) FROM redpacket.claim'), '>', $jumped,
	'the claim ids start past the jump');
consumer_has_all('after a jump and an unguarded drop');

# --- A copy made from a template gets its marks from the reconciler -------------

sql('CREATE DATABASE tpl');
sql('CREATE EXTENSION redpacket', 'tpl');
life('tpl', 'tpl');
my $tpl = sql($max_q, 'tpl');
sql('CREATE DATABASE cpy TEMPLATE tpl');
ok( $pub->poll_query_until(
		'cpy', q{
SELECT count(*) = 1 FROM pg_db_role_setting s, unnest(s.setconfig) c
 WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = 'cpy')
   AND s.setrole = 0 AND c LIKE 'redpacket.id_marks=%'}),
	'CREATE DATABASE ... TEMPLATE: the reconciler gives the copy its marks');
sql('ALTER EVENT TRIGGER redpacket_drop_guard DISABLE; DROP EXTENSION redpacket', 'cpy');
sql('CREATE EXTENSION redpacket', 'cpy');
life('cpy', 'cpy');
above('the copy, after an unguarded drop', 'cpy', $tpl);

# --- pg_dump/pg_restore into a new database ------------------------------------

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $four = sql($max_q);
$pub->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/app.dump", '-d', $pub->connstr('postgres') ],
	'pg_dump of the publisher');
sql('CREATE DATABASE restored');
sql('ALTER DATABASE restored SET redpacket.restoring = on');
$pub->command_ok([ 'pg_restore', '-d', $pub->connstr('restored'), "$tmp/app.dump" ],
	'pg_restore into a new database');
sql('CALL redpacket.rp_post_restore()', 'restored');
like(marks('restored'), qr/\bclaim_id_seq=(\d+)/, 'rp_post_restore wrote the marks');
my ($restored_claim) = marks('restored') =~ /\bclaim_id_seq=(\d+)/;
is($restored_claim, (split /\|/, $four)[1], 'they carry the dump\'s claim position');
sql('SET redpacket.allow_drop = on; DROP EXTENSION redpacket', 'restored');
sql('CREATE EXTENSION redpacket', 'restored');
life('restored', 'restored');
above('the restored database, after DROP/CREATE EXTENSION', 'restored', $four);

# --- A rebuilt schema: dump, DROP, CREATE, restore the older dump ---------------
# The rows made after the dump were handed out (and published) before the
# drop; the restore sets the sequences back to the dump's positions, and
# rp_post_restore moves them forward past every id handed out.

sql('CREATE DATABASE rebuilt');
sql('CREATE EXTENSION redpacket', 'rebuilt');
life('rebuilt', 'before-dump');
$pub->command_ok(
	[ 'pg_dump', '-Fc', '-n', 'redpacket', '-e', 'redpacket', '-f', "$tmp/rebuilt.dump",
		'-d', $pub->connstr('rebuilt') ],
	'pg_dump of the redpacket schema');
my @dumped = split /\|/, sql($max_q, 'rebuilt');
life('rebuilt', 'after-dump');
my @handed_out = split /\|/, sql($max_q, 'rebuilt');
sql('SET redpacket.allow_drop = on; DROP EXTENSION redpacket', 'rebuilt');
sql('CREATE EXTENSION redpacket', 'rebuilt');
sql('CALL redpacket.rp_pre_restore()', 'rebuilt');
$pub->command_ok(
	[ 'pg_restore', '--data-only', '-d', $pub->connstr('rebuilt'), "$tmp/rebuilt.dump" ],
	'pg_restore --data-only of the older dump');
sql('CALL redpacket.rp_post_restore()', 'rebuilt');
is( join('|', (split /\|/, sql($max_q, 'rebuilt'))[ 0 .. 2 ]), join('|', @dumped[ 0 .. 2 ]),
	'the dump\'s activities, claims and entries are back, not those made after it');
life('rebuilt', 'rebuilt');
cmp_ok(sql('SELECT max(claim_id) FROM redpacket.claim', 'rebuilt'), '>', $handed_out[1],
	'new claims are paid after the restore');
is( sql(qq{SELECT (SELECT count(*) FROM redpacket.activity WHERE id > $dumped[0] AND id <= $handed_out[0])
                + (SELECT count(*) FROM redpacket.claim WHERE claim_id > $dumped[1] AND claim_id <= $handed_out[1])
                + (SELECT count(*) FROM redpacket.ledger WHERE entry_id > $dumped[2] AND entry_id <= $handed_out[2])
                + (SELECT count(*) FROM redpacket.reconciliation WHERE pass_id > $dumped[3] AND pass_id <= $handed_out[3])},
		'rebuilt'),
	'0', 'no id handed out between the dump and the drop is handed out again');

ok(!$pub->log_contains(qr/PANIC|terminated by signal/, 0), 'no crash on the publisher');
$sub->stop;
$pub->stop;
done_testing();
