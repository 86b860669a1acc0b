/*
 * worker.c
 *		One reconciler: a short-lived background worker that the launcher
 *		(launcher.c) starts in one database.  It connects, looks for the
 *		extension, runs one pass (WorkerPass, which pins the search_path and
 *		runs each step of the pass of reconcile.c in a transaction of its
 *		own) when it is there, reports what it found to the launcher and
 *		exits.  Not staying connected
 *		between passes is what keeps DROP DATABASE and CREATE DATABASE ...
 *		TEMPLATE from waiting for it; a long pass stops between two
 *		activities as soon as one of those commands waits for the database
 *		(RpDatabaseWanted).  It keeps no state of its own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "base/base.h"
#include "ops/ops.h"
#include "pass.h"
#include "worker.h"

/* a reconciler's longest lock wait */
#define RP_WORKER_LOCK_TIMEOUT "5s"

/*
 * Settings a database owner (or a role) may set with ALTER DATABASE/ROLE
 * SET that would stop or distort a superuser's pass: overridden for the
 * reconciler's whole life, above any database or role setting.  The pass
 * waits for an activity lock at most RP_WORKER_LOCK_TIMEOUT, so one long claim
 * transaction costs its activity one check (recorded as an error and
 * retried next pass), never the pass, nor the launcher slot other
 * databases wait for.
 */
static void
OverrideSettings(void)
{
	static const char *const settings[][2] = {
		{"default_transaction_read_only", "off"},
		{"default_transaction_isolation", "read committed"},
		{"statement_timeout", "0"},
		{"idle_in_transaction_session_timeout", "0"},
		{"lock_timeout", RP_WORKER_LOCK_TIMEOUT},
		{"jit", "off"},			/* as RpPassSettings: no compiling index probes */
	};

	for (int i = 0; i < lengthof(settings); i++)
		SetConfigOption(settings[i][0], settings[i][1], PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * Does nobody wait to have this database to itself?  DROP DATABASE and
 * CREATE DATABASE ... TEMPLATE lock the database object (AccessExclusiveLock
 * and ShareLock) before they wait up to 5 s for the other sessions to
 * leave, and PostgreSQL 15 does not signal background workers for them; a
 * RowExclusiveLock probe that does not wait fails exactly while one of them
 * is there.  The probe is released at once.  A reconciler calls this
 * between two activities and stops its pass when it returns false.
 */
static bool
DatabaseWanted(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	if (LockAcquire(&tag, RowExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
	{
		elog(DEBUG1, "redpacket reconciler stops: another session waits for database %u", MyDatabaseId);
		return false;
	}
	LockRelease(&tag, RowExclusiveLock, false);
	return true;
}

/*
 * Run fn(arg) in a transaction of its own, READ COMMITTED (each check reads
 * with a snapshot taken after it holds the stripe locks), inside SPI.
 */
static void
InTransaction(void (*fn) (void *), void *arg)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	XactIsoLevel = XACT_READ_COMMITTED;
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	fn(arg);
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
}

/* The state of a worker pass, kept across its transactions. */
typedef struct RpWorkerState
{
	MemoryContext cxt;
	bool		go;				/* false: nothing to do (or stop) */
	bool		more;			/* steps left */
	RpPass	   *pass;
} RpWorkerState;

/*
 * Is the extension installed, and will it stay until this transaction
 * ends?  DROP EXTENSION locks the extension object in AccessExclusiveLock
 * before it drops anything; a share lock, taken only if free and held to
 * the end of the transaction, makes a later drop wait for this step (one
 * batch) and keeps a drop already under way from pulling the tables from
 * under it.
 */
static bool
ExtensionStays(void)
{
	Oid			ext = get_extension_oid("redpacket", true);

	if (!OidIsValid(ext) ||
		!ConditionalLockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock))
		return false;
	/* the lock accepted invalidations: is it the same extension still? */
	return get_extension_oid("redpacket", true) == ext;
}

/*
 * May a worker transaction act?  The extension is installed, the server is
 * not in recovery, no restore is announced, and no other pass is running
 * (the reconciliation lock, held to this transaction's end).
 */
static bool
WorkerMayAct(void)
{
	return !RecoveryInProgress() && ExtensionStays() &&
		!RpRestoring() && DatabaseWanted() &&
		RpLock(RP_LOCK_RECONCILE, 0, 0, false);
}

static void
WorkerList(void *arg)
{
	RpWorkerState *w = arg;
	TimestampTz full_before = 0;
	Datum		full_share = (Datum) 0;

	w->go = WorkerMayAct();
	if (!w->go)
		return;
	if (rp_full_check_interval > 0)
	{
		/* spread: each pass fully checks its share of the interval */
		full_before = GetCurrentTransactionStartTimestamp() -
			(TimestampTz) rp_full_check_interval * USECS_PER_SEC;
		full_share = DirectFunctionCall2(numeric_div,
										 NumericGetDatum(int64_to_numeric(Max(rp_reconcile_interval, 1))),
										 NumericGetDatum(int64_to_numeric(rp_full_check_interval)));
	}
	w->more = RpPassList(w->pass, false, full_before, full_share) > 0;
}

static void
WorkerStep(void *arg)
{
	RpWorkerState *w = arg;

	w->go = WorkerMayAct();
	if (!w->go)
		return;
	pgstat_report_activity(STATE_RUNNING, "redpacket reconciliation pass");
	w->more = RpPassStep(w->pass);
}

static void
WorkerRecord(void *arg)
{
	RpWorkerState *w = arg;

	if (WorkerMayAct())
	{
		RpPassRecord(w->pass);
		RpIdsKeepUp();			/* ids.c: the marks that outlive the extension */
	}
}

/*
 * List what is pending, or give the pass up when the tables stay locked
 * longer than the worker's lock timeout: DDL on them, or rp_distribute()
 * converting them on a Citus cluster.  That is no failure of the pass, only
 * a late one; the next pass comes after redpacket.reconcile_interval.  Any
 * other error ends the worker as before.
 */
static void
WorkerListOrSkip(RpWorkerState *w)
{
	MemoryContext outer = CurrentMemoryContext;

	PG_TRY();
	{
		InTransaction(WorkerList, w);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(outer);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			PG_RE_THROW();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("redpacket reconciler skipped a pass: its tables stayed locked for %s",
						RP_WORKER_LOCK_TIMEOUT),
				 errdetail("Listing the pending activities failed: %s.", edata->message),
				 errhint("The next pass follows after redpacket.reconcile_interval.")));
		FreeErrorData(edata);
		w->go = false;
	}
	PG_END_TRY();
}

/*
 * One pass of the background worker in the current database: list what is
 * pending, then check each activity in a transaction of its own, so the
 * pass holds the stripe locks of one activity at a time however many
 * activities expire together.  Called with no transaction open.  Returns
 * quietly when the extension is not installed, in recovery, while
 * RpRestoring(), or while another pass runs (that pass is stopped between
 * two activities as soon as one of those becomes true).
 *
 * The search_path of the calling process is pinned here, for the process's
 * whole life and above any database or role setting (PGC_S_OVERRIDE): the
 * worker runs as a superuser, and nothing it runs may resolve a name through
 * a schema a database owner can write.
 */
static void
WorkerPass(void)
{
	RpWorkerState w;

	SetConfigOption("search_path", RP_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);

	memset(&w, 0, sizeof(w));
	w.cxt = AllocSetContextCreate(TopMemoryContext, "redpacket worker pass",
								  ALLOCSET_DEFAULT_SIZES);
	w.pass = RpPassCreate(w.cxt);
	WorkerListOrSkip(&w);
	while (w.go && w.more)
	{
		CHECK_FOR_INTERRUPTS();
		InTransaction(WorkerStep, &w);
	}
	if (w.go)
	{
		/* also when nothing was due: the status shows the reconciler alive */
		InTransaction(WorkerRecord, &w);
	}
	MemoryContextDelete(w.cxt);
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Is the extension installed in this database? */
static bool
ExtensionPresent(void)
{
	bool		present;

	StartTransactionCommand();
	present = OidIsValid(get_extension_oid("redpacket", true));
	CommitTransactionCommand();
	return present;
}

void
RpWorkerMain(Datum main_arg)
{
	int			slot = DatumGetInt32(main_arg);
	Oid			dboid;
	bool		present;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	OverrideSettings();
	pgstat_report_appname("redpacket reconciler");

	present = ExtensionPresent();
	if (present)
		WorkerPass();
	RpLauncherReport(slot, dboid, present ? RP_WORKER_PASSED : RP_WORKER_ABSENT);
	proc_exit(0);
}
