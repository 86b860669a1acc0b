/*
 * stripe.c
 *		Taking a claim's money from an activity's stripes (sub-balances).
 *
 *		Spread.  A claim starts probing at a per-backend spread, so that
 *		concurrent claimers land on different rows; inside one transaction
 *		a backend keeps using the stripe it already holds (sticky), so a
 *		transaction making many claims pins one stripe instead of many.
 *
 *		Stripe sets.  The stripes one claim or one batch holds and decides
 *		over: locked with try-locks (the waiting is the caller's: locks.c),
 *		read under their locks, decided by the allocator (alloc.c) claim
 *		after claim, and written in one go: the stripes that changed stay
 *		locked to the end of the transaction, the others are given back.
 *		A stripe read halted, or at another revision than the activity the
 *		caller read, means a freeze, a close or a new schedule committed
 *		since: the caller answers from the activity as it is now.
 *
 *		The careful take (RpTakeCareful) for one claim: probe a few stripes
 *		from the spread with try-locks; then read every stripe without a
 *		lock, which proves exhaustion when even their committed balances
 *		together cannot pay (in-flight claims only take more, so no lock can
 *		change that answer) and names the stripes that could pay alone; try
 *		those; only when none could pay alone is every stripe locked (a
 *		gather) for the allocator's rule 3.  So an exhausted activity answers
 *		without gathering, and a gather is rare: rule 3 leaves the
 *		remainder of a fixed-amount activity on one stripe.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "base/base.h"
#include "ops/ops.h"
#include "scaleout/scaleout.h"
#include "locks.h"
#include "rules.h"
#include "stripe.h"

int			rp_default_stripes = RP_DEFAULT_STRIPES;

/* Stripes a careful take tries from its spread before it reads them all. */
#define RP_CAREFUL_PROBES 4

/* The columns the stripes are read with. */
enum
{
	SR_STRIPE = 1, SR_BALANCE, SR_PACKETS, SR_HALTED, SR_REVISION, SR_DEALT, SR_DEALT_UNITS,
	SR_DEALT_COUNT
};

/*
 * $2 the stripes to read, $3 those held: only their dealt amounts are read
 * (a guess needs their sum and number, not the amounts).
 */
#define RP_READ_STRIPES(extra) \
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0), s.halted, " extra \
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1" \
	"   AND s.stripe OPERATOR(pg_catalog.=) ANY ($2)"

static RpPlan read_stripes_14 = {
	RP_READ_STRIPES("s.revision,"
					" CASE WHEN s.stripe OPERATOR(pg_catalog.=) ANY ($3) THEN s.dealt END,"
					" s.dealt_units, s.dealt_count"),
	3, {INT8OID, INT4ARRAYOID, INT4ARRAYOID}
};

/* One stripe, held: an index scan, not a bitmap of one. */
static RpPlan read_stripe_14 = {
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0), s.halted, s.revision, s.dealt,"
	"       s.dealt_units, s.dealt_count"
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND s.stripe OPERATOR(pg_catalog.=) $2",
	2, {INT8OID, INT4OID}
};

static RpPlan read_stripes_13 = {
	RP_READ_STRIPES("0::pg_catalog.int8, NULL::pg_catalog.int8[], 0::pg_catalog.int8,"
					" 0::pg_catalog.int4"),
	3, {INT8OID, INT4ARRAYOID, INT4ARRAYOID}
};

#define RP_WRITE_STRIPE(extra) \
	"UPDATE redpacket.stripe" \
	"   SET balance = balance OPERATOR(pg_catalog.-) $3," \
	"       packets = packets OPERATOR(pg_catalog.-) $4," \
	"       claims = claims OPERATOR(pg_catalog.+) $5" extra \
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND stripe OPERATOR(pg_catalog.=) $2"

static RpPlan write_stripe_14 = {
	RP_WRITE_STRIPE(", dealt = $6, dealt_units = $7, dealt_count = $8"),
	8, {INT8OID, INT4OID, INT8OID, INT4OID, INT8OID, INT8ARRAYOID, INT8OID, INT4OID}
};

static RpPlan write_stripe_13 = {
	RP_WRITE_STRIPE(""),
	5, {INT8OID, INT4OID, INT8OID, INT4OID, INT8OID}
};

/* Per-backend state: where the next claim starts, and the draw generator. */
static uint32 spread_counter = 0;
static LocalTransactionId sticky_lxid = InvalidLocalTransactionId;
static int64 sticky_activity = 0;
static int	sticky_stripe = 0;
static pg_prng_state draw_prng;
static bool draw_prng_seeded = false;

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
 * can still get one unit; the last packet takes the exact remainder.  When
 * fixed-amount claims on the same activity have left fewer units than
 * packets, each draw gets one unit until the money is gone.  Requires
 * balance >= 1, packets >= 1.
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

/*
 * The stripe count of a new activity.  Given (stripes =>): as asked.  By
 * default: redpacket.stripes, but an activity with a packet cap gets one
 * stripe per RP_PACKETS_PER_STRIPE packets at most -- a group packet of ten
 * needs one stripe, not sixty-four -- so that small activities are small
 * and a lucky draw of up to 127 packets is one pool.  Either way never more
 * stripes than packets or minor units, since a stripe with no money or no
 * packet could never pay anything.
 */
int
RpStripesFor(bool given, int stripes, int64 total_units, int32 packets)
{
	if (!given)
	{
		stripes = rp_default_stripes;
		if (packets > 0)
			stripes = Min(stripes, Max(1, packets / RP_PACKETS_PER_STRIPE));
	}
	if (packets > 0 && stripes > packets)
		stripes = packets;
	if (stripes > total_units)
		stripes = (int) total_units;
	return stripes;
}

static RpPlan count_stripes = {
	"SELECT pg_catalog.count(*) FROM redpacket.stripe s"
	" WHERE s.activity_id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

/* Copy the activity's frozen-or-closed state onto its stripes. */
static RpPlan sync_halt = {
	"UPDATE redpacket.stripe s SET halted = a.frozen_reason IS NOT NULL OR a.closed_at IS NOT NULL"
	"  FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1 AND s.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND s.halted IS DISTINCT FROM (a.frozen_reason IS NOT NULL OR a.closed_at IS NOT NULL)",
	1, {INT8OID}
};

/*
 * Settlement and freezing act only on an activity whose stripe rows are all
 * there (a restore that has not loaded them yet, or rows lost, would make
 * a return of the wrong amount, or leave stripes unmarked).
 */
void
RpCheckStripeRows(const RpActivity *act)
{
	Datum		id = Int64GetDatum(act->id);
	int64		rows;

	if (RpExec(&count_stripes, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count the stripes of activity " INT64_FORMAT, act->id);
	rows = RpGetInt64(0, 1, 0);
	if (rows != act->stripes)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is incomplete", act->id),
				 errdetail("It has " INT64_FORMAT " of its %d stripe rows.", rows, act->stripes),
				 errhint("Finish the restore of redpacket.stripe, or restore the missing rows, first.")));
}

/* The caller holds every stripe lock of the activity. */
void
RpSyncHalt(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	if (RpExec(&sync_halt, &id, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not mark stripes of activity " INT64_FORMAT, activity);
}

/* A new activity's stripes, spread as RpStripeSpread says, nothing dealt. */
static RpPlan insert_even = {
	"INSERT INTO redpacket.stripe (activity_id, stripe, balance, packets)"
	" SELECT $1, (s.o OPERATOR(pg_catalog.-) 1)::pg_catalog.int4, s.b, s.p"
	"   FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) WITH ORDINALITY s(b, p, o)",
	3, {INT8OID, INT8ARRAYOID, INT4ARRAYOID}, NULL, true	/* generic: a custom plan
															 * each time was 1/8 of a
															 * creation's cost */
};

static Datum DealtArray(const RpStripeState *st, bool *isnull);

int64
RpStripeShare(int64 total, int n, int g)
{
	return total / n + (g < total % n ? 1 : 0);
}

int64
RpStripeBalance(int64 units, int32 packets, int stripes, int g, int64 unit)
{
	return unit > 0 ? unit * RpStripeShare(packets, stripes, g) : RpStripeShare(units, stripes, g);
}

void
RpStripeSpread(int64 units, int32 packets, int stripes, int64 unit, Datum *balances,
			   Datum *packs)
{
	Datum	   *b = palloc(sizeof(Datum) * stripes);
	Datum	   *p = palloc(sizeof(Datum) * stripes);

	for (int g = 0; g < stripes; g++)
	{
		b[g] = Int64GetDatum(RpStripeBalance(units, packets, stripes, g, unit));
		p[g] = Int32GetDatum((int32) RpStripeShare(packets, stripes, g));
	}
	*balances = PointerGetDatum(construct_array(b, stripes, INT8OID, sizeof(int64),
												FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	*packs = packets > 0 ? PointerGetDatum(construct_array(p, stripes, INT4OID, sizeof(int32),
														   true, TYPALIGN_INT)) : (Datum) 0;
	pfree(b);
	pfree(p);
}

/*
 * The stripe rows of a new activity of units in packets (0: no cap).
 * Whether its claims will be lucky draws or fixed amounts is not known
 * yet: the first lucky draw deals (alloc.c, rule 3), and fixed amounts are
 * paid from undealt money, so an activity that never draws never gathers
 * for a deal.
 */
void
RpCreateStripes(int64 activity, int64 units, int32 packets, int stripes, int64 unit)
{
	Datum		values[3];
	char		nulls[3] = {' ', ' ', packets > 0 ? ' ' : 'n'};

	values[0] = Int64GetDatum(activity);
	RpStripeSpread(units, packets, stripes, unit, &values[1], &values[2]);
	if (RpExecOn(&insert_even, RpDistributed(), values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not insert stripes");
}

/* --- Stripe sets ----------------------------------------------------------- */

void
RpStripeSetInit(RpStripeSet *set, const RpActivity *act)
{
	int			n = act->stripes;

	set->act = act;
	set->n = n;
	set->all = false;
	set->deal = RpActivityDeals(act);
	set->deal_ahead = false;
	set->others_clear = false;
	set->last_primary = -1;
	set->cxt = CurrentMemoryContext;
	set->locked = palloc0(sizeof(bool) * n);
	set->halted = palloc0(sizeof(bool) * n);
	set->revision = palloc0(sizeof(int64) * n);
	set->read = palloc0(sizeof(RpStripeState) * n);
	set->dealt_units = palloc0(sizeof(int64) * n);
	set->dealt_count = palloc0(sizeof(int64) * n);
	set->now = palloc0(sizeof(RpStripeState) * n);
	set->claims = palloc0(sizeof(int64) * n);
	set->changed = palloc0(sizeof(bool) * n);
	set->next = palloc0(sizeof(RpStripeState) * n);
	set->next_changed = palloc0(sizeof(bool) * n);
	set->scratch = palloc(sizeof(int64) * n * RP_DEAL_BLOCK);
}

bool
RpStripeSetTryLock(RpStripeSet *set, int s)
{
	if (set->locked[s])
		return true;
	if (!RpLock(RP_LOCK_STRIPE, set->act->id, (uint32) s, false))
		return false;
	set->locked[s] = true;
	return true;
}

/* Lock every stripe, giving up the partial set first; false, holding none, on a busy one. */
bool
RpStripeSetLockAll(RpStripeSet *set, int *busy)
{
	RpStripeSetRelease(set);
	if (!RpTryLockAllStripes(set->act, busy))
		return false;
	RpStripeSetHoldAll(set);
	return true;
}

/* The caller holds every stripe (it waited for them in stripe order). */
void
RpStripeSetHoldAll(RpStripeSet *set)
{
	for (int s = 0; s < set->n; s++)
		set->locked[s] = true;
	set->all = true;
}

/* Give back every stripe this set locked; nothing of it was written. */
void
RpStripeSetRelease(RpStripeSet *set)
{
	for (int s = 0; s < set->n; s++)
		if (set->locked[s])
		{
			RpUnlock(RP_LOCK_STRIPE, set->act->id, (uint32) s);
			set->locked[s] = false;
		}
	set->all = false;
}

/* A dealt array into an allocation of set->cxt. */
static void
ReadDealt(RpStripeSet *set, Datum d, RpStripeState *st)
{
	ArrayType  *arr = DatumGetArrayTypeP(d);
	Datum	   *elems;
	int			n;
	int64	   *amounts;

	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, NULL, &n);
	amounts = MemoryContextAlloc(set->cxt, sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		amounts[i] = DatumGetInt64(elems[i]);
	st->dealt = amounts;
	st->ndealt = n;
}

/*
 * Read the stripes this set holds (guess: every stripe, holding none of
 * them, for a first idea), and forget the decisions made so far.
 */
void
RpStripeSetRead(RpStripeSet *set, bool guess)
{
	Datum	   *idd = palloc(sizeof(Datum) * set->n);
	Datum	   *held = palloc(sizeof(Datum) * set->n);
	int			m = 0;
	int			h = 0;
	Datum		values[3];
	RpPlan	   *plan;
	MemoryContext outer;

	for (int s = 0; s < set->n; s++)
	{
		memset(&set->read[s], 0, sizeof(RpStripeState));
		set->halted[s] = false;
		set->revision[s] = set->act->revision;
		set->dealt_units[s] = 0;
		set->dealt_count[s] = 0;
		if (set->locked[s])
			held[h++] = Int32GetDatum(s);
		if (guess || set->locked[s])
			idd[m++] = Int32GetDatum(s);
	}
	values[0] = Int64GetDatum(set->act->id);
	if (m == 1 && h == 1 && RpCatalogVersion() >= RP_CATALOG_1_4)
	{
		values[1] = idd[0];
		plan = &read_stripe_14;
	}
	else
	{
		values[1] = PointerGetDatum(construct_array(idd, m, INT4OID, 4, true, TYPALIGN_INT));
		values[2] = PointerGetDatum(construct_array(held, h, INT4OID, 4, true, TYPALIGN_INT));
		plan = RpCatalogVersion() >= RP_CATALOG_1_4 ? &read_stripes_14 : &read_stripes_13;
	}
	if (RpExec(plan, values, NULL, false, 0) != SPI_OK_SELECT || SPI_processed != (uint64) m)
		elog(ERROR, "activity " INT64_FORMAT " has " UINT64_FORMAT " of the %d stripe rows asked",
			 set->act->id, SPI_processed, m);
	outer = MemoryContextSwitchTo(set->cxt);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int			s = DatumGetInt32(RpGetDatum(r, SR_STRIPE, &isnull));
		RpStripeState *st = &set->read[s];
		Datum		d;

		st->balance = RpGetInt64(r, SR_BALANCE, 0);
		st->packets = RpGetInt64(r, SR_PACKETS, 0);
		set->halted[s] = DatumGetBool(RpGetDatum(r, SR_HALTED, &isnull));
		set->revision[s] = RpGetInt64(r, SR_REVISION, 0);
		d = RpGetDatum(r, SR_DEALT, &isnull);
		if (!isnull)
			ReadDealt(set, d, st);
		set->dealt_units[s] = RpGetInt64(r, SR_DEALT_UNITS, 0);
		set->dealt_count[s] = RpGetInt64(r, SR_DEALT_COUNT, 0);
	}
	MemoryContextSwitchTo(outer);
	set->others_clear = false;
	RpStripeSetReset(set);
}

/* As read: stripe s has no undealt money or packet. */
static bool
Clear(const RpStripeSet *set, int s)
{
	return set->read[s].balance == set->dealt_units[s] &&
		set->read[s].packets == set->dealt_count[s];
}

/* As read: the pool holds every undealt money and packet, and can deal. */
static bool
PoolCanDeal(const RpStripeSet *set)
{
	const RpStripeState *pool = &set->read[0];

	for (int s = 1; s < set->n; s++)
		if (!Clear(set, s))
			return false;
	return set->dealt_count[0] == 0 && pool->balance > 0 && pool->packets > 0;
}

/*
 * Read the stripes held before a decision; with pool, every stripe: the
 * caller holds the pool (stripe 0), so nobody can be adding undealt money or
 * packets to the others (alloc.c), and what they show says whether the pool
 * holds all of it.  Not under REPEATABLE READ or SERIALIZABLE: the
 * transaction's snapshot may predate a change that committed before the
 * pool was locked (only the stripes it writes would tell, with 40001).
 */
static void
ReadHeld(RpStripeSet *set, bool pool)
{
	bool		clear = !IsolationUsesXactSnapshot();

	RpStripeSetRead(set, pool);
	if (!pool)
		return;
	for (int s = 1; s < set->n; s++)
		if (!set->locked[s] && !Clear(set, s))
			clear = false;
	set->others_clear = clear;
}

void
RpStripeSetReset(RpStripeSet *set)
{
	for (int s = 0; s < set->n; s++)
	{
		set->now[s] = set->read[s];
		set->claims[s] = 0;
		set->changed[s] = false;
	}
	set->last_primary = -1;
}

/*
 * Did a freeze or a close (RP_TAKE_HALTED, whichever stripe shows it), or a
 * new schedule (RP_TAKE_STALE), commit after the caller read the activity?
 * Seen on the stripes read (held only: those it holds), which they all
 * mark; RP_TAKE_OK when neither.
 */
static RpTakeResult
StripesMarked(const RpStripeSet *set, bool held_only)
{
	RpTakeResult r = RP_TAKE_OK;

	for (int s = 0; s < set->n; s++)
	{
		if (held_only && !set->locked[s])
			continue;
		if (set->halted[s])
			return RP_TAKE_HALTED;
		if (set->revision[s] != set->act->revision)
			r = RP_TAKE_STALE;
	}
	return r;
}

RpTakeResult
RpStripeSetStale(const RpStripeSet *set)
{
	return StripesMarked(set, true);
}

/* Copy a new dealt list, which may live in the allocator's scratch, into the set's memory. */
static const int64 *
KeepDealt(RpStripeSet *set, const RpStripeState *st)
{
	int64	   *copy;

	if (st->ndealt == 0)
		return NULL;
	copy = MemoryContextAlloc(set->cxt, sizeof(int64) * st->ndealt);
	memcpy(copy, st->dealt, sizeof(int64) * st->ndealt);
	return copy;
}

/* The allocator's input and output over what the decisions so far left. */
static void
AllocInput(RpStripeSet *set, int64 units, int start, RpAllocIn *in, RpAllocOut *out)
{
	in->n = set->n;
	in->stripes = set->now;
	in->visible = set->all ? NULL : set->locked;
	in->capped = set->act->packets != 0;
	in->deal = set->deal;
	in->others_clear = set->others_clear;
	in->start = start;
	in->units = units;
	in->draw = RpDrawUnits;
	in->scratch = set->scratch;
	out->next = set->next;
	out->changed = set->next_changed;
}

/* Keep the allocator's new state of the stripes as the set's decisions. */
static void
KeepNext(RpStripeSet *set)
{
	for (int s = 0; s < set->n; s++)
	{
		if (!set->next_changed[s])
			continue;
		if (set->next[s].dealt != set->now[s].dealt ||
			set->next[s].ndealt != set->now[s].ndealt)
			set->next[s].dealt = KeepDealt(set, &set->next[s]);
		set->now[s] = set->next[s];
		set->changed[s] = true;
	}
}

/*
 * Deal from the pool, which the set holds, to every stripe it holds with
 * nothing dealt (alloc.c, rule 2), reading every stripe first (ReadHeld);
 * the decisions that follow see the blocks.  False when nothing was dealt.
 */
static bool
DealHeld(RpStripeSet *set, int start)
{
	RpAllocIn	in;
	RpAllocOut	out;

	ReadHeld(set, true);
	if (RpStripeSetStale(set) != RP_TAKE_OK)
		return false;
	AllocInput(set, 0, start, &in, &out);
	if (RpAllocDeal(&in, &out) < 0)
		return false;
	KeepNext(set);
	return true;
}

/*
 * Before a deal from the pool: try-lock every stripe, so that the deal can
 * reach each free one with nothing dealt (it learns which from its read);
 * the stripes it does not deal to are given back when it writes.
 */
static void
LockFree(RpStripeSet *set)
{
	for (int s = 1; s < set->n; s++)
		(void) RpStripeSetTryLock(set, s);
}

/*
 * Deal ahead: a lucky draw that took the last amount dealt to its stripe s,
 * in the transaction's first claim on the activity, deals the next blocks
 * now if the pool is free: to s and to every free stripe with nothing dealt
 * (every lock only tried), as rule 2 of alloc.c would deal to them for the
 * next claims.  So under load the stripes seldom run dry, and a claim seldom
 * finds one so and waits for the pool.  A transaction that claimed before
 * deals nothing ahead: it keeps what it holds to its end, and would keep
 * the stripes it dealt to (so too, claims made one after the other in one
 * transaction take the amounts in the order they were drawn).
 */
static void
DealAhead(const RpActivity *act, int s)
{
	RpStripeSet set;

	RpStripeSetInit(&set, act);
	if (!RpStripeSetTryLock(&set, 0) || !RpStripeSetTryLock(&set, s))
	{
		RpStripeSetRelease(&set);
		return;
	}
	LockFree(&set);
	if (DealHeld(&set, s))
		RpStripeSetWrite(&set);
	else
		RpStripeSetRelease(&set);
}

/*
 * Decide one claim of units (0: a lucky draw) over the stripes held and what
 * the decisions before it left.  On RP_ALLOC_PAID the decision is kept (the
 * stripe that counts it, the amount).
 */
RpAllocResult
RpStripeSetTake(RpStripeSet *set, int64 units, int start, int *primary, int64 *amount)
{
	RpAllocIn	in;
	RpAllocOut	out;
	RpAllocResult r;

	AllocInput(set, units, start, &in, &out);
	r = RpAllocate(&in, &out);
	if (r == RP_ALLOC_PAID)
	{
		KeepNext(set);
		set->claims[out.primary]++;
		set->last_primary = out.primary;
		*primary = out.primary;
		*amount = out.units;
	}
	return r;
}

static Datum
DealtArray(const RpStripeState *st, bool *isnull)
{
	Datum	   *d;

	*isnull = st->ndealt == 0;
	if (*isnull)
		return (Datum) 0;
	d = palloc(sizeof(Datum) * st->ndealt);
	for (int i = 0; i < st->ndealt; i++)
		d[i] = Int64GetDatum(st->dealt[i]);
	return PointerGetDatum(construct_array(d, st->ndealt, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

static void
WriteStripe(RpStripeSet *set, int s)
{
	const RpStripeState *was = &set->read[s];
	const RpStripeState *is = &set->now[s];
	bool		v14 = RpCatalogVersion() >= RP_CATALOG_1_4;
	Datum		values[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int64		dealt_units = 0;
	bool		isnull;

	for (int i = 0; i < is->ndealt; i++)
		dealt_units += is->dealt[i];
	values[0] = Int64GetDatum(set->act->id);
	values[1] = Int32GetDatum(s);
	values[2] = Int64GetDatum(was->balance - is->balance);
	values[3] = Int32GetDatum((int32) (was->packets - is->packets));
	values[4] = Int64GetDatum(set->claims[s]);
	values[5] = DealtArray(is, &isnull);
	nulls[5] = isnull ? 'n' : ' ';
	values[6] = Int64GetDatum(dealt_units);
	values[7] = Int32GetDatum(is->ndealt);
	if (RpExec(v14 ? &write_stripe_14 : &write_stripe_13, values, nulls, false, 0) != SPI_OK_UPDATE ||
		SPI_processed != 1)
		elog(ERROR, "stripe %d of activity " INT64_FORMAT " is missing", s, set->act->id);
}

/*
 * Write every stripe the decisions changed (they stay locked to the end of
 * the transaction) and give back the others.  The transaction's next claim
 * starts at the stripe that paid the last one (sticky): it holds it, and a
 * lucky draw's next amount is there.
 */
void
RpStripeSetWrite(RpStripeSet *set)
{
	for (int s = 0; s < set->n; s++)
	{
		if (set->changed[s])
			WriteStripe(set, s);
		else if (set->locked[s])
		{
			RpUnlock(RP_LOCK_STRIPE, set->act->id, (uint32) s);
			set->locked[s] = false;
		}
	}
	set->all = false;
	if (set->last_primary >= 0)
		RpRememberStripe(set->act, set->last_primary);
}

/* --- The careful take ------------------------------------------------------- */

/* A guess says stripe s could pay units alone. */
static bool
CouldPayAlone(const RpStripeSet *set, int s, int64 units)
{
	const RpStripeState *st = &set->read[s];
	int64		dealt = set->dealt_units[s];
	int64		ndealt = set->dealt_count[s];

	if (set->halted[s])
		return false;
	if (units > 0)
		return RpFixedFits(st->balance - dealt, st->packets - ndealt, set->act->packets != 0,
						   units);
	if (ndealt > 0 || (!set->deal && st->packets > 0 && st->balance > 0))
		return true;
	return set->deal && s == 0 && PoolCanDeal(set);
}

/* A guess proves exhaustion: even every committed balance together cannot pay. */
static bool
GuessExhausted(const RpStripeSet *set, int64 units)
{
	int64		money = 0;
	int64		packets = 0;

	for (int s = 0; s < set->n; s++)
	{
		money += set->read[s].balance;
		packets += set->read[s].packets;
	}
	if (set->act->packets != 0 && packets == 0)
		return true;
	return units > 0 ? money < units : money == 0;
}

/* Decide over the stripes held as read; write on success. */
static RpTakeResult
Decide(RpStripeSet *set, int64 units, int start, int *stripe, int64 *amount)
{
	RpTakeResult stale = RpStripeSetStale(set);

	if (stale != RP_TAKE_OK)
	{
		RpStripeSetRelease(set);
		return stale;
	}
	switch (RpStripeSetTake(set, units, start, stripe, amount))
	{
		case RP_ALLOC_PAID:
			RpStripeSetWrite(set);
			if (units == 0 && set->deal_ahead && set->now[*stripe].ndealt == 0)
				DealAhead(set->act, *stripe);
			return RP_TAKE_OK;
		case RP_ALLOC_EXHAUSTED:
			RpStripeSetRelease(set);
			return RP_TAKE_EXHAUSTED;
		case RP_ALLOC_NEED_ALL:
			break;
	}
	return RP_TAKE_DIVERT;		/* not decided with the stripes held */
}

/* Read the stripes held, decide over them; write on success. */
static RpTakeResult
DecideHeld(RpStripeSet *set, int64 units, int start, int *stripe, int64 *amount)
{
	ReadHeld(set, false);
	return Decide(set, units, start, stripe, amount);
}

/*
 * A lucky draw that found nothing dealt on the stripes it holds: hold the
 * pool too, and every free stripe, and decide again, so that the pool may
 * deal a block to each with nothing dealt (alloc.c, rule 2).  The other
 * stripes are only try-locked.  RP_TAKE_DIVERT when the pool is busy
 * (whoever holds it is likely dealing: the claim then looks for the blocks,
 * and waits for the pool only when no stripe has any) or cannot deal.
 */
static RpTakeResult
DealFromPool(RpStripeSet *set, int64 units, int start, int *stripe, int64 *amount)
{
	if (units != 0 || !set->deal)
		return RP_TAKE_DIVERT;
	if (!RpStripeSetTryLock(set, 0))
		return RP_TAKE_DIVERT;	/* another claim is dealing: look for its blocks */
	LockFree(set);
	(void) DealHeld(set, start);
	return Decide(set, units, start, stripe, amount);
}

/*
 * Probe from the spread: try-lock a stripe, decide with it alone, give it
 * back if it cannot pay alone; a lucky draw that found none then tries the
 * pool.  RP_TAKE_DIVERT when the probes did not decide; RP_TAKE_WAIT when no
 * stripe could be locked.
 */
static RpTakeResult
Probe(RpStripeSet *set, int64 units, int start, int *stripe, int64 *amount, int *wait)
{
	int			tried = 0;

	for (int i = 0; i < set->n && tried < RP_CAREFUL_PROBES; i++)
	{
		int			s = (start + i) % set->n;
		RpTakeResult r;

		if (!RpStripeSetTryLock(set, s))
			continue;
		tried++;
		r = DecideHeld(set, units, s, stripe, amount);
		if (r != RP_TAKE_DIVERT)
			return r;
		RpStripeSetRelease(set);	/* it cannot pay alone: one stripe at a time */
	}
	if (tried == 0)
	{
		*wait = start;
		return RP_TAKE_WAIT;
	}
	return DealFromPool(set, units, start, stripe, amount);
}

RpTakeResult
RpTakeCareful(const RpActivity *act, int64 units, bool all_held, bool earlier, int *stripe,
			  int64 *amount, int *wait)
{
	RpStripeSet set;
	int			start = RpStartStripe(act);
	int			first = -1;
	int		   *cand = palloc(sizeof(int) * act->stripes);
	int			ncand;
	RpTakeResult r;

	RpStripeSetInit(&set, act);
	set.deal_ahead = set.deal && !earlier;
	if (all_held)
	{
		/* the caller waited for them all: take them again, as a set of ours */
		if (!RpStripeSetLockAll(&set, wait))
			elog(ERROR, "a stripe held by this transaction was busy");
		r = DecideHeld(&set, units, start, stripe, amount);
		if (r == RP_TAKE_DIVERT)
			elog(ERROR, "claim could not be decided with every stripe locked");
		return r;
	}

	r = Probe(&set, units, start, stripe, amount, wait);
	if (r != RP_TAKE_DIVERT)
		return r;
	RpStripeSetRelease(&set);

	/*
	 * Every stripe, read without locks: a freeze, close or new schedule
	 * already committed; exhausted; or who could pay alone.
	 */
	RpStripeSetRead(&set, true);
	r = StripesMarked(&set, false);
	if (r != RP_TAKE_OK)
		return r;
	if (GuessExhausted(&set, units))
		return RP_TAKE_EXHAUSTED;
	ncand = 0;
	for (int i = 0; i < set.n; i++)
	{
		int			s = (start + i) % set.n;

		if (CouldPayAlone(&set, s, units))
			cand[ncand++] = s;
	}
	for (int i = 0; i < ncand; i++)
	{
		int			s = cand[i];

		if (!RpStripeSetTryLock(&set, s))
		{
			if (first < 0)
				first = s;		/* busy, but it could pay alone */
			continue;
		}
		if (s == 0 && set.dealt_count[0] == 0)
			r = DealFromPool(&set, units, start, stripe, amount);
		else
			r = DecideHeld(&set, units, s, stripe, amount);
		if (r != RP_TAKE_DIVERT)
			return r;
		RpStripeSetRelease(&set);
	}
	if (first >= 0)
	{
		*wait = first;
		return RP_TAKE_WAIT;
	}

	/* Only every stripe together can pay: gather. */
	if (!RpStripeSetLockAll(&set, wait))
		return RP_TAKE_GATHER;
	RpStatsCount(act->id, RP_STAT_GATHER);
	r = DecideHeld(&set, units, start, stripe, amount);
	if (r == RP_TAKE_DIVERT)
		elog(ERROR, "claim could not be decided with every stripe locked");
	return r;
}
