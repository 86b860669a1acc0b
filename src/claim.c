/*
 * claim.c
 *		rp_claim: one claim is the duplicate check, the
 *		status checks in the order the SPEC lists them, a stripe decrement and
 *		the unique claim insert, all in the caller's transaction with no
 *		subtransaction.  Concurrent claims by one user are serialized by a
 *		per-(activity, user) lock, so the duplicate and limit checks see every
 *		committed claim of that user.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_claim);
PG_FUNCTION_INFO_V1(rp_claim_v13);
PG_FUNCTION_INFO_V1(rp_claim_v14);

/*
 * The activity, the caller's claim under this idempotency key if any, in
 * one statement.  Columns 1-9 are the activity as RpActivityFromRow reads it.
 */
static RpPlan lookup = {
	"SELECT a.total, a.packets, a.scale, a.stripes, a.per_user_limit,"
	"       a.starts_at, a.ends_at, a.closed_at IS NOT NULL, a.frozen_reason IS NOT NULL,"
	"       c.claim_id, c.amount, c.claimed_at"
	"  FROM redpacket.activity a"
	"  LEFT JOIN redpacket.claim c"
	"    ON c.activity_id OPERATOR(pg_catalog.=) a.id AND c.user_id OPERATOR(pg_catalog.=) $2"
	"   AND c.idempotency_key OPERATOR(pg_catalog.=)"
	"       CASE WHEN a.per_user_limit OPERATOR(pg_catalog.=) 1 THEN '' ELSE $3 END"
	" WHERE a.id OPERATOR(pg_catalog.=) $1",
	3, {INT8OID, TEXTOID, TEXTOID}, NULL, true	/* generic off Citus: RpPreparedOn */
};

static RpPlan count_user = {
	"SELECT pg_catalog.count(*) FROM redpacket.claim"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND user_id OPERATOR(pg_catalog.=) $2",
	2, {INT8OID, TEXTOID}, NULL, true
};

static RpPlan insert_claim = {
	"INSERT INTO redpacket.claim"
	"       (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, pg_catalog.now())"
	" ON CONFLICT (activity_id, user_id, idempotency_key) DO NOTHING"
	" RETURNING claim_id, claimed_at",
	6, {INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT4OID}
};

/*
 * Enum value OIDs of redpacket.claim_status, looked up on first use per
 * type OID (a catalog older than 1.4 lacks the 1.4 labels, which only 1.4
 * features answer).
 */
static Oid	status_type = InvalidOid;
static Oid	status_oids[RP_NSTATUS];

Datum
RpStatusDatum(Oid enumtype, RpStatus status)
{
	if (enumtype != status_type)
	{
		memset(status_oids, 0, sizeof(status_oids));
		status_type = enumtype;
	}
	if (!OidIsValid(status_oids[status]))
	{
		Oid			oid = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
										  ObjectIdGetDatum(enumtype),
										  CStringGetDatum(RpStatName(status)));

		if (!OidIsValid(oid))
			elog(ERROR, "redpacket.claim_status has no label \"%s\"", RpStatName(status));
		status_oids[status] = oid;
	}
	return ObjectIdGetDatum(status_oids[status]);
}

/*
 * Fast path: a fixed amount on a running activity is one statement that
 * checks, decrements and inserts.  Anything else (a duplicate, a halt, the
 * user's limit, a stripe that cannot pay, a lucky draw, a time outside the
 * schedule) goes the careful way, which reports the statuses in the SPEC's
 * order.  REPEATABLE READ and SERIALIZABLE callers always go the careful
 * way, whose ON CONFLICT turns a claim committed after their snapshot into
 * a serialization failure.  Returns RP_TAKE_OK (claimed), RP_TAKE_WAIT or
 * RP_TAKE_DIVERT (go the careful way).
 */
static RpTakeResult
ClaimFast(int64 activity, text *user_id, Numeric amount, text *request_id,
		  RpOutcome *out, int *wait_stripe)
{
	RpActivity	act;
	RpFastClaim fast;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int64		units;
	int			stripe = 0;
	RpTakeResult took;

	if (amount == NULL || IsolationUsesXactSnapshot() ||
		!RpActivityMeta(activity, &act) ||
		!(act.per_user_limit == 1 || request_id != NULL) ||
		now < act.starts_at || now >= act.ends_at)
		return RP_TAKE_DIVERT;

	units = RpAmountToUnits(amount, act.scale, "amount");
	fast.user_id = user_id;
	fast.request_id = request_id;
	fast.key = act.per_user_limit == 1 ? cstring_to_text("") : request_id;
	fast.amount = RpUnitsToAmount(units, act.scale);
	took = RpTake(&act, &units, &stripe, &fast);
	if (took == RP_TAKE_OK)
	{
		out->status = RP_CLAIMED;
		out->scale = act.scale;
		out->units = units;
		out->claim_id = fast.claim_id;
		out->claimed_at = fast.claimed_at;
	}
	else if (took == RP_TAKE_WAIT)
		*wait_stripe = stripe;
	return took;
}

/*
 * The user's claims so far, for the per-user limit.  Under REPEATABLE READ
 * or SERIALIZABLE the count is as of the caller's snapshot; a claim under
 * another request id committed since would not conflict with ours, so look
 * with a fresh snapshot and refuse to decide on stale data.
 */
static int64
CountUserClaims(int64 activity, text *user_id, Datum *values)
{
	bool		distributed = RpDistributed();
	int64		held;

	if (RpExecOn(&count_user, distributed, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not count claims");
	held = RpGetInt64(0, 1, 0);
	if (IsolationUsesXactSnapshot())
	{
		if (SPI_execute_snapshot(RpPreparedOn(&count_user, distributed), values, NULL,
								 GetLatestSnapshot(), InvalidSnapshot,
								 true, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not count claims");
		if (RpGetInt64(0, 1, 0) != held)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize claim of user \"%s\" on activity " INT64_FORMAT,
							text_to_cstring(user_id), activity),
					 errdetail("The user claimed in a transaction that committed after this transaction's snapshot."),
					 errhint("Retry the transaction.")));
	}
	return held;
}

/*
 * Careful path, first half: read the activity and the user's claim under
 * this key, raise errors for bad input, and answer every status but
 * exhausted/claimed.  Returns true when *out is the answer.
 */
static bool
ClaimChecks(int64 activity, text *user_id, Numeric amount, text *request_id,
			RpActivity *act, int64 *units, RpOutcome *out)
{
	Datum		values[3];
	char		nulls[3] = {' ', ' ', request_id ? ' ' : 'n'};
	bool		isnull;
	Datum		d;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	values[0] = Int64GetDatum(activity);
	values[1] = PointerGetDatum(user_id);
	values[2] = PointerGetDatum(request_id);
	if (RpExecOn(&lookup, RpDistributed(), values, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("activity " INT64_FORMAT " does not exist", activity)));
	RpActivityFromRow(activity, act);
	out->scale = act->scale;

	/* Bad input first: nothing is written for it. */
	if (amount != NULL)
		*units = RpAmountToUnits(amount, act->scale, "amount");
	else if (act->packets == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("amount must be given for activity " INT64_FORMAT, activity),
				 errdetail("A lucky draw (amount NULL) needs an activity created with packets."),
				 errhint("Pass the amount to claim, or create the activity with packets.")));
	if (act->per_user_limit > 1 && request_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("request_id is required for activity " INT64_FORMAT, activity),
				 errdetail("The activity allows %d claims per user, so each claim is identified by its request_id.",
						   act->per_user_limit)));

	/* duplicate: the claim already held under this idempotency key */
	d = RpGetDatum(0, 10, &isnull);
	if (!isnull)
	{
		out->status = RP_DUPLICATE;
		out->claim_id = DatumGetInt64(d);
		out->units = RpAmountToUnits(DatumGetNumeric(RpGetDatum(0, 11, &isnull)),
									 act->scale, "amount");
		out->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 12, &isnull));
		return true;
	}
	if (act->frozen)
		out->status = RP_FROZEN;
	else if (now < act->starts_at)
		out->status = RP_NOT_STARTED;
	else if (act->closed || now >= act->ends_at)
		out->status = RP_ENDED;
	else if (act->per_user_limit > 1 &&
			 CountUserClaims(activity, user_id, values) >= act->per_user_limit)
		out->status = RP_USER_LIMIT;
	else
		return false;
	return true;
}

/* Careful path, second half: the claim row for money already taken. */
static void
ClaimInsert(const RpActivity *act, text *user_id, text *request_id, int64 units,
			int stripe, RpOutcome *out)
{
	Datum		values[6];
	char		nulls[6] = {' ', ' ', request_id ? ' ' : 'n', ' ', ' ', ' '};
	bool		isnull;

	values[0] = Int64GetDatum(act->id);
	values[1] = PointerGetDatum(user_id);
	values[2] = PointerGetDatum(request_id);
	values[3] = act->per_user_limit == 1 ? CStringGetTextDatum("") : PointerGetDatum(request_id);
	values[4] = NumericGetDatum(RpUnitsToAmount(units, act->scale));
	values[5] = Int32GetDatum(stripe);
	if (RpExec(&insert_claim, values, nulls, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not insert claim");

	/*
	 * The user lock makes a conflict impossible under READ COMMITTED; under
	 * REPEATABLE READ ON CONFLICT itself raises a serialization failure for
	 * a claim committed after our snapshot.  Either way the stripe decrement
	 * must not commit without its claim row.
	 */
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize claim of user \"%s\" on activity " INT64_FORMAT,
						text_to_cstring(user_id), act->id),
				 errhint("Retry the transaction.")));

	out->status = RP_CLAIMED;
	out->units = units;
	out->claim_id = RpGetInt64(0, 1, 0);
	out->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 2, &isnull));
}

/*
 * One attempt at a claim, holding the user's lock.  Bad input raises an
 * error before anything is written; every business outcome is a status.
 * Returns RP_TAKE_OK with the answer in *out, or, having written nothing,
 * RP_TAKE_WAIT (stripe *wait_stripe is busy) or RP_TAKE_GATHER (the claim
 * needs every stripe and *wait_stripe is busy).  Must be called inside
 * SPI_connect.
 */
static RpTakeResult
ClaimAttempt(int64 activity, text *user_id, Numeric amount, text *request_id,
			 RpOutcome *out, int *wait_stripe)
{
	RpActivity	act;
	int64		units = 0;
	int			stripe = 0;
	RpTakeResult took;

	memset(out, 0, sizeof(*out));
	took = ClaimFast(activity, user_id, amount, request_id, out, wait_stripe);
	if (took != RP_TAKE_DIVERT)
		return took;

	if (ClaimChecks(activity, user_id, amount, request_id, &act, &units, out))
		return RP_TAKE_OK;

	took = RpTake(&act, &units, &stripe, NULL);
	switch (took)
	{
		case RP_TAKE_OK:
			ClaimInsert(&act, user_id, request_id, units, stripe, out);
			break;
		case RP_TAKE_EXHAUSTED:
			out->status = RP_EXHAUSTED;
			break;
		case RP_TAKE_FROZEN:
			out->status = RP_FROZEN;
			break;
		case RP_TAKE_ENDED:
			out->status = RP_ENDED;
			break;
		case RP_TAKE_WAIT:
		case RP_TAKE_GATHER:
			*wait_stripe = stripe;
			return took;
		case RP_TAKE_DIVERT:
			elog(ERROR, "careful claim path diverted");
	}
	return RP_TAKE_OK;
}

/*
 * One claim, in as many attempts as it takes, by the protocol in locks.c.
 * An attempt that finds a stripe busy has written nothing; the claim then
 * waits for that stripe holding nothing it took, keeps it, and tries again,
 * taking the user's locks only if they are free.  An attempt that needs
 * every stripe makes the claim a gatherer, unless the transaction holds
 * locks of earlier claims on the activity.
 */
void
RpClaimOne(int64 activity, text *user_id, Numeric amount, text *request_id,
		   RpOutcome *out)
{
	uint32		user_hash;
	int			wait_stripe;
	int			kept = -1;		/* stripe waited for and kept for the next attempt */
	RpActivity	gather;			/* .id != 0 while gathering */
	RpTakeResult took;

	RpCheckUserId(user_id);
	RpCheckRequestId(request_id);
	RpRequireLocalActivity(activity);	/* on Citus: our locks only work here */
	user_hash = RpUserHash(user_id);
	gather.id = 0;

	for (;;)
	{
		/* Serialize this user's claims on this activity. */
		if (kept >= 0 && !RpLockUser(activity, user_hash, false))
		{
			/* never wait for the user while holding a stripe we took */
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
			kept = -1;
		}
		if (kept < 0 && gather.id == 0)
			(void) RpLockUser(activity, user_hash, true);

		took = ClaimAttempt(activity, user_id, amount, request_id, out, &wait_stripe);

		/* the attempt took its own lock on any stripe it wrote */
		if (kept >= 0)
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
		kept = -1;
		if (gather.id != 0)
			RpGatherEnd(&gather);
		gather.id = 0;
		if (took == RP_TAKE_OK)
			break;

		RpUnlockUser(activity, user_hash);
		RpStatsCount(activity, RP_STAT_WAIT);
		if (took == RP_TAKE_GATHER && !RpHeldEarlier(activity) &&
			RpActivityMeta(activity, &gather))
		{
			RpGatherBegin(&gather, user_hash);
		}
		else
		{
			gather.id = 0;
			RpWaitLock(RP_LOCK_STRIPE, activity, (uint32) wait_stripe, ExclusiveLock);
			kept = wait_stripe;
		}
	}
	RpNoteHeld(activity);
	RpStatsCount(activity, out->status);
}

/* Fill the four output columns status, claim_id, amount, claimed_at. */
void
RpOutcomeColumns(const RpOutcome *o, Oid statustype, Datum *values, bool *nulls)
{
	bool		has_claim = (o->status == RP_CLAIMED || o->status == RP_DUPLICATE);

	values[0] = RpStatusDatum(statustype, o->status);
	nulls[0] = false;
	values[1] = Int64GetDatum(o->claim_id);
	values[2] = has_claim ? NumericGetDatum(RpUnitsToAmount(o->units, o->scale)) : (Datum) 0;
	values[3] = TimestampTzGetDatum(o->claimed_at);
	nulls[1] = nulls[2] = nulls[3] = !has_claim;
}

Datum
rp_claim(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;
	RpOutcome	out;
	Datum		values[4];
	bool		nulls[4];

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "user_id");

	if (tupdesc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = tupdesc;
	}

	PG_TRY();
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		RpClaimOne(PG_GETARG_INT64(0), PG_GETARG_TEXT_PP(1),
				   PG_ARGISNULL(2) ? NULL : PG_GETARG_NUMERIC(2),
				   PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3),
				   &out);
		SPI_finish();
	}
	PG_CATCH();
	{
		RpStatsCount(PG_GETARG_INT64(0), RP_STAT_ERROR);
		PG_RE_THROW();
	}
	PG_END_TRY();

	RpOutcomeColumns(&out, TupleDescAttr(tupdesc, 0)->atttypid, values, nulls);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * rp_claim as 1.3 declares it: without SET search_path.  The path is pinned
 * here for the whole call, on entry, exactly as the SET of every other
 * catalog's definition pins it (see RpPinSearchPath).
 */
Datum
rp_claim_v13(PG_FUNCTION_ARGS)
{
	int			level = RpPinSearchPath();
	Datum		result = rp_claim(fcinfo);

	RpUnpinSearchPath(level);
	return result;
}

/* rp_claim as 1.4 declares it (a symbol a library older than 1.4 lacks). */
Datum
rp_claim_v14(PG_FUNCTION_ARGS)
{
	return rp_claim(fcinfo);
}
