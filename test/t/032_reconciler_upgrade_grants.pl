# The update to 1.4 makes rp_activity_stats (new columns), its view
# activity_stats and rp_reconcile_strict (a lock_wait argument) again, and
# 1.5 the counters once more.  An operator role granted them by
# rp_grant_operator under 1.3 gets them back, with what 1.4 and 1.5 add
# (rp_verify, reconcile_problem, rp_launcher_running), from rp_regrant() after
# ALTER EXTENSION UPDATE, reads the new counters and runs the strict pass as
# before, and a dump of the database restores those grants.
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

# The update itself grants nothing (a grant made by an update script would
# be an initial privilege of the extension, which pg_dump leaves out, so a
# restore would lose it): rp_regrant(), in the same transaction, gives the
# operator what rp_grant_operator grants in 1.4.
sql('ALTER EXTENSION redpacket UPDATE');
is(sql("SELECT extversion = default_version FROM pg_extension, pg_available_extensions WHERE extname = 'redpacket' AND name = extname"),
	't', 'updated to the default version');
my $privs14_q = q{
SELECT has_table_privilege('op', 'redpacket.activity_stats', 'SELECT'),
       has_function_privilege('op', 'redpacket.rp_activity_stats()', 'EXECUTE'),
       has_function_privilege('op', 'redpacket.rp_reconcile_strict(boolean, interval)', 'EXECUTE'),
       has_function_privilege('op', 'redpacket.rp_verify(bigint, boolean)', 'EXECUTE')};
is(sql($privs14_q), 'f|f|f|f', 'the objects 1.4 makes again come without grants');
is(sql("SELECT string_agg(role || ':' || kind, ',') FROM redpacket.rp_regrant()"),
	'op:operator', 'rp_regrant finds the operator');
is(sql($privs14_q), 't|t|t|t', 'rp_regrant gives it the counters, the strict pass and rp_verify');
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT claimed, busy, not_eligible, scope FROM redpacket.activity_stats WHERE activity_id = 1",
	extra_params => [ '-U', 'op' ]);
is($out, '1|0|0|activity', 'the operator reads the new counters') or diag $err;
($rc, $out, $err) = $node->psql('postgres', 'CALL redpacket.rp_reconcile_strict()',
	extra_params => [ '-U', 'op' ]);
is($rc, 0, 'the operator runs the strict pass') or diag $err;
($rc, $out, $err) = $node->psql('postgres',
	'SELECT ok FROM redpacket.rp_verify(1); SELECT count(*) FROM redpacket.reconcile_problem',
	extra_params => [ '-U', 'op' ]);
is($out, "t\n0", 'and rp_verify, reconcile_problem') or diag $err;
($rc, $out, $err) = $node->psql('postgres',
	'SELECT launcher_running FROM redpacket.reconciler_status',
	extra_params => [ '-U', 'op' ]);
is($out, 't', 'and reconciler_status, whose launcher_running it reads from shared memory')
  or diag $err;

# The grants survive pg_dump and pg_restore into a new database.
my $dump = $node->basedir . '/upgraded.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
	'pg_dump of the updated database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database');
my $restored = $privs14_q =~ s/\n/ /gr;
is($node->safe_psql('restored', $restored), 't|t|t|t',
	'the restored database gives the operator the same');

$node->stop;
done_testing();
