/*
 * base.c
 *		The base layer every subsystem builds on: the extension's own advisory
 *		lock space, SPI plans prepared once per backend, reading SPI results,
 *		the installed catalog version and the restore flag.  It calls nothing
 *		else of redpacket's.
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

#include "redpacket.h"

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
RpLockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode, bool wait)
{
	LOCKTAG		tag;

	RpLockTag(&tag, kind, activity, sub);
	return LockAcquire(&tag, mode, false, !wait) != LOCKACQUIRE_NOT_AVAIL;
}

void
RpUnlockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	LOCKTAG		tag;

	RpLockTag(&tag, kind, activity, sub);
	LockRelease(&tag, mode, false);
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

SPIPlanPtr
RpPrepared(RpPlan *p)
{
	return RpPreparedOn(p, false);
}

/* Execute a kept plan; any SPI failure is an internal error. */
int
RpExecOn(RpPlan *p, bool distributed, Datum *values, const char *nulls, bool read_only,
		 long count)
{
	int			rc = SPI_execute_plan(RpPreparedOn(p, distributed), values, nulls,
									  read_only, count);

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

static RpPlan catalog_version = {
	"SELECT e.extversion FROM pg_catalog.pg_extension e"
	" WHERE e.extname OPERATOR(pg_catalog.=) 'redpacket'",
	0, {InvalidOid}
};

/*
 * The version of the installed SQL objects as major * 100 + minor (1.0 is
 * 100, 1.1 is 101, 1.2 is 102, 1.3 is 103), or 0 when the extension is not
 * installed.  The library serves every catalog it can meet: code that needs
 * objects of a later version asks this first.  Read once per transaction;
 * ALTER EXTENSION UPDATE commits before anyone can see the new objects.
 * Must be called inside SPI_connect.
 */
int
RpCatalogVersion(void)
{
	static LocalTransactionId cached_lxid = InvalidLocalTransactionId;
	static int	cached = 0;
	int			major = 0,
				minor = 0;

	if (cached_lxid == MyProc->lxid)
		return cached;
	if (RpExec(&catalog_version, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the redpacket extension version");
	cached = 0;
	if (SPI_processed == 1)
	{
		bool		isnull;
		char	   *v = TextDatumGetCString(RpGetDatum(0, 1, &isnull));

		if (sscanf(v, "%d.%d", &major, &minor) == 2)
			cached = major * 100 + minor;
	}
	cached_lxid = MyProc->lxid;
	return cached;
}

static RpPlan database_restoring = {
	"SELECT true FROM pg_catalog.pg_db_role_setting s"
	" WHERE s.setdatabase OPERATOR(pg_catalog.=) $1"
	"   AND s.setrole OPERATOR(pg_catalog.=) 0::pg_catalog.oid"
	"   AND 'redpacket.restoring=on' OPERATOR(pg_catalog.=) ANY (s.setconfig)",
	1, {OIDOID}
};

/*
 * True while a restore is in progress: redpacket.restoring is on in this
 * session, or set for this database (rp_pre_restore does that).  The
 * database setting is read from the catalog, not the session's copy, so a
 * long-lived worker sees it as soon as it is committed.  Must be called
 * inside SPI_connect.
 */
bool
RpRestoring(void)
{
	Datum		db = ObjectIdGetDatum(MyDatabaseId);

	if (rp_restoring)
		return true;
	if (RpExec(&database_restoring, &db, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the settings of the database");
	return SPI_processed > 0;
}
