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

#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "stripe.h"

/* Stripes a careful take tries from its spread before it reads them all. */
#define RP_CAREFUL_PROBES 4

/* The columns the stripes are read with. */
enum
{
	SR_STRIPE = 1, SR_BALANCE, SR_PACKETS, SR_HALTED, SR_REVISION, SR_DEALT
};

#define RP_READ_STRIPES(extra) \
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0), s.halted, " extra \
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1" \
	"   AND s.stripe OPERATOR(pg_catalog.=) ANY ($2)"

static RpPlan read_stripes_14 = {
	RP_READ_STRIPES("s.revision, s.dealt"),
	2, {INT8OID, INT4ARRAYOID}
};

static RpPlan read_stripes_13 = {
	RP_READ_STRIPES("0::pg_catalog.int8, NULL::pg_catalog.int8[]"),
	2, {INT8OID, INT4ARRAYOID}
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
	if (sticky_lxid == MyProc->lxid && sticky_activity == act->id)
		return sticky_stripe % act->stripes;
	return (int) (((uint32) RpMyProcNumber * 7u + spread_counter++) % (uint32) act->stripes);
}

void
RpRememberStripe(const RpActivity *act, int stripe)
{
	sticky_lxid = MyProc->lxid;
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

/* Budget and packets spread evenly; the first stripes take the remainders. */
static RpPlan insert_even = {
	"INSERT INTO redpacket.stripe (activity_id, stripe, balance, packets)"
	" SELECT $1, g, ($2 OPERATOR(pg_catalog./) $4) OPERATOR(pg_catalog.+)"
	"               CASE WHEN g OPERATOR(pg_catalog.<) ($2 OPERATOR(pg_catalog.%) $4) THEN 1 ELSE 0 END,"
	"        (($3 OPERATOR(pg_catalog./) $4) OPERATOR(pg_catalog.+)"
	"         CASE WHEN g OPERATOR(pg_catalog.<) ($3 OPERATOR(pg_catalog.%) $4) THEN 1 ELSE 0 END)::pg_catalog.int4"
	"   FROM pg_catalog.generate_series(0, $4 OPERATOR(pg_catalog.-) 1) g",
	4, {INT8OID, INT8OID, INT8OID, INT4OID}
};

static RpPlan insert_dealt = {
	"INSERT INTO redpacket.stripe"
	"       (activity_id, stripe, balance, packets, dealt, dealt_units, dealt_count)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7)",
	7, {INT8OID, INT4OID, INT8OID, INT4OID, INT8ARRAYOID, INT8OID, INT4OID}
};

static Datum DealtArray(const RpStripeState *st, bool *isnull);

/*
 * The stripe rows of a new activity of units in packets (0: no cap).  On a
 * 1.4 catalog an activity with a cap and more than one stripe is dealt
 * straight away (RpDeal): its first lucky draws need no gathering, and a
 * session that claims first does not hold every stripe.
 */
void
RpCreateStripes(int64 activity, int64 units, int32 packets, int stripes)
{
	Datum		values[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	RpStripeState *st;
	int64	   *scratch;

	values[0] = Int64GetDatum(activity);
	if (packets == 0 || stripes == 1 || RpCatalogVersion() < RP_CATALOG_1_4)
	{
		values[1] = Int64GetDatum(units);
		values[2] = Int64GetDatum(packets);
		values[3] = Int32GetDatum(stripes);
		nulls[2] = packets > 0 ? ' ' : 'n';
		if (RpExec(&insert_even, values, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not insert stripes");
		return;
	}
	st = palloc0(sizeof(RpStripeState) * stripes);
	scratch = palloc(sizeof(int64) * stripes * RP_DEAL_BLOCK);
	RpDeal(stripes, 0, units, packets, RpDrawUnits, scratch, st);
	for (int s = 0; s < stripes; s++)
	{
		bool		isnull;
		int64		dealt_units = 0;

		for (int i = 0; i < st[s].ndealt; i++)
			dealt_units += st[s].dealt[i];
		values[1] = Int32GetDatum(s);
		values[2] = Int64GetDatum(st[s].balance);
		values[3] = Int32GetDatum((int32) st[s].packets);
		values[4] = DealtArray(&st[s], &isnull);
		nulls[4] = isnull ? 'n' : ' ';
		values[5] = Int64GetDatum(dealt_units);
		values[6] = Int32GetDatum(st[s].ndealt);
		if (RpExec(&insert_dealt, values, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not insert stripe %d", s);
	}
}

/* --- Stripe sets ----------------------------------------------------------- */

void
RpStripeSetInit(RpStripeSet *set, const RpActivity *act)
{
	int			n = act->stripes;

	set->act = act;
	set->n = n;
	set->all = false;
	set->deal = n > 1 && RpCatalogVersion() >= RP_CATALOG_1_4;
	set->last_primary = -1;
	set->cxt = CurrentMemoryContext;
	set->locked = palloc0(sizeof(bool) * n);
	set->halted = palloc0(sizeof(bool) * n);
	set->revision = palloc0(sizeof(int64) * n);
	set->read = palloc0(sizeof(RpStripeState) * n);
	set->now = palloc0(sizeof(RpStripeState) * n);
	set->claims = palloc0(sizeof(int64) * n);
	set->changed = palloc0(sizeof(bool) * n);
	set->next = palloc0(sizeof(RpStripeState) * n);
	set->next_changed = palloc0(sizeof(bool) * n);
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
	int32	   *ids = palloc(sizeof(int32) * set->n);
	Datum	   *idd = palloc(sizeof(Datum) * set->n);
	int			m = 0;
	Datum		values[2];
	MemoryContext outer;

	for (int s = 0; s < set->n; s++)
	{
		memset(&set->read[s], 0, sizeof(RpStripeState));
		set->halted[s] = false;
		set->revision[s] = set->act->revision;
		if (guess || set->locked[s])
		{
			ids[m] = s;
			idd[m] = Int32GetDatum(s);
			m++;
		}
	}
	values[0] = Int64GetDatum(set->act->id);
	values[1] = PointerGetDatum(construct_array(idd, m, INT4OID, 4, true, TYPALIGN_INT));
	if (RpExec(RpCatalogVersion() >= RP_CATALOG_1_4 ? &read_stripes_14 : &read_stripes_13,
			   values, NULL, false, 0) != SPI_OK_SELECT || SPI_processed != (uint64) m)
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
	}
	MemoryContextSwitchTo(outer);
	RpStripeSetReset(set);
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
 * Did a freeze or a close (RP_TAKE_HALTED), or a new schedule
 * (RP_TAKE_STALE), commit after the caller read the activity?  Seen on the
 * stripes it holds, which they all mark; RP_TAKE_OK when neither.
 */
RpTakeResult
RpStripeSetStale(const RpStripeSet *set)
{
	RpTakeResult r = RP_TAKE_OK;

	for (int s = 0; s < set->n; s++)
	{
		if (!set->locked[s])
			continue;
		if (set->halted[s])
			return RP_TAKE_HALTED;
		if (set->revision[s] != set->act->revision)
			r = RP_TAKE_STALE;
	}
	return r;
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

	in.n = set->n;
	in.stripes = set->now;
	in.visible = set->all ? NULL : set->locked;
	in.capped = set->act->packets != 0;
	in.deal = set->deal;
	in.start = start;
	in.units = units;
	in.draw = RpDrawUnits;
	in.scratch = MemoryContextAlloc(set->cxt, sizeof(int64) * set->n * RP_DEAL_BLOCK);
	out.next = set->next;
	out.changed = set->next_changed;
	r = RpAllocate(&in, &out);
	if (r == RP_ALLOC_PAID)
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
		set->claims[out.primary]++;
		set->last_primary = out.primary;
		*primary = out.primary;
		*amount = out.units;
	}
	pfree(in.scratch);
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
	int64		dealt = 0;

	if (set->halted[s])
		return false;
	for (int i = 0; i < st->ndealt; i++)
		dealt += st->dealt[i];
	if (units > 0)
		return st->balance - dealt >= units &&
			(set->act->packets == 0 || st->packets - st->ndealt > 0);
	return st->ndealt > 0 || (!set->deal && st->packets > 0 && st->balance > 0);
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

/* Decide over the stripes held; write on success. */
static RpTakeResult
DecideHeld(RpStripeSet *set, int64 units, int start, int *stripe, int64 *amount)
{
	RpTakeResult stale;

	RpStripeSetRead(set, false);
	stale = RpStripeSetStale(set);
	if (stale != RP_TAKE_OK)
	{
		RpStripeSetRelease(set);
		return stale;
	}
	switch (RpStripeSetTake(set, units, start, stripe, amount))
	{
		case RP_ALLOC_PAID:
			RpStripeSetWrite(set);
			return RP_TAKE_OK;
		case RP_ALLOC_EXHAUSTED:
			RpStripeSetRelease(set);
			return RP_TAKE_EXHAUSTED;
		case RP_ALLOC_NEED_ALL:
			break;
	}
	return RP_TAKE_DIVERT;		/* not decided with the stripes held */
}

/*
 * Probe from the spread: try-lock a stripe, decide with the stripes held so
 * far.  RP_TAKE_DIVERT when the probes did not decide; RP_TAKE_WAIT when no
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
		r = DecideHeld(set, units, start, stripe, amount);
		if (r != RP_TAKE_DIVERT)
			return r;
	}
	if (tried == 0)
	{
		*wait = start;
		return RP_TAKE_WAIT;
	}
	return RP_TAKE_DIVERT;
}

RpTakeResult
RpTakeCareful(const RpActivity *act, int64 units, bool all_held, int *stripe, int64 *amount,
			  int *wait)
{
	RpStripeSet set;
	int			start = RpStartStripe(act);
	int			first = -1;
	int		   *cand = palloc(sizeof(int) * act->stripes);
	int			ncand;
	RpTakeResult r;

	RpStripeSetInit(&set, act);
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
	for (int s = 0; s < set.n; s++)
	{
		if (set.halted[s])
			return RP_TAKE_HALTED;
		if (set.revision[s] != act->revision)
			return RP_TAKE_STALE;
	}
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
