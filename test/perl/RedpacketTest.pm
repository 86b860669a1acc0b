# Helpers shared by redpacket's TAP tests (test/t/*.pl).  The Makefile puts
# test/perl on prove's include path.
#
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
package RedpacketTest;

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Spec;

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

1;
