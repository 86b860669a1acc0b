# The executor-direct fast path of rp_claim (src/claim/direct.c) keeps the OIDs of
# redpacket.claim and redpacket.stripe and the shape of the tables for the
# life of the backend.  In one session: claims before and after DROP
# EXTENSION / CREATE EXTENSION (new OIDs) take the direct path and do not
# crash; a column added to claim sends claims to the SPI path (which fills
# it from its default), dropping it again brings the direct path back; a
# preloaded library counts every claim in the activity's statistics either way.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node('direct', "shared_preload_libraries = 'redpacket'\nredpacket.reconcile_interval = 0");

my $script = q{
CREATE EXTENSION redpacket;
SET redpacket.direct_claims = on;
SELECT redpacket.rp_create_activity(10.00, stripes => 2) AS a \gset
SET client_min_messages = debug1;
SELECT 'first:' || status FROM redpacket.rp_claim(:a, 'u1', 1.00);
RESET client_min_messages;
SET redpacket.allow_drop = on;
DROP EXTENSION redpacket;
CREATE EXTENSION redpacket;
SELECT redpacket.rp_create_activity(10.00, stripes => 2) AS a \gset
SET client_min_messages = debug1;
SELECT 'recreated:' || status FROM redpacket.rp_claim(:a, 'u1', 1.00);
ALTER TABLE redpacket.claim ADD COLUMN note text DEFAULT 'from default';
SELECT 'extra column:' || status FROM redpacket.rp_claim(:a, 'u2', 1.00);
SELECT 'note:' || note FROM redpacket.claim WHERE user_id = 'u2';
ALTER TABLE redpacket.claim DROP COLUMN note;
SELECT 'dropped column:' || status FROM redpacket.rp_claim(:a, 'u3', 1.00);
RESET client_min_messages;
SELECT 'books:' || count(*) || ':' || sum(amount) FROM redpacket.claim WHERE activity_id = :a;
SELECT 'reconciled:' || ok FROM redpacket.rp_reconcile(:a);
SELECT 'stats:' || claimed FROM redpacket.activity_stats WHERE activity_id = :a;
};
my ($ret, $out, $err) = $node->psql('postgres', $script, on_error_stop => 1);
is($ret, 0, 'the session ran to the end') or diag($err);
my @debug = map { /redpacket: claim (took the direct path|takes the SPI path)/ ? $1 : () }
  split /\n/, $err;
is_deeply(
	\@debug,
	[ 'took the direct path', 'took the direct path', 'takes the SPI path', 'took the direct path' ],
	'direct before and after DROP/CREATE EXTENSION, SPI with an extra column, direct once it is dropped');
like($out, qr/^first:claimed$/m, 'claim before the drop');
like($out, qr/^recreated:claimed$/m, 'claim after CREATE EXTENSION in the same session');
like($out, qr/^note:from default$/m, 'the SPI path filled the extra column from its default');
like($out, qr/^dropped column:claimed$/m, 'claim after the column is dropped');
like($out, qr/^books:3:3\.00$/m, 'three claims recorded');
like($out, qr/^reconciled:true$/m, 'the activity reconciles');
like($out, qr/^stats:3$/m, 'every claim counted in the statistics');

$node->stop;
done_testing();
