# The worker runs full checks on its own.  Incremental passes read only
# claims past the watermark, so an old claim deleted behind the extension's
# back (session_replication_role = replica silences the append-only
# trigger) is invisible to them; with redpacket.full_check_interval the
# worker re-sums every claim of each activity within that interval, a share
# per pass, and flags it without anyone calling rp_reconcile.  The status
# views say when each activity was last fully checked.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node(
	'full_check', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 1
redpacket.full_check_interval = 0
});

sql('CREATE EXTENSION redpacket');
my @ids = map {
	sql("SELECT redpacket.rp_create_activity(10.00, 10, stripes => 2, name => 'a$_')")
} 1 .. 4;
my $aid = $ids[0];
sql(qq{SELECT redpacket.rp_claim(a, 'u' || g, 1.00)
         FROM unnest('{@{[join ',', @ids]}}'::bigint[]) a, generate_series(1, 3) g});
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 4 FROM redpacket.reconcile_state WHERE claim_count = 3"),
	'the worker counted every claim');
is(sql("SELECT count(*) FROM redpacket.reconciliation WHERE full_check"),
	'0', 'with full_check_interval = 0 the worker makes no full check');

# An old claim, already counted, deleted behind the extension's back.
sql(qq{SET session_replication_role = replica;
       DELETE FROM redpacket.claim WHERE activity_id = $aid
          AND claim_id = (SELECT min(claim_id) FROM redpacket.claim WHERE activity_id = $aid)});
sleep 3;
is(sql("SELECT frozen_reason IS NULL FROM redpacket.activity WHERE id = $aid"),
	't', 'incremental passes do not see it');

# Full checks on: within the interval the worker alone flags it.
$node->append_conf('postgresql.conf', 'redpacket.full_check_interval = 4');
$node->reload;
ok( $node->poll_query_until('postgres',
		"SELECT frozen_reason IS NOT NULL FROM redpacket.activity WHERE id = $aid"),
	'the worker flagged the deleted claim on its own');
is( sql(qq{SELECT full_check, ok, problems, drift FROM redpacket.reconciliation
            WHERE activity_id = $aid AND NOT ok ORDER BY pass_id LIMIT 1}),
	't|f|{money,packets,claims}|-1.00', 'by a full check: money, packets and claims fail');

# Every activity gets its full check, spread over passes.  (Its first
# check, which summed every claim from no watermark, already set
# last_full_check_at: wait for the full checks themselves.)
ok( $node->poll_query_until('postgres',
		"SELECT count(DISTINCT activity_id) = 4 FROM redpacket.reconciliation WHERE full_check"),
	'every activity was fully checked');
is(sql("SELECT count(*) FROM redpacket.reconcile_state WHERE last_full_check_at IS NOT NULL"),
	'4', 'and its last_full_check_at says so');
is( sql(qq{SELECT count(*) FROM redpacket.activity_status
            WHERE last_full_check_at IS NOT NULL AND last_full_check_at <= now()}),
	'4', 'activity_status says when each activity was last fully checked');
is( sql(qq{SELECT last_full_check_at = (SELECT min(last_full_check_at) FROM redpacket.reconcile_state)
             FROM redpacket.reconciler_status}),
	't', 'reconciler_status.last_full_check_at is the oldest of them');
is( sql(q{SELECT database = current_database(), last_pass_finished_at >= last_pass_started_at,
                 next_due_at > last_pass_finished_at, activities_checked >= 0
            FROM redpacket.reconciler_status}),
	't|t|t|t', 'reconciler_status describes the last pass and the next');
# spread: the first full checks of the four came over several passes
is( sql(q{SELECT max(f) - min(f) > interval '0.5 s'
            FROM (SELECT min(checked_at) AS f FROM redpacket.reconciliation
                   WHERE full_check GROUP BY activity_id) p}),
	't', 'no pass re-summed every activity at once');

$node->stop;
done_testing();
