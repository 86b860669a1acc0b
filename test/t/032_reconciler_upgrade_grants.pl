# The update to 1.4 makes rp_activity_stats (new columns), its view
# activity_stats and rp_reconcile_strict (a lock_wait argument) again: an
# operator role granted them by rp_grant_operator under 1.3 keeps them
# after ALTER EXTENSION UPDATE, and reads the new counters and runs the
# strict pass as before; rp_grant_operator run again grants what 1.4 adds
# (rp_verify, reconcile_problem).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node(
	'upgrade_grants', q{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 0
});

sql(q{
CREATE EXTENSION redpacket VERSION '1.3';
CREATE ROLE op LOGIN;
SELECT redpacket.rp_grant_operator('op');
SELECT redpacket.rp_claim(redpacket.rp_create_activity(10.00, 10, stripes => 2), 'u', 1.00);
});
my $privs_q = q{
SELECT has_table_privilege('op', 'redpacket.activity_stats', 'SELECT'),
       has_function_privilege('op', 'redpacket.rp_activity_stats()', 'EXECUTE'),
       has_function_privilege('op', to_regprocedure('redpacket.rp_reconcile_strict(boolean)')
                                    ::regproc::oid, 'EXECUTE')};
is(sql($privs_q), 't|t|t', '1.3: the operator has the counters and the strict pass');

sql('ALTER EXTENSION redpacket UPDATE');
is(sql("SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"), '1.4', 'updated to 1.4');
is( sql(q{
SELECT has_table_privilege('op', 'redpacket.activity_stats', 'SELECT'),
       has_function_privilege('op', 'redpacket.rp_activity_stats()', 'EXECUTE'),
       has_function_privilege('op', 'redpacket.rp_reconcile_strict(boolean, interval)', 'EXECUTE')}),
	't|t|t', '1.4: the operator kept them through the update');
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT claimed, busy, not_eligible, scope FROM redpacket.activity_stats WHERE activity_id = 1",
	extra_params => [ '-U', 'op' ]);
is($out, '1|0|0|activity', 'the operator reads the new counters') or diag $err;
($rc, $out, $err) = $node->psql('postgres', 'CALL redpacket.rp_reconcile_strict()',
	extra_params => [ '-U', 'op' ]);
is($rc, 0, 'the operator runs the strict pass') or diag $err;
is( sql(q{SELECT has_function_privilege('op', 'redpacket.rp_verify(bigint, boolean)', 'EXECUTE')}),
	'f', 'what 1.4 adds is not granted by the update');
sql("SELECT redpacket.rp_grant_operator('op')");
($rc, $out, $err) = $node->psql('postgres',
	'SELECT ok FROM redpacket.rp_verify(1); SELECT count(*) FROM redpacket.reconcile_problem',
	extra_params => [ '-U', 'op' ]);
is($out, "t\n0", 'rp_grant_operator again grants it: rp_verify, reconcile_problem') or diag $err;

$node->stop;
done_testing();
