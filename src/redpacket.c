/*
 * redpacket.c
 *		Module entry point and shared infrastructure: the GUCs, _PG_init
 *		(which only defines GUCs and registers the worker), the extension's
 *		own advisory lock space, and SPI plans prepared once per backend.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/guc.h"

#include "redpacket.h"

PG_MODULE_MAGIC;

int			rp_default_stripes = RP_DEFAULT_STRIPES;
int			rp_reconcile_interval = RP_DEFAULT_RECONCILE_INTERVAL;
char	   *rp_database = NULL;
bool		rp_freeze_on_mismatch = true;

void		_PG_init(void);

void
_PG_init(void)
{
	if (IsBinaryUpgrade)
		return;

	DefineCustomIntVariable("redpacket.stripes",
							"Number of stripes (sub-balances) for new activities.",
							"More stripes let more concurrent claims on one activity proceed without waiting.",
							&rp_default_stripes,
							RP_DEFAULT_STRIPES, RP_MIN_STRIPES, RP_MAX_STRIPES,
							PGC_USERSET, 0, NULL, NULL, NULL);

	DefineCustomIntVariable("redpacket.reconcile_interval",
							"Seconds between reconciliation passes of the background worker.",
							"0 pauses the worker without stopping it.",
							&rp_reconcile_interval,
							RP_DEFAULT_RECONCILE_INTERVAL, RP_MIN_RECONCILE_INTERVAL,
							RP_MAX_RECONCILE_INTERVAL,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.freeze_on_mismatch",
							 "Freeze an activity whose reconciliation fails.",
							 NULL,
							 &rp_freeze_on_mismatch,
							 true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	/*
	 * A postmaster-level setting can only be defined while preloading; it
	 * only matters to the worker, which exists only then.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomStringVariable("redpacket.database",
								   "Database the reconciliation worker connects to.",
								   NULL,
								   &rp_database,
								   "postgres",
								   PGC_POSTMASTER, 0, NULL, NULL, NULL);

	MarkGUCPrefixReserved("redpacket");

	if (process_shared_preload_libraries_in_progress)
		RpRegisterWorker();
}

/*
 * Take (or try) a transaction-scoped lock in redpacket's lock space.
 * field1 is the database, field2 folds the 64-bit activity id into 32 bits:
 * ids that alias only share a lock, which can make them wait for each other
 * but never breaks mutual exclusion.
 */
static void
RpLockTag(LOCKTAG *tag, RpLockKind kind, int64 activity, uint32 sub)
{
	uint64		a = (uint64) activity;

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (a ^ (a >> 32)), sub,
						 (uint16) kind);
}

bool
RpLock(RpLockKind kind, int64 activity, uint32 sub, bool wait)
{
	LOCKTAG		tag;

	RpLockTag(&tag, kind, activity, sub);
	return LockAcquire(&tag, ExclusiveLock, false, !wait) != LOCKACQUIRE_NOT_AVAIL;
}

void
RpUnlock(RpLockKind kind, int64 activity, uint32 sub)
{
	LOCKTAG		tag;

	RpLockTag(&tag, kind, activity, sub);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * Prepare a statement on first use and keep it for the life of the backend.
 * The plan cache revalidates it after DDL, so it survives ALTER and even
 * DROP/CREATE EXTENSION (the names are re-resolved).
 */
SPIPlanPtr
RpPrepared(RpPlan *p)
{
	if (p->plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(p->sql, p->nargs, p->argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 p->sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		p->plan = plan;
	}
	return p->plan;
}

/* Execute a kept plan; any SPI failure is an internal error. */
int
RpExec(RpPlan *p, Datum *values, const char *nulls, bool read_only, long count)
{
	int			rc = SPI_execute_plan(RpPrepared(p), values, nulls, read_only, count);

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 p->sql, SPI_result_code_string(rc));
	return rc;
}

Datum
RpGetDatum(int row, int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

int64
RpGetInt64(int row, int col, int64 if_null)
{
	bool		isnull;
	Datum		d = RpGetDatum(row, col, &isnull);

	return isnull ? if_null : DatumGetInt64(d);
}
