/*
 * worker.c
 *		The reconciliation background worker.  Registered from _PG_init when
 *		redpacket is in shared_preload_libraries, it connects to
 *		redpacket.database and every redpacket.reconcile_interval seconds runs
 *		RpWorkerPass (reconcile.c), which commits per activity and pins the
 *		process's search_path.  It keeps
 *		no state of its own: after an error the postmaster restarts it and it
 *		carries on from the tables.
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

/* how long to sleep while paused (interval 0) before looking again */
#define RP_PAUSED_SLEEP_MS 1000L

void
RpRegisterWorker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "redpacket");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "RpWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "redpacket reconciler");
	snprintf(worker.bgw_type, BGW_MAXLEN, "redpacket reconciler");
	RegisterBackgroundWorker(&worker);
}

void
RpWorkerMain(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(rp_database, NULL, 0);
	pgstat_report_appname("redpacket reconciler");
	elog(LOG, "redpacket reconciler started in database \"%s\"", rp_database);

	for (;;)
	{
		long		sleep_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		if (rp_reconcile_interval > 0)
		{
			RpWorkerPass();
			sleep_ms = rp_reconcile_interval * 1000L;
		}
		else
			sleep_ms = RP_PAUSED_SLEEP_MS;

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
