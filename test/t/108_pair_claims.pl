# Transactions that make two claims on one activity finish in bounded time
# under a steady stream of claims that would gather (need every stripe).
#
# Sixteen stripes of 1.00.  Gathering clients claim 100.00, which the whole
# activity cannot pay: they are answered exhausted, again and again.  Pair
# clients each make two claims of 0.60 in one transaction (so the second
# cannot be paid by the stripe the first one holds) and roll back, so the
# activity never runs dry.  pgbench retries a transaction that fails with a
# deadlock (--max-tries=10), as the README advises.  Every transaction must
# complete, no backend may lose a deadlock more than twice in a row, and the
# exhausted answers need no lock at all: a claim the activity's committed
# balances cannot cover is answered from them.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node('pairs', qq{
max_connections = 50
log_line_prefix = '%m [%p] '
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');
my $act = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(16.00, stripes => 16, name => 'pairs')");

my $tmp = PostgreSQL::Test::Utils::tempdir;
sub script
{
	my ($name, $body) = @_;
	open(my $fh, '>', "$tmp/$name") or die;
	print $fh $body;
	close $fh;
	return "$tmp/$name";
}
my $gather = script('gather.pgbench', qq{\\set u random(1, 1000000000)
SELECT status FROM redpacket.rp_claim($act, 'g-' || :u, 100.00);
});
my $pair = script('pair.pgbench', qq{\\set u random(1, 1000000000)
BEGIN;
SELECT status FROM redpacket.rp_claim($act, 'p1-' || :u, 0.60);
SELECT status FROM redpacket.rp_claim($act, 'p2-' || :u, 0.60);
ROLLBACK;
});

my ($out, $err) = ('', '');
IPC::Run::run(
	[   $node->installed_command('pgbench'), '-n', '-c', '24', '-j', '2', '-T', '20',
		'--max-tries=10', '--failures-detailed', '-l', "--log-prefix=$tmp/pb",
		'-f', "$gather\@1", '-f', "$pair\@1", $node->connstr('postgres') ],
	'>', \$out, '2>', \$err);
note($out);
my ($done) = $out =~ /number of transactions actually processed: (\d+)/;
my ($failed) = $out =~ /number of failed transactions: (\d+)/;
$failed //= 0;
cmp_ok($done // 0, '>', 100, 'the load ran');
is($failed, 0, 'every transaction completed (none failed after 10 tries)')
  or diag($err);

# The retries of each transaction (the last field of pgbench's log lines):
# no transaction was a deadlock victim more than twice in a row.
my $worst = 0;
my $retried = 0;
for my $file (glob("$tmp/pb.*"))
{
	for my $line (split /\n/, slurp_file($file))
	{
		my @f = split / /, $line;
		my $retries = $f[-1];
		$worst = $retries if $retries > $worst;
		$retried++ if $retries > 0;
	}
}
my $victims = () = slurp_file($node->logfile) =~ /ERROR:  deadlock detected/g;
note("deadlock victims: $victims; transactions retried: $retried; most retries: $worst");
cmp_ok($worst, '<=', 2, 'no transaction lost a deadlock more than twice in a row');

is( $node->safe_psql('postgres', qq{
	SELECT count(*) FROM redpacket.claim WHERE activity_id = $act}),
	'0', 'the pairs rolled back and the gatherers got nothing');
is($node->safe_psql('postgres', "SELECT bool_and(ok) FROM redpacket.rp_reconcile($act, true)"),
	't', 'the books balance');

$node->stop;
done_testing();
