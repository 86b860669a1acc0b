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
#include "common/hashfn.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

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

/* 1.6: and the split, the funder and the request id ($10-$12) */
static RpPlan insert_activity_16 = {
	"INSERT INTO redpacket.activity"
	"       (name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at, restricted,"
	"        split, funder, request_id)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
	12, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID, TEXTOID, TEXTOID, TEXTOID}
};

/*
 * 1.6: the entry names the activity's funder, read first (an INSERT ...
 * SELECT would be pushed down whole to a Citus worker, which would fill
 * created_at with its own clock, not the coordinator's).
 */
static RpPlan insert_ledger_16 = {
	"INSERT INTO redpacket.ledger (activity_id, kind, amount, reason, packets, funder)"
	" VALUES ($1, $2, $3, $4, $5, $6) RETURNING entry_id",
	6, {INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID, TEXTOID}
};

static RpPlan read_funder = {
	"SELECT a.funder FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

/* 1.4: the entry says how many packets it adds to the cap (NULL: none) */
static RpPlan insert_ledger_14 = {
	"INSERT INTO redpacket.ledger (activity_id, kind, amount, reason, packets)"
	" VALUES ($1, $2, $3, $4, $5) RETURNING entry_id",
	5, {INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID}
};

static RpPlan insert_ledger = {
	"INSERT INTO redpacket.ledger (activity_id, kind, amount, reason)"
	" VALUES ($1, $2, $3, $4) RETURNING entry_id",
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
#define RP_CREATE(ACOLS, AVALS, LCOLS, LVALS) \
	"WITH a AS (INSERT INTO redpacket.activity AS a (" ACOLS ") VALUES (" AVALS ")" \
	"           RETURNING a.id, " RP_ACTIVITY_SELECT_14 ")," \
	"     s AS (INSERT INTO redpacket.stripe (activity_id, stripe, balance, packets)" \
	"           SELECT a.id, (s.o OPERATOR(pg_catalog.-) 1)::pg_catalog.int4, s.b, s.p" \
	"             FROM a, ROWS FROM (pg_catalog.unnest($10), pg_catalog.unnest($11))" \
	"                     WITH ORDINALITY s(b, p, o))," \
	"     l AS (INSERT INTO redpacket.ledger (activity_id, kind, amount, reason, packets" LCOLS ")" \
	"           SELECT a.id, 'fund', $2, 'funded', $3" LVALS " FROM a)," \
	"     r AS (INSERT INTO redpacket.reconcile_state (activity_id) SELECT a.id FROM a)" \
	" SELECT * FROM a"
#define RP_CREATE_COLS_14 \
	"name, total, packets, scale, stripes, per_user_limit, starts_at, ends_at, restricted"

static RpPlan create_14 = {
	RP_CREATE(RP_CREATE_COLS_14, "$1, $2, $3, $4, $5, $6, $7, $8, $9", "", ""),
	11, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID, INT8ARRAYOID, INT4ARRAYOID}, NULL, true
};

/* 1.6: $12-$14 the split, the funder (on the funding entry too) and the request id */
static RpPlan create_16 = {
	RP_CREATE(RP_CREATE_COLS_14 ", split, funder, request_id",
			  "$1, $2, $3, $4, $5, $6, $7, $8, $9, $12, $13, $14", ", funder", ", $13"),
	14, {TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BOOLOID, INT8ARRAYOID, INT4ARRAYOID, TEXTOID, TEXTOID, TEXTOID}, NULL, true
};

/*
 * The same four inserts written directly (insert.c), when the tables allow:
 * what create_14 costs is mostly starting its statement and compiling the
 * tables' CHECK constraints for it.
 */
enum
{
	CA_NAME, CA_TOTAL, CA_PACKETS, CA_SCALE, CA_STRIPES, CA_PER_USER_LIMIT, CA_STARTS_AT,
	CA_ENDS_AT, CA_RESTRICTED, CA_NGIVEN_14,
	CA_SPLIT = CA_NGIVEN_14, CA_FUNDER, CA_REQUEST_ID, CA_NGIVEN
};
#define CA_READ_BACK {"id", "closed_at", "frozen_reason", "revision"}
enum
{
	CA_ID, CA_CLOSED_AT, CA_FROZEN_REASON, CA_REVISION, CA_NREAD
};
static RpInsertTarget activity_targets[2] = {
	{RP_REL_ACTIVITY, true, CA_NGIVEN_14 + CA_NREAD, CA_NGIVEN_14,
		{"name", "total", "packets", "scale", "stripes", "per_user_limit", "starts_at", "ends_at",
		"restricted", "id", "closed_at", "frozen_reason", "revision"},
		{TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		BOOLOID, INT8OID, TIMESTAMPTZOID, TEXTOID, INT8OID}},
	{RP_REL_ACTIVITY, true, CA_NGIVEN + CA_NREAD, CA_NGIVEN,
		{"name", "total", "packets", "scale", "stripes", "per_user_limit", "starts_at", "ends_at",
		"restricted", "split", "funder", "request_id", "id", "closed_at", "frozen_reason",
		"revision"},
		{TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		BOOLOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, TEXTOID, INT8OID}}
};
static RpInsertTarget stripe_target = {
	RP_REL_STRIPE, false, 4, 4,
	{"activity_id", "stripe", "balance", "packets"}, {INT8OID, INT4OID, INT8OID, INT4OID}
};
static RpInsertTarget ledger_targets[2] = {
	{RP_REL_LEDGER, false, 5, 5,
		{"activity_id", "kind", "amount", "reason", "packets"},
		{INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID}},
	{RP_REL_LEDGER, false, 6, 6,
		{"activity_id", "kind", "amount", "reason", "packets", "funder"},
		{INT8OID, TEXTOID, NUMERICOID, TEXTOID, INT4OID, TEXTOID}}
};
static RpInsertTarget state_target = {
	RP_REL_RECONCILE_STATE, false, 1, 1, {"activity_id"}, {INT8OID}
};

/* The activity's stripes, spread as RpStripeSpread spreads them. */
static void
InsertStripes(RpInserter *ins, int64 id, int64 units, int32 packets, int32 stripes, int64 unit)
{
	for (int32 g = 0; g < stripes; g++)
	{
		Datum		values[4];
		bool		isnull[4] = {false, false, false, packets == 0};

		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum(g);
		values[2] = Int64GetDatum(RpStripeBalance(units, packets, stripes, g, unit));
		values[3] = Int32GetDatum((int32) RpStripeShare(packets, stripes, g));
		RpInsertRow(ins, 1, values, isnull);
	}
}

/* The activity as written, from the row RpInsertRow returned (given columns set). */
static void
ActivityInserted(RpInserter *ins, int given, RpActivity *act)
{
	bool		isnull;
	Datum		d;

	act->id = DatumGetInt64(RpInsertedValue(ins, 0, given + CA_ID, &isnull));
	d = RpInsertedValue(ins, 0, CA_PACKETS, &isnull);
	act->packets = isnull ? 0 : DatumGetInt32(d);
	act->scale = DatumGetInt32(RpInsertedValue(ins, 0, CA_SCALE, &isnull));
	act->stripes = DatumGetInt32(RpInsertedValue(ins, 0, CA_STRIPES, &isnull));
	act->per_user_limit = DatumGetInt32(RpInsertedValue(ins, 0, CA_PER_USER_LIMIT, &isnull));
	act->starts_at = DatumGetTimestampTz(RpInsertedValue(ins, 0, CA_STARTS_AT, &isnull));
	d = RpInsertedValue(ins, 0, CA_ENDS_AT, &isnull);
	act->ends_at = isnull ? DT_NOEND : DatumGetTimestampTz(d);
	(void) RpInsertedValue(ins, 0, given + CA_CLOSED_AT, &isnull);
	act->closed = !isnull;
	(void) RpInsertedValue(ins, 0, given + CA_FROZEN_REASON, &isnull);
	act->frozen = !isnull;
	act->revision = DatumGetInt64(RpInsertedValue(ins, 0, given + CA_REVISION, &isnull));
	act->restricted = DatumGetBool(RpInsertedValue(ins, 0, CA_RESTRICTED, &isnull));
}

/*
 * A new activity's row (create_14's and create_16's parameters; v16: the
 * 1.6 ones are set), its total in minor units and the share of an equal
 * packet (0: not equal).
 */
typedef struct NewActivity
{
	Datum		values[14];
	char		nulls[14];
	bool		has_restricted;	/* 1.4 */
	bool		v16;
	int64		units;
	int64		unit;
} NewActivity;

/*
 * create_14 or create_16 written directly.  False when the tables cannot
 * be written so (nothing was written).
 */
static bool
CreateDirect(const NewActivity *na, RpActivity *act)
{
	RpInsertTarget *targets[4] = {&activity_targets[na->v16], &stripe_target,
	&ledger_targets[na->v16], &state_target};
	int			given = na->v16 ? CA_NGIVEN : CA_NGIVEN_14;
	RpInserter	ins = {0};
	Datum		values[CA_NGIVEN];
	bool		isnull[CA_NGIVEN];
	Datum		row[6];
	bool		rownull[6] = {false, false, false, false, na->nulls[2] == 'n', na->nulls[12] == 'n'};
	bool		ok = rp_direct_claims && RpInsertBegin(&ins, targets, 4);

	if (ok)
	{
		for (int c = 0; c < given; c++)
		{
			int			p = c < CA_NGIVEN_14 ? c : c + 2;	/* past $10, $11 */

			values[c] = na->values[p];
			isnull[c] = na->nulls[p] == 'n';
		}
		RpInsertRow(&ins, 0, values, isnull);
		ActivityInserted(&ins, given, act);
		/* in create_14's order: its CTEs run from the last one up */
		row[0] = Int64GetDatum(act->id);
		row[1] = CStringGetTextDatum("fund");
		row[2] = na->values[1];
		row[3] = CStringGetTextDatum("funded");
		row[4] = na->values[2];
		row[5] = na->values[12];
		RpInsertRow(&ins, 3, row, rownull);
		RpInsertRow(&ins, 2, row, rownull);
		InsertStripes(&ins, act->id, na->units, act->packets, act->stripes, na->unit);
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

/* The activity's funder (1.6), copied into the caller's context; NULL when none. */
Datum
RpActivityFunder(int64 activity, bool *isnull)
{
	Datum		id = Int64GetDatum(activity);
	Datum		d;

	if (RpExec(&read_funder, &id, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the funder of activity " INT64_FORMAT, activity);
	d = RpGetDatum(0, 1, isnull);
	return *isnull ? (Datum) 0 : SPI_datumTransfer(d, false, -1);
}

/* 1.6: an entry that gives money back is owed to the funder (refund.c) */
static RpPlan insert_owed = {
	"INSERT INTO redpacket.refund (activity_id, entry_id) VALUES ($1, $2)",
	2, {INT8OID, INT8OID}
};

/* Does an entry of this kind give money back to the funder? */
static bool
OwedBack(const char *kind)
{
	return strcmp(kind, "withdraw") == 0 || strcmp(kind, "return") == 0 ||
		strcmp(kind, "refund") == 0;
}

/*
 * A ledger entry with its funder (1.6); packets is what it adds to the
 * packet cap (0: none), recorded from 1.4 on.  From 1.6 an entry that gives
 * money back is owed to the funder until the wallet pays it (a refund
 * row).  Returns the entry's id.
 */
static int64
InsertLedger(int64 activity, const char *kind, int64 units, int scale, int32 packets,
			 const char *reason, Datum funder, bool no_funder)
{
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', packets > 0 ? ' ' : 'n', no_funder ? 'n' : ' '};
	int			version = RpCatalogVersion();
	bool		isnull;
	int64		entry;

	values[0] = Int64GetDatum(activity);
	values[1] = CStringGetTextDatum(kind);
	values[2] = NumericGetDatum(RpUnitsToAmount(units, scale));
	values[3] = CStringGetTextDatum(reason);
	values[4] = Int32GetDatum(packets);
	values[5] = funder;
	if (RpExec(version >= RP_CATALOG_1_6 ? &insert_ledger_16
			   : version >= RP_CATALOG_1_4 ? &insert_ledger_14 : &insert_ledger,
			   values, nulls, false, 0) != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not write ledger entry");
	values[1] = RpGetDatum(0, 1, &isnull);
	entry = DatumGetInt64(values[1]);
	if (version >= RP_CATALOG_1_6 && units > 0 && OwedBack(kind) &&
		RpExec(&insert_owed, values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record what ledger entry " INT64_FORMAT " owes", entry);
	return entry;
}

int64
RpInsertLedger(int64 activity, const char *kind, int64 units, int scale, int32 packets,
			   const char *reason)
{
	bool		no_funder = true;
	Datum		funder = RpCatalogVersion() >= RP_CATALOG_1_6
		? RpActivityFunder(activity, &no_funder) : (Datum) 0;

	return InsertLedger(activity, kind, units, scale, packets, reason, funder, no_funder);
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

/* The terms a split needs: packets for lucky and equal, equal shares for equal. */
static int64
SplitUnit(RpSplit split, int64 total_units, int32 packets, int scale)
{
	if ((split == RP_SPLIT_LUCKY || split == RP_SPLIT_EQUAL) && packets == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("packets must be given for the %s split", split == RP_SPLIT_LUCKY ? "lucky" : "equal"),
				 errdetail("The split is over the packets of the activity.")));
	if (split != RP_SPLIT_EQUAL)
		return 0;
	if (total_units % packets != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("total does not split into %d equal packets", packets),
				 errdetail("At scale %d the total is " INT64_FORMAT " minor units, which %d packets do not divide.",
						   scale, total_units, packets),
				 errhint("Choose a total that is a multiple of %d minor units.", packets)));
	return total_units / packets;
}

/* An optional id argument (funder, request_id): NULL, or checked as a user id is. */
static text *
IdArg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	text	   *id;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	id = PG_GETARG_TEXT_PP(argno);
	RpCheckUserId(id, what, 0);
	return id;
}

/*
 * rp_create_activity's arguments, checked, as the parameters of create_14
 * or create_16 (stripes left to the caller).
 */
static void
ReadNewActivity(FunctionCallInfo fcinfo, NewActivity *na)
{
	int			scale;
	int32		packets = 0;
	int32		stripes;
	RpSplit		split = RP_SPLIT_ANY;

	memset(na, 0, sizeof(*na));
	memset(na->nulls, ' ', sizeof(na->nulls));
	RpNoNull(PG_ARGISNULL(0), "total");
	na->v16 = PG_NARGS() > 9;
	na->has_restricted = PG_NARGS() > 8;
	if (na->has_restricted)
		RpNoNull(PG_ARGISNULL(8), "restricted");
	if (na->v16 && !PG_ARGISNULL(9))
		split = RpSplitFromName(text_to_cstring(PG_GETARG_TEXT_PP(9)));
	scale = IntArg(fcinfo, 6, "scale", RP_MIN_SCALE, RP_MAX_SCALE);
	stripes = PG_ARGISNULL(4) ? rp_default_stripes
		: IntArg(fcinfo, 4, "stripes", RP_MIN_STRIPES, RP_MAX_STRIPES);
	na->units = RpAmountToUnits(PG_GETARG_NUMERIC(0), scale, "total");
	if (!PG_ARGISNULL(1))
	{
		packets = IntArg(fcinfo, 1, "packets", 1, PG_INT32_MAX);
		if (na->units < packets)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("total is too small for %d packets", packets),
					 errdetail("Every packet gets at least one minor unit, so total must be at least %d minor units at scale %d.",
							   packets, scale)));
	}
	na->unit = SplitUnit(split, na->units, packets, scale);
	RpNoNull(PG_ARGISNULL(2), "starts_at");
	if (!PG_ARGISNULL(3) && PG_GETARG_TIMESTAMPTZ(3) <= PG_GETARG_TIMESTAMPTZ(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ends_at must be after starts_at")));

	na->values[0] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
	na->nulls[0] = PG_ARGISNULL(5) ? 'n' : ' ';
	na->values[1] = NumericGetDatum(RpUnitsToAmount(na->units, scale));
	na->values[2] = Int32GetDatum(packets);
	na->nulls[2] = packets > 0 ? ' ' : 'n';
	na->values[3] = Int32GetDatum(scale);
	na->values[4] = Int32GetDatum(RpStripesFor(!PG_ARGISNULL(4), stripes, na->units, packets));
	na->values[5] = Int32GetDatum(IntArg(fcinfo, 7, "per_user_limit", 1, PG_INT32_MAX));
	na->values[6] = PG_GETARG_DATUM(2);
	na->values[7] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	na->nulls[7] = PG_ARGISNULL(3) ? 'n' : ' ';
	na->values[8] = BoolGetDatum(na->has_restricted && PG_GETARG_BOOL(8));
	na->values[11] = CStringGetTextDatum(RpSplitName(split));
	for (int i = 0; i < 2; i++)
	{
		text	   *id = IdArg(fcinfo, 10 + i, i == 0 ? "funder" : "request_id");

		na->values[12 + i] = PointerGetDatum(id);
		na->nulls[12 + i] = id ? ' ' : 'n';
	}
}

/*
 * The activity a creation request made before: the same funder and
 * request id.  The request's lock, held to the end of the transaction,
 * makes a retry wait for the creation still in flight; read with the
 * latest snapshot, what it made is seen at every isolation level.  Terms
 * other than the ones asked now are an error (the schedule and the stripe
 * count may differ: a retry computes its now() again).  0 when none.
 */
static RpPlan find_request = {
	"SELECT a.id, a.total OPERATOR(pg_catalog.=) $3 AND a.packets IS NOT DISTINCT FROM $4"
	"       AND a.scale OPERATOR(pg_catalog.=) $5 AND a.per_user_limit OPERATOR(pg_catalog.=) $6"
	"       AND a.restricted OPERATOR(pg_catalog.=) $7 AND a.split OPERATOR(pg_catalog.=) $8"
	"  FROM redpacket.activity a"
	" WHERE a.funder IS NOT DISTINCT FROM $1 AND a.request_id OPERATOR(pg_catalog.=) $2",
	8, {TEXTOID, TEXTOID, NUMERICOID, INT4OID, INT4OID, INT4OID, BOOLOID, TEXTOID}
};

static int64
FindRequested(const NewActivity *na)
{
	bool		distributed = RpDistributed();
	Datum		values[8] = {na->values[12], na->values[13], na->values[1], na->values[2],
	na->values[3], na->values[5], na->values[8], na->values[11]};
	char		nulls[8] = {na->nulls[12], ' ', ' ', na->nulls[2], ' ', ' ', ' ', ' '};
	uint32		fh = na->nulls[12] == 'n' ? 0
		: hash_any((unsigned char *) VARDATA_ANY(DatumGetPointer(na->values[12])),
				   VARSIZE_ANY_EXHDR(DatumGetPointer(na->values[12])));
	text	   *req = (text *) DatumGetPointer(na->values[13]);
	bool		isnull;
	int64		id;

	(void) RpLock(RP_LOCK_REQUEST, (int64) fh,
				  hash_any((unsigned char *) VARDATA_ANY(req), VARSIZE_ANY_EXHDR(req)), true);
	if (SPI_execute_snapshot(RpPreparedOn(&find_request, distributed), values, nulls,
							 GetLatestSnapshot(), InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up creation request \"%s\"", text_to_cstring(req));
	if (SPI_processed == 0)
		return 0;
	id = RpGetInt64(0, 1, 0);
	if (!DatumGetBool(RpGetDatum(0, 2, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("request_id \"%s\" made activity " INT64_FORMAT " with other terms",
						text_to_cstring(req), id),
				 errdetail("A retried creation must ask for the same total, packets, scale, per_user_limit, restricted and split."),
				 errhint("Use a new request_id for a new activity.")));
	return id;
}

/* The rows of a new activity, through the direct path or SQL; returns its id. */
static int64
CreateActivity(NewActivity *na)
{
	RpActivity	act;
	int32		packets = na->nulls[2] == 'n' ? 0 : DatumGetInt32(na->values[2]);
	int32		stripes = DatumGetInt32(na->values[4]);
	int64		id;

	if (RpCatalogVersion() >= RP_CATALOG_1_4 && !RpDistributed() && na->has_restricted)
	{
		if (!CreateDirect(na, &act))
		{
			RpStripeSpread(na->units, packets, stripes, na->unit, &na->values[9], &na->values[10]);
			na->nulls[10] = packets > 0 ? ' ' : 'n';
			if (RpExec(na->v16 ? &create_16 : &create_14, na->values, na->nulls, false, 0) !=
				SPI_OK_SELECT || SPI_processed != 1)
				elog(ERROR, "could not insert activity");
			RpActivityFromRow(RpGetInt64(0, 1, 0), 2, &act);
		}
		/* the row as written: its first claims need not read it */
		RpActivityMetaRemember(&act);
		return act.id;
	}
	if (na->v16)
	{
		Datum		v[12];
		char		n[12];

		memcpy(v, na->values, sizeof(Datum) * 9);
		memcpy(n, na->nulls, 9);
		memcpy(v + 9, na->values + 11, sizeof(Datum) * 3);
		memcpy(n + 9, na->nulls + 11, 3);
		if (RpExec(&insert_activity_16, v, n, false, 1) != SPI_OK_INSERT_RETURNING)
			elog(ERROR, "could not insert activity");
	}
	else if (RpExec(na->has_restricted ? &insert_activity_14 : &insert_activity, na->values,
					na->nulls, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not insert activity");
	id = RpGetInt64(0, 1, 0);
	RpCreateStripes(id, na->units, packets, stripes, na->unit);
	InsertLedger(id, "fund", na->units, DatumGetInt32(na->values[3]), packets, "funded",
				 na->values[12], na->nulls[12] == 'n');
	{
		Datum		v = Int64GetDatum(id);

		if (RpExec(&insert_state, &v, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not insert reconciliation state");
	}
	return id;
}

Datum
rp_create_activity(PG_FUNCTION_ARGS)
{
	NewActivity na;
	int64		id = 0;

	ReadNewActivity(fcinfo, &na);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (na.nulls[13] != 'n')
		id = FindRequested(&na);
	if (id == 0)
		id = CreateActivity(&na);
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
