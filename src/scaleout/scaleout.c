/*
 * scaleout.c
 *		Where an activity lives when redpacket runs on a Citus cluster.  Our
 *		locks are advisory locks of the node that runs the function: they
 *		exclude each other only when every call that takes them for one
 *		activity runs on the node holding that activity's shards.
 *		rp_distribute() delegates those functions there; this file makes any
 *		call that still lands elsewhere (an explicit transaction on the
 *		coordinator, a direct connection to the wrong worker) refuse instead
 *		of locking the wrong node.
 *
 *		Off Citus, or while our tables are not distributed, the check costs a
 *		cached flag; it is rebuilt after any relcache invalidation of
 *		redpacket.activity, which create_distributed_table() and
 *		undistribute_table() both send.  On a distributed cluster the
 *		activities this node holds are cached per backend.
 *
 *		Also here: the local shard tables of an activity (RpShardTables),
 *		which the claim engine's Citus backends write.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "base/base.h"
#include "scaleout.h"

/* Is redpacket.activity a Citus distributed table? */
static RpPlan is_distributed = {
	"SELECT 1 FROM pg_catalog.pg_dist_partition p"
	" WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1",
	1, {OIDOID}
};

/*
 * Where the shard of the activity is placed: true when on this node's
 * group, with the group id of one placement for the error message.
 */
static RpPlan placement = {
	"SELECT p.groupid OPERATOR(pg_catalog.=) g.groupid, p.groupid,"
	"       (SELECT n.nodename OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) n.nodeport"
	"          FROM pg_catalog.pg_dist_node n"
	"         WHERE n.groupid OPERATOR(pg_catalog.=) p.groupid AND n.noderole OPERATOR(pg_catalog.=) 'primary'"
	"         LIMIT 1)"
	"  FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
	" WHERE p.shardid OPERATOR(pg_catalog.=)"
	"       pg_catalog.get_shard_id_for_distribution_column('redpacket.activity'::pg_catalog.regclass, $1)"
	" ORDER BY 1 DESC LIMIT 1",
	1, {INT8OID}
};

typedef enum RpDistState
{
	RP_DIST_UNKNOWN,
	RP_DIST_LOCAL,				/* no Citus, or our tables are not distributed */
	RP_DIST_CITUS				/* redpacket.activity is distributed */
} RpDistState;

static RpDistState dist_state = RP_DIST_UNKNOWN;
static Oid	dist_relid = InvalidOid;
static bool dist_callback_registered = false;

/*
 * Activities held by this node, with their shards of redpacket.stripe and
 * redpacket.claim: the node guard and the fast path look them up here
 * instead of in Citus's catalogs.  Forgotten on any relcache invalidation:
 * Citus sends one for the distributed table whenever a placement of its
 * shards changes (a move, a split).
 */
typedef struct RpLocalShards
{
	int64		activity;		/* hash key */
	uint64		stripe_shard;
	uint64		claim_shard;
	Oid			stripe_rel;
	Oid			claim_rel;
	Oid			claim_seq;		/* redpacket.claim_id_seq */
} RpLocalShards;

#define RP_LOCAL_SHARDS_MAX 4096	/* entries kept; then the cache starts over */

static HTAB *local_shards = NULL;

/*
 * The activity's shard ids, and the shard tables when this node holds
 * them (placement in this node's group; a table left behind by a move is
 * not enough); the sequence of claim ids, by the name the SQL uses.
 */
static RpPlan shards_of = {
	"SELECT x.st, x.cl, (SELECT p.groupid OPERATOR(pg_catalog.=) g.groupid"
	"                      FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
	"                     WHERE p.shardid OPERATOR(pg_catalog.=) x.cl"
	"                     ORDER BY 1 DESC LIMIT 1),"
	"       pg_catalog.to_regclass(pg_catalog.shard_name('redpacket.stripe'::pg_catalog.regclass, x.st)),"
	"       pg_catalog.to_regclass(pg_catalog.shard_name('redpacket.claim'::pg_catalog.regclass, x.cl)),"
	"       pg_catalog.to_regclass('redpacket.claim_id_seq')"
	"  FROM (SELECT pg_catalog.get_shard_id_for_distribution_column('redpacket.stripe'::pg_catalog.regclass, $1) st,"
	"               pg_catalog.get_shard_id_for_distribution_column('redpacket.claim'::pg_catalog.regclass, $1) cl) x",
	1, {INT8OID}
};

static bool FindLocalShards(int64 activity, bool lock, RpLocalShards *out);

static void
DistInvalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == dist_relid)
		dist_state = RP_DIST_UNKNOWN;
	if (local_shards != NULL)
	{
		hash_destroy(local_shards);
		local_shards = NULL;
	}
}

/* Must be called inside SPI_connect. */
static RpDistState
DistState(void)
{
	Oid			nsp;
	RpDistState state;

	if (!dist_callback_registered)
	{
		RpOnRelcacheInvalidation(DistInvalidate);
		dist_callback_registered = true;
	}
	if (dist_state != RP_DIST_UNKNOWN)
		return dist_state;

	/*
	 * Decided in a local: the lookups below can process an invalidation
	 * that resets dist_state to unknown while they run.
	 */
	state = RP_DIST_LOCAL;
	nsp = get_namespace_oid("redpacket", true);
	dist_relid = OidIsValid(nsp) ? get_relname_relid("activity", nsp) : InvalidOid;
	if (OidIsValid(dist_relid) && OidIsValid(get_extension_oid("citus", true)))
	{
		Datum		relid = ObjectIdGetDatum(dist_relid);

		if (RpExec(&is_distributed, &relid, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read pg_dist_partition");
		if (SPI_processed > 0)
			state = RP_DIST_CITUS;
	}
	dist_state = state;
	return state;
}

/*
 * True when redpacket's tables are distributed by Citus: callers that have a
 * single-node form of a statement Citus cannot route (a data-modifying CTE
 * feeding INSERT ... SELECT) pick the routable form with this.  Must be
 * called inside SPI_connect.
 */
bool
RpDistributed(void)
{
	return DistState() == RP_DIST_CITUS;
}

/*
 * True when the activity's rows are on this node: always off Citus;
 * on Citus, when this node holds a placement of the activity's shard.  An
 * id no shard covers cannot happen for a distributed table (hash ranges
 * cover every value).  Must be called inside SPI_connect.
 */
bool
RpActivityIsLocal(int64 activity)
{
	return RpActivityPlacement(activity, NULL);
}

/*
 * As RpActivityIsLocal; when not local and where is given, *where is set
 * to "host:port" of a node that holds it.
 */
bool
RpActivityPlacement(int64 activity, char **where)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;
	bool		local;
	RpLocalShards shards;

	if (DistState() == RP_DIST_LOCAL || FindLocalShards(activity, false, &shards))
		return true;
	if (RpExec(&placement, &id, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the shard placement of activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		return true;
	local = DatumGetBool(RpGetDatum(0, 1, &isnull));
	if (!local && where != NULL)
	{
		Datum		d = RpGetDatum(0, 3, &isnull);

		*where = isnull ? psprintf("group %d", DatumGetInt32(RpGetDatum(0, 2, &isnull)))
			: TextDatumGetCString(d);
	}
	return local;
}

/*
 * Refuse to go on when the activity's shards are on another node: our locks
 * taken here would not exclude a claim running there.  Every function that
 * takes a stripe, user or reconciliation lock for an activity calls this
 * first.  Must be called inside SPI_connect.
 */
void
RpRequireLocalActivity(int64 activity)
{
	char	   *where = NULL;

	if (!RpActivityPlacement(activity, &where))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is not held by this node", activity),
				 errdetail("Its shards are on %s; redpacket's locks work only on the node that holds them.",
						   where ? where : "another node"),
				 errhint("Call the function through the Citus coordinator in its own statement, outside an explicit transaction that touched other activities, or connect to that node.")));
}

/* Share-lock a shard's Citus metadata, as Citus's own executor does. */
static void
LockShardMetadata(uint64 shardid)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (shardid >> 32), (uint32) shardid,
						 4 /* Citus: ADV_LOCKTAG_CLASS_CITUS_SHARD_METADATA */ );
	(void) LockAcquire(&tag, ShareLock, false, false);
}

static RpLocalShards *
CachedShards(int64 activity)
{
	if (local_shards == NULL)
		return NULL;
	return hash_search(local_shards, &activity, HASH_FIND, NULL);
}

/*
 * Whether this node holds the activity, with its shards in *out.  With lock,
 * share-locks the shards' metadata first, so that the answer holds to the
 * end of the transaction (the fast path writes the shard tables).  Must be
 * called inside SPI_connect.
 */
static bool
FindLocalShards(int64 activity, bool lock, RpLocalShards *out)
{
	Datum		id = Int64GetDatum(activity);
	bool		n1, n2, n3, n4, n5, n6;
	RpLocalShards *e;

	AcceptInvalidationMessages();
	if ((e = CachedShards(activity)) != NULL)
	{
		*out = *e;
		if (!lock)
			return true;
		LockShardMetadata(out->stripe_shard);
		LockShardMetadata(out->claim_shard);
		AcceptInvalidationMessages();	/* a move may have committed meanwhile */
		if (CachedShards(activity) != NULL)
			return true;
	}

	if (RpExec(&shards_of, &id, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not find the shards of activity " INT64_FORMAT, activity);
	out->activity = activity;
	out->stripe_shard = (uint64) DatumGetInt64(RpGetDatum(0, 1, &n1));
	out->claim_shard = (uint64) DatumGetInt64(RpGetDatum(0, 2, &n2));
	out->stripe_rel = DatumGetObjectId(RpGetDatum(0, 4, &n4));
	out->claim_rel = DatumGetObjectId(RpGetDatum(0, 5, &n5));
	out->claim_seq = DatumGetObjectId(RpGetDatum(0, 6, &n6));
	if (n1 || n2 || n4 || n5 || n6 || !DatumGetBool(RpGetDatum(0, 3, &n3)) || n3)
		return false;
	if (lock)
	{
		/*
		 * Citus locks first, then reads the placement: do the same, with a
		 * snapshot taken after the lock (a move that committed while we
		 * waited for it must be seen).
		 */
		LockShardMetadata(out->stripe_shard);
		LockShardMetadata(out->claim_shard);
		if (RpExec(&shards_of, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not find the shards of activity " INT64_FORMAT, activity);
		if (!DatumGetBool(RpGetDatum(0, 3, &n3)) || n3)
			return false;
	}

	if (local_shards == NULL || hash_get_num_entries(local_shards) >= RP_LOCAL_SHARDS_MAX)
	{
		HASHCTL		ctl;

		if (local_shards != NULL)
			hash_destroy(local_shards);
		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(RpLocalShards);
		ctl.hcxt = TopMemoryContext;
		local_shards = hash_create("redpacket local shards", 64, &ctl,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	e = hash_search(local_shards, &activity, HASH_ENTER, NULL);
	*e = *out;
	return true;
}

/*
 * The shard tables of the activity on this node, for the claims written on
 * them: false when this node does not hold them.  The shards' metadata
 * locks are held to the end of the transaction, as Citus holds them for its
 * own writes.  Must be called inside SPI_connect.
 */
bool
RpShardTables(int64 activity, Oid *claim_rel, Oid *stripe_rel, Oid *claim_seq)
{
	RpLocalShards shards;

	if (!FindLocalShards(activity, true, &shards))
		return false;
	*claim_rel = shards.claim_rel;
	*stripe_rel = shards.stripe_rel;
	*claim_seq = shards.claim_seq;
	return true;
}
