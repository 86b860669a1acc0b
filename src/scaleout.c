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
 *		Also here: the local shard tables of an activity, which the fast
 *		claim writes (direct.c through RpShardTables, else RpShardFastClaim's
 *		statements) and a batch inserts into (RpShardInsertClaims), and the
 *		cluster-wide rp_reconcile() (RpReconcileCluster).
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

#include "fast.h"
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

/*
 * The fast path on a Citus node, for fixed amounts under READ COMMITTED
 * (fast.c's RpFastTake, whose caller holds the user's lock and the stripe's),
 * where direct.c's path does not apply (a per-user limit above one,
 * redpacket.direct_claims off, tables that are not plain).
 *
 * Through Citus every statement on a distributed table costs a distributed
 * plan, shard pruning and, with local execution, a deparsed, re-parsed and
 * re-planned shard query on every call (Citus 13.2 does not keep the local
 * plan of a prepared statement here): about three times the claim's own
 * work.  The statements of this path touch one activity, whose shards this
 * node holds (the caller's node guard made sure), so they run on the shard
 * tables themselves, as plain prepared statements (or, in direct.c, with
 * no statement at all).  Citus's protection
 * against a concurrent shard move is kept: the shards' metadata locks in
 * share mode, as Citus takes them for its own statements (a move blocks
 * writes with them in exclusive mode on every node), and the placement is
 * re-read after any invalidation.
 *
 * The three statements are the single statement of the single-node path
 * taken apart: no claim under the key and room under the user's limit, the
 * conditional decrement, the insert.  Returns false, having written
 * nothing, when a check fails or the stripe cannot pay (the careful path
 * then decides, through Citus), or when the shards are not here.
 */
typedef enum RpShardStmt
{
	RP_SHARD_CHECK,
	RP_SHARD_TAKE,
	RP_SHARD_TAKE_14,
	RP_SHARD_INSERT,
	RP_SHARD_BATCH_INSERT,
	RP_SHARD_NSTMT
} RpShardStmt;

#define SHARD_TAKE "UPDATE %s" RP_SQL_DEBIT("", "$3") RP_SQL_STRIPE_OPEN("", "$1", "$2")

static const char *const shard_sql[RP_SHARD_NSTMT] = {
	"SELECT pg_catalog.count(*),"
	"       pg_catalog.bool_or(c.idempotency_key OPERATOR(pg_catalog.=) $3)"
	"  FROM %s c"
	" WHERE c.activity_id OPERATOR(pg_catalog.=) $1 AND c.user_id OPERATOR(pg_catalog.=) $2",
	/* the fast decrement, on the 1.3 catalog and on 1.4 (revision, undealt) */
	SHARD_TAKE RP_SQL_CAN_PAY_13("", "$3"),
	SHARD_TAKE RP_SQL_CAN_PAY_14("", "$3", "$4"),
	"INSERT INTO %s"
	"       (activity_id, claim_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
	" VALUES ($1, pg_catalog.nextval('redpacket.claim_id_seq'::pg_catalog.regclass),"
	"         $2, $3, $4, $5, $6, $7)"
	" RETURNING claim_id, claimed_at",
	/* batch.c's insert_claims */
	"INSERT INTO %s"
	"       (activity_id, claim_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
	" SELECT $1, pg_catalog.nextval('redpacket.claim_id_seq'::pg_catalog.regclass),"
	"        k.user_id, k.request_id, k.idem, k.amount, k.stripe, pg_catalog.now()"
	RP_SQL_BATCH_ROWS
};

/*
 * The check reads the user's claims on the shard's (activity_id, user_id,
 * idempotency_key) index from a generic plan, as claim.c does off Citus: a
 * custom plan for an activity newer than the shard's statistics scanned its
 * primary key by activity_id alone.  A shard table is a plain table to the
 * planner, so Citus's routing (which needs custom plans) is not involved.
 */
static const int shard_nargs[RP_SHARD_NSTMT] = {3, 3, 4, 7, 6};
static const Oid shard_argtypes[RP_SHARD_NSTMT][7] = {
	{INT8OID, TEXTOID, TEXTOID},
	{INT8OID, INT4OID, INT8OID},
	{INT8OID, INT4OID, INT8OID, INT8OID},
	{INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT4OID, TIMESTAMPTZOID},
	{INT8OID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, NUMERICARRAYOID, INT4ARRAYOID}
};

/* Prepared statements per shard table, kept for the life of the backend. */
typedef struct RpShardPlans
{
	Oid			relid;			/* hash key */
	SPIPlanPtr	plan[RP_SHARD_NSTMT];
} RpShardPlans;

static HTAB *shard_plans = NULL;

static SPIPlanPtr
ShardPlan(RpShardStmt stmt, Oid relid)
{
	RpShardPlans *e;
	bool		found;

	if (shard_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(RpShardPlans);
		ctl.hcxt = TopMemoryContext;
		shard_plans = hash_create("redpacket shard plans", 64, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	e = hash_search(shard_plans, &relid, HASH_ENTER, &found);
	if (!found)
		memset(e->plan, 0, sizeof(e->plan));
	if (e->plan[stmt] == NULL)
	{
		char	   *rel = quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
													 get_rel_name(relid));
		SPIPlanPtr	plan = SPI_prepare_cursor(psprintf(shard_sql[stmt], rel), shard_nargs[stmt],
											  (Oid *) shard_argtypes[stmt],
											  stmt == RP_SHARD_CHECK ? CURSOR_OPT_GENERIC_PLAN : 0);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "could not prepare a statement on shard table %s", rel);
		e->plan[stmt] = plan;
	}
	return e->plan[stmt];
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
 * The shard tables of the activity on this node, for direct.c's fast claim:
 * false when this node does not hold them.  The shards' metadata locks are
 * held to the end of the transaction, as for the statements below.  Must
 * be called inside SPI_connect.
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

bool
RpShardFastClaim(const RpActivity *act, int stripe, int64 units, RpFastClaim *fast)
{
	Datum		args[7];
	char		nulls[7] = {' ', ' ', fast->request_id ? ' ' : 'n', ' ', ' ', ' ', ' '};
	bool		isnull;
	int			rc;
	RpLocalShards shards;
	RpLocalShards *sh = &shards;

	if (!FindLocalShards(act->id, true, &shards))
		return false;

	/*
	 * Not read-only: a snapshot taken now, under the user's lock, sees every
	 * committed claim of the user.  The statement's own snapshot was taken
	 * before the lock, so a claim committed while we waited for it was
	 * missed: the insert then failed on the unique key (23505), and under a
	 * per-user limit the user got one claim too many.
	 */
	args[0] = Int64GetDatum(act->id);
	args[1] = PointerGetDatum(fast->user_id);
	args[2] = PointerGetDatum(fast->key);
	rc = SPI_execute_plan(ShardPlan(RP_SHARD_CHECK, sh->claim_rel), args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look up the claims of the user");
	if ((DatumGetBool(RpGetDatum(0, 2, &isnull)) && !isnull) ||
		RpGetInt64(0, 1, 0) >= act->per_user_limit)
		return false;

	args[1] = Int32GetDatum(stripe);
	args[2] = Int64GetDatum(units);
	args[3] = Int64GetDatum(act->revision);
	rc = SPI_execute_plan(ShardPlan(RpCatalogVersion() >= RP_CATALOG_1_4 ?
									RP_SHARD_TAKE_14 : RP_SHARD_TAKE,
									sh->stripe_rel), args, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "could not update stripe %d", stripe);
	if (SPI_processed == 0)
		return false;

	args[1] = PointerGetDatum(fast->user_id);
	args[2] = PointerGetDatum(fast->request_id);
	args[3] = PointerGetDatum(fast->key);
	args[4] = NumericGetDatum(fast->amount);
	args[5] = Int32GetDatum(stripe);
	/* what now() is in this transaction, as the single-node statement writes */
	args[6] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	rc = SPI_execute_plan(ShardPlan(RP_SHARD_INSERT, sh->claim_rel), args, nulls, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not insert the claim on stripe %d", stripe);
	fast->claim_id = RpGetInt64(0, 1, 0);
	fast->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 2, &isnull));
	return true;
}

/*
 * batch.c's INSERT of a batch's claims on a Citus node: Citus would run an
 * INSERT ... SELECT from unnest through an intermediate result (a COPY into
 * the shard); the same statement on the local shard table is a plain one.
 * The batch's node guard made sure the activity is held here.  Returns the
 * SPI result.
 */
int
RpShardInsertClaims(int64 activity, Datum *values)
{
	RpLocalShards shards;

	if (!FindLocalShards(activity, true, &shards))
		RpRequireLocalActivity(activity);	/* raises the guard's error */
	return SPI_execute_plan(ShardPlan(RP_SHARD_BATCH_INSERT, shards.claim_rel),
							values, NULL, false, 0);
}

/*
 * rp_reconcile() without an activity on a Citus cluster.  Each node checks
 * only the activities it holds (RpReconcilePass skips the others), and
 * Citus delegates a plain call without an activity to whichever node holds
 * the shard of a NULL key, so the pass would check that node's share only.
 * Instead the node that runs it asks every node, itself included, for its
 * own share (rp_reconcile(0): activity 0 never exists, and on a
 * distributed cluster it means "this node's activities"), in a connection
 * of its own (each share commits there), and returns every row they report:
 * each activity is checked once, where it lives.  A node whose pass fails
 * or cannot be reached is reported with a WARNING and the others go on;
 * within a node's pass a failing activity is a failed row, as on a single
 * node.  The WHERE clause keeps Citus from delegating the inner call.  Must
 * be called inside SPI_connect.
 */
static RpPlan node_passes = {
	"SELECT n.nodename, n.nodeport, w.success, w.result"
	"  FROM pg_catalog.run_command_on_all_nodes($1) w"
	"  JOIN pg_catalog.pg_dist_node n ON n.nodeid OPERATOR(pg_catalog.=) w.nodeid"
	" ORDER BY n.groupid",
	1, {TEXTOID}
};

static RpPlan node_rows = {
	"SELECT x.* FROM pg_catalog.json_populate_recordset(NULL::redpacket.reconciliation,"
	"                                                   $1::pg_catalog.json) x",
	1, {TEXTOID}
};

void
RpReconcileCluster(bool full_check, Tuplestorestate *out)
{
	Datum		cmd;
	SPITupleTable *nodes;
	uint64		n;

	cmd = CStringGetTextDatum(psprintf("SELECT pg_catalog.json_agg(r)"
									   "  FROM redpacket.rp_reconcile(0, %s) r"
									   " WHERE r.activity_id IS NOT NULL",
									   full_check ? "true" : "false"));
	if (RpExec(&node_passes, &cmd, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not run the reconciliation on the nodes");
	nodes = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	t = nodes->vals[i];
		char	   *node = SPI_getvalue(t, nodes->tupdesc, 1);
		char	   *port = SPI_getvalue(t, nodes->tupdesc, 2);
		char	   *ok = SPI_getvalue(t, nodes->tupdesc, 3);
		char	   *result = SPI_getvalue(t, nodes->tupdesc, 4);
		Datum		json;

		if (ok == NULL || strcmp(ok, "t") != 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("redpacket reconciliation failed on node %s:%s", node, port),
					 errdetail("The node answered: %s", result ? result : "nothing."),
					 errhint("The other nodes' results are returned; run the pass again for this one.")));
			continue;
		}
		if (result == NULL || result[0] == '\0')
			continue;			/* nothing pending there, or its own pass was running */
		json = CStringGetTextDatum(result);
		if (RpExec(&node_rows, &json, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the reconciliation of node %s:%s", node, port);
		for (uint64 r = 0; r < SPI_processed; r++)
			tuplestore_puttuple(out, SPI_tuptable->vals[r]);
	}
}
