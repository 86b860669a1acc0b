/*
 * worker.c
 *		One reconciler: a short-lived background worker that the launcher
 *		(launcher.c) starts in one database.  It connects, looks for the
 *		extension, runs one pass (RpWorkerPass, which pins the search_path and
 *		commits per activity) when it is there, reports
 *		what it found to the launcher and exits.  Not staying connected
 *		between passes is what keeps DROP DATABASE and CREATE DATABASE ...
 *		TEMPLATE from waiting for it; a long pass stops between two
 *		activities as soon as one of those commands waits for the database
 *		(RpDatabaseWanted).  It keeps no state of its own.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "redpacket.h"

/*
 * Settings a database owner (or a role) may set with ALTER DATABASE/ROLE
 * SET that would stop or distort a superuser's pass: overridden for the
 * reconciler's whole life, above any database or role setting.  The pass
 * waits for stripe locks at most RP_WORKER_LOCK_TIMEOUT, so one long claim
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
bool
RpDatabaseWanted(void)
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
		RpWorkerPass();
	RpLauncherReport(slot, dboid, present ? RP_WORKER_PASSED : RP_WORKER_ABSENT);
	proc_exit(0);
}
