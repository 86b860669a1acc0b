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
 *		undistribute_table() both send.  On a distributed cluster each check
 *		is one catalog query (shard placement of the activity).
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "redpacket.h"

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

static void
DistInvalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == dist_relid)
		dist_state = RP_DIST_UNKNOWN;
}

/* Must be called inside SPI_connect. */
static RpDistState
DistState(void)
{
	Oid			nsp;

	if (!dist_callback_registered)
	{
		CacheRegisterRelcacheCallback(DistInvalidate, (Datum) 0);
		dist_callback_registered = true;
	}
	if (dist_state != RP_DIST_UNKNOWN)
		return dist_state;

	dist_state = RP_DIST_LOCAL;
	nsp = get_namespace_oid("redpacket", true);
	dist_relid = OidIsValid(nsp) ? get_relname_relid("activity", nsp) : InvalidOid;
	if (OidIsValid(dist_relid) && OidIsValid(get_extension_oid("citus", true)))
	{
		Datum		relid = ObjectIdGetDatum(dist_relid);

		if (RpExec(&is_distributed, &relid, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read pg_dist_partition");
		if (SPI_processed > 0)
			dist_state = RP_DIST_CITUS;
	}
	return dist_state;
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

	if (DistState() == RP_DIST_LOCAL)
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
