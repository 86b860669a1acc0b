/*
 * catalog.c
 *		One backend-local cache of the extension's relation OIDs (pg_cron's
 *		job_metadata.c keeps its own the same way): looked up by name in the
 *		schema redpacket on first use, and forgotten, with a new generation
 *		number, on any relcache invalidation of one of them (ALTER, CREATE
 *		INDEX, DROP/CREATE EXTENSION) or of every relation.  Everything else
 *		that caches something about our tables (the direct path's shape, the
 *		activities' metadata) keys it on the generation.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "catalog.h"
#include "redpacket.h"

static const char *const rel_names[RP_NRELS] = {
	"activity", "stripe", "claim", "eligible"
};

static Oid	relids[RP_NRELS];
static bool valid = false;
static uint64 generation = 1;
static bool callback_registered = false;

static void
CatalogInvalidate(Datum arg, Oid relid)
{
	if (!valid)
		return;
	for (int r = 0; r < RP_NRELS; r++)
		if (relid == InvalidOid || relid == relids[r])
		{
			valid = false;
			generation++;
			return;
		}
}

static void
CatalogLoad(void)
{
	Oid			nsp;

	if (!callback_registered)
	{
		RpOnRelcacheInvalidation(CatalogInvalidate);
		callback_registered = true;
	}
	nsp = get_namespace_oid("redpacket", true);
	for (int r = 0; r < RP_NRELS; r++)
		relids[r] = OidIsValid(nsp) ? get_relname_relid(rel_names[r], nsp) : InvalidOid;

	/*
	 * Without redpacket.activity the extension is not installed: nothing is
	 * kept, since CREATE EXTENSION sends no invalidation of a relation we
	 * know.  A catalog that merely predates a relation changes activity when
	 * it is updated (ALTER TABLE), which invalidates what is kept.
	 */
	valid = OidIsValid(relids[RP_REL_ACTIVITY]);
	if (!valid)
		generation++;
}

Oid
RpRelid(RpRel rel)
{
	if (!valid)
		CatalogLoad();
	return relids[rel];
}

uint64
RpCatalogGeneration(void)
{
	if (!valid)
		CatalogLoad();
	return generation;
}
