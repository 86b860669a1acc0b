# Every change a superuser or a bad restore can make to a row of ours, taken
# from the catalog: for every table of the extension and every column,
# an UPDATE of one row; for every table, a DELETE of one row and a forged
# INSERT (a copy of a row under a new key).  Each is tried with the triggers
# firing and with session_replication_role = replica (no trigger fires, as on
# a logical replica or a restore with triggers off), in a transaction rolled
# back afterwards.  A cell is "refused" (the statement fails, its SQLSTATE
# named) or "reported" (a full check, rp_verify(NULL, true), or one from the
# watermarks as the next pass runs it, rp_verify(NULL, false), of the books
# as changed says anything else than of the books as they were, or fails);
# "silent" is what must not be.
#
# With the triggers firing, every UPDATE and DELETE is refused by
# construction (the append-only tables refuse everyone, the others refuse
# any statement that is not the extension's own).  The cells the checks do
# not cover yet are TODO tests, named: they fail until a check covers them,
# and report unexpectedly passing when one does.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest qw(sql);
use Test::More;

my $node = RedpacketTest::node('tamper_matrix', qq{
shared_preload_libraries = 'redpacket'
redpacket.reconcile_interval = 3600
});
sql('CREATE EXTENSION redpacket');

# --- Books that use every table ----------------------------------------------

my $plain = sql(qq{SELECT redpacket.rp_create_activity(100.00, 20, stripes => 4, name => 'plain',
                                                     starts_at => now() - interval '1 hour',
                                                     ends_at => now() + interval '1 day')});
sql("SELECT redpacket.rp_claim($plain, 'u' || g, 1.00) FROM generate_series(1, 4) g");
sql("SELECT redpacket.rp_top_up($plain, 5.00, 2, 'more')");
sql("SELECT redpacket.rp_withdraw($plain, 1.00, 'less')");
sql("SELECT redpacket.rp_set_window($plain, now() - interval '2 hours', now() + interval '2 days', 'longer')");
my @ids = split /\n/, sql("SELECT claim_id FROM redpacket.claim WHERE activity_id = $plain ORDER BY claim_id");
sql("SELECT redpacket.rp_credited($plain, ARRAY[$ids[0], $ids[2]], 'wallet-1')");
sql("SELECT redpacket.rp_reverse($plain, $ids[3], 'risk')");
sql("SELECT count(*) FROM redpacket.rp_pending_credits($plain)");
my $listed = sql(qq{SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2, name => 'listed',
                                                      restricted => true)});
sql("SELECT redpacket.rp_allow($listed, ARRAY['e1', 'e2', 'e3'])");
sql("SELECT redpacket.rp_claim($listed, 'e1', 1.00)");
my $lucky = sql("SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2, name => 'lucky')");
sql("SELECT redpacket.rp_claim($lucky, 'l' || g) FROM generate_series(1, 2) g");
my $closed = sql("SELECT redpacket.rp_create_activity(8.00, 4, stripes => 2, name => 'closed')");
sql("SELECT redpacket.rp_claim($closed, 'c1', 2.00)");
sql("SELECT redpacket.rp_close_activity($closed)");
sql(qq{SELECT redpacket.rp_refunded($closed, ARRAY(SELECT entry_id FROM redpacket.ledger
                                                 WHERE activity_id = $closed AND kind = 'return'), 'back-1')});
# claims from before settlement tracking, as an update from 1.3 records them
my $old = sql("SELECT redpacket.rp_create_activity(5.00, 5, stripes => 2, name => 'old')");
sql("SELECT redpacket.rp_claim($old, 'o' || g, 1.00) FROM generate_series(1, 2) g");
sql(qq{INSERT INTO redpacket.settlement_start (activity_id, untracked_through)
       SELECT activity_id, max(claim_id) FROM redpacket.claim
        WHERE activity_id = $old GROUP BY activity_id});
sql("SELECT redpacket.rp_claim($old, 'o3', 1.00)");
# an activity whose stripe row is lost: its open problem fills reconcile_problem
my $broken = sql("SELECT redpacket.rp_create_activity(6.00, 3, stripes => 2, name => 'broken')");
sql(qq{SET session_replication_role = replica;
       DELETE FROM redpacket.stripe WHERE activity_id = $broken AND stripe = 1});
sql('SELECT count(*) FROM redpacket.rp_reconcile(NULL, true)');

# What the checks say of these books, a full check and one from the
# watermarks (as the next pass would run it); a cell is reported when
# either says anything else.
sql(q{CREATE FUNCTION public.tamper_says() RETURNS text LANGUAGE sql AS $$
      SELECT (SELECT string_agg(activity_id || ':' || ok || ':' || problems::text, ' ' ORDER BY activity_id)
                FROM redpacket.rp_verify(NULL, true))
             || ' | ' ||
             (SELECT string_agg(activity_id || ':' || ok || ':' || problems::text, ' ' ORDER BY activity_id)
                FROM redpacket.rp_verify(NULL, false)) $$});
sql(q{CREATE TABLE public.tamper_verdict AS SELECT public.tamper_says() AS v});
is(sql('SELECT v FROM public.tamper_verdict'),
	join(' | ', ("$plain:true:{} $listed:true:{} $lucky:true:{} $closed:true:{} $old:true:{} $broken:false:{incomplete}") x 2),
	'the books are right before any change but the lost stripe row');
# --- The cells ---------------------------------------------------------------

# One cell: run q with session_replication_role = mode, then the full check,
# then roll everything back.  Answers "refused SQLSTATE", "no row",
# "reported", "check fails SQLSTATE" or "silent".
sql(q{
CREATE FUNCTION public.tamper_cell(mode text, q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    r text;
    st text;
BEGIN
    BEGIN
        PERFORM pg_catalog.set_config('session_replication_role', mode, true);
        BEGIN
            EXECUTE q;
            GET DIAGNOSTICS n = ROW_COUNT;
        EXCEPTION WHEN others THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
            r := 'refused ' || st;
        END;
        PERFORM pg_catalog.set_config('session_replication_role', 'origin', true);
        IF r IS NULL AND n = 0 THEN
            r := 'no row';
        ELSIF r IS NULL THEN
            BEGIN
                SELECT CASE WHEN public.tamper_says()
                                 IS NOT DISTINCT FROM (SELECT t.v FROM public.tamper_verdict t)
                            THEN 'silent' ELSE 'reported' END INTO r;
            EXCEPTION WHEN others THEN
                GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
                r := 'check fails ' || st;
            END;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'RPTMX', MESSAGE = r;
    EXCEPTION WHEN SQLSTATE 'RPTMX' THEN
        RETURN SQLERRM;
    END;
END $$;
});

# A value other than v of a column of type typ (v is the SQL of the current value).
sub changed
{
	my ($v, $typ, $enum, $unique) = @_;
	return "$v + 1000000" if $unique && $typ =~ /^(bigint|integer)$/;
	return "(SELECT e FROM unnest(enum_range(NULL::$typ)) e WHERE e IS DISTINCT FROM $v LIMIT 1)"
	  if $enum;
	return "NOT coalesce($v, false)" if $typ eq 'boolean';
	return "coalesce($v, 0) + 1"
	  if $typ =~ /^(bigint|integer|smallint|numeric)$/;
	return "coalesce($v, '') || 'x'" if $typ =~ /^(text|name)$/;
	return "coalesce($v, now()) + interval '1 hour'" if $typ eq 'timestamp with time zone';
	return "coalesce($v, '{}') || 1::bigint" if $typ eq 'bigint[]';
	return "coalesce($v, '{}') || 'x'::text" if $typ eq 'text[]';
	return "coalesce($v, '{}'::jsonb) || '{\"x\": 1}'" if $typ eq 'jsonb';
	die "no change for a column of type $typ";
}

my @columns = map { [ split /\|/ ] } split /\n/, sql(q{
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
       t.typtype = 'e',
       EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique
                                        AND a.attnum = ANY (i.indkey::int2[]))
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
WHERE c.relnamespace = 'redpacket'::regnamespace AND c.relkind = 'r'
ORDER BY c.relname, a.attnum});
my %tables;
push @{ $tables{ $_->[0] } }, $_ for @columns;
is(join(' ', grep { sql("SELECT count(*) FROM redpacket.$_") == 0 } sort keys %tables),
	'', 'every table has a row to change');

my @cells;    # [table, what, sql]
for my $t (sort keys %tables)
{
	# one row, not the broken activity's (its check fails already)
	my ($act) = grep { $_ eq 'activity_id' || ($t eq 'activity' && $_ eq 'id') }
	  map { $_->[1] } @{ $tables{$t} };
	my $but = $act && $t ne 'reconcile_problem' ? " WHERE $act <> $broken" : '';
	my $row = "ctid = (SELECT min(ctid) FROM redpacket.$t$but)";
	for my $c (@{ $tables{$t} })
	{
		my (undef, $col, $typ, $enum, $unique) = @$c;
		push @cells,
		  [ $t, "UPDATE $col",
			"UPDATE redpacket.$t SET $col = " . changed($col, $typ, $enum eq 't', $unique eq 't') . " WHERE $row" ];
	}
	push @cells, [ $t, 'DELETE', "DELETE FROM redpacket.$t WHERE $row" ];

	# a copy of a row under a new key: each column of a unique index but
	# activity_id changed, or (a table keyed by activity alone) another
	# activity
	my @keys = grep { $_->[4] eq 't' } @{ $tables{$t} };
	my @other = grep { $_->[1] ne 'activity_id' } @keys;
	@other = @keys unless @other;
	my $over = join ' || ', map {
		my (undef, $col, $typ, $enum) = @$_;
		"jsonb_build_object('$col', " . changed($col, $typ, $enum eq 't', 1) . ')'
	} @other;
	push @cells,
	  [ $t, 'INSERT',
		"INSERT INTO redpacket.$t SELECT (jsonb_populate_record(NULL::redpacket.$t, to_jsonb(x) || $over)).*"
		  . " FROM redpacket.$t x WHERE $row" ];
}

ok(@cells > 100, scalar(@cells) . ' cells from the catalog, ' . scalar(keys %tables) . ' tables');
is(scalar(keys %tables), 16, 'every table of the extension is in the matrix');

# The cells no check reports yet, all with the triggers off: the terms and
# history of an activity (no copy of them to compare with), who and when
# of every row, a claim's user and keys, the reconciler's own records and
# counters, which users an eligibility list names (its length is checked),
# the settlements' references, and the watermarks and hints of the
# reconciliation state that steer which rows a pass reads (wrong, they show
# as wrong money once a claim crosses them), and where an activity's
# settlement tracking starts (a start moved, removed or made for an
# activity that has none changes which claims are pending, not the books).
my %todo = map { $_ => 1 } split /\n/, <<'EOF';
replica activity UPDATE name
replica activity UPDATE per_user_limit
replica activity UPDATE starts_at
replica activity UPDATE ends_at
replica activity UPDATE frozen_at
replica activity UPDATE restricted
replica activity UPDATE funder
replica activity UPDATE request_id
replica activity_change UPDATE activity_id
replica activity_change UPDATE changed_at
replica activity_change UPDATE changed_by
replica activity_change UPDATE before
replica activity_change UPDATE after
replica activity_change UPDATE reason
replica activity_change DELETE
replica claim UPDATE user_id
replica claim UPDATE request_id
replica claim UPDATE idempotency_key
replica claim UPDATE claimed_at
replica claim_settlement UPDATE settlement_id
replica claim_settlement UPDATE settled_at
replica claim_settlement UPDATE settled_by
replica claim_settlement UPDATE reference
replica claim_settlement UPDATE reason
replica eligible UPDATE user_id
replica eligible UPDATE added_at
replica eligible UPDATE added_by
replica ledger UPDATE reason
replica ledger UPDATE funder
replica reconcile_problem UPDATE activity_id
replica reconcile_problem UPDATE detail
replica reconcile_problem UPDATE since
replica reconcile_problem UPDATE reported_at
replica reconcile_problem DELETE
replica reconcile_state UPDATE last_claim_id
replica reconcile_state UPDATE last_pass_at
replica reconcile_state UPDATE last_full_check_at
replica reconcile_state UPDATE last_balance
replica reconcile_state UPDATE last_packets
replica reconcile_state UPDATE last_claims
replica reconcile_state UPDATE last_settlement_id
replica reconcile_state UPDATE last_entry_id
replica reconcile_state UPDATE last_ok
replica reconciler UPDATE last_pass_started_at
replica reconciler UPDATE last_pass_finished_at
replica reconciler UPDATE last_pass_ms
replica reconciler UPDATE activities_checked
replica reconciler UPDATE failures
replica reconciler UPDATE passes
replica reconciler UPDATE probed_through
replica reconciler UPDATE credit_probed_through
replica reconciler UPDATE installed_at
replica reconciler UPDATE checks
replica reconciler UPDATE mismatches
replica reconciler UPDATE unchecked
replica reconciler UPDATE settlements
replica reconciler UPDATE last_pass_mismatches
replica reconciler UPDATE last_pass_unchecked
replica reconciler DELETE
replica reconciliation UPDATE activity_id
replica reconciliation UPDATE checked_at
replica reconciliation UPDATE full_check
replica reconciliation UPDATE expected
replica reconciliation UPDATE actual
replica reconciliation UPDATE drift
replica reconciliation UPDATE expected_packets
replica reconciliation UPDATE actual_packets
replica reconciliation UPDATE expected_claims
replica reconciliation UPDATE actual_claims
replica reconciliation UPDATE negative_stripes
replica reconciliation UPDATE new_claims
replica reconciliation UPDATE ok
replica reconciliation UPDATE problems
replica reconciliation UPDATE error
replica reconciliation DELETE
replica role_grant UPDATE privilege
replica role_grant DELETE
replica settlement_state UPDATE advanced_at
replica settlement_state INSERT
origin settlement_start INSERT
replica settlement_start UPDATE activity_id
replica settlement_start UPDATE recorded_at
replica settlement_start DELETE
replica settlement_start INSERT
EOF

my (%seen, %result);
for my $mode ('origin', 'replica')
{
	for my $cell (@cells)
	{
		my ($t, $what, $q) = @$cell;
		(my $lit = $q) =~ s/'/''/g;
		my $got = sql("SELECT public.tamper_cell('$mode', '$lit')");
		my $name = "$mode $t $what";
		$seen{$got}++;
		$result{$name} = $got;
		note("$name: $got");
		if ($mode eq 'origin' && $what !~ /^INSERT/)
		{
			is($got, 'refused 42501', "$name: refused by a trigger");
			next;
		}
		local $TODO = $todo{$name} ? 'not covered by a check yet' : undef;
		unlike($got, qr/^silent$/, "$name: $got");
	}
}
note(join(', ', map { "$_: $seen{$_}" } sort keys %seen));

# The list shrinks as checks grow: it names silent cells only.
is(join(', ', grep { ($result{$_} // '') ne 'silent' } sort keys %todo), '',
	'every TODO cell is a silent cell of the matrix');

done_testing();
