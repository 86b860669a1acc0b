# Behind PgBouncer in transaction pooling mode (32 clients sharing 8 server
# connections, so consecutive transactions of one client run on different
# backends and one backend serves many clients), a pgbench stress run as an
# application role keeps every invariant: fresh users, returning users
# (duplicates), multi-claim transactions, rolled-back claims, lucky draws, a
# red-packet rain, and an activity that runs out exactly.  Meanwhile another
# session holds application advisory locks on every key a naive
# implementation might use (activity ids, (activity, stripe) pairs): claims
# never wait for them.  Afterwards no advisory lock of ours remains on the
# pooled server connections, which sit idle, not idle in transaction.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use RedpacketTest;

my ($pgbouncer) = grep { -x $_ } (
	(map {"$_/pgbouncer"} split /:/, ($ENV{PATH} // '')),
	'/usr/sbin/pgbouncer', '/usr/bin/pgbouncer');
plan skip_all => 'pgbouncer is not installed' unless $pgbouncer;

my $node = PostgreSQL::Test::Cluster->new('bouncer');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
max_connections = 40
max_locks_per_transaction = 256
log_line_prefix = '%m [%p] %e '
log_statement = none
});
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION redpacket;
CREATE ROLE rp_app LOGIN;
SELECT redpacket.rp_grant_app('rp_app');
-- A claim waiting on a colliding application lock would show as an error.
ALTER ROLE rp_app SET lock_timeout = '10s';
});

my %act;
$act{runout} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(100.00, stripes => 16, name => 'runs out')");
$act{big} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(1000000.00, stripes => 16, name => 'big')");
$act{lucky} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(800.00, packets => 1500, stripes => 8, name => 'lucky')");
$act{rain} = $node->safe_psql('postgres',
	"SELECT redpacket.rp_create_activity(5000.00, stripes => 4, per_user_limit => 2, name => 'rain')");
my $acts = join(',', map { $act{$_} } sort keys %act);

# --- PgBouncer ---------------------------------------------------------------

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $bport = PostgreSQL::Test::Cluster::get_free_port();
my $pghost = $node->host;
my $pgport = $node->port;
my $osuser = getpwuid($<);
open(my $fh, '>', "$tmp/userlist.txt") or die;
print $fh qq{"rp_app" ""\n"$osuser" ""\n};
close $fh;
open($fh, '>', "$tmp/pgbouncer.ini") or die;
print $fh qq{[databases]
postgres = host=$pghost port=$pgport dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $tmp/userlist.txt
pool_mode = transaction
default_pool_size = 8
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 200
max_db_connections = 8
server_lifetime = 3600
server_idle_timeout = 3600
ignore_startup_parameters = extra_float_digits
logfile = $tmp/pgbouncer.log
pidfile = $tmp/pgbouncer.pid
};
close $fh;
my $bouncer = IPC::Run::start([ $pgbouncer, "$tmp/pgbouncer.ini" ],
	'>', "$tmp/pgbouncer.out", '2>&1');

my $bconn = "host=127.0.0.1 port=$bport dbname=postgres user=rp_app";
my $psql = $node->installed_command('psql');
my $up = 0;
for (1 .. 100)
{
	my ($o, $e) = ('', '');
	if (IPC::Run::run([ $psql, '-X', '-Atc', 'SELECT 1', $bconn ], '>', \$o, '2>', \$e)
		&& $o eq "1\n")
	{
		$up = 1;
		last;
	}
	select(undef, undef, undef, 0.1);
}
ok($up, "pgbouncer accepts connections on 127.0.0.1:$bport") or BAIL_OUT('no pgbouncer');

# --- Application advisory locks on every key we might collide with ------------

my $holder = $node->background_psql('postgres');
$holder->query_safe(qq{
SELECT count(pg_advisory_lock(a)) + count(pg_advisory_lock(a::int, s)) + count(pg_advisory_lock(s, a::int))
     + count(pg_advisory_lock(a::int, a::int)) + count(pg_advisory_lock((a << 32) + s))
FROM unnest(ARRAY[$acts]::bigint[]) a, generate_series(0, 16) s;
});
my $held = $node->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
cmp_ok($held, '>', 100, "an application session holds $held advisory locks");

# --- The stress run ------------------------------------------------------------

my %script = (
	fresh => qq{\\set u random(1, 1000000000)
SELECT redpacket.rp_claim($act{runout}, 'f' || :u, 0.05);
},
	returning => qq{\\set u random(1, 300)
SELECT redpacket.rp_claim($act{runout}, 'd' || :u, 0.05);
SELECT redpacket.rp_claim($act{big}, 'd' || :u, 1.00);
},
	txn => qq{\\set u random(1, 1000000000)
\\set c random(1, 999)
BEGIN;
SELECT redpacket.rp_claim($act{big}, 't' || :u, :c * 0.01);
SELECT redpacket.rp_claim($act{runout}, 't' || :u, 0.05);
SELECT redpacket.rp_claim($act{lucky}, 't' || :u);
SELECT pg_sleep(0.001);
SELECT redpacket.rp_claim($act{rain}, 't' || (:u % 500), 0.10, 'r' || (:c % 3));
COMMIT;
},
	rollback => qq{\\set u random(1, 1000000000)
BEGIN;
SELECT redpacket.rp_claim($act{big}, 'x' || :u, 7.77);
SELECT redpacket.rp_claim($act{runout}, 'x' || :u, 0.05);
ROLLBACK;
},
	batch => qq{\\set u random(1, 1000000000)
SELECT count(*) FROM redpacket.rp_claim_batch($act{runout},
    ARRAY['b' || :u || 'a', 'b' || :u || 'b', 'd' || (:u % 300)], ARRAY[0.05, 0.05, 0.05]);
},
	lucky => qq{\\set u random(1, 3000)
SELECT redpacket.rp_claim($act{lucky}, 'l' || :u);
},
	rain => qq{\\set u random(1, 500)
\\set r random(1, 3)
SELECT redpacket.rp_claim($act{rain}, 'w' || :u, 0.25, 'r' || :r);
});
my %weight = (fresh => 5, returning => 2, txn => 2, rollback => 1, batch => 1, lucky => 2, rain => 2);
my @files;
for my $name (sort keys %script)
{
	open($fh, '>', "$tmp/$name.pgbench") or die;
	print $fh $script{$name};
	close $fh;
	push @files, '-f', "$tmp/$name.pgbench\@$weight{$name}";
}
my ($pb_out, $pb_err) = ('', '');
my $pb_ok = IPC::Run::run(
	[   $node->installed_command('pgbench'), '-n', '-c', '32', '-j', '2', '-T', '20',
		'--random-seed', '103', @files, $bconn ],
	'>', \$pb_out, '2>', \$pb_err);
ok($pb_ok, 'pgbench through pgbouncer exited 0') or diag("$pb_out\n$pb_err");
like($pb_out, qr/number of clients: 32/, '32 clients');
my ($tx) = $pb_out =~ /number of transactions actually processed: (\d+)/;
cmp_ok($tx // 0, '>', 2000, 'pgbench processed ' . ($tx // 0) . ' transactions');
unlike($pb_out, qr/number of failed transactions: [1-9]/, 'no failed transaction');
unlike($pb_err, qr/ERROR|FATAL|aborted/, 'no client error') or diag($pb_err);
note($pb_out =~ /(tps = [\d.]+)/ ? "pgbench: $tx transactions, $1" : $pb_out);

# --- After the run ------------------------------------------------------------

# The pooled server connections stay open (idle) with pgbouncer up.
my $backends = $node->safe_psql(
	'postgres', q{
SELECT count(*) || ' ' || count(*) FILTER (WHERE state = 'idle') || ' ' || count(*) FILTER (WHERE xact_start IS NOT NULL)
FROM pg_stat_activity WHERE usename = 'rp_app'});
my ($n_backends, $n_idle, $n_in_xact) = split / /, $backends;
ok($n_backends >= 1 && $n_backends <= 8,
	"pgbouncer used $n_backends server connections for 32 clients (at most default_pool_size 8)");
is($n_idle, $n_backends, 'every pooled server connection is idle');
is($n_in_xact, 0, 'no pooled server connection is inside a transaction');

is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		  WHERE l.locktype = 'advisory' AND a.usename = 'rp_app'}),
	0,
	'the pooled server connections hold no advisory lock');
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
	$held, "only the application's own advisory locks are held");
$holder->query_safe('SELECT pg_advisory_unlock_all()');
$holder->quit;
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"),
	0, 'no advisory lock at all once every client has finished');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid NOT IN (1, 2)"),
	0,
	'in particular none in redpacket\'s lock space');

my $checks = $node->safe_psql(
	'postgres', RedpacketTest::books_view() . qq{
WITH b AS (SELECT *, n_claims AS n FROM rp_books)
SELECT 'books balance', count(*) FILTER (WHERE balanced) || '/4' FROM b
UNION ALL
SELECT 'runs out: claims and remaining', n || ' ' || round(remaining, 2) FROM b WHERE id = $act{runout}
UNION ALL
SELECT 'lucky: packets left', coalesce(packets_left::text, '-') FROM b WHERE id = $act{lucky}
UNION ALL
SELECT 'rolled-back claims present', count(*)::text FROM redpacket.claim WHERE user_id LIKE 'x%'
UNION ALL
SELECT 'users over their limit', count(*)::text FROM (
    SELECT 1 FROM redpacket.claim c JOIN redpacket.activity a ON a.id = c.activity_id
     GROUP BY c.activity_id, c.user_id, a.per_user_limit HAVING count(*) > a.per_user_limit) x
UNION ALL
SELECT 'returning users: claims, users', count(*) || ' ' || count(DISTINCT user_id) FROM redpacket.claim
 WHERE activity_id = $act{big} AND user_id LIKE 'd%'
UNION ALL
SELECT 'transactions half done', count(*)::text FROM (
    SELECT user_id FROM redpacket.claim WHERE user_id LIKE 't%' AND activity_id IN ($act{big}, $act{runout})
    GROUP BY user_id HAVING count(*) = 1 AND bool_or(activity_id = $act{runout})) x
UNION ALL
SELECT 'reconciliation not ok', count(*) FILTER (WHERE NOT ok) || ' of ' || count(*)
  FROM redpacket.rp_reconcile(NULL, true)});
my %c = map { split /\|/ } split /\n/, $checks;
is($c{'books balance'}, '4/4', 'every activity: funded = claims + remaining + returned, counts agree');
is($c{'runs out: claims and remaining'}, '2000 0.00',
	'the activity that ran out paid exactly 2000 claims of 0.05 and has nothing left');
is($c{'lucky: packets left'}, '0', 'every lucky packet was drawn');
is($c{'rolled-back claims present'}, '0', 'rolled-back transactions left no claim');
is($c{'users over their limit'}, '0', 'no user over per_user_limit');
my ($ret_claims, $ret_users) = split / /, $c{'returning users: claims, users'};
ok($ret_users > 100 && $ret_claims == $ret_users,
	"returning users came back often and each holds one claim ($ret_claims claims, $ret_users users)");
is($c{'transactions half done'}, '0',
	'no transaction kept its runout claim without its big claim');
is($c{'reconciliation not ok'}, '0 of 4', 'rp_reconcile(NULL, true) is ok for every activity');

my $blog = slurp_file("$tmp/pgbouncer.log");
unlike($blog, qr/ERROR|WARNING.*(server|client).*(closed|error)/, 'pgbouncer logged no error')
  or diag(join("\n", grep {/ERROR|WARNING/} split /\n/, $blog));

$bouncer->kill_kill(grace => 5);
ok(!$node->log_contains(qr/terminated by signal|PANIC|TRAP:/), 'no backend crashed');
$node->stop;
done_testing();
