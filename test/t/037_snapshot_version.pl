# A REPEATABLE READ transaction is refused (40001) by the extension's
# functions when its snapshot sees another version installed than the
# catalog does: it would not see the rows that came with the new version.
# Nothing else refuses it: not an update the transaction itself made, nor
# one it rolled back to a savepoint or prepared (which sends no
# invalidation, so the library must forget the version itself), nor a
# change of the extension's row that keeps its version (an owner changed,
# as REASSIGN OWNED does).
# The worker and autovacuum are off, so that no invalidation from elsewhere
# makes the library read the catalog again on its own.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('snapshot_version', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
autovacuum = off
max_prepared_transactions = 2
});
sql("CREATE EXTENSION redpacket VERSION '1.6'");
# an activity with a pending claim, so that the listing reads the catalog
sql("SELECT redpacket.rp_claim(redpacket.rp_create_activity(10.00, stripes => 2), 'u', 1.00)");

my $pending = 'SELECT count(*) FROM redpacket.rp_pending_credits()';

my $s = RedpacketTest::rr_session($node, 'postgres');
$s->query_safe('SAVEPOINT s');
$s->query_safe('ALTER EXTENSION redpacket UPDATE');
is(RedpacketTest::sql_state($s, $pending), 'ok', 'the transaction that updates is served the new version');
$s->query_safe('ROLLBACK TO s');
is(RedpacketTest::sql_state($s, $pending), 'ok', 'and, the update rolled back to a savepoint, the old one');
$s->query_safe('COMMIT');
is(sql("SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"), '1.6',
	'the update did not happen');

$s->quit;

# A prepared update is no longer the session's: until it commits, the
# session is served the installed version.
$s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe('\set VERBOSITY sqlstate');
$s->query_safe('BEGIN');
$s->query_safe('ALTER EXTENSION redpacket UPDATE');
is(RedpacketTest::sql_state($s, $pending), 'ok', 'the transaction that updates is served');
$s->query_safe(q{PREPARE TRANSACTION 'up'});
$s->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
is(RedpacketTest::sql_state($s, $pending), 'ok', 'after PREPARE TRANSACTION the session is served the installed version');
$s->query_safe('COMMIT');
sql(q{ROLLBACK PREPARED 'up'});
$s->quit;

my $t = RedpacketTest::rr_session($node, 'postgres');
is(RedpacketTest::sql_state($t, $pending), 'ok', 'a snapshot of the installed version is served');
sql(q{UPDATE pg_catalog.pg_extension SET extowner = extowner WHERE extname = 'redpacket'});
# a change of redpacket.activity's row: an invalidation that makes the
# library read the version again
sql('CREATE ROLE probe; GRANT SELECT ON redpacket.activity TO probe');
$t->query_safe('SELECT count(*) FROM redpacket.activity');    # takes the invalidation in
is(RedpacketTest::sql_state($t, $pending), 'ok', 'also after a change of the row that keeps the version');
$t->query_safe('COMMIT');
$t->quit;

my $old = RedpacketTest::rr_session($node, 'postgres');
sql('ALTER EXTENSION redpacket UPDATE');
is(RedpacketTest::sql_state($old, $pending), '40001', 'a snapshot from before an update is refused');
is(RedpacketTest::sql_state($old, 'ROLLBACK'), 'ok', 'and its retry');
$old->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
is(RedpacketTest::sql_state($old, $pending), 'ok', 'sees the new version and is served');
$old->query_safe('COMMIT');
$old->quit;

$node->stop;
done_testing();
