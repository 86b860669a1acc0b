/*
 * stats.c
 *		Per-activity counters of claim answers and events, kept in shared
 *		memory the way pg_stat_statements keeps its counters: a shared hash
 *		keyed by (database, activity) whose entries hold one atomic counter
 *		per RpStatus and per RpStatEvent.  The key also holds the OID of
 *		the table redpacket.activity, so a dropped and re-created extension
 *		(whose activity ids start again at 1) starts with no counters; the
 *		OID is looked up once per backend and forgotten on a relcache
 *		invalidation.  Counting takes the hash's LWLock in shared mode and
 *		adds to an atomic; only the first event of an activity takes the
 *		lock exclusively to create its entry.
 *
 *		The table holds redpacket.stats_max_activities entries and never
 *		fills up: an activity's counters leave it for the folded row of its
 *		database (activity 0 of the key: the sum of every activity that left)
 *		when the reconciler sees the activity settled (RpStatsFold), or, when
 *		an entry is needed and there is no room, the entry that the clock
 *		hand finds first without a recent event (or settled, or only
 *		answering ended) leaves.  So the counters of a database add up over
 *		its activity rows and its folded row, and an activity row says since
 *		when it counts.  Only an event that finds no room even for its
 *		database's folded row (more databases than RP_STATS_FOLDED_MAX) goes
 *		to the untracked counters.  Counters live only in memory: a restart
 *		or rp_stats_reset() clears them; rp_stats_reset() also frees the
 *		entries of databases that no longer exist and of a dropped
 *		extension.  Without shared_preload_libraries there is no table,
 *		counting is a no-op and the view is empty.
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
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "ops.h"

PG_FUNCTION_INFO_V1(rp_activity_stats);
PG_FUNCTION_INFO_V1(rp_stats_reset);

static bool rp_track_stats = true;
static int	rp_stats_max_activities = RP_DEFAULT_STATS_MAX_ACTIVITIES;

/* Folded rows (one per database and installation) beyond the activities. */
#define RP_STATS_FOLDED_MAX 64

/* The activity of a key that holds the folded counters of its database. */
#define RP_STATS_FOLDED 0

typedef struct RpStatsKey
{
	Oid			dbid;
	Oid			relid;			/* redpacket.activity: this install of it */
	int64		activity;		/* RP_STATS_FOLDED: the folded row */
} RpStatsKey;

typedef struct RpStatsEntry
{
	RpStatsKey	key;
	TimestampTz since;			/* when this entry started counting */
	pg_atomic_uint32 recent;	/* an event since the clock hand last passed */
	pg_atomic_uint32 done;		/* settled, or its answers are only "ended" */
	pg_atomic_uint64 counts[RP_NSTATS];
} RpStatsEntry;

/*
 * The shared state: the untracked counters, and the clock of the activity
 * entries (a ring of their keys in the order they were created).
 */
typedef struct RpStatsShared
{
	LWLock	   *lock;			/* protects the hash's membership and the ring */
	bool		untracked_logged;	/* "no room" logged since the last reset */
	TimestampTz untracked_since;
	pg_atomic_uint64 untracked[RP_NSTATS];	/* events that found no room at all */
	int			live;			/* activity entries in the hash */
	int			ring_head;		/* next key the clock hand looks at */
	int			ring_count;		/* keys in the ring, some of them of entries gone */
	RpStatsKey	ring[FLEXIBLE_ARRAY_MEMBER];	/* RING_SIZE keys */
} RpStatsShared;

/*
 * The ring has room for twice the activity entries: keys of entries folded
 * or reset stay in it until the hand passes them, and when it is full more
 * than half of it is such keys, which Compact() drops at once.
 */
#define RING_SIZE (2 * rp_stats_max_activities)

static RpStatsShared *rp_stats = NULL;
static HTAB *rp_stats_hash = NULL;

/* this backend's redpacket.activity OID, looked up again when not valid */
static Oid	activity_relid = InvalidOid;
static bool activity_relid_valid = false;
static bool callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* The names of the counters: the claim_status labels, then the events. */
static const char *const stat_names[RP_NSTATS] = {
	"duplicate", "frozen", "not_started", "ended", "user_limit", "exhausted", "claimed",
	"not_eligible", "busy", "stripe_waits", "gathers", "errors", "retryable"
};

const char *
RpStatName(int event)
{
	Assert(event >= 0 && event < RP_NSTATS);
	return stat_names[event];
}

static Size
SharedSize(void)
{
	return add_size(offsetof(RpStatsShared, ring), mul_size(RING_SIZE, sizeof(RpStatsKey)));
}

static Size
StatsShmemSize(void)
{
	return add_size(MAXALIGN(SharedSize()),
					hash_estimate_size(rp_stats_max_activities + RP_STATS_FOLDED_MAX,
									   sizeof(RpStatsEntry)));
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
	long		size = rp_stats_max_activities + RP_STATS_FOLDED_MAX;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rp_stats = ShmemInitStruct("redpacket stats", SharedSize(), &found);
	if (!found)
	{
		rp_stats->lock = &(GetNamedLWLockTranche("redpacket stats"))->lock;
		rp_stats->untracked_logged = false;
		rp_stats->untracked_since = GetCurrentTimestamp();
		rp_stats->live = rp_stats->ring_head = rp_stats->ring_count = 0;
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_init_u64(&rp_stats->untracked[i], 0);
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RpStatsKey);
	info.entrysize = sizeof(RpStatsEntry);
	rp_stats_hash = ShmemInitHash("redpacket stats hash", size, size,
								  &info, HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Called from _PG_init: the settings, and while preloading the shared
 * table (only then can the postmaster-level size be defined).
 */
void
RpStatsInit(void)
{
	DefineCustomBoolVariable("redpacket.track_stats",
							 "Count claim answers and events per activity in shared memory.",
							 "Takes effect only when redpacket is in shared_preload_libraries.",
							 &rp_track_stats,
							 true,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("redpacket.stats_max_activities",
							"Most activities whose claim counters are kept in shared memory one by one.",
							"Settled activities, and the least recently active ones when room is needed, are folded into the counters of their database.",
							&rp_stats_max_activities,
							RP_DEFAULT_STATS_MAX_ACTIVITIES, RP_MIN_STATS_MAX_ACTIVITIES,
							RP_MAX_STATS_MAX_ACTIVITIES,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);

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

static RpStatsEntry *
NewEntry(const RpStatsKey *key)
{
	bool		found;
	RpStatsEntry *e = hash_search(rp_stats_hash, key, HASH_ENTER_NULL, &found);

	if (e != NULL && !found)
	{
		e->since = GetCurrentTimestamp();
		pg_atomic_init_u32(&e->recent, 1);
		pg_atomic_init_u32(&e->done, 0);
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_init_u64(&e->counts[i], 0);
	}
	return e;
}

/*
 * Add the counters of e to the folded row of its database (or to the
 * untracked ones when that row cannot be made) and remove e.  Called with
 * the lock held exclusively.
 */
static void
Fold(RpStatsEntry *e)
{
	RpStatsKey	key = e->key;
	RpStatsEntry *into;
	pg_atomic_uint64 *to;

	key.activity = RP_STATS_FOLDED;
	into = hash_get_num_entries(rp_stats_hash) < rp_stats_max_activities + RP_STATS_FOLDED_MAX ||
		hash_search(rp_stats_hash, &key, HASH_FIND, NULL) != NULL ? NewEntry(&key) : NULL;
	to = into ? into->counts : rp_stats->untracked;
	for (int i = 0; i < RP_NSTATS; i++)
		pg_atomic_fetch_add_u64(&to[i], pg_atomic_read_u64(&e->counts[i]));
	(void) hash_search(rp_stats_hash, &e->key, HASH_REMOVE, NULL);
	rp_stats->live--;
}

/*
 * Make room for one activity entry: the clock hand goes round the ring of
 * activity keys; an entry done (only answering ended) or without an event
 * since the hand last passed is folded, one with a recent event gets a
 * second chance; the keys of entries gone are dropped on the way.  Called
 * with the lock held exclusively.
 */
static void
MakeRoom(void)
{
	int			size = RING_SIZE;
	int			steps = rp_stats->ring_count + rp_stats->live;

	while (rp_stats->ring_count > 0 && steps-- >= 0)
	{
		RpStatsKey	key = rp_stats->ring[rp_stats->ring_head];
		RpStatsEntry *e = hash_search(rp_stats_hash, &key, HASH_FIND, NULL);

		rp_stats->ring_head = (rp_stats->ring_head + 1) % size;
		rp_stats->ring_count--;
		if (e == NULL)
			continue;			/* folded or reset since */
		if (pg_atomic_read_u32(&e->done) == 0 && pg_atomic_exchange_u32(&e->recent, 0) != 0)
		{
			/* second chance: to the back of the ring */
			rp_stats->ring[(rp_stats->ring_head + rp_stats->ring_count) % size] = key;
			rp_stats->ring_count++;
			continue;
		}
		Fold(e);
		return;
	}
}

/* Drop the keys of entries gone from the ring (it is full). */
static void
Compact(void)
{
	int			size = RING_SIZE;
	int			kept = 0;

	for (int i = 0; i < rp_stats->ring_count; i++)
	{
		RpStatsKey	key = rp_stats->ring[(rp_stats->ring_head + i) % size];

		if (hash_search(rp_stats_hash, &key, HASH_FIND, NULL) != NULL)
			rp_stats->ring[(rp_stats->ring_head + kept++) % size] = key;
	}
	rp_stats->ring_count = kept;
}

/*
 * The entry of key, created if need be (making room); NULL when there is no
 * room even after folding (the folded rows of too many databases).  Called
 * with the lock held exclusively.
 */
static RpStatsEntry *
StatsEnter(const RpStatsKey *key)
{
	RpStatsEntry *e = hash_search(rp_stats_hash, key, HASH_FIND, NULL);

	if (e != NULL)
		return e;
	if (rp_stats->live >= rp_stats_max_activities)
		MakeRoom();
	if (rp_stats->live >= rp_stats_max_activities)
		return NULL;
	if (rp_stats->ring_count >= RING_SIZE)
		Compact();
	e = NewEntry(key);
	if (e != NULL)
	{
		rp_stats->ring[(rp_stats->ring_head + rp_stats->ring_count) % RING_SIZE] = *key;
		rp_stats->ring_count++;
		rp_stats->live++;
	}
	return e;
}

/*
 * Count the error a claim call raised, from its PG_CATCH block (the error
 * is still on the error stack): retryable when its caller is told to try
 * again (serialization failure, deadlock, lock timeout, statement timeout
 * or cancel), so that an alert on errors does not page on contention.
 */
void
RpStatsCountFailure(int64 activity)
{
	int			code = geterrcode();
	bool		retryable = code == ERRCODE_T_R_SERIALIZATION_FAILURE ||
		code == ERRCODE_T_R_DEADLOCK_DETECTED ||
		code == ERRCODE_LOCK_NOT_AVAILABLE ||
		code == ERRCODE_QUERY_CANCELED;

	RpStatsCount(activity, retryable ? RP_STAT_RETRYABLE : RP_STAT_ERROR);
}

/*
 * Count one event of an activity.  The hot path: a shared lock, a hash
 * probe, an atomic add (and a store when the entry had no recent event).
 */
void
RpStatsCount(int64 activity, int event)
{
	RpStatsKey	key;
	RpStatsEntry *e;

	if (rp_stats == NULL || !rp_track_stats || event < 0 || event >= RP_NSTATS)
		return;
	if (activity == RP_STATS_FOLDED)
	{
		/* no activity has that id (an error for a bad argument) */
		pg_atomic_fetch_add_u64(&rp_stats->untracked[event], 1);
		return;
	}

	/*
	 * An error is counted from a PG_CATCH block, before the abort: no
	 * catalog lookup there (the error may have left a buffer or LWLock
	 * held).  It uses the OID last looked up by this backend (stale only
	 * if the extension was re-created since: then the error lands in an
	 * invisible entry); a backend that never looked it up counts the error
	 * as untracked.
	 */
	if (event >= RP_STAT_ERROR && !OidIsValid(activity_relid))
	{
		pg_atomic_fetch_add_u64(&rp_stats->untracked[event], 1);
		return;
	}
	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.relid = event >= RP_STAT_ERROR ? activity_relid : ActivityRelid();
	key.activity = activity;

	LWLockAcquire(rp_stats->lock, LW_SHARED);
	e = hash_search(rp_stats_hash, &key, HASH_FIND, NULL);
	if (e == NULL)
	{
		LWLockRelease(rp_stats->lock);
		LWLockAcquire(rp_stats->lock, LW_EXCLUSIVE);
		e = StatsEnter(&key);
		/* an activity whose first answer is ended is over: fold it first */
		if (e != NULL && event == RP_ENDED && pg_atomic_read_u64(&e->counts[RP_ENDED]) == 0 &&
			pg_atomic_read_u64(&e->counts[RP_CLAIMED]) == 0)
			pg_atomic_write_u32(&e->done, 1);
	}
	if (e != NULL)
	{
		pg_atomic_fetch_add_u64(&e->counts[event], 1);
		if (pg_atomic_read_u32(&e->recent) == 0)
			pg_atomic_write_u32(&e->recent, 1);
	}
	else
	{
		pg_atomic_fetch_add_u64(&rp_stats->untracked[event], 1);
		if (!rp_stats->untracked_logged)
		{
			rp_stats->untracked_logged = true;
			ereport(LOG,
					(errmsg("redpacket counters have no room even for the folded row of a database: events are counted as untracked"),
					 errhint("More than %d databases count claims; call redpacket.rp_stats_reset() in each to free the rows of dropped ones.",
							 RP_STATS_FOLDED_MAX)));
		}
	}
	LWLockRelease(rp_stats->lock);
}

/*
 * The reconciler saw these activities of this database settled: their
 * counters leave shared memory for the folded row (a later answer, ended or
 * duplicate, starts a row of its own that is folded first when room is
 * needed).  Needs a transaction.
 */
void
RpStatsFold(const int64 *activities, int n)
{
	RpStatsKey	key;

	if (rp_stats == NULL || n == 0)
		return;
	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.relid = ActivityRelid();
	LWLockAcquire(rp_stats->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		RpStatsEntry *e;

		key.activity = activities[i];
		if (key.activity == RP_STATS_FOLDED)
			continue;
		e = hash_search(rp_stats_hash, &key, HASH_FIND, NULL);
		if (e != NULL)
			Fold(e);
	}
	LWLockRelease(rp_stats->lock);
}

/*
 * One row of rp_activity_stats: the activity (NULL for the folded and
 * untracked rows), then each OUT column the installed catalog declares, by
 * name (a catalog gains columns as the library gains counters): the
 * counters, scope (activity, folded or untracked) and counting_since.
 */
static void
StatsRow(ReturnSetInfo *rsinfo, int64 activity, const char *scope, TimestampTz since,
		 pg_atomic_uint64 *counts)
{
	TupleDesc	desc = rsinfo->setDesc;
	Datum	   *values = palloc0(sizeof(Datum) * desc->natts);
	bool	   *nulls = palloc0(sizeof(bool) * desc->natts);

	values[0] = Int64GetDatum(activity);
	nulls[0] = strcmp(scope, "activity") != 0;
	for (int c = 1; c < desc->natts; c++)
	{
		const char *name = NameStr(TupleDescAttr(desc, c)->attname);

		nulls[c] = true;
		if (strcmp(name, "scope") == 0)
		{
			values[c] = CStringGetTextDatum(scope);
			nulls[c] = false;
		}
		else if (strcmp(name, "counting_since") == 0)
		{
			values[c] = TimestampTzGetDatum(since);
			nulls[c] = false;
		}
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
 * The counters of the current database: its activities, its folded row
 * when it has one, and one row for the untracked events (of any database)
 * when there are any.
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
			StatsRow(rsinfo, e->key.activity,
					 e->key.activity == RP_STATS_FOLDED ? "folded" : "activity",
					 e->since, e->counts);
	for (int i = 0; i < RP_NSTATS; i++)
		untracked += pg_atomic_read_u64(&rp_stats->untracked[i]);
	if (untracked > 0)
		StatsRow(rsinfo, 0, "untracked", rp_stats->untracked_since, rp_stats->untracked);
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
 * of all its activities, its folded row and the untracked counters;
 * returns how many activities were forgotten.  Either way, also frees the
 * entries of databases that no longer exist and of this database's dropped
 * extension (not counted in the result).  The ring keeps the keys of
 * removed entries until the clock hand passes them.
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

		if (ours && (all || (e->key.activity == activity && activity != RP_STATS_FOLDED)))
			n += e->key.activity != RP_STATS_FOLDED;
		else if (ours || (e->key.dbid != MyDatabaseId &&
						  !list_member_oid(gone, e->key.dbid)))
			continue;
		if (e->key.activity != RP_STATS_FOLDED)
			rp_stats->live--;
		(void) hash_search(rp_stats_hash, &e->key, HASH_REMOVE, NULL);
	}
	if (all)
	{
		for (int i = 0; i < RP_NSTATS; i++)
			pg_atomic_write_u64(&rp_stats->untracked[i], 0);
		rp_stats->untracked_logged = false;
		rp_stats->untracked_since = GetCurrentTimestamp();
	}
	LWLockRelease(rp_stats->lock);
	list_free(gone);
	PG_RETURN_INT64(n);
}
