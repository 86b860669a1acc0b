/*
 * batch.c
 *		rp_claim_batch: many claims on one activity in one call, with the same
 *		outcome, element by element, as calling rp_claim for each in array
 *		order.  Under READ COMMITTED it works set-wise: every element is
 *		validated before anything is locked or written, the users' locks are
 *		taken in hash order (so two batches never deadlock on them), one query
 *		finds the claims already held, the stripes are locked once for the whole
 *		batch, the elements are decided in memory in array order, and then one
 *		UPDATE decrements every stripe touched and one INSERT adds every claim.
 *		If the stripes first locked cannot pay an element, the decision is
 *		redone with every stripe locked, so no element is falsely exhausted.
 *		The user locks, once taken, are kept while the batch waits for
 *		stripes (at most twice a call; the argument is in locks.c).
 *		Under REPEATABLE READ or SERIALIZABLE each element takes the
 *		single-claim path.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_claim_batch);
PG_FUNCTION_INFO_V1(rp_claim_batch_v14);

typedef struct BatchElem
{
	text	   *user;
	text	   *request;		/* may be NULL */
	text	   *key;			/* idempotency key */
	int64		units;			/* fixed amount; 0 for a lucky draw */
	int64		asked;			/* units as asked: 0 for a lucky draw */
	uint32		user_hash;
	int			key_root;		/* first element with the same key */
	int			user_root;		/* first element with the same user */
	int64		held;			/* claims the user held before the batch */
	bool		existing;		/* out.* holds the claim held before the batch */
	int			dup_of;			/* element of this batch whose claim it repeats */
	RpOutcome	out;
} BatchElem;

typedef struct BatchStripes
{
	int			n;
	bool		all;			/* every stripe of the activity is locked */
	bool	   *locked;			/* locked by this batch */
	bool	   *halted;
	int64	   *balance;
	int64	   *packets;
	int64	   *avail_units;	/* balance less what is decided */
	int64	   *avail_packets;
	int64	   *plan_take;		/* the allocator's answer for one element */
	int64	   *take_units;		/* decided decrements */
	int64	   *take_packets;
	int64	   *take_claims;
} BatchStripes;

/*
 * One index probe per element: the LIMIT keeps the planner from turning
 * this into a join that reads the activity's whole claim history.  Both
 * are generic plans off Citus (RpPreparedOn): with a per-call plan each new
 * backend's first five calls read every claim of a new activity for every
 * element, which under 256 new callers was the batch collapse of issue 14.
 */
static RpPlan existing_claims = {
	"SELECT k.ord, c.claim_id, c.amount, c.claimed_at"
	"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]),"
	"                  pg_catalog.unnest($3::pg_catalog.text[]))"
	"       WITH ORDINALITY AS k(user_id, idem, ord)"
	"  CROSS JOIN LATERAL (SELECT c.claim_id, c.amount, c.claimed_at"
	"                        FROM redpacket.claim c"
	"                       WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"                         AND c.user_id OPERATOR(pg_catalog.=) k.user_id"
	"                         AND c.idempotency_key OPERATOR(pg_catalog.=) k.idem LIMIT 1) c",
	3, {INT8OID, TEXTARRAYOID, TEXTARRAYOID}, NULL, true
};

static RpPlan held_counts = {
	"SELECT k.ord, (SELECT pg_catalog.count(*) FROM redpacket.claim c"
	"                WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"                  AND c.user_id OPERATOR(pg_catalog.=) k.user_id)"
	"  FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY AS k(user_id, ord)",
	2, {INT8OID, TEXTARRAYOID}, NULL, true
};

static RpPlan read_stripes = {
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0), s.halted"
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND s.stripe OPERATOR(pg_catalog.=) ANY ($2)",
	2, {INT8OID, INT4ARRAYOID}
};

static RpPlan debit_stripes = {
	"UPDATE redpacket.stripe s"
	"   SET balance = s.balance OPERATOR(pg_catalog.-) d.units,"
	"       packets = s.packets OPERATOR(pg_catalog.-) d.packets,"
	"       claims = s.claims OPERATOR(pg_catalog.+) d.claims"
	"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]),"
	"                  pg_catalog.unnest($3::pg_catalog.int8[]),"
	"                  pg_catalog.unnest($4::pg_catalog.int4[]),"
	"                  pg_catalog.unnest($5::pg_catalog.int8[]))"
	"       AS d(stripe, units, packets, claims)"
	" WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.stripe OPERATOR(pg_catalog.=) d.stripe",
	5, {INT8OID, INT4ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID}
};

static RpPlan insert_claims = {
	"INSERT INTO redpacket.claim"
	"       (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
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
		uint64		h = e[i].user_hash;
		bool		found;
		char	   *entry;
		int			root = i;

		if (with_key)
			h = hash_combine64(h, hash_bytes_extended((const unsigned char *) VARDATA_ANY(e[i].key),
													  VARSIZE_ANY_EXHDR(e[i].key), 0));
		entry = hash_search(seen, &h, HASH_ENTER, &found);
		if (found)
		{
			int			first = *(int *) (entry + sizeof(uint64));

			if (TextEq(e[first].user, e[i].user) &&
				(!with_key || TextEq(e[first].key, e[i].key)))
				root = first;
			else
				for (int j = 0; j < i; j++)
					if (TextEq(e[j].user, e[i].user) && (!with_key || TextEq(e[j].key, e[i].key)))
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

static Datum
TextArray(BatchElem *e, int n, int which, const bool *include)
{
	Datum	   *d = palloc(sizeof(Datum) * n);
	bool	   *nulls = palloc(sizeof(bool) * n);
	int			m = 0;
	int			dims[1];
	int			lbs[1] = {1};

	for (int i = 0; i < n; i++)
	{
		text	   *t;

		if (include && !include[i])
			continue;
		t = which == 0 ? e[i].user : which == 1 ? e[i].request : e[i].key;
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

static Datum
Int8Array(const int64 *v, int m)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(m, 1));

	for (int i = 0; i < m; i++)
		d[i] = Int64GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, m, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* Read the balances of the stripes this batch has locked. */
static void
ReadStripes(const RpActivity *act, BatchStripes *st)
{
	int32	   *ids = palloc(sizeof(int32) * st->n);
	int			m = 0;
	Datum		values[2];
	bool		isnull;

	for (int s = 0; s < st->n; s++)
	{
		st->balance[s] = st->packets[s] = 0;
		st->halted[s] = false;
		if (st->locked[s])
			ids[m++] = s;
	}
	values[0] = Int64GetDatum(act->id);
	values[1] = Int4Array(ids, m);
	if (RpExec(&read_stripes, values, NULL, false, 0) != SPI_OK_SELECT ||
		SPI_processed != (uint64) m)
		elog(ERROR, "could not read the stripes of activity " INT64_FORMAT, act->id);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int			s = DatumGetInt32(RpGetDatum(r, 1, &isnull));

		st->balance[s] = RpGetInt64(r, 2, 0);
		st->packets[s] = RpGetInt64(r, 3, 0);
		st->halted[s] = DatumGetBool(RpGetDatum(r, 4, &isnull));
	}
}

/*
 * Lock every stripe, giving up the partial set first.  Returns false,
 * holding none of them, when one is busy (*busy).
 */
static bool
LockAll(const RpActivity *act, BatchStripes *st, int *busy)
{
	for (int s = 0; s < st->n; s++)
		if (st->locked[s])
		{
			RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
			st->locked[s] = false;
		}
	if (!RpTryLockAllStripes(act, busy))
		return false;
	for (int s = 0; s < st->n; s++)
		st->locked[s] = true;
	st->all = true;
	return true;
}

/*
 * A freeze or close marks every stripe while holding every stripe lock: if
 * a stripe we hold is marked, one committed since the activity was read.
 */
static void
CheckHalted(RpActivity *act, const BatchStripes *st)
{
	for (int s = 0; s < st->n; s++)
		if (st->locked[s] && st->halted[s])
		{
			RpActivity	fresh;

			(void) RpFetchActivity(act->id, &fresh, false);
			act->frozen = fresh.frozen;
			act->closed = fresh.closed;
			return;
		}
}

/*
 * Decide one element's payment with the allocator, over the stripes held
 * and what earlier elements left in them.  Returns the allocator's answer;
 * on RP_PLAN_PAID the element's take is added to the batch's.
 */
static RpPlanResult
Allocate(const RpActivity *act, BatchStripes *st, int start, BatchElem *e, int *paid_by)
{
	RpPlanIn	in;
	RpPlanOut	out;
	RpPlanResult r;

	in.n = st->n;
	in.balance = st->avail_units;
	in.packets = st->avail_packets;
	in.visible = st->all ? NULL : st->locked;
	in.capped = act->packets != 0;
	in.start = start;
	in.units = e->units;
	in.draw = RpDrawUnits;
	out.take = st->plan_take;
	r = RpPlanClaim(&in, &out);
	if (r != RP_PLAN_PAID)
		return r;
	for (int s = 0; s < st->n; s++)
	{
		st->take_units[s] += out.take[s];
		st->avail_units[s] -= out.take[s];
	}
	if (act->packets != 0)
	{
		st->take_packets[out.primary] += 1;
		st->avail_packets[out.primary] -= 1;
	}
	st->take_claims[out.primary] += 1;
	e->units = out.units;
	*paid_by = out.primary;
	return RP_PLAN_PAID;
}

/* The status an element gets before any money is looked at, or -1. */
static int
ElemStatus(const RpActivity *act, const BatchElem *x, const int64 *taken)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	if (act->frozen)
		return RP_FROZEN;
	if (now < act->starts_at)
		return RP_NOT_STARTED;
	if (act->closed || now >= act->ends_at)
		return RP_ENDED;
	if (act->per_user_limit > 1 && x->held + taken[x->user_root] >= act->per_user_limit)
		return RP_USER_LIMIT;
	return -1;
}

/*
 * Decide every element in array order.  Returns false when an element
 * could not be paid by a partial set of stripes (the caller then locks
 * them all and decides again).
 */
static bool
Decide(const RpActivity *act, BatchStripes *st, int start, BatchElem *e, int n,
	   int *paid_by)
{
	int		   *winner = palloc(sizeof(int) * n);
	int64	   *taken = palloc0(sizeof(int64) * n);

	for (int s = 0; s < st->n; s++)
	{
		st->take_units[s] = st->take_packets[s] = st->take_claims[s] = 0;
		st->avail_units[s] = st->balance[s];
		st->avail_packets[s] = st->packets[s];
	}
	for (int i = 0; i < n; i++)
	{
		winner[i] = -1;
		e[i].dup_of = -1;
		paid_by[i] = -1;
		e[i].units = e[i].asked;
	}

	for (int i = 0; i < n; i++)
	{
		BatchElem  *x = &e[i];
		int			status;

		if (x->existing)
			continue;			/* duplicate of a claim held before */
		if (winner[x->key_root] >= 0)
		{
			x->dup_of = winner[x->key_root];
			x->out.status = RP_DUPLICATE;
			continue;
		}
		status = ElemStatus(act, x, taken);
		if (status >= 0)
			x->out.status = (RpStatus) status;
		else
			switch (Allocate(act, st, start, x, &paid_by[i]))
			{
				case RP_PLAN_PAID:
					x->out.status = RP_CLAIMED;
					winner[x->key_root] = i;
					taken[x->user_root]++;
					break;
				case RP_PLAN_NEED_ALL:
					return false;
				case RP_PLAN_EXHAUSTED:
					x->out.status = RP_EXHAUSTED;
					break;
			}
	}
	return true;
}

/* Read the claims the batch's keys already hold, and the users' counts. */
static void
ReadHeld(const RpActivity *act, BatchElem *e, int n)
{
	Datum		values[3];
	bool		isnull;

	for (int i = 0; i < n; i++)
	{
		e[i].existing = false;
		e[i].held = 0;
		memset(&e[i].out, 0, sizeof(e[i].out));
	}
	values[0] = Int64GetDatum(act->id);
	values[1] = TextArray(e, n, 0, NULL);
	values[2] = TextArray(e, n, 2, NULL);
	if (RpExecOn(&existing_claims, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look up existing claims");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		BatchElem  *x = &e[RpGetInt64(r, 1, 0) - 1];

		x->existing = true;
		x->out.status = RP_DUPLICATE;
		x->out.claim_id = RpGetInt64(r, 2, 0);
		x->out.units = RpAmountToUnits(DatumGetNumeric(RpGetDatum(r, 3, &isnull)),
									   act->scale, "amount");
		x->out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, 4, &isnull));
	}
	if (act->per_user_limit > 1)
	{
		if (RpExecOn(&held_counts, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not count claims");
		for (uint64 r = 0; r < SPI_processed; r++)
			e[RpGetInt64(r, 1, 0) - 1].held = RpGetInt64(r, 2, 0);
	}
}

static void
InitStripes(BatchStripes *st, int n)
{
	st->n = n;
	st->all = false;
	st->locked = palloc0(sizeof(bool) * n);
	st->halted = palloc0(sizeof(bool) * n);
	st->balance = palloc0(sizeof(int64) * n);
	st->packets = palloc0(sizeof(int64) * n);
	st->avail_units = palloc0(sizeof(int64) * n);
	st->avail_packets = palloc0(sizeof(int64) * n);
	st->plan_take = palloc0(sizeof(int64) * n);
	st->take_units = palloc0(sizeof(int64) * n);
	st->take_packets = palloc0(sizeof(int64) * n);
	st->take_claims = palloc0(sizeof(int64) * n);
}

/*
 * Lock as few stripes as cover the batch: guess from balances read without
 * locks, try-lock in spread order until the guess covers it.  Returns false,
 * holding none, when every stripe that could pay was busy (*wait_stripe:
 * the first in spread order, so that waiters fan out).
 */
static bool
LockSome(const RpActivity *act, BatchStripes *st, const BatchElem *e, int n,
		 int start, int *wait_stripe)
{
	int64		want_units = 0;
	int64		want_packets = 0;
	int64		have_units = 0;
	int64		have_packets = 0;
	int			first = -1;

	for (int i = 0; i < n; i++)
		if (!e[i].existing)
		{
			want_units += e[i].asked > 0 ? e[i].asked : 1;
			want_packets++;
		}
	for (int s = 0; s < st->n; s++)
		st->locked[s] = true;
	ReadStripes(act, st);
	for (int s = 0; s < st->n; s++)
		st->locked[s] = false;
	for (int i = 0; i < st->n; i++)
	{
		int			s = (start + i) % st->n;

		if (have_units >= want_units && (act->packets == 0 || have_packets >= want_packets))
			break;
		if (st->balance[s] <= 0 || (act->packets != 0 && st->packets[s] <= 0))
			continue;
		if (first < 0)
			first = s;
		if (!RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, false))
			continue;
		st->locked[s] = true;
		have_units += st->balance[s];
		have_packets += st->packets[s];
	}
	if (have_units == 0 && first >= 0)
	{
		*wait_stripe = first;
		return false;
	}
	return true;
}

/* Some element may be paid: not all held already, and the activity runs. */
static bool
MayPay(const RpActivity *act, const BatchElem *e, int n)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	bool		any = false;

	for (int i = 0; i < n && !any; i++)
		any = !e[i].existing;
	return any && !act->frozen && !act->closed && now >= act->starts_at && now < act->ends_at;
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
LockAndDecide(RpActivity *act, BatchStripes *st, BatchElem *e, int n, int start,
			  bool all_held, int *paid_by, int *wait_stripe)
{
	if (all_held)
	{
		for (int s = 0; s < st->n; s++)
			st->locked[s] = true;
		st->all = true;
	}
	else if (MayPay(act, e, n))
	{
		if (!LockSome(act, st, e, n, start, wait_stripe))
			return RP_TAKE_WAIT;
	}
	if (all_held || MayPay(act, e, n))
	{
		ReadStripes(act, st);
		CheckHalted(act, st);	/* a freeze or close may have won the race */
	}
	if (Decide(act, st, start, e, n, paid_by))
		return RP_TAKE_OK;
	if (all_held)
		elog(ERROR, "batch could not be decided with every stripe locked");

	if (!LockAll(act, st, wait_stripe))
		return RP_TAKE_GATHER;
	RpStatsCount(act->id, RP_STAT_GATHER);
	ReadStripes(act, st);
	CheckHalted(act, st);
	if (!Decide(act, st, start, e, n, paid_by))
		elog(ERROR, "batch could not be decided with every stripe locked");
	return RP_TAKE_OK;
}

/* One UPDATE over the stripes touched; unlock the stripes not touched. */
static int
WriteStripes(const RpActivity *act, BatchStripes *st)
{
	int32	   *ids = palloc(sizeof(int32) * st->n);
	int64	   *units = palloc(sizeof(int64) * st->n);
	int32	   *pks = palloc(sizeof(int32) * st->n);
	int64	   *cls = palloc(sizeof(int64) * st->n);
	Datum		values[5];
	int			m = 0;

	for (int s = 0; s < st->n; s++)
		if (st->take_claims[s] > 0 || st->take_units[s] > 0)
		{
			ids[m] = s;
			units[m] = st->take_units[s];
			pks[m] = (int32) st->take_packets[s];
			cls[m] = st->take_claims[s];
			m++;
		}
		else if (st->locked[s])
			RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
	if (m == 0)
		return m;
	values[0] = Int64GetDatum(act->id);
	values[1] = Int4Array(ids, m);
	values[2] = Int8Array(units, m);
	values[3] = Int4Array(pks, m);
	values[4] = Int8Array(cls, m);
	if (RpExec(&debit_stripes, values, NULL, false, 0) != SPI_OK_UPDATE ||
		SPI_processed != (uint64) m)
		elog(ERROR, "could not update the stripes of activity " INT64_FORMAT, act->id);
	RpRememberStripe(act, ids[m - 1]);
	return m;
}

/* One INSERT for the claims decided, and every element's answer. */
static void
WriteClaims(const RpActivity *act, BatchElem *e, int n, const int *paid_by)
{
	bool	   *claimed = palloc0(sizeof(bool) * n);
	Datum	   *ad = palloc(sizeof(Datum) * n);
	int32	   *stripes = palloc(sizeof(int32) * n);
	int			nclaimed = 0;
	Datum		values[6];
	bool		isnull;

	for (int i = 0; i < n; i++)
		if (e[i].out.status == RP_CLAIMED && e[i].dup_of < 0 && !e[i].existing)
		{
			claimed[i] = true;
			ad[nclaimed] = NumericGetDatum(RpUnitsToAmount(e[i].units, act->scale));
			stripes[nclaimed] = paid_by[i];
			nclaimed++;
		}
	if (nclaimed > 0)
	{
		values[0] = Int64GetDatum(act->id);
		values[1] = TextArray(e, n, 0, claimed);
		values[2] = TextArray(e, n, 1, claimed);
		values[3] = TextArray(e, n, 2, claimed);
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
			e[i].out.claim_id = RpGetInt64(r, 1, 0);
			e[i].out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, 2, &isnull));
			r++;
		}
		if (e[i].out.status == RP_CLAIMED)
			e[i].out.units = e[i].units;
		else if (e[i].dup_of >= 0)
		{
			BatchElem  *w = &e[e[i].dup_of];

			e[i].out.claim_id = w->out.claim_id;
			e[i].out.units = w->units;
			e[i].out.claimed_at = w->out.claimed_at;
		}
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
	BatchStripes st;
	int		   *paid_by = palloc(sizeof(int) * n);
	RpTakeResult r;

	(void) RpFetchActivity(activity, &act, false);
	InitStripes(&st, act.stripes);
	r = LockAndDecide(&act, &st, e, n, RpStartStripe(&act), all_held, paid_by, wait_stripe);
	if (r != RP_TAKE_OK)
		return r;
	(void) WriteStripes(&act, &st);
	WriteClaims(&act, e, n, paid_by);
	return RP_TAKE_OK;
}

/*
 * The batch's locks on its users.  A batch of at most RP_BATCH_USER_LOCKS
 * distinct users locks them as single claims do: its buckets in shared mode,
 * then each user, so concurrent batches of different users do not wait for
 * each other.  A larger batch locks its buckets exclusively instead (at most
 * RP_USER_BUCKETS locks whatever its size).  Either way buckets are taken in
 * bucket order, then users in hash order (rule 2 in locks.c).
 */
#define RP_BATCH_USER_LOCKS 128

typedef struct BatchLocks
{
	int64		activity;
	uint32	   *buckets;		/* distinct, ascending */
	int			nbuckets;
	uint32	   *users;			/* distinct user hashes, ascending; NULL: exclusive buckets */
	int			nusers;
} BatchLocks;

static LOCKMODE
BucketMode(const BatchLocks *bl)
{
	return bl->users ? RowExclusiveLock : ExclusiveLock;
}

/*
 * Wait for every user lock in order: buckets in bucket order, then users in
 * hash order (rule 2 in locks.c).  They are kept to the end of the
 * transaction: a batch never gives them back.
 */
static void
LockUsers(const BatchLocks *bl)
{
	for (int i = 0; i < bl->nbuckets; i++)
		RpWaitLock(RP_LOCK_BUCKET, bl->activity, bl->buckets[i], BucketMode(bl));
	for (int i = 0; i < bl->nusers; i++)
		RpWaitLock(RP_LOCK_USER, bl->activity, bl->users[i], ExclusiveLock);
}

static int
CompareUint32(const void *a, const void *b)
{
	uint32		x = *(const uint32 *) a;
	uint32		y = *(const uint32 *) b;

	return (x > y) - (x < y);
}

/* The distinct buckets (and, for a small batch, users) of the batch. */
static void
FindUserLocks(BatchLocks *bl, const BatchElem *e, int n)
{
	bool		used[RP_USER_BUCKETS] = {false};
	uint32	   *hashes = palloc(sizeof(uint32) * n);
	int			m = 0;

	bl->buckets = palloc(sizeof(uint32) * RP_USER_BUCKETS);
	bl->nbuckets = 0;
	for (int i = 0; i < n; i++)
	{
		used[e[i].user_hash % RP_USER_BUCKETS] = true;
		hashes[i] = e[i].user_hash;
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
 * The batch, by the protocol in locks.c: take an admission slot (rule 0),
 * wait for the user locks in order and keep them; then at most three
 * attempts (the slot, the user locks and the stripes written stay locked to
 * the end of the transaction; a batch that wrote no stripe gives the slot
 * back).  The first try-locks the
 * stripes it needs.  If every stripe that could pay is busy, wait for one
 * (holding the user locks but no stripe) and try again with it.  If every
 * stripe is needed and one is busy (or the second attempt fails too), let
 * go of the stripes and wait for every stripe in stripe order, still
 * holding the user locks; the last attempt then cannot fail.
 */
static void
ClaimBatch(const RpActivity *meta, BatchElem *e, int n)
{
	int64		activity = meta->id;
	BatchLocks	bl;
	int			gate;
	int			wait_stripe;
	int			kept = -1;		/* stripe waited for, held for the next attempt */
	bool		all_held = false;
	bool		wrote = false;
	RpActivity	act;
	RpTakeResult took;

	RpRequireLocalActivity(activity);	/* on Citus: our locks only work here */
	bl.activity = activity;
	FindUserLocks(&bl, e, n);
	FindRoots(e, n, true);
	FindRoots(e, n, false);

	gate = RpBatchGateEnter(meta);	/* rule 0: one lock while waiting its turn */
	LockUsers(&bl);
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
			RpWaitLock(RP_LOCK_STRIPE, activity, (uint32) wait_stripe, ExclusiveLock);
			kept = wait_stripe;
		}
		else
		{
			RpWaitAllStripes(&act);
			RpStatsCount(activity, RP_STAT_GATHER);
			kept = -1;
			all_held = true;
		}
	}
	for (int i = 0; i < n; i++)
		if (e[i].out.status == RP_CLAIMED && e[i].dup_of < 0 && !e[i].existing)
			wrote = true;		/* it paid a claim: it wrote a stripe */
	if (!wrote)
		RpBatchGateLeave(activity, gate);
	RpNoteHeld(activity);
	for (int i = 0; i < n; i++)
		RpStatsCount(activity, e[i].out.status);
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

/*
 * Validate every element and fill in what the attempts need; bad input is
 * an error before anything is locked or written.
 */
static void
BatchElems(int64 activity, const Datum *users, const Datum *amounts, const bool *amount_nulls,
		   const Datum *requests, const bool *request_nulls, BatchElem *e, int n,
		   RpActivity *out)
{
	RpActivity	act;

	for (int i = 0; i < n; i++)
	{
		e[i].user = DatumGetTextPP(users[i]);
		e[i].request = (requests == NULL || request_nulls[i]) ? NULL : DatumGetTextPP(requests[i]);
		RpCheckUserId(e[i].user);
		RpCheckRequestId(e[i].request);
	}
	/* amounts need the activity's scale; RpFetchActivity raises P0002 */
	(void) RpFetchActivity(activity, &act, false);
	for (int i = 0; i < n; i++)
	{
		if (amounts != NULL && !amount_nulls[i])
			e[i].asked = RpAmountToUnits(DatumGetNumeric(amounts[i]), act.scale, "amount");
		else if (act.packets == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("amounts[%d] must be given for activity " INT64_FORMAT, i + 1, activity),
					 errdetail("A lucky draw (amount NULL) needs an activity created with packets.")));
		else
			e[i].asked = 0;
		if (act.per_user_limit > 1 && e[i].request == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("request_ids[%d] is required for activity " INT64_FORMAT, i + 1, activity),
					 errdetail("The activity allows %d claims per user, so each claim is identified by its request_id.",
							   act.per_user_limit)));
		e[i].key = act.per_user_limit == 1 ? cstring_to_text("") : e[i].request;
		e[i].user_hash = RpUserHash(e[i].user);
	}
	*out = act;
}

/* Every element through the single-claim path (REPEATABLE READ, SERIALIZABLE). */
static void
ClaimEach(int64 activity, const Datum *users, const Datum *amounts, const bool *amount_nulls,
		  const Datum *requests, const bool *request_nulls, BatchElem *e, int n)
{
	for (int i = 0; i < n; i++)
		RpClaimOne(activity, DatumGetTextPP(users[i]),
				   (amounts == NULL || amount_nulls[i]) ? NULL : DatumGetNumeric(amounts[i]),
				   (requests == NULL || request_nulls[i]) ? NULL : DatumGetTextPP(requests[i]),
				   &e[i].out);
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

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "user_ids");
	activity = PG_GETARG_INT64(0);

	InitMaterializedSRF(fcinfo, 0);
	statustype = TupleDescAttr(rsinfo->setDesc, 2)->atttypid;

	n = ArrayGetNItems(ARR_NDIM(PG_GETARG_ARRAYTYPE_P(1)), ARR_DIMS(PG_GETARG_ARRAYTYPE_P(1)));
	RpCheckBatchSize(n);
	BatchArray(fcinfo, 1, TEXTOID, -1, "user_ids", &users, &user_nulls);
	BatchArray(fcinfo, 2, NUMERICOID, n, "amounts", &amounts, &amount_nulls);
	BatchArray(fcinfo, 3, TEXTOID, n, "request_ids", &requests, &request_nulls);

	e = palloc0(sizeof(BatchElem) * Max(n, 1));
	for (int i = 0; i < n; i++)
		if (user_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("user_ids[%d] must not be NULL", i + 1)));

	PG_TRY();
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (IsolationUsesXactSnapshot())
			ClaimEach(activity, users, amounts, amount_nulls, requests, request_nulls, e, n);
		else if (n > 0)
		{
			RpActivity	act;

			BatchElems(activity, users, amounts, amount_nulls, requests, request_nulls, e, n,
					   &act);
			ClaimBatch(&act, e, n);
		}
		else
			(void) RpFetchActivity(activity, &(RpActivity) {0}, false);
		SPI_finish();
	}
	PG_CATCH();
	{
		RpStatsCount(activity, RP_STAT_ERROR);
		PG_RE_THROW();
	}
	PG_END_TRY();

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
