/*
 * locks.c
 *		The locks of an activity, and why no wait of a single call closes a
 *		cycle.
 *
 *		Locks.  Every activity has one activity lock A, and under it the
 *		batch gate slots G, the user buckets B, the user locks U and the
 *		stripe locks S (all advisory, transaction-scoped; base/base.h).  A
 *		claim or batch holds A in RowExclusiveLock (shared among claims)
 *		from its first lock to the end of its transaction; inside it, its
 *		bucket and user (a batch: a gate slot and its users' buckets and
 *		users, batch.c), and the stripes it writes, also kept to the end.
 *		Whoever must see the activity with no claim in flight (close,
 *		freeze, live changes, unfreeze, reversals, reconciliation, the
 *		pending-credit frontier) is a walker: it takes A in ExclusiveLock,
 *		then every stripe.  Every holder of a stripe, user, bucket or slot
 *		holds A, so a walker that holds A exclusively finds all of them
 *		free: it waits once, for A, holding nothing of the activity.
 *
 *		The waits.  A call is "earlier" on an activity when its transaction
 *		already holds A, from an earlier call (the lock manager's count: a
 *		savepoint rolled back gives back its calls' locks, A with them).  A
 *		call that is not earlier waits only as follows:
 *		1. for A, first, holding nothing of the activity (any mode);
 *		2. a single claim only tries its bucket, its user and its stripe;
 *		   when one is busy it gives back everything of the activity, A
 *		   too, waits holding nothing and in no queue until the
 *		   transactions that hold that lock have ended, and starts over;
 *		3. a batch: for a gate slot holding only A, for its buckets and
 *		   users in order holding only A and lower ones, and for at most one
 *		   busy stripe holding A, its slot and users but no stripe;
 *		4. a claim or batch that needs every stripe (it gathers) gives back
 *		   everything of the activity, A too, waits for A exclusively as a
 *		   walker does, takes its user locks and every stripe (all free),
 *		   decides, and then takes A shared (granted at once: it holds A)
 *		   and gives back the exclusive lock and the stripes it did not
 *		   write.
 *		An earlier call re-acquires its A at once, waits for users and
 *		stripes in the same order holding what it kept, and gathers by
 *		waiting for every stripe in stripe order (it never gives back:
 *		what it kept from its earlier calls cannot be given back).  A
 *		walker that is earlier does the same: it waits for every stripe in
 *		order, never for A exclusively (claims waiting for stripes hold A
 *		shared).  No wait is given up and started over.
 *
 *		Why a cycle needs an earlier call.  Take a cycle of waits T1 -> T2
 *		-> ... -> T1 in which no Ti is earlier.  A walker or gatherer
 *		waiting for A exclusively holds nothing of the activity, and only
 *		first locks (rule 1), which hold nothing of the activity either,
 *		queue behind it.  A single claim waiting for holders to end holds
 *		nothing and is in no queue.  Every other wait is for a lock above
 *		every lock of the activity the waiter holds (A < G < B < U < S,
 *		stripes by number; a batch waiting for a stripe holds none).  So
 *		each Ti holds a lock below the one Ti+1 waits for, and going round
 *		the cycle gives L1 < L2 < ... < L1: impossible.  The cycles left
 *		each include an earlier call: an application transaction that made
 *		several calls, an operator's that froze and then claimed, a
 *		reconciliation in a transaction that holds locks.  PostgreSQL
 *		breaks such a cycle with 40P01 as any application deadlock, failing
 *		the waiter whose check finds it: one of the transactions, or a
 *		batch queued on a lock of the cycle (its rule: a waiter that finds
 *		a cycle it cannot break by reordering a queue fails, though it only
 *		queues beside it).  A single claim is never that waiter: while it
 *		waits for holders no wait is for it, so no cycle goes through it.
 *		It queues only for A (rule 1), behind walkers; only a deadlock
 *		between two transactions that each walk several activities (an
 *		operator closing two activities in the opposite order of another)
 *		can pass through that queue.  A walker never waits holding a lock
 *		of the activity, so it is never part of a cycle of claims.
 *		test/model/locks_model.py checks all of this exhaustively.
 *
 *		Progress.  Lock queues are first come first served, so a walker or
 *		gatherer waiting for A is served once the calls that hold A end:
 *		claims that came after it queue behind it.  Single claims that wait
 *		for holders to end are not served in order: each starts over when
 *		the holder it saw ends, and may find the lock taken again, by a
 *		claim that came later; its wait is bounded by lock_timeout.  The
 *		price is that a walker waiting behind a transaction that idles
 *		holding a claim holds up the claims behind it; that is what an operator's
 *		lock_timeout is for.  What a scheduler calls keeps that short: the
 *		reconciliation pass tries A without waiting (RpWalkTry) and comes
 *		back to a busy activity alone, its one wait bounded by lock_timeout
 *		(the worker's is 5 s), and the pending-credit frontier only tries
 *		A, for a moment, before its scan.
 *
 *		Busy.  redpacket.max_waiting sheds load: a call that would wait for
 *		a lock of an activity while that many calls of it wait answers busy
 *		having written nothing.  A call counts itself while it waits by
 *		holding the activity's waiting marker, a lock taken only in
 *		RowShareLock, which never conflicts and is never waited for.
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/base.h"
#include "locks.h"

uint32
RpUserHash(text *user_id)
{
	return hash_bytes((const unsigned char *) VARDATA_ANY(user_id),
					  VARSIZE_ANY_EXHDR(user_id));
}

/*
 * The mode in which this transaction holds the activity lock (the
 * stronger, when both), or NoLock.  The lock manager's own count, so a
 * savepoint rolled back takes the hold with the locks it gives back.
 */
static LOCKMODE
HeldMode(int64 activity)
{
	LOCKTAG		tag;

	RpLockTag(&tag, RP_LOCK_ACTIVITY, activity, 0);
	if (RpLockHeldByMe(&tag, ExclusiveLock))
		return ExclusiveLock;
	if (RpLockHeldByMe(&tag, RowExclusiveLock))
		return RowExclusiveLock;
	return NoLock;
}

/* Earlier: the transaction holds the activity lock, from an earlier call. */
bool
RpHeldEarlier(int64 activity)
{
	return HeldMode(activity) != NoLock;
}

int			rp_max_waiting = RP_DEFAULT_MAX_WAITING;
static bool busy_scope = false;

/* Inside the scope (a claim or batch call) a wait may be refused for busy. */
bool
RpBusyScope(bool on)
{
	bool		outer = busy_scope;

	busy_scope = on;
	return outer;
}

/*
 * Inside the busy scope, count the caller among the activity's waiters
 * while it waits: false, not counted, when redpacket.max_waiting already
 * wait.  WaitersLeave ends the count.
 */
static bool
WaitersEnter(int64 activity)
{
	if (!busy_scope)
		return true;
	if (rp_max_waiting > 0 &&
		RpLockHolders(RP_LOCK_WAITING, activity, 0) >= rp_max_waiting)
		return false;
	(void) RpLockMode(RP_LOCK_WAITING, activity, 0, RowShareLock, true);
	return true;
}

static void
WaitersLeave(int64 activity)
{
	if (busy_scope)
		RpUnlockMode(RP_LOCK_WAITING, activity, 0, RowShareLock);
}

/*
 * Take the lock, waiting if need be; false (not waiting) when the call may
 * answer busy and redpacket.max_waiting calls of the activity already wait.
 */
bool
RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	if (RpLockMode(kind, activity, sub, mode, false))
		return true;
	if (!WaitersEnter(activity))
		return false;
	(void) RpLockMode(kind, activity, sub, mode, true);
	WaitersLeave(activity);
	return true;
}

/* A claim's or batch's first lock of the activity: A, shared (rule 1). */
bool
RpCallBegin(RpCall *call, int64 activity)
{
	call->activity = activity;
	call->earlier = RpHeldEarlier(activity);
	call->shared = RpWaitLock(RP_LOCK_ACTIVITY, activity, 0, RowExclusiveLock);
	return call->shared;
}

/* The call ends: it keeps what it took, or gives back its hold on A. */
void
RpCallEnd(RpCall *call, bool keep)
{
	if (!keep && call->shared)
		RpUnlockMode(RP_LOCK_ACTIVITY, call->activity, 0, RowExclusiveLock);
	call->shared = false;
}

/*
 * A claim's bucket and user lock, waiting for either holding neither, as a
 * batch may hold both.  For an earlier call, and for one that holds A
 * exclusively (all free then).
 */
bool
RpLockUser(int64 activity, uint32 user_hash)
{
	uint32		bucket = user_hash % RP_USER_BUCKETS;

	for (;;)
	{
		if (!RpWaitLock(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock))
			return false;
		if (RpLock(RP_LOCK_USER, activity, user_hash, false))
			return true;
		RpUnlockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
		if (!RpWaitLock(RP_LOCK_USER, activity, user_hash, ExclusiveLock))
			return false;
		if (RpLockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock, false))
			return true;
		RpUnlock(RP_LOCK_USER, activity, user_hash);
	}
}

/* The same without waiting: false, holding neither, naming the busy one. */
bool
RpTryUser(int64 activity, uint32 user_hash, RpBusyLock *busy)
{
	uint32		bucket = user_hash % RP_USER_BUCKETS;

	if (!RpLockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock, false))
	{
		RpBusyIs(busy, RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
		return false;
	}
	if (RpLock(RP_LOCK_USER, activity, user_hash, false))
		return true;
	RpUnlockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
	RpBusyIs(busy, RP_LOCK_USER, activity, user_hash, ExclusiveLock);
	return false;
}

void
RpBusyIs(RpBusyLock *busy, RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	busy->activity = activity;
	busy->kind = kind;
	busy->sub = sub;
	busy->mode = mode;
}

/*
 * Wait, holding nothing of the activity, until every transaction that
 * holds the busy lock in a conflicting mode has ended (rule 2); false, not
 * waiting, for busy.  The waiter is in no queue of the activity's locks and
 * holds none, so no wait of the activity can be for it.  A lock refused for
 * a waiter ahead (a batch waiting for a bucket exclusively behind claims
 * that share it) has no conflicting holder: then wait for every holder, so
 * that the wait is for the transactions the waiter ahead waits for.
 */
bool
RpWaitHolders(const RpBusyLock *busy)
{
	LOCKTAG		tag;
	VirtualTransactionId *holders;
	int			n;

	if (!WaitersEnter(busy->activity))
		return false;
	RpLockTag(&tag, busy->kind, busy->activity, busy->sub);
	holders = GetLockConflicts(&tag, busy->mode, &n);
	if (n == 0)
		holders = GetLockConflicts(&tag, AccessExclusiveLock, &n);
	for (; VirtualTransactionIdIsValid(*holders); holders++)
		(void) VirtualXactLock(*holders, true);
	WaitersLeave(busy->activity);
	return true;
}

void
RpUnlockUser(int64 activity, uint32 user_hash)
{
	RpUnlock(RP_LOCK_USER, activity, user_hash);
	RpUnlockMode(RP_LOCK_BUCKET, activity, user_hash % RP_USER_BUCKETS, RowExclusiveLock);
}

static LOCKMODE
BucketMode(const RpUserLocks *ul)
{
	return ul->users ? RowExclusiveLock : ExclusiveLock;
}

/* A batch's buckets, then its users, in order (rule 3); false for busy. */
bool
RpLockUsers(const RpUserLocks *ul)
{
	int			b = 0;
	int			u = 0;

	for (; b < ul->nbuckets; b++)
		if (!RpWaitLock(RP_LOCK_BUCKET, ul->activity, ul->buckets[b], BucketMode(ul)))
			break;
	if (b == ul->nbuckets)
		for (; u < ul->nusers; u++)
			if (!RpWaitLock(RP_LOCK_USER, ul->activity, ul->users[u], ExclusiveLock))
				break;
	if (b == ul->nbuckets && u == ul->nusers)
		return true;
	while (--u >= 0)
		RpUnlock(RP_LOCK_USER, ul->activity, ul->users[u]);
	while (--b >= 0)
		RpUnlockMode(RP_LOCK_BUCKET, ul->activity, ul->buckets[b], BucketMode(ul));
	return false;
}

void
RpUnlockUsers(const RpUserLocks *ul)
{
	for (int u = 0; u < ul->nusers; u++)
		RpUnlock(RP_LOCK_USER, ul->activity, ul->users[u]);
	for (int b = 0; b < ul->nbuckets; b++)
		RpUnlockMode(RP_LOCK_BUCKET, ul->activity, ul->buckets[b], BucketMode(ul));
}

static void
UnlockStripes(const RpActivity *act, int upto)
{
	for (int s = 0; s < upto; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
}

/* Every stripe in stripe order; false, holding none of them, for busy. */
static bool
WaitStripesInOrder(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		if (!RpWaitLock(RP_LOCK_STRIPE, act->id, (uint32) s, ExclusiveLock))
		{
			UnlockStripes(act, s);
			return false;
		}
	return true;
}

/*
 * The stripes once A is held exclusively: free, since whoever holds one
 * holds A (a wait here would be a bug, and would show as one).
 */
static void
TakeFreeStripes(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		(void) RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, true);
}

/* Try to lock every stripe, in order; on a busy one give back what was taken. */
bool
RpTryLockAllStripes(const RpActivity *act, int *busy)
{
	for (int s = 0; s < act->stripes; s++)
		if (!RpLock(RP_LOCK_STRIPE, act->id, (uint32) s, false))
		{
			*busy = s;
			UnlockStripes(act, s);
			return false;
		}
	return true;
}

/*
 * Every stripe for a call that needs them all (rule 4).  A call that is not
 * earlier has given back its user locks and gives back A; false, for busy,
 * holding nothing of the activity then (and, for an earlier call, holding
 * what it held).
 */
bool
RpGatherBegin(RpCall *call, const RpActivity *act)
{
	if (call->earlier)
		return WaitStripesInOrder(act);
	RpUnlockMode(RP_LOCK_ACTIVITY, act->id, 0, RowExclusiveLock);
	call->shared = false;
	if (!RpWaitLock(RP_LOCK_ACTIVITY, act->id, 0, ExclusiveLock))
		return false;
	TakeFreeStripes(act);
	return true;
}

/* The call decided: give back the stripes it did not write, and A exclusive. */
void
RpGatherEnd(RpCall *call, const RpActivity *act)
{
	if (!call->earlier)
	{
		(void) RpLockMode(RP_LOCK_ACTIVITY, act->id, 0, RowExclusiveLock, true);
		call->shared = true;
	}
	UnlockStripes(act, act->stripes);
	if (!call->earlier)
		RpUnlockMode(RP_LOCK_ACTIVITY, act->id, 0, ExclusiveLock);
}

/*
 * A walk, kept to the end of the transaction unless given back
 * (RpWalkEnd): A exclusively holding nothing of the activity, then every
 * stripe.  An earlier walker takes A again in the mode it holds it (at
 * once), so that the walk's own hold can be given back alone, then waits
 * for every stripe in order.
 */
void
RpWalk(const RpActivity *act)
{
	LOCKMODE	held = HeldMode(act->id);

	if (held != NoLock)
	{
		(void) RpLockMode(RP_LOCK_ACTIVITY, act->id, 0, held, false);
		(void) WaitStripesInOrder(act);
		return;
	}
	(void) RpLockMode(RP_LOCK_ACTIVITY, act->id, 0, ExclusiveLock, true);
	TakeFreeStripes(act);
}

/*
 * A walk that never waits: false, holding nothing it took, when a call
 * holds the activity (*busy: the stripe found busy, or -1 for A).
 */
bool
RpWalkTry(const RpActivity *act, int *busy)
{
	LOCKMODE	held = HeldMode(act->id);
	LOCKMODE	mode = held != NoLock ? held : ExclusiveLock;

	if (!RpLockMode(RP_LOCK_ACTIVITY, act->id, 0, mode, false))
	{
		*busy = -1;
		return false;
	}
	if (RpTryLockAllStripes(act, busy))
		return true;
	RpUnlockMode(RP_LOCK_ACTIVITY, act->id, 0, mode);
	return false;
}

/*
 * Give back what a walk took: its stripes, and its hold on A (the
 * stronger mode held is the one it took: ExclusiveLock, or, for an
 * earlier walker holding A only shared, RowExclusiveLock).
 */
void
RpWalkEnd(const RpActivity *act)
{
	UnlockStripes(act, act->stripes);
	RpUnlockMode(RP_LOCK_ACTIVITY, act->id, 0, HeldMode(act->id));
}

/*
 * A batch's admission slot (rule 3): a slot per stripe, at most
 * RP_BATCH_GATE_SLOTS.  Each is tried, starting at one picked by the
 * backend; when all are busy the batch waits for that one.  An earlier
 * batch passes without one.  The slot is kept to the end of the
 * transaction when the batch wrote (so the batches in flight never
 * outnumber the stripes), else given back when the call ends.
 */
#define RP_BATCH_GATE_SLOTS 64

int
RpBatchGateEnter(const RpActivity *act, const RpCall *call)
{
	uint32		slots = (uint32) Max(Min(act->stripes, RP_BATCH_GATE_SLOTS), 1);
	uint32		start = (uint32) RpMyProcNumber % slots;

	if (call->earlier)
		return -1;
	for (uint32 i = 0; i < slots; i++)
		if (RpLock(RP_LOCK_GATE, act->id, (start + i) % slots, false))
			return (int) ((start + i) % slots);
	if (!RpWaitLock(RP_LOCK_GATE, act->id, start, ExclusiveLock))
		return RP_GATE_BUSY;
	return (int) start;
}

void
RpBatchGateLeave(int64 activity, int slot)
{
	if (slot >= 0)
		RpUnlock(RP_LOCK_GATE, activity, (uint32) slot);
}

/* The protocol's setting: called from _PG_init. */
void
RpLocksInit(void)
{
	DefineCustomIntVariable("redpacket.max_waiting",
							"Most claims that may wait for a lock of one activity; further ones answer busy.",
							"A claim or batch that would wait for a lock of an activity while this many claims of the activity already wait answers busy at once, having written nothing. 0 means no limit.",
							&rp_max_waiting,
							RP_DEFAULT_MAX_WAITING, RP_MIN_MAX_WAITING, RP_MAX_MAX_WAITING,
							PGC_USERSET, 0, NULL, NULL, NULL);
}
