# The roles the documentation describes are the roles the extension makes:
# doc/security.md's list of what rp_grant_app, rp_grant_operator, rp_grant_wallet
# and rp_grant_sender grant is exactly the rows of redpacket.role_grant, and a role granted with
# them holds exactly those privileges on redpacket's objects (and USAGE on
# the schema), nothing more.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('roles');

sql('CREATE EXTENSION redpacket');
sql("CREATE ROLE app; CREATE ROLE ops; CREATE ROLE wallet_svc; CREATE ROLE sender_svc;
     SELECT redpacket.rp_grant_app('app'), redpacket.rp_grant_operator('ops'),
            redpacket.rp_grant_wallet('wallet_svc'), redpacket.rp_grant_sender('sender_svc')");

# The documented list: the sql block of doc/security.md that grants USAGE to app.
my ($block) = RedpacketTest::repo_file('doc/security.md')
  =~ /```sql\n((?:(?!```).)*GRANT USAGE ON SCHEMA redpacket TO app;(?:(?!```).)*)```/s;
ok($block, 'doc/security.md lists what the grant helpers grant');
my %kind = (app => 'app', ops => 'operator', wallet_svc => 'wallet', sender_svc => 'sender');
my @readme = sort map { /^GRANT (.+) TO (app|ops|wallet_svc|sender_svc);$/ ? ("$kind{$2} $1") : () }
  grep { !/^GRANT USAGE ON SCHEMA/ } split /\n/, $block // '';
my @usage = sort grep { /^GRANT USAGE ON SCHEMA redpacket TO (app|ops|wallet_svc|sender_svc);$/ } split /\n/, $block // '';
is(scalar(@usage), 4, 'with USAGE on the schema for the four roles');
is( join("\n", @readme),
	sql(q{SELECT string_agg(role_kind || ' ' || privilege, E'\n' ORDER BY role_kind || ' ' || privilege)
	        FROM redpacket.role_grant}),
	'the documented list is exactly redpacket.role_grant');

# What each role holds on redpacket's functions, tables, views and schema,
# against what role_grant lists for its kind (and USAGE on the schema).
my $diff_q = q{
WITH want AS (
    SELECT CASE g.role_kind WHEN 'app' THEN 'app' WHEN 'wallet' THEN 'wallet_svc'
                            WHEN 'sender' THEN 'sender_svc' ELSE 'ops' END AS rolname,
           split_part(g.privilege, ' ', 1) AS priv,
           CASE WHEN g.privilege ~ '^\w+ ON (FUNCTION|PROCEDURE) '
                THEN regexp_replace(g.privilege, '^\w+ ON (FUNCTION|PROCEDURE) ', '')::regprocedure::oid
                ELSE regexp_replace(g.privilege, '^\w+ ON ', '')::regclass::oid END AS obj
      FROM redpacket.role_grant g WHERE g.role_kind IN ('app', 'operator', 'wallet', 'sender')
    UNION ALL
    SELECT r, 'USAGE', 'redpacket'::regnamespace::oid FROM unnest(ARRAY['app', 'ops', 'wallet_svc', 'sender_svc']) r),
have AS (
    SELECT r.rolname, a.privilege_type AS priv, p.oid AS obj
      FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
     WHERE p.pronamespace = 'redpacket'::regnamespace
    UNION ALL
    SELECT r.rolname, a.privilege_type, c.oid
      FROM pg_class c, aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
     WHERE c.relnamespace = 'redpacket'::regnamespace
    UNION ALL
    SELECT r.rolname, a.privilege_type, n.oid
      FROM pg_namespace n, aclexplode(n.nspacl) a JOIN pg_roles r ON r.oid = a.grantee
     WHERE n.nspname = 'redpacket')
SELECT coalesce(string_agg(x, ', ' ORDER BY x), '')
  FROM ((SELECT 'missing ' || rolname || ' ' || priv || ' ' || obj FROM want
         EXCEPT SELECT 'missing ' || rolname || ' ' || priv || ' ' || obj FROM have)
        UNION ALL
        (SELECT 'extra ' || rolname || ' ' || priv || ' ' || obj FROM have WHERE rolname IN ('app', 'ops', 'wallet_svc', 'sender_svc')
         EXCEPT SELECT 'extra ' || rolname || ' ' || priv || ' ' || obj FROM want)) d(x)};
is(sql($diff_q), '', 'rp_grant_app, rp_grant_operator, rp_grant_wallet and rp_grant_sender grant exactly what role_grant lists');
is( sql(q{SELECT count(*) FROM redpacket.role_grant WHERE role_kind = 'operator'
            AND privilege = 'EXECUTE ON PROCEDURE redpacket.rp_reconcile_strict(boolean, interval)'}),
	'1', 'the operator gets rp_reconcile_strict, the scheduler\'s form');

$node->stop;
done_testing();
