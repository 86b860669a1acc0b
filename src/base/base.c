/*
 * base.c
 *		The base layer every subsystem builds on: the extension's own advisory
 *		lock space, SPI plans prepared once per backend, reading SPI results
 *		and the library's one relcache invalidation callback.  It calls
 *		nothing else of redpacket's.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/resowner.h"

#include "base.h"

/*
 * Take (or try) a transaction-scoped lock in redpacket's lock space.
 * field1 is the database, field2 folds the 64-bit activity id into 32 bits:
 * ids that alias only share a lock, which can make them wait for each other
 * but never breaks mutual exclusion.
 */
void
RpLockTag(LOCKTAG *tag, RpLockKind kind, int64 activity, uint32 sub)
{
	uint64		a = (uint64) activity;

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (a ^ (a >> 32)), sub,
						 (uint16) kind);
}

/*
 * Our locks belong to the (sub)transaction, not to the portal running the
 * statement: a reconciliation unit (reconcile.c) takes them in a
 * subtransaction of its own, which hands them to its parent's owner when
 * it succeeds, and they are given back the same way whoever took them.  On an error the
 * abort (or the handler that catches it) resets CurrentResourceOwner.
 */
bool
RpLockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode, bool wait)
{
	LOCKTAG		tag;
	ResourceOwner owner = CurrentResourceOwner;
	bool		took;

	RpLockTag(&tag, kind, activity, sub);
	CurrentResourceOwner = CurTransactionResourceOwner;
	took = LockAcquire(&tag, mode, false, !wait) != LOCKACQUIRE_NOT_AVAIL;
	CurrentResourceOwner = owner;
	return took;
}

void
RpUnlockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	LOCKTAG		tag;
	ResourceOwner owner = CurrentResourceOwner;

	RpLockTag(&tag, kind, activity, sub);
	CurrentResourceOwner = CurTransactionResourceOwner;
	LockRelease(&tag, mode, false);
	CurrentResourceOwner = owner;
}

/*
 * How many other transactions hold the lock, in any mode: for the waiting
 * marker (RP_LOCK_WAITING), which is only ever taken in a mode that
 * conflicts with none of its own.
 */
int
RpLockHolders(RpLockKind kind, int64 activity, uint32 sub)
{
	LOCKTAG		tag;
	int			n = 0;

	RpLockTag(&tag, kind, activity, sub);
	(void) GetLockConflicts(&tag, AccessExclusiveLock, &n);
	return n;
}

bool
RpLock(RpLockKind kind, int64 activity, uint32 sub, bool wait)
{
	return RpLockMode(kind, activity, sub, ExclusiveLock, wait);
}

void
RpUnlock(RpLockKind kind, int64 activity, uint32 sub)
{
	RpUnlockMode(kind, activity, sub, ExclusiveLock);
}

/*
 * The search path of every statement the C code runs.  Every SECURITY
 * DEFINER function pins it in its definition (SET search_path), so it is
 * pinned before anything of the call can resolve a name: our statements, a
 * trigger, an index expression, an operator class's support function.  The
 * one exception is rp_claim as the 1.3 catalog declares it (no SET; the
 * symbol rp_claim_v13): the library pins it for that call itself, on entry,
 * exactly as the SET would (RpPinSearchPath), and pops it on return; an
 * error's abort pops it as it pops a SET's.
 */
int
RpPinSearchPath(void)
{
	int			level = NewGUCNestLevel();

	(void) set_config_option("search_path", RP_SEARCH_PATH, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

void
RpUnpinSearchPath(int level)
{
	AtEOXact_GUC(true, level);
}

/*
 * Prepare a statement on first use and keep it for the life of the backend.
 * The plan cache revalidates it after DDL, so it survives ALTER and even
 * DROP/CREATE EXTENSION (the names are re-resolved).
 */
static SPIPlanPtr
Prepare(const RpPlan *p, int cursor_options)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(p->sql, p->nargs, (Oid *) p->argtypes,
										  cursor_options);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 p->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	return plan;
}

/*
 * The plan of a statement.  A generic one (p->generic) never depends on
 * the parameters: a per-call plan for an activity newer than claim's
 * statistics, estimated to hold one claim, scanned claim_pkey by
 * activity_id alone and read every claim of the activity.  On a
 * Citus cluster (distributed, the caller knows) the same statement is
 * planned per call instead: Citus routes it by the value of the
 * distribution column, which a generic plan lacks ("could not create
 * distributed plan"), and plans for the one shard anyway.  Both are kept:
 * rp_distribute() can come after the first call.
 */
SPIPlanPtr
RpPreparedOn(RpPlan *p, bool distributed)
{
	if (p->generic && distributed)
	{
		if (p->plan_citus == NULL)
			p->plan_citus = Prepare(p, 0);
		return p->plan_citus;
	}
	if (p->plan == NULL)
		p->plan = Prepare(p, p->generic ? CURSOR_OPT_GENERIC_PLAN : 0);
	return p->plan;
}

/* How deep this backend is in statements of the extension's own (RpExecOn). */
static int	own_statements = 0;

/*
 * Whether the statement running now is one of the extension's own: the
 * guard of the tables whose rows only the extension changes lets these
 * through and refuses any other (rowguard.c).
 */
bool
RpOwnStatement(void)
{
	return own_statements > 0;
}

/* Execute a kept plan; any SPI failure is an internal error. */
int
RpExecOn(RpPlan *p, bool distributed, Datum *values, const char *nulls, bool read_only,
		 long count)
{
	SPIPlanPtr	plan = RpPreparedOn(p, distributed);
	int			rc;

	own_statements++;
	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, read_only, count);
	}
	PG_FINALLY();
	{
		own_statements--;
	}
	PG_END_TRY();

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 p->sql, SPI_result_code_string(rc));
	return rc;
}

int
RpExec(RpPlan *p, Datum *values, const char *nulls, bool read_only, long count)
{
	return RpExecOn(p, false, values, nulls, read_only, count);
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

/*
 * Every cache of ours that follows relcache invalidations registers its
 * function here, and the library takes one of PostgreSQL's ten relcache
 * callback slots for all of them: they are shared by every module of the
 * backend (Citus takes five, the plan and type caches one each), and four
 * of our own made the next one fail with "out of relcache_callback_list
 * slots" on a Citus node.
 */
#define RP_RELCACHE_FUNCTIONS 8

static RelcacheCallbackFunction relcache_functions[RP_RELCACHE_FUNCTIONS];
static int	relcache_nfunctions = 0;

static void
RelcacheDispatch(Datum arg, Oid relid)
{
	for (int i = 0; i < relcache_nfunctions; i++)
		relcache_functions[i] (arg, relid);
}

void
RpOnRelcacheInvalidation(RelcacheCallbackFunction fn)
{
	if (relcache_nfunctions >= RP_RELCACHE_FUNCTIONS)
		elog(ERROR, "too many redpacket relcache callbacks");
	if (relcache_nfunctions == 0)
		CacheRegisterRelcacheCallback(RelcacheDispatch, (Datum) 0);
	relcache_functions[relcache_nfunctions++] = fn;
}
