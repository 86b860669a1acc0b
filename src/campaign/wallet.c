/*
 * wallet.c
 *		Settling claims with the wallet service that pays users (1.4).  A
 *		claim is pending until the wallet says it paid it (rp_credited) or an
 *		operator undoes it (rp_reverse); it moves once, to one row of
 *		redpacket.claim_settlement.
 *
 *		That row's primary key (activity_id, claim_id) is what decides
 *		between a credit and a reversal of the same claim racing each other:
 *		both insert it with ON CONFLICT DO NOTHING, so the second waits for
 *		the first transaction to end, then either finds its row (and reads
 *		it, in a new statement) or, if it rolled back, inserts its own.  So
 *		rp_credited takes no lock of ours, whatever the number of claims it
 *		acknowledges: PostgreSQL holds none per row for it (a speculative
 *		insertion lock lives for one row's insert).  rp_reverse gives money
 *		back to the stripes, so it holds every stripe lock of the activity,
 *		taken like rp_close_activity's (locks.c): the reconciler sees a
 *		reversal whole or not at all, and its settlement id is drawn in the
 *		order reversals of the activity commit.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "claim/claim.h"
#include "scaleout/scaleout.h"
#include "campaign.h"

PG_FUNCTION_INFO_V1(rp_credited);
PG_FUNCTION_INFO_V1(rp_reverse);

/* ---- rp_credited ------------------------------------------------------- */

/*
 * One index probe per listed claim, from a generic plan: "= ANY ($2)" on a
 * generic plan compares every claim of the activity with every element
 * (seconds for 10,000), and a per-call plan spends longer planning the
 * array than running.  Rows go in in claim order, so that two credits of
 * overlapping lists wait for each other's rows in the same order (never a
 * deadlock).
 */
static RpPlan insert_credits = {
	"INSERT INTO redpacket.claim_settlement (activity_id, claim_id, state, amount, reference)"
	" SELECT c.activity_id, c.claim_id, 'credited', c.amount, $3"
	"   FROM redpacket.claim c"
	"  WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"    AND c.claim_id IN (SELECT pg_catalog.unnest($2))"
	"  ORDER BY c.claim_id"
	" ON CONFLICT (activity_id, claim_id) DO NOTHING",
	3, {INT8OID, INT8ARRAYOID, TEXTOID}, NULL, true
};

/*
 * The first id of the list, in its order, that is not a credited claim of
 * the activity: unknown (column 2 false) or reversed (column 3).
 */
static RpPlan first_not_credited = {
	"SELECT x.id, c.claim_id IS NOT NULL, s.state"
	"  FROM pg_catalog.unnest($2) WITH ORDINALITY AS x(id, ord)"
	"  LEFT JOIN redpacket.claim c ON c.activity_id OPERATOR(pg_catalog.=) $1"
	"                             AND c.claim_id OPERATOR(pg_catalog.=) x.id"
	"  LEFT JOIN redpacket.claim_settlement s ON s.activity_id OPERATOR(pg_catalog.=) $1"
	"                                        AND s.claim_id OPERATOR(pg_catalog.=) x.id"
	" WHERE s.state IS NULL OR s.state OPERATOR(pg_catalog.<>) 'credited'"
	" ORDER BY x.ord LIMIT 1",
	2, {INT8OID, INT8ARRAYOID}, NULL, true
};

static int
CompareInt64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * How many different ids the list (the argument name) holds; a NULL
 * element or a list of more than one dimension is an error (as in
 * rp_claim_batch).
 */
static int
DistinctIds(ArrayType *arr, const char *name)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			distinct = 0;
	int64	   *ids;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must have one dimension", name)));
	deconstruct_array(arr, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &elems, &nulls, &n);
	ids = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] must not be NULL", name, i + 1)));
		ids[i] = DatumGetInt64(elems[i]);
	}
	qsort(ids, n, sizeof(int64), CompareInt64);
	for (int i = 0; i < n; i++)
		if (i == 0 || ids[i] != ids[i - 1])
			distinct++;
	return distinct;
}

/*
 * Some ids were not newly credited: each must be a claim credited before
 * (by an earlier call, or by one that committed while this one waited for
 * it).  The first that is not makes the whole call an error; this runs in
 * a statement of its own, so it sees the rows the insert waited for.
 */
static void
RefuseNotCredited(int64 activity, Datum *values)
{
	int64		id;
	bool		isnull;
	bool		known;
	Datum		state;

	if (RpExecOn(&first_not_credited, RpDistributed(), values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the settlements of activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		return;
	id = RpGetInt64(0, 1, 0);
	known = DatumGetBool(RpGetDatum(0, 2, &isnull));
	state = RpGetDatum(0, 3, &isnull);
	if (!known || isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("claim " INT64_FORMAT " of activity " INT64_FORMAT " does not exist",
						id, activity),
				 errdetail("Nothing was credited by this call."),
				 errhint("Acknowledge only claims read from this database, of the activity given; an unknown claim means the wallet and the books disagree.")));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("claim " INT64_FORMAT " of activity " INT64_FORMAT " was %s",
					id, activity, TextDatumGetCString(state)),
			 errdetail("Its amount went back to the activity or its funder, so the wallet must not pay it. Nothing was credited by this call."),
			 errhint("Leave it out and acknowledge the others again; if the wallet paid it, take the payment back.")));
}

/*
 * The arguments of an acknowledgement, (activity, ids, reference), checked
 * and as the statements take them in values[3] and nulls[3], inside
 * SPI_connect with the activity known here; returns how many different ids
 * the list holds (ids_name names the list in errors).
 */
int
RpAcknowledgement(FunctionCallInfo fcinfo, const char *ids_name, Datum *values, char *nulls)
{
	int64		activity;
	int			n;
	RpActivity	act;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), ids_name);
	activity = PG_GETARG_INT64(0);
	n = DistinctIds(PG_GETARG_ARRAYTYPE_P(1), ids_name);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(activity);
	(void) RpFetchActivity(activity, &act, false);
	values[0] = Int64GetDatum(activity);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[0] = nulls[1] = ' ';
	nulls[2] = PG_ARGISNULL(2) ? 'n' : ' ';
	return n;
}

/*
 * rp_credited(activity, claim_ids, reference): the wallet paid these claims.
 * Returns how many were newly credited; all or nothing.
 */
Datum
rp_credited(PG_FUNCTION_ARGS)
{
	Datum		values[3];
	char		nulls[3];
	int			n = RpAcknowledgement(fcinfo, "claim_ids", values, nulls);
	int64		activity = DatumGetInt64(values[0]);
	int64		credited = 0;

	if (n > 0)
	{
		RpSettlementBegun(activity);
		if (RpExecOn(&insert_credits, RpDistributed(), values, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not credit claims of activity " INT64_FORMAT, activity);
		credited = (int64) SPI_processed;
		if (credited < n)
			RefuseNotCredited(activity, values);
	}
	SPI_finish();
	PG_RETURN_INT64(credited);
}

/* ---- rp_reverse -------------------------------------------------------- */

typedef enum ClaimState
{
	CLAIM_PENDING,
	CLAIM_UNTRACKED,			/* made before settlement tracking */
	CLAIM_CREDITED,
	CLAIM_REVERSED
} ClaimState;

/* A claim of the activity, as a reversal needs it. */
typedef struct ClaimToReverse
{
	int64		claim_id;
	Numeric		amount;
	int64		units;
	int			stripe;
	ClaimState	state;
} ClaimToReverse;

#define RP_READ_CLAIM(UNTRACKED) \
	"SELECT c.amount, c.stripe, s.state, " UNTRACKED \
	"  FROM redpacket.claim c" \
	"  LEFT JOIN redpacket.claim_settlement s" \
	"    ON s.activity_id OPERATOR(pg_catalog.=) c.activity_id" \
	"   AND s.claim_id OPERATOR(pg_catalog.=) c.claim_id" \
	" WHERE c.activity_id OPERATOR(pg_catalog.=) $1 AND c.claim_id OPERATOR(pg_catalog.=) $2"

/*
 * [catalog: 1.4, 1.6] Once tracked a claim stays tracked (rp_track_claims
 * only removes starts), so a claim read as tracked is tracked for good; a
 * snapshot from before the update that recorded the start is refused with
 * the catalog (RpCatalogVersion).
 */
static RpPlan read_claim[2] = {
	{RP_READ_CLAIM("false"), 2, {INT8OID, INT8OID}},
	{RP_READ_CLAIM("c.claim_id OPERATOR(pg_catalog.<=) " RP_UNTRACKED_THROUGH("$1")),
	 2, {INT8OID, INT8OID}}
};

/*
 * Under REPEATABLE READ the row lock fails with 40001 when a close or an
 * expiry settlement committed after the caller's snapshot (which the
 * stripes alone need not show: a closed activity's stripe that was already
 * empty is not updated by the close).
 */
static RpPlan lock_activity = {
	"SELECT a.closed_at IS NOT NULL FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
	1, {INT8OID}
};

static RpPlan insert_reversal = {
	"INSERT INTO redpacket.claim_settlement (activity_id, claim_id, state, amount, reason)"
	" VALUES ($1, $2, 'reversed', $3, $4)"
	" ON CONFLICT (activity_id, claim_id) DO NOTHING"
	" RETURNING settlement_id",
	4, {INT8OID, INT8OID, NUMERICOID, TEXTOID}
};

/*
 * Open activity: the paying stripe gets the money and the packet back, as
 * undealt budget (balance and packets only, never dealt: a lucky draw's
 * next draws spread it, and its last packet still takes what is left).
 */
static RpPlan give_back = {
	"UPDATE redpacket.stripe"
	"   SET balance = balance OPERATOR(pg_catalog.+) $3,"
	"       packets = packets OPERATOR(pg_catalog.+) 1,"
	"       claims = claims OPERATOR(pg_catalog.-) 1::pg_catalog.int8"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND stripe OPERATOR(pg_catalog.=) $2",
	3, {INT8OID, INT4OID, INT8OID}
};

/* Settled activity: the money goes to the funder, the stripes stay empty. */
static RpPlan uncount_claim = {
	"UPDATE redpacket.stripe"
	"   SET claims = claims OPERATOR(pg_catalog.-) 1::pg_catalog.int8"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND stripe OPERATOR(pg_catalog.=) $2",
	2, {INT8OID, INT4OID}
};

static void
ReadClaim(const RpActivity *act, int64 claim_id, ClaimToReverse *c)
{
	Datum		values[2] = {Int64GetDatum(act->id), Int64GetDatum(claim_id)};
	bool		isnull;
	Datum		state;

	if (RpExec(&read_claim[RpCatalogVersion() >= RP_CATALOG_1_6], values, NULL, false, 1)
		!= SPI_OK_SELECT)
		elog(ERROR, "could not read claim " INT64_FORMAT, claim_id);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("claim " INT64_FORMAT " of activity " INT64_FORMAT " does not exist",
						claim_id, act->id)));
	c->claim_id = claim_id;
	c->amount = DatumGetNumericCopy(RpGetDatum(0, 1, &isnull));
	c->units = RpAmountToUnits(c->amount, act->scale, "amount");
	c->stripe = DatumGetInt32(RpGetDatum(0, 2, &isnull));
	state = RpGetDatum(0, 3, &isnull);
	if (isnull)
		c->state = DatumGetBool(RpGetDatum(0, 4, &isnull)) ? CLAIM_UNTRACKED : CLAIM_PENDING;
	else
		c->state = strcmp(TextDatumGetCString(state), "credited") == 0
			? CLAIM_CREDITED : CLAIM_REVERSED;
}

static void
RefuseCredited(int64 activity, int64 claim_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("claim " INT64_FORMAT " of activity " INT64_FORMAT " was credited",
					claim_id, activity),
			 errdetail("The wallet paid it; a credited claim cannot be reversed."),
			 errhint("Take the payment back through the wallet.")));
}

/*
 * The wallet of before settlement tracking may have paid the claim, and
 * nothing says whether it did: giving its amount back could pay it twice.
 */
static void
RefuseUntracked(int64 activity, int64 claim_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("claim " INT64_FORMAT " of activity " INT64_FORMAT " was made before settlement tracking",
					claim_id, activity),
			 errdetail("The wallet of that time may have paid it, so giving its amount back could pay it twice."),
			 errhint("If that wallet did not pay it, bring it in with redpacket.rp_track_claims first.")));
}

/* Insert the reversal; false when a settlement of the claim exists. */
static bool
InsertReversal(const RpActivity *act, const ClaimToReverse *c, text *reason)
{
	Datum		values[4];

	values[0] = Int64GetDatum(act->id);
	values[1] = Int64GetDatum(c->claim_id);
	values[2] = NumericGetDatum(c->amount);
	values[3] = PointerGetDatum(reason);
	if (RpExec(&insert_reversal, values, NULL, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not record the reversal of claim " INT64_FORMAT, c->claim_id);
	return SPI_processed == 1;
}

/* Put the claim's money back where it came from; returns the JSON "after". */
static char *
GiveBack(const RpActivity *act, const ClaimToReverse *c, bool settled, text *reason)
{
	Datum		values[3];
	int64		entry;
	char	   *amount = DatumGetCString(DirectFunctionCall1(numeric_out,
															 NumericGetDatum(c->amount)));

	values[0] = Int64GetDatum(act->id);
	values[1] = Int32GetDatum(c->stripe);
	values[2] = Int64GetDatum(c->units);
	if (RpExec(settled ? &uncount_claim : &give_back, values, NULL, false, 0) != SPI_OK_UPDATE
		|| SPI_processed != 1)
		elog(ERROR, "stripe %d of activity " INT64_FORMAT " is missing", c->stripe, act->id);
	if (!settled)
		return psprintf("{\"claim_id\": " INT64_FORMAT ", \"state\": \"reversed\", \"amount\": %s,"
						" \"returned_to\": \"budget\", \"stripe\": %d}",
						c->claim_id, amount, c->stripe);

	entry = RpInsertLedger(act->id, "refund", c->units, act->scale, 0, text_to_cstring(reason));
	return psprintf("{\"claim_id\": " INT64_FORMAT ", \"state\": \"reversed\", \"amount\": %s,"
					" \"returned_to\": \"funder\", \"entry_id\": " INT64_FORMAT "}",
					c->claim_id, amount, entry);
}

/*
 * The claim is pending as far as the caller saw: record its reversal,
 * unless a settlement of it committed meanwhile, then, holding the activity
 * as a walker does, give its money back.  The row comes first: a wallet's
 * credit of the claim still in flight holds it up, and it waits for that
 * holding nothing of the activity, so claims go on meanwhile.  Returns the
 * units reversed (0 when another reversal won).
 */
static int64
ReverseLocked(const RpActivity *act, ClaimToReverse *c, text *reason)
{
	Datum		id = Int64GetDatum(act->id);
	bool		isnull;
	bool		settled;

	if (!InsertReversal(act, c, reason))
	{
		/* a credit or a reversal of the claim committed while we waited */
		ReadClaim(act, c->claim_id, c);
		if (c->state == CLAIM_CREDITED)
			RefuseCredited(act->id, c->claim_id);
		return 0;
	}
	RpWalk(act);
	RpCheckStripeRows(act);
	if (RpExec(&lock_activity, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "activity " INT64_FORMAT " disappeared", act->id);
	settled = DatumGetBool(RpGetDatum(0, 1, &isnull));
	RpRecordChange(act->id, "reverse",
				   psprintf("{\"claim_id\": " INT64_FORMAT ", \"state\": \"claimed\"}",
							c->claim_id),
				   GiveBack(act, c, settled, reason), text_to_cstring(reason));
	return c->units;
}

/*
 * rp_reverse(activity, claim_id, reason): undo a claim that was not
 * credited.  Returns its amount, or 0 when it was reversed already.
 */
Datum
rp_reverse(PG_FUNCTION_ARGS)
{
	int64		activity;
	text	   *reason;
	RpActivity	act;
	ClaimToReverse c;
	int64		reversed = 0;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "claim_id");
	RpNoNull(PG_ARGISNULL(2), "reason");
	activity = PG_GETARG_INT64(0);
	reason = PG_GETARG_TEXT_PP(2);
	if (VARSIZE_ANY_EXHDR(reason) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reason must not be empty"),
				 errhint("Say why the claim is undone, for the wallet and the auditors.")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(activity);
	(void) RpFetchActivity(activity, &act, false);
	/* a retry of a reversal, or a credited claim, needs no stripe lock */
	ReadClaim(&act, PG_GETARG_INT64(1), &c);
	if (c.state == CLAIM_CREDITED)
		RefuseCredited(activity, c.claim_id);
	if (c.state == CLAIM_UNTRACKED)
		RefuseUntracked(activity, c.claim_id);
	if (c.state == CLAIM_PENDING)
		reversed = ReverseLocked(&act, &c, reason);
	SPI_finish();
	PG_RETURN_NUMERIC(RpUnitsToAmount(reversed, act.scale));
}
