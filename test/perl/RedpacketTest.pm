# Helpers shared by redpacket's TAP tests (test/t/*.pl).  The Makefile puts
# test/perl on prove's include path.
#
#   RedpacketTest::books_view()   the SQL of test/sql/books.sql: prefix a
#                                 query with it to use the view rp_books
#   RedpacketTest::unbalanced($node[, $db])
#                                 how many activities' books do not balance
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

1;
