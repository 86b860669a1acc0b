# Restoring a dump into the database the reconciliation worker serves, with
# the worker running (reconcile_interval = 1), slowly: the data of one table
# first, several passes in between, then the rest.  The dump is taken while
# claims are running and holds an activity whose ends_at passes before the
# restore (unsettled, its stripes holding 90.00).
#
# With the procedure (CALL rp_pre_restore(); pg_restore --data-only ...;
# CALL rp_post_restore()): pg_restore exits 0, every table equals a quiet
# reference restore of the same dump, rp_post_restore's full check is ok, the
# books balance, nothing is frozen, the expired activity is settled with its
# real remainder, and claims continue with fresh ids.
#
# Without it (a plain whole-database pg_restore in two steps): pg_restore
# still exits 0 (no row of the worker collides with a restored row), no
# money is stranded (every activity balances, the expired one returns 90.00,
# not 0.00) and nothing is frozen by a false alarm.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $tmp = PostgreSQL::Test::Utils::tempdir;

# --- The source, under claim load ---------------------------------------------

my $src = RedpacketTest::node('source');
$src->safe_psql('postgres', 'CREATE EXTENSION redpacket');
my $fixed = $src->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(100000.00, stripes => 4, name => 'fixed')");
my $lucky = $src->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(5000.00, 20000, stripes => 4, name => 'lucky')");
my $expiring = $src->safe_psql('postgres',
	q{SELECT redpacket.rp_create_activity(100.00, ends_at => clock_timestamp() + interval '6 s',
	                                       stripes => 3, name => 'expiring')});
$src->safe_psql('postgres', "SELECT redpacket.rp_claim($expiring, 'early', 10.00)");
$src->safe_psql('postgres', "SELECT redpacket.rp_claim($fixed, 'seed' || g, 1.00) FROM generate_series(1, 200) g");
$src->safe_psql('postgres', 'SELECT count(*) FROM redpacket.rp_reconcile()');

open(my $fh, '>', "$tmp/claim.pgbench") or die;
print $fh qq{\\set u random(1, 1000000)
SELECT redpacket.rp_claim($fixed, 'pb' || :u, 0.25);
SELECT redpacket.rp_claim($lucky, 'pb' || :u);
};
close $fh;
my ($pb_out, $pb_err) = ('', '');
my $pgbench = IPC::Run::start(
	[   $src->installed_command('pgbench'), '-n', '-c', '2', '-T', '4',
		'-f', "$tmp/claim.pgbench", $src->connstr('postgres') ],
	'>', \$pb_out, '2>', \$pb_err);
sleep 1;
$src->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/app.dump", '-d', $src->connstr('postgres') ],
	'pg_dump -Fc while claims are running');
$pgbench->finish;
like($pb_out, qr/number of transactions actually processed: [1-9]/, 'claims ran during the dump');

# The reference: the same dump restored in one transaction where no worker runs.
$src->safe_psql('postgres', 'CREATE DATABASE ref');
$src->command_ok(
	[ 'pg_restore', '--single-transaction', '-d', $src->connstr('ref'), "$tmp/app.dump" ],
	'reference restore');
my @tables = qw(activity stripe claim ledger reconcile_state reconciliation);
my %ref;
$ref{$_} = $src->safe_psql('ref', "SELECT * FROM redpacket.$_ ORDER BY 1, 2") for @tables;
my $ref_max_claim = $src->safe_psql('ref', 'SELECT max(claim_id) FROM redpacket.claim');
cmp_ok($ref_max_claim, '>', 200, 'the dump holds the claims made under load');
$src->stop;

# The TOC of the dump, split into step 1 (up to the data of one table) and
# step 2 (the rest).
my ($toc) = run_command([ $src->installed_command('pg_restore'), '-l', "$tmp/app.dump" ]);
my @entries = grep { /^\d+;/ } split /\n/, $toc;
sub write_list
{
	my ($file, @lines) = @_;
	open(my $l, '>', $file) or die;
	print $l "$_\n" for @lines;
	close $l;
}
my @data = grep { /TABLE DATA|SEQUENCE SET|PUBLICATION/ } @entries;
my @first_data = grep { /TABLE DATA redpacket activity / } @data;
is(scalar(@first_data), 1, 'the dump has the data of redpacket.activity');
my @rest_data = grep { !/TABLE DATA redpacket activity / } @data;
my @schema = grep { !/TABLE DATA|SEQUENCE SET|PUBLICATION/ } @entries;
write_list("$tmp/data1.list", @first_data);
write_list("$tmp/data2.list", @rest_data);
write_list("$tmp/whole1.list", @schema, @first_data);
write_list("$tmp/whole2.list", @rest_data);

# --- The target: the worker's database -----------------------------------------

my $node = RedpacketTest::node(
	'target', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
redpacket.database = 'app'
});

sub app { return $node->safe_psql('app', $_[0]); }

sub restore_step
{
	my ($list, $what, @opts) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ $node->installed_command('pg_restore'), @opts, '-L', $list, '-d',
			$node->connstr('app'), "$tmp/app.dump" ],
		'>', \$out, '2>', \$err);
	ok($ok, "$what: pg_restore exits 0") or diag($err);
}

# Let several worker passes (one a second) go by.
sub passes_go_by { sleep 4; }

# Books per activity: funded = claims + stripes + returned; closed => empty.
my $books_q = q{
SELECT count(*) FILTER (WHERE funded IS DISTINCT FROM claimed + held + returned),
       count(*) FILTER (WHERE closed AND held <> 0),
       count(*) FILTER (WHERE frozen)
  FROM (SELECT a.id, a.closed_at IS NOT NULL AS closed, a.frozen_reason IS NOT NULL AS frozen,
               (SELECT sum(amount) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'fund') AS funded,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = a.id AND kind = 'return') AS returned,
               (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = a.id) AS claimed,
               (SELECT coalesce(sum(balance), 0) / 10::numeric ^ a.scale FROM redpacket.stripe s WHERE s.activity_id = a.id) AS held
          FROM redpacket.activity a) b};

sleep 2;    # the expiring activity's ends_at has passed by now

# --- With the procedure -------------------------------------------------------

$node->safe_psql('postgres', 'CREATE DATABASE app');
app('CREATE EXTENSION redpacket');
app('CALL redpacket.rp_pre_restore()');
is(app("SELECT 'redpacket.restoring=on' = ANY (setconfig) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = 'app')"),
	't', 'rp_pre_restore sets redpacket.restoring for the database');
restore_step("$tmp/data1.list", 'with the procedure, step 1 (activity)', '--data-only');
passes_go_by();
restore_step("$tmp/data2.list", 'with the procedure, step 2 (the rest)', '--data-only');
passes_go_by();
for my $t (@tables)
{
	is(app("SELECT * FROM redpacket.$t ORDER BY 1, 2"), $ref{$t},
		"with the procedure: redpacket.$t equals the dump");
}
my $t0 = app('SELECT clock_timestamp()');
app('CALL redpacket.rp_post_restore()');
is(app("SELECT count(*) FROM pg_db_role_setting, unnest(setconfig) c WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = 'app') AND c LIKE 'redpacket.restoring=%'"),
	'0', 'rp_post_restore clears the database setting');
is( app(
		"SELECT count(DISTINCT activity_id), bool_and(ok) FROM redpacket.reconciliation WHERE full_check AND checked_at >= '$t0'"
	),
	'3|t', 'rp_post_restore fully checked every activity, all ok');
is(app($books_q), '0|0|0', 'with the procedure: the books balance, nothing stranded, nothing frozen');
is( app("SELECT amount FROM redpacket.ledger WHERE activity_id = $expiring AND kind = 'return'"),
	'90.00', 'the expired activity returned its real remainder');
my $new = app("SELECT claim_id FROM redpacket.rp_claim($fixed, 'after-restore', 1.00)");
cmp_ok($new, '>', $ref_max_claim, 'claims continue with fresh ids');

# --- Without it -----------------------------------------------------------------

$node->safe_psql('postgres', 'DROP DATABASE app WITH (FORCE)');
$node->safe_psql('postgres', 'CREATE DATABASE app');
restore_step("$tmp/whole1.list", 'without the procedure, step 1 (schema, activity)');
passes_go_by();
restore_step("$tmp/whole2.list", 'without the procedure, step 2 (the rest)');
passes_go_by();
is(app($books_q), '0|0|0', 'without the procedure: no money stranded, no false freeze');
is(app("SELECT coalesce(sum(amount), 0) FROM redpacket.ledger WHERE activity_id = $expiring AND kind = 'return'"),
	app("SELECT CASE WHEN closed_at IS NULL THEN 0 ELSE 90.00 END FROM redpacket.activity WHERE id = $expiring"),
	'the expired activity returns 90.00 if settled, nothing before');
my $ref_claims = () = $ref{claim} =~ /\n/g;
is(app("SELECT count(*) FROM redpacket.claim"), $ref_claims + 1, 'every claim of the dump is there');
is(app("SELECT pubname || ':' || string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables GROUP BY pubname"),
	'redpacket_events:activity_change,claim,claim_settlement,ledger',
	'the publication lists claim, ledger, activity_change and claim_settlement after the restore');

$node->stop;
done_testing();
