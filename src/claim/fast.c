/*
 * fast.c
 *		The fast path's one interface (fast.h) and where its backend is
 *		chosen: on a Citus cluster the shard backend (shard.c); on a
 *		single node the executor-direct backend (direct.c) when it applies,
 *		else the SPI backend here: the same checks, decrement and insert as
 *		one prepared statement.
 */
#include "postgres.h"

#include "catalog/pg_type.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "fast.h"

/*
 * The SPI backend's statement: the duplicate, halt, revision, limit and
 * eligibility checks, the conditional decrement of undealt money and an
 * undealt packet, and the claim insert in one statement; it returns the new
 * claim, or no row when any check failed or the stripe cannot pay (then
 * nothing was written).  $1 activity, $2 stripe, $3 units, $4 user, $5
 * request id, $6 idempotency key, $7 amount, $8 revision, $9 per-user
 * limit.  Generic plans: a custom plan for an activity newer than claim's
 * statistics checked the user's claims by scanning claim_pkey on
 * activity_id alone, every claim of the activity per claim.
 */
#define TAKE_AND_CLAIM(can_pay, extra_checks) \
	"WITH t AS (" \
	"  UPDATE redpacket.stripe s" RP_SQL_DEBIT("s.", "$3") \
	RP_SQL_STRIPE_OPEN("s.", "$1", "$2") \
	can_pay \
	"     AND NOT EXISTS (SELECT 1 FROM redpacket.claim c" \
	"                      WHERE" RP_SQL_CLAIM_UNDER_KEY("c.", "$1", "$4", "$6") ")" \
	extra_checks \
	"  RETURNING s.stripe)" \
	" INSERT INTO redpacket.claim (" RP_SQL_CLAIM_COLUMNS ")" \
	" SELECT $1, $4, $5, $6, $7, t.stripe, pg_catalog.now() FROM t" \
	" RETURNING claim_id, claimed_at"

#define CAN_PAY_13 RP_SQL_CAN_PAY_13("s.", "$3")
#define CAN_PAY_14 RP_SQL_CAN_PAY_14("s.", "$3", "$8")
#define LIMIT_CHECK \
	"     AND (SELECT pg_catalog.count(*) FROM redpacket.claim c" \
	"           WHERE c.activity_id OPERATOR(pg_catalog.=) $1" \
	"             AND c.user_id OPERATOR(pg_catalog.=) $4) OPERATOR(pg_catalog.<) $9"
#define ELIGIBLE_CHECK \
	"     AND EXISTS (SELECT 1 FROM redpacket.eligible e" \
	"                  WHERE e.activity_id OPERATOR(pg_catalog.=) $1" \
	"                    AND e.user_id OPERATOR(pg_catalog.=) $4)"

#define TAKE_ARGS \
	9, {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT8OID, INT4OID}, \
	NULL, true

/* [catalog 1.4][per-user limit][restricted] */
static RpPlan take[2][2][2] = {
	{
		{{TAKE_AND_CLAIM(CAN_PAY_13, ""), TAKE_ARGS}, {0}},
		{{TAKE_AND_CLAIM(CAN_PAY_13, LIMIT_CHECK), TAKE_ARGS}, {0}}
	},
	{
		{{TAKE_AND_CLAIM(CAN_PAY_14, ""), TAKE_ARGS},
		 {TAKE_AND_CLAIM(CAN_PAY_14, ELIGIBLE_CHECK), TAKE_ARGS}},
		{{TAKE_AND_CLAIM(CAN_PAY_14, LIMIT_CHECK), TAKE_ARGS},
		 {TAKE_AND_CLAIM(CAN_PAY_14, LIMIT_CHECK ELIGIBLE_CHECK), TAKE_ARGS}}
	}
};

/* The fast path as one SQL statement (the SPI path). */
static bool
TakeSpi(const RpActivity *act, int stripe, RpFastClaim *fc)
{
	bool		v14 = RpCatalogVersion() >= RP_CATALOG_1_4;
	RpPlan	   *plan = &take[v14][act->per_user_limit > 1][v14 && act->restricted];
	Datum		values[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', fc->request_id ? ' ' : 'n', ' ', ' ', ' ', ' '};
	bool		isnull;

	values[0] = Int64GetDatum(act->id);
	values[1] = Int32GetDatum(stripe);
	values[2] = Int64GetDatum(fc->units);
	values[3] = PointerGetDatum(fc->user_id);
	values[4] = PointerGetDatum(fc->request_id);
	values[5] = PointerGetDatum(fc->key);
	values[6] = NumericGetDatum(fc->amount);
	values[7] = Int64GetDatum(act->revision);
	values[8] = Int32GetDatum(act->per_user_limit);
	if (RpExec(plan, values, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not claim from stripe %d", stripe);
	ereport(DEBUG1, (errmsg_internal("redpacket: claim took the SPI path (%s)",
									 SPI_processed > 0 ? "paid" : "diverted")));
	if (SPI_processed == 0)
		return false;
	fc->claim_id = RpGetInt64(0, 1, 0);
	fc->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 2, &isnull));
	return true;
}

/*
 * The backend: on a Citus cluster restricted activities take the careful
 * path (the shard statements know no eligibility list), and so do lucky
 * draws where the direct backend does not apply (the statements take a
 * fixed amount).  Otherwise the
 * direct backend, on this node's tables or the activity's shards; when it
 * does not apply, the shard statements on Citus, else the SPI statement.
 */
bool
RpFastTake(const RpActivity *act, int stripe, RpFastClaim *fc)
{
	bool		distributed = RpDistributed();

	if (distributed && act->restricted)
		return false;
	if (fc->units == 0)			/* a lucky draw: only the direct backend draws */
		return RpDirectTake(act, stripe, fc) == RP_DIRECT_TOOK;
	switch (RpDirectTake(act, stripe, fc))
	{
		case RP_DIRECT_TOOK:
			return true;
		case RP_DIRECT_DIVERT:
			return false;
		case RP_DIRECT_UNUSED:
			break;
	}
	if (distributed)
		return RpShardFastClaim(act, stripe, fc->units, fc);
	return TakeSpi(act, stripe, fc);
}
