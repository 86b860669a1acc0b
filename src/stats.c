/*
 * stats.c
 *		Per-activity counters of claim answers and events, kept in shared
 *		memory the way pg_stat_statements keeps its counters: a shared hash
 *		keyed by (database, activity) whose entries hold one atomic counter
 *		per RpStatus and per RpStatEvent.  The key also holds the OID of
 *		the table redpacket.activity, so a dropped and re-created extension
 *		(whose activity ids start again at 1) starts with no counters; the
 *		OID is looked up once per backend and forgotten on a relcache
 *		invalidation.  Counting takes the hash's LWLock
 *		in shared mode and adds to an atomic; only the first event of an
 *		activity takes the lock exclusively to create its entry.  The table
 *		holds at most redpacket.stats_max_activities entries; events of an
 *		activity that finds it full go to the untracked counters instead (no
 *		eviction, so what a row shows is never silently incomplete).
 *		Counters live only in memory: a restart or rp_stats_reset() clears
 *		them; rp_stats_reset() also frees the entries of databases that no
 *		longer exist and of a dropped extension.  Without shared_preload_libraries there is no table, counting
 *		is a no-op and the view is empty.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_activity_stats);
PG_FUNCTION_INFO_V1(rp_stats_reset);

bool		rp_track_stats = true;
int			rp_stats_max_activities = RP_DEFAULT_STATS_MAX_ACTIVITIES;

typedef struct RpStatsKey
{
	Oid			dbid;
	Oid			relid;			/* redpacket.activity: this install of it */
	int64		activity;
} RpStatsKey;

typedef struct RpStatsEntry
{
	RpStatsKey	key;
	pg_atomic_uint64 counts[RP_NSTATS];
} RpStatsEntry;

typedef struct RpStatsShared
{
	LWLock	   *lock;			/* protects the hash's membership */
	bool		full_logged;	/* "table full" logged since the last reset */
	pg_atomic_uint64 untracked[RP_NSTATS];	/* events that found the table full */
} RpStatsShared;

static RpStatsShared *rp_stats = NULL;
static HTAB *rp_stats_hash = NULL;

/* this backend's redpacket.activity OID, looked up again when not valid */
static Oid	activity_relid = InvalidOid;
static bool activity_relid_valid = false;
static bool callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;

/* The names of the counters: the claim_status labels, then the events. */
static const char *const stat_names[RP_NSTATS] = {
	"duplicate", "frozen", "not_started", "ended", "user_limit", "exhausted", "claimed",
	"not_eligible", "busy", "stripe_waits", "gathers", "errors"
};

const char *
RpStatName(int event)
{
	Assert(event >= 0 && event < RP_NSTATS);
	return stat_names[event];
}
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
StatsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(RpStatsShared)),
					hash_estimate_size(rp_stats_max_activities, sizeof(RpStatsEntry)));
}

static void
StatsShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(StatsShmemSize());
	RequestNamedLWLockTranche("redpacket stats", 1);
}

static void
StatsShmemStartup(void)
{
	HASHCTL		info;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rp_stats = ShmemInitStruct("redpacket stats", sizeof(RpStatsShared), &found);
	if (!found)
	{
		rp_stats->lock = &(GetNamedLWLockTranche("redpacket stats"))->lock;
		rp_stats->full_logged = false;
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_init_u64(&rp_stats->untracked[i], 0);
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RpStatsKey);
	info.entrysize = sizeof(RpStatsEntry);
	rp_stats_hash = ShmemInitHash("redpacket stats hash",
								  rp_stats_max_activities, rp_stats_max_activities,
								  &info, HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
}

/* Called from _PG_init while preloading: ask for the shared table. */
void
RpStatsInit(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = StatsShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = StatsShmemStartup;
}

static void
StatsRelcacheCallback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == activity_relid)
		activity_relid_valid = false;
}

/*
 * The OID of redpacket.activity in this database (InvalidOid when the
 * extension is not installed), cached until a relcache invalidation of it.
 * Needs a transaction.
 */
static Oid
ActivityRelid(void)
{
	Oid			nsp;

	if (activity_relid_valid)
		return activity_relid;
	if (!callback_registered)
	{
		RpOnRelcacheInvalidation(StatsRelcacheCallback);
		callback_registered = true;
	}
	nsp = get_namespace_oid("redpacket", true);
	activity_relid = OidIsValid(nsp) ? get_relname_relid("activity", nsp) : InvalidOid;
	activity_relid_valid = true;
	return activity_relid;
}

/*
 * The entry of key, created if there is room; NULL when the table is full.
 * Called with the lock held exclusively.
 */
static RpStatsEntry *
StatsEnter(const RpStatsKey *key)
{
	RpStatsEntry *e;
	bool		found;

	e = hash_search(rp_stats_hash, key, HASH_FIND, NULL);
	if (e != NULL)
		return e;
	if (hash_get_num_entries(rp_stats_hash) >= rp_stats_max_activities)
	{
		if (!rp_stats->full_logged)
		{
			rp_stats->full_logged = true;
			ereport(LOG,
					(errmsg("redpacket.stats_max_activities (%d) is reached: events of further activities are counted only as untracked",
							rp_stats_max_activities),
					 errhint("Call redpacket.rp_stats_reset() to make room, or raise redpacket.stats_max_activities and restart.")));
		}
		return NULL;
	}
	e = hash_search(rp_stats_hash, key, HASH_ENTER_NULL, &found);
	if (e != NULL && !found)
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_init_u64(&e->counts[i], 0);
	return e;
}

/*
 * Count one event of an activity.  The hot path: a shared lock, a hash
 * probe and an atomic add.
 */
void
RpStatsCount(int64 activity, int event)
{
	RpStatsKey	key;
	RpStatsEntry *e;

	if (rp_stats == NULL || !rp_track_stats || event < 0 || event >= RP_NSTATS)
		return;

	/*
	 * An error is counted from a PG_CATCH block, before the abort: no
	 * catalog lookup there (the error may have left a buffer or LWLock
	 * held).  It uses the OID last looked up by this backend (stale only
	 * if the extension was re-created since: then the error lands in an
	 * invisible entry); a backend that never looked it up counts the error
	 * as untracked.
	 */
	if (event == RP_STAT_ERROR && !OidIsValid(activity_relid))
	{
		pg_atomic_fetch_add_u64(&rp_stats->untracked[event], 1);
		return;
	}
	key.dbid = MyDatabaseId;
	key.relid = event == RP_STAT_ERROR ? activity_relid : ActivityRelid();
	key.activity = activity;

	LWLockAcquire(rp_stats->lock, LW_SHARED);
	e = hash_search(rp_stats_hash, &key, HASH_FIND, NULL);
	if (e == NULL)
	{
		LWLockRelease(rp_stats->lock);
		LWLockAcquire(rp_stats->lock, LW_EXCLUSIVE);
		e = StatsEnter(&key);
	}
	if (e != NULL)
		pg_atomic_fetch_add_u64(&e->counts[event], 1);
	else
		pg_atomic_fetch_add_u64(&rp_stats->untracked[event], 1);
	LWLockRelease(rp_stats->lock);
}

/*
 * One row of rp_activity_stats: the activity (NULL: untracked), then each
 * OUT column the installed catalog declares, by name (a catalog gains
 * columns as the library gains counters).
 */
static void
StatsRow(ReturnSetInfo *rsinfo, bool has_activity, int64 activity, pg_atomic_uint64 *counts)
{
	TupleDesc	desc = rsinfo->setDesc;
	Datum	   *values = palloc0(sizeof(Datum) * desc->natts);
	bool	   *nulls = palloc0(sizeof(bool) * desc->natts);

	values[0] = Int64GetDatum(activity);
	nulls[0] = !has_activity;
	for (int c = 1; c < desc->natts; c++)
	{
		const char *name = NameStr(TupleDescAttr(desc, c)->attname);

		nulls[c] = true;
		for (int i = 0; i < RP_NSTATS; i++)
			if (strcmp(name, RpStatName(i)) == 0)
			{
				values[c] = Int64GetDatum((int64) pg_atomic_read_u64(&counts[i]));
				nulls[c] = false;
			}
	}
	tuplestore_putvalues(rsinfo->setResult, desc, values, nulls);
	pfree(values);
	pfree(nulls);
}

/*
 * The counters of the current database's activities, and one row with a
 * NULL activity for the untracked events (of any database) when there are
 * any.
 */
Datum
rp_activity_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS seq;
	RpStatsEntry *e;
	uint64		untracked = 0;
	Oid			relid;

	InitMaterializedSRF(fcinfo, 0);
	if (rp_stats == NULL)
		return (Datum) 0;
	relid = ActivityRelid();

	LWLockAcquire(rp_stats->lock, LW_SHARED);
	hash_seq_init(&seq, rp_stats_hash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->key.dbid == MyDatabaseId && e->key.relid == relid)
			StatsRow(rsinfo, true, e->key.activity, e->counts);
	for (int i = 0; i < RP_NSTATS; i++)
		untracked += pg_atomic_read_u64(&rp_stats->untracked[i]);
	if (untracked > 0)
		StatsRow(rsinfo, false, 0, rp_stats->untracked);
	LWLockRelease(rp_stats->lock);
	return (Datum) 0;
}

/*
 * The databases, other than ours, that have entries but no longer exist.
 * Looked up without holding the hash's lock.
 */
static List *
GoneDatabases(void)
{
	HASH_SEQ_STATUS seq;
	RpStatsEntry *e;
	List	   *dbs = NIL;
	List	   *gone = NIL;
	ListCell   *lc;

	LWLockAcquire(rp_stats->lock, LW_SHARED);
	hash_seq_init(&seq, rp_stats_hash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->key.dbid != MyDatabaseId)
			dbs = list_append_unique_oid(dbs, e->key.dbid);
	LWLockRelease(rp_stats->lock);

	foreach(lc, dbs)
		if (!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(lfirst_oid(lc))))
			gone = lappend_oid(gone, lfirst_oid(lc));
	list_free(dbs);
	return gone;
}

/*
 * Forget the counters of one activity of the current database, or (NULL)
 * of all its activities and the untracked counters; returns how many
 * activities were forgotten.  Either way, also frees the entries of
 * databases that no longer exist and of this database's dropped extension
 * (not counted in the result).
 */
Datum
rp_stats_reset(PG_FUNCTION_ARGS)
{
	bool		all = PG_ARGISNULL(0);
	int64		activity = all ? 0 : PG_GETARG_INT64(0);
	HASH_SEQ_STATUS seq;
	RpStatsEntry *e;
	int64		n = 0;
	Oid			relid;
	List	   *gone;

	if (rp_stats == NULL)
		PG_RETURN_INT64(0);

	relid = ActivityRelid();
	gone = GoneDatabases();
	LWLockAcquire(rp_stats->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, rp_stats_hash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		bool		ours = e->key.dbid == MyDatabaseId && e->key.relid == relid;

		if (ours && (all || e->key.activity == activity))
			n++;
		else if (ours || (e->key.dbid != MyDatabaseId &&
						  !list_member_oid(gone, e->key.dbid)))
			continue;
		(void) hash_search(rp_stats_hash, &e->key, HASH_REMOVE, NULL);
	}
	if (all)
	{
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_write_u64(&rp_stats->untracked[i], 0);
		rp_stats->full_logged = false;
	}
	LWLockRelease(rp_stats->lock);
	list_free(gone);
	PG_RETURN_INT64(n);
}
