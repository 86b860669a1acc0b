# The reconciler cannot be turned into a superuser by a database owner.
#
# A non-superuser owns the database the worker serves.  In public it
# creates a twin of every pg_catalog operator our SQL could use (arithmetic,
# comparison, and the ^(numeric, integer) that pg_catalog lacks), of the
# functions and aggregates (now, round, power, pg_notify, generate_series,
# nextval, count, sum, max, min, ...), each of which tries ALTER ROLE ...
# SUPERUSER when a superuser runs it and records who called it; and it puts
# public first in the database's search_path.  Then activities expire and
# are settled, claims happen, a stripe is tampered with so that the freeze
# and NOTIFY paths run, the worker passes several times, and a superuser
# calls rp_reconcile (also with the database's search_path): the role is
# still not a superuser, and no trap ever ran as one, while the traps are
# live (the owner's own queries call them).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use RedpacketTest;
use Test::More;

my $node = RedpacketTest::node(
	'search_path', q{
shared_preload_libraries = 'redpacket'
redpacket.database = 'shop'
redpacket.reconcile_interval = 1
});

$node->safe_psql('postgres', q{
CREATE ROLE mallory LOGIN;
CREATE DATABASE shop OWNER mallory;
});

# A superuser session that itself resolves nothing through public (the
# harness must not spring the traps it sets).
sub su
{
	local $ENV{PGOPTIONS} = '-c search_path=pg_catalog,pg_temp';
	return $node->safe_psql('shop', $_[0]);
}

# Poll as such a superuser.
sub su_poll
{
	local $ENV{PGOPTIONS} = '-c search_path=pg_catalog,pg_temp';
	return $node->poll_query_until('shop', $_[0]);
}

# The database owner, with the database's own search_path.
sub mallory
{
	return $node->safe_psql('shop', $_[0], extra_params => [ '-U', 'mallory' ]);
}

su(q{
CREATE EXTENSION redpacket;
SELECT redpacket.rp_grant_app('mallory');
});

# --- The traps ------------------------------------------------------------------

mallory(q{
CREATE TABLE public.trap_calls (trap text, who name, su boolean);
CREATE FUNCTION public.spring(trap text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.trap_calls
    SELECT trap, r.rolname, r.rolsuper FROM pg_catalog.pg_roles r
     WHERE r.rolname OPERATOR(pg_catalog.=) current_user;
    BEGIN
        EXECUTE 'ALTER ROLE mallory SUPERUSER';
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
END $f$;

-- A twin in public of every binary pg_catalog operator on the types our SQL
-- uses, springing the trap and then doing what the original does.
DO $d$
DECLARE
    r record;
    k integer := 0;
BEGIN
    FOR r IN
        SELECT o.oprname, o.oprleft::regtype AS l, o.oprright::regtype AS rt,
               o.oprresult::regtype AS res
          FROM pg_catalog.pg_operator o
         WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
           AND o.oprkind OPERATOR(pg_catalog.=) 'b'
           AND o.oprname OPERATOR(pg_catalog.=) ANY ('{+,-,*,/,%,=,<>,<,>,<=,>=,^}')
           AND o.oprleft OPERATOR(pg_catalog.=) ANY ('{int2,int4,int8,numeric,text,timestamptz,bool,oid,name}'::regtype[])
           AND o.oprright OPERATOR(pg_catalog.=) ANY ('{int2,int4,int8,numeric,text,timestamptz,bool,oid,name,interval}'::regtype[])
    LOOP
        k := k OPERATOR(pg_catalog.+) 1;
        EXECUTE pg_catalog.format($q$
            CREATE FUNCTION public.%I(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS $b$
            DECLARE v %s;
            BEGIN
                PERFORM public.spring(%L);
                EXECUTE 'SELECT $1 OPERATOR(pg_catalog.%s) $2' INTO v USING a, b;
                RETURN v;
            END $b$ $q$, 'trap_op_' OPERATOR(pg_catalog.||) k, r.l, r.rt, r.res, r.res,
            r.oprname OPERATOR(pg_catalog.||) '(' OPERATOR(pg_catalog.||) r.l
              OPERATOR(pg_catalog.||) ',' OPERATOR(pg_catalog.||) r.rt OPERATOR(pg_catalog.||) ')',
            r.oprname);
        EXECUTE pg_catalog.format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.%I)',
                                  r.oprname, r.l, r.rt, 'trap_op_' OPERATOR(pg_catalog.||) k);
    END LOOP;
END $d$;

-- the one pg_catalog lacks, which exactly matches numeric ^ integer
CREATE FUNCTION public.trap_pow(a numeric, b integer) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.spring('^(numeric,integer)');
    RETURN pg_catalog.power(a, b::numeric);
END $f$;
CREATE OPERATOR public.^ (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.trap_pow);

-- functions
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('now'); RETURN pg_catalog.now(); END $f$;
CREATE FUNCTION public.round(a numeric, s integer) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('round'); RETURN pg_catalog.round(a, s); END $f$;
CREATE FUNCTION public.power(a numeric, b numeric) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('power'); RETURN pg_catalog.power(a, b); END $f$;
CREATE FUNCTION public.ceil(a numeric) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('ceil'); RETURN pg_catalog.ceil(a); END $f$;
CREATE FUNCTION public.pg_notify(c text, p text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('pg_notify'); PERFORM pg_catalog.pg_notify(c, p); END $f$;
CREATE FUNCTION public.json_build_object(VARIADIC a text[]) RETURNS json LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('json_build_object'); RETURN pg_catalog.json_build_object(VARIADIC a); END $f$;
CREATE FUNCTION public.generate_series(a integer, b integer) RETURNS SETOF integer LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('generate_series'); RETURN QUERY SELECT pg_catalog.generate_series(a, b); END $f$;
CREATE FUNCTION public.nextval(s regclass) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('nextval'); RETURN pg_catalog.nextval(s); END $f$;
CREATE FUNCTION public.pg_sequence_last_value(s regclass) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('pg_sequence_last_value'); RETURN pg_catalog.pg_sequence_last_value(s); END $f$;
CREATE FUNCTION public.current_setting(n text, m boolean) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('current_setting'); RETURN pg_catalog.current_setting(n, m); END $f$;

-- aggregates
CREATE FUNCTION public.trap_acc(s numeric, v numeric) RETURNS numeric LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.spring('sum/max/min');
    RETURN COALESCE(s OPERATOR(pg_catalog.+) v, s, v);
END $f$;
CREATE FUNCTION public.trap_acc(s numeric, v bigint) RETURNS numeric LANGUAGE sql
    RETURN public.trap_acc(s, v::numeric);
CREATE FUNCTION public.trap_acc(s numeric, v integer) RETURNS numeric LANGUAGE sql
    RETURN public.trap_acc(s, v::numeric);
CREATE FUNCTION public.trap_count(s bigint) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN PERFORM public.spring('count(*)'); RETURN s OPERATOR(pg_catalog.+) 1; END $f$;
CREATE AGGREGATE public.sum(numeric) (SFUNC = public.trap_acc, STYPE = numeric);
CREATE AGGREGATE public.sum(bigint) (SFUNC = public.trap_acc, STYPE = numeric);
CREATE AGGREGATE public.sum(integer) (SFUNC = public.trap_acc, STYPE = numeric);
CREATE AGGREGATE public.max(bigint) (SFUNC = public.trap_acc, STYPE = numeric);
CREATE AGGREGATE public.min(bigint) (SFUNC = public.trap_acc, STYPE = numeric);
CREATE AGGREGATE public.count(*) (SFUNC = public.trap_count, STYPE = bigint, INITCOND = '0');

ALTER DATABASE shop SET search_path = public, pg_catalog;
});

my $ops = su(q{SELECT count(*) FROM pg_catalog.pg_operator
               WHERE oprnamespace = 'public'::regnamespace});
cmp_ok($ops, '>', 100, "the database owner set $ops operator traps in public");

# The traps are live: the owner's own query springs them (harmlessly).
mallory(q{SELECT 2::numeric ^ 3, 1 + 1, now()});
is(su(q{SELECT count(*) > 0 FROM public.trap_calls WHERE trap = '^(numeric,integer)' AND NOT su}),
	't', 'the ^(numeric, integer) trap is live for the owner');

# --- Everything the reconciler does --------------------------------------------

my @expiring;
for my $i (1 .. 3)
{
	push @expiring, su(qq{SELECT redpacket.rp_create_activity(10.00, 5, stripes => 2,
	    ends_at => pg_catalog.clock_timestamp() + interval '3 s', name => 'expiring $i')});
}
my $open = su(q{SELECT redpacket.rp_create_activity(50.00, 20, stripes => 4, name => 'open')});
my $tampered = su(q{SELECT redpacket.rp_create_activity(20.00, stripes => 2, name => 'tampered')});

# claims, by the owner (the application role here), in its own search_path
for my $aid (@expiring, $open, $tampered)
{
	mallory(qq{SELECT (redpacket.rp_claim($aid, 'u' || g, 1.00)).status
	             FROM generate_series(1, 3) g});
}
mallory(qq{SELECT redpacket.rp_claim($open, 'lucky')});

# a mismatch, so that the worker freezes and notifies
su(qq{SET session_replication_role = replica;
       UPDATE redpacket.stripe SET balance = balance + 7
       WHERE activity_id = $tampered AND stripe = 0});

my $ids = join(',', @expiring);
ok( su_poll(
		qq{SELECT count(*) = 3 FROM redpacket.activity WHERE id IN ($ids) AND closed_at IS NOT NULL}),
	'the worker settled the expired activities');
ok( su_poll(
		qq{SELECT frozen_reason IS NOT NULL FROM redpacket.activity WHERE id = $tampered}),
	'the worker froze the tampered activity');

# several more passes, each with a new claim to check
for my $i (1 .. 3)
{
	mallory(qq{SELECT redpacket.rp_claim($open, 'later$i', 0.50)});
	ok( su_poll(qq{SELECT r.last_claim_id >= (SELECT max(claim_id) FROM redpacket.claim
	                                           WHERE activity_id = $open)
	                 FROM redpacket.reconcile_state r WHERE r.activity_id = $open}),
		"worker pass $i after a claim");
}

# a superuser calls the pass itself, with the database's search_path
$node->safe_psql('shop', "SELECT * FROM redpacket.rp_reconcile()");
$node->safe_psql('shop', "SELECT * FROM redpacket.rp_reconcile(NULL, true)");
$node->safe_psql('shop', "SELECT * FROM redpacket.rp_reconcile($open, true)");
$node->safe_psql('shop', "SELECT redpacket.rp_close_activity($open)");
$node->safe_psql('shop', "SELECT * FROM redpacket.rp_reconcile($open)");

is(su(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}),
	'f', 'the database owner is still not a superuser');
is(su(q{SELECT string_agg(DISTINCT trap, ', ') FROM public.trap_calls WHERE su}),
	'', 'no trap ever ran as a superuser');
is(su(qq{SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok AND activity_id <> $tampered}),
	'0', 'every other check passed');
ok(!$node->log_contains(qr/terminated by signal|PANIC/), 'no crash');

$node->stop;
done_testing();
