/*
 * stripe.c
 *		Taking one claim's money from an activity's stripes (sub-balances).
 *		A claim first tries stripes one by one with a non-blocking lock,
 *		starting from a per-backend spread so that concurrent claimers land
 *		on different rows, and asks to wait only when every stripe it tried
 *		was busy.  When the stripes it tried cannot pay, it locks every stripe
 *		and lets the allocator (alloc.c) decide over the whole activity: an
 *		activity is exhausted only when all its stripes together cannot pay.
 *		The waiting itself is the caller's (claim.c, locks.c).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "storage/proc.h"

#include "redpacket.h"

/* Failed fast-path attempts before a claim gathers across all stripes. */
#define RP_FAST_PROBES 4

/*
 * Every take refuses a halted stripe (its activity is frozen or closed), so
 * that a claim that read the activity before a freeze or close committed
 * still sees it once it holds its stripe: freeze and close take every stripe
 * lock and mark every stripe.
 */
static RpPlan take_fixed = {
	"UPDATE redpacket.stripe" RP_SQL_TAKE_FIXED,
	3, {INT8OID, INT4OID, INT8OID}
};

/*
 * The fast path: the duplicate, halt and per-user-limit checks, the
 * conditional decrement and the claim insert in one statement; it returns
 * the new claim, or no row when any check failed or the stripe cannot pay
 * (then nothing was written).  The caller holds the user's lock and the
 * stripe's and runs under READ COMMITTED, so the duplicate check sees every
 * committed claim under this key and the insert cannot conflict.
 */
#define TAKE_AND_CLAIM(limit_check) \
	"WITH t AS (" \
	"  UPDATE redpacket.stripe s" \
	"     SET balance = s.balance OPERATOR(pg_catalog.-) $3," \
	"         packets = s.packets OPERATOR(pg_catalog.-) 1," \
	"         claims = s.claims OPERATOR(pg_catalog.+) 1::pg_catalog.int8" \
	"   WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.stripe OPERATOR(pg_catalog.=) $2" \
	"     AND s.balance OPERATOR(pg_catalog.>=) $3" \
	"     AND (s.packets IS NULL OR s.packets OPERATOR(pg_catalog.>) 0) AND NOT s.halted" \
	"     AND NOT EXISTS (SELECT 1 FROM redpacket.claim c" \
	"                      WHERE c.activity_id OPERATOR(pg_catalog.=) $1" \
	"                        AND c.user_id OPERATOR(pg_catalog.=) $4" \
	"                        AND c.idempotency_key OPERATOR(pg_catalog.=) $6)" \
	limit_check \
	"  RETURNING s.stripe)" \
	" INSERT INTO redpacket.claim" \
	"        (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)" \
	" SELECT $1, $4, $5, $6, $7, t.stripe, pg_catalog.now() FROM t" \
	" RETURNING claim_id, claimed_at"

/*
 * Generic plans: a custom plan for an activity newer than claim's statistics
 * checked the user's claims by scanning claim_pkey on activity_id alone,
 * every claim of the activity per claim.  These run only off Citus (TryFast).
 */

/* one claim per user: the duplicate check is the limit check */
static RpPlan take_and_claim = {
	TAKE_AND_CLAIM(""),
	8, {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT4OID},
	NULL, true
};

static RpPlan take_and_claim_limited = {
	TAKE_AND_CLAIM("     AND (SELECT pg_catalog.count(*) FROM redpacket.claim c"
				   "           WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
				   "             AND c.user_id OPERATOR(pg_catalog.=) $4)"
				   "         OPERATOR(pg_catalog.<) $8"),
	8, {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT4OID},
	NULL, true
};

static RpPlan read_stripe = {
	"SELECT s.balance, s.packets FROM redpacket.stripe s"
	" WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.stripe OPERATOR(pg_catalog.=) $2"
	"   AND NOT s.halted",
	2, {INT8OID, INT4OID}
};

static RpPlan read_all = {
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0)"
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1"
	" ORDER BY s.stripe",
	1, {INT8OID}
};

static RpPlan read_halt = {
	"SELECT a.frozen_reason IS NOT NULL, a.closed_at IS NOT NULL"
	"  FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

static RpPlan debit = {
	"UPDATE redpacket.stripe"
	"   SET balance = balance OPERATOR(pg_catalog.-) $3,"
	"       packets = packets OPERATOR(pg_catalog.-) $4,"
	"       claims = claims OPERATOR(pg_catalog.+) $5"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND stripe OPERATOR(pg_catalog.=) $2",
	5, {INT8OID, INT4OID, INT8OID, INT4OID, INT8OID}
};

/* Per-backend state: where the next claim starts, and the draw generator. */
static uint32 spread_counter = 0;
static LocalTransactionId sticky_lxid = InvalidLocalTransactionId;
static int64 sticky_activity = 0;
static int	sticky_stripe = 0;
static pg_prng_state draw_prng;
static bool draw_prng_seeded = false;

/*
 * Where a claim starts probing.  Inside one transaction a backend keeps
 * using the stripe it already holds, so a transaction making many claims
 * pins one stripe instead of all of them.
 */
int
RpStartStripe(const RpActivity *act)
{
	if (sticky_lxid == RpMyLocalXid && sticky_activity == act->id)
		return sticky_stripe % act->stripes;
	return (int) (((uint32) RpMyProcNumber * 7u + spread_counter++) % (uint32) act->stripes);
}

void
RpRememberStripe(const RpActivity *act, int stripe)
{
	sticky_lxid = RpMyLocalXid;
	sticky_activity = act->id;
	sticky_stripe = stripe;
}

/*
 * The double-mean draw in minor units: uniform in [1, max] where max is
 * twice the mean remaining per packet, capped so that every other packet
 * can still get one unit; the last packet takes the exact remainder.  A
 * fixed-amount claim on the same activity may have left fewer units than
 * packets in the stripe; then each draw gets one unit until it is empty,
 * never more than the stripe holds.  Requires balance >= 1, packets >= 1.
 */
int64
RpDrawUnits(int64 balance, int64 packets)
{
	int64		max;

	Assert(packets >= 1 && balance >= 1);
	if (packets == 1)
		return balance;

	if (!draw_prng_seeded)
	{
		if (!pg_prng_strong_seed(&draw_prng))
			pg_prng_seed(&draw_prng, (uint64) MyProcPid ^ (uint64) GetCurrentTimestamp());
		draw_prng_seeded = true;
	}

	/* 2 * balance / packets without overflowing */
	max = (balance / packets) * 2 + ((balance % packets) * 2) / packets;
	if (max > balance - (packets - 1))
		max = balance - (packets - 1);
	if (max < 1)
		max = 1;
	return (int64) pg_prng_uint64_range(&draw_prng, 1, (uint64) max);
}

static void
Debit(const RpActivity *act, int stripe, int64 units, int32 packets, int64 claims)
{
	Datum		values[5];

	values[0] = Int64GetDatum(act->id);
	values[1] = Int32GetDatum(stripe);
	values[2] = Int64GetDatum(units);
	values[3] = Int32GetDatum(packets);
	values[4] = Int64GetDatum(claims);
	if (RpExec(&debit, values, NULL, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "stripe %d of activity " INT64_FORMAT " is missing", stripe, act->id);
}

typedef enum RpTry
{
	RP_TRY_TOOK,				/* paid (and, on the fast path, claimed) */
	RP_TRY_SHORT,				/* this stripe cannot pay; try another */
	RP_TRY_DIVERT				/* fast path gives up: careful path decides */
} RpTry;

static RpTry
TryFast(const RpActivity *act, int stripe, int64 units, RpFastClaim *fast)
{
	Datum		values[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;

	if (RpDistributed())		/* Citus: the same claim on the local shards */
		return RpShardFastClaim(act, stripe, units, fast) ? RP_TRY_TOOK : RP_TRY_DIVERT;

	/* on a single node, the same work without SQL (direct.c) */
	switch (RpDirectTake(act, stripe, units, fast))
	{
		case RP_DIRECT_TOOK:
			return RP_TRY_TOOK;
		case RP_DIRECT_DIVERT:
			return RP_TRY_DIVERT;
		case RP_DIRECT_UNUSED:
			break;
	}

	values[0] = Int64GetDatum(act->id);
	values[1] = Int32GetDatum(stripe);
	values[2] = Int64GetDatum(units);
	values[3] = PointerGetDatum(fast->user_id);
	values[4] = PointerGetDatum(fast->request_id);
	if (fast->request_id == NULL)
		nulls[4] = 'n';
	values[5] = PointerGetDatum(fast->key);
	values[6] = NumericGetDatum(fast->amount);
	values[7] = Int32GetDatum(act->per_user_limit);
	if (RpExec(act->per_user_limit == 1 ? &take_and_claim : &take_and_claim_limited,
			   values, nulls, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not claim from stripe %d", stripe);
	if (SPI_processed == 0)
		return RP_TRY_DIVERT;
	fast->claim_id = RpGetInt64(0, 1, 0);
	fast->claimed_at = DatumGetTimestampTz(RpGetDatum(0, 2, &isnull));
	return RP_TRY_TOOK;
}

/*
 * The allocator's answer for the stripes whose balances and packets are
 * given, over the stripes visible (NULL: all).  *units is the fixed amount,
 * or 0 for a lucky draw.
 */
static RpPlanResult
PlanStripes(const RpActivity *act, const int64 *balance, const int64 *packets,
	 const bool *visible, int start, int64 units, RpPlanOut *out)
{
	RpPlanIn	in;

	in.n = act->stripes;
	in.balance = balance;
	in.packets = packets;
	in.visible = visible;
	in.capped = act->packets != 0;
	in.start = start;
	in.units = units;
	in.draw = RpDrawUnits;
	out->take = palloc(sizeof(int64) * act->stripes);
	return RpPlanClaim(&in, out);
}

/*
 * Write a plan: debit every stripe that pays (the primary also counts the
 * packet and the claim), and unlock the stripes it does not write.
 */
static void
DebitPlan(const RpActivity *act, const RpPlanOut *plan)
{
	for (int s = 0; s < act->stripes; s++)
	{
		if (plan->take[s] == 0 && s != plan->primary)
		{
			RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
			continue;
		}
		Debit(act, s, plan->take[s], (act->packets != 0 && s == plan->primary) ? 1 : 0,
			  s == plan->primary ? 1 : 0);
	}
}

/*
 * Try to take the claim from one stripe whose lock we hold.  *units is the
 * fixed amount, or 0 for a lucky draw (then set to the drawn amount).  A
 * fixed amount is the allocator's rule 1 for one stripe, written as one
 * conditional UPDATE.
 */
static RpTry
TryStripe(const RpActivity *act, int stripe, int64 *units, RpFastClaim *fast)
{
	Datum		values[3];
	int64	   *balance;
	int64	   *packets;
	bool	   *visible;
	RpPlanOut	plan;

	if (fast)
		return TryFast(act, stripe, *units, fast);

	values[0] = Int64GetDatum(act->id);
	values[1] = Int32GetDatum(stripe);

	if (*units > 0)
	{
		values[2] = Int64GetDatum(*units);
		if (RpExec(&take_fixed, values, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not update stripe %d", stripe);
		return SPI_processed == 1 ? RP_TRY_TOOK : RP_TRY_SHORT;
	}

	if (RpExec(&read_stripe, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read stripe %d", stripe);
	if (SPI_processed != 1)
		return RP_TRY_SHORT;
	balance = palloc0(sizeof(int64) * act->stripes);
	packets = palloc0(sizeof(int64) * act->stripes);
	visible = palloc0(sizeof(bool) * act->stripes);
	balance[stripe] = RpGetInt64(0, 1, 0);
	packets[stripe] = RpGetInt64(0, 2, 0);
	visible[stripe] = true;
	if (PlanStripes(act, balance, packets, visible, stripe, 0, &plan) != RP_PLAN_PAID)
		return RP_TRY_SHORT;
	*units = plan.units;
	Debit(act, stripe, *units, 1, 1);
	return RP_TRY_TOOK;
}

/*
 * Deadlock avoidance: see locks.c.  A claim never waits while holding a
 * lock it took itself, except as a gatherer.
 */

/* Try to lock every stripe, in order; on a busy one give back what was taken. */
bool
RpTryLockAllStripes(const RpActivity *act, int *busy)
{
	for (int s = 0; s < act->stripes; s++)
	{
		if (!RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, false))
		{
			*busy = s;
			while (--s >= 0)
				RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
			return false;
		}
	}
	return true;
}

/*
 * Lock every stripe, in stripe order, waiting for each: for gatherers,
 * close, freeze and reconciliation.  The lock queue is fair, so under a
 * steady stream of claims they are served in turn; giving back and
 * retrying could starve them.
 */
void
RpLockAllStripes(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		(void) RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, true);
}

static void
UnlockAll(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
}

/*
 * Slow path: with every stripe locked, the allocator looks at the whole
 * activity.  The stripes not written are unlocked again before returning.
 * When a stripe is busy nothing is held or written, and the caller gathers
 * (RP_TAKE_GATHER, *stripe the busy one).
 */
static RpTakeResult
GatherStripes(const RpActivity *act, int start, int64 *units, int *stripe)
{
	int			n = act->stripes;
	int64	   *balance = palloc(sizeof(int64) * n);
	int64	   *packets = palloc(sizeof(int64) * n);
	Datum		id = Int64GetDatum(act->id);
	bool		isnull;
	RpPlanOut	plan;
	int			busy;

	if (!RpTryLockAllStripes(act, &busy))
	{
		*stripe = busy;
		return RP_TAKE_GATHER;
	}

	/* A freeze or close may have committed since the activity was read. */
	if (RpExec(&read_halt, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "activity " INT64_FORMAT " disappeared", act->id);
	if (DatumGetBool(RpGetDatum(0, 1, &isnull)) || DatumGetBool(RpGetDatum(0, 2, &isnull)))
	{
		bool		frozen = DatumGetBool(RpGetDatum(0, 1, &isnull));

		UnlockAll(act);
		return frozen ? RP_TAKE_FROZEN : RP_TAKE_ENDED;
	}

	if (RpExec(&read_all, &id, NULL, false, 0) != SPI_OK_SELECT || SPI_processed != (uint64) n)
		elog(ERROR, "activity " INT64_FORMAT " has " UINT64_FORMAT " stripes, expected %d",
			 act->id, SPI_processed, n);
	for (int i = 0; i < n; i++)
	{
		balance[i] = RpGetInt64(i, 2, 0);
		packets[i] = RpGetInt64(i, 3, 0);
	}
	RpStatsCount(act->id, RP_STAT_GATHER);
	if (PlanStripes(act, balance, packets, NULL, start, *units, &plan) != RP_PLAN_PAID)
	{
		UnlockAll(act);
		return RP_TAKE_EXHAUSTED;
	}
	DebitPlan(act, &plan);
	*units = plan.units;
	*stripe = plan.primary;
	RpRememberStripe(act, plan.primary);
	return RP_TAKE_OK;
}

/*
 * Take a claim's money from the activity.  *units is the fixed amount, or 0
 * for a lucky draw, in which case it returns the drawn amount.  On success
 * *stripe is the stripe that paid, and its lock is held to the end of the
 * transaction.  RP_TAKE_WAIT means stripe *stripe was busy and nothing is
 * held or written: the caller lets go of its own locks, waits for that
 * stripe and tries again (RpClaimOne); RP_TAKE_GATHER means the claim needs
 * every stripe and *stripe was busy: the caller gathers (locks.c).
 *
 * With fast set (fixed amounts, READ COMMITTED), one attempt on the first
 * stripe we can lock also checks for a duplicate, a halt or the user's limit
 * and inserts the claim, all in one statement.  If it writes nothing, the
 * careful path takes over and tells why; the fast path never gathers.
 */
RpTakeResult
RpTake(const RpActivity *act, int64 *units, int *stripe, RpFastClaim *fast)
{
	int			n = act->stripes;
	int			start = RpStartStripe(act);
	int			failed = 0;
	bool		locked_any = false;
	RpTry		r;

	Assert(fast == NULL || *units > 0);


	for (int i = 0; i < n && failed < RP_FAST_PROBES; i++)
	{
		int			s = (start + i) % n;

		if (!RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, false))
			continue;
		locked_any = true;
		r = TryStripe(act, s, units, fast);
		if (r == RP_TRY_TOOK)
		{
			*stripe = s;
			RpRememberStripe(act, s);
			return RP_TAKE_OK;
		}
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
		if (r == RP_TRY_DIVERT)
			return RP_TAKE_DIVERT;
		failed++;
	}

	/* Every stripe was busy: the caller waits for the first one. */
	if (!locked_any)
	{
		*stripe = start;
		return RP_TAKE_WAIT;
	}

	if (fast)
		return RP_TAKE_DIVERT;
	return GatherStripes(act, start, units, stripe);
}
