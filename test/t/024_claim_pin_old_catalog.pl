# rp_claim as the 1.3 catalog declares it (SECURITY DEFINER without SET
# search_path, bound to the symbol rp_claim_v13) is safe with this library
# too: the library pins the path for the whole call on entry.  The attacks
# of sql/claim_search_path.sql (an application role's lower() and abs()
# reached through an admin's BRIN, GiST-exclusion, expression, partial-index,
# CHECK and column-default objects) run against a database still at 1.3,
# then again after ALTER EXTENSION redpacket UPDATE: every round leaves the
# role without superuser, and no twin ran as a superuser.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node('pin13');
$node->safe_psql('postgres', 'CREATE DATABASE c13');
$node->safe_psql('c13', "CREATE EXTENSION redpacket VERSION '1.3'");

my $attack = RedpacketTest::repo_file('sql/claim_search_path.sql');

sub attack_rounds
{
	my ($what) = @_;
	my ($out, $err) = ('', '');
	$node->psql('c13', $attack, stdout => \$out, stderr => \$err,
		extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
	is($err =~ /ERROR/ ? $err : '', '', "$what: the attacks ran without an error");
	my @rounds = ($out =~ /superuser: (true|false), twins run as a superuser: (\d+)/g);
	is(scalar(@rounds), 2 * 8, "$what: eight reports of the damage");
	my @bad = grep { $_ eq 'true' || ($_ =~ /^\d+$/ && $_ > 0) } @rounds;
	is(scalar(@bad), 0, "$what: the role never became a superuser, no twin ran as one");
	like($out, qr/brin on claim: claimed,claimed,claimed/, "$what: the claims were made");
	return $out;
}

is($node->safe_psql('c13', q{SELECT prosrc || ' ' || (proconfig IS NULL)
	FROM pg_proc WHERE oid = 'redpacket.rp_claim(bigint,text,numeric,text)'::regprocedure}),
	'rp_claim_v13 true', '1.3 declares rp_claim without SET search_path');
attack_rounds('1.3 catalog');

$node->safe_psql('c13', 'ALTER EXTENSION redpacket UPDATE');
is($node->safe_psql('c13', q{SELECT prosrc || ' ' || array_to_string(proconfig, ',')
	FROM pg_proc WHERE oid = 'redpacket.rp_claim(bigint,text,numeric,text)'::regprocedure}),
	'rp_claim_v14 search_path=pg_catalog, pg_temp', 'the update pins it in the definition');
attack_rounds('after the update');

$node->stop;
done_testing();
