# The monitoring material runs as written: every query of the
# postgres_exporter file examples/monitoring/redpacket_queries.yaml runs against
# a real preloaded database with activities and counters, as an operator role
# (rp_grant_operator), returns every column its metrics name, and numbers
# where a COUNTER or GAUGE is expected; every statement of the README's
# "Monitoring" section runs too; and that role sees the reconciler's status
# as the superuser does.  A query on a view this branch does not
# have yet (reconciler_status before it is merged) is skipped, saying so.
use strict;
use warnings;

use CPAN::Meta::YAML;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $yaml = CPAN::Meta::YAML->read_string(
	RedpacketTest::repo_file('examples/monitoring/redpacket_queries.yaml'))
  or die CPAN::Meta::YAML->errstr;
my $queries = $yaml->[0];

my $node = RedpacketTest::node(
	'monitoring', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
});

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION redpacket;
CREATE ROLE monitor LOGIN;
SELECT redpacket.rp_grant_operator('monitor');
SELECT redpacket.rp_create_activity(10.00, 3, stripes => 2, name => 'm1');
SELECT redpacket.rp_claim(1, 'u' || g, 1.00) FROM generate_series(1, 5) g;
SELECT redpacket.rp_create_activity(10.00, name => 'idle');
});
$node->poll_query_until('postgres',
	'SELECT count(DISTINCT activity_id) = 2 FROM redpacket.reconciliation')
  or die 'no pass';
sleep 2;    # the idle activity's last check is now older than the last pass

# Does the view a query reads exist here?
sub has_relation
{
	my ($rel) = @_;
	return $node->safe_psql('postgres', "SELECT to_regclass('$rel') IS NOT NULL") eq 't';
}

for my $name (sort keys %$queries)
{
	my $q = $queries->{$name};
	my ($rel) = $q->{query} =~ /FROM\s+(redpacket\.\w+)/;
	SKIP:
	{
		skip "$name: $rel is not in this build", 3 unless has_relation($rel);
		# Cluster::psql prints tuples only: ask for the header back
		my ($ret, $out, $err) = $node->psql(
			'postgres', "\\pset tuples_only off\n" . $q->{query},
			extra_params => [ '-U', 'monitor', '-F', "\t", '-P', 'footer=off' ]);
		is($ret, 0, "$name: the query runs as the operator role") or diag $err;
		my ($head, @rows) = split /\n/, $out;
		my @cols = split /\t/, $head // '';
		my %usage = map { my ($k, $v) = %$_; ($k => $v->{usage}) } @{ $q->{metrics} };
		is_deeply([ sort @cols ], [ sort keys %usage ],
			"$name: the columns are exactly the metrics");
		my @bad;
		for my $row (@rows)
		{
			my @v = split /\t/, $row, -1;
			for my $i (0 .. $#cols)
			{
				next if $usage{ $cols[$i] } eq 'LABEL';
				push @bad, "$cols[$i]=$v[$i]"
				  unless $v[$i] eq '' || $v[$i] =~ /^-?\d+(?:\.\d+)?(?:e[-+]?\d+)?$/;
			}
		}
		ok(@rows > 0 && !@bad,
			"$name: rows with numbers in every metric column (" . scalar(@rows) . ' rows)')
		  or diag "@bad";
	}
}

# The README's Monitoring section, statement by statement.
my $readme = RedpacketTest::repo_file('README.md');
my ($section) = $readme =~ /\n## Monitoring\n(.*?)(?=\n## )/s;
ok($section, 'README has a Monitoring section');
my @sql = ($section // '') =~ /```sql\n(.*?)```/sg;
my @statements = grep { /\S/ } map { s/--[^\n]*//gr } map { split /;\s*\n/ } @sql;
ok(@statements >= 3, 'it has monitoring statements');
for my $st (@statements)
{
	my ($first) = $st =~ /^\s*(.{0,60})/;
	my @rels = $st =~ /(?:FROM|JOIN)\s+(redpacket\.\w+)/g;
	SKIP:
	{
		my @missing = grep { !has_relation($_) && !/\.rp_/ } @rels;
		skip "README statement reads @missing, not in this build", 2 if @missing;
		my ($ret, $out, $err) = $node->psql('postgres', $st,
			extra_params => [ '-U', 'monitor', '-A' ]);
		is($ret, 0, "README statement runs: $first") or diag $err;
		unlike($out, qr/\bidle\b/, "README statement does not report the healthy idle activity");
	}
}

# The operator role sees the status the superuser sees, the launcher
# included (pg_stat_activity hides its backend type from that role).
my $status = 'SELECT launcher_running, overdue, failing, incomplete FROM redpacket.reconciler_status';
is($node->safe_psql('postgres', $status), 't|f|0|0', 'the superuser sees the launcher running');
is( $node->safe_psql('postgres', $status, extra_params => [ '-U', 'monitor' ]),
	$node->safe_psql('postgres', $status),
	'the operator role sees the same reconciler status');

$node->stop('fast');
done_testing();
