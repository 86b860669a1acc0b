# The books can be verified where rp_reconcile cannot run.  On a streaming
# standby rp_reconcile refuses (read-only), and rp_verify returns the rows
# of rp_reconcile's checks for every activity, or one: ok where the books
# balance, the mismatch of an activity tampered with on the primary (full
# check, the default, and from the watermark), the incomplete activity, all
# without a pass id; on the primary it runs inside a READ ONLY transaction
# and at REPEATABLE READ, and writes nothing anywhere: no reconciliation
# row, no watermark, no freeze, no settlement of an expired activity.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
});
$primary->start;
RedpacketTest::use_node($primary);

sql('CREATE EXTENSION redpacket');
my $good = sql("SELECT redpacket.rp_create_activity(50.00, 10, stripes => 4, name => 'good')");
my $bad = sql("SELECT redpacket.rp_create_activity(20.00, 10, stripes => 2, name => 'bad')");
my $expired = sql(q{SELECT redpacket.rp_create_activity(5.00, stripes => 1, name => 'expired',
                     starts_at => now() - interval '2 hours', ends_at => now() - interval '1 hour')});
sql("SELECT redpacket.rp_claim($good, 'u' || g, 2.50) FROM generate_series(1, 3) g");
sql("SELECT redpacket.rp_claim($bad, 'u' || g, 1.00) FROM generate_series(1, 2) g");
# the good and the bad are checked once (a watermark); the expired one not
sql("SELECT count(*) FROM redpacket.rp_reconcile($good)");
sql("SELECT count(*) FROM redpacket.rp_reconcile($bad)");
# then the bad one loses 0.30 behind the extension's back
sql("SET session_replication_role = replica;
     UPDATE redpacket.stripe SET balance = balance - 30 WHERE activity_id = $bad AND stripe = 0");

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

sub sq { return $standby->safe_psql('postgres', $_[0]); }
my $rows_q = 'SELECT count(*) FROM redpacket.reconciliation';
my $rows_before = sql($rows_q);

is(sq('SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
my ($rc, $out, $err) = $standby->psql('postgres', 'SELECT * FROM redpacket.rp_reconcile()');
like($err, qr/cannot execute rp_reconcile\(\) in a read-only transaction/,
	'rp_reconcile refuses on the standby');

is( sq(qq{SELECT string_agg(activity_id || ':' || ok || ':' || full_check || ':' || (pass_id IS NULL)
                           || ':' || coalesce(drift::text, '-') || ':' || array_to_string(problems, '+'),
                           ' ' ORDER BY activity_id)
           FROM redpacket.rp_verify()}),
	"$good:true:true:true:0.00: $bad:false:true:true:-0.30:money $expired:true:true:true:0.00:",
	'rp_verify on the standby: every activity, the tampered one fails, no pass ids');
is( sq("SELECT ok, drift, new_claims FROM redpacket.rp_verify($bad, false)"),
	'f|-0.30|0', 'from the watermark too (full_check => false)');
is( sq("SELECT ok, expected_claims, actual_claims FROM redpacket.rp_verify($good)"),
	't|3|3', 'one activity, by default a full check');
($rc, $out, $err) = $standby->psql('postgres', 'SELECT * FROM redpacket.rp_verify(999999)');
like($err, qr/activity 999999 does not exist/, 'an unknown activity is an error');

# an activity the standby cannot fully see (a stripe row gone on the primary)
sql(qq{SET session_replication_role = replica;
      DELETE FROM redpacket.stripe WHERE activity_id = $good AND stripe = 3});
$primary->wait_for_catchup($standby);
is( sq("SELECT ok, problems, error FROM redpacket.rp_verify($good)"),
	'f|{incomplete}|It has 3 of its 4 stripe rows.', 'an incomplete activity is reported, not checked');

# on the primary: inside READ ONLY, and at REPEATABLE READ
is( sql(qq{BEGIN READ ONLY;
          SELECT string_agg(activity_id || ':' || ok, ' ' ORDER BY activity_id) FROM redpacket.rp_verify();
          COMMIT;}),
	"$good:false $bad:false $expired:true", 'rp_verify inside a READ ONLY transaction on the primary');
is( sql(qq{BEGIN ISOLATION LEVEL REPEATABLE READ;
          SELECT count(*) FROM redpacket.rp_verify();
          COMMIT;}),
	'3', 'and at REPEATABLE READ');

# nothing written by any of it
is(sql($rows_q), $rows_before, 'no reconciliation row written');
is( sql(qq{SELECT count(*) FILTER (WHERE frozen_reason IS NOT NULL), count(*) FILTER (WHERE closed_at IS NOT NULL)
            FROM redpacket.activity}),
	'0|0', 'nothing frozen, the expired activity not settled');
is( sql("SELECT count(*) FROM redpacket.reconcile_state WHERE last_pass_at IS NOT NULL"),
	'2', 'no watermark moved (two checked before, by rp_reconcile)');

$standby->stop;
$primary->stop;
done_testing();
