# Fuzzing.  Two parts, both with fixed seeds:
#   1. sqlsmith, as an application role, against a database with the
#      extension, some activities and a table of interesting values it can
#      feed into rp_claim (2000 random queries);
#   2. a randomized argument fuzzer calling every function of ours, as the
#      owner and as the application role, with NULLs, tiny, huge, negative
#      and non-finite numerics, boundary integers, 256/257-byte and
#      multibyte strings, control characters, unknown ids, and random
#      orders of create, claim, batch, close, freeze, unfreeze and reconcile.
# Pass: the server never crashes or restarts, every error raised by our code
# carries one of the SQLSTATEs the README documents for bad calls (22004,
# 22023, 22003, P0002; 42501 for privileges; 2202E for a malformed
# rp_claim_batch array), and at the end every activity's books balance, no
# user holds more than per_user_limit claims, and a full reconciliation pass
# is ok.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use RedpacketTest;

my $SQLSMITH_QUERIES = 2000;
my $FUZZ_STATEMENTS = 4000;
my %allowed = map { $_ => 1 } qw(22004 22023 22003 P0002 42501);
my %allowed_batch = (%allowed, '2202E' => 1);

my $node = PostgreSQL::Test::Cluster->new('fuzz');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf(
	'postgresql.conf', q{
max_connections = 20
max_locks_per_transaction = 256
log_line_prefix = '%m [%p] %e '
log_error_verbosity = verbose
log_min_error_statement = error
log_statement = none
});
$node->start;
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION redpacket;
CREATE ROLE fuzz_app LOGIN;
SELECT redpacket.rp_grant_app('fuzz_app');
CREATE ROLE fuzz_operator;
ALTER ROLE fuzz_app SET statement_timeout = '2s';
});

# Activities of every shape.
my @acts = split /\n/, $node->safe_psql(
	'postgres', q{
SELECT redpacket.rp_create_activity(1000.00, stripes => 8, name => 'fixed');
SELECT redpacket.rp_create_activity(300.00, packets => 500, stripes => 4, name => 'lucky');
SELECT redpacket.rp_create_activity(500.00, stripes => 2, per_user_limit => 3, name => 'rain');
SELECT redpacket.rp_create_activity(77, stripes => 3, scale => 0, name => 'yuan');
SELECT redpacket.rp_create_activity(12.3456, packets => 40, stripes => 5, scale => 4, name => 'fine');
SELECT redpacket.rp_create_activity(0.05, packets => 5, stripes => 16, name => 'tiny');
SELECT redpacket.rp_create_activity(92233720368547758.07, stripes => 1024, name => 'int64 max');
SELECT redpacket.rp_create_activity(50.00, starts_at => now() + interval '1 day', name => 'later');
SELECT redpacket.rp_create_activity(50.00, starts_at => now() - interval '2 days',
                                    ends_at => now() - interval '1 day', name => 'expired');
SELECT redpacket.rp_create_activity(50.00, ends_at => now() + interval '20 seconds', name => 'ends soon');
SELECT redpacket.rp_create_activity(50.00, stripes => 4, per_user_limit => 2147483647, name => 'no limit');
});
is(scalar(@acts), 11, 'eleven activities to fuzz');
$node->safe_psql(
	'postgres', qq{
SELECT redpacket.rp_claim($acts[0], 'seed' || g, g * 0.01) FROM generate_series(1, 20) g;
SELECT redpacket.rp_claim($acts[1], 'seed' || g) FROM generate_series(1, 20) g;
SELECT redpacket.rp_claim($acts[2], 'seed' || g % 5, 1.00, 'r' || g) FROM generate_series(1, 20) g;
-- Values sqlsmith can feed into rp_claim.
CREATE TABLE public.fuzz_input (act bigint, user_id text, amount numeric, request_id text, flag boolean);
INSERT INTO public.fuzz_input
SELECT a, u, m, r, f
FROM unnest(ARRAY[$acts[0], $acts[1], $acts[2], $acts[3], $acts[5], $acts[9], 0, -1, NULL]::bigint[]) a,
     unnest(ARRAY['seed1', 'u' || repeat('x', 255), '', NULL, E'\\t\\x01']) u,
     unnest(ARRAY[0.01, 0, -1, 'NaN', 'Infinity', 1e30, 1e-30, NULL]::numeric[]) m,
     unnest(ARRAY['r1', NULL]) r,
     unnest(ARRAY[true, false]) f;
GRANT SELECT ON public.fuzz_input TO fuzz_app;
});

# Errors of the server log from $offset on: [sqlstate, ours, text], where
# ours means raised by our C code (LOCATION in one of our files) or inside
# our SQL (a CONTEXT naming redpacket's statements or functions).
sub server_errors
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my (@errors, $cur);
	for my $line (split /\n/, $log)
	{
		if ($line =~ /^\S+ \S+ \S+ \[(\d+)\] (\S+) (ERROR|FATAL|PANIC|LOG|WARNING|DETAIL|HINT|CONTEXT|LOCATION|STATEMENT|QUERY):\s+(.*)$/)
		{
			my ($pid, $state, $kind, $text) = ($1, $2, $3, $4);
			if ($kind =~ /^(ERROR|FATAL|PANIC)$/)
			{
				$cur = { state => $state, kind => $kind, text => $text, ours => 0 };
				push @errors, $cur;
			}
			elsif ($kind =~ /^(LOG|WARNING)$/)
			{
				undef $cur;
			}
			elsif ($cur)
			{
				$cur->{ours} = 1
				  if ($kind eq 'LOCATION'
					&& $text =~ /\b(activity|claim|money|reconcile|redpacket|stripe|worker)\.c:\d+/)
				  || ($kind eq 'CONTEXT' && $text =~ /redpacket\.|function redpacket/);
				$cur->{statement} = $text if $kind eq 'STATEMENT';
			}
		}
	}
	return @errors;
}

sub histogram
{
	my %h;
	$h{$_}++ for @_;
	return join(', ', map {"$_: $h{$_}"} sort keys %h);
}

# --- 1. sqlsmith as the application role ---------------------------------------

SKIP:
{
	my ($sqlsmith) = grep { -x $_ } (map {"$_/sqlsmith"} split /:/, ($ENV{PATH} // '')),
	  '/usr/bin/sqlsmith';
	skip 'sqlsmith is not installed', 4 unless $sqlsmith;

	my $offset = -s $node->logfile;
	my ($out, $err) = ('', '');
	my $target = $node->connstr('postgres') . ' user=fuzz_app';
	my $ok = IPC::Run::run(
		[ $sqlsmith, "--target=$target", '--seed=104', "--max-queries=$SQLSMITH_QUERIES",
		  '--exclude-catalog', '--verbose', '--dump-all-queries' ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(150));
	my @progress = $err =~ /queries: (\d+)/g;
	my $queries = $progress[-1] // 0;
	is($queries, $SQLSMITH_QUERIES, "sqlsmith ran $SQLSMITH_QUERIES queries (exit ok: " . ($ok ? 1 : 0) . ')')
	  or diag(substr($err, -3000));

	my $calls = () = $out =~ /redpacket\.rp_\w+\(/g;
	note("sqlsmith: its queries named a function of ours $calls times");
	my @errors = server_errors($offset);
	my @ours = grep { $_->{ours} } @errors;
	note('sqlsmith: ' . scalar(@errors) . ' errors, SQLSTATEs: ' . histogram(map { $_->{state} } @errors));
	note('sqlsmith: ' . scalar(@ours) . ' raised by redpacket, SQLSTATEs: ' . histogram(map { $_->{state} } @ours));
	my $claims = $node->safe_psql('postgres', 'SELECT count(*) FROM redpacket.claim');
	note("sqlsmith: claims in the database now: $claims");
	# A statement_timeout can cancel a claim inside our SPI statements (57014).
	my @bad = grep { !$allowed{ $_->{state} } && $_->{state} ne '57014' } @ours;
	is(scalar(@bad), 0, 'every error sqlsmith got from redpacket has a documented SQLSTATE')
	  or diag(join("\n", map {"$_->{state} $_->{text}\n    in: " . substr($_->{statement} // '', 0, 300)} @bad[ 0 .. ($#bad < 9 ? $#bad : 9) ]));
	is(scalar(grep { $_->{kind} ne 'ERROR' } @errors), 0, 'no FATAL or PANIC during sqlsmith');
	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
		$started, 'the server survived sqlsmith without a restart');
}

# --- 2. The argument fuzzer ------------------------------------------------------

srand(104);
sub pick { return $_[ int(rand(@_)) ]; }

sub rand_alnum
{
	my ($n) = @_;
	my @c = ('a' .. 'z', 'A' .. 'Z', '0' .. '9');
	return join('', map { $c[ int(rand(@c)) ] } 1 .. $n);
}
my $hong = "\xe7\xba\xa2";    # U+7EA2 in UTF-8, three bytes
my @text = (
	'NULL', "''", "'u1'", "'u2'", "'u3'", "'seed1'", "'seed2'", "' '", "'a b'",
	"'" . ('x' x 256) . "'", "'" . ('y' x 257) . "'",
	"'" . ($hong x 85) . "'",          # 255 bytes
	"'a" . ($hong x 85) . "'",         # 256 bytes
	"'ab" . ($hong x 85) . "'",        # 257 bytes
	"'" . ($hong x 86) . "'",          # 258 bytes
	"'" . ("\xf0\x9f\xa7\xa7" x 64) . "'",    # 64 four-byte characters: 256 bytes
	"E'\\x01\\x02\\x03\\t\\n\\r\\x1b\\x7f'", "E'\\x1f'", "E'\\\\'", "'%s%n%x'",
	"'Robert''); DROP TABLE redpacket.claim;--'", "'" . rand_alnum(1000) . "'",
	"'" . rand_alnum(3000) . "'", "'" . ('z' x 10000) . "'");
my @numeric = (
	'NULL', '0', '-0', '0.00', '-0.00', '0.01', '0.07', '0.5', '1', '1.005', '5', '10',
	'100.00', '-1', '-0.01', '1e-30', '1e30', '-1e30', "'NaN'", "'Infinity'", "'-Infinity'",
	'9223372036854775807', '9223372036854775808', '92233720368547758.07',
	'92233720368547758.08', '922337203685477.5807', '922337203685477.5808', '0.0001',
	'0.00001', '123456789.123456789', '1e1000');
my @int = ('NULL', '0', '-1', '1', '2', '3', '16', '100', '1024', '1025', '2147483647', '-2147483648');
my @ts = (
	'NULL', 'now()', "now() - interval '1 day'", "now() + interval '1 day'",
	"now() + interval '3 seconds'", "'infinity'", "'-infinity'", "'2000-01-01 00:00+00'",
	"'294276-12-31 23:59:59+00'", "'4713-11-24 00:00+00 BC'");
my @bool = ('NULL', 'true', 'false');
my @good_amount = ('0.01', '0.05', '0.07', '0.10', '0.50', '1.00', '2.50');
my @known = @acts;
my @act = (@known, @known, @known, 'NULL', '0', '-1', '999999999', '9223372036854775807',
	'-9223372036854775808');

# A value of the pool, parenthesized (so that -1 or now() + x cast as a whole).
sub v
{
	my ($pool, $type) = @_;
	return '(' . pick(@$pool) . ")::$type";
}

sub arr
{
	my ($pool, $type, $len) = @_;
	return pick("NULL::$type\[]", "'{}'::$type\[]") if rand() < 0.1;
	return "ARRAY[ARRAY[" . pick(@$pool) . ', ' . pick(@$pool) . "]]::$type\[]" if rand() < 0.05;
	return 'ARRAY[' . join(', ', map { '(' . pick(@$pool) . ')' } 1 .. $len) . "]::$type\[]";
}

# One statement (one line); $app says whether it runs as the application role.
sub fuzz_statement
{
	my ($app) = @_;
	my $p = rand();
	my $a = '(' . ($app || rand() >= 0.1 ? pick(@act) : 'SELECT max(id) FROM redpacket.activity') . ')';
	if ($p < 0.40)
	{
		# a valid claim with, most of the time, one or two arguments mutated
		my @args = (
			"$a\::bigint",
			"('u" . int(rand(300)) . "')::text",
			'(' . pick(@good_amount) . ')::numeric',
			"('r" . (1 + int(rand(4))) . "')::text");
		for (1 .. pick(0, 1, 1, 2))
		{
			my $i = 1 + int(rand(3));
			$args[$i] = v($i == 2 ? \@numeric : \@text, $i == 2 ? 'numeric' : 'text');
		}
		pop @args if rand() < 0.15;
		$args[2] = '(NULL)::numeric' if rand() < 0.15;    # a lucky draw
		return ('claim', 'SELECT * FROM redpacket.rp_claim(' . join(', ', @args) . ');');
	}
	if ($p < 0.50)
	{
		my $n = 1 + int(rand(4));
		my @users = map { "'u" . int(rand(300)) . "'" } 1 .. $n;
		my @amounts = map { pick(@good_amount) } 1 .. $n;
		my @reqs = map { "'r" . (1 + int(rand(4))) . "'" } 1 .. $n;
		$users[ int(rand($n)) ] = pick(@text) if rand() < 0.4;
		$amounts[ int(rand($n)) ] = pick(@numeric) if rand() < 0.4;
		$reqs[ int(rand($n)) ] = pick(@text) if rand() < 0.4;
		my @args = ("$a\::bigint",
			rand() < 0.15 ? arr(\@text, 'text', $n) : 'ARRAY[' . join(', ', map {"($_)"} @users) . ']::text[]');
		push @args, rand() < 0.15 ? arr(\@numeric, 'numeric', 1 + int(rand(4)))
		  : 'ARRAY[' . join(', ', map {"($_)"} @amounts) . ']::numeric[]'
		  if rand() < 0.85;
		push @args, rand() < 0.15 ? arr(\@text, 'text', 1 + int(rand(4)))
		  : 'ARRAY[' . join(', ', map {"($_)"} @reqs) . ']::text[]'
		  if @args == 3 && rand() < 0.7;
		return ('batch', 'SELECT * FROM redpacket.rp_claim_batch(' . join(', ', @args) . ');');
	}
	if ($p < 0.62)
	{
		# a valid activity with some arguments mutated or left out
		my %arg = (
			total => '(' . pick('100.00', '10', '0.30', '5000') . ')::numeric',
			packets => '(' . pick('NULL', '3', '50') . ')::integer',
			starts_at => '(now())::timestamptz',
			ends_at => '(NULL)::timestamptz',
			stripes => '(' . pick('1', '2', '4', '16') . ')::integer',
			name => "('fuzz')::text",
			scale => '(2)::integer',
			per_user_limit => '(' . pick('1', '1', '2', '3') . ')::integer');
		my %pool = (
			total => [ \@numeric, 'numeric' ], packets => [ \@int, 'integer' ],
			starts_at => [ \@ts, 'timestamptz' ], ends_at => [ \@ts, 'timestamptz' ],
			stripes => [ \@int, 'integer' ], name => [ \@text, 'text' ],
			scale => [ [ @int, '0', '3', '4' ], 'integer' ], per_user_limit => [ \@int, 'integer' ]);
		my @names = sort keys %arg;
		for (1 .. pick(0, 1, 1, 2, 3))
		{
			my $k = pick(@names);
			$arg{$k} = v(@{ $pool{$k} });
		}
		my @args = ($arg{total});
		for my $k (grep { $_ ne 'total' } @names)
		{
			push @args, "$k => $arg{$k}" if rand() < 0.6;
		}
		return ('create', 'SELECT redpacket.rp_create_activity(' . join(', ', @args) . ');');
	}
	return ('close', "SELECT redpacket.rp_close_activity($a\::bigint);") if $p < 0.645;
	return ('freeze', "SELECT redpacket.rp_freeze($a\::bigint, " . v(\@text, 'text') . ');')
	  if $p < 0.70;
	return ('unfreeze', "SELECT redpacket.rp_unfreeze($a\::bigint);") if $p < 0.81;
	if ($p < 0.91)
	{
		my $r = rand();
		return ('reconcile', 'SELECT count(*) FROM redpacket.rp_reconcile();') if $r < 0.2;
		return ('reconcile', "SELECT count(*) FROM redpacket.rp_reconcile($a\::bigint);") if $r < 0.5;
		return ('reconcile',
			"SELECT count(*) FROM redpacket.rp_reconcile($a\::bigint, " . v(\@bool, 'boolean') . ');');
	}
	if ($p < 0.96)
	{
		return ('status', "SELECT count(*) FROM redpacket.activity_status WHERE id = $a\::bigint;");
	}
	return ('grant', 'SELECT redpacket.' . pick('rp_grant_app', 'rp_grant_operator')
		  . '(' . pick('NULL', "'fuzz_operator'") . '::regrole);');
}

my $tmp = PostgreSQL::Test::Utils::tempdir;
my @lines = ('\\set VERBOSITY verbose', '\\set ON_ERROR_STOP 0');
my @what = ('', '');

# First every edge value in every position of rp_claim, on every activity
# (with the other arguments valid), then random calls.
for my $a (@known)
{
	for my $t (@text)
	{
		push @lines, "SELECT * FROM redpacket.rp_claim(($a)::bigint, ($t)::text, (0.01)::numeric, ('r1')::text);";
		push @lines, "SELECT * FROM redpacket.rp_claim(($a)::bigint, ('edge-" . int(rand(1e9))
		  . "')::text, (0.01)::numeric, ($t)::text);";
		push @what, 'edge claim', 'edge claim';
	}
	for my $n (@numeric)
	{
		push @lines, "SELECT * FROM redpacket.rp_claim(($a)::bigint, ('edge-" . int(rand(1e9))
		  . "')::text, ($n)::numeric, ('r1')::text);";
		push @what, 'edge claim';
	}
}
for my $t (@text)
{
	push @lines, "SELECT * FROM redpacket.rp_claim_batch(($known[2])::bigint, ARRAY['edge-b1', ($t)]::text[], "
	  . "ARRAY[0.01, 0.01]::numeric[], ARRAY['r1', ($t)]::text[]);";
	push @what, 'edge batch';
}
for my $i (1 .. $FUZZ_STATEMENTS)
{
	my $app = rand() < 0.2;
	my ($kind, $sql) = fuzz_statement($app);
	$sql = "BEGIN; $sql ROLLBACK;" if rand() < 0.05;
	$sql = "SET ROLE fuzz_app; $sql RESET ROLE;" if $app;
	push @lines, $sql;
	push @what, ($app ? 'app ' : '') . $kind;
}
open(my $fh, '>', "$tmp/fuzz.sql") or die;
print $fh join("\n", @lines), "\n";
close $fh;

my $offset = -s $node->logfile;
my ($out, $err) = ('', '');
IPC::Run::run(
	[   $node->installed_command('psql'), '-X', '-q', '-At', '-d', $node->connstr('postgres'),
		'-f', "$tmp/fuzz.sql" ],
	'>', \$out, '2>', \$err, IPC::Run::timeout(150));
unlike($err, qr/connection to server was lost|server closed the connection/,
	'the fuzzer never lost its connection');

my (%states, %by_kind, %bad);
my $n_errors = 0;
while ($err =~ /^psql:[^:]*:(\d+): ERROR:\s+([0-9A-Z]{5}): (.*)$/mg)
{
	my ($line, $state, $msg) = ($1, $2, $3);
	my $kind = $what[ $line - 1 ] // '?';
	$n_errors++;
	$states{$state}++;
	$by_kind{"$kind $state"}++;
	my $ok = $kind =~ /batch/ ? $allowed_batch{$state} : $allowed{$state};
	push @{ $bad{"$kind $state"} }, "line $line: $msg\n    " . substr($lines[ $line - 1 ], 0, 300)
	  unless $ok;
}
my %calls;
$calls{$_}++ for @what[ 2 .. $#what ];
note('fuzzer: ' . ($#what - 1) . ' statements (' . join(', ', map {"$_ $calls{$_}"} sort keys %calls) . ')');
note("fuzzer: $n_errors errors, SQLSTATEs: " . join(', ', map {"$_: $states{$_}"} sort keys %states));
note('fuzzer: by call: ' . join(', ', map {"$_: $by_kind{$_}"} sort keys %by_kind));
is(join(', ', map { "$_: " . scalar(@{ $bad{$_} }) } sort keys %bad),
	'', 'every error of the fuzzer has a documented SQLSTATE')
  or diag(join("\n", map { "$_, e.g.:\n  " . join("\n  ", @{ $bad{$_} }[ 0 .. ($#{ $bad{$_} } < 2 ? $#{ $bad{$_} } : 2) ]) } sort keys %bad));
unlike($err, qr/FATAL|PANIC/, 'no FATAL or PANIC');
my @srv = server_errors($offset);
is(scalar(grep { $_->{kind} ne 'ERROR' } @srv), 0, 'the server log has no FATAL or PANIC either');

# --- The server and the books ----------------------------------------------------

is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$started, 'pg_postmaster_start_time is unchanged: the server never restarted');
ok(!$node->log_contains(qr/terminated by signal|server process .* was terminated|TRAP:/),
	'no "terminated by signal" in the server log');

my $books = $node->safe_psql(
	'postgres', RedpacketTest::books_view() . q{
WITH b AS (SELECT * FROM rp_books)
SELECT count(*),
       count(*) FILTER (WHERE NOT balanced),
       (SELECT count(*) FROM redpacket.claim),
       (SELECT count(*) FROM (SELECT 1 FROM redpacket.claim c JOIN redpacket.activity a ON a.id = c.activity_id
                              GROUP BY c.activity_id, c.user_id, a.per_user_limit
                              HAVING count(*) > a.per_user_limit) x)
FROM b});
my ($n_act, $unbalanced, $n_claims, $over) = split /\|/, $books;
note("at the end: $n_act activities, $n_claims claims");
is($unbalanced, 0, 'every activity: claims + stripe balances + returned = funded = total, counts agree');
is($over, 0, 'no user holds more than per_user_limit claims');
is($node->safe_psql('postgres', 'SELECT count(*) FROM redpacket.reconciliation WHERE NOT ok'),
	0, 'no reconciliation pass during the fuzzing found a mismatch');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FILTER (WHERE NOT ok) || \'/\' || count(*) FROM redpacket.rp_reconcile(NULL, true)'),
	"0/$n_act",
	'rp_reconcile(NULL, true) is ok for every activity');

$node->stop;
done_testing();
