/*
 * meta.c
 *		Reading an activity: the row as claims need it (RpFetchActivity), and
 *		a backend-local cache of what a claim may reuse between calls
 *		(RpActivityMeta): scale, stripes, packet cap, per-user limit,
 *		restriction, schedule and the revision that names the schedule.
 *		frozen and closed are never cached (a claim finds them on the stripe
 *		it holds: halted); a schedule moved by rp_set_window bumps the
 *		revision on the activity and every stripe, so a claim that cached
 *		the old one finds out on the stripe it holds too.  The cache is
 *		dropped with the catalog's generation (catalog.c) and when full.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/hsearch.h"

#include "base.h"
#include "catalog.h"

/*
 * The columns an activity is read with, in this order, by every statement
 * that reads one (RP_ACTIVITY_SELECT_14/_13 in base.h): column c of
 * the result is RP_ACT_<name>.
 */
void
RpActivityFromRow(int64 id, int first, RpActivity *act)
{
	bool		isnull;
	Datum		d;

	act->id = id;
	act->scale = DatumGetInt32(RpGetDatum(0, first + RP_ACT_SCALE, &isnull));
	d = RpGetDatum(0, first + RP_ACT_PACKETS, &isnull);
	act->packets = isnull ? 0 : DatumGetInt32(d);
	act->stripes = DatumGetInt32(RpGetDatum(0, first + RP_ACT_STRIPES, &isnull));
	act->per_user_limit = DatumGetInt32(RpGetDatum(0, first + RP_ACT_PER_USER_LIMIT, &isnull));
	act->starts_at = DatumGetTimestampTz(RpGetDatum(0, first + RP_ACT_STARTS_AT, &isnull));
	d = RpGetDatum(0, first + RP_ACT_ENDS_AT, &isnull);
	act->ends_at = isnull ? DT_NOEND : DatumGetTimestampTz(d);
	act->closed = DatumGetBool(RpGetDatum(0, first + RP_ACT_CLOSED, &isnull));
	act->frozen = DatumGetBool(RpGetDatum(0, first + RP_ACT_FROZEN, &isnull));
	act->revision = DatumGetInt64(RpGetDatum(0, first + RP_ACT_REVISION, &isnull));
	act->restricted = DatumGetBool(RpGetDatum(0, first + RP_ACT_RESTRICTED, &isnull));
}

static RpPlan fetch_14 = {
	"SELECT " RP_ACTIVITY_SELECT_14 " FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

static RpPlan fetch_13 = {
	"SELECT " RP_ACTIVITY_SELECT_13 " FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

bool
RpFetchActivity(int64 id, RpActivity *act, bool missing_ok)
{
	Datum		value = Int64GetDatum(id);

	if (RpExec(RpCatalogVersion() >= RP_CATALOG_1_4 ? &fetch_14 : &fetch_13, &value, NULL,
			   false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read activity " INT64_FORMAT, id);
	if (SPI_processed == 0)
	{
		if (missing_ok)
			return false;
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("activity " INT64_FORMAT " does not exist", id)));
	}
	RpActivityFromRow(id, 1, act);
	return true;
}

#define RP_META_CACHE_MAX 4096

typedef struct RpMetaEntry
{
	int64		id;				/* hash key */
	RpActivity	act;
} RpMetaEntry;

static HTAB *meta_cache = NULL;
static uint64 meta_generation = 0;

/*
 * A backend-local cache keyed by activity id (entries of entrysize, the id
 * first), made empty when the catalog's generation moved or it is full.
 */
HTAB *
RpActivityCache(HTAB **cache, uint64 *generation, const char *name, Size entrysize)
{
	uint64		now = RpCatalogGeneration();

	if (*cache != NULL &&
		(now != *generation || hash_get_num_entries(*cache) >= RP_META_CACHE_MAX))
	{
		hash_destroy(*cache);
		*cache = NULL;
	}
	if (*cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(int64);
		ctl.entrysize = entrysize;
		*cache = hash_create(name, 256, &ctl, HASH_ELEM | HASH_BLOBS);
		*generation = now;
	}
	return *cache;
}

static HTAB *
MetaCache(void)
{
	return RpActivityCache(&meta_cache, &meta_generation, "redpacket activity metadata",
						   sizeof(RpMetaEntry));
}

/* Keep what a claim read of the activity (frozen and closed left out). */
void
RpActivityMetaRemember(const RpActivity *act)
{
	RpMetaEntry *entry = hash_search(MetaCache(), &act->id, HASH_ENTER, NULL);

	entry->act = *act;
	entry->act.closed = entry->act.frozen = false;
}

bool
RpActivityMeta(int64 id, RpActivity *act)
{
	RpMetaEntry *entry = hash_search(MetaCache(), &id, HASH_FIND, NULL);

	if (entry != NULL)
	{
		*act = entry->act;
		return true;
	}
	if (!RpFetchActivity(id, act, true))
		return false;
	RpActivityMetaRemember(act);
	act->closed = act->frozen = false;
	return true;
}
