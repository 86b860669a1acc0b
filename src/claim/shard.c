/*
 * shard.c
 *		The claim engine's Citus backend: a fixed claim's check, debit and
 *		insert (RpShardFastClaim) and a batch's insert (RpShardInsertClaims)
 *		as plain prepared statements on the shard tables this node holds
 *		(scaleout/scaleout.c finds them).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "take.h"

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

bool
RpShardFastClaim(const RpActivity *act, int stripe, int64 units, RpFastClaim *fast)
{
	Datum		args[7];
	char		nulls[7] = {' ', ' ', fast->request_id ? ' ' : 'n', ' ', ' ', ' ', ' '};
	bool		isnull;
	int			rc;
	Oid			claim_rel;
	Oid			stripe_rel;
	Oid			claim_seq;

	if (!RpShardTables(act->id, &claim_rel, &stripe_rel, &claim_seq))
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
	rc = SPI_execute_plan(ShardPlan(RP_SHARD_CHECK, claim_rel), args, NULL, false, 1);
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
									stripe_rel), args, NULL, false, 0);
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
	rc = SPI_execute_plan(ShardPlan(RP_SHARD_INSERT, claim_rel), args, nulls, false, 0);
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
	Oid			claim_rel;
	Oid			stripe_rel;
	Oid			claim_seq;

	if (!RpShardTables(activity, &claim_rel, &stripe_rel, &claim_seq))
		RpRequireLocalActivity(activity);	/* raises the guard's error */
	return SPI_execute_plan(ShardPlan(RP_SHARD_BATCH_INSERT, claim_rel),
							values, NULL, false, 0);
}
