/*
 * batch.c
 *		rp_claim_batch: many claims on one activity in one call, with the same
 *		outcome, element by element, as calling rp_claim for each in array
 *		order.  Under READ COMMITTED it works set-wise: every element is
 *		checked and resolved (rules.c) before anything is locked or written,
 *		the users' locks are taken in hash order (so two batches never
 *		deadlock on them), one query finds the claims already held (and the
 *		users on a restricted activity's list), the stripes are locked once
 *		for the whole batch (a stripe set, stripe.c), the elements are decided
 *		in array order with the claim rules and the allocator, and the
 *		stripes and the claims are written in one go.  If the stripes first
 *		locked cannot pay an element, the decision is redone with every
 *		stripe locked, so no element is falsely exhausted.  The user locks,
 *		once taken, are kept while the batch waits for stripes (at most twice
 *		a call; the argument is in locks.c).  Under REPEATABLE READ or
 *		SERIALIZABLE each element takes the single-claim path.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "ops/ops.h"
#include "scaleout/scaleout.h"
#include "locks.h"
#include "rules.h"
#include "stripe.h"
#include "take.h"

PG_FUNCTION_INFO_V1(rp_claim_batch);
PG_FUNCTION_INFO_V1(rp_claim_batch_v14);

typedef struct BatchElem
{
	RpClaimRequest req;
	int			key_root;		/* first element with the same key */
	int			user_root;		/* first element with the same user */
	int64		held;			/* claims the user held before the batch */
	bool		eligible;		/* on a restricted activity's list */
	bool		existing;		/* out.* holds the claim held before the batch */
	int			dup_of;			/* element of this batch whose claim it repeats */
	int			paid_by;		/* the stripe that counts its claim */
	RpOutcome	out;
} BatchElem;

/*
 * One index probe per element: the LIMIT keeps the planner from turning
 * this into a join that reads the activity's whole claim history.  These
 * are generic plans off Citus (RpPreparedOn): with a per-call plan each new
 * backend's first five calls read every claim of a new activity for every
 * element.
 */
enum
{
	EX_ORD = 1, EX_CLAIM_ID, EX_AMOUNT, EX_CLAIMED_AT
};
static RpPlan existing_claims = {
	"SELECT k.ord, c.claim_id, c.amount, c.claimed_at"
	"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]),"
	"                  pg_catalog.unnest($3::pg_catalog.text[]))"
	"       WITH ORDINALITY AS k(user_id, idem, ord)"
	"  CROSS JOIN LATERAL (SELECT c.claim_id, c.amount, c.claimed_at"
	"                        FROM redpacket.claim c"
	"                       WHERE" RP_SQL_CLAIM_UNDER_KEY("c.", "$1", "k.user_id", "k.idem")
	"                       LIMIT 1) c",
	3, {INT8OID, TEXTARRAYOID, TEXTARRAYOID}, NULL, true
};

enum
{
	HC_ORD = 1, HC_COUNT
};
static RpPlan held_counts = {
	"SELECT k.ord, (SELECT pg_catalog.count(*) FROM redpacket.claim c"
	"                WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"                  AND c.user_id OPERATOR(pg_catalog.=) k.user_id)"
	"  FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY AS k(user_id, ord)",
	2, {INT8OID, TEXTARRAYOID}, NULL, true
};

enum
{
	EL_ORD = 1
};
static RpPlan listed_users = {
	"SELECT k.ord FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY AS k(user_id, ord)"
	" WHERE EXISTS (SELECT 1 FROM redpacket.eligible e"
	"                WHERE e.activity_id OPERATOR(pg_catalog.=) $1"
	"                  AND e.user_id OPERATOR(pg_catalog.=) k.user_id)",
	2, {INT8OID, TEXTARRAYOID}, NULL, true
};

enum
{
	IC_CLAIM_ID = 1, IC_CLAIMED_AT
};
static RpPlan insert_claims = {
	"INSERT INTO redpacket.claim (" RP_SQL_CLAIM_COLUMNS ")"
	" SELECT $1, k.user_id, k.request_id, k.idem, k.amount, k.stripe, pg_catalog.now()"
	RP_SQL_BATCH_ROWS,
	6, {INT8OID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, NUMERICARRAYOID, INT4ARRAYOID}
};

static bool
TextEq(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * For each element, the first element with the same user (and key, when
 * with_key): a hash table of first occurrences, with an exact comparison
 * and a linear scan on the (rare) hash collision.
 */
static void
FindRoots(BatchElem *e, int n, bool with_key)
{
	HASHCTL		ctl;
	HTAB	   *seen;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(uint64) + sizeof(int);
	ctl.hcxt = CurrentMemoryContext;
	seen = hash_create("redpacket batch keys", Max(n, 16), &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	for (int i = 0; i < n; i++)
	{
		RpClaimRequest *r = &e[i].req;
		uint64		h = r->user_hash;
		bool		found;
		char	   *entry;
		int			root = i;

		if (with_key)
			h = hash_combine64(h, hash_bytes_extended((const unsigned char *) VARDATA_ANY(r->key),
													  VARSIZE_ANY_EXHDR(r->key), 0));
		entry = hash_search(seen, &h, HASH_ENTER, &found);
		if (found)
		{
			int			first = *(int *) (entry + sizeof(uint64));

			if (TextEq(e[first].req.user_id, r->user_id) &&
				(!with_key || TextEq(e[first].req.key, r->key)))
				root = first;
			else
				for (int j = 0; j < i; j++)
					if (TextEq(e[j].req.user_id, r->user_id) &&
						(!with_key || TextEq(e[j].req.key, r->key)))
					{
						root = (with_key ? e[j].key_root : e[j].user_root);
						break;
					}
		}
		else
			*(int *) (entry + sizeof(uint64)) = i;
		if (with_key)
			e[i].key_root = root;
		else
			e[i].user_root = root;
	}
	hash_destroy(seen);
}

typedef enum BatchText
{
	BT_USER, BT_REQUEST, BT_KEY
} BatchText;

static Datum
TextArray(BatchElem *e, int n, BatchText which, const bool *include)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));
	bool	   *nulls = palloc(sizeof(bool) * Max(n, 1));
	int			m = 0;
	int			dims[1];
	int			lbs[1] = {1};

	for (int i = 0; i < n; i++)
	{
		text	   *t;

		if (include && !include[i])
			continue;
		t = which == BT_USER ? e[i].req.user_id : which == BT_REQUEST ? e[i].req.request_id
			: e[i].req.key;
		d[m] = PointerGetDatum(t);
		nulls[m] = (t == NULL);
		m++;
	}
	dims[0] = m;
	return PointerGetDatum(construct_md_array(d, nulls, 1, dims, lbs, TEXTOID, -1, false,
											  TYPALIGN_INT));
}

static Datum
Int4Array(const int32 *v, int m)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(m, 1));

	for (int i = 0; i < m; i++)
		d[i] = Int32GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, m, INT4OID, 4, true, TYPALIGN_INT));
}

/*
 * Read what the batch's users hold: the claims under their keys, their
 * counts (per_user_limit > 1), whether they are on a restricted activity's
 * list.  Called holding their locks, or without them (a busy answer) for
 * the statuses that need no lock to be known.
 */
static void
ReadHeld(const RpActivity *act, BatchElem *e, int n)
{
	Datum		values[3];
	bool		isnull;

	for (int i = 0; i < n; i++)
	{
		e[i].existing = false;
		e[i].held = 0;
		e[i].eligible = false;
		memset(&e[i].out, 0, sizeof(e[i].out));
	}
	values[0] = Int64GetDatum(act->id);
	values[1] = TextArray(e, n, BT_USER, NULL);
	values[2] = TextArray(e, n, BT_KEY, NULL);
	if (RpExecOn(&existing_claims, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look up existing claims");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		BatchElem  *x = &e[RpGetInt64(r, EX_ORD, 0) - 1];

		x->existing = true;
		x->out.claim_id = RpGetInt64(r, EX_CLAIM_ID, 0);
		x->out.units = RpAmountToUnits(DatumGetNumeric(RpGetDatum(r, EX_AMOUNT, &isnull)),
									   act->scale, "amount");
		x->out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, EX_CLAIMED_AT, &isnull));
	}
	if (act->per_user_limit > 1)
	{
		if (RpExecOn(&held_counts, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not count claims");
		for (uint64 r = 0; r < SPI_processed; r++)
			e[RpGetInt64(r, HC_ORD, 0) - 1].held = RpGetInt64(r, HC_COUNT, 0);
	}
	if (act->restricted)
	{
		if (RpExecOn(&listed_users, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not look up the eligible users");
		for (uint64 r = 0; r < SPI_processed; r++)
			e[RpGetInt64(r, EL_ORD, 0) - 1].eligible = true;
	}
}

/* What an element's status depends on, for RpStatusBeforeMoney. */
typedef struct ElemFacts
{
	const BatchElem *x;
	const int64 *taken;			/* claims each user took earlier in the batch */
} ElemFacts;

static bool
ElemEligible(void *arg)
{
	return ((ElemFacts *) arg)->x->eligible;
}

static int64
ElemHeld(void *arg)
{
	ElemFacts  *f = arg;

	return f->x->held + f->taken[f->x->user_root];
}

/*
 * Decide every element in array order: the claim rules, then (for those
 * that take money) the allocator over the stripes held.  Returns false
 * when an element could not be paid by a partial set of stripes (the
 * caller then locks them all and decides again); with money false, every
 * element that would take money is answered busy instead.
 */
static bool
Decide(const RpActivity *act, RpStripeSet *set, int start, BatchElem *e, int n, bool money)
{
	int		   *winner = palloc(sizeof(int) * n);
	int64	   *taken = palloc0(sizeof(int64) * n);
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	if (set)
		RpStripeSetReset(set);
	for (int i = 0; i < n; i++)
	{
		winner[i] = -1;
		e[i].dup_of = -1;
		e[i].paid_by = -1;
	}

	for (int i = 0; i < n; i++)
	{
		BatchElem  *x = &e[i];
		ElemFacts	arg = {x, taken};
		RpClaimFacts facts = {x->existing || winner[x->key_root] >= 0,
		ElemEligible, ElemHeld, &arg};
		int			status = RpStatusBeforeMoney(act, &facts, now);
		int64		amount;

		if (status == RP_DUPLICATE && !x->existing)
			x->dup_of = winner[x->key_root];
		if (status != RP_TAKE_MONEY)
		{
			x->out.status = (RpStatus) status;
			continue;
		}
		if (!money)
		{
			x->out.status = RP_BUSY;
			continue;
		}
		switch (RpStripeSetTake(set, x->req.units, start, &x->paid_by, &amount))
		{
			case RP_ALLOC_PAID:
				x->out.status = RP_CLAIMED;
				x->out.units = amount;
				winner[x->key_root] = i;
				taken[x->user_root]++;
				break;
			case RP_ALLOC_NEED_ALL:
				return false;
			case RP_ALLOC_EXHAUSTED:
				x->out.status = RP_EXHAUSTED;
				break;
		}
	}
	return true;
}

/* Does any element take money, with the activity running? */
static bool
MayPay(const RpActivity *act, const BatchElem *e, int n)
{
	bool		any = false;

	for (int i = 0; i < n && !any; i++)
		any = !e[i].existing;
	return any && RpActivityRunning(act, GetCurrentTransactionStartTimestamp());
}

/*
 * Lock as few stripes as cover the batch: guess from every stripe read
 * without locks, try-lock in spread order until the guess covers it (a
 * dealing activity's lucky draws count dealt amounts only: the pool's
 * undealt money pays none of them without every stripe).
 * Returns false, holding none, when every stripe that could pay was busy
 * (*wait_stripe: the first in spread order, so that waiters fan out).
 */
static bool
LockSome(const RpActivity *act, RpStripeSet *set, const BatchElem *e, int n, int start,
		 int *wait_stripe)
{
	int64		want_units = 0;
	int64		want_packets = 0;
	int64		have_units = 0;
	int64		have_packets = 0;
	int			first = -1;
	bool		lucky = false;

	for (int i = 0; i < n; i++)
		if (!e[i].existing)
		{
			want_units += e[i].req.units > 0 ? e[i].req.units : 1;
			want_packets++;
			lucky |= e[i].req.units == 0;
		}
	/* lucky draws of a dealing activity are paid from dealt amounts only */
	lucky &= set->deal;
	RpStripeSetRead(set, true);
	for (int i = 0; i < set->n; i++)
	{
		int			s = (start + i) % set->n;
		const RpStripeState *st = &set->read[s];
		int64		units = lucky ? set->dealt_units[s] : st->balance;
		int64		packets = lucky ? set->dealt_count[s] : st->packets;

		if (have_units >= want_units && (act->packets == 0 || have_packets >= want_packets))
			break;
		if (units <= 0 || (act->packets != 0 && packets <= 0))
			continue;
		if (first < 0)
			first = s;
		if (!RpStripeSetTryLock(set, s))
			continue;
		have_units += units;
		have_packets += packets;
	}
	if (have_units == 0 && first >= 0)
	{
		*wait_stripe = first;
		return false;
	}
	return true;
}

/*
 * Read the stripes held; if one is halted, or at another revision than the
 * activity read, take the activity as it is now (a freeze, close or new
 * schedule won the race; a stripe halted by hand counts as frozen).
 */
static void
ReadHeldStripes(RpActivity *act, RpStripeSet *set)
{
	RpTakeResult stale;

	RpStripeSetRead(set, false);
	stale = RpStripeSetStale(set);
	if (stale == RP_TAKE_OK)
		return;
	(void) RpFetchActivity(act->id, act, false);
	if (stale == RP_TAKE_HALTED && !act->frozen && !act->closed)
		act->frozen = true;
}

/*
 * Take the stripes and decide every element.  With all_held, every stripe
 * is already locked (the caller waited for them in stripe order) and the
 * decision cannot fail.  Returns RP_TAKE_OK when decided, or, holding no
 * stripe it took, RP_TAKE_WAIT (no stripe that could pay was free) or
 * RP_TAKE_GATHER (every stripe is needed and one is busy), the busy stripe
 * in *wait_stripe.
 */
static RpTakeResult
LockAndDecide(RpActivity *act, RpStripeSet *set, BatchElem *e, int n, int start,
			  bool all_held, int *wait_stripe)
{
	int			busy;

	if (all_held)
	{
		if (!RpStripeSetLockAll(set, &busy))
			elog(ERROR, "a stripe held by this transaction was busy");
	}
	else if (MayPay(act, e, n) && !LockSome(act, set, e, n, start, wait_stripe))
		return RP_TAKE_WAIT;
	ReadHeldStripes(act, set);
	if (Decide(act, set, start, e, n, true))
		return RP_TAKE_OK;
	if (all_held)
		elog(ERROR, "batch could not be decided with every stripe locked");

	if (!RpStripeSetLockAll(set, wait_stripe))
		return RP_TAKE_GATHER;
	RpStatsCount(act->id, RP_STAT_GATHER);
	ReadHeldStripes(act, set);
	if (!Decide(act, set, start, e, n, true))
		elog(ERROR, "batch could not be decided with every stripe locked");
	return RP_TAKE_OK;
}

/* One INSERT for the claims decided, and every element's answer. */
static void
WriteClaims(const RpActivity *act, BatchElem *e, int n)
{
	bool	   *claimed = palloc0(sizeof(bool) * n);
	Datum	   *ad = palloc(sizeof(Datum) * n);
	int32	   *stripes = palloc(sizeof(int32) * n);
	int			nclaimed = 0;
	Datum		values[6];
	bool		isnull;

	for (int i = 0; i < n; i++)
		if (e[i].out.status == RP_CLAIMED)
		{
			claimed[i] = true;
			ad[nclaimed] = NumericGetDatum(RpUnitsToAmount(e[i].out.units, act->scale));
			stripes[nclaimed] = e[i].paid_by;
			nclaimed++;
		}
	if (nclaimed > 0)
	{
		values[0] = Int64GetDatum(act->id);
		values[1] = TextArray(e, n, BT_USER, claimed);
		values[2] = TextArray(e, n, BT_REQUEST, claimed);
		values[3] = TextArray(e, n, BT_KEY, claimed);
		values[4] = PointerGetDatum(construct_array(ad, nclaimed, NUMERICOID, -1, false,
													TYPALIGN_INT));
		values[5] = Int4Array(stripes, nclaimed);
		if ((RpDistributed() ? RpShardInsertClaims(act->id, values)	/* Citus: local shard */
			 : RpExec(&insert_claims, values, NULL, false, 0)) != SPI_OK_INSERT_RETURNING ||
			SPI_processed != (uint64) nclaimed)
			elog(ERROR, "could not insert the claims of a batch");
	}
	for (int i = 0, r = 0; i < n; i++)
	{
		e[i].out.scale = act->scale;
		if (claimed[i])
		{
			e[i].out.claim_id = RpGetInt64(r, IC_CLAIM_ID, 0);
			e[i].out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, IC_CLAIMED_AT, &isnull));
			r++;
		}
	}
	for (int i = 0; i < n; i++)
		if (e[i].dup_of >= 0)
		{
			BatchElem  *w = &e[e[i].dup_of];

			e[i].out.claim_id = w->out.claim_id;
			e[i].out.units = w->out.units;
			e[i].out.claimed_at = w->out.claimed_at;
		}
}

/*
 * One attempt at the whole batch, holding its user locks (and, with
 * all_held, every stripe): lock stripes, decide, write.  The claims the
 * users held were read once (ReadHeld) after their locks were taken: no
 * other transaction can change them while the batch waits for stripes.
 * Returns RP_TAKE_OK when every element has its answer, or, having written
 * nothing and holding no stripe it took, RP_TAKE_WAIT / RP_TAKE_GATHER with
 * the busy stripe in *wait_stripe.
 */
static RpTakeResult
BatchAttempt(int64 activity, BatchElem *e, int n, bool all_held, int *wait_stripe)
{
	RpActivity	act;
	RpStripeSet set;
	RpTakeResult r;

	(void) RpFetchActivity(activity, &act, false);
	RpStripeSetInit(&set, &act);
	r = LockAndDecide(&act, &set, e, n, RpStartStripe(&act), all_held, wait_stripe);
	if (r != RP_TAKE_OK)
		return r;
	RpStripeSetWrite(&set);
	WriteClaims(&act, e, n);
	return RP_TAKE_OK;
}

/*
 * The batch's locks on its users.  A batch of at most RP_BATCH_USER_LOCKS
 * distinct users locks them as single claims do: its buckets in shared mode,
 * then each user, so concurrent batches of different users do not wait for
 * each other.  A larger batch locks its buckets exclusively instead (at most
 * RP_USER_BUCKETS locks whatever its size).  Either way buckets are taken in
 * bucket order, then users in hash order (rule 3 in locks.c).
 */
#define RP_BATCH_USER_LOCKS 128

static int
CompareUint32(const void *a, const void *b)
{
	uint32		x = *(const uint32 *) a;
	uint32		y = *(const uint32 *) b;

	return (x > y) - (x < y);
}

/* The distinct buckets (and, for a small batch, users) of the batch. */
static void
FindUserLocks(RpUserLocks *bl, const BatchElem *e, int n)
{
	bool		used[RP_USER_BUCKETS] = {false};
	uint32	   *hashes = palloc(sizeof(uint32) * Max(n, 1));
	int			m = 0;

	bl->buckets = palloc(sizeof(uint32) * RP_USER_BUCKETS);
	bl->nbuckets = 0;
	for (int i = 0; i < n; i++)
	{
		used[e[i].req.user_hash % RP_USER_BUCKETS] = true;
		hashes[i] = e[i].req.user_hash;
	}
	for (uint32 b = 0; b < RP_USER_BUCKETS; b++)
		if (used[b])
			bl->buckets[bl->nbuckets++] = b;

	qsort(hashes, n, sizeof(uint32), CompareUint32);
	for (int i = 0; i < n; i++)
		if (i == 0 || hashes[i] != hashes[i - 1])
			hashes[m++] = hashes[i];
	bl->users = m <= RP_BATCH_USER_LOCKS ? hashes : NULL;
	bl->nusers = bl->users ? m : 0;
}

/*
 * A batch that must answer busy: the elements whose status comes before
 * busy in the order get it (read without the users' locks), the others
 * busy; nothing is written.
 */
static void
BatchBusy(const RpActivity *act, BatchElem *e, int n)
{
	ReadHeld(act, e, n);
	(void) Decide(act, NULL, 0, e, n, false);
	for (int i = 0; i < n; i++)
		e[i].out.scale = act->scale;
}

/*
 * Gather every stripe for the batch's last attempt (rule 4 in locks.c): a
 * batch that is not earlier gives back its user locks and slot and waits
 * holding nothing of the activity, then takes its user locks again (free
 * then).  False for busy, holding no user lock of its own.
 */
static bool
BatchGather(RpCall *call, const RpActivity *act, const RpUserLocks *bl, int *gate)
{
	if (!call->earlier)
	{
		RpUnlockUsers(bl);
		RpBatchGateLeave(act->id, *gate);
		*gate = -1;
	}
	if (!RpGatherBegin(call, act))
	{
		if (call->earlier)
			RpUnlockUsers(bl);
		return false;
	}
	if (!call->earlier)
		(void) RpLockUsers(bl);
	return true;
}

/*
 * The batch, by the protocol in locks.c: the activity lock, an admission
 * slot, the user locks in order (kept); then at most three attempts (the
 * slot, the user locks and the stripes written stay locked to the end of
 * the transaction; a batch that wrote no stripe gives the slot back).  The
 * first try-locks the stripes it needs.  If every stripe that could pay is
 * busy, wait for one (holding the user locks but no stripe) and try again
 * with it.  If every stripe is needed and one is busy (or the second
 * attempt fails too), gather (BatchGather); the claims of its users are
 * read again and the last attempt then cannot fail.  A wait refused for
 * busy gives back what the call took and answers busy.
 */
static void
ClaimBatch(const RpActivity *meta, BatchElem *e, int n)
{
	int64		activity = meta->id;
	RpUserLocks	bl;
	RpCall		call;
	int			gate = -1;
	int			wait_stripe;
	int			kept = -1;		/* stripe waited for, held for the next attempt */
	bool		all_held = false;
	bool		users_held = true;
	bool		wrote = false;
	RpActivity	act;
	RpTakeResult took;

	RpRequireLocalActivity(activity);	/* on Citus: our locks only work here */
	bl.activity = activity;
	FindUserLocks(&bl, e, n);
	FindRoots(e, n, true);
	FindRoots(e, n, false);

	if (!RpCallBegin(&call, activity) ||
		(gate = RpBatchGateEnter(meta, &call)) == RP_GATE_BUSY || !RpLockUsers(&bl))
	{
		RpBatchGateLeave(activity, gate);
		RpCallEnd(&call, false);
		BatchBusy(meta, e, n);
		return;
	}
	(void) RpFetchActivity(activity, &act, false);
	ReadHeld(&act, e, n);
	for (;;)
	{
		took = BatchAttempt(activity, e, n, all_held, &wait_stripe);
		/* the attempt took its own lock on any stripe it wrote */
		if (kept >= 0)
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
		if (took == RP_TAKE_OK)
			break;

		RpStatsCount(activity, RP_STAT_WAIT);
		if (took == RP_TAKE_WAIT && kept < 0)
		{
			if (!RpWaitLock(RP_LOCK_STRIPE, activity, (uint32) wait_stripe, ExclusiveLock))
				break;
			kept = wait_stripe;
		}
		else
		{
			users_held = BatchGather(&call, &act, &bl, &gate);
			if (!users_held)
				break;
			ReadHeld(&act, e, n);	/* the users' claims may have changed */
			RpStatsCount(activity, RP_STAT_GATHER);
			kept = -1;
			all_held = true;
		}
	}
	if (took != RP_TAKE_OK)
	{
		if (users_held)
			RpUnlockUsers(&bl);
		RpBatchGateLeave(activity, gate);
		RpCallEnd(&call, false);
		BatchBusy(&act, e, n);
		return;
	}
	if (all_held)
		RpGatherEnd(&call, &act);
	for (int i = 0; i < n; i++)
		wrote |= e[i].out.status == RP_CLAIMED;	/* it paid a claim: it wrote a stripe */
	if (!wrote)
		RpBatchGateLeave(activity, gate);
	RpCallEnd(&call, true);
}

/* Deconstruct an optional array argument, checking its length. */
static void
BatchArray(FunctionCallInfo fcinfo, int argno, Oid elemtype, int nelems,
		   const char *what, Datum **elems, bool **nulls)
{
	ArrayType  *arr;
	int			n;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	*elems = NULL;
	*nulls = NULL;
	if (PG_ARGISNULL(argno))
		return;
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign, elems, nulls, &n);
	if (nelems >= 0 && n != nelems)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s has %d elements but user_ids has %d", what, n, nelems),
				 errdetail("The arrays of one batch must have the same length.")));
}

/* The arguments of rp_claim_batch, one request per element. */
static BatchElem *
BatchRequests(const Datum *users, const Datum *amounts, const bool *amount_nulls,
			  const Datum *requests, const bool *request_nulls, int n)
{
	BatchElem  *e = palloc0(sizeof(BatchElem) * Max(n, 1));

	for (int i = 0; i < n; i++)
	{
		RpClaimRequest *r = &e[i].req;

		r->elem = i + 1;
		r->user_id = DatumGetTextPP(users[i]);
		r->amount = (amounts == NULL || amount_nulls[i]) ? NULL : DatumGetNumeric(amounts[i]);
		r->request_id = (requests == NULL || request_nulls[i]) ? NULL
			: DatumGetTextPP(requests[i]);
	}
	return e;
}

/*
 * Check every element and resolve it against the activity; bad input is
 * an error before anything is locked or written.
 */
static void
BatchResolve(int64 activity, BatchElem *e, int n, RpActivity *act)
{
	for (int i = 0; i < n; i++)
		RpCheckRequest(&e[i].req);
	/* amounts need the activity's scale; RpFetchActivity raises P0002 */
	(void) RpFetchActivity(activity, act, false);
	for (int i = 0; i < n; i++)
		RpResolveRequest(&e[i].req, act);
}

Datum
rp_claim_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int64		activity;
	Datum	   *users;
	bool	   *user_nulls;
	Datum	   *amounts;
	bool	   *amount_nulls;
	Datum	   *requests;
	bool	   *request_nulls;
	int			n = 0;
	Oid			statustype;
	BatchElem  *e;
	bool		busy_outer;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "user_ids");
	activity = PG_GETARG_INT64(0);
	/* a batch writes: on a standby or in a read-only transaction, say so first */
	PreventCommandIfReadOnly("rp_claim_batch()");

	InitMaterializedSRF(fcinfo, 0);
	statustype = TupleDescAttr(rsinfo->setDesc, 2)->atttypid;

	n = ArrayGetNItems(ARR_NDIM(PG_GETARG_ARRAYTYPE_P(1)), ARR_DIMS(PG_GETARG_ARRAYTYPE_P(1)));
	RpCheckBatchSize(n);
	BatchArray(fcinfo, 1, TEXTOID, -1, "user_ids", &users, &user_nulls);
	BatchArray(fcinfo, 2, NUMERICOID, n, "amounts", &amounts, &amount_nulls);
	BatchArray(fcinfo, 3, TEXTOID, n, "request_ids", &requests, &request_nulls);
	for (int i = 0; i < n; i++)
		if (user_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("user_ids[%d] must not be NULL", i + 1)));
	e = BatchRequests(users, amounts, amount_nulls, requests, request_nulls, n);

	busy_outer = RpBusyScope(false);
	PG_TRY();
	{
		RpActivity	act;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		(void) RpBusyScope(RpCatalogVersion() >= RP_CATALOG_1_4);
		if (IsolationUsesXactSnapshot())
			for (int i = 0; i < n; i++)
				RpClaimOne(activity, &e[i].req, &e[i].out);
		else
		{
			BatchResolve(activity, e, n, &act);
			if (n > 0)
				ClaimBatch(&act, e, n);
			for (int i = 0; i < n; i++)
				RpStatsCount(activity, e[i].out.status);
		}
		SPI_finish();
	}
	PG_CATCH();
	{
		(void) RpBusyScope(busy_outer);
		RpStatsCountFailure(activity);
		PG_RE_THROW();
	}
	PG_END_TRY();
	(void) RpBusyScope(busy_outer);

	for (int i = 0; i < n; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = users[i];
		RpOutcomeColumns(&e[i].out, statustype, values + 2, nulls + 2);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* rp_claim_batch as 1.4 declares it (a symbol a library older than 1.4 lacks). */
Datum
rp_claim_batch_v14(PG_FUNCTION_ARGS)
{
	return rp_claim_batch(fcinfo);
}
