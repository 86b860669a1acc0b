# Nothing hides from the worker.  Its passes find their work through the
# reconciliation state rows; an activity that lost its row (deleted with the
# triggers off, or a restore that left it out) would never be checked or
# settled again.  So each pass also probes the next window of activity ids
# for one without a state row, in turn (reconciler.probed_through), and a
# lost row is reported incomplete within as many passes as there are
# windows; a state row whose activity row is gone is reported at once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $window = 8192;    # RP_PASS_STATE_PROBE

my $node = RedpacketTest::node('lost_state', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 3600
});
sql('CREATE EXTENSION redpacket');

# More activities than one window, with ids that jump (a sequence moved on)
my $first = sql("SELECT redpacket.rp_create_activity(1.00, stripes => 1, name => 'first')");
sql("SELECT redpacket.rp_create_activity(1.00, stripes => 1) FROM generate_series(2, $window)");
sql("SELECT setval('redpacket.activity_id_seq', 5000000000)");
my $last = sql("SELECT redpacket.rp_create_activity(1.00, stripes => 1, name => 'last')");
sql("SELECT redpacket.rp_claim(a, 'u1', 0.50) FROM unnest(ARRAY[$first, $last]) a");
sql('SET client_min_messages = error; SELECT count(*) FROM redpacket.rp_reconcile()');
is(sql('SELECT count(*) FROM redpacket.reconcile_state WHERE last_pass_at IS NULL'), '0',
	'every activity was checked once');

# An incremental pass: which of the two it reports, and where it probed.
sub one_pass
{
	my $seen = sql(qq{SET client_min_messages = error;
		SELECT coalesce(string_agg(CASE activity_id WHEN $first THEN 'first' ELSE 'last' END
		                           || ':' || problems::text, ' ' ORDER BY activity_id), '')
		  FROM redpacket.rp_reconcile() WHERE activity_id IN ($first, $last)});
	return [ $seen, sql('SELECT probed_through FROM redpacket.reconciler') ];
}

sql(qq{SET session_replication_role = replica;
       DELETE FROM redpacket.reconcile_state WHERE activity_id IN ($first, $last)});
my @passes = map { one_pass() } 1 .. 3;
my $nth = sql("SELECT id FROM redpacket.activity ORDER BY id OFFSET $window - 1 LIMIT 1");
note(join(', ', map { "$_->[0] through $_->[1]" } @passes));

# Every pass probes one window; after the last window it starts again.
my %reported = map { $_ => 1 } map { split / /, $_->[0] } @passes;
ok($reported{'first:{incomplete}'}, 'the first activity, lost state row, is reported incomplete');
ok($reported{'last:{incomplete}'}, 'the last activity, past the first window, is reported incomplete');
ok((grep { $_->[1] eq $nth } @passes), "a pass probed through the ${window}th activity");
ok((grep { $_->[1] eq '0' } @passes), 'a pass probed past the last activity and wrapped');
is(sql(qq{SELECT count(*) FROM redpacket.reconcile_problem
           WHERE activity_id IN ($first, $last) AND problem = 'incomplete'}),
	'2', 'both are open problems, told once');

# The explicit full check recreates the row; then the books balance again.
sql("SET client_min_messages = error; SELECT count(*) FROM redpacket.rp_reconcile($_, true)")
  for $first, $last;
is(sql(qq{SET client_min_messages = error;
          SELECT string_agg(ok::text, ' ' ORDER BY activity_id) FROM redpacket.rp_reconcile()
           WHERE activity_id IN ($first, $last)}) // '', '', 'nothing left to report once recreated');
is(sql(qq{SELECT count(*) FROM redpacket.rp_verify(NULL, true) WHERE NOT ok}), '0',
	'a full check of everything finds the books right');

# A state row whose activity row is gone is a candidate of every pass.
sql(qq{SET session_replication_role = replica; DELETE FROM redpacket.activity WHERE id = $first});
is(one_pass()->[0], 'first:{incomplete}', 'an activity whose row is gone is reported by the next pass');

done_testing();
