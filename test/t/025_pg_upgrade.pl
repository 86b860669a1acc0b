# pg_upgrade of a cluster that runs redpacket, from an older PostgreSQL major
# to the one under test (15 to 18 in test/run_all.sh), the way a DBA does it:
# the same redpacket version installed in both, redpacket preloaded in both,
# pg_upgrade --check first, then the upgrade, then the update_extensions.sql
# that pg_upgrade writes (ALTER EXTENSION redpacket UPDATE).
#
# The old cluster has two databases: "postgres" at the current version and
# "shop" at 1.2, each with fixed, lucky, rain and batch claims, a closed
# activity and the worker's reconciliation rows.  After the upgrade every
# claim, ledger and reconciliation row is there unchanged and the books
# balance (test/sql/books.sql); claims work on the 1.2 catalog under the new
# server, and again after the update: a retried claim answers duplicate with
# its old id, new claims get ids above the old ones, a close returns the
# remainder, the worker passes on the new server and a full check is ok.
#
# 18's initdb enables data checksums by default and 15's did not; pg_upgrade
# refuses clusters whose settings differ, and --check says so before anything
# is written.  The new cluster is then created with --no-data-checksums
# (the other way is pg_checksums --enable on the stopped old cluster).
#
# Needs both majors: REDPACKET_UPGRADE_FROM is the pg_config of the older
# one (test/run_all.sh sets it for its PostgreSQL 18 suite), the suite's own
# PostgreSQL is the newer one.  Skips, saying why, without them.
use strict;
use warnings;

use Cwd qw(getcwd);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $from = $ENV{REDPACKET_UPGRADE_FROM};
plan skip_all => 'pg_upgrade needs an older PostgreSQL major with redpacket installed:'
  . ' set REDPACKET_UPGRADE_FROM to its pg_config and run this test with the newer'
  . " major's suite (test/run_all.sh does, from 15 to 18 built by test/pg18/build.sh)"
  unless defined $from && $from ne '';
plan skip_all => "REDPACKET_UPGRADE_FROM=$from is not an executable pg_config"
  unless -x $from;

# pg_config of an installation: its output for one option
sub config
{
	my ($pg_config, $opt) = @_;
	my ($out) = run_command([ $pg_config, $opt ]);
	chomp $out;
	return $out;
}

my $old = PostgreSQL::Test::Cluster->new('old',
	install_path => dirname(config($from, '--bindir')));
my $new_version = PostgreSQL::Test::Cluster->new('new_version')->pg_version;
plan skip_all => "the suite runs PostgreSQL $new_version"
  . ', not newer than REDPACKET_UPGRADE_FROM (' . $old->pg_version
  . "): run this test with the newer major's suite, e.g. PostgreSQL 18"
  . ' (test/pg18/build.sh)'
  unless $new_version > $old->pg_version;

# The same redpacket in both: the version CREATE EXTENSION installs and the library.
sub default_version
{
	my ($pg_config) = @_;
	my $control = config($pg_config, '--sharedir') . '/extension/redpacket.control';
	my ($v) = slurp_file($control) =~ /^default_version\s*=\s*'([^']+)'/m
	  or die "no default_version in $control";
	return $v;
}
my $version = default_version($from);
is(default_version('pg_config'), $version,
	"redpacket $version is installed for both majors");
ok(-f config($from, '--pkglibdir') . '/redpacket.so', 'the old major has the library')
  or BAIL_OUT("redpacket is not installed for $from");

my $conf = q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
};

# --- The old cluster, in use ------------------------------------------------------

$old->init;    # the old major's defaults: no data checksums on 15
$old->append_conf('postgresql.conf', $conf);
$old->start;
$old->safe_psql('postgres', 'CREATE DATABASE shop');
$old->safe_psql('postgres', 'CREATE EXTENSION redpacket');
$old->safe_psql('shop', "CREATE EXTENSION redpacket VERSION '1.2'");

my %act;    # database => name => id
for my $db ('postgres', 'shop')
{
	my $sql = sub { return $old->safe_psql($db, $_[0]); };
	my $a = $act{$db} = {};
	$a->{fixed} = $sql->("SELECT redpacket.rp_create_activity(100.00, stripes => 4, name => 'fixed')");
	$a->{lucky} = $sql->("SELECT redpacket.rp_create_activity(50.00, 20, stripes => 4, name => 'lucky')");
	$a->{rain} = $sql->(
		"SELECT redpacket.rp_create_activity(30.00, 100, stripes => 2, per_user_limit => 3, name => 'rain')");
	$a->{batch} = $sql->("SELECT redpacket.rp_create_activity(40.00, stripes => 4, name => 'batch')");
	$a->{closed} = $sql->("SELECT redpacket.rp_create_activity(20.00, stripes => 3, name => 'closed')");
	is( $sql->(
			"SELECT count(*) FILTER (WHERE (r).status = 'claimed') FROM (SELECT redpacket.rp_claim($a->{fixed}, 'u' || g, 1.25) AS r FROM generate_series(1, 5) g) s"
		),
		'5', "$db: fixed claims on the old server");
	is( $sql->(
			"SELECT count(*) FILTER (WHERE (r).status = 'claimed') FROM (SELECT redpacket.rp_claim($a->{lucky}, 'u' || g) AS r FROM generate_series(1, 8) g) s"
		),
		'8', "$db: lucky draws");
	is( $sql->(
			"SELECT string_agg(status::text, ',' ORDER BY g) FROM generate_series(1, 4) g, LATERAL redpacket.rp_claim($a->{rain}, 'bob', 0.50, 'drop-' || g)"
		),
		'claimed,claimed,claimed,user_limit',
		"$db: rain with its per-user limit");
	is( $sql->(
			"SELECT string_agg(status::text, ',' ORDER BY ord) FROM redpacket.rp_claim_batch($a->{batch}, ARRAY['a','b','c'], ARRAY[2.00, 3.00, 4.00])"
		),
		'claimed,claimed,claimed',
		"$db: batch claims");
	$sql->("SELECT redpacket.rp_claim($a->{closed}, 'early', 5.00)");
	is($sql->("SELECT redpacket.rp_close_activity($a->{closed})"),
		'15.00', "$db: the close returns the remainder");
	ok( $old->poll_query_until($db,
			'SELECT count(DISTINCT activity_id) = 5 FROM redpacket.reconciliation'),
		"$db: the worker checked every activity");
	is(RedpacketTest::unbalanced($old, $db), '0', "$db: the books balance before the upgrade");
}

# What must survive, read with the worker paused (so that nothing is written
# between the reading and the stop).
my %rows_q = (
	claims => 'SELECT string_agg(c::text, E\'\n\' ORDER BY claim_id) FROM redpacket.claim c',
	ledger => 'SELECT string_agg(l::text, E\'\n\' ORDER BY entry_id) FROM redpacket.ledger l',
	reconciliation => 'SELECT string_agg(r::text, E\'\n\' ORDER BY pass_id, activity_id)'
	  . ' FROM redpacket.reconciliation r WHERE pass_id <= PASS',
	activities => 'SELECT string_agg(a::text, E\'\n\' ORDER BY id) FROM redpacket.activity a',
	stripes => 'SELECT string_agg(s::text, E\'\n\' ORDER BY activity_id, stripe) FROM redpacket.stripe s');
$old->append_conf('postgresql.conf', 'redpacket.reconcile_interval = 0');
$old->restart;
my (%before, %max_claim, %max_pass);
# the rows of one table (the worker's passes on the new server come later)
sub rows
{
	my ($node, $db, $what) = @_;
	return $node->safe_psql($db, $rows_q{$what} =~ s/PASS/$max_pass{$db}/r);
}
for my $db ('postgres', 'shop')
{
	$max_claim{$db} = $old->safe_psql($db, 'SELECT max(claim_id) FROM redpacket.claim');
	$max_pass{$db} = $old->safe_psql($db, 'SELECT max(pass_id) FROM redpacket.reconciliation');
	$before{$db}{$_} = rows($old, $db, $_) for keys %rows_q;
}
is($old->safe_psql('shop', "SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	'1.2', 'shop is at 1.2');
$old->stop;

# --- pg_upgrade ---------------------------------------------------------------------

my $work = PostgreSQL::Test::Utils::tempdir;    # pg_upgrade writes its scripts here

sub pg_upgrade
{
	my ($to, @opts) = @_;
	my $cwd = getcwd();
	chdir $work or die "chdir $work: $!";
	my ($ok, $out, $err) = (0, '', '');
	$ok = IPC::Run::run(
		[
			$to->installed_command('pg_upgrade'), '--no-sync',
			'--old-datadir' => $old->data_dir,
			'--new-datadir' => $to->data_dir,
			'--old-bindir' => $old->config_data('--bindir'),
			'--new-bindir' => $to->config_data('--bindir'),
			'--socketdir' => $to->host,
			'--old-port' => $old->port,
			'--new-port' => $to->port,
			@opts
		],
		'>', \$out, '2>', \$err);
	chdir $cwd or die "chdir $cwd: $!";
	return ($ok, $out . $err);
}

# A new cluster of the new major, redpacket preloaded as in the old one.
sub new_cluster
{
	my ($name, %init) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%init);
	$node->append_conf('postgresql.conf', $conf);
	return $node;
}

# With the new major's defaults, data checksums are on (18) and pg_upgrade
# refuses.
my $defaults = new_cluster('new_defaults');
my ($ok, $out) = pg_upgrade($defaults, '--check');
ok(!$ok, 'pg_upgrade --check refuses a new cluster with data checksums');
like($out, qr/old cluster does not use data checksums but the new one does/,
	'and says so');

# As the old cluster: no data checksums.
my $new = new_cluster('new', no_data_checksums => 1);
($ok, $out) = pg_upgrade($new, '--check');
ok($ok, 'pg_upgrade --check passes') or diag($out);
($ok, $out) = pg_upgrade($new);

# PostgreSQL 15.20 keeps a version in every column's attoptions
# (pg_attver, internal: its defence against composite types altered
# concurrently); a new major's minor release older than that (18.6 was
# released before 15.20) does not know the option, and the restore of the
# schema fails for every database with a table.  That is PostgreSQL's to
# fix (use a minor release of the new major no older than the old one's);
# to check redpacket's part, the upgrade is repeated from the same cluster
# with the versions removed, as its columns had before the old server was
# updated to 15.20 (which copes with columns that have none).
if (!$ok && $out =~ /Restoring database schemas in the new cluster/)
{
	my $logs = join('', map { slurp_file($_) }
		  glob($new->data_dir . '/pg_upgrade_output.d/*/log/pg_upgrade_dump_*.log'));
	if ($logs =~ /unrecognized parameter "pg_attver"/)
	{
		diag('PostgreSQL ' . $new->pg_version . ' does not know the column versions of '
			  . 'PostgreSQL ' . $old->pg_version . ' (pg_attver): pg_upgrade fails for any '
			  . 'database with a table; repeating it with the versions removed');
		pass('pg_upgrade fails only on the old server\'s column versions (pg_attver)');
		$old->start;
		for my $db ('postgres', 'shop')
		{
			$old->safe_psql(
				$db, q{
SET allow_system_table_mods = on;
UPDATE pg_catalog.pg_attribute a
   SET attoptions = (SELECT pg_catalog.array_agg(o) FROM pg_catalog.unnest(a.attoptions) o
                      WHERE o NOT LIKE 'pg_attver=%')
 WHERE a.attrelid >= 16384 AND a.attoptions::text LIKE '%pg_attver=%'});
		}
		$old->stop;
		$new = new_cluster('new_again', no_data_checksums => 1);
		($ok, $out) = pg_upgrade($new);
	}
}
ok($ok, 'pg_upgrade') or diag($out);
like($out, qr/update_extensions\.sql/, 'pg_upgrade asks for ALTER EXTENSION UPDATE');
my $update = slurp_file("$work/update_extensions.sql");
like($update, qr/^\\connect shop\nALTER EXTENSION "?redpacket"? UPDATE;$/m,
	'update_extensions.sql updates redpacket in shop');
unlike($update, qr/\\connect postgres\n/, 'and not in postgres (already current)');

# --- The new server -----------------------------------------------------------------

$new->start;
for my $db ('postgres', 'shop')
{
	for my $what (sort keys %rows_q)
	{
		is(rows($new, $db, $what), $before{$db}{$what},
			"$db: every $what row carried over unchanged");
	}
	is(RedpacketTest::unbalanced($new, $db), '0', "$db: the books balance after the upgrade");
}
is($new->safe_psql('shop', "SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	'1.2', 'shop is still at 1.2');

# Claims on each database as it came over (shop at 1.2), then on shop again
# after update_extensions.sql.
sub claims_work
{
	my ($db, $round) = @_;
	my $a = $act{$db};
	my $sql = sub { return $new->safe_psql($db, $_[0]); };
	is( $sql->(
			"SELECT status || ',' || (claim_id > $max_claim{$db}) FROM redpacket.rp_claim($a->{fixed}, 'new$round', 2.00)"
		),
		'claimed,true', "$db ($round): a claim gets a fresh id");
	is($sql->("SELECT status FROM redpacket.rp_claim($a->{lucky}, 'new$round')"),
		'claimed', "$db ($round): lucky draw");
	my $bob = $sql->(
		"SELECT claim_id FROM redpacket.claim WHERE activity_id = $a->{rain} AND user_id = 'bob' AND request_id = 'drop-1'"
	);
	is($sql->("SELECT status || ',' || claim_id FROM redpacket.rp_claim($a->{rain}, 'bob', 0.50, 'drop-1')"),
		"duplicate,$bob", "$db ($round): a retry of an old claim answers duplicate with its id");
	is( $sql->(
			"SELECT string_agg(status::text, ',' ORDER BY ord) FROM redpacket.rp_claim_batch($a->{batch}, ARRAY['a','x$round'], ARRAY[2.00, 1.00])"
		),
		'duplicate,claimed', "$db ($round): batch");
	is($sql->("SELECT status FROM redpacket.rp_claim($a->{closed}, 'late$round', 1.00)"),
		'ended', "$db ($round): the closed activity stays closed");
	my $cid = $sql->("SELECT claim_id FROM redpacket.rp_claim($a->{fixed}, 'probe$round', 0.01)");
	ok( $new->poll_query_until($db,
			"SELECT last_claim_id >= $cid FROM redpacket.reconcile_state WHERE activity_id = $a->{fixed}"),
		"$db ($round): the worker passes on the new server");
	ok( $new->poll_query_until($db,
			'SELECT count(*) = 5 AND bool_and(ok) FROM redpacket.rp_reconcile(NULL, true)'),
		"$db ($round): a full check of every activity is ok");
	is(RedpacketTest::unbalanced($new, $db), '0', "$db ($round): the books balance");
}
claims_work('postgres', 'upgraded');
claims_work('shop', 'upgraded');

$new->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $new->connstr('postgres'),
		'-f', "$work/update_extensions.sql" ],
	'update_extensions.sql runs');
is($new->safe_psql('shop', "SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	$version, "shop is at $version");
claims_work('shop', 'updated');
is($new->safe_psql('shop', "SELECT redpacket.rp_close_activity($act{shop}{batch})"),
	'29.00', 'shop: a close after the update returns the remainder');
is(RedpacketTest::unbalanced($new, 'shop'), '0', 'shop: the books balance after the close');
is($new->safe_psql($_, 'SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok'),
	'0', "$_: no pass ever failed, before or after the upgrade")
  for ('postgres', 'shop');

$new->stop;
done_testing();
