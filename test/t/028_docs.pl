# What the documentation says about retrying and about the lock table holds.
#
# 1. Every list of retryable SQLSTATEs names the same four: 40001, 40P01,
#    55P03 and 57014.  A list is a fenced code block, a table or a sentence
#    of README.md or doc/*.md that mentions retrying and names at least two
#    of the four, or a RETRYABLE set of an example client under examples/.
#
# 2. The number of single rp_claim calls one transaction makes before the
#    lock table runs out, as README.md and doc/locking.md state it ("about N
#    ... with default settings"), is within 5% of the number measured here:
#    a server with initdb's defaults for the lock table
#    (max_locks_per_transaction = 64, max_connections = 100, and its other
#    backend slots: 3 autovacuum workers, 8 worker processes, 10 WAL
#    senders, no prepared transactions), redpacket preloaded, one activity
#    of 64 stripes with money and packets to spare, and in one transaction
#    one `SELECT status FROM redpacket.rp_claim(activity, 'uN')` statement
#    per distinct user until one fails with 53200 (out of shared memory).
#    The docs give PostgreSQL 15's figure; on another major the measured
#    number is reported, and the docs are compared with the figure measured
#    the same way on 15.20 (Debian 12): 12,777.
#
# REDPACKET_DOCS_ROOT: read README.md, doc/ and examples/ from that directory
# instead of this tree.
use strict;
use warnings;

use File::Basename qw(dirname);
use File::Find;
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $root = $ENV{REDPACKET_DOCS_ROOT}
  // File::Spec->rel2abs(File::Spec->catdir(dirname(__FILE__), '..', '..'));
my $measured_on_15 = 12777;
my @codes = qw(40001 40P01 55P03 57014);

my @docs = ('README.md', map { "doc/$_" } sort grep { /\.md$/ }
	  do { opendir my $d, "$root/doc" or die "$root/doc: $!"; readdir $d });

# The blocks of a Markdown text: [first line, text, kind], kind 'code' (a
# fenced block), 'table' (consecutive table rows) or 'sentence' (of a
# paragraph, list item or heading).
sub blocks
{
	my ($text) = @_;
	my (@out, @cur, $start, $kind);
	my $flush = sub {
		push @out, [ $start, join("\n", @cur), $kind ] if @cur;
		@cur = ();
	};
	my $n = 0;
	for my $l (split /\n/, $text)
	{
		$n++;
		if (defined $kind && $kind eq 'code')
		{
			push @cur, $l;
			if ($l =~ /^\s*```/) { $flush->(); undef $kind; }
			next;
		}
		my $k =
			$l =~ /^\s*```/ ? 'code'
		  : $l =~ /^\s*\|/  ? 'table'
		  : $l =~ /^\s*$/   ? undef
		  :                   'prose';
		if (!defined $k) { $flush->(); undef $kind; next; }
		if (   !defined $kind
			|| $kind ne $k
			|| $k eq 'code'
			|| ($k eq 'prose' && $l =~ /^\s*(?:[-*]|\d+\.|#+)\s/))
		{
			$flush->();
			($kind, $start) = ($k, $n);
		}
		push @cur, $l;
	}
	$flush->();

	my @res;
	for my $b (@out)
	{
		my ($line, $t, $k) = @$b;
		if ($k ne 'prose') { push @res, $b; next; }
		my @parts = split /((?<=[.!?])\s+(?=[A-Z`*(\[]))/, $t;
		while (@parts)
		{
			my $s = shift @parts;
			my $sep = shift @parts // '';
			push @res, [ $line, $s, 'sentence' ];
			$line += ($s =~ tr/\n//) + ($sep =~ tr/\n//);
		}
	}
	return @res;
}

sub missing
{
	my ($text) = @_;
	return grep { $text !~ /\b$_\b/ } @codes;
}

# --- 1. the retryable SQLSTATEs ----------------------------------------------
my $lists = 0;
for my $file (@docs)
{
	for my $b (blocks(slurp_file("$root/$file")))
	{
		my ($line, $text) = @$b;
		next unless $text =~ /retr(?:y|ies|ied|yable)/i;
		next if grep({ $text =~ /\b$_\b/ } @codes) < 2;
		$lists++;
		my @miss = missing($text);
		ok(!@miss, "$file:$line: a list of retryable SQLSTATEs names all four")
		  or diag("missing: @miss\n$text");
	}
}
my @examples;
find(sub { push @examples, $File::Find::name if -f && /\.(?:py|java|js|go|rb)$/ },
	"$root/examples");
for my $path (sort @examples)
{
	my $file = File::Spec->abs2rel($path, $root);
	my $n = 0;
	for my $l (split /\n/, slurp_file($path))
	{
		$n++;
		next unless $l =~ /\bRETRYABLE\s*=/;
		$lists++;
		my @miss = missing($l);
		ok(!@miss, "$file:$n: the example's RETRYABLE names all four")
		  or diag("missing: @miss\n$l");
	}
}
cmp_ok($lists, '>=', 5, "lists of retryable SQLSTATEs found ($lists)");

# --- 2. single claims in one transaction and the lock table ----------------
my $node = RedpacketTest::node(
	'docs', q{
shared_preload_libraries = 'redpacket'
max_locks_per_transaction = 64
max_connections = 100
autovacuum_max_workers = 3
max_worker_processes = 8
wal_level = replica
max_wal_senders = 10
max_prepared_transactions = 0
});
sql('CREATE EXTENSION redpacket');
my $major = sql("SELECT current_setting('server_version_num')::int / 10000");
my $act = sql(
	"SELECT redpacket.rp_create_activity(100000000.00, packets => 1000000, stripes => 64)");

my $script = "\\set VERBOSITY verbose\nBEGIN;\n"
  . join('', map { "SELECT status FROM redpacket.rp_claim($act, 'u$_');\n" } 1 .. 40000)
  . "COMMIT;\n";
# (from a file: psql stops reading at the failure)
my $file = $node->basedir . '/claims.sql';
append_to_file($file, $script);
my ($out, $err) = ('', '');
$node->psql('postgres', '', stdout => \$out, stderr => \$err, on_error_stop => 1,
	extra_params => [ '-f', $file ]);
my @rows = split /\n/, $out;
my $claimed = grep { $_ eq 'claimed' } @rows;
is($claimed, scalar @rows, 'every call before the failure claimed');
cmp_ok($claimed, '>', 1000, 'claims were made');
like($err, qr/ERROR:  53200: out of shared memory/, 'the transaction ran out of lock table (53200)');
note("single claims in one transaction before 53200: $claimed (PostgreSQL $major)");

my $reference = $major == 15 ? $claimed : $measured_on_15;
my $figures = 0;
for my $file (@docs)
{
	for my $b (blocks(slurp_file("$root/$file")))
	{
		my ($line, $text) = @$b;
		next unless $text =~ /lock table/ && $text =~ /one transaction|single claims/;
		unlike($text, qr/\b20,000\b/, "$file:$line: not the old figure of 20,000");
		next unless $text =~ /default settings/;
		while ($text =~ /\babout\s+([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)\b/g)
		{
			(my $doc = $1) =~ tr/,//d;
			$figures++;
			ok(abs($doc - $reference) <= 0.05 * $reference,
				"$file:$line: about $1 single claims (measured: $reference)");
		}
	}
}
is($figures, 2, 'README.md and doc/locking.md each state the figure once');

$node->stop;
done_testing();
