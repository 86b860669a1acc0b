# A non-superuser database owner must not be able to make a superuser run its
# code through the extension's SQL objects:
#  - CREATE EXTENSION / ALTER EXTENSION UPDATE refuse a schema "redpacket"
#    that a non-superuser owns or may create objects in (the owner could add
#    operators or overloads beside the extension's, and the install script's
#    CHECK constraints or our calls would bind to them);
#  - rp_reconcile_strict, a SECURITY INVOKER procedure (it commits, so it
#    cannot pin search_path with SET), resolves nothing through the caller's
#    search_path: a database-level search_path naming a schema with a type
#    "text" and an assignment cast must not run the owner's cast function.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node('capture', "shared_preload_libraries = 'redpacket'\n"
	  . "redpacket.reconcile_interval = 0\n");
my $new = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'redpacket'");

sub is_super
{
	my ($role) = @_;
	return $node->safe_psql('postgres',
		"SELECT rolsuper FROM pg_roles WHERE rolname = '$role'");
}

# 1. A schema the database owner created beforehand.
$node->safe_psql('postgres', q{
	CREATE ROLE m1 LOGIN;
	CREATE DATABASE pre OWNER m1;
});
$node->safe_psql('pre', 'SET ROLE m1; CREATE SCHEMA redpacket;');
my ($rc, $out, $err) = $node->psql('pre', 'CREATE EXTENSION redpacket');
isnt($rc, 0, 'CREATE EXTENSION refuses a schema owned by a non-superuser');
like($err, qr/schema "redpacket" is owned by/, 'and says whose schema it is');
is($node->safe_psql('pre',
		"SELECT count(*) FROM pg_extension WHERE extname = 'redpacket'"),
	'0', 'nothing was installed');

# The same schema handed to a superuser, but with CREATE for its old owner.
$node->safe_psql('pre', q{
	ALTER SCHEMA redpacket OWNER TO CURRENT_USER;
	GRANT CREATE ON SCHEMA redpacket TO m1;
});
($rc, $out, $err) = $node->psql('pre', 'CREATE EXTENSION redpacket');
isnt($rc, 0, 'CREATE EXTENSION refuses a schema others may create objects in');
like($err, qr/may create objects in schema "redpacket"/, 'and says who may');
$node->safe_psql('pre', 'REVOKE CREATE ON SCHEMA redpacket FROM m1');
$node->safe_psql('pre', 'CREATE EXTENSION redpacket');
is($node->safe_psql('pre',
		"SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	$new, 'a superuser-owned schema is accepted');

# 2. An upgrade from 1.0 installed into a schema the owner controls.
$node->safe_psql('postgres', 'CREATE DATABASE old OWNER m1');
$node->safe_psql('old', 'SET ROLE m1; CREATE SCHEMA redpacket;');
$node->safe_psql('old', "CREATE EXTENSION redpacket VERSION '1.0'");
($rc, $out, $err) = $node->psql('old', 'ALTER EXTENSION redpacket UPDATE');
isnt($rc, 0, 'ALTER EXTENSION UPDATE refuses a schema owned by a non-superuser');
like($err, qr/ALTER SCHEMA redpacket OWNER TO/, 'and hints how to take it back');
$node->safe_psql('old', 'ALTER SCHEMA redpacket OWNER TO CURRENT_USER');
$node->safe_psql('old', 'ALTER EXTENSION redpacket UPDATE');
is($node->safe_psql('old',
		"SELECT extversion FROM pg_extension WHERE extname = 'redpacket'"),
	$new, 'the update goes through once the schema is a superuser\'s');

# 3. rp_reconcile_strict under a hostile database-level search_path.
$node->safe_psql('postgres', q{
	CREATE ROLE m2 LOGIN;
	CREATE DATABASE strict OWNER m2;
});
$node->safe_psql('strict', 'CREATE EXTENSION redpacket');
# A type named like each built-in type the procedure uses, with an
# assignment cast from the real one whose function grabs superuser.
my $traps = "SET ROLE m2; CREATE SCHEMA evil;\n";
for my $t ('text', 'int8')
{
	$traps .= qq{
	CREATE TYPE evil.$t AS ENUM ('x');
	CREATE FUNCTION evil.grab_$t(pg_catalog.$t) RETURNS evil.$t
	LANGUAGE plpgsql AS \$\$
	BEGIN
		IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
			EXECUTE 'ALTER ROLE m2 SUPERUSER';
		END IF;
		RETURN NULL;
	END \$\$;
	CREATE CAST (pg_catalog.$t AS evil.$t)
		WITH FUNCTION evil.grab_$t(pg_catalog.$t) AS ASSIGNMENT;
	};
}
$traps .= 'ALTER DATABASE strict SET search_path = evil, redpacket, pg_catalog;';
$node->safe_psql('strict', $traps);
$node->safe_psql('strict',
	"SELECT redpacket.rp_create_activity(10.00, stripes => 2)");
is(is_super('m2'), 'f', 'the owner is not a superuser before');
($rc, $out, $err) = $node->psql('strict', 'CALL redpacket.rp_reconcile_strict()');
is($rc, 0, 'rp_reconcile_strict runs') or diag($err);
($rc, $out, $err) = $node->psql('strict', 'CALL redpacket.rp_reconcile_strict(true)');
is($rc, 0, 'rp_reconcile_strict(true) runs') or diag($err);
is(is_super('m2'), 'f', 'nothing the owner wrote ran as the superuser');

$node->stop;
done_testing();
