/*
 * launcher.c
 *		The reconciler launcher: one long-lived background worker, registered
 *		from _PG_init when redpacket is preloaded, connected to no database.
 *		Every redpacket.reconcile_interval seconds it lists the databases
 *		that accept connections and queues a reconciler (worker.c) for each;
 *		it runs at most redpacket.max_workers of them at once, in queue
 *		order.  A reconciler looks for the extension, runs one pass when it
 *		is there, reports back through a slot in shared memory and exits, so
 *		the launcher needs no configuration to find the databases with the
 *		extension and notices CREATE and DROP EXTENSION at the next round.
 *		A database whose pass outlasts the interval is queued again as soon
 *		as that pass ends (passes follow each other without a gap while
 *		there is more to do than an interval holds).  A database still
 *		queued when its next round comes means the workers cannot keep up:
 *		that is logged, with the setting to raise.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "ops.h"

PG_FUNCTION_INFO_V1(rp_launcher_running);

/* Seconds between two lines about databases that waited for a reconciler. */
#define RP_LATE_LOG_SECS 60

/* What a reconciler found, written by it just before it exits. */
typedef struct RpSlot
{
	Oid			dboid;
	RpWorkerResult result;
} RpSlot;

typedef struct RpLauncherShared
{
	pid_t		launcher_pid;	/* 0 while no launcher runs */
	int			nslots;
	RpSlot		slots[FLEXIBLE_ARRAY_MEMBER];
} RpLauncherShared;

/* The launcher's own view of one database. */
typedef struct RpDb
{
	Oid			dboid;			/* hash key */
	NameData	name;
	bool		seen;			/* listed in the latest round */
	bool		queued;
	bool		running;
	bool		owed;			/* its round came while it ran: next pass at once */
	RpWorkerResult known;		/* what its last reconciler found */
} RpDb;

int			rp_reconcile_interval = RP_DEFAULT_RECONCILE_INTERVAL;
static int	rp_max_workers = RP_DEFAULT_MAX_WORKERS;
static char *rp_database = NULL;

static RpLauncherShared *rp_launcher = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* launcher-local state */
static HTAB *dbs = NULL;
static bool no_slot = false;	/* a reconciler could not start since the last round */
static TimestampTz late_logged_at = 0;	/* the last "databases waited" line */
static List *queue = NIL;		/* database oids waiting for a slot */
static BackgroundWorkerHandle **handles = NULL; /* by slot; NULL when free */

static Size
LauncherShmemSize(void)
{
	return add_size(offsetof(RpLauncherShared, slots),
					mul_size(rp_max_workers, sizeof(RpSlot)));
}

static void
LauncherShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(LauncherShmemSize());
}

static void
LauncherShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rp_launcher = ShmemInitStruct("redpacket launcher", LauncherShmemSize(), &found);
	if (!found)
	{
		memset(rp_launcher, 0, LauncherShmemSize());
		rp_launcher->nslots = rp_max_workers;
	}
	LWLockRelease(AddinShmemInitLock);
}

static void
LauncherGone(int code, Datum arg)
{
	rp_launcher->launcher_pid = 0;
}

/*
 * rp_launcher_running(): whether the launcher runs on this server, from
 * shared memory, so that every role that may call it gets the same answer
 * (pg_stat_activity hides other roles' backends from a role without
 * pg_read_all_stats).  False when the library was not preloaded.
 */
Datum
rp_launcher_running(PG_FUNCTION_ARGS)
{
	pid_t		pid = rp_launcher != NULL ? rp_launcher->launcher_pid : 0;

	PG_RETURN_BOOL(pid != 0 && BackendPidGetProc(pid) != NULL);
}

/*
 * Called from _PG_init: the settings, and while preloading the shared
 * slots and the launcher.  Postmaster-level settings can only be defined
 * while preloading; they only matter to the workers, which exist only then.
 */
void
RpLauncherInit(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("redpacket.reconcile_interval",
							"Seconds between reconciliation passes of the background worker.",
							"0 pauses the worker without stopping it.",
							&rp_reconcile_interval,
							RP_DEFAULT_RECONCILE_INTERVAL, RP_MIN_RECONCILE_INTERVAL,
							RP_MAX_RECONCILE_INTERVAL,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomStringVariable("redpacket.database",
							   "Obsolete and ignored: the launcher reconciles every database with the extension.",
							   NULL,
							   &rp_database,
							   "",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("redpacket.max_workers",
							"Most reconcilers (one per database) running at once.",
							"Each takes a max_worker_processes slot while it runs.",
							&rp_max_workers,
							RP_DEFAULT_MAX_WORKERS, RP_MIN_MAX_WORKERS, RP_MAX_MAX_WORKERS,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = LauncherShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = LauncherShmemStartup;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "redpacket");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "RpLauncherMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "redpacket launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "redpacket launcher");
	RegisterBackgroundWorker(&worker);
}

/* Called by a reconciler just before it exits. */
void
RpLauncherReport(int slot, Oid dboid, RpWorkerResult result)
{
	if (rp_launcher == NULL || slot < 0 || slot >= rp_launcher->nslots)
		return;
	rp_launcher->slots[slot].dboid = dboid;
	pg_write_barrier();
	rp_launcher->slots[slot].result = result;
}

/*
 * Mark every database that accepts connections as seen (adding new ones)
 * and forget those that are gone.  Reads pg_database, a shared catalog, the
 * way the autovacuum launcher does.
 */
static void
ListDatabases(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	HASH_SEQ_STATUS seq;
	RpDb	   *db;

	hash_seq_init(&seq, dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
		db->seen = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);
		bool		found;

		if (!d->datallowconn || database_is_invalid_form(d))
			continue;
		db = hash_search(dbs, &d->oid, HASH_ENTER, &found);
		if (!found)
		{
			db->queued = db->running = db->owed = false;
			db->known = RP_WORKER_NONE;
		}
		db->name = d->datname;
		db->seen = true;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();

	hash_seq_init(&seq, dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
		if (!db->seen && !db->running)
		{
			queue = list_delete_oid(queue, db->dboid);
			(void) hash_search(dbs, &db->dboid, HASH_REMOVE, NULL);
		}
}

/*
 * A new round: queue every database that has no reconciler queued or
 * running.  One still queued from the previous round waited a whole
 * interval for a slot: say so.
 */
static void
StartRound(void)
{
	HASH_SEQ_STATUS seq;
	RpDb	   *db;
	int			late = 0;

	ListDatabases();
	hash_seq_init(&seq, dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (db->queued)
			late++;
		else if (db->running)
			db->owed = true;	/* a pass longer than the interval */
		else
		{
			db->queued = true;
			queue = lappend_oid(queue, db->dboid);
		}
	}
	/* a line at most every RP_LATE_LOG_SECS, naming the setting that binds */
	if (late > 0 &&
		TimestampDifferenceExceeds(late_logged_at, GetCurrentTimestamp(), RP_LATE_LOG_SECS * 1000))
	{
		if (no_slot)
			ereport(LOG,
					(errmsg("redpacket: %d database(s) waited a whole redpacket.reconcile_interval (%d s) for a reconciler: no background worker slot was free",
							late, rp_reconcile_interval),
					 errhint("Raise max_worker_processes (%d now; the launcher and up to redpacket.max_workers reconcilers each need one, besides everything else that uses them) and restart.",
							 max_worker_processes)));
		else
			ereport(LOG,
					(errmsg("redpacket.max_workers (%d) is too small: %d database(s) waited a whole redpacket.reconcile_interval (%d s) for a reconciler",
							rp_max_workers, late, rp_reconcile_interval),
					 errhint("Raise redpacket.max_workers (and max_worker_processes) and restart, or lengthen redpacket.reconcile_interval.")));
		late_logged_at = GetCurrentTimestamp();
	}
	no_slot = false;
}

/* Log the start and the end of reconciling one database. */
static void
NoteResult(RpDb *db, RpWorkerResult result)
{
	if (result == RP_WORKER_PASSED && db->known != RP_WORKER_PASSED)
		ereport(LOG,
				(errmsg("redpacket launcher: reconciling database \"%s\" every %d s",
						NameStr(db->name), rp_reconcile_interval)));
	else if (result == RP_WORKER_ABSENT && db->known == RP_WORKER_PASSED)
		ereport(LOG,
				(errmsg("redpacket launcher: the extension is gone from database \"%s\": stopped reconciling it",
						NameStr(db->name))));
	if (result != RP_WORKER_NONE)
		db->known = result;
}

/* Collect the reports of reconcilers that have exited and free their slots. */
static void
ReapWorkers(void)
{
	for (int i = 0; i < rp_max_workers; i++)
	{
		pid_t		pid;
		RpSlot	   *s = &rp_launcher->slots[i];
		RpDb	   *db;

		if (handles[i] == NULL ||
			GetBackgroundWorkerPid(handles[i], &pid) != BGWH_STOPPED)
			continue;
		pfree(handles[i]);
		handles[i] = NULL;
		pg_read_barrier();
		db = hash_search(dbs, &s->dboid, HASH_FIND, NULL);
		if (db != NULL && db->running)
		{
			db->running = false;
			NoteResult(db, s->result);
			/* its pass outlasted a round: the next one follows at once */
			if (db->owed && db->known == RP_WORKER_PASSED && !db->queued &&
				rp_reconcile_interval > 0)
			{
				db->queued = true;
				queue = lappend_oid(queue, db->dboid);
			}
			db->owed = false;
		}
		s->dboid = InvalidOid;
		s->result = RP_WORKER_NONE;
	}
}

/* Start a reconciler for dboid in free slot i; false when none could start. */
static bool
StartWorker(Oid dboid, int i)
{
	BackgroundWorker w;
	RpSlot	   *s = &rp_launcher->slots[i];

	memset(&w, 0, sizeof(w));
	w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w.bgw_start_time = BgWorkerStart_RecoveryFinished;
	w.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(w.bgw_library_name, BGW_MAXLEN, "redpacket");
	snprintf(w.bgw_function_name, BGW_MAXLEN, "RpWorkerMain");
	snprintf(w.bgw_name, BGW_MAXLEN, "redpacket reconciler for database %u", dboid);
	snprintf(w.bgw_type, BGW_MAXLEN, "redpacket reconciler");
	w.bgw_main_arg = Int32GetDatum(i);
	memcpy(w.bgw_extra, &dboid, sizeof(Oid));
	w.bgw_notify_pid = MyProcPid;

	/* the slot is ours until the reconciler exits: mark it before it runs */
	s->dboid = dboid;
	s->result = RP_WORKER_NONE;
	return RegisterDynamicBackgroundWorker(&w, &handles[i]);
}

/* Start queued reconcilers while there are free slots. */
static void
LaunchQueued(void)
{
	static bool full_logged = false;

	for (int i = 0; i < rp_max_workers && queue != NIL; i++)
	{
		Oid			dboid = linitial_oid(queue);
		RpDb	   *db;

		if (handles[i] != NULL)
			continue;
		if (!StartWorker(dboid, i))
		{
			handles[i] = NULL;
			no_slot = true;
			if (!full_logged)
				ereport(WARNING,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("redpacket launcher could not start a reconciler: no free background worker slot"),
						 errhint("Raise max_worker_processes; the launcher and up to redpacket.max_workers reconcilers each need one.")));
			full_logged = true;
			return;
		}
		full_logged = false;
		queue = list_delete_first(queue);
		db = hash_search(dbs, &dboid, HASH_FIND, NULL);
		if (db != NULL)
		{
			db->queued = false;
			db->running = true;
		}
	}
}

static void
ForgetQueue(void)
{
	ListCell   *lc;

	foreach(lc, queue)
	{
		Oid			dboid = lfirst_oid(lc);
		RpDb	   *db = hash_search(dbs, &dboid, HASH_FIND, NULL);

		if (db != NULL)
			db->queued = false;
	}
	list_free(queue);
	queue = NIL;
}

static bool
AnyRunning(void)
{
	for (int i = 0; i < rp_max_workers; i++)
		if (handles[i] != NULL)
			return true;
	return false;
}

void
RpLauncherMain(Datum main_arg)
{
	HASHCTL		info;
	TimestampTz next_round = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("redpacket launcher");
	MemoryContextSwitchTo(TopMemoryContext);
	rp_launcher->launcher_pid = MyProcPid;
	on_shmem_exit(LauncherGone, (Datum) 0);

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(RpDb);
	dbs = hash_create("redpacket databases", 64, &info, HASH_ELEM | HASH_BLOBS);
	handles = MemoryContextAllocZero(TopMemoryContext,
									 sizeof(BackgroundWorkerHandle *) * rp_max_workers);
	if (rp_database != NULL && rp_database[0] != '\0')
		ereport(LOG,
				(errmsg("redpacket.database is obsolete and ignored: every database with the extension is reconciled")));
	ereport(LOG,
			(errmsg("redpacket launcher started: up to %d reconcilers at once, every %d s",
					rp_max_workers, rp_reconcile_interval)));

	for (;;)
	{
		long		timeout = -1;
		int			events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			next_round = 0;		/* a changed interval applies at once */
		}

		ReapWorkers();
		if (rp_reconcile_interval > 0)
		{
			TimestampTz now = GetCurrentTimestamp();

			if (now >= next_round)
			{
				StartRound();
				next_round = TimestampTzPlusMilliseconds(now, rp_reconcile_interval * 1000L);
			}
			timeout = TimestampDifferenceMilliseconds(now, next_round);
		}
		else
			ForgetQueue();		/* paused: start nothing new */
		LaunchQueued();

		/* reconcilers wake us when they exit (bgw_notify_pid); paused: sleep */
		if (queue != NIL && !AnyRunning())
			timeout = 1000L;	/* no worker slot: try again soon */
		if (timeout >= 0)
			events |= WL_TIMEOUT;
		(void) WaitLatch(MyLatch, events, timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
