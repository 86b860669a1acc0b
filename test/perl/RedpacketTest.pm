# Helpers shared by redpacket's TAP tests (test/t/*.pl).  The Makefile puts
# test/perl on prove's include path.
#
# A node and its queries:
#   RedpacketTest::node($name[, $conf])
#                                 a new PostgreSQL::Test::Cluster, initialised,
#                                 with the lines $conf (if given) appended to
#                                 its postgresql.conf, and started; sql()
#                                 queries it from then on
#   RedpacketTest::use_node($node)
#                                 make sql() query $node (one set up by hand)
#   sql($query[, $db])            $node->safe_psql($db, $query) on that node,
#                                 database postgres by default; imported with
#                                 use RedpacketTest qw(sql);
#   RedpacketTest::rr_session($node, $db)
#                                 a background psql session of $db (errors
#                                 do not stop it, SQLSTATEs for messages) in
#                                 a REPEATABLE READ transaction that has
#                                 taken its snapshot
#   RedpacketTest::sql_state($session, $query)
#                                 run $query in the session: the SQLSTATE it
#                                 failed with, or 'ok'
#   RedpacketTest::repo_file($path)
#                                 the text of a file of this repository, $path
#                                 relative to its root (e.g. README.md)
#
# The books and the publication:
#   RedpacketTest::books_view()   the SQL of test/sql/books.sql: prefix a
#                                 query with it to use the view rp_books
#   RedpacketTest::unbalanced($node[, $db])
#                                 how many activities' books do not balance
#   RedpacketTest::subscribe_events($pub, $sub, $name[, $db])
#                                 make $sub a logical subscriber of $pub's
#                                 publication redpacket_events (database $db,
#                                 default postgres): plain tables with the
#                                 publisher's columns and primary keys, and a
#                                 subscription $name, synchronized
#
# Sessions and locks (background_psql sessions of one node):
#   RedpacketTest::claim_on($s, $act, $user, $amount, $stripe)
#                                 in session $s, inside an open transaction,
#                                 claim $amount for $user until the claim
#                                 lands on stripe $stripe (rolling back the
#                                 others); false if it never did
#   RedpacketTest::on_both_paths($node, $code)
#                                 $code->($path) with redpacket.direct_claims
#                                 set to 'on', then 'off' (ALTER SYSTEM, reload)
#   RedpacketTest::waits_for_lock($node, $pattern)
#                                 poll until a backend whose query is LIKE
#                                 $pattern waits for a lock; the time it
#                                 was seen (Time::HiRes), undef if it never
#                                 was
#
# A Citus cluster on loopback (test/t/2xx_citus*.pl), for the PostgreSQL
# under test with Citus installed (test/citus/build.sh); the test is skipped
# without it:
#   citus_nodes()                 (coordinator, worker1, worker2): started with
#                                 citus and redpacket preloaded and created
#   citus_join($coord, @workers)  the coordinator's host set, the workers added
#   citus_distribute($coord)      rp_distribute(), then wait for the workers'
#                                 metadata (calls are delegated only then)
#   citus_cluster()               the three steps: (coordinator, workers...)
#   citus_holder($coord, $aid)    the port of the worker holding an activity
#   citus_placed($coord, \@workers, $create)
#                                 activities made by the SQL expression
#                                 $create until each worker holds one: their
#                                 ids in the order of @workers
package RedpacketTest;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

our @EXPORT_OK = qw(sql);

my $root = File::Spec->rel2abs(File::Spec->catdir(dirname(__FILE__), '..', '..'));
my $books_file = File::Spec->catfile($root, 'test', 'sql', 'books.sql');

my $default_node;

sub node
{
	my ($name, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', $conf) if defined $conf;
	$node->start;
	return use_node($node);
}

sub use_node
{
	($default_node) = @_;
	return $default_node;
}

sub sql
{
	my ($query, $db) = @_;
	die 'RedpacketTest::sql: no node (RedpacketTest::node or use_node first)'
	  unless $default_node;
	return $default_node->safe_psql($db // 'postgres', $query);
}

sub rr_session
{
	my ($node, $db) = @_;
	my $s = $node->background_psql($db, on_error_stop => 0);
	$s->query_safe('\set VERBOSITY sqlstate');
	$s->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	$s->query_safe('SELECT 1');
	return $s;
}

sub sql_state
{
	my ($s, $query) = @_;
	$s->{stderr} = '';
	$s->query($query);
	my $state = $s->{stderr} =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : 'ok';
	$s->{stderr} = '';
	return $state;
}

sub repo_file
{
	my ($path) = @_;
	return slurp_file(File::Spec->catfile($root, $path));
}

sub books_view
{
	open(my $fh, '<', $books_file) or die "could not open $books_file: $!";
	local $/;
	my $sql = <$fh>;
	close $fh;
	return $sql . "\n";
}

sub unbalanced
{
	my ($node, $db) = @_;
	return $node->safe_psql($db // 'postgres',
		books_view() . 'SELECT count(*) FILTER (WHERE NOT balanced) FROM rp_books');
}

sub claim_on
{
	my ($s, $act, $user, $amount, $want) = @_;
	for my $try (1 .. 40)
	{
		$s->query_safe('BEGIN');
		my $cid = $s->query_safe(
			"SELECT claim_id FROM redpacket.rp_claim($act, '$user', $amount)");
		my $stripe = $s->query_safe(
			"SELECT stripe FROM redpacket.claim WHERE activity_id = $act AND claim_id = $cid");
		return 1 if $stripe eq $want;
		$s->query_safe('ROLLBACK');
	}
	return 0;
}

sub on_both_paths
{
	my ($node, $code) = @_;
	for my $path ('on', 'off')
	{
		$node->safe_psql('postgres', "ALTER SYSTEM SET redpacket.direct_claims = $path");
		$node->reload;
		$code->($path);
	}
	return;
}

# T (a background session in a transaction) commits; the close that session
# C started on the activity, waiting for T, then completes without an error.
sub close_after_commit
{
	my ($node, $t, $c, $act, $label) = @_;
	$t->query('COMMIT');
	$t->quit;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $act"),
		"$label: the close completes once T commits");
	$c->query('SELECT 1');
	unlike($c->{stderr}, qr/ERROR/, "$label: the close ended without an error");
	$c->quit;
	return;
}

sub waits_for_lock
{
	my ($node, $pattern) = @_;
	for (1 .. 500)
	{
		return Time::HiRes::time() if $node->safe_psql('postgres', qq{
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
 WHERE NOT l.granted AND s.query LIKE '$pattern'}) > 0;
		Time::HiRes::sleep(0.01);
	}
	return undef;
}

# The published tables as the publisher has them (columns in order, primary
# key), to be created on a subscriber, which needs no extension.
my $mirror_q = q{
SELECT string_agg(format('CREATE TABLE %I.%I (%s, PRIMARY KEY (%s));', t.schemaname, t.tablename,
         (SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', '
                            ORDER BY a.attnum)
            FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
         (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord)
            FROM pg_index i, unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord), pg_attribute a
           WHERE i.indrelid = c.oid AND i.indisprimary
             AND a.attrelid = c.oid AND a.attnum = k.attnum)),
       E'\n' ORDER BY t.tablename)
  FROM pg_publication_tables t
  JOIN pg_class c ON c.oid = format('%I.%I', t.schemaname, t.tablename)::regclass
 WHERE t.pubname = 'redpacket_events'};

sub subscribe_events
{
	my ($pub, $sub, $name, $db) = @_;
	$db //= 'postgres';
	my $tables = $pub->safe_psql($db, $mirror_q);
	$sub->safe_psql('postgres', "CREATE SCHEMA IF NOT EXISTS redpacket;\n$tables");
	my $connstr = $pub->connstr . " dbname=$db";
	$sub->safe_psql('postgres',
		"CREATE SUBSCRIPTION $name CONNECTION '$connstr' PUBLICATION redpacket_events");
	$sub->wait_for_subscription_sync($pub, $name);
	return;
}

sub citus_nodes
{
	my $coord = PostgreSQL::Test::Cluster->new('coord');
	my $libdir = $coord->config_data('--pkglibdir');
	plan skip_all => "Citus is not installed in $libdir (run test/citus/build.sh)"
	  unless -f "$libdir/citus.so";
	my @nodes = ($coord, map { PostgreSQL::Test::Cluster->new("worker$_") } (1, 2));
	for my $n (@nodes)
	{
		$n->init;
		$n->append_conf(
			'postgresql.conf', q{
shared_preload_libraries = 'citus,redpacket'
listen_addresses = '127.0.0.1'
redpacket.reconcile_interval = 1
max_connections = 60
citus.node_conninfo = 'sslmode=disable'
});
		$n->start;
		$n->safe_psql('postgres', 'CREATE EXTENSION citus; CREATE EXTENSION redpacket;');
	}
	return @nodes;
}

sub citus_join
{
	my ($coord, @workers) = @_;
	$coord->safe_psql('postgres',
		"SELECT citus_set_coordinator_host('127.0.0.1', " . $coord->port . ")");
	$coord->safe_psql('postgres', "SELECT citus_add_node('127.0.0.1', " . $_->port . ")")
	  for @workers;
	return;
}

sub citus_distribute
{
	my ($coord) = @_;
	$coord->safe_psql('postgres', 'SELECT redpacket.rp_distribute()');
	return $coord->poll_query_until('postgres',
		'SELECT bool_and(metadatasynced) FROM pg_dist_node WHERE groupid <> 0');
}

sub citus_cluster
{
	my @nodes = citus_nodes();
	citus_join(@nodes);
	die 'worker metadata not synced after rp_distribute' unless citus_distribute($nodes[0]);
	return @nodes;
}

sub citus_holder
{
	my ($coord, $aid) = @_;
	return $coord->safe_psql('postgres',
		    'SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)'
		  . " WHERE p.shardid = get_shard_id_for_distribution_column('redpacket.activity', $aid)");
}

sub citus_placed
{
	my ($coord, $workers, $create) = @_;
	my %got;
	my $missing = sub { grep { !exists $got{ $_->port } } @$workers };
	for (1 .. 40)
	{
		my $aid = $coord->safe_psql('postgres', "SELECT $create");
		$got{ citus_holder($coord, $aid) } //= $aid;
		last unless $missing->();
	}
	die 'could not place activities on every worker' if $missing->();
	return map { $got{ $_->port } } @$workers;
}

1;
