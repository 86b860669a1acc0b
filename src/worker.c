/*
 * worker.c
 *		One reconciler: a short-lived background worker that the launcher
 *		(launcher.c) starts in one database.  It connects, looks for the
 *		extension, runs one pass (RpWorkerPass, which pins the search_path and
 *		commits per activity) when it is there, reports
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
	pgstat_report_appname("redpacket reconciler");

	present = ExtensionPresent();
	if (present)
		RpWorkerPass();
	RpLauncherReport(slot, dboid, present ? RP_WORKER_PASSED : RP_WORKER_ABSENT);
	proc_exit(0);
}
