# redpacket on a real Citus cluster: a coordinator and two workers
# on loopback, rp_distribute(), then every kind of call through the
# coordinator, the node guard, the worker's expiry settlement, 16 clients
# claiming at once on activities placed on both workers, and the
# per-activity invariants afterwards.
#
# Needs Citus installed in the PostgreSQL under test (test/citus/build.sh,
# which test/run_all.sh runs first); skips without it.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use RedpacketTest;

my ($coord, @workers) = RedpacketTest::citus_nodes();
my @nodes = ($coord, @workers);
my $cport = $coord->port;

sub q_coord { return $coord->safe_psql('postgres', $_[0]); }

# psql on a node: (exit code, stdout, stderr), never dies.
sub try_psql
{
	my ($node, $sql) = @_;
	my ($out, $err);
	my $rc = $node->psql('postgres', $sql, stdout => \$out, stderr => \$err,
		on_error_stop => 1);
	return ($rc, $out // '', $err // '');
}

# bool_and(ok) of rp_reconcile(activity, full) through the coordinator.  A
# pass returns no row when the node's worker holds the pass lock at that
# moment: retry a few times.
sub reconcile_ok
{
	my ($aid, $full) = @_;
	my $r = '';
	for (1 .. 20)
	{
		$r = q_coord("SELECT bool_and(ok) FROM redpacket.rp_reconcile($aid, $full)");
		last if $r ne '';
		select(undef, undef, undef, 0.5);
	}
	return $r;
}

# Refusals before the cluster is complete.
my ($rc, $out, $err) = try_psql($coord, 'SELECT redpacket.rp_distribute()');
like($err, qr/must run on the Citus coordinator/,
	'rp_distribute refuses before the coordinator is set');
$coord->safe_psql('postgres',
	"SELECT citus_set_coordinator_host('127.0.0.1', $cport)");
($rc, $out, $err) = try_psql($coord, 'SELECT redpacket.rp_distribute()');
like($err, qr/has no worker node/, 'rp_distribute refuses without workers');
for my $w (@workers)
{
	$coord->safe_psql('postgres',
		"SELECT citus_add_node('127.0.0.1', " . $w->port . ")");
}
$coord->safe_psql('postgres',
	'CREATE DATABASE nocitus; ');
$coord->safe_psql('nocitus', 'CREATE EXTENSION redpacket');
$coord->psql('nocitus', 'SELECT redpacket.rp_distribute()', stderr => \$err);
like($err, qr/citus is not installed in this database/,
	'rp_distribute refuses where Citus is not installed');

# An activity with claims made before distributing must survive it.
my $pre = q_coord('SELECT redpacket.rp_create_activity(10.00, 10, stripes => 4)');
q_coord("SELECT redpacket.rp_claim($pre, 'pre' || i) FROM generate_series(1, 3) i");

# --- rp_distribute ---------------------------------------------------------
($rc, $out, $err) = try_psql($workers[0], 'SELECT redpacket.rp_distribute()');
like($err, qr/must run on the Citus coordinator/,
	'rp_distribute refuses on a worker');

# A worker's reconciler reads its own copy of the tables, which become
# distributed there when rp_distribute commits: a pass planning its query at
# that moment failed ("cannot perform distributed planning ...") and the
# reconciler exited.  rp_distribute must wait for a transaction reading the
# tables on a worker, as it waits for one on the coordinator.
my $reader = $workers[0]->background_psql('postgres');
$reader->query_safe('BEGIN; SELECT count(*) FROM redpacket.activity');
my $dist = $coord->background_psql('postgres', on_error_stop => 0);
$dist->query_until(qr/distributing/, "\\echo distributing\nSELECT redpacket.rp_distribute();\n");
my $waited = 0;
for (1 .. 300)
{
	$waited = $workers[0]->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE relation = 'redpacket.activity'::regclass AND NOT granted");
	last if $waited > 0;
	# committed without waiting
	last
	  if q_coord("SELECT count(*) FROM pg_dist_partition"
		  . " WHERE logicalrelid = 'redpacket.activity'::regclass") > 0;
	select(undef, undef, undef, 0.1);
}
ok($waited > 0, 'rp_distribute waits for a transaction reading the tables on a worker');
$reader->query_safe('COMMIT');
$reader->quit;
$dist->quit;
# Calls are delegated only to workers whose metadata is in sync.
ok( $coord->poll_query_until('postgres',
		"SELECT bool_and(metadatasynced) FROM pg_dist_node WHERE groupid <> 0"),
	'worker metadata synced after rp_distribute');
# Every table of an activity's rows (the activity itself, and each table
# with an activity_id column) is hash-distributed, all in one group.
is( q_coord(
		"SELECT count(*) FILTER (WHERE p.logicalrelid IS NULL OR p.partmethod <> 'h'),"
		  . " count(DISTINCT p.colocationid), count(*) >= 8"
		  . " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
		  . " LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid"
		  . " WHERE n.nspname = 'redpacket' AND c.relkind IN ('r', 'p')"
		  . "   AND (c.relname = 'activity' OR EXISTS (SELECT 1 FROM pg_attribute a"
		  . "        WHERE a.attrelid = c.oid AND a.attname = 'activity_id' AND NOT a.attisdropped))"),
	'0|1|t',
	'every table of activity rows hash-distributed by activity, in one colocation group');
is( q_coord(
		"SELECT string_agg(p.proname || ':' || coalesce(o.force_delegation, false), ',' ORDER BY p.proname)"
		  . " FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid"
		  . " WHERE o.classid = 'pg_proc'::regclass AND o.distribution_argument_index = 0"
		  . "   AND p.pronamespace = 'redpacket'::regnamespace"),
	'rp_allow:true,rp_claim:true,rp_claim_batch:true,rp_close_activity:true,rp_credited:true,'
	  . 'rp_disallow:true,rp_freeze:true,rp_reconcile:false,rp_refunded:true,rp_repair_stripes:true,'
	  . 'rp_reverse:true,rp_set_window:true,rp_top_up:true,rp_unfreeze:true,rp_withdraw:true',
	'lock-taking functions delegated by activity (rp_reconcile without force)');
is( q_coord(
		"SELECT count(*) FROM redpacket.claim WHERE activity_id = $pre")
	  . '|' . q_coord("SELECT count(*) FROM ONLY redpacket.claim"),
	'3|3',
	'claims made before distributing moved into the shards');
for my $w (@workers)
{
	is( $w->safe_psql(
			'postgres',
			"SELECT bool_and(s.max_value = ((g.groupid::bigint + 1) << 48) - 1)"
			  . "   AND bool_and(coalesce(s.last_value, 0) < (g.groupid::bigint + 1) << 48)"
			  . " FROM pg_sequences s, pg_dist_local_group g"
			  . " WHERE s.schemaname = 'redpacket'"),
		't',
		'worker ' . $w->name . ' sequences confined to its group range');
}

# Activities, until each worker holds at least one of each kind we need.
sub holder { return RedpacketTest::citus_holder($coord, $_[0]); }
sub two_placed { return RedpacketTest::citus_placed($coord, \@workers, $_[0]); }
my @fixed = two_placed('redpacket.rp_create_activity(7.00, stripes => 2)');
my @lucky = two_placed('redpacket.rp_create_activity(50.00, 10, stripes => 4)');
my ($rain) = two_placed(
	'redpacket.rp_create_activity(20.00, stripes => 1, per_user_limit => 3)');
my @ops = two_placed('redpacket.rp_create_activity(30.00, stripes => 2)');
my @nd = two_placed('redpacket.rp_create_activity(7.00, stripes => 2)');
my @recon = two_placed('redpacket.rp_create_activity(5.00, stripes => 1)');
my %group_of = map { $_->port => $_->safe_psql('postgres', 'SELECT groupid FROM pg_dist_local_group') } @workers;
note "fixed @fixed, lucky @lucky, rain $rain, ops @ops";

# --- Claims through the coordinator ----------------------------------------
is( q_coord("SELECT status FROM redpacket.rp_claim($fixed[0], 'a1', 0.07)"),
	'claimed', 'autocommit claim through the coordinator');
my $cid = q_coord(
	"SELECT claim_id FROM redpacket.claim WHERE activity_id = $fixed[0] AND user_id = 'a1'");
my $grp = $group_of{ $workers[0]->port };
note "first claim id $cid";
is( q_coord("SELECT $cid >> 48"), $grp,
	'its claim id comes from the range of the worker that holds the activity');
is( q_coord("SELECT status FROM redpacket.rp_claim($fixed[0], 'a1', 0.07)"),
	'duplicate', 'the same user again is a duplicate');

is( q_coord(
		"BEGIN;"
		  . " SELECT status FROM redpacket.rp_claim($fixed[0], 't1', 0.07);"
		  . " SELECT status FROM redpacket.rp_claim($fixed[0], 't1', 0.07);"
		  . " SELECT status FROM redpacket.rp_claim($fixed[1], 't1', 0.07);"
		  . " COMMIT;"),
	"claimed\nduplicate\nclaimed",
	'claims inside BEGIN ... COMMIT, on both workers, duplicates found');
is( q_coord(
		"BEGIN; SELECT status FROM redpacket.rp_claim($fixed[1], 'r1', 0.07); ROLLBACK;"
		  . " SELECT count(*) FROM redpacket.claim WHERE user_id = 'r1'"),
	"claimed\n0", 'a rolled-back claim leaves nothing');

my $statuses = '';
for my $i (1 .. 10)
{
	$statuses .= q_coord("SELECT status FROM redpacket.rp_claim($lucky[1], 'l$i')") . ' ';
}
is($statuses, 'claimed ' x 10, 'ten lucky draws on a 10-packet activity');
# A call inside a larger query is not delegated (Citus refuses the nested
# distributed query on the worker): each call is its own statement.
is( q_coord("SELECT status FROM redpacket.rp_claim($lucky[1], 'l11')") . '|'
	  . q_coord("SELECT sum(amount) FROM redpacket.claim WHERE activity_id = $lucky[1]"),
	'exhausted|50.00', 'the 11th draw finds it exhausted; the draws add up to the total');

is( join(',',
		map { q_coord("SELECT status FROM redpacket.rp_claim($rain, 'rainer', 1, 'q$_')") }
		  (1, 2, 3, 4, 1)),
	'claimed,claimed,claimed,user_limit,duplicate',
	'rain: per-user limit of 3 with request ids');

is( q_coord(
		"SELECT string_agg(status::text, ',' ORDER BY ord)"
		  . " FROM redpacket.rp_claim_batch($fixed[1], ARRAY['b1','b2','t1'],"
		  . "                               ARRAY[0.07, 0.07, 0.07])"),
	'claimed,claimed,duplicate', 'batch through the coordinator');
is( q_coord(
		"BEGIN; SELECT count(*) FROM redpacket.rp_claim_batch($fixed[0], ARRAY['b3','b4'],"
		  . " ARRAY[0.07, 0.07]); COMMIT;"),
	'2', 'batch inside BEGIN ... COMMIT');

# A call Citus does not delegate (the function inside a larger expression)
# runs on the coordinator.  rp_claim must then refuse (node guard), not take
# the coordinator's locks while delegated claims take the worker's.
is(q_coord("SELECT status FROM redpacket.rp_claim($nd[0], 'nd0', 0.07)"),
	'claimed', 'a delegated claim first (sets the watermark past it)');
reconcile_ok($nd[0], 'false');
($rc, $out, $err) = try_psql($coord,
	"SELECT (redpacket.rp_claim($nd[0], 'nd1', 0.07)).status");
like($err, qr/is not held by this node/,
	'an undelegated rp_claim on the coordinator refuses');
# Without the guard it claimed, with an id of the coordinator's range, below
# the watermark: the next incremental pass missed it and froze the activity.
is(reconcile_ok($nd[0], 'false'),
	't', 'the incremental reconciliation after it is ok');

# --- The claim path's statements on a worker -------------------------------
# Through Citus the fast path's statements were planned as INSERT ... SELECT
# via intermediate results (0.03x of a single node); now they run on the
# local shard tables: Citus executes none of them.
{
	my ($hw) = grep { $_->port == holder($fixed[0]) } @workers;
	my $log = "SET citus.log_local_commands = on; SET citus.log_remote_commands = on;"
	  . " SET client_min_messages = log;";
	($rc, $out, $err) = try_psql($hw,
		"$log SELECT status FROM redpacket.rp_claim($fixed[0], 'loc1', 0.07)");
	is($out, 'claimed', 'a claim directly on the worker holding the activity');
	unlike($err, qr/executing the (command|copy) locally: (INSERT|UPDATE)|intermediate_result|issuing/,
		'its fast path runs no statement through Citus (local shard tables)')
	  or diag $err;
	# and none at all by default: direct.c writes the shard tables
	($rc, $out, $err) = try_psql($hw,
		"SET client_min_messages = debug1; SELECT status FROM redpacket.rp_claim($fixed[0], 'loc4', 0.07)");
	is($out, 'claimed', 'another claim directly on the worker');
	like($err, qr/redpacket: claim took the direct path/,
		'it takes the direct path on the shard tables') or diag $err;
	($rc, $out, $err) = try_psql($coord,
		"SELECT status FROM redpacket.rp_claim($fixed[0], 'loc4', 0.07)");
	is($out, 'duplicate', 'the same user through the coordinator: duplicate');
	($rc, $out, $err) = try_psql($hw,
		"$log SELECT count(*) FROM redpacket.rp_claim_batch($fixed[0], ARRAY['loc2','loc3'],"
		  . " ARRAY[0.07, 0.07])");
	is($out, '2', 'a batch directly on the worker');
	unlike($err, qr/intermediate_result|executing the copy locally|issuing/,
		'its insert is no INSERT ... SELECT through intermediate results')
	  or diag $err;
}

# --- Reconciliation and the node guard -------------------------------------
is(reconcile_ok($fixed[0], 'false'),
	't', 'rp_reconcile(activity) through the coordinator is delegated and ok');
($rc, $out, $err) = try_psql($coord,
	"BEGIN; SELECT * FROM redpacket.rp_reconcile($fixed[0]); COMMIT;");
like($err, qr/activity $fixed[0] is not held by this node/,
	'rp_reconcile inside a transaction on the coordinator refuses instead of locking there');
($rc, $out, $err) = try_psql($workers[1],
	"BEGIN; SELECT * FROM redpacket.rp_reconcile($fixed[0]); COMMIT;");
like($err, qr/activity $fixed[0] is not held by this node/,
	'rp_reconcile on the worker that does not hold the activity refuses')
  or diag "rc $rc, out: $out";
($rc, $out, $err) = try_psql($coord,
	"SELECT count(*) FROM (SELECT redpacket.rp_freeze($ops[0], 'x') OFFSET 0) s");
like($err, qr/activity $ops[0] is not held by this node/,
	'rp_freeze inside a larger query (not delegated) refuses on the coordinator');
my $held = '';
for (1 .. 20)
{
	$held = $workers[0]->safe_psql('postgres',
		"BEGIN; SELECT bool_and(ok) FROM redpacket.rp_reconcile($fixed[0]); COMMIT;");
	last if $held ne '';
	select(undef, undef, undef, 0.5);
}
is($held, 't', 'rp_reconcile on the worker that holds the activity works in a transaction');

# --- rp_reconcile() without an activity, through the coordinator -----------
# Citus delegated the call to the node holding the NULL key's shard, which
# checked only its own activities.  Now every node checks its share, each
# activity once, where it lives; a failing activity does not stop the rest.
{
	q_coord("SELECT redpacket.rp_claim($_, 'rc', 0.01)") for @recon;
	# break one activity on one worker: a stripe with money nobody funded
	q_coord("UPDATE redpacket.stripe SET balance = balance + 1 WHERE activity_id = $recon[0]");
	my (%seen, %dup, %grp);
	for (1 .. 20)
	{
		for my $row (split /\n/, q_coord(
				"SELECT activity_id, ok, pass_id >> 48 FROM redpacket.rp_reconcile(NULL, true)"))
		{
			my ($aid, $ok, $g) = split /\|/, $row;
			$dup{$aid} = 1 if exists $seen{$aid};
			$seen{$aid} = $ok;
			$grp{$aid} = $g;
		}
		# a node's share is empty while its own worker holds the pass lock
		last if exists $seen{ $recon[0] } && exists $seen{ $recon[1] };
		%seen = %dup = ();
		select(undef, undef, undef, 0.5);
	}
	is(join(',', sort keys %dup), '', 'no activity checked twice in one cluster-wide pass');
	is(($seen{ $recon[0] } // 'missing') . ',' . ($seen{ $recon[1] } // 'missing'),
		'f,t', 'the broken activity fails, the healthy one on the other worker passes');
	my @wrong = grep { $grp{$_} != $group_of{ holder($_) } } keys %grp;
	is("@wrong", '', 'each activity was checked on the node that holds it');
	my %groups = map { $_ => 1 } values %grp;
	is(scalar(keys %groups), 2, 'both workers reported their share');
}

# --- Freeze, unfreeze, close ------------------------------------------------
{
	# (was refused by Citus: now() inside CASE/COALESCE, parameterised by rec)
	($rc, $out, $err) = try_psql($coord, "SELECT redpacket.rp_freeze($ops[0], 'hold')");
	is($err, '', 'rp_freeze through the coordinator');
	is( q_coord("SELECT status FROM redpacket.rp_claim($ops[0], 'f1', 1)"),
		'frozen', 'a frozen activity answers frozen');
	($rc, $out, $err) = try_psql($coord, "SELECT redpacket.rp_unfreeze($ops[0])");
	is($err, '', 'rp_unfreeze through the coordinator');
	($rc, $out, $err) = try_psql($coord, "SELECT redpacket.rp_close_activity($ops[1])");
	is($err, '', 'rp_close_activity through the coordinator');
	is( q_coord("SELECT status FROM redpacket.rp_claim($ops[1], 'c1', 1)"),
		'ended', 'a closed activity answers ended');
}

# --- Campaign changes and the wallet's settlement ---------------------------
# Each is delegated to the node holding the activity and changes its rows
# there; the books of the activity balance afterwards.
{
	my $c = q_coord("SELECT redpacket.rp_create_activity(10.00, stripes => 4, restricted => true)");
	is(q_coord("SELECT redpacket.rp_allow($c, ARRAY['w1', 'w2', 'w3'])"), '3',
		'rp_allow through the coordinator');
	is(q_coord("SELECT redpacket.rp_disallow($c, ARRAY['w3'])"), '1',
		'rp_disallow through the coordinator');
	is( join(',', map { q_coord("SELECT status FROM redpacket.rp_claim($c, '$_', 1.00)") } qw(w1 w2 w3)),
		'claimed,claimed,not_eligible', 'claims follow the list');
	is(q_coord("SELECT redpacket.rp_top_up($c, 2.00)"), '12.00', 'rp_top_up through the coordinator');
	is(q_coord("SELECT redpacket.rp_withdraw($c, 1.00)"), '9.00', 'rp_withdraw through the coordinator');
	($rc, $out, $err) = try_psql($coord,
		"SELECT redpacket.rp_set_window($c, now() - interval '1 hour', NULL, 'moved')");
	is($err, '', 'rp_set_window through the coordinator');
	my ($k1, $k2) = split /\n/,
	  q_coord("SELECT claim_id FROM redpacket.claim WHERE activity_id = $c ORDER BY claim_id");
	is(q_coord("SELECT redpacket.rp_credited($c, ARRAY[$k1]::bigint[], 'paid')"), '1',
		'rp_credited through the coordinator');
	is(q_coord("SELECT redpacket.rp_reverse($c, $k2, 'fraud')"), '1.00',
		'rp_reverse through the coordinator');
	is( q_coord("SELECT string_agg(kind, ',' ORDER BY change_id) FROM redpacket.activity_change"
			  . " WHERE activity_id = $c"),
		'allow,disallow,top_up,withdraw,set_window,reverse', 'each change recorded on its node');
	is(reconcile_ok($c, 'true'), 't', 'a full check of the changed activity passes');
	# The withdrawal is owed to the funder, on the node that holds it.
	my $owed = q_coord("SELECT string_agg(entry_id::text, ',') FROM redpacket.rp_pending_refunds($c)");
	is(q_coord("SELECT kind || ':' || amount FROM redpacket.rp_pending_refunds($c)"),
		'withdraw:1.00', 'rp_pending_refunds through the coordinator');
	is(q_coord("SELECT redpacket.rp_refunded($c, ARRAY[$owed]::bigint[], 'back')"), '1',
		'rp_refunded through the coordinator');
	is(q_coord("SELECT count(*) FROM redpacket.rp_pending_refunds() WHERE activity_id = $c"), '0',
		'nothing owed on any node');
}

# --- Expiry settlement by the worker ---------------------------------------
my $exp = q_coord(
	"SELECT redpacket.rp_create_activity(5.00, 5, ends_at => now() + interval '6 s')");
is(q_coord("SELECT status FROM redpacket.rp_claim($exp, 'e1')"),
	'claimed', 'claim on an activity about to expire');
{
	# A few passes' worth (interval 1 s), not the 180 s of poll_query_until.
	my $closed = 'f';
	sleep 6;
	for (1 .. 8)
	{
		$closed = q_coord("SELECT closed_at IS NOT NULL FROM redpacket.activity WHERE id = $exp");
		last if $closed eq 't';
		sleep 1;
	}
	is($closed, 't', 'the worker on the holding node settles the expired activity');
}
{
	# A failed settlement must leave nothing behind.  Seen on a manual
	# cluster: the worker's pass failed on closing the activity, yet its
	# ledger 'return' entry and zeroed stripes stayed committed.
	is( q_coord(
			"SELECT count(*) FROM redpacket.ledger l JOIN redpacket.activity a ON a.id = l.activity_id"
			  . " WHERE l.activity_id = $exp AND l.kind = 'return' AND a.closed_at IS NULL"),
		'0', 'no returned remainder on an activity still open');
}

# --- 16 clients at once on activities on both workers ----------------------
# 0.07 at a time out of 7.00: exactly 100 claims fit in each.
my $script = "$PostgreSQL::Test::Utils::tmp_check/citus_claim.pgbench";
open my $fh, '>', $script or die $!;
print $fh "\\set u random(1, 1000000000)\n";
print $fh "SELECT status FROM redpacket.rp_claim($fixed[0], 'p' || :client_id || '-' || :u, 0.07);\n";
print $fh "SELECT status FROM redpacket.rp_claim($fixed[1], 'p' || :client_id || '-' || :u, 0.07);\n";
close $fh;
my ($pgb_out, $pgb_err) = ('', '');
IPC::Run::run(
	[
		'pgbench', '-n', '-c', '16', '-j', '2', '-t', '10', '--max-tries=20',
		'-f', $script, '-h', $coord->host, '-p', $cport, 'postgres'
	],
	'>', \$pgb_out, '2>', \$pgb_err);
note $pgb_out;
like($pgb_out, qr/number of transactions actually processed: 160\/160/,
	'16 clients, 160 transactions of two claims each, all processed');

my $foreign = 0;
for my $aid (@fixed)
{
	my $g = $group_of{ holder($aid) };
	$foreign += q_coord(
		"SELECT count(*) FROM redpacket.claim WHERE activity_id = $aid"
		  . " AND user_id LIKE 'p%' AND claim_id >> 48 <> $g");
}
is($foreign, 0,
	'every claim of the concurrent run has an id of its holding node (it was delegated)');

# --- Invariants, per activity ------------------------------------------------
my @all = (@fixed, @lucky, $rain, $pre, @nd);
my $ids = join(',', @all);
is( q_coord(
		"SELECT string_agg(a.id::text, ',') FROM redpacket.activity a"
		  . " WHERE a.id IN ($ids) AND"
		  . " (SELECT coalesce(sum(amount), 0) FROM redpacket.claim c WHERE c.activity_id = a.id)"
		  . " + (SELECT sum(balance) FROM redpacket.stripe s WHERE s.activity_id = a.id)::numeric"
		  . "   / 10 ^ a.scale"
		  . " + (SELECT coalesce(sum(amount), 0) FROM redpacket.ledger l"
		  . "     WHERE l.activity_id = a.id AND l.kind = 'return')"
		  . " <> (SELECT sum(amount) FROM redpacket.ledger l"
		  . "     WHERE l.activity_id = a.id AND l.kind = 'fund')"),
	'', 'claims + stripes + returned = funded, for every activity');
is( q_coord(
		"SELECT count(*) FROM (SELECT activity_id, user_id, idempotency_key"
		  . " FROM redpacket.claim GROUP BY 1, 2, 3 HAVING count(*) > 1) d"),
	'0', 'one claim per key');
is(q_coord("SELECT count(*) FROM redpacket.stripe WHERE balance < 0"),
	'0', 'no negative stripe');
is( q_coord(
		"SELECT string_agg(n::text, ',' ORDER BY activity_id) FROM"
		  . " (SELECT activity_id, count(*) n FROM redpacket.claim"
		  . "   WHERE activity_id IN ($fixed[0], $fixed[1]) GROUP BY 1) c"),
	'100,100', 'exactly 100 claims of 0.07 on each 7.00 activity');
my $recon = '';
for my $aid (@all)
{
	$recon .= reconcile_ok($aid, 'true');
}
is($recon, 't' x @all, 'a full reconciliation of every activity is ok');
is( q_coord(
		"SELECT count(*) FROM redpacket.activity_status WHERE id IN ($ids)"
		  . " AND last_reconcile_ok"),
	scalar(@all), 'the status view shows every activity reconciled ok');

# --- Logs of every node -------------------------------------------------------
my (@dup, @crash);
for my $n (@nodes)
{
	my $log = slurp_file($n->logfile);
	push @dup, $n->name if $log =~ /duplicate key value violates unique constraint "reconciliation_pkey"/;
	push @crash, $n->name if $log =~ /"redpacket reconciler" \(PID \d+\) exited with exit code/;
}
is("@dup", '', 'no colliding reconciliation ids on any node');
is("@crash", '', 'no reconciler crash in any node\'s log');
{
	my @fatal;
	for my $n (@nodes)
	{
		push @fatal, $n->name
		  if slurp_file($n->logfile) =~ /terminated by signal|server process .* exited with exit code [1-9]/;
	}
	is("@fatal", '', 'no server process crashed on any node');
}

done_testing();
