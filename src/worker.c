/*
 * worker.c
 *		One reconciler: a short-lived background worker that the launcher
 *		(launcher.c) starts in one database.  It connects, pins its
 *		search_path, looks for the extension, runs one pass like
 *		rp_reconcile() in transactions of its own when it is there, reports
 *		what it found to the launcher and exits.  Not staying connected
 *		between passes is what keeps DROP DATABASE and CREATE DATABASE ...
 *		TEMPLATE from waiting for it.  It keeps no state of its own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "redpacket.h"

/* One pass in its own transaction; quiet when there is nothing to do. */
static void
WorkerPass(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	/* the pass needs a snapshot taken after its locks: see reconcile.c */
	XactIsoLevel = XACT_READ_COMMITTED;
	PushActiveSnapshot(GetTransactionSnapshot());

	if (!RecoveryInProgress() && OidIsValid(get_extension_oid("redpacket", true)))
	{
		int			n;

		pgstat_report_activity(STATE_RUNNING, "redpacket reconciliation pass");
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		n = RpReconcilePass(NULL, false, NULL);
		SPI_finish();
		if (n > 0)
			elog(DEBUG1, "redpacket reconciler checked %d activities", n);
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
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
	/* every name the pass resolves must come from pg_catalog or be qualified */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	pgstat_report_appname("redpacket reconciler");

	present = ExtensionPresent();
	if (present)
		WorkerPass();
	RpLauncherReport(slot, dboid, present ? RP_WORKER_PASSED : RP_WORKER_ABSENT);
	proc_exit(0);
}
