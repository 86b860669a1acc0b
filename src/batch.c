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

typedef struct BatchElem
{
	text	   *user;
	text	   *request;		/* may be NULL */
	text	   *key;			/* idempotency key */
	int64		units;			/* fixed amount; 0 for a lucky draw */
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
	int64	   *take_units;		/* decided decrements */
	int64	   *take_packets;
	int64	   *take_claims;
} BatchStripes;

/*
 * One index probe per element: the LIMIT keeps the planner from turning
 * this into a join that reads the activity's whole claim history.
 */
static RpPlan existing_claims = {
	"SELECT k.ord, c.claim_id, c.amount, c.claimed_at"
	"  FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS k(user_id, idem, ord)"
	"  CROSS JOIN LATERAL (SELECT c.claim_id, c.amount, c.claimed_at"
	"                        FROM redpacket.claim c"
	"                       WHERE c.activity_id = $1 AND c.user_id = k.user_id"
	"                         AND c.idempotency_key = k.idem LIMIT 1) c",
	3, {INT8OID, TEXTARRAYOID, TEXTARRAYOID}
};

static RpPlan held_counts = {
	"SELECT k.ord, (SELECT count(*) FROM redpacket.claim c"
	"                WHERE c.activity_id = $1 AND c.user_id = k.user_id)"
	"  FROM unnest($2::text[]) WITH ORDINALITY AS k(user_id, ord)",
	2, {INT8OID, TEXTARRAYOID}
};

static RpPlan read_stripes = {
	"SELECT s.stripe, s.balance, coalesce(s.packets, 0), s.halted"
	"  FROM redpacket.stripe s WHERE s.activity_id = $1 AND s.stripe = ANY ($2)",
	2, {INT8OID, INT4ARRAYOID}
};

static RpPlan debit_stripes = {
	"UPDATE redpacket.stripe s"
	"   SET balance = s.balance - d.units, packets = s.packets - d.packets,"
	"       claims = s.claims + d.claims"
	"  FROM unnest($2::integer[], $3::bigint[], $4::integer[], $5::bigint[])"
	"       AS d(stripe, units, packets, claims)"
	" WHERE s.activity_id = $1 AND s.stripe = d.stripe",
	5, {INT8OID, INT4ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID}
};

static RpPlan insert_claims = {
	"INSERT INTO redpacket.claim"
	"       (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)"
	" SELECT $1, k.user_id, k.request_id, k.idem, k.amount, k.stripe, now()"
	"   FROM unnest($2::text[], $3::text[], $4::text[], $5::numeric[], $6::integer[])"
	"        WITH ORDINALITY AS k(user_id, request_id, idem, amount, stripe, ord)"
	"  ORDER BY k.ord"
	" RETURNING claim_id, claimed_at",
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

static int
CompareUint32(const void *a, const void *b)
{
	uint32		x = *(const uint32 *) a;
	uint32		y = *(const uint32 *) b;

	return (x > y) - (x < y);
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
 * Give up the partial set and lock every stripe.  Returns false, holding
 * none of them, when one is busy (*busy).
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
	ReadStripes(act, st);
	return true;
}

/*
 * Decide one element's payment against the stripes in memory, as a single
 * claim would: one stripe that can pay it all, else several (largest
 * first) with the packet from one that has packets.  Returns false when the
 * locked stripes cannot pay.
 */
static bool
Allocate(const RpActivity *act, BatchStripes *st, int start, BatchElem *e, int *paid_by)
{
	int			n = st->n;
	int			primary = -1;
	int64		units = e->units;
	int64		total = 0;

	for (int i = 0; i < n && primary < 0; i++)
	{
		int			s = (start + i) % n;
		int64		bal = st->balance[s] - st->take_units[s];
		int64		pk = st->packets[s] - st->take_packets[s];

		if (!st->locked[s])
			continue;
		if (units == 0 ? (pk > 0 && bal > 0)
			: (bal >= units && (act->packets == 0 || pk > 0)))
			primary = s;
	}

	if (units == 0)
	{
		if (primary < 0)
			return false;
		units = RpDrawUnits(st->balance[primary] - st->take_units[primary],
							st->packets[primary] - st->take_packets[primary]);
		e->units = units;
		st->take_units[primary] += units;
	}
	else if (primary >= 0)
		st->take_units[primary] += units;
	else
	{
		int64		left = units;

		for (int s = 0; s < n; s++)
			if (st->locked[s])
			{
				total += st->balance[s] - st->take_units[s];
				if (primary < 0 && (act->packets == 0 ? st->balance[s] - st->take_units[s] > 0
									: st->packets[s] - st->take_packets[s] > 0))
					primary = s;
			}
		if (primary < 0 || total < units)
			return false;
		while (left > 0)
		{
			int			best = -1;
			int64		more;

			for (int s = 0; s < n; s++)
				if (st->locked[s] && st->balance[s] > st->take_units[s] &&
					(best < 0 || st->balance[s] - st->take_units[s] >
					 st->balance[best] - st->take_units[best]))
					best = s;
			more = Min(st->balance[best] - st->take_units[best], left);
			st->take_units[best] += more;
			left -= more;
		}
	}
	if (act->packets != 0)
		st->take_packets[primary] += 1;
	st->take_claims[primary] += 1;
	*paid_by = primary;
	return true;
}

/*
 * Decide every element in array order.  Returns false when an element
 * could not be paid by a partial set of stripes (the caller then locks
 * them all and decides again).
 */
static bool
Decide(const RpActivity *act, BatchStripes *st, int start, BatchElem *e, int n,
	   bool halted_frozen, bool halted_closed, int *paid_by, int64 *lucky_in)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int		   *winner = palloc(sizeof(int) * n);
	int64	   *taken = palloc0(sizeof(int64) * n);

	for (int s = 0; s < st->n; s++)
		st->take_units[s] = st->take_packets[s] = st->take_claims[s] = 0;

	for (int i = 0; i < n; i++)
	{
		winner[i] = -1;
		e[i].dup_of = -1;
		paid_by[i] = -1;
		e[i].units = lucky_in[i];
	}

	for (int i = 0; i < n; i++)
	{
		BatchElem  *x = &e[i];

		if (x->existing)
			continue;			/* duplicate of a claim held before */
		if (winner[x->key_root] >= 0)
		{
			x->dup_of = winner[x->key_root];
			x->out.status = RP_DUPLICATE;
			continue;
		}
		if (act->frozen || halted_frozen)
			x->out.status = RP_FROZEN;
		else if (now < act->starts_at)
			x->out.status = RP_NOT_STARTED;
		else if (act->closed || halted_closed || now >= act->ends_at)
			x->out.status = RP_ENDED;
		else if (act->per_user_limit > 1 &&
				 x->held + taken[x->user_root] >= act->per_user_limit)
			x->out.status = RP_USER_LIMIT;
		else if (Allocate(act, st, start, x, &paid_by[i]))
		{
			x->out.status = RP_CLAIMED;
			winner[x->key_root] = i;
			taken[x->user_root]++;
		}
		else if (!st->all)
			return false;
		else
			x->out.status = RP_EXHAUSTED;
	}
	return true;
}

static void
ClaimBatch(int64 activity, BatchElem *e, int n)
{
	RpActivity	act;
	BatchStripes st;
	uint32	   *hashes = palloc(sizeof(uint32) * Max(n, 1));
	int		   *paid_by = palloc(sizeof(int) * Max(n, 1));
	int64	   *lucky_in = palloc(sizeof(int64) * Max(n, 1));
	bool	   *claimed = palloc0(sizeof(bool) * Max(n, 1));
	Datum		values[6];
	bool		isnull;
	int			start;
	int			nclaimed = 0;
	int64		want_units = 0;
	int64		want_packets = 0;
	bool		halted_frozen = false;
	bool		halted_closed = false;
	int			wait_stripe;
	int			kept = -1;		/* stripe waited for, held for this attempt */

	/* Bad input first, before any lock or write. */
	for (int i = 0; i < n; i++)
		RpCheckUserId(e[i].user);
	(void) RpFetchActivity(activity, &act, false);
	for (int i = 0; i < n; i++)
	{
		if (e[i].units < 0)
		{
			if (act.packets == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("amounts[%d] must be given for activity " INT64_FORMAT, i + 1, activity),
						 errdetail("A lucky draw (amount NULL) needs an activity created with packets.")));
			e[i].units = 0;
		}
		if (act.per_user_limit > 1 && e[i].request == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("request_ids[%d] is required for activity " INT64_FORMAT, i + 1, activity),
					 errdetail("The activity allows %d claims per user, so each claim is identified by its request_id.",
							   act.per_user_limit)));
		e[i].key = act.per_user_limit == 1 ? cstring_to_text("") : e[i].request;
		e[i].user_hash = RpUserHash(e[i].user);
		hashes[i] = e[i].user_hash;
		lucky_in[i] = e[i].units;
	}

	qsort(hashes, n, sizeof(uint32), CompareUint32);
	FindRoots(e, n, true);
	FindRoots(e, n, false);

	/*
	 * Each attempt takes the users' locks in hash order and reads everything
	 * again.  An attempt that finds a stripe busy has written nothing: it
	 * gives back its locks and waits for that stripe before the next one
	 * (see "Deadlock avoidance" in stripe.c).
	 */
retry:
	for (int i = 0; i < n; i++)
		if (i == 0 || hashes[i] != hashes[i - 1])
			(void) RpLock(RP_LOCK_USER, activity, hashes[i], true);
retry_locked:
	(void) RpFetchActivity(activity, &act, false);
	for (int i = 0; i < n; i++)
	{
		e[i].existing = false;
		e[i].held = 0;
		memset(&e[i].out, 0, sizeof(e[i].out));
	}
	want_units = want_packets = 0;
	halted_frozen = halted_closed = false;

	values[0] = Int64GetDatum(activity);
	values[1] = TextArray(e, n, 0, NULL);
	values[2] = TextArray(e, n, 2, NULL);
	if (RpExec(&existing_claims, values, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look up existing claims");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		BatchElem  *x = &e[RpGetInt64(r, 1, 0) - 1];

		x->existing = true;
		x->out.status = RP_DUPLICATE;
		x->out.claim_id = RpGetInt64(r, 2, 0);
		x->out.units = RpAmountToUnits(DatumGetNumeric(RpGetDatum(r, 3, &isnull)),
									   act.scale, "amount");
		x->out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, 4, &isnull));
	}
	if (act.per_user_limit > 1)
	{
		if (RpExec(&held_counts, values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not count claims");
		for (uint64 r = 0; r < SPI_processed; r++)
			e[RpGetInt64(r, 1, 0) - 1].held = RpGetInt64(r, 2, 0);
	}

	/* What the batch may need at most, to pick enough stripes. */
	for (int i = 0; i < n; i++)
		if (!e[i].existing)
		{
			want_units += e[i].units > 0 ? e[i].units : 1;
			want_packets++;
		}

	st.n = act.stripes;
	st.all = false;
	st.locked = palloc0(sizeof(bool) * st.n);
	st.halted = palloc0(sizeof(bool) * st.n);
	st.balance = palloc0(sizeof(int64) * st.n);
	st.packets = palloc0(sizeof(int64) * st.n);
	st.take_units = palloc0(sizeof(int64) * st.n);
	st.take_packets = palloc0(sizeof(int64) * st.n);
	st.take_claims = palloc0(sizeof(int64) * st.n);
	start = RpStartStripe(&act);

	/* Stripes only when some element may be paid. */
	if (want_packets > 0 && !act.frozen && !act.closed &&
		GetCurrentTransactionStartTimestamp() >= act.starts_at &&
		GetCurrentTransactionStartTimestamp() < act.ends_at)
	{
		int64		have_units = 0;
		int64		have_packets = 0;
		int			first = -1;
		bool		covered = false;

		/*
		 * Lock as few stripes as cover the batch: guess from balances read
		 * without locks, try-lock in spread order until the guess covers it,
		 * then read the locked ones exactly.  Wait (on the first stripe in
		 * spread order) only when every stripe was busy; lock them all when
		 * still short.
		 */
		for (int s = 0; s < st.n; s++)
			st.locked[s] = true;
		ReadStripes(&act, &st);
		for (int s = 0; s < st.n; s++)
			st.locked[s] = false;
		for (int i = 0; i < st.n && !covered; i++)
		{
			int			s = (start + i) % st.n;

			if (st.balance[s] <= 0 || (act.packets != 0 && st.packets[s] <= 0))
				continue;
			if (first < 0)
				first = s;		/* the first in spread order: waiters fan out */
			if (!RpLock(RP_LOCK_STRIPE, activity, (uint32) s, false))
				continue;
			st.locked[s] = true;
			have_units += st.balance[s];
			have_packets += st.packets[s];
			covered = have_units >= want_units &&
				(act.packets == 0 || have_packets >= want_packets);
		}
		if (!covered && have_units == 0 && first >= 0)
		{
			wait_stripe = first;
			goto wait;
		}
		ReadStripes(&act, &st);
		have_units = have_packets = 0;
		for (int s = 0; s < st.n; s++)
		{
			have_units += st.balance[s];
			have_packets += st.packets[s];
		}
		if ((have_units < want_units || (act.packets != 0 && have_packets < want_packets)) &&
			!LockAll(&act, &st, &wait_stripe))
			goto wait;

		for (int s = 0; s < st.n; s++)
			if (st.locked[s] && st.halted[s])
			{
				/* frozen or closed since the activity was read */
				(void) RpFetchActivity(activity, &act, false);
				halted_frozen = act.frozen;
				halted_closed = act.closed;
				break;
			}
	}

	if (!Decide(&act, &st, start, e, n, halted_frozen, halted_closed, paid_by, lucky_in))
	{
		if (!LockAll(&act, &st, &wait_stripe))
			goto wait;
		if (!Decide(&act, &st, start, e, n, halted_frozen, halted_closed, paid_by, lucky_in))
			elog(ERROR, "batch could not be decided with every stripe locked");
	}

	/* One UPDATE for the stripes, one INSERT for the claims. */
	{
		int32	   *ids = palloc(sizeof(int32) * Max(st.n, 1));
		int64	   *units = palloc(sizeof(int64) * Max(st.n, 1));
		int32	   *pks = palloc(sizeof(int32) * Max(st.n, 1));
		int64	   *cls = palloc(sizeof(int64) * Max(st.n, 1));
		int			m = 0;

		for (int s = 0; s < st.n; s++)
			if (st.take_claims[s] > 0 || st.take_units[s] > 0)
			{
				ids[m] = s;
				units[m] = st.take_units[s];
				pks[m] = (int32) st.take_packets[s];
				cls[m] = st.take_claims[s];
				m++;
			}
			else if (st.locked[s])
				RpUnlock(RP_LOCK_STRIPE, activity, (uint32) s);

		if (m > 0)
		{
			Datum		amounts;
			Datum	   *ad = palloc(sizeof(Datum) * n);
			int32	   *stripes = palloc(sizeof(int32) * n);

			values[1] = Int4Array(ids, m);
			values[2] = Int8Array(units, m);
			values[3] = Int4Array(pks, m);
			values[4] = Int8Array(cls, m);
			if (RpExec(&debit_stripes, values, NULL, false, 0) != SPI_OK_UPDATE ||
				SPI_processed != (uint64) m)
				elog(ERROR, "could not update the stripes of activity " INT64_FORMAT, activity);

			for (int i = 0; i < n; i++)
				if (e[i].out.status == RP_CLAIMED && e[i].dup_of < 0 && !e[i].existing)
				{
					claimed[i] = true;
					ad[nclaimed] = NumericGetDatum(RpUnitsToAmount(e[i].units, act.scale));
					stripes[nclaimed] = paid_by[i];
					nclaimed++;
				}
			amounts = PointerGetDatum(construct_array(ad, nclaimed, NUMERICOID, -1, false,
													  TYPALIGN_INT));
			values[1] = TextArray(e, n, 0, claimed);
			values[2] = TextArray(e, n, 1, claimed);
			values[3] = TextArray(e, n, 2, claimed);
			values[4] = amounts;
			values[5] = Int4Array(stripes, nclaimed);
			if (RpExec(&insert_claims, values, NULL, false, 0) != SPI_OK_INSERT_RETURNING ||
				SPI_processed != (uint64) nclaimed)
				elog(ERROR, "could not insert the claims of a batch");
			for (int i = 0, r = 0; i < n; i++)
				if (claimed[i])
				{
					e[i].out.claim_id = RpGetInt64(r, 1, 0);
					e[i].out.claimed_at = DatumGetTimestampTz(RpGetDatum(r, 2, &isnull));
					r++;
				}
			RpRememberStripe(&act, ids[m - 1]);
		}
	}

	for (int i = 0; i < n; i++)
	{
		e[i].out.scale = act.scale;
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
	if (kept >= 0)
		RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
	return;

wait:
	if (kept >= 0)
		RpUnlock(RP_LOCK_STRIPE, activity, (uint32) kept);
	kept = -1;
	for (int s = 0; s < st.n; s++)
		if (st.locked[s])
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) s);
	for (int i = 0; i < n; i++)
		if (i == 0 || hashes[i] != hashes[i - 1])
			RpUnlock(RP_LOCK_USER, activity, hashes[i]);

	/*
	 * Wait for the stripe holding nothing we took, keep it, and take the
	 * users' locks again only if they are all free; else wait for the busy
	 * one instead (holding nothing) and start over.
	 */
	(void) RpLock(RP_LOCK_STRIPE, activity, (uint32) wait_stripe, true);
	for (int i = 0; i < n; i++)
	{
		if (i > 0 && hashes[i] == hashes[i - 1])
			continue;
		if (!RpLock(RP_LOCK_USER, activity, hashes[i], false))
		{
			while (--i >= 0)
				if (i == 0 || hashes[i] != hashes[i - 1])
					RpUnlock(RP_LOCK_USER, activity, hashes[i]);
			RpUnlock(RP_LOCK_STRIPE, activity, (uint32) wait_stripe);
			kept = -1;
			goto retry;
		}
	}
	kept = wait_stripe;
	goto retry_locked;
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

	BatchArray(fcinfo, 1, TEXTOID, -1, "user_ids", &users, &user_nulls);
	n = ArrayGetNItems(ARR_NDIM(PG_GETARG_ARRAYTYPE_P(1)), ARR_DIMS(PG_GETARG_ARRAYTYPE_P(1)));
	BatchArray(fcinfo, 2, NUMERICOID, n, "amounts", &amounts, &amount_nulls);
	BatchArray(fcinfo, 3, TEXTOID, n, "request_ids", &requests, &request_nulls);

	e = palloc0(sizeof(BatchElem) * Max(n, 1));
	for (int i = 0; i < n; i++)
		if (user_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("user_ids[%d] must not be NULL", i + 1)));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (IsolationUsesXactSnapshot())
	{
		for (int i = 0; i < n; i++)
			RpClaimOne(activity, DatumGetTextPP(users[i]),
					   (amounts == NULL || amount_nulls[i]) ? NULL : DatumGetNumeric(amounts[i]),
					   (requests == NULL || request_nulls[i]) ? NULL : DatumGetTextPP(requests[i]),
					   &e[i].out);
	}
	else if (n > 0)
	{
		RpActivity	act;

		/* amounts need the activity's scale; RpFetchActivity raises P0002 */
		for (int i = 0; i < n; i++)
		{
			RpCheckUserId(DatumGetTextPP(users[i]));
			if (requests != NULL && !request_nulls[i])
				RpCheckRequestId(DatumGetTextPP(requests[i]));
		}
		(void) RpFetchActivity(activity, &act, false);
		for (int i = 0; i < n; i++)
		{
			e[i].user = DatumGetTextPP(users[i]);
			e[i].request = (requests == NULL || request_nulls[i]) ? NULL : DatumGetTextPP(requests[i]);
			e[i].units = (amounts == NULL || amount_nulls[i]) ? -1
				: RpAmountToUnits(DatumGetNumeric(amounts[i]), act.scale, "amount");
		}
		ClaimBatch(activity, e, n);
	}
	else
		(void) RpFetchActivity(activity, &(RpActivity) {0}, false);

	SPI_finish();

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
