/*
 * split.c
 *		How an activity's claims are paid, a term fixed when it is created
 *		(1.6): lucky (the server draws every amount), equal (every packet
 *		total / packets) or caller (every claim names its amount); any, the
 *		rule of the activities made before, pays an amount named and draws
 *		when none is.  No statement of ours changes it, so what a backend
 *		read once holds for the activity's life; the cache goes with the
 *		catalog's generation and when full.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "claim.h"


static const char *const split_names[] = {"any", "lucky", "equal", "caller"};

const char *
RpSplitName(RpSplit split)
{
	return split_names[split];
}

RpSplit
RpSplitFromName(const char *name)
{
	for (int s = 0; s < lengthof(split_names); s++)
		if (strcmp(name, split_names[s]) == 0)
			return (RpSplit) s;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("split must be lucky, equal, caller or any"),
			 errdetail("Got \"%s\".", name)));
	return RP_SPLIT_ANY;		/* not reached */
}

typedef struct RpSplitEntry
{
	int64		id;				/* hash key */
	RpSplit		split;
	int64		unit;
} RpSplitEntry;

static HTAB *split_cache = NULL;
static uint64 split_generation = 0;

static RpPlan fetch_split = {
	"SELECT a.split, a.total FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

static HTAB *
SplitCache(void)
{
	return RpActivityCache(&split_cache, &split_generation, "redpacket activity splits",
						   sizeof(RpSplitEntry));
}

/* The split of the activity, and for equal the packet in minor units; inside SPI_connect. */
RpSplit
RpActivitySplit(const RpActivity *act, int64 *unit)
{
	RpSplitEntry *entry;
	bool		found;
	Datum		id = Int64GetDatum(act->id);
	bool		isnull;

	*unit = 0;
	if (RpCatalogVersion() < RP_CATALOG_1_6)
		return RP_SPLIT_ANY;
	entry = hash_search(SplitCache(), &act->id, HASH_FIND, NULL);
	if (entry == NULL)
	{
		RpSplit		split = RP_SPLIT_ANY;
		int64		u = 0;

		if (RpExecOn(&fetch_split, RpDistributed(), &id, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read the split of activity " INT64_FORMAT, act->id);
		if (SPI_processed == 0)
			return RP_SPLIT_ANY;	/* the caller finds it missing */
		split = RpSplitFromName(TextDatumGetCString(RpGetDatum(0, 1, &isnull)));
		if (split == RP_SPLIT_EQUAL && act->packets > 0)
			u = RpAmountToUnits(DatumGetNumeric(RpGetDatum(0, 2, &isnull)), act->scale, "total") /
				act->packets;
		entry = hash_search(SplitCache(), &act->id, HASH_ENTER, &found);
		entry->split = split;
		entry->unit = u;
	}
	*unit = entry->unit;
	return entry->split;
}
