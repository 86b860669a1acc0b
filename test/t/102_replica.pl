# Streaming replication: a standby built while claims are running serves
# activity_status, the claims and the books with the same numbers as the
# primary once caught up; on the standby every writing function fails with
# 25006 (read-only transaction) and the server stays up, holding no lock of
# ours; the reconciliation worker waits quietly during recovery.  After the
# primary is lost and the standby promoted, claims continue (new claim ids,
# no reuse), the worker passes again, the invariants hold and rp_reconcile
# is ok.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $conf = q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
max_connections = 40
max_locks_per_transaction = 256
log_line_prefix = '%m [%p] %e '
log_statement = none
};

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', $conf);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION redpacket');

my %act;
$act{fixed} = $primary->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(100000.00, stripes => 8, name => 'replica fixed')");
$act{lucky} = $primary->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(50000.00, packets => 40000, stripes => 4, name => 'replica lucky')");
$act{rain} = $primary->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(800.00, stripes => 2, per_user_limit => 2, name => 'replica rain')");
$act{small} = $primary->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(3.00, stripes => 2, name => 'replica small')");
$primary->safe_psql(
	'postgres', qq{
SELECT redpacket.rp_claim($act{fixed}, 'seed' || g, 1.00) FROM generate_series(1, 50) g;
SELECT redpacket.rp_claim($act{lucky}, 'seed' || g) FROM generate_series(1, 50) g;
SELECT redpacket.rp_claim($act{rain}, 'seed' || g % 20, 0.50, 'r' || g) FROM generate_series(1, 60) g;
SELECT redpacket.rp_claim($act{small}, 'seed' || g, 0.50) FROM generate_series(1, 10) g;
});

# Claims keep coming while the standby is built and catches up.
my $tmp = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$tmp/claim.pgbench") or die;
print $fh qq{\\set u random(1, 200000)
\\set c random(1, 500)
SELECT redpacket.rp_claim($act{fixed}, 'pb' || :u, :c * 0.01);
SELECT redpacket.rp_claim($act{lucky}, 'pb' || :u);
SELECT redpacket.rp_claim($act{rain}, 'pb' || (:u % 300), 0.75, 'r' || (:c % 3));
};
close $fh;
my ($pb_out, $pb_err) = ('', '');
my $pgbench = IPC::Run::start(
	[   $primary->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-T', '6',
		'-f', "$tmp/claim.pgbench", $primary->connstr('postgres') ],
	'>', \$pb_out, '2>', \$pb_err);

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

$pgbench->finish;
is($pgbench->result(0), 0, 'pgbench on the primary ran without error')
  or diag($pb_err);
like($pb_out, qr/number of transactions actually processed: [1-9]/, 'pgbench made claims');

# Pause the primary's worker so that nothing changes while we compare.
$primary->safe_psql('postgres', 'ALTER SYSTEM SET redpacket.reconcile_interval = 0');
$primary->reload;
sleep 2;
$primary->wait_for_catchup($standby);

my $status_q = 'SELECT * FROM redpacket.activity_status ORDER BY id';
my $books_q = q{
SELECT a.id, count(c.claim_id), coalesce(sum(c.amount), 0),
       md5(coalesce(string_agg(c.claim_id || ':' || c.user_id || ':' || c.amount, ',' ORDER BY c.claim_id), '')),
       (SELECT sum(balance) || '/' || coalesce(sum(packets)::text, '-') || '/' || sum(claims)
          FROM redpacket.stripe s WHERE s.activity_id = a.id)
FROM redpacket.activity a LEFT JOIN redpacket.claim c ON c.activity_id = a.id
GROUP BY a.id ORDER BY a.id};
my $primary_status = $primary->safe_psql('postgres', $status_q);
is($standby->safe_psql('postgres', $status_q),
	$primary_status, 'activity_status on the standby equals the primary after catch-up');
is($standby->safe_psql('postgres', $books_q),
	$primary->safe_psql('postgres', $books_q),
	'claims and stripes on the standby equal the primary');
like($primary_status, qr/replica small\|exhausted/, 'the small activity ran out on the primary');
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'standby is in recovery');

# --- Writes on the standby: 25006, not a crash -------------------------------

my $standby_start = $standby->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $log_offset = -s $standby->logfile;

# SQLSTATE of one statement on the standby ('' when it succeeded).
sub standby_sqlstate
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	$standby->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 0);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}

my %writes = (
	'rp_claim, fixed amount' => "SELECT redpacket.rp_claim($act{fixed}, 'standby-1', 1.00)",
	'rp_claim, lucky draw' => "SELECT redpacket.rp_claim($act{lucky}, 'standby-2')",
	'rp_claim, rain' => "SELECT redpacket.rp_claim($act{rain}, 'standby-3', 0.50, 'r1')",
	'rp_claim in a transaction' =>
	  "BEGIN; SELECT redpacket.rp_claim($act{fixed}, 'standby-4', 1.00); COMMIT;",
	'rp_claim_batch' =>
	  "SELECT * FROM redpacket.rp_claim_batch($act{fixed}, ARRAY['standby-5', 'standby-6'], ARRAY[1.00, 2.00])",
	'rp_create_activity' => 'SELECT redpacket.rp_create_activity(10.00)',
	'rp_close_activity' => "SELECT redpacket.rp_close_activity($act{small})",
	'rp_freeze' => "SELECT redpacket.rp_freeze($act{fixed}, 'standby')",
	'rp_unfreeze' => "SELECT redpacket.rp_unfreeze($act{fixed})",
	'rp_reconcile(id, true)' => "SELECT * FROM redpacket.rp_reconcile($act{fixed}, true)",
	'rp_reconcile(NULL, true)' => 'SELECT * FROM redpacket.rp_reconcile(NULL, true)');
is( $standby->safe_psql(
		'postgres',
		"SELECT state FROM redpacket.activity_status WHERE id IN ($act{fixed}, $act{lucky}, $act{rain}) ORDER BY id"),
	"active\nactive\nactive",
	'the activities claimed on the standby below still have budget and packets');
for my $what (sort keys %writes)
{
	is(standby_sqlstate($writes{$what}), '25006', "standby: $what fails with 25006");
}

# A retry of a claim the primary recorded reads only: it may answer with the
# original claim, or refuse as read-only, but never anything else.
my ($seed_id, $seed_amount) = split /\|/,
  $standby->safe_psql('postgres',
	"SELECT claim_id, amount FROM redpacket.claim WHERE activity_id = $act{fixed} AND user_id = 'seed1'");
my ($out, $err) = ('', '');
$standby->psql(
	'postgres',
	"\\set VERBOSITY verbose\nSELECT status, claim_id, amount FROM redpacket.rp_claim($act{fixed}, 'seed1', 1.00)",
	stdout => \$out, stderr => \$err, on_error_stop => 0);
my $got = $out ne '' ? $out : ($err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : $err);
ok( $got eq "duplicate|$seed_id|$seed_amount" || $got eq '25006',
	"standby: a retry of an existing claim is its duplicate or 25006 (got $got)");

is($standby->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$standby_start, 'standby did not restart');
ok(!$standby->log_contains(qr/terminated by signal|PANIC|TRAP:/, $log_offset),
	'no standby process crashed');
is($standby->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
	0, 'standby holds no advisory lock after the failed calls');
is($standby->safe_psql('postgres', $books_q),
	$primary->safe_psql('postgres', $books_q),
	'the standby is unchanged');
ok( !$standby->log_contains(
		qr/background worker "redpacket (?:launcher|reconciler)[^"]*".*exited with exit code [1-9]|redpacket (?:launcher|reconciler).*(ERROR|FATAL)/),
	'the reconciliation worker stayed quiet on the standby');

# --- Failover: the primary is lost, the standby promoted ----------------------

my $max_claim = $primary->safe_psql('postgres', 'SELECT max(claim_id) FROM redpacket.claim');
$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'standby did not finish promotion';
my $promoted_at = $standby->safe_psql('postgres', 'SELECT now()');

my $after = $standby->safe_psql(
	'postgres', qq{
SELECT string_agg(status::text, ',' ORDER BY ord) FROM (
  SELECT 1 ord, (redpacket.rp_claim($act{fixed}, 'after-1', 2.50)).status
  UNION ALL SELECT 2, (redpacket.rp_claim($act{fixed}, 'after-1', 2.50)).status
  UNION ALL SELECT 3, (redpacket.rp_claim($act{fixed}, 'seed1', 1.00)).status
  UNION ALL SELECT 4, (redpacket.rp_claim($act{small}, 'after-2', 0.40)).status
  UNION ALL SELECT 5, (redpacket.rp_claim($act{rain}, 'after-3', 0.50, 'r1')).status) x});
is($after, 'claimed,duplicate,duplicate,exhausted,claimed',
	'claims continue on the promoted standby with the right statuses');

# A short stress run on the new primary.
my ($pb2_out, $pb2_err) = ('', '');
IPC::Run::run(
	[   $standby->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-t', '200',
		'-f', "$tmp/claim.pgbench", $standby->connstr('postgres') ],
	'>', \$pb2_out, '2>', \$pb2_err);
like($pb2_out, qr/number of transactions actually processed: 800\/800/,
	'pgbench on the promoted standby ran every transaction')
  or diag($pb2_err);
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM redpacket.claim WHERE claim_id <= $max_claim AND claimed_at >= '$promoted_at'"
	),
	0,
	'claim ids after promotion are new (no id handed out twice)');

# The worker passes again now that recovery is over.
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE checked_at > '$promoted_at'"),
	'the reconciliation worker runs on the promoted standby');

my $invariants = $standby->safe_psql(
	'postgres', q{
WITH b AS (
  SELECT a.id, a.packets, a.per_user_limit,
         (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = a.id AND l.kind = 'fund') AS funded,
         (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l WHERE l.activity_id = a.id AND l.kind = 'return') AS returned,
         (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = a.id) AS claimed,
         (SELECT count(*) FROM redpacket.claim c WHERE c.activity_id = a.id) AS n,
         (SELECT sum(balance) FROM redpacket.stripe s WHERE s.activity_id = a.id) / 10::numeric ^ a.scale AS remaining,
         (SELECT sum(packets) FROM redpacket.stripe s WHERE s.activity_id = a.id) AS packets_left,
         (SELECT sum(claims) FROM redpacket.stripe s WHERE s.activity_id = a.id) AS stripe_claims
  FROM redpacket.activity a)
SELECT count(*) FILTER (WHERE funded <> claimed + remaining + returned OR n <> stripe_claims
                           OR (packets IS NOT NULL AND packets - n <> packets_left)),
       (SELECT count(*) FROM (SELECT 1 FROM redpacket.claim c JOIN redpacket.activity a ON a.id = c.activity_id
                              GROUP BY c.activity_id, c.user_id, a.per_user_limit
                              HAVING count(*) > a.per_user_limit) x),
       (SELECT count(*) FROM redpacket.stripe WHERE balance < 0 OR packets < 0)
FROM b});
is($invariants, '0|0|0',
	'after promotion: books balance, no user over the limit, no negative stripe');
# The promoted node's own worker passes every second, and a pass that finds
# another running returns at once with no rows: ask again until ours runs.
my $passes;
for (1 .. 100)
{
	$passes = $standby->safe_psql('postgres',
		q{SELECT count(*) || ' passes, ' || count(*) FILTER (WHERE NOT ok) || ' not ok' FROM redpacket.rp_reconcile(NULL, true)}
	);
	last if $passes ne '0 passes, 0 not ok';
	usleep(100_000);
}
is($passes, '4 passes, 0 not ok',
	'rp_reconcile(NULL, true) is ok for every activity after promotion');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok'),
	0, 'no reconciliation pass ever failed, on either node');

$standby->stop;
done_testing();
