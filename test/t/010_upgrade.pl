# The upgrade path from every released version before the current one (1.0
# to 1.6 today) to the current one.  A database created with
# CREATE EXTENSION redpacket VERSION '1.0' is served by the current library
# before it is updated: fixed, lucky, rain and batch claims, a close, the
# worker's passes and rp_reconcile all work on the old catalog.  After
# ALTER EXTENSION redpacket UPDATE the books still balance (claims + stripes +
# returned = funded for every activity), every idempotency key holds one
# claim, a full reconciliation is ok, old claims still answer 'duplicate' and
# new claims get fresh ids, and rp_regrant gives an application and an
# operator role granted under the old version (rp_grant_app,
# rp_grant_operator) what the new version grants their kind.  Finally each
# upgraded database and a fresh install
# install in another database give the same pg_dump --schema-only output,
# both plain and --binary-upgrade (the form that spells out every member
# object, its comment, its privileges and its membership; only the OIDs that
# binary-upgrade pins legitimately differ and are masked).  A session
# connected since before the update, and a transaction that claims, updates
# and claims again, are served as the new catalog (a lucky draw pays an amount
# an earlier draw dealt, which only the new catalog does).  Last, a 1.3
# database with application and operator roles: the functions 1.4 replaces
# (new arguments) come back with rp_regrant, a 1.3 activity takes top-ups,
# withdrawals and a new window and its books balance, and role_grant is the
# same after every update as in a fresh install.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node(
	'upgrade', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});
$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(up10 up11 up12 up13 up14 up15 up16);
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
# An application and an operator role, granted in every database by the
# helpers of the version installed there (the dumps compare their grants).
$node->safe_psql('postgres', 'CREATE ROLE up_app; CREATE ROLE up_ops');
my $grant_q = "SELECT redpacket.rp_grant_app('up_app'), redpacket.rp_grant_operator('up_ops')";

our $db;    # the database of the upgrade path under test
my $new = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'redpacket'");

# Per activity: funded = claims + stripes + returned, and the packet count.
my $books_q = q{
SELECT count(*) AS activities,
       count(*) FILTER (WHERE funded <> claimed + held + returned) AS unbalanced,
       count(*) FILTER (WHERE packets IS NOT NULL AND packets <> claims + held_packets) AS bad_packets
  FROM (SELECT a.id, a.packets,
               (SELECT sum(amount) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'fund') AS funded,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'return') AS returned,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = a.id) AS claimed,
               (SELECT count(*) FROM redpacket.claim c WHERE c.activity_id = a.id) AS claims,
               (SELECT sum(balance) / 10::numeric ^ a.scale FROM redpacket.stripe s WHERE s.activity_id = a.id) AS held,
               (SELECT sum(packets) FROM redpacket.stripe s WHERE s.activity_id = a.id) AS held_packets
          FROM redpacket.activity a) b};
# A full check of all five activities by rp_reconcile, all ok.  The worker
# passes every second and a call made while it runs returns no row, so the
# call is repeated until it gets its turn.
sub full_check_ok
{
	return $node->poll_query_until($db,
		'SELECT count(*) = 5 AND bool_and(ok) FROM redpacket.rp_reconcile(NULL, true)');
}
my $publication_q = q{
SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = 'redpacket_events'};
my $one_per_key_q = q{
SELECT count(*) = count(DISTINCT (activity_id, user_id, idempotency_key)) FROM redpacket.claim};

# A lucky draw in the given session on a new activity whose first lucky
# draw (another session's) dealt its other amounts to the stripes: the draw
# must pay one of them (a library that took the catalog for an older one
# draws a fresh amount instead, and deals nothing).
sub dealt_draw
{
	my ($session) = @_;
	my $l = sql("SELECT redpacket.rp_create_activity(200.00, 20, stripes => 4)", $db);
	sql("SELECT redpacket.rp_claim($l, 'first', NULL)", $db);
	my $dealt = sql(
		"SELECT string_agg(d::text, ',') FROM redpacket.stripe s, unnest(s.dealt) d WHERE s.activity_id = $l", $db);
	my $got = $session->query_safe(
		"SELECT (amount * 100)::bigint FROM redpacket.rp_claim($l, 'drawn', NULL)");
	return (grep { $_ eq $got } split /,/, ($dealt // '')) ? 't' : "drew $got, dealt $dealt";
}

# One transaction claims on the old catalog, updates the extension and
# claims again: its lucky draws see the new catalog (the first deals, the
# second pays a dealt amount).
sub update_inside_claims
{
	my ($from) = @_;
	my $d = 'tx' . ($from =~ s/\.//r);
	$node->safe_psql('postgres', "CREATE DATABASE $d");
	local $db = $d;
	sql("CREATE EXTENSION redpacket VERSION '$from'", $db);
	my $f = sql("SELECT redpacket.rp_create_activity(10.00)", $db);
	my $s = $node->background_psql($d);
	$s->query_safe('BEGIN');
	$s->query_safe("SELECT redpacket.rp_claim($f, 'before', 0.01)");
	$s->query_safe('ALTER EXTENSION redpacket UPDATE');
	my $l = $s->query_safe("SELECT redpacket.rp_create_activity(200.00, 20, stripes => 4)");
	$s->query_safe("SELECT redpacket.rp_claim($l, 'first', NULL)");
	my $dealt = $s->query_safe(
		"SELECT string_agg(d::text, ',') FROM redpacket.stripe s, unnest(s.dealt) d WHERE s.activity_id = $l");
	my $got = $s->query_safe(
		"SELECT (amount * 100)::bigint FROM redpacket.rp_claim($l, 'drawn', NULL)");
	$s->query_safe('COMMIT');
	$s->quit;
	ok((grep { $_ eq $got } split /,/, ($dealt // '')),
		"$from: claims, ALTER EXTENSION UPDATE and lucky draws in one transaction: the second draw pays a dealt amount");
}

sub upgrade_path
{
	my ($from) = @_;
	# --- The old version, served by the current library ------------------------

	sql("CREATE EXTENSION redpacket VERSION '$from'", $db);
	is(sql("SELECT extversion FROM pg_extension WHERE extname = 'redpacket'", $db),
		$from, "installed version $from");
	sql($grant_q, $db);

	my %act;
	$act{fixed} = sql("SELECT redpacket.rp_create_activity(100.00, stripes => 4, name => 'fixed')", $db);
	$act{lucky} = sql("SELECT redpacket.rp_create_activity(50.00, 20, stripes => 4, name => 'lucky')", $db);
	$act{rain} = sql(
		"SELECT redpacket.rp_create_activity(30.00, 100, stripes => 2, per_user_limit => 3, name => 'rain')", $db);
	$act{batch} = sql("SELECT redpacket.rp_create_activity(40.00, stripes => 4, name => 'batch')", $db);
	$act{closed} = sql("SELECT redpacket.rp_create_activity(20.00, stripes => 3, name => 'closed')", $db);

	is( sql(
			"SELECT string_agg(status::text, ',') FROM (SELECT (redpacket.rp_claim($act{fixed}, 'u' || g, 1.25)).status FROM generate_series(1, 5) g) s",
			$db),
		'claimed,claimed,claimed,claimed,claimed',
		"$from catalog: fixed claims");
	is( sql(
			"SELECT count(*) FILTER (WHERE (r).status = 'claimed') FROM (SELECT redpacket.rp_claim($act{lucky}, 'u' || g) AS r FROM generate_series(1, 8) g) s",
			$db),
		'8', "$from catalog: lucky draws");
	is( sql(
			"SELECT string_agg(status::text, ',' ORDER BY g) FROM generate_series(1, 4) g, LATERAL redpacket.rp_claim($act{rain}, 'bob', 0.50, 'drop-' || g)",
			$db),
		'claimed,claimed,claimed,user_limit',
		"$from catalog: rain with per-user limit");
	is( sql(
			"SELECT string_agg(status::text, ',' ORDER BY ord) FROM redpacket.rp_claim_batch($act{batch}, ARRAY['a','b','c','a'], ARRAY[2.00, 3.00, 4.00, 2.00])",
			$db),
		'claimed,claimed,claimed,duplicate',
		"$from catalog: batch claims");
	sql("SELECT redpacket.rp_claim($act{closed}, 'early', 5.00)", $db);
	is(sql("SELECT redpacket.rp_close_activity($act{closed})", $db),
		'15.00', "$from catalog: close returns the remainder");
	is(sql("SELECT status FROM redpacket.rp_claim($act{closed}, 'late', 1.00)", $db),
		'ended', "$from catalog: claims after the close are ended");
	ok(full_check_ok(), "$from catalog: rp_reconcile checks every activity, all ok");

	# The worker serves the old catalog too: a claim made now is counted by a pass.
	my $cid = sql("SELECT claim_id FROM redpacket.rp_claim($act{fixed}, 'worker-probe', 0.01)", $db);
	ok( $node->poll_query_until(
			$db,
			"SELECT last_claim_id >= $cid FROM redpacket.reconcile_state WHERE activity_id = $act{fixed}"),
		"$from catalog: the worker passes");
	# A session that claimed on the old catalog stays connected through the
	# update: the library must see the new catalog in it (at the end).
	my $old_session = $node->background_psql($db);
	$old_session->query_safe("SELECT redpacket.rp_claim($act{fixed}, 'long-lived', 0.01)");
	is(sql($books_q, $db), '5|0|0', "$from catalog: the books balance");
	my $max_claim_old = sql('SELECT max(claim_id) FROM redpacket.claim', $db);
	my $claims_old = sql('SELECT count(*) FROM redpacket.claim', $db);
	my $old_bob = sql(
		"SELECT claim_id FROM redpacket.claim WHERE activity_id = $act{rain} AND user_id = 'bob' AND request_id = 'drop-1'", $db);

	# --- ALTER EXTENSION UPDATE -------------------------------------------------

	sql('ALTER EXTENSION redpacket UPDATE', $db);
	is(sql("SELECT extversion FROM pg_extension WHERE extname = 'redpacket'", $db),
		$new, "updated to $new (the default version)");
	is(sql('SELECT count(*) FROM redpacket.claim', $db), $claims_old, 'every claim carried over');
	is(sql($books_q, $db), '5|0|0', "$new: the books balance after the update");
	is(sql($one_per_key_q, $db), 't', "$new: one claim per idempotency key");
	is( sql(q{SELECT string_agg(role || ':' || kind, ',') FROM redpacket.rp_regrant()}, $db),
		'up_app:app,up_ops:operator', "$new: rp_regrant finds the roles granted under $from");
	is( sql(q{SELECT has_function_privilege('up_app', 'redpacket.rp_user_claims(bigint, text)', 'EXECUTE'),
	                 has_table_privilege('up_ops', 'redpacket.activity_change', 'SELECT')}, $db),
		't|t', "$new: and gives them what $new grants their kind");
	ok(full_check_ok(), "$new: a full reconciliation of every activity is ok");
	is(sql($publication_q, $db), 'activity_change,claim,claim_settlement,ledger',
		"$new: the publication carries the changes and the settlements too");
	# Claims made before the update are settled like new ones.
	is( sql(
			"SELECT redpacket.rp_credited($act{fixed}, ARRAY(SELECT claim_id FROM redpacket.claim WHERE activity_id = $act{fixed})) = (SELECT count(*) FROM redpacket.claim WHERE activity_id = $act{fixed})",
			$db),
		't', "$new: rp_credited acknowledges the claims of the $from catalog");
	# Before 1.4 nothing tracked settlements: the old wallet paid those
	# claims, so they are not pending until an operator brings them in.
	my $others = sql("SELECT count(*) FROM redpacket.claim WHERE activity_id <> $act{fixed}", $db);
	my $untracked = $from lt '1.4' ? $others : 0;
	is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()', $db),
		$others - $untracked, "$new: the claims of $from are pending only if $from tracked settlements");
	ok(full_check_ok(), "$new: the books are right with the untracked claims");
	is(sql('SELECT redpacket.rp_track_claims()', $db), $untracked,
		"$new: rp_track_claims brings in the claims from before the tracking");
	is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()', $db),
		$others, "$new: rp_pending_credits then lists every other claim of the $from catalog");
	# What was returned before 1.6 was paid back by hand: not owed again;
	# from 1.6 on it is owed until the wallet says it paid it.
	my $tracked_refunds = $from ge '1.6';
	is( sql(q{SELECT count(*) || ',' || count(*) FILTER (WHERE r.reference = 'before refund tracking')
	            FROM redpacket.ledger l JOIN redpacket.refund r USING (activity_id, entry_id)}, $db),
		$tracked_refunds ? '1,0' : '1,1', "$new: the return of $from is recorded, paid back before 1.6");
	is(sql('SELECT count(*) FROM redpacket.rp_pending_refunds()', $db),
		$tracked_refunds ? '1' : '0', "$new: only a return of 1.6 or later is owed to a funder");

	# --- Claims continue ----------------------------------------------------------

	is( sql("SELECT status || ',' || (claim_id > $max_claim_old) FROM redpacket.rp_claim($act{fixed}, 'new1', 2.00)", $db),
		'claimed,true', "$new: fixed claim with a fresh id");
	is(sql("SELECT status FROM redpacket.rp_claim($act{lucky}, 'new1')", $db),
		'claimed', "$new: lucky draw");
	is( sql("SELECT status || ',' || claim_id FROM redpacket.rp_claim($act{rain}, 'bob', 0.50, 'drop-1')", $db),
		"duplicate,$old_bob", "$new: a retry of a $from claim answers duplicate with its id");
	is( sql("SELECT string_agg(status::text, ',' ORDER BY ord) FROM redpacket.rp_claim_batch($act{batch}, ARRAY['a','d'], ARRAY[2.00, 1.00])", $db),
		'duplicate,claimed', "$new: batch");
	is(sql("SELECT redpacket.rp_close_activity($act{batch})", $db), '30.00', "$new: close");
	is( sql("SELECT string_agg(kind || ':' || amount, ',') FROM redpacket.rp_pending_refunds($act{batch})", $db),
		'return:30.00', "$new: the return of a close after the update is owed to the funder");
	my $cid2 = sql("SELECT claim_id FROM redpacket.rp_claim($act{fixed}, 'worker-probe2', 0.01)", $db);
	ok( $node->poll_query_until(
			$db,
			"SELECT last_claim_id >= $cid2 FROM redpacket.reconcile_state WHERE activity_id = $act{fixed}"),
		"$new: the worker passes");
	is(sql($books_q, $db), '5|0|0', "$new: the books balance after more claims");
	ok(full_check_ok(), "$new: full reconciliation ok after more claims");
	is( sql("SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok", $db),
		'0', 'no pass ever failed, before or after the update');
	is(dealt_draw($old_session), 't',
		"$new: a session connected since the $from catalog draws a dealt amount");
	$old_session->quit;
}

# --- Each upgraded schema equals a fresh install ------------------------------

$node->safe_psql('fresh', 'CREATE EXTENSION redpacket');
$node->safe_psql('fresh', $grant_q);
is($node->safe_psql('fresh', "SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	$new, "fresh install is $new");

# Everything binary-upgrade pins by OID differs between two databases: the
# OID-setting calls, and the config relations that
# binary_upgrade_create_empty_extension lists by OID (their names and filter
# conditions are compared below, as a set: the order is the order in which
# the scripts registered them, which pg_dump never uses); the frozen xids of
# the tables and the OIDs binary-upgrade writes them to; the values of the
# sequences registered with pg_extension_config_dump, which even
# --schema-only dumps (data, not schema); and the random key of pg_dump's
# \restrict line.
sub schema_dump
{
	my ($db, @opts) = @_;
	my ($out, $err);
	my $ok = IPC::Run::run(
		[ $node->installed_command('pg_dump'), '--schema-only', @opts,
			'--dbname' => $node->connstr($db) ],
		'>', \$out, '2>', \$err);
	ok($ok, "pg_dump --schema-only @opts of $db") or diag($err);
	$out =~ s/^SELECT pg_catalog\.binary_upgrade_set_next_\w+\(.*\);\n//mg;
	$out =~ s/(binary_upgrade_create_empty_extension\('redpacket', 'redpacket', false, '[\d.]+', )'\{[\d,]*\}'/$1'{OIDS}'/g;
	$out =~ s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = 'X', relminmxid = 'X'/g;
	$out =~ s/^WHERE oid = '\d+';$/WHERE oid = 'X';/mg;
	$out =~ s/^(SELECT pg_catalog\.setval\('[\w.]+'), \d+, (true|false)\);$/$1, N, B);/mg;
	$out =~ s/^\\((?:un)?)restrict \S+$/\\$1restrict KEY/mg;
	return $out;
}

sub compare_dumps
{
	my ($what, $a, $b) = @_;
	if ($a eq $b)
	{
		pass("$what: upgraded and fresh $new are identical");
		return;
	}
	my $tmp = PostgreSQL::Test::Utils::tempdir;
	PostgreSQL::Test::Utils::append_to_file("$tmp/upgraded.sql", $a);
	PostgreSQL::Test::Utils::append_to_file("$tmp/fresh.sql", $b);
	my ($diff) = run_command([ 'diff', '-u', "$tmp/upgraded.sql", "$tmp/fresh.sql" ]);
	fail("$what: upgraded and fresh $new are identical");
	diag($diff);
}

sub same_as_fresh
{
	compare_dumps("$db: pg_dump --schema-only", schema_dump($db), schema_dump('fresh'));
	my $bu_up = schema_dump($db, '--binary-upgrade');
	like($bu_up, qr/ALTER EXTENSION redpacket ADD TABLE redpacket\.claim;/,
		'the --binary-upgrade dump spells out the members');
	compare_dumps("$db: pg_dump --schema-only --binary-upgrade", $bu_up,
		schema_dump('fresh', '--binary-upgrade'));

	my $config_q = q{
	SELECT string_agg(c.relname || ':' || x.cond, ' ' ORDER BY c.relname)
	  FROM pg_extension e,
	       unnest(e.extconfig, e.extcondition) AS x(rel, cond)
	  JOIN pg_class c ON c.oid = x.rel
	 WHERE e.extname = 'redpacket'};
	is(sql($config_q, $db), $node->safe_psql('fresh', $config_q),
		'the same relations are registered with pg_extension_config_dump, with the same conditions');
	is(sql($publication_q, $db), $node->safe_psql('fresh', $publication_q),
		'the publication has the same tables');
}

# every released version before the current one
for my $from (grep { $_ ne $new } ('1.0', '1.1', '1.2', '1.3', '1.4', '1.5', '1.6'))
{
	local $db = 'up' . ($from =~ s/\.//r);
	upgrade_path($from);
	same_as_fresh();
	update_inside_claims($from);
}

# --- When tracking began, seen by the update ------------------------------
# An update from 1.3 run in a transaction that began before another
# session's claim committed: that claim is untracked like the older ones,
# and the full check (which reports an untracked claim made after tracking
# began) is ok, also when the steps run in savepoints (as psql's
# ON_ERROR_ROLLBACK does) or the update goes to 1.6 and then 1.7.  A
# transaction whose snapshot predates the update is refused (40001), and
# no session can reverse an untracked claim.  An extension created in the
# transaction that updates it had no old wallet: its claims are pending
# credits.
my $in_savepoints = q{SAVEPOINT a; ALTER EXTENSION redpacket UPDATE TO '1.6'; RELEASE a;
SAVEPOINT b; ALTER EXTENSION redpacket UPDATE; RELEASE b};

sub update_after_claims
{
	my ($name, $update) = @_;
	local $db = "late$name";
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	sql("CREATE EXTENSION redpacket VERSION '1.3'", $db);
	my $act = sql("SELECT redpacket.rp_create_activity(10.00, stripes => 2)", $db);
	my $old = sql("SELECT claim_id FROM redpacket.rp_claim($act, 'before', 1.00)", $db);
	my ($reader, $tracker) = map { RedpacketTest::rr_session($node, $db) } 1 .. 2;
	my $s = $node->background_psql($db);
	$s->query_safe('BEGIN');
	$s->query_safe('SELECT now()');
	sql("SELECT redpacket.rp_claim($act, 'while', 1.00)", $db);
	$s->query_safe($update);
	$s->query_safe('COMMIT');
	$s->quit;
	is(RedpacketTest::sql_state($reader, 'SELECT count(*) FROM redpacket.rp_pending_credits()'), '40001',
		"$name: a snapshot from before the update is refused (it would list the untracked claims)");
	is(RedpacketTest::sql_state($tracker, 'SELECT redpacket.rp_track_claims()'), '40001',
		"$name: and cannot bring in claims it does not see as untracked");
	$tracker->quit;
	$reader->{stderr} = '';
	$reader->query_safe('ROLLBACK');
	$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	is(RedpacketTest::sql_state($reader, "SELECT redpacket.rp_reverse($act, $old, 'never paid')"), '55000',
		"$name: an untracked claim cannot be reversed");
	$reader->{stderr} = '';
	$reader->query_safe('ROLLBACK');
	$reader->quit;
	is(sql('SELECT count(*) FROM redpacket.rp_pending_credits()', $db),
		'0', "$name: a claim committed while the update transaction ran is untracked");
	is( sql(q{SELECT u.recorded_at >= max(c.claimed_at) FROM redpacket.settlement_start u
	            JOIN redpacket.claim c USING (activity_id) GROUP BY u.recorded_at}, $db),
		't', "$name: the start is dated after every untracked claim");
	ok( $node->poll_query_until($db,
			'SELECT count(*) = 1 AND bool_and(ok) FROM redpacket.rp_reconcile(NULL, true)'),
		"$name: and the full check is ok");
}

sub created_with_update
{
	my ($from, $name, $update) = @_;
	local $db = 'made' . ($from =~ s/\.//r) . $name;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	sql(qq{BEGIN;
CREATE EXTENSION redpacket VERSION '$from';
SELECT redpacket.rp_claim(redpacket.rp_create_activity(10.00, stripes => 2), 'u' || g, 1.00)
  FROM generate_series(1, 2) g;
$update;
COMMIT}, $db);
	is( sql(q{SELECT (SELECT count(*) FROM redpacket.rp_pending_credits()) || ','
	              || (SELECT count(*) FROM redpacket.settlement_start)}, $db),
		'2,0', "$from created and updated in one transaction ($name): its claims are pending credits");
}

update_after_claims('plain', 'ALTER EXTENSION redpacket UPDATE');
update_after_claims('savepoints', $in_savepoints);
for my $from ('1.3', '1.4')
{
	created_with_update($from, 'plain', 'ALTER EXTENSION redpacket UPDATE');
	created_with_update($from, 'savepoints', $in_savepoints);
}


# --- 1.5 -> 1.6 with a sender: rp_regrant gives it the new creation -------
# rp_create_activity gained the split, the funder and the request id and
# rp_activity_info two columns, so the update replaces them; a sender of
# 1.5 is found by what the update kept and gets them back; its 1.5
# activities pay as before (split any) and have no funder.
{
	local $db = 'up15sender';
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	sql("CREATE EXTENSION redpacket VERSION '1.5'", $db);
	sql("CREATE ROLE up15_send; SELECT redpacket.rp_grant_sender('up15_send')", $db);
	my $old = sql("SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2)", $db);
	sql("SELECT redpacket.rp_claim($old, 'before', 1.00)", $db);
	sql('ALTER EXTENSION redpacket UPDATE', $db);
	my $q = q{SELECT has_function_privilege('up15_send', 'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text)', 'EXECUTE')
	          || ',' || has_function_privilege('up15_send', 'redpacket.rp_activity_info(bigint, text)', 'EXECUTE')};
	is(sql($q, $db), 'false,false', 'the replaced functions come without grants');
	is(sql(q{SELECT string_agg(role || ':' || kind, ',') FROM redpacket.rp_regrant()}, $db),
		'up15_send:sender', 'rp_regrant finds the sender of 1.5');
	is(sql($q, $db), 'true,true', 'and gives it the new ones');
	my $new = sql(q{SET ROLE up15_send;
SELECT redpacket.rp_create_activity(3.00, 3, split => 'equal', funder => 'f', request_id => 'q')}, $db);
	is(sql(qq{SELECT split || ',' || coalesce(funder, '-') FROM redpacket.activity WHERE id IN ($old, $new) ORDER BY id}, $db),
		"any,-\nequal,f", 'a 1.5 activity pays as before, a new one as it was created');
	is(sql(qq{SELECT (redpacket.rp_claim($old, 'after')).status || ',' || (redpacket.rp_claim($old, 'named', 1.00)).amount}, $db),
		'claimed,1.00', 'the 1.5 activity still draws without an amount and pays one named');
}

# --- 1.3 -> 1.4 with roles: rp_regrant gives the replaced functions back ---
# rp_create_activity and rp_activity_info gained an argument in 1.4, so the
# update replaces them, without grants (an update script's grant would be an
# initial privilege, which pg_dump leaves out); rp_regrant() gives the roles
# that could call the 1.3 ones the new ones and what 1.4 adds, and an
# activity of 1.3 takes the 1.4 changes (its funding entry has no packets).
{
	local $db = 'up13roles';
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	sql("CREATE EXTENSION redpacket VERSION '1.3'", $db);
	sql('CREATE ROLE up13_app; CREATE ROLE up13_op', $db);
	sql("SELECT redpacket.rp_grant_app('up13_app'), redpacket.rp_grant_operator('up13_op')", $db);
	my $old = sql("SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2, name => 'old')", $db);
	sql("SELECT redpacket.rp_claim($old, 'before', 1.00)", $db);
	sql('ALTER EXTENSION redpacket UPDATE', $db);
	my $replaced_q = q{
SELECT string_agg(has_function_privilege(r, f, 'EXECUTE')::text, ',' ORDER BY r, f)
  FROM (VALUES ('up13_app', 'redpacket.rp_activity_info(bigint, text)'),
               ('up13_op', 'redpacket.rp_activity_info(bigint, text)'),
               ('up13_op', 'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text)'),
               ('up13_app', 'redpacket.rp_create_activity(numeric, integer, timestamptz, timestamptz, integer, text, integer, integer, boolean, text, text, text)'),
               ('public', 'redpacket.rp_activity_info(bigint, text)')) v(r, f)};
	is(sql($replaced_q, $db), 'false,false,false,false,false', 'the replaced functions come without grants');
	is(sql(q{SELECT string_agg(role || ':' || kind, ',') FROM redpacket.rp_regrant()}, $db),
		'up13_app:app,up13_op:operator', 'rp_regrant finds the roles granted under 1.3');
	is(sql($replaced_q, $db), 'false,true,false,true,true',
		'rp_regrant gives them the replaced functions, and PUBLIC none');
	is(sql("SELECT count(*) FROM pg_proc WHERE proname IN ('rp_create_activity', 'rp_activity_info')", $db),
		'2', 'the 1.3 signatures are gone');
	is(sql("SELECT has_function_privilege('up13_op', 'redpacket.rp_top_up(bigint, numeric, integer, text)', 'EXECUTE')", $db),
		't', 'and the new functions of its kind');

	is( sql("SET ROLE up13_app; SELECT state || ',' || total || ',' || packets || ',' || eligible FROM redpacket.rp_activity_info($old, 'after')", $db),
		'active,10.00,5,true', "an application reads a 1.3 activity through the new rp_activity_info");
	is( sql(qq{SET ROLE up13_op;
SELECT redpacket.rp_top_up($old, 2.00, 2) || ',' || redpacket.rp_withdraw($old, 0.50)
       || ',' || redpacket.rp_set_window($old, '2020-01-01', NULL)::text}, $db),
		'12.00,10.50,', 'an operator tops up, withdraws from and moves a 1.3 activity');
	is( sql(qq{SELECT restricted || ',' || total || ',' || packets || ',' || remaining_packets
                 FROM redpacket.activity_status WHERE id = $old}, $db),
		'false,11.50,7,6', 'it is unrestricted, its total and cap count the changes');
	is(sql("SELECT packets IS NULL FROM redpacket.ledger WHERE activity_id = $old AND kind = 'fund'", $db),
		't', 'its funding entry of 1.3 has no packets');
	is( $node->safe_psql($db,
			RedpacketTest::books_view() . "SELECT balanced FROM rp_books WHERE id = $old"),
		't', 'its books balance');
	my $vip = sql(qq{SET ROLE up13_op;
SELECT redpacket.rp_create_activity(5.00, restricted => true, name => 'vip')}, $db);
	is( sql(qq{SET ROLE up13_op; SELECT redpacket.rp_allow($vip, ARRAY['a', 'b'])}, $db),
		'2', 'an operator creates a restricted activity and lists its users');
}

# The rows of role_grant are the extension's definition: the same after
# every update as in a fresh install.
my $grants_q = q{SELECT string_agg(role_kind || ' ' || privilege, E'\n' ORDER BY role_kind, privilege)
                   FROM redpacket.role_grant};
for my $db (qw(up10 up11 up12 up13 up14 up15 up16 up13roles up15sender))
{
	is($node->safe_psql($db, $grants_q), $node->safe_psql('fresh', $grants_q),
		"$db: role_grant as in a fresh install");
}

$node->stop;
done_testing();
