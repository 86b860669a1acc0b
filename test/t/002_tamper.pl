# Tampering behind the extension's back is caught by the worker.  A superuser
# with session_replication_role = replica (which silences the append-only
# triggers) changes a stripe balance, makes a fresh claim row vanish, forges
# a claim row, deletes an old claim, forges a top-up or a withdrawal entry
# in the ledger, or changes the amount of an old top-up.  The next
# incremental pass (or, for the old claim and the old top-up,
# rp_reconcile(id, full_check => true)) records a not-ok row,
# sends NOTIFY redpacket_alert, logs a WARNING and freezes the activity; a
# healthy activity beside it is unaffected.  With
# redpacket.freeze_on_mismatch = off the mismatch is recorded and announced
# but the activity keeps taking claims.  A frozen activity whose books do not
# balance cannot be unfrozen; rp_repair_stripes rebuilds its stripes from the
# ledger and the claims (recorded, still frozen), and after rp_unfreeze it
# pays and passes again.  A stripe put right by hand unfreezes and passes
# again too.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;
use Time::HiRes qw(time usleep);

my $interval = 1;
my $node = RedpacketTest::node(
	'tamper', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = $interval
});
$node->safe_psql('postgres', 'CREATE EXTENSION redpacket');

# New activity of 100.00 in 20 packets on 4 stripes, with $n claims of 1.00.
sub activity
{
	my ($name, $n) = @_;
	my $aid = sql(
		"SELECT redpacket.rp_create_activity(100.00, 20, stripes => 4, name => '$name')"
	);
	sql("SELECT redpacket.rp_claim($aid, '$name-' || g, 1.00) FROM generate_series(1, $n) g"
	);
	return $aid;
}

# Latest reconciliation row of an activity: "ok|drift|expected_claims|actual_claims".
sub last_pass
{
	my ($aid) = @_;
	return sql(
		qq{SELECT ok, drift, expected_claims, actual_claims FROM redpacket.reconciliation
		    WHERE activity_id = $aid ORDER BY pass_id DESC LIMIT 1});
}

sub claim_status
{
	my ($aid, $user) = @_;
	return sql("SELECT status FROM redpacket.rp_claim($aid, '$user', 1.00)");
}

# Wait for the first not-ok row of an activity after pass $after; returns
# the seconds from $t0 (a server timestamp) to that row's checked_at: the
# worker's own delay, not the harness's (psql start-ups on a busy machine).
sub wait_mismatch
{
	my ($aid, $after, $t0) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND pass_id > $after AND NOT ok"
	) or die "no mismatch recorded for activity $aid";
	return sql(qq{SELECT extract(epoch FROM min(checked_at) - '$t0'::timestamptz)
	                FROM redpacket.reconciliation
	               WHERE activity_id = $aid AND pass_id > $after AND NOT ok});
}

sub max_pass { return sql('SELECT coalesce(max(pass_id), 0) FROM redpacket.reconciliation'); }

# The NOTIFY listener: a psql session that LISTENs; psql prints pending
# notifications after each command it runs.
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN redpacket_alert');
my %alerts;    # activity id => [ [payload hash, sender pid, raw payload], ... ]

sub drain_alerts
{
	my $out = $listener->query_safe('SELECT 1');
	while ($out =~
		/Asynchronous notification "redpacket_alert" with payload "(.*?)" received from server process with PID (\d+)\./g
	  )
	{
		my ($payload, $sender) = ($1, $2);
		my $p = decode_json($payload);
		push @{ $alerts{ $p->{activity} } }, [ $p, $sender, $payload ];
	}
}

# Wait (up to 30 s) for an alert about $aid.
sub wait_alert
{
	my ($aid) = @_;
	for (1 .. 300)
	{
		drain_alerts();
		return $alerts{$aid}[0] if $alerts{$aid};
		usleep(100_000);
	}
	return undef;
}

my $stripe_tamper = activity('stripe', 5);     # A: stripe balance changed
my $healthy = activity('healthy', 5);          # B: left alone
my $old_claim = activity('oldclaim', 5);       # C: an old claim deleted
my $vanished = activity('vanished', 5);        # D: a fresh claim row vanishes
my $forged = activity('forged', 5);            # E: a claim row forged
my $top_up = activity('topup', 5);             # F: a top-up entry forged
my $withdraw = activity('withdraw', 5);        # G: a withdrawal entry forged
my $old_top_up = activity('oldtopup', 5);      # H: an old top-up's amount changed
# H was topped up by 10.00 and 2 packets the way rp_top_up does it
sql(qq{
SET session_replication_role = replica;
INSERT INTO redpacket.ledger (activity_id, kind, amount, packets, reason)
VALUES ($old_top_up, 'top_up', 10.00, 2, 'more');
UPDATE redpacket.stripe SET balance = balance + 250, packets = packets + CASE WHEN stripe < 2 THEN 1 ELSE 0 END
 WHERE activity_id = $old_top_up;
});

for my $aid ($stripe_tamper, $healthy, $old_claim, $vanished, $forged, $top_up, $withdraw,
	$old_top_up)
{
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND ok AND expected_claims = 5"
		),
		"activity $aid reconciled ok before tampering");
}
my $launcher_pid = sql(
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'redpacket launcher'");
drain_alerts();
is(scalar(keys %alerts), 0, 'no alert while everything is healthy');

# --- Tamper: stripe balance, vanished claim, forged claim --------------------

my $log_offset = -s $node->logfile;
my $before = max_pass();
my $t0 = sql('SELECT clock_timestamp()');
sql(qq{
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 5
 WHERE activity_id = $stripe_tamper
   AND stripe = (SELECT min(stripe) FROM redpacket.stripe
                  WHERE activity_id = $stripe_tamper AND balance >= 5);
});
sql(qq{
BEGIN;
SELECT redpacket.rp_claim($vanished, 'ghost', 1.00);
SET LOCAL session_replication_role = replica;
DELETE FROM redpacket.claim WHERE activity_id = $vanished AND user_id = 'ghost';
COMMIT;
});
sql(qq{
SET session_replication_role = replica;
INSERT INTO redpacket.claim (activity_id, user_id, idempotency_key, amount, stripe, claimed_at)
VALUES ($forged, 'forger', '', 7.00, 0, now());
});
sql(qq{
SET session_replication_role = replica;
INSERT INTO redpacket.ledger (activity_id, kind, amount, packets, reason)
VALUES ($top_up, 'top_up', 3.00, NULL, 'forged');
INSERT INTO redpacket.ledger (activity_id, kind, amount, reason)
VALUES ($withdraw, 'withdraw', 2.00, 'forged');
});

my $limit = 2 * $interval + 3;    # two intervals, plus slack for a busy machine
for my $case ([ $stripe_tamper, 'stripe balance changed' ],
	[ $vanished, 'fresh claim row vanished' ],
	[ $forged, 'claim row forged' ],
	[ $top_up, 'top-up entry forged' ],
	[ $withdraw, 'withdrawal entry forged' ])
{
	my ($aid, $what) = @$case;
	my $secs = wait_mismatch($aid, $before, $t0);
	cmp_ok($secs, '<=', $limit,
		sprintf("$what: flagged by the worker within two intervals (%.1f s)", $secs));
}

is(last_pass($stripe_tamper), 'f|-0.05|5|5',
	'stripe balance changed: not-ok row with drift -0.05, claim counts agree');
is(last_pass($vanished), 'f|-1.00|5|6',
	'vanished claim: drift -1.00, stripes count one claim more than the claim table');
is(last_pass($forged), 'f|7.00|6|5',
	'forged claim: drift +7.00, claim table has one claim the stripes never paid');
is(last_pass($top_up), 'f|-3.00|5|5',
	'forged top-up: drift -3.00, the ledger funds money no stripe holds');
is(last_pass($withdraw), 'f|2.00|5|5',
	'forged withdrawal: drift +2.00, the stripes hold money the ledger says went back');

for my $aid ($stripe_tamper, $vanished, $forged, $top_up, $withdraw)
{
	is( sql(qq{SELECT state, last_reconcile_ok, frozen_reason LIKE 'reconciliation mismatch%'
	             FROM redpacket.activity_status WHERE id = $aid}),
		'frozen|f|t', "activity $aid is frozen by the mismatch");
	is(claim_status($aid, 'newcomer'), 'frozen', "activity $aid: rp_claim returns frozen");
	like(
		$node->wait_for_log(
			qr/WARNING:  redpacket reconciliation of activity $aid failed/, $log_offset),
		qr/^\d+$/,
		"activity $aid: WARNING in the server log");
	my $alert = wait_alert($aid);
	ok($alert, "activity $aid: NOTIFY redpacket_alert received by a listener");
	# reconcilers are short-lived: the alert's sender is the process that
	# logged the failure, a reconciler (no client session runs a pass here)
	like(
		slurp_file($node->logfile, $log_offset),
		qr/\[$alert->[1]\] WARNING:  redpacket reconciliation of activity $aid failed/,
		"activity $aid: the alert came from the reconciler that logged the failure")
	  if $alert;
}
like(
	slurp_file($node->logfile, $log_offset),
	qr/WARNING:  redpacket reconciliation of activity $stripe_tamper failed\n.*DETAIL:  Expected balance 95\.00, stripes hold 94\.95 \(drift -0\.05\)/,
	'the WARNING details expected, actual and drift');

my $first_alert = wait_alert($stripe_tamper);
like($first_alert->[2], qr/"activity":$stripe_tamper,/, 'alert payload names the activity');
like($first_alert->[2], qr/"database":"postgres",/, 'alert payload names the database');
like($first_alert->[2], qr/"expected":95\.00,"actual":94\.95,"drift":-0\.05,/,
	'alert payload carries expected, actual and drift');
like($first_alert->[2], qr/"frozen":true,"problems":\["money"\],/,
	'alert payload says what failed and that the activity is frozen');
like($first_alert->[2], qr/"kind":"mismatch",/,
	'alert payload says the books are wrong (not: could not check)');
like($first_alert->[2], qr/"checks":\{"money":\{"expected":95\.00,"actual":94\.95\}\}/,
	'alert payload gives expected and actual of each failed check');
ok( $first_alert->[0]{pass_id} && $first_alert->[0]{checked_at},
	'alert payload names the pass and its time');
is( sql(qq{SELECT ok FROM redpacket.reconciliation
            WHERE activity_id = $stripe_tamper AND pass_id = $first_alert->[0]{pass_id}}),
	'f', 'alert pass_id points at the not-ok row');

# The healthy activity beside them is untouched.
is(last_pass($healthy), 't|0.00|5|5', 'healthy activity: latest pass still ok');
is( sql("SELECT count(*) FROM redpacket.reconciliation WHERE activity_id = $healthy AND NOT ok"),
	'0', 'healthy activity: never a not-ok row');
is( sql("SELECT state, frozen_reason IS NULL FROM redpacket.activity_status WHERE id = $healthy"),
	'active|t', 'healthy activity: not frozen');
is(claim_status($healthy, 'newcomer'), 'claimed', 'healthy activity: still claimable');
ok( $node->poll_query_until(
		'postgres',
		"SELECT claim_count = 6 FROM redpacket.reconcile_state WHERE activity_id = $healthy"),
	'healthy activity: the worker counts its new claim');
is(last_pass($healthy), 't|0.00|6|6', 'healthy activity: and that pass is ok');
drain_alerts();
ok(!$alerts{$healthy}, 'healthy activity: no alert');

# --- An old claim deleted: the full check re-sums and catches it ------------

$log_offset = -s $node->logfile;
sql(qq{
SET session_replication_role = replica;
DELETE FROM redpacket.claim
 WHERE activity_id = $old_claim
   AND claim_id = (SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = $old_claim);
});
sleep 2 * $interval;    # incremental passes go by; only the full check must catch it

# A worker pass may hold the reconciliation lock at this instant, in which
# case rp_reconcile returns no row at once: try again.
my $full = '';
for (1 .. 100)
{
	$full = sql(
		qq{SELECT full_check, ok, drift, expected_claims, actual_claims, new_claims
		     FROM redpacket.rp_reconcile($old_claim, full_check => true)});
	last if $full ne '';
	usleep(100_000);
}
is($full, 't|f|-1.00|4|5|4',
	'deleted old claim: full check re-sums all claims and reports drift -1.00');
is( sql(qq{SELECT state, last_reconcile_ok FROM redpacket.activity_status WHERE id = $old_claim}),
	'frozen|f', 'deleted old claim: activity frozen');
is(claim_status($old_claim, 'newcomer'), 'frozen', 'deleted old claim: rp_claim returns frozen');
ok($node->wait_for_log(qr/WARNING:  redpacket reconciliation of activity $old_claim failed/,
		$log_offset),
	'deleted old claim: WARNING in the server log');
ok(wait_alert($old_claim), 'deleted old claim: NOTIFY redpacket_alert received');
my $again = '';
for (1 .. 100)
{
	$again = sql(
		"SELECT ok, drift, expected_claims, actual_claims FROM redpacket.rp_reconcile($old_claim)");
	last if $again ne '';
	usleep(100_000);
}
is($again, 'f|-1.00|4|5',
	'deleted old claim: a later pass over it keeps reporting it');

# --- An old top-up's amount changed: the full check catches it ---------------

$log_offset = -s $node->logfile;
sql(qq{
SET session_replication_role = replica;
UPDATE redpacket.ledger SET amount = 12.00 WHERE activity_id = $old_top_up AND kind = 'top_up';
});
sleep 2 * $interval;    # incremental passes go by: the entry is not new
is(sql("SELECT frozen_reason IS NULL FROM redpacket.activity WHERE id = $old_top_up"),
	't', 'changed old top-up: incremental passes do not re-read old entries');
$full = '';
for (1 .. 100)
{
	$full = sql(
		qq{SELECT full_check, ok, drift, problems FROM redpacket.rp_reconcile($old_top_up, full_check => true)});
	last if $full ne '';
	usleep(100_000);
}
is($full, 't|f|-2.00|{money}', 'changed old top-up: the full check reports drift -2.00');
is(sql("SELECT state FROM redpacket.activity_status WHERE id = $old_top_up"),
	'frozen', 'changed old top-up: activity frozen');
ok(wait_alert($old_top_up), 'changed old top-up: NOTIFY redpacket_alert received');

# --- Frozen books stay frozen until they are repaired -------------------------
# rp_unfreeze of an activity the reconciler froze needs a full check that
# passes now; rp_repair_stripes rebuilds the stripes from the ledger and the
# claims, records it, and leaves the activity frozen until rp_unfreeze.

for my $case ([ $vanished, 'vanished claim', 'money', 'claims' ],
	[ $forged, 'forged claim', 'money', 'claims' ],
	[ $old_claim, 'deleted old claim', 'money', 'claims' ])
{
	my ($aid, $what, @failed) = @$case;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET client_min_messages = error; SELECT redpacket.rp_unfreeze($aid)");
	isnt($ret, 0, "$what: rp_unfreeze refuses while the books do not balance");
	like($err, qr/ERROR:  activity $aid cannot be unfrozen: its books do not balance/,
		"$what: with the reason");
	like($err, qr/DETAIL:  A full check now fails: \Q$failed[0]\E \(.*\Q$failed[1]\E \(/,
		"$what: and the checks that failed (@failed)");
	is(claim_status($aid, 'while-frozen'), 'frozen', "$what: claims still answer frozen");

	my $before = max_pass();
	is( sql(qq{SET client_min_messages = error;
	           SELECT ok, full_check FROM redpacket.rp_repair_stripes($aid, '$what: claim rows verified')}),
		't|t', "$what: rp_repair_stripes rebuilds the stripes and the full check passes");
	is( sql(qq{SELECT kind, changed_by = current_user, reason FROM redpacket.activity_change
	            WHERE activity_id = $aid AND kind = 'repair'}),
		"repair|t|$what: claim rows verified", "$what: the repair is recorded, with who and why");
	is(sql(RedpacketTest::books_view() . "SELECT balanced FROM rp_books WHERE id = $aid"),
		't', "$what: the books balance");
	is(sql("SELECT state FROM redpacket.activity_status WHERE id = $aid"),
		'frozen', "$what: still frozen after the repair");
	is(claim_status($aid, 'while-frozen'), 'frozen', "$what: claims answer frozen until rp_unfreeze");
	sql("SELECT redpacket.rp_unfreeze($aid)");
	is(claim_status($aid, 'after-repair'), 'claimed', "$what: unfrozen, it pays again");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $aid AND pass_id > $before AND expected_claims = actual_claims AND ok AND new_claims > 0"),
		"$what: the worker's next pass counts the new claim, ok");
	is( sql("SELECT count(*) FROM redpacket.reconciliation WHERE activity_id = $aid AND pass_id > $before AND NOT ok"),
		'0', "$what: no check failed since the repair");
}

# --- Repair, unfreeze: passes are clean again ---------------------------------

$before = max_pass();    # before the repair: the worker may pass at once
sql(qq{
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance + 5
 WHERE activity_id = $stripe_tamper
   AND stripe = (SELECT min(stripe) FROM redpacket.stripe
                  WHERE activity_id = $stripe_tamper AND balance >= 0);
});
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $stripe_tamper AND pass_id > $before AND ok"
	),
	'repaired activity: the next pass is ok');
sql("SELECT redpacket.rp_unfreeze($stripe_tamper)");
$before = max_pass();
is(claim_status($stripe_tamper, 'after-repair'), 'claimed',
	'repaired and unfrozen activity takes claims again');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $stripe_tamper AND pass_id > $before"
	),
	'repaired activity: passed again after the new claim');
is(last_pass($stripe_tamper), 't|0.00|6|6', 'repaired activity: ok with 6 claims');
is(sql("SELECT state FROM redpacket.activity_status WHERE id = $stripe_tamper"),
	'active', 'repaired activity: stays unfrozen');

# --- freeze_on_mismatch = off: recorded and announced, not frozen --------------

my $unfrozen = activity('nofreeze', 5);
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) > 0 FROM redpacket.reconciliation WHERE activity_id = $unfrozen AND ok AND expected_claims = 5"
	),
	'nofreeze activity reconciled ok');
$log_offset = -s $node->logfile;
sql('ALTER SYSTEM SET redpacket.freeze_on_mismatch = off');
$node->reload;
$node->wait_for_log(qr/parameter "redpacket.freeze_on_mismatch" changed to "off"/,
	$log_offset);
sleep 2 * $interval;    # the worker reloads on its next wake-up

$before = max_pass();
$t0 = sql('SELECT clock_timestamp()');
sql(qq{
SET session_replication_role = replica;
UPDATE redpacket.stripe SET balance = balance - 3
 WHERE activity_id = $unfrozen
   AND stripe = (SELECT min(stripe) FROM redpacket.stripe
                  WHERE activity_id = $unfrozen AND balance >= 3);
});
my $secs = wait_mismatch($unfrozen, $before, $t0);
cmp_ok($secs, '<=', $limit,
	sprintf('freeze_on_mismatch off: mismatch flagged within two intervals (%.1f s)', $secs));
is(last_pass($unfrozen), 'f|-0.03|5|5', 'freeze_on_mismatch off: mismatch recorded');
is( sql("SELECT state, frozen_reason IS NULL, last_reconcile_ok FROM redpacket.activity_status WHERE id = $unfrozen"),
	'active|t|f', 'freeze_on_mismatch off: activity not frozen');
is(claim_status($unfrozen, 'newcomer'), 'claimed',
	'freeze_on_mismatch off: activity still claimable');
ok($node->wait_for_log(qr/WARNING:  redpacket reconciliation of activity $unfrozen failed/,
		$log_offset),
	'freeze_on_mismatch off: WARNING still logged');
ok(wait_alert($unfrozen), 'freeze_on_mismatch off: alert still sent');

# A session calling rp_reconcile itself follows the setting too.
my $manual = '';
for (1 .. 100)
{
	$manual = sql("SELECT ok FROM redpacket.rp_reconcile($unfrozen)");
	last if $manual ne '';
	usleep(100_000);
}
is($manual, 'f', 'freeze_on_mismatch off: rp_reconcile reports the mismatch');
is(sql("SELECT frozen_reason IS NULL FROM redpacket.activity WHERE id = $unfrozen"),
	't', 'freeze_on_mismatch off: rp_reconcile does not freeze either');

# Nothing crashed along the way.
ok(!$node->log_contains(qr/PANIC|terminated by signal|server process .* was terminated/, 0),
	'no crash in the server log');
is(sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'redpacket launcher'"),
	$launcher_pid, 'the launcher never restarted');

$listener->quit;
$node->stop('fast');
done_testing();
