/*
 * catalog.c
 *		One backend-local cache of the extension's relation OIDs (pg_cron's
 *		job_metadata.c keeps its own the same way): looked up by name in the
 *		schema redpacket on first use, and forgotten, with a new generation
 *		number, on any relcache invalidation of one of them (ALTER, CREATE
 *		INDEX, DROP/CREATE EXTENSION) or of every relation.  Everything else
 *		that caches something about our tables (the direct path's shape, the
 *		activities' metadata) keys it on the generation.  And the version of
 *		the installed catalog, and for the update scripts whether a row was
 *		written by the transaction running them.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "storage/sinval.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "base.h"
#include "catalog.h"

static const char *const rel_names[RP_NRELS] = {
	"activity", "stripe", "claim", "eligible", "ledger", "reconcile_state"
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

/*
 * The version of the installed SQL objects as major * 100 + minor (1.0 is
 * 100, 1.1 is 101, 1.2 is 102, 1.3 is 103), or 0 when the extension is not
 * installed.  The library serves every catalog it can meet: code that needs
 * objects of a later version asks this first.
 *
 * Read from pg_extension, and kept until this backend processes any
 * invalidation message or the generation of our relations moves.  What a
 * version changes is catalog objects, and every change of one sends an
 * invalidation that every other backend processes before its next
 * transaction uses the catalog.  An update inside a transaction that
 * claimed before it sends its invalidations to that transaction only as
 * local ones: the update to 1.4 alters redpacket.activity, which moves the
 * generation (test/t/010_upgrade.pl claims, updates and claims again in one
 * transaction).  An update rolled back (a savepoint's) or prepared sends
 * nothing either: any abort or PREPARE TRANSACTION forgets the version.  A read per transaction cost more than a
 * claim's own two index probes.
 */
static int	cached = 0;
static TransactionId cached_xmin = InvalidTransactionId;

/* The version a snapshot (NULL: the catalog's) sees installed, and its row's xmin. */
static int
ReadVersion(Snapshot snapshot, TransactionId *xmin)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	int			version = 0;

	*xmin = InvalidTransactionId;
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("redpacket"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, snapshot, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);
		int			major = 0,
					minor = 0;

		if (!isnull && sscanf(TextDatumGetCString(d), "%d.%d", &major, &minor) == 2)
			version = major * 100 + minor;
		*xmin = HeapTupleHeaderGetXmin(tuple->t_data);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

static bool cached_valid = false;

/*
 * A rolled-back update sends no invalidation, and a prepared one leaves
 * this backend as if rolled back: forget what it may have shown.
 */
static void
ForgetOnAbort(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		cached_valid = false;
}

static void
ForgetOnSubAbort(SubXactEvent event, SubTransactionId sub, SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		cached_valid = false;
}

/*
 * A transaction snapshot (REPEATABLE READ, SERIALIZABLE) that sees another
 * version installed (an update, or the extension itself, committed after
 * it) does not show the rows that came with this one (where an activity's
 * settlement tracking starts, the refunds the update recorded): served, it
 * would decide on the rows of one version by the rules of the next.  Like a
 * row changed since the snapshot, that is a serialization failure, and the
 * retry sees both.  Another change of the row (its owner) is no such thing.
 */
static void
RefuseOlderSnapshot(void)
{
	Snapshot	snapshot;
	TransactionId seen_xmin;

	if (!IsolationUsesXactSnapshot() || !TransactionIdIsNormal(cached_xmin) ||
		TransactionIdIsCurrentTransactionId(cached_xmin))
		return;
	snapshot = GetTransactionSnapshot();
	if (!XidInMVCCSnapshot(cached_xmin, snapshot) || ReadVersion(snapshot, &seen_xmin) == cached)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to an update of extension \"redpacket\""),
			 errdetail("The extension was created or updated after this transaction took its snapshot."),
			 errhint("Retry the transaction.")));
}

int
RpCatalogVersion(void)
{
	static uint64 cached_messages = 0;
	static uint64 cached_generation = 0;
	static bool callbacks = false;
	uint64		generation = RpCatalogGeneration();

	if (!callbacks)
	{
		RegisterXactCallback(ForgetOnAbort, NULL);
		RegisterSubXactCallback(ForgetOnSubAbort, NULL);
		callbacks = true;
	}
	if (!(cached_valid && cached_messages == SharedInvalidMessageCounter &&
		  cached_generation == generation))
	{
		cached_messages = SharedInvalidMessageCounter;
		cached = ReadVersion(NULL, &cached_xmin);
		/* the lock may have processed messages: they were before this read */
		cached_generation = RpCatalogGeneration();
		cached_valid = cached_generation == generation;
	}
	RefuseOlderSnapshot();
	return cached;
}

PG_FUNCTION_INFO_V1(rp_written_now);

/*
 * rp_written_now(xmin): whether a row with this xmin was written by the
 * running transaction, in any of its subtransactions (a savepoint, psql's
 * ON_ERROR_ROLLBACK).  An update script creates it for one step and drops
 * it again.
 */
Datum
rp_written_now(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(TransactionIdIsCurrentTransactionId(PG_GETARG_TRANSACTIONID(0)));
}
