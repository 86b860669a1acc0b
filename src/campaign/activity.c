/*
 * activity.c
 *		The life of an activity: creation (validation, the stripes and the
 *		funding entry in the ledger), freeze and unfreeze, and settlement, which
 *		returns the unclaimed remainder to the funder exactly once, whether an
 *		operator closes the activity or the reconciliation pass finds it
 *		expired.  Anything that changes what claims may do takes every stripe
 *		lock first, so it waits for claims in flight and they see it after.
 *		From 1.4 each such change is also a row of redpacket.activity_change
 *		(RpRecordChange), with the fields it changed before and after
 *		(RpActivityState).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "claim/claim.h"
#include "reconcile/reconcile.h"
#include "scaleout/scaleout.h"
#include "campaign.h"

PG_FUNCTION_INFO_V1(rp_create_activity);
PG_FUNCTION_INFO_V1(rp_close_activity);
PG_FUNCTION_INFO_V1(rp_freeze);
PG_FUNCTION_INFO_V1(rp_unfreeze);

static RpPlan insert_activity = {
	"INSERT INTO redpacket.activity"
	"       (name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
	8, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static RpPlan insert_activity_14 = {
	"INSERT INTO redpacket.activity"
	"       (name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at, restricted)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
	9, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID}
};

/* 1.4: the entry says how many packets it adds to the cap (NULL: none) */
static RpPlan insert_ledger_14 = {
	"INSERT INTO redpacket.ledger (activity_id, kind, amount, reason, packets)"
	" VALUES ($1, $2, $3, $4, $5)",
	5, {INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID}
};

static RpPlan insert_ledger = {
	"INSERT INTO redpacket.ledger (activity_id, kind, amount, reason)"
	" VALUES ($1, $2, $3, $4)",
	4, {INT8OID, TEXTOID, NUMERICOID, TEXTOID}
};

/*
 * What an operator's change can touch, today's values: the schedule, the
 * holds, the funded total (the ledger's fund + top_up - withdraw) and the
 * packet cap (activity.packets + the packets of the top-ups), what the
 * stripes hold and what went back to the funder; only the keys $2 (1.4).
 */
static RpPlan activity_state = {
	"SELECT pg_catalog.jsonb_object_agg(j.key, j.value)::pg_catalog.text"
	"  FROM redpacket.activity a"
	" CROSS JOIN LATERAL (SELECT"
	"       COALESCE(pg_catalog.sum(l.amount) FILTER (WHERE l.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}')), 0)"
	"         OPERATOR(pg_catalog.-)"
	"       COALESCE(pg_catalog.sum(l.amount) FILTER (WHERE l.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded,"
	"       COALESCE(pg_catalog.sum(l.amount) FILTER (WHERE l.kind OPERATOR(pg_catalog.=) ANY ('{return,refund}')), 0)"
	"         AS returned,"
	"       COALESCE(pg_catalog.sum(l.packets) FILTER (WHERE l.kind OPERATOR(pg_catalog.=) 'top_up'), 0) AS added"
	"       FROM redpacket.ledger l WHERE l.activity_id OPERATOR(pg_catalog.=) a.id) l"
	" CROSS JOIN LATERAL (SELECT pg_catalog.sum(s.balance) AS balance, pg_catalog.sum(s.packets) AS packets"
	"       FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) a.id) s"
	" CROSS JOIN LATERAL pg_catalog.jsonb_each(pg_catalog.jsonb_build_object("
	"       'starts_at', a.starts_at, 'ends_at', a.ends_at,"
	"       'frozen_reason', a.frozen_reason, 'closed_at', a.closed_at,"
	"       'funded', l.funded, 'packets', a.packets OPERATOR(pg_catalog.+) l.added,"
	"       'remaining', pg_catalog.round(s.balance OPERATOR(pg_catalog./)"
	"                    pg_catalog.power(10::pg_catalog.numeric, a.scale::pg_catalog.numeric), a.scale),"
	"       'remaining_packets', s.packets, 'returned', l.returned)) j"
	" WHERE a.id OPERATOR(pg_catalog.=) $1 AND j.key OPERATOR(pg_catalog.=) ANY ($2)",
	2, {INT8OID, TEXTARRAYOID}
};

/* What a settlement changes, for its activity_change row. */
#define RP_SETTLE_FIELDS "closed_at,remaining,remaining_packets,returned"

static RpPlan insert_state = {
	"INSERT INTO redpacket.reconcile_state (activity_id) VALUES ($1)",
	1, {INT8OID}
};

/*
 * A 1.4 activity on a single node in one statement: the activity, its
 * stripes (the budget and packets spread evenly, the first stripes taking
 * the remainders, nothing dealt), its funding and its reconciliation state.
 * $1-$9 as insert_activity_14, $10 and $11 the stripes' balances and packets
 * (RpStripeSpread); it returns the
 * id and the activity's columns as written (RP_ACTIVITY_SELECT_14).  One
 * statement instead of four made creation about a third cheaper; on Citus
 * the four run one by one (each routed by activity).
 */
static RpPlan create_14 = {
	"WITH a AS (INSERT INTO redpacket.activity AS a"
	"           (name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at, restricted)"
	"           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
	"           RETURNING a.id, " RP_ACTIVITY_SELECT_14 "),"
	"     s AS (INSERT INTO redpacket.stripe (activity_id, stripe, balance, packets)"
	"           SELECT a.id, (s.o OPERATOR(pg_catalog.-) 1)::pg_catalog.int4, s.b, s.p"
	"             FROM a, ROWS FROM (pg_catalog.unnest($10), pg_catalog.unnest($11))"
	"                     WITH ORDINALITY s(b, p, o)),"
	"     l AS (INSERT INTO redpacket.ledger (activity_id, kind, amount, reason, packets)"
	"           SELECT a.id, 'fund', $2, 'funded', $3 FROM a),"
	"     r AS (INSERT INTO redpacket.reconcile_state (activity_id) SELECT a.id FROM a)"
	" SELECT * FROM a",
	11, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID, INT8ARRAYOID, INT4ARRAYOID}, NULL, true
};

/*
 * The same four inserts written directly (insert.c), when the tables allow:
 * what create_14 costs is mostly starting its statement and compiling the
 * tables' CHECK constraints for it.
 */
enum
{
	CA_NAME, CA_TOTAL, CA_PACKETS, CA_SCALE, CA_STRIPES, CA_PER_USER_LIMIT, CA_STARTS_AT,
	CA_ENDS_AT, CA_RESTRICTED, CA_NGIVEN,
	CA_ID = CA_NGIVEN, CA_CLOSED_AT, CA_FROZEN_REASON, CA_REVISION, CA_NCOLS
};
static RpInsertTarget activity_target = {
	RP_REL_ACTIVITY, true, CA_NCOLS, CA_NGIVEN,
	{"name", "total", "packets", "scale", "stripes", "per_user_limit", "starts_at", "ends_at",
	"restricted", "id", "closed_at", "frozen_reason", "revision"},
	{TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID, INT8OID, TIMESTAMPTZOID, TEXTOID, INT8OID}
};
static RpInsertTarget stripe_target = {
	RP_REL_STRIPE, false, 4, 4,
	{"activity_id", "stripe", "balance", "packets"}, {INT8OID, INT4OID, INT8OID, INT4OID}
};
static RpInsertTarget ledger_target = {
	RP_REL_LEDGER, false, 5, 5,
	{"activity_id", "kind", "amount", "reason", "packets"},
	{INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID}
};
static RpInsertTarget state_target = {
	RP_REL_RECONCILE_STATE, false, 1, 1, {"activity_id"}, {INT8OID}
};

/* The activity's stripes, spread as RpStripeSpread spreads them. */
static void
InsertStripes(RpInserter *ins, int64 id, int64 units, int32 packets, int32 stripes)
{
	for (int32 g = 0; g < stripes; g++)
	{
		Datum		values[4];
		bool		isnull[4] = {false, false, false, packets == 0};

		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum(g);
		values[2] = Int64GetDatum(RpStripeShare(units, stripes, g));
		values[3] = Int32GetDatum((int32) RpStripeShare(packets, stripes, g));
		RpInsertRow(ins, 1, values, isnull);
	}
}

/* The activity as written, from the row RpInsertRow returned. */
static void
ActivityInserted(RpInserter *ins, RpActivity *act)
{
	bool		isnull;
	Datum		d;

	act->id = DatumGetInt64(RpInsertedValue(ins, 0, CA_ID, &isnull));
	d = RpInsertedValue(ins, 0, CA_PACKETS, &isnull);
	act->packets = isnull ? 0 : DatumGetInt32(d);
	act->scale = DatumGetInt32(RpInsertedValue(ins, 0, CA_SCALE, &isnull));
	act->stripes = DatumGetInt32(RpInsertedValue(ins, 0, CA_STRIPES, &isnull));
	act->per_user_limit = DatumGetInt32(RpInsertedValue(ins, 0, CA_PER_USER_LIMIT, &isnull));
	act->starts_at = DatumGetTimestampTz(RpInsertedValue(ins, 0, CA_STARTS_AT, &isnull));
	d = RpInsertedValue(ins, 0, CA_ENDS_AT, &isnull);
	act->ends_at = isnull ? DT_NOEND : DatumGetTimestampTz(d);
	(void) RpInsertedValue(ins, 0, CA_CLOSED_AT, &isnull);
	act->closed = !isnull;
	(void) RpInsertedValue(ins, 0, CA_FROZEN_REASON, &isnull);
	act->frozen = !isnull;
	act->revision = DatumGetInt64(RpInsertedValue(ins, 0, CA_REVISION, &isnull));
	act->restricted = DatumGetBool(RpInsertedValue(ins, 0, CA_RESTRICTED, &isnull));
}

/*
 * create_14 written directly: values/nulls as create_14's first nine
 * parameters, units the total in minor units.
 * False when the tables cannot be written so (nothing was written).
 */
static bool
CreateDirect(const Datum *values, const char *nulls, int64 units, RpActivity *act)
{
	RpInsertTarget *targets[4] = {&activity_target, &stripe_target, &ledger_target,
	&state_target};
	RpInserter	ins = {0};
	bool		isnull[CA_NGIVEN];
	Datum		row[5];
	bool		rownull[5] = {false, false, false, false, nulls[2] == 'n'};
	bool		ok = rp_direct_claims && RpInsertBegin(&ins, targets, 4);

	if (ok)
	{
		for (int c = 0; c < CA_NGIVEN; c++)
			isnull[c] = nulls[c] == 'n';
		RpInsertRow(&ins, 0, values, isnull);
		ActivityInserted(&ins, act);
		/* in create_14's order: its CTEs run from the last one up */
		row[0] = Int64GetDatum(act->id);
		row[1] = CStringGetTextDatum("fund");
		row[2] = values[1];
		row[3] = CStringGetTextDatum("funded");
		row[4] = values[2];
		RpInsertRow(&ins, 3, row, rownull);
		RpInsertRow(&ins, 2, row, rownull);
		InsertStripes(&ins, act->id, units, act->packets, act->stripes);
	}
	RpInsertEnd(&ins);
	ereport(DEBUG1,
			(errmsg_internal(ok ? "redpacket: activity created through the direct path"
							 : "redpacket: activity creation takes the SPI path")));
	return ok;
}

static RpPlan set_frozen = {
	"UPDATE redpacket.activity"
	"   SET frozen_reason = $2, frozen_at = CASE WHEN $2 IS NULL THEN NULL ELSE $3 END"
	" WHERE id OPERATOR(pg_catalog.=) $1",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * A ledger entry; packets is what it adds to the packet cap (0: none),
 * recorded from 1.4 on.
 */
void
RpInsertLedger(int64 activity, const char *kind, int64 units, int scale, int32 packets,
			   const char *reason)
{
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', packets > 0 ? ' ' : 'n'};
	bool		v14 = RpCatalogVersion() >= RP_CATALOG_1_4;

	values[0] = Int64GetDatum(activity);
	values[1] = CStringGetTextDatum(kind);
	values[2] = NumericGetDatum(RpUnitsToAmount(units, scale));
	values[3] = CStringGetTextDatum(reason);
	values[4] = Int32GetDatum(packets);
	if (RpExec(v14 ? &insert_ledger_14 : &insert_ledger, values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write ledger entry");
}

/* "a,b,c" as a text[] */
static ArrayType *
KeyArray(const char *keys)
{
	Datum		d[16];
	int			n = 0;

	for (const char *k = keys; *k != '\0' && n < lengthof(d);)
	{
		const char *end = strchr(k, ',');
		int			len = end ? (int) (end - k) : (int) strlen(k);

		d[n++] = PointerGetDatum(cstring_to_text_with_len(k, len));
		k += len + (end ? 1 : 0);
	}
	return construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT);
}

/*
 * The fields keys (a comma-separated list of activity_state's keys) of the
 * activity, today, as JSON text for RpRecordChange; NULL under a catalog
 * older than 1.4, which records no changes.
 */
char *
RpActivityState(int64 activity, const char *keys)
{
	Datum		values[2];
	bool		isnull;
	Datum		d;

	if (RpCatalogVersion() < RP_CATALOG_1_4)
		return NULL;
	values[0] = Int64GetDatum(activity);
	values[1] = PointerGetDatum(KeyArray(keys));
	if (RpExec(&activity_state, values, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the state of activity " INT64_FORMAT, activity);
	d = RpGetDatum(0, 1, &isnull);
	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * Return the unclaimed remainder to the funder and mark the activity
 * closed (settle.c), recorded as a close (1.4) when that changed anything.
 * The caller holds every stripe lock.  Returns the remainder in minor units
 * (0 when it was settled before).
 */
static int64
RpSettle(const RpActivity *act, const char *reason)
{
	int64		remainder;
	char	   *before;
	char	   *after;

	RpCheckStripeRows(act);
	before = RpActivityState(act->id, RP_SETTLE_FIELDS);
	RpSettleMany(&act->id, 1, GetCurrentTransactionStartTimestamp(), reason, false, &remainder);
	after = RpActivityState(act->id, RP_SETTLE_FIELDS);
	if (before != NULL && strcmp(before, after) != 0)
		RpRecordChange(act->id, "close", before, after, NULL);
	return remainder;
}

static int32
IntArg(FunctionCallInfo fcinfo, int argno, const char *what, int32 min, int32 max)
{
	int32		v;

	RpNoNull(PG_ARGISNULL(argno), what);
	v = PG_GETARG_INT32(argno);
	if (v < min || v > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between %d and %d", what, min, max),
				 errdetail("Got %d.", v)));
	return v;
}

Datum
rp_create_activity(PG_FUNCTION_ARGS)
{
	int			scale;
	int64		total_units;
	int32		packets = 0;
	int32		stripes;
	int32		per_user_limit;
	TimestampTz starts_at;
	bool		restricted = false;
	Datum		values[11];
	char		nulls[11] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int64		id;

	RpNoNull(PG_ARGISNULL(0), "total");
	if (PG_NARGS() > 8)			/* 1.4 */
	{
		RpNoNull(PG_ARGISNULL(8), "restricted");
		restricted = PG_GETARG_BOOL(8);
	}
	scale = IntArg(fcinfo, 6, "scale", RP_MIN_SCALE, RP_MAX_SCALE);
	per_user_limit = IntArg(fcinfo, 7, "per_user_limit", 1, PG_INT32_MAX);
	stripes = PG_ARGISNULL(4) ? rp_default_stripes
		: IntArg(fcinfo, 4, "stripes", RP_MIN_STRIPES, RP_MAX_STRIPES);
	total_units = RpAmountToUnits(PG_GETARG_NUMERIC(0), scale, "total");

	if (!PG_ARGISNULL(1))
	{
		packets = IntArg(fcinfo, 1, "packets", 1, PG_INT32_MAX);
		if (total_units < packets)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("total is too small for %d packets", packets),
					 errdetail("Every packet gets at least one minor unit, so total must be at least %d minor units at scale %d.",
							   packets, scale)));
	}

	RpNoNull(PG_ARGISNULL(2), "starts_at");
	starts_at = PG_GETARG_TIMESTAMPTZ(2);
	if (!PG_ARGISNULL(3) && PG_GETARG_TIMESTAMPTZ(3) <= starts_at)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ends_at must be after starts_at")));

	stripes = RpStripesFor(!PG_ARGISNULL(4), stripes, total_units, packets);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	values[0] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
	nulls[0] = PG_ARGISNULL(5) ? 'n' : ' ';
	values[1] = NumericGetDatum(RpUnitsToAmount(total_units, scale));
	values[2] = Int32GetDatum(packets);
	nulls[2] = packets > 0 ? ' ' : 'n';
	values[3] = Int32GetDatum(scale);
	values[4] = Int32GetDatum(stripes);
	values[5] = Int32GetDatum(per_user_limit);
	values[6] = TimestampTzGetDatum(starts_at);
	values[7] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[7] = PG_ARGISNULL(3) ? 'n' : ' ';
	values[8] = BoolGetDatum(restricted);
	if (PG_NARGS() > 8 && RpCatalogVersion() >= RP_CATALOG_1_4 && !RpDistributed())
	{
		RpActivity	act;

		if (!CreateDirect(values, nulls, total_units, &act))
		{
			RpStripeSpread(total_units, packets, stripes, &values[9], &values[10]);
			nulls[9] = ' ';
			nulls[10] = packets > 0 ? ' ' : 'n';
			if (RpExec(&create_14, values, nulls, false, 0) != SPI_OK_SELECT ||
				SPI_processed != 1)
				elog(ERROR, "could not insert activity");
			RpActivityFromRow(RpGetInt64(0, 1, 0), 2, &act);
		}
		id = act.id;
		/* the row as written: its first claims need not read it */
		RpActivityMetaRemember(&act);
		SPI_finish();
		PG_RETURN_INT64(id);
	}
	if (RpExec(PG_NARGS() > 8 ? &insert_activity_14 : &insert_activity, values, nulls, false,
			   1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not insert activity");
	id = RpGetInt64(0, 1, 0);

	RpCreateStripes(id, total_units, packets, stripes);
	values[0] = Int64GetDatum(id);
	RpInsertLedger(id, "fund", total_units, scale, packets, "funded");
	if (RpExec(&insert_state, values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not insert reconciliation state");

	SPI_finish();
	PG_RETURN_INT64(id);
}

Datum
rp_close_activity(PG_FUNCTION_ARGS)
{
	RpActivity	act;
	int64		remainder;

	RpNoNull(PG_ARGISNULL(0), "activity");
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(PG_GETARG_INT64(0));
	(void) RpFetchActivity(PG_GETARG_INT64(0), &act, false);
	RpWalk(&act);
	RpRefuseWrongBooks(act.id, "rp_close_activity");
	remainder = RpSettle(&act, "closed");
	SPI_finish();
	PG_RETURN_NUMERIC(RpUnitsToAmount(remainder, act.scale));
}

static void
SetFrozen(int64 activity, text *reason)
{
	RpActivity	act;
	Datum		values[3];
	char		nulls[3] = {' ', reason ? ' ' : 'n', ' '};
	char	   *before;
	char	   *after;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(activity);
	(void) RpFetchActivity(activity, &act, false);
	/* wait for claims in flight; later ones see the new state */
	RpWalk(&act);
	RpCheckStripeRows(&act);
	before = RpActivityState(activity, "frozen_reason");
	values[0] = Int64GetDatum(activity);
	values[1] = PointerGetDatum(reason);
	values[2] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	if (RpExec(&set_frozen, values, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not update activity");
	RpSyncHalt(activity);
	after = RpActivityState(activity, "frozen_reason");
	if (before != NULL && strcmp(before, after) != 0)
		RpRecordChange(activity, reason ? "freeze" : "unfreeze", before, after,
					   reason ? text_to_cstring(reason) : NULL);
	SPI_finish();
}

Datum
rp_freeze(PG_FUNCTION_ARGS)
{
	text	   *reason;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "reason");
	reason = PG_GETARG_TEXT_PP(1);
	if (VARSIZE_ANY_EXHDR(reason) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reason must not be empty"),
				 errhint("Say why the activity is held, for the operators who lift it.")));
	SetFrozen(PG_GETARG_INT64(0), reason);
	PG_RETURN_VOID();
}

Datum
rp_unfreeze(PG_FUNCTION_ARGS)
{
	RpNoNull(PG_ARGISNULL(0), "activity");
	RpUnfreezeCheck(PG_GETARG_INT64(0));	/* unfreeze.c: books that balance */
	SetFrozen(PG_GETARG_INT64(0), NULL);
	PG_RETURN_VOID();
}
