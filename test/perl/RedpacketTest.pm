# Helpers shared by redpacket's TAP tests (test/t/*.pl).  The Makefile puts
# test/perl on prove's include path.
#
#   RedpacketTest::books_view()   the SQL of test/sql/books.sql: prefix a
#                                 query with it to use the view rp_books
#   RedpacketTest::unbalanced($node[, $db])
#                                 how many activities' books do not balance
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

use File::Basename qw(dirname);
use File::Spec;
use PostgreSQL::Test::Cluster;
use Test::More;

my $books_file = File::Spec->catfile(dirname(__FILE__), '..', 'sql', 'books.sql');

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
