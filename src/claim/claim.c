/*
 * claim.c
 *		rp_claim: one claim, in the caller's transaction, with no
 *		subtransaction: the duplicate check and the statuses in their order
 *		(rules.c), the money from a stripe (fast.c, stripe.c) and the unique
 *		claim row.  A fixed claim is followed from here through RpClaimOne,
 *		ClaimFast and RpFastTake (fast.c) to the backend that writes it
 *		(direct.c, or fast.c's statement).
 *
 *		Wording, used the same way by every file of the claim engine:
 *		- stripe: one of an activity's sub-balances (a row of
 *		  redpacket.stripe, guarded by its advisory lock).
 *		- spread, sticky: where a claim starts looking for a free stripe
 *		  (per backend), and the stripe a transaction keeps using.
 *		- fast path: a claim under READ COMMITTED, checked, paid and
 *		  recorded in one attempt on one stripe (fast.h); its backends (take.h) are
 *		  the direct path (the executor's simple-relation interface,
 *		  direct.c: fixed amounts and lucky draws), the SPI path (one
 *		  prepared statement, fast.c) and the shard path (the same on a
 *		  Citus node's shard tables, shard.c), both for fixed amounts.
 *		- careful path: everything else (lucky draws the direct path cannot
 *		  take, a stripe with nothing dealt, any fast attempt that wrote
 *		  nothing, REPEATABLE READ and SERIALIZABLE): read the
 *		  activity and the user's claim, answer the statuses in order, then
 *		  take the money with the allocator (stripe.c, alloc.c).
 *		- statement: a prepared SPI statement (RpPlan, base.c); allocation:
 *		  the allocator's decision where a claim's money comes from.
 *		- dealt, undealt: money and packets of a lucky draw drawn ahead for
 *		  the whole activity and handed to a stripe, and the rest (alloc.c).
 *		- gather: holding every stripe of the activity, to decide over all
 *		  of it (rule 4 of the protocol, locks.c); a walker: anything that
 *		  takes the activity lock exclusively and then every stripe (a
 *		  gathering claim or batch, close, freeze, reversals, the
 *		  reconciler, the live changes of an activity).
 *		- kept locks: locks held past a call to the end of the transaction
 *		  (the activity lock, the stripes written, a batch's user locks and
 *		  gate slot); an earlier call is one whose transaction already
 *		  holds the activity lock, from an earlier call.
 *		- busy: the answer of a claim that would wait while
 *		  redpacket.max_waiting claims already wait (locks.c).
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "base/base.h"
#include "ops/ops.h"
#include "scaleout/scaleout.h"
#include "fast.h"
#include "locks.h"
#include "rules.h"
#include "stripe.h"

PG_FUNCTION_INFO_V1(rp_claim);
PG_FUNCTION_INFO_V1(rp_claim_v13);
PG_FUNCTION_INFO_V1(rp_claim_v14);

/*
 * The activity and the caller's claim under this idempotency key, in one
 * statement: the activity's columns first (RpActivityFromRow), then the
 * claim's at LOOKUP_CLAIM_ID .. LOOKUP_CLAIMED_AT.
 */
#define RP_LOOKUP(activity_cols) \
	"SELECT " activity_cols ", c.claim_id, c.amount, c.claimed_at" \
	"  FROM redpacket.activity a" \
	"  LEFT JOIN redpacket.claim c" \
	"    ON" RP_SQL_CLAIM_UNDER_KEY("c.", "a.id", "$2", \
	"       CASE WHEN a.per_user_limit OPERATOR(pg_catalog.=) 1 THEN '' ELSE $3 END") \
	" WHERE a.id OPERATOR(pg_catalog.=) $1"

enum
{
	LOOKUP_CLAIM_ID = RP_ACT_NCOLS + 1, LOOKUP_AMOUNT, LOOKUP_CLAIMED_AT
};

/* generic off Citus: RpPreparedOn */
static RpPlan lookup_14 = {
	RP_LOOKUP(RP_ACTIVITY_SELECT_14), 3, {INT8OID, TEXTOID, TEXTOID}, NULL, true
};
static RpPlan lookup_13 = {
	RP_LOOKUP(RP_ACTIVITY_SELECT_13), 3, {INT8OID, TEXTOID, TEXTOID}, NULL, true
};

static RpPlan count_user = {
	"SELECT pg_catalog.count(*) FROM redpacket.claim"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND user_id OPERATOR(pg_catalog.=) $2",
	2, {INT8OID, TEXTOID}, NULL, true
};

static RpPlan find_eligible = {
	"SELECT 1 FROM redpacket.eligible"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND user_id OPERATOR(pg_catalog.=) $2",
	2, {INT8OID, TEXTOID}, NULL, true
};

static RpPlan insert_claim = {
	"INSERT INTO redpacket.claim (" RP_SQL_CLAIM_COLUMNS ")"
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
 * The fast path: a fixed amount, or a lucky draw on an activity with
 * packets, on an activity that runs, under READ COMMITTED, read from the
 * backend's metadata cache.  One attempt on the
 * first stripe that can be locked decides; if it writes nothing the
 * careful path answers.  Returns RP_TAKE_OK (claimed), RP_TAKE_WAIT (every
 * stripe was busy: *wait_stripe) or RP_TAKE_DIVERT.
 */
static RpTakeResult
ClaimFast(int64 activity, RpClaimRequest *req, RpOutcome *out, int *wait_stripe)
{
	RpActivity	act;
	RpFastClaim fc;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int			start;

	if (IsolationUsesXactSnapshot() || !RpActivityMeta(activity, &act) ||
		(req->amount == NULL && act.packets == 0) ||
		!(act.per_user_limit == 1 || req->request_id != NULL) ||
		!RpActivityRunning(&act, now))
		return RP_TAKE_DIVERT;

	RpResolveRequest(req, &act);
	fc.user_id = req->user_id;
	fc.request_id = req->request_id;
	fc.key = req->key;
	fc.units = req->units;
	fc.amount = RpUnitsToAmount(req->units, act.scale);
	start = RpStartStripe(&act);
	for (int i = 0; i < act.stripes; i++)
	{
		int			s = (start + i) % act.stripes;

		if (!RpLock(RP_LOCK_STRIPE, act.id, (uint32) s, false))
			continue;
		if (!RpFastTake(&act, s, &fc))
		{
			RpUnlock(RP_LOCK_STRIPE, act.id, (uint32) s);
			return RP_TAKE_DIVERT;
		}
		RpRememberStripe(&act, s);
		out->status = RP_CLAIMED;
		out->scale = act.scale;
		out->units = fc.units;
		out->claim_id = fc.claim_id;
		out->claimed_at = fc.claimed_at;
		return RP_TAKE_OK;
	}
	*wait_stripe = start;
	return RP_TAKE_WAIT;
}

/*
 * The user's claims so far, for the per-user limit.  Under REPEATABLE READ
 * or SERIALIZABLE the count is as of the caller's snapshot; a claim under
 * another request id committed since would not conflict with ours, so look
 * with a fresh snapshot and refuse to decide on stale data.
 */
static int64
CountUserClaims(int64 activity, text *user_id)
{
	bool		distributed = RpDistributed();
	Datum		values[2] = {Int64GetDatum(activity), PointerGetDatum(user_id)};
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
 * Is the user on the restricted activity's list?  Read with the latest
 * snapshot at every isolation level: rp_allow and rp_disallow take the
 * activity's user buckets, which the claim holds (its user's), so the
 * latest committed list is the one in force for this claim.
 */
static bool
UserEligible(int64 activity, text *user_id)
{
	Datum		values[2] = {Int64GetDatum(activity), PointerGetDatum(user_id)};

	if (SPI_execute_snapshot(RpPreparedOn(&find_eligible, RpDistributed()), values, NULL,
							 GetLatestSnapshot(), InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the eligibility of user \"%s\"", text_to_cstring(user_id));
	return SPI_processed > 0;
}

typedef struct ClaimFactsArg
{
	int64		activity;
	text	   *user_id;
} ClaimFactsArg;

static bool
FactEligible(void *arg)
{
	ClaimFactsArg *a = arg;

	return UserEligible(a->activity, a->user_id);
}

static int64
FactHeld(void *arg)
{
	ClaimFactsArg *a = arg;

	return CountUserClaims(a->activity, a->user_id);
}

/*
 * The careful path, first half: read the activity and the user's claim
 * under this key, raise errors for bad input, and answer every status that
 * comes before money.  Returns true when *out is the answer.
 */
static bool
ClaimChecks(int64 activity, RpClaimRequest *req, RpActivity *act, RpOutcome *out)
{
	Datum		values[3];
	char		nulls[3] = {' ', ' ', req->request_id ? ' ' : 'n'};
	bool		isnull;
	Datum		d;
	ClaimFactsArg arg = {activity, req->user_id};
	RpClaimFacts facts = {false, FactEligible, FactHeld, &arg};
	int			status;

	values[0] = Int64GetDatum(activity);
	values[1] = PointerGetDatum(req->user_id);
	values[2] = PointerGetDatum(req->request_id);
	if (RpExecOn(RpCatalogVersion() >= RP_CATALOG_1_4 ? &lookup_14 : &lookup_13, RpDistributed(),
				 values, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("activity " INT64_FORMAT " does not exist", activity)));
	RpActivityFromRow(activity, 1, act);
	RpActivityMetaRemember(act);
	out->scale = act->scale;

	d = RpGetDatum(0, LOOKUP_CLAIM_ID, &isnull);
	facts.has_claim = !isnull;
	if (facts.has_claim)
	{
		out->claim_id = DatumGetInt64(d);
		out->units = RpAmountToUnits(DatumGetNumeric(RpGetDatum(0, LOOKUP_AMOUNT, &isnull)),
									 act->scale, "amount");
		out->claimed_at = DatumGetTimestampTz(RpGetDatum(0, LOOKUP_CLAIMED_AT, &isnull));
	}
	/*
	 * Bad input before any status: nothing is written for it.  It may run
	 * statements of its own (the split), so the lookup's row is read first.
	 */
	RpResolveRequest(req, act);
	status = RpStatusBeforeMoney(act, &facts, GetCurrentTransactionStartTimestamp());
	if (status == RP_TAKE_MONEY)
		return false;
	out->status = (RpStatus) status;
	return true;
}

/* The careful path, second half: the claim row for money already taken. */
static void
ClaimInsert(const RpActivity *act, const RpClaimRequest *req, int64 units, int stripe,
			RpOutcome *out)
{
	Datum		values[6];
	char		nulls[6] = {' ', ' ', req->request_id ? ' ' : 'n', ' ', ' ', ' '};
	bool		isnull;

	values[0] = Int64GetDatum(act->id);
	values[1] = PointerGetDatum(req->user_id);
	values[2] = PointerGetDatum(req->request_id);
	values[3] = PointerGetDatum(req->key);
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
						text_to_cstring(req->user_id), act->id),
				 errhint("Retry the transaction.")));

	out->status = RP_CLAIMED;
	out->units = units;
	out->claim_id = RpGetInt64(0, 1, 0);
	out->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 2, &isnull));
}

/*
 * One attempt at a claim, holding the user's lock (and, with all_held,
 * every stripe: the gatherer).  Bad input raises an error before anything
 * is written; every business outcome is a status.  Returns RP_TAKE_OK with
 * the answer in *out, RP_TAKE_STALE (the activity's schedule moved: try
 * again; *revision is the activity's revision it read), or, having
 * written nothing, RP_TAKE_WAIT (stripe *wait_stripe is busy) or
 * RP_TAKE_GATHER (the claim needs every stripe and *wait_stripe is busy).
 * Must be called inside SPI_connect.
 */
static RpTakeResult
ClaimAttempt(const RpCall *call, RpClaimRequest *req, bool all_held, RpOutcome *out,
			 int *wait_stripe, int64 *revision)
{
	int64		activity = call->activity;
	RpActivity	act;
	int64		units = 0;
	int			stripe = 0;
	RpTakeResult took;

	memset(out, 0, sizeof(*out));
	if (!all_held)
	{
		took = ClaimFast(activity, req, out, wait_stripe);
		if (took != RP_TAKE_DIVERT)
			return took;
	}
	if (ClaimChecks(activity, req, &act, out))
		return RP_TAKE_OK;
	ereport(DEBUG1, (errmsg_internal("redpacket: claim takes the careful path")));
	*revision = act.revision;

	took = RpTakeCareful(&act, req->units, all_held, call->earlier, &stripe, &units,
						 wait_stripe);
	switch (took)
	{
		case RP_TAKE_OK:
			ClaimInsert(&act, req, units, stripe, out);
			break;
		case RP_TAKE_EXHAUSTED:
			out->status = RP_EXHAUSTED;
			break;
		case RP_TAKE_HALTED:
			out->status = RpHaltedStatus(activity);
			break;
		case RP_TAKE_STALE:
		case RP_TAKE_WAIT:
		case RP_TAKE_GATHER:
			return took;
		case RP_TAKE_DIVERT:
		case RP_TAKE_BUSY:
			elog(ERROR, "careful claim path answered %d", (int) took);
	}
	return RP_TAKE_OK;
}

/*
 * A stripe read under its lock is at another revision than the activity,
 * read again after it: a schedule change committed meanwhile would show in
 * that second read, so the stripe row was changed outside the extension,
 * and reading again would never end.
 */
static void
StripesCorrupt(int64 activity, int64 revision)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("a stripe of activity " INT64_FORMAT " is not at the activity's revision " INT64_FORMAT,
					activity, revision),
			 errdetail("The stripe kept another revision after the activity was read again, so no change of the activity explains it: its row was changed outside redpacket."),
			 errhint("Freeze the activity and rebuild its stripes with redpacket.rp_repair_stripes.")));
}

/*
 * Gather every stripe for the next attempt, taking the user's locks again
 * after them (a call that is not earlier gives them back first: it waits
 * holding nothing of the activity).  False for busy, holding no user lock.
 */
static bool
ClaimGather(RpCall *call, const RpActivity *act, uint32 user_hash)
{
	if (!call->earlier)
		RpUnlockUser(act->id, user_hash);
	if (!RpGatherBegin(call, act))
	{
		if (call->earlier)
			RpUnlockUser(act->id, user_hash);
		return false;
	}
	if (!call->earlier)
		(void) RpLockUser(act->id, user_hash);	/* free now */
	return true;
}

/*
 * A claim that must answer busy: but a status that comes before busy in the
 * order is still answered (a retry that finds its claim gets duplicate), as
 * far as it can be known without the user's lock.
 */
static void
ClaimBusy(int64 activity, RpClaimRequest *req, RpOutcome *out)
{
	RpActivity	act;

	memset(out, 0, sizeof(*out));
	if (!ClaimChecks(activity, req, &act, out))
		out->status = RP_BUSY;
}

/*
 * The activity lock and the user's locks (rules 1 and 2 in locks.c).  A
 * call that is not earlier only tries the user's locks: when one is busy it
 * gives back A, waits holding nothing until its holders end, and starts
 * over.  False for busy, holding nothing the call took.
 */
static bool
ClaimBegin(RpCall *call, int64 activity, uint32 user_hash)
{
	RpBusyLock	busy;

	for (;;)
	{
		if (!RpCallBegin(call, activity))
			return false;
		if (call->earlier)
			return RpLockUser(activity, user_hash);
		if (RpTryUser(activity, user_hash, &busy))
			return true;
		RpCallEnd(call, false);
		if (!RpWaitHolders(&busy))
			return false;
	}
}

/*
 * A stripe the attempt found busy.  An earlier call waits for it holding
 * what it holds, and keeps it for the next attempt (*kept); one that is not
 * earlier gives back everything, waits holding nothing until the stripe's
 * holders end, and begins again.  False for busy, holding nothing the call
 * took.
 */
static bool
ClaimWaitStripe(RpCall *call, uint32 user_hash, int stripe, int *kept)
{
	RpBusyLock	busy;

	if (call->earlier)
	{
		if (!RpWaitLock(RP_LOCK_STRIPE, call->activity, (uint32) stripe, ExclusiveLock))
		{
			RpUnlockUser(call->activity, user_hash);
			return false;
		}
		*kept = stripe;
		return true;
	}
	RpUnlockUser(call->activity, user_hash);
	RpCallEnd(call, false);
	RpBusyIs(&busy, RP_LOCK_STRIPE, call->activity, (uint32) stripe, ExclusiveLock);
	return RpWaitHolders(&busy) && ClaimBegin(call, call->activity, user_hash);
}

/*
 * One claim, in as many attempts as it takes, by the protocol in locks.c:
 * the activity lock, the user's locks, then attempts.  An attempt that
 * finds a stripe busy has written nothing; the claim then waits for that
 * stripe (ClaimWaitStripe) and tries again.  An attempt that needs every
 * stripe gathers them (ClaimGather).  A wait refused for busy ends the
 * claim with that answer, having given back what the call took.
 */
void
RpClaimOne(int64 activity, RpClaimRequest *req, RpOutcome *out)
{
	int			wait_stripe;
	int			kept = -1;		/* stripe waited for and kept for the next attempt */
	RpActivity	gather;			/* .id != 0 while gathering */
	RpTakeResult took;
	RpCall		call;
	bool		user_held;
	int64		revision = -1;
	int64		stale_at = -1;	/* the revision an attempt found stale */

	RpCheckRequest(req);
	RpRequireLocalActivity(activity);	/* on Citus: our locks only work here */
	req->user_hash = RpUserHash(req->user_id);
	gather.id = 0;

	user_held = ClaimBegin(&call, activity, req->user_hash);
	while (user_held)
	{
		took = ClaimAttempt(&call, req, gather.id != 0, out, &wait_stripe, &revision);

		/* the attempt took its own lock on any stripe it wrote */
		if (kept >= 0)
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
		kept = -1;
		if (gather.id != 0)
			RpGatherEnd(&call, &gather);
		gather.id = 0;
		if (took == RP_TAKE_OK)
			break;
		if (took == RP_TAKE_STALE)
		{
			/* two stale attempts in a row at one revision: nothing moved */
			if (revision == stale_at)
				StripesCorrupt(activity, revision);
			stale_at = revision;
			continue;			/* read the activity again */
		}
		stale_at = -1;
		RpStatsCount(activity, RP_STAT_WAIT);
		if (took == RP_TAKE_GATHER && RpActivityMeta(activity, &gather))
			user_held = ClaimGather(&call, &gather, req->user_hash);
		else
			user_held = ClaimWaitStripe(&call, req->user_hash, wait_stripe, &kept);
		if (!user_held)
			gather.id = 0;
	}
	if (!user_held)
		ClaimBusy(activity, req, out);
	RpCallEnd(&call, user_held);
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
	RpClaimRequest req = {0};
	RpOutcome	out;
	Datum		values[4];
	bool		nulls[4];
	bool		busy_outer;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "user_id");
	/* a claim writes: on a standby or in a read-only transaction, say so first */
	PreventCommandIfReadOnly("rp_claim()");

	if (tupdesc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = tupdesc;
	}

	req.user_id = PG_GETARG_TEXT_PP(1);
	req.amount = PG_ARGISNULL(2) ? NULL : PG_GETARG_NUMERIC(2);
	req.request_id = PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3);

	busy_outer = RpBusyScope(false);
	PG_TRY();
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		(void) RpBusyScope(RpCatalogVersion() >= RP_CATALOG_1_4);
		RpClaimOne(PG_GETARG_INT64(0), &req, &out);
		SPI_finish();
	}
	PG_CATCH();
	{
		(void) RpBusyScope(busy_outer);
		RpStatsCountFailure(PG_GETARG_INT64(0));
		PG_RE_THROW();
	}
	PG_END_TRY();
	(void) RpBusyScope(busy_outer);

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
