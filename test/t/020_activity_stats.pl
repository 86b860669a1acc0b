# The per-activity counters (redpacket.activity_stats) against known outcome
# counts: N users race for P packets under pgbench (claimed = P, exhausted =
# N - P), a second round of the same users adds P duplicates and N - P more
# exhausted; frozen, not_started, ended and user_limit answers each land in
# their column; errors and retryable failures (timeouts) land apart.
# redpacket.track_stats = off counts nothing;
# rp_stats_reset() forgets one activity or all; a full table
# (redpacket.stats_max_activities) never fills: the least recently active
# activities, and settled ones on their own, are folded into the row of
# their database, and the rows add up to every answer; a restart loses
# everything.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node(
	'stats', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
redpacket.stats_max_activities = 100
max_locks_per_transaction = 256
});

my $cols = 'claimed, duplicate, exhausted, frozen, ended, not_started, user_limit';
sub stats
{
	my ($aid) = @_;
	return sql("SELECT $cols FROM redpacket.activity_stats WHERE activity_id = $aid");
}

sql('CREATE EXTENSION redpacket');

# --- N users race for P packets, twice --------------------------------------

my ($clients, $per_client, $packets) = (4, 50, 60);
my $users = $clients * $per_client;    # N = 200
my $aid = sql("SELECT redpacket.rp_create_activity(600.00, $packets, stripes => 4)");
is(stats($aid), '', 'no row before the first claim');

# each client claims for its own users c-1 .. c-50, once each per round
my $script = qq{
\\set n :n + 1
SELECT status FROM redpacket.rp_claim($aid, :client_id || '-' || :n);
};
for my $round (1, 2)
{
	$node->pgbench(
		"--no-vacuum --client=$clients --jobs=2 --transactions=$per_client --define=n=0",
		0,
		[qr{processed: $users/$users}],
		[qr{^$}],
		"round $round: $users users claim $packets packets",
		{ "020_round$round" => $script });
}
is(sql("SELECT count(*) FROM redpacket.claim WHERE activity_id = $aid"),
	$packets, "the books: $packets claims recorded");
is( stats($aid),
	join('|', $packets, $packets, 2 * ($users - $packets), 0, 0, 0, 0),
	"counters: claimed = P, duplicate = P (second round), exhausted = 2 (N - P)");

# --- one answer of every other kind ----------------------------------------

my $frozen = sql("SELECT redpacket.rp_create_activity(10.00)");
sql("SELECT redpacket.rp_freeze($frozen, 'test')");
my $later = sql("SELECT redpacket.rp_create_activity(10.00, starts_at => now() + interval '1 day')");
my $closed = sql("SELECT redpacket.rp_create_activity(10.00)");
sql("SELECT redpacket.rp_close_activity($closed)");
my $rain = sql("SELECT redpacket.rp_create_activity(10.00, per_user_limit => 2)");
for my $r (1 .. 3)
{
	sql("SELECT redpacket.rp_claim($rain, 'rainer', 0.10, 'r$r')");
}
for my $a ($frozen, $later, $closed)
{
	sql("SELECT redpacket.rp_claim($a, 'someone', 1.00)");
	sql("SELECT redpacket.rp_claim($a, 'someone-else', 1.00)");
}
is(stats($frozen),  '0|0|0|2|0|0|0', 'frozen answers counted');
is(stats($later),   '0|0|0|0|0|2|0', 'not_started answers counted');
is(stats($closed),  '0|0|0|0|2|0|0', 'ended answers counted');
is(stats($rain),    '2|0|0|0|0|0|1', 'claimed and user_limit answers counted');

# --- errors and retryable failures are counted apart ------------------------
# A claim that times out behind an open transaction (57014, 55P03) is one its
# caller retries, not a fault to page on; bad input is an error.

my $contended = sql("SELECT redpacket.rp_create_activity(10.00, 10, stripes => 1)");
# A backend counts an error under its activity once it has counted an
# answer (before that, as untracked): each failing call below comes after one.
my $warm = sql("SELECT redpacket.rp_create_activity(10.00)");
sub fails
{
	my ($setting, $call) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SELECT redpacket.rp_claim($warm, 'w', 1.00); $setting; SELECT $call");
	return $err;
}
my $holder = $node->background_psql('postgres');
$holder->query_safe("BEGIN; SELECT redpacket.rp_claim($contended, 'held', 1.00)");
like(fails("SET statement_timeout = '300ms'", "redpacket.rp_claim($contended, 'held', 1.00)"),
	qr/canceling statement due to statement timeout/, 'a claim behind the open one times out');
like(fails("SET lock_timeout = '300ms'", "redpacket.rp_claim($contended, 'held', 1.00)"),
	qr/lock timeout/, 'another gives up on its lock_timeout');
$holder->query_safe('COMMIT');
$holder->quit;
like(fails('SELECT 1', "redpacket.rp_claim($contended, 'u', 0.001)"),
	qr/more than 2 fractional digits/, 'a claim with a bad amount raises an error');
like(fails('SELECT 1', "redpacket.rp_claim_batch($contended, ARRAY['b1', ''], ARRAY[1.00, 1.00])"),
	qr/ERROR/, 'a batch with an empty user id raises an error');
is(sql("SELECT claimed, errors, retryable FROM redpacket.activity_stats WHERE activity_id = $contended"),
	'1|2|2', 'two errors, and the two timeouts counted as retryable');

# --- counting off --------------------------------------------------------------

my $off = sql("SELECT redpacket.rp_create_activity(10.00)");
$node->safe_psql('postgres',
	"SET redpacket.track_stats = off; SELECT redpacket.rp_claim($off, 'quiet', 1.00)");
is(stats($off), '', 'redpacket.track_stats = off: nothing counted');

# --- reset ---------------------------------------------------------------------

is(sql("SELECT redpacket.rp_stats_reset($frozen)"), '1', 'reset of one activity');
is(stats($frozen), '', 'its row is gone');
is(stats($later), '0|0|0|0|0|2|0', 'the others are kept');

# --- the table never fills: rows leave it for the folded row -------------------

# 103 activities with a claim each in a table of 100: the three least
# recently active are folded into the database's folded row, nothing goes
# untracked, and the rows still add up to every answer.
sql('SELECT redpacket.rp_stats_reset()');
my $fill_from = sql('SELECT coalesce(max(id), 0) + 1 FROM redpacket.activity');
sql(q{
SELECT redpacket.rp_claim(redpacket.rp_create_activity(1.00), 'filler', 0.01)
  FROM generate_series(1, 103)});
is(sql("SELECT count(*) FROM redpacket.activity_stats WHERE scope = 'activity'"),
	'100', 'the table holds redpacket.stats_max_activities activity rows');
is( sql(q{SELECT activity_id IS NULL, claimed FROM redpacket.activity_stats WHERE scope = 'folded'}),
	't|3', 'the three least recently active are folded into the row of the database');
is( sql(q{SELECT min(activity_id) FROM redpacket.activity_stats WHERE scope = 'activity'}),
	$fill_from + 3, 'the oldest ones left');
is(sql('SELECT sum(claimed) FROM redpacket.activity_stats'), '103', 'the rows add up to every answer');
is(sql("SELECT count(*) FROM redpacket.activity_stats WHERE scope = 'untracked'"),
	'0', 'nothing is untracked');

# A settled activity's counters leave on their own: the pass that sees it
# settled folds them.  A later answer (ended) starts a row of its own.
my $settle = sql("SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2)");
sql("SELECT redpacket.rp_claim($settle, 'u' || g, 1.00) FROM generate_series(1, 2) g");
is(stats($settle), '2|0|0|0|0|0|0', 'an activity with two claims has its row');
sql("SELECT redpacket.rp_close_activity($settle)");
sql("SELECT count(*) FROM redpacket.rp_reconcile($settle)");
is(stats($settle), '', 'settled and checked: its row left shared memory');
is(sql(q{SELECT claimed FROM redpacket.activity_stats WHERE scope = 'folded'}),
	'6', 'its claims are in the folded row (with one more that made room for it)');
is(sql('SELECT sum(claimed) FROM redpacket.activity_stats'), '105', 'the rows still add up');
sql("SELECT redpacket.rp_claim($settle, 'late', 1.00)");
is(stats($settle), '0|0|0|0|1|0|0', 'a late answer starts a row of its own');
is( sql(qq{SELECT counting_since > (SELECT created_at FROM redpacket.activity WHERE id = $settle)
             FROM redpacket.activity_stats WHERE activity_id = $settle}),
	't', 'which says since when it counts');
is(sql('SELECT redpacket.rp_stats_reset()'), '100', 'reset all');
is(sql('SELECT count(*) FROM redpacket.activity_stats'), '0', 'empty after reset all');

# --- DROP and CREATE EXTENSION start with no counters ------------------------

# one session throughout: its cached key must follow the new extension
$node->safe_psql('postgres', 'CREATE DATABASE cyc');
is( $node->safe_psql(
		'cyc', q{
CREATE EXTENSION redpacket;
SELECT count(redpacket.rp_claim(redpacket.rp_create_activity(100.00, 10, stripes => 1), 'u' || g, 1.00))
  FROM generate_series(1, 5) g;
SET redpacket.allow_drop = on;
DROP EXTENSION redpacket;
CREATE EXTENSION redpacket;
SELECT redpacket.rp_create_activity(100.00, 10, stripes => 1) AS a \gset
SELECT :a > 5;
SELECT count(*) FROM redpacket.activity_stats WHERE activity_id IS NOT NULL;
SELECT (redpacket.rp_claim(:a, 'new', 1.00)).status;
SELECT activity_id = :a, claimed FROM redpacket.activity_stats;
}),
	"5\nt\n0\nclaimed\nt|1",
	'a re-created extension starts with no counters (its first activity, id 6 and up, shows only its own claim)');
is( $node->safe_psql('cyc',
		'SELECT activity_id = (SELECT max(id) FROM redpacket.activity), claimed FROM redpacket.activity_stats'),
	't|1', 'another session sees the same');

# --- the counters of a dropped database can be freed --------------------------

sql('SELECT redpacket.rp_stats_reset()');
$node->safe_psql('postgres', 'CREATE DATABASE gone');
$node->safe_psql('gone', q{
CREATE EXTENSION redpacket;
SELECT count(redpacket.rp_claim(redpacket.rp_create_activity(1.00, stripes => 1), 'u', 0.01))
  FROM generate_series(1, 100)});
$node->safe_psql('postgres', 'DROP DATABASE gone');
$node->safe_psql('postgres', 'DROP DATABASE cyc');
sql('SELECT redpacket.rp_stats_reset()');
my $fresh = sql("SELECT redpacket.rp_create_activity(1.00, stripes => 1)");
sql("SELECT redpacket.rp_claim($fresh, 'u', 0.01)");
is(sql("SELECT claimed FROM redpacket.activity_stats WHERE activity_id = $fresh"),
	'1', 'rp_stats_reset() frees the entries of dropped databases: a new activity gets a row');

# --- lost on restart ------------------------------------------------------------

sql("SELECT redpacket.rp_claim($aid, 'after-reset')");
is(stats($aid), '0|0|1|0|0|0|0', 'counting again after a reset');
$node->restart;
is(sql('SELECT count(*) FROM redpacket.activity_stats'), '0', 'a restart loses the counters');

$node->stop('fast');
done_testing();
