/*
 * locks.c
 *		The locking protocol of rp_claim and rp_claim_batch.
 *
 *		Locks.  A single claim holds its user's lock (activity, hash of the
 *		user) and, in RowExclusiveLock, the user's bucket (hash modulo
 *		RP_USER_BUCKETS).  A small batch does the same for each of its users;
 *		a batch of many users holds their buckets in ExclusiveLock instead,
 *		so it needs at most RP_USER_BUCKETS user locks whatever its size, and
 *		still excludes every single claim of its users (batch.c); before
 *		them it takes one of the activity's gate slots (rule 0).  Money is
 *		taken under stripe locks, kept to the end of the transaction for the
 *		stripes written.
 *
 *		Waiting.  Which waits are allowed, and why a transaction that makes a
 *		single rp_claim or rp_claim_batch call is never part of a deadlock.
 *		The locks of one activity are ordered: the batch gate slots, then
 *		the gather lock, then the buckets (by number), then the users (by
 *		hash), then the stripes (by number).  Try-locks never wait, so only
 *		waits matter:
 *		0. A batch first takes a gate slot (RpBatchGateEnter): it try-locks
 *		   each slot, and if all are busy waits for one holding nothing of
 *		   the activity; it keeps the slot to the end of its transaction,
 *		   like the stripes it writes (if it wrote none, it gives the slot
 *		   back when its call ends).  Only batches take slots, and a
 *		   transaction of rule 4 passes without one, so nobody waits for a
 *		   slot holding anything of the activity.
 *		1. A single claim waits for its user and bucket locks holding nothing
 *		   of its own (RpLockUser), and for a busy stripe holding nothing: it
 *		   gives everything back, waits, keeps the stripe and takes its user
 *		   lock only if free (else gives back again).
 *		2. A batch waits for its buckets in bucket order, then for its users
 *		   in hash order, holding only lower ones of its own (its gate slot
 *		   and buckets), and keeps them to the end.  Holding them (and no
 *		   stripe) it may wait for one busy stripe; with that one and what it
 *		   can try-lock it decides, or, when every stripe is needed and one is
 *		   busy, it gives back its stripes and its user locks and walks: its
 *		   user locks in order again, then every stripe in stripe order (a
 *		   walk of rule 5).  So at most two waits for stripes a call, each
 *		   for a stripe above every stripe it holds.
 *		3. A single claim that needs every stripe and holds nothing from
 *		   earlier claims on the activity in its transaction (a gatherer)
 *		   gives everything back, waits for the activity's gather lock, then
 *		   for its user lock as in 1 (holding the gather lock), then for every
 *		   stripe in stripe order.  The lock queues are fair, so it is served
 *		   in bounded time while other claims keep coming.  Close, freeze and
 *		   reconciliation wait for the stripes in stripe order holding no
 *		   other lock of the activity.
 *		4. A transaction that holds locks of earlier claims on the activity is
 *		   not a gatherer: it gathers by rule 1 (a single claim) or 2 (a
 *		   batch), holding those earlier locks out of the order.  A
 *		   transaction that froze or closed the activity keeps every stripe
 *		   and counts as such (RpNoteHeld): its later claims and batches
 *		   pass the gate.
 *		5. The waits of 3 (the gatherer's, and the stripes of close, freeze,
 *		   reconciliation and a gathering batch), when the transaction holds
 *		   nothing of any activity from earlier calls, are restartable: they
 *		   run in a subtransaction and look for a cycle first (after
 *		   deadlock_timeout, where a wait of 4 looks after three times that),
 *		   and end after twice deadlock_timeout in any case; then the
 *		   subtransaction is rolled back, which gives back all the call
 *		   took, and the call starts over.  While such a wait waits for a
 *		   stripe it holds the stripe's walker marker.
 *		6. A wait of 4 runs in a subtransaction too.  When PostgreSQL finds
 *		   it in a cycle and a walk that holds a walker marker on a stripe
 *		   the transaction holds is part of it (read off the lock table), it
 *		   gives way for that once (the rollback gives back only the lock it
 *		   waited for) and waits again, at most RP_MAX_YIELDS times.
 *		7. While a wait of 4 waits, it holds the activity's holder marker.
 *		   A walk of 5 that would wait for a stripe while such a holder
 *		   waits for a lock the walk took (directly, or through the waits
 *		   of the backends it waits for: read off the lock table) gives way
 *		   at once instead of waiting (its subtransaction is rolled back,
 *		   which hands the lock to the holder) and starts over a tenth of d
 *		   later; a walk that cannot help a holder goes on.  A holder that
 *		   gives way by rule 6 leaves its place in the lock queue, and the
 *		   walks queued behind it meanwhile get ahead of it; under a
 *		   stream of walks (gathering claims and batches on a nearly
 *		   exhausted activity) its waits added up past
 *		   the 10d after which the claims queued behind it look for a
 *		   cycle, and they failed with 40P01.  With rule 7 a walk that
 *		   reaches a waiting holder's stripe gives way before the holder
 *		   looks, and rule 6 is left for a walk that began to wait just
 *		   before the holder did.
 *		8. Two transactions of rule 4 can close a cycle of their own (each
 *		   keeps a claim's stripe and needs the other's); one of them must
 *		   fail, and it is the younger one.  While a wait of 4 waits it
 *		   also holds its age marker, whose key is when its transaction
 *		   began (or, after it lost such a cycle, when the first
 *		   transaction of its losing streak began: a retried transaction
 *		   keeps its age).  When PostgreSQL finds the wait in a cycle and
 *		   every other wait of 4 reached from it is younger, it gives way
 *		   (as in rule 6) and waits again: the younger one looks later and
 *		   loses.  So a caller that retries a loser is not failed again
 *		   by a transaction that began after it, unless that one had
 *		   already looked before the cycle closed (PostgreSQL looks once
 *		   a wait): then the older one fails after giving way twice.
 *		So every wait of a transaction that made no earlier claim on the
 *		activity is for a lock above every lock of the activity it holds (a
 *		single claim and the gatherer of 3 in particular never wait for a
 *		user lock holding a stripe: the gatherer takes its user lock first).
 *		In a cycle of waits T1 -> T2 -> ... -> T1, where Ti waits for a lock
 *		Li held by Ti+1, each Li is below what Ti+1 waits for, so L1 < L2 <
 *		... < L1 if all of them were such transactions: impossible.  A cycle
 *		therefore needs a transaction of rule 4.  If it also holds a
 *		restartable wait of 5, that call gives way, and the transactions of
 *		rule 4 go on: a transaction that already claimed never loses to a
 *		gatherer, a close or a reconciliation, however many of them come.
 *		Who looks first does not decide it: a walk may reach the stripe of
 *		a transaction of rule 4 long after that transaction began to wait
 *		(its earlier waits, each shorter than 2d, add up), so the holder's
 *		look at 3d can come before the walk's at d; by rule 6 the holder
 *		then waits again, and the walk, whose wait began before the
 *		holder's second one, gives way before the holder looks again.  A
 *		batch waiting for one stripe keeps its user locks, so a cycle through
 *		a user lock it holds (the same user claimed in the batch and by the
 *		transaction of rule 4) and a cycle of transactions of rule 4 alone
 *		end with PostgreSQL failing one of them with 40P01 (in the second,
 *		the younger: rule 8): the caller retries.
 *		Every other wait holds nothing of its activity and waits ten times
 *		deadlock_timeout before it looks for a cycle, so it is never the
 *		victim: PostgreSQL's detector may fail any waiter whose check finds
 *		a cycle, even one queued behind it.
 *		History.  Before restartable waits the gatherer waited patiently and
 *		the transaction of rule 4 was always the victim: under a stream of
 *		gatherers a caller's two-claim transaction lost ten times in a row.
 *		An earlier version refused a rule 4 wait up front while a gatherer
 *		was about; that failed about 4% of the two-claim transactions.
 *		Before rule 6, a walk that reached a holder's stripe more than 2d
 *		after the holder began to wait found the holder looking first, and
 *		the holder lost (one stress run in a few: five times in a row); and
 *		a gathering batch kept its user locks when it started over, so a
 *		holder waiting for one of them could not be served by its giving
 *		way.  Before rule 7, one stress run in about forty lost that way
 *		(a holder waited 19 s, 22 innocent claims queued behind it failed,
 *		and another holder lost six times in a row).  Before rule 8 took
 *		the age, a backend whose holder wait lost looked later (5d instead
 *		of 3d) until it committed: a CI stress run still had a
 *		transaction lose four times in a row, to partners that began to
 *		wait more than 2d after it.  A
 *		batch once gave back its user locks before every stripe wait and took
 *		them again after it: under 256 concurrent batches that was a loop of
 *		hundreds of lock manager calls per wait.  Without the gate, 256
 *		batches of 100 users on 16 stripes meant ~240 of them waiting for a
 *		stripe holding ~150 user and bucket locks each (~38,000 locks in
 *		the shared lock table); with it, at most one batch per stripe holds
 *		user locks and the rest wait for a slot holding none.  The slot was
 *		first given back when the call ended, before the commit: the next
 *		batch then competed for stripes still held by the committing one,
 *		and waited a second time for one of them; kept to the commit, the
 *		slots bound the transactions in flight to the stripes, and 256
 *		callers made about 30% more claims a second.
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "locks.h"
#include "stripe.h"

uint32
RpUserHash(text *user_id)
{
	return hash_bytes((const unsigned char *) VARDATA_ANY(user_id),
					  VARSIZE_ANY_EXHDR(user_id));
}

/*
 * The activities on which this transaction keeps locks from a claim, a
 * batch, a freeze or a close: every one of them, in memory of the
 * transaction (a transaction that holds locks of many activities holds
 * that many locks anyway).
 */
static LocalTransactionId held_lxid = InvalidLocalTransactionId;
static int	held_n = 0;
static int	held_max = 0;
static int64 *held_ids = NULL;

bool
RpHeldEarlier(int64 activity)
{
	if (held_lxid != RpMyLocalXid)
		return false;
	for (int i = 0; i < held_n; i++)
		if (held_ids[i] == activity)
			return true;
	return false;
}

/* Does this transaction keep locks of any activity from earlier calls? */
bool
RpHeldAny(void)
{
	return held_lxid == RpMyLocalXid && held_n > 0;
}

/* A claim or batch on the activity is done and keeps its locks. */
void
RpNoteHeld(int64 activity)
{
	if (held_lxid != RpMyLocalXid)
	{
		held_lxid = RpMyLocalXid;
		held_n = 0;
		held_max = 8;
		held_ids = MemoryContextAlloc(TopTransactionContext, sizeof(int64) * held_max);
	}
	if (RpHeldEarlier(activity))
		return;
	if (held_n == held_max)
	{
		held_max *= 2;
		held_ids = repalloc(held_ids, sizeof(int64) * held_max);
	}
	held_ids[held_n++] = activity;
}

/*
 * Load shedding (redpacket.max_waiting).  While a claim or batch waits for
 * a lock of its activity it holds the activity's waiting marker (a lock
 * mode that conflicts with none of the modes it is taken in); a call that
 * would wait while max_waiting others hold it answers busy instead, having
 * waited for nothing.  Only inside RpBusyScope (rp_claim and rp_claim_batch
 * on a 1.4 catalog, which has the status).  Every waiting claim holds the
 * marker, whatever its own setting, so that a session with the setting
 * counts the waits of sessions without it; the marker costs one lock per
 * wait, next to a wait for a commit.
 */
int			rp_max_waiting = 0;
static bool busy_scope = false;

bool
RpBusyScope(bool on)
{
	bool		outer = busy_scope;

	busy_scope = on;
	return outer;
}

static bool
TooManyWaiting(int64 activity)
{
	if (!busy_scope || rp_max_waiting <= 0)
		return false;
	return RpLockHolders(RP_LOCK_WAITING, activity, 0) >= rp_max_waiting;
}

static int	restartable = 0;	/* inside a restartable acquisition */
static bool gave_way_to_holder = false;
static void HolderWait(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);

static bool HolderWaitsForUs(int64 activity);
static TimestampTz AgeMarkerTake(void);
static void AgeMarkerDrop(TimestampTz age);

/*
 * Rule 7: a restartable walk that would wait for a stripe while a
 * transaction of rule 4 waits, directly or through the waits of others,
 * for a lock the walk took, gives way before it waits (the error rolls its
 * subtransaction back, which gives that lock back; Restartable starts it
 * over).  A walk already waiting when the holder began to wait ends its
 * wait within 2d, before the holder looks.
 */
static void
GiveWayToHolders(int64 activity)
{
	if (RpLockHolders(RP_LOCK_HOLDER, activity, 0) == 0 || !HolderWaitsForUs(activity))
		return;
	gave_way_to_holder = true;
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("a walk over the stripes of activity " INT64_FORMAT " gives way to a claim waiting for it",
					activity)));
}

/*
 * Wait for a lock of the activity (every wait of the claim paths comes
 * through here; see rules 4 to 6 above).  Returns false, having waited for
 * nothing and taken nothing, when the call must answer busy.
 */
bool
RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	bool		marked;
	bool		walker = restartable > 0 && kind == RP_LOCK_STRIPE;

	if (RpLockMode(kind, activity, sub, mode, false))
		return true;			/* free: no wait, no setting to change */
	if (walker)
		GiveWayToHolders(activity);
	if (TooManyWaiting(activity))
		return false;
	marked = busy_scope;
	if (marked)
		(void) RpLockMode(RP_LOCK_WAITING, activity, 0, RowShareLock, true);
	if (walker)
		(void) RpLockMode(RP_LOCK_WALKER, activity, sub, RowShareLock, true);
	if (restartable == 0 && RpHeldAny())
	{
		TimestampTz age;

		(void) RpLockMode(RP_LOCK_HOLDER, activity, 0, RowShareLock, true);
		age = AgeMarkerTake();
		HolderWait(kind, activity, sub, mode);
		AgeMarkerDrop(age);
		RpUnlockMode(RP_LOCK_HOLDER, activity, 0, RowShareLock);
	}
	else
	{
		RpPatientBegin(activity);
		(void) RpLockMode(kind, activity, sub, mode, true);
		RpPatientEnd();
	}
	if (walker)
		RpUnlockMode(RP_LOCK_WALKER, activity, sub, RowShareLock);
	if (marked)
		RpUnlockMode(RP_LOCK_WAITING, activity, 0, RowShareLock);
	return true;
}

/*
 * Restartable acquisition (rule 5).  A call that holds nothing of any
 * activity from earlier in its transaction takes what it needs in the
 * protocol's order inside a subtransaction.  Its waits look for a cycle
 * after deadlock_timeout (d), before any wait of rule 4 does (3d); and
 * since PostgreSQL looks only once a wait, for a cycle closed later each
 * wait also ends after 2d (lock_timeout, unless the caller's is shorter:
 * the reconciler's 5 s applies to the last start only).  Either
 * way the subtransaction is rolled back, which gives back everything the
 * call took, and the call starts over: the other transactions of a cycle,
 * which hold locks of claims they already made, go on.  After
 * RP_MAX_RESTARTS starts (a cycle through locks outside redpacket, the
 * caller's own rows, which starting over cannot break; or stripes held that
 * long) the last start waits without a subtransaction, patiently, and
 * PostgreSQL fails whichever transaction finds the cycle.
 */
#define RP_MAX_RESTARTS 10

typedef bool (*RpLockStep) (const RpActivity *act, const void *arg);

typedef enum RpStepResult
{
	RP_STEP_TOOK,
	RP_STEP_BUSY,
	RP_STEP_RESTART
} RpStepResult;

/*
 * A call run in a subtransaction of its own (rules 5 and 6): run(call) says
 * whether it took what it waited for, and the subtransaction's commit hands
 * that to the transaction; when it throws, the rollback gives back all it
 * took, and gave_way(call, sqlerrcode) says whether the call answers that
 * error by trying again (RP_STEP_RESTART) rather than failing with it.
 */
typedef struct RpSubCall RpSubCall;
struct RpSubCall
{
	bool		(*run) (RpSubCall *call);
	bool		(*gave_way) (RpSubCall *call, int sqlerrcode);
	/* a restartable walk: the step, and whether its waits end after 2d */
	RpLockStep	step;
	const RpActivity *act;
	const void *arg;
	bool		timed;
	bool		in_cycle;		/* it gave way to a cycle PostgreSQL found, or
								 * to a holder waiting for it (rule 7) */
	/* a holder's wait: the lock, and how many more times it may give way */
	int			yields_left;
	RpLockKind	kind;
	int64		activity;
	uint32		sub;
	LOCKMODE	mode;
};

static RpStepResult
InSubTransaction(RpSubCall *call)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile RpStepResult result = RP_STEP_BUSY;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		result = call->run(call) ? RP_STEP_TOOK : RP_STEP_BUSY;
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (!call->gave_way(call, edata->sqlerrcode))
			ReThrowError(edata);
		FreeErrorData(edata);
		result = RP_STEP_RESTART;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return result;
}

static bool
WalkRun(RpSubCall *call)
{
	int			give_way = Min(DeadlockTimeout, PG_INT32_MAX / 2) * 2;
	int			level = 0;
	bool		took;

	if (call->timed)
	{
		level = NewGUCNestLevel();
		(void) set_config_option("lock_timeout", psprintf("%d", give_way),
								 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	}
	restartable++;
	took = call->step(call->act, call->arg);
	restartable--;
	if (call->timed)
		AtEOXact_GUC(true, level);
	return took;
}

static bool
WalkGaveWay(RpSubCall *call, int sqlerrcode)
{
	restartable--;				/* the rollback undid the lock_timeout */
	call->in_cycle = gave_way_to_holder || sqlerrcode == ERRCODE_T_R_DEADLOCK_DETECTED;
	gave_way_to_holder = false;
	return call->in_cycle || (call->timed && sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE);
}

/*
 * A walk that gave way to a cycle lets the others of the cycle take what it
 * gave back before it starts over: a holder that had given way itself for
 * a moment (rule 6) may not be queued for it yet, and would find the walk
 * holding it again.  A tenth of deadlock_timeout (at most 100 ms).
 */
static void
AfterGivingWay(void)
{
	long		ms = Min(Max(DeadlockTimeout / 10, 1), 100);

	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms,
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

static bool
Restartable(RpLockStep step, const RpActivity *act, const void *arg)
{
	RpSubCall	call = {0};

	if (RpHeldAny())
		return step(act, arg);	/* what it holds would stay: rule 4 */
	call.run = WalkRun;
	call.gave_way = WalkGaveWay;
	call.step = step;
	call.act = act;
	call.arg = arg;
	call.timed = LockTimeout == 0 || LockTimeout > Min(DeadlockTimeout, PG_INT32_MAX / 2) * 2;
	for (int starts = 0; starts < RP_MAX_RESTARTS; starts++)
	{
		RpStepResult r = InSubTransaction(&call);

		if (r != RP_STEP_RESTART)
			return r == RP_STEP_TOOK;
		ereport(DEBUG1,
				(errmsg_internal("redpacket: a wait on activity " INT64_FORMAT " was part of a deadlock or lasted too long; gave everything back and starts over",
								 act->id)));
		if (call.in_cycle)
			AfterGivingWay();
	}
	return step(act, arg);
}

/* Every stripe in stripe order; false, holding none of them, for busy. */
static bool
AllStripesStep(const RpActivity *act, const void *unused)
{
	for (int s = 0; s < act->stripes; s++)
		if (!RpWaitLock(RP_LOCK_STRIPE, act->id, (uint32) s, ExclusiveLock))
		{
			while (--s >= 0)
				RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
			return false;
		}
	return true;
}

/* Every stripe in stripe order: for close, freeze and reconciliation. */
void
RpWaitAllStripes(const RpActivity *act)
{
	(void) Restartable(AllStripesStep, act, NULL);
}

/*
 * A batch's user locks (rule 2): buckets in bucket order, in shared mode
 * for a batch of few users (then each user in hash order, as single claims
 * take theirs), exclusively for a larger one (users NULL: at most
 * RP_USER_BUCKETS locks whatever its size).  Kept to the end of the
 * transaction, except while a gathering batch starts over (rule 5).  False,
 * having given back every one it took, when a wait is refused for busy.
 */
static LOCKMODE
BucketMode(const RpUserLocks *ul)
{
	return ul->users ? RowExclusiveLock : ExclusiveLock;
}

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

/* A gathering batch's walk: its user locks in order, then every stripe. */
static bool
UsersAndStripesStep(const RpActivity *act, const void *arg)
{
	const RpUserLocks *ul = arg;

	if (!RpLockUsers(ul))
		return false;
	if (AllStripesStep(act, NULL))
		return true;
	RpUnlockUsers(ul);
	return false;
}

/*
 * For a gathering batch, holding none of its user locks (it gave them
 * back): take them again, then every stripe in stripe order, restartable
 * like the gatherer's walk (rule 5), so that starting over gives back the
 * user locks too.  False, holding none of them, when it must answer busy.
 */
bool
RpWaitUsersAndAllStripes(const RpActivity *act, const RpUserLocks *ul)
{
	return Restartable(UsersAndStripesStep, act, ul);
}

/*
 * Take a single claim's user lock and bucket lock.  Without wait, only if
 * both are free.  With wait, each wait holds neither (rule 1), except for a
 * gatherer, which holds the gather lock (rule 3); false, holding neither,
 * when the claim must answer busy instead of waiting.
 */
bool
RpLockUser(int64 activity, uint32 user_hash, bool wait)
{
	uint32		bucket = user_hash % RP_USER_BUCKETS;

	if (!wait)
	{
		if (!RpLockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock, false))
			return false;
		if (RpLock(RP_LOCK_USER, activity, user_hash, false))
			return true;
		RpUnlockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
		return false;
	}
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

void
RpUnlockUser(int64 activity, uint32 user_hash)
{
	RpUnlock(RP_LOCK_USER, activity, user_hash);
	RpUnlockMode(RP_LOCK_BUCKET, activity, user_hash % RP_USER_BUCKETS, RowExclusiveLock);
}

/*
 * How long a wait lasts before PostgreSQL looks for a cycle through it
 * (deadlock_timeout, the setting's value d): d inside a restartable
 * acquisition (rule 5), which must look first; 3d for a transaction that
 * holds locks of earlier claims on the activity (rule 4), which a
 * restartable call gives way to and which fails with 40P01 only in a cycle
 * of such transactions (rule 8); 10d for every other wait, which holds
 * nothing of the activity and is in no cycle of its locks.  RpPatientEnd undoes the
 * setting, or the transaction's (or subtransaction's) end does on an error.
 */
static int	patient_guc_level = 0;
static bool patient = false;

/*
 * Rule 8's age: when the first transaction of this backend's losing streak
 * began (0: no holder wait lost since this backend last committed).
 */
static TimestampTz streak_start = 0;

static TimestampTz
HolderAge(void)
{
	return streak_start != 0 ? streak_start : GetCurrentTransactionStartTimestamp();
}

static void
StreakEndsAtCommit(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
		streak_start = 0;
}

/*
 * The age marker's key holds the age whole: its high half, then its low.
 * Dropped with the age it was taken with (a loss, which changes the age,
 * ends the wait with an error, and the abort drops the marker).
 */
static TimestampTz
AgeMarkerTake(void)
{
	TimestampTz age = HolderAge();

	(void) RpLockMode(RP_LOCK_AGE, (int64) ((uint64) age >> 32), (uint32) age,
					  RowShareLock, true);
	return age;
}

static void
AgeMarkerDrop(TimestampTz age)
{
	RpUnlockMode(RP_LOCK_AGE, (int64) ((uint64) age >> 32), (uint32) age, RowShareLock);
}

void
RpPatientBegin(int64 activity)
{
	int			times = RpHeldEarlier(activity) ? 3 : 10;

	patient = restartable == 0;
	if (!patient)
		return;
	patient_guc_level = NewGUCNestLevel();
	(void) set_config_option("deadlock_timeout",
							 psprintf("%d", Min(DeadlockTimeout, PG_INT32_MAX / 10) * times),
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

void
RpPatientEnd(void)
{
	if (patient)
		AtEOXact_GUC(true, patient_guc_level);
	patient = false;
}

/*
 * Rules 6 and 8: a wait of a transaction that keeps locks from earlier
 * calls (rule 4) runs in a subtransaction.  When PostgreSQL finds it in a
 * cycle that a restartable walk (rule 5) is part of, the walk gives way
 * within 2d of the start of its wait; in a cycle of younger waits of 4
 * only, the younger one looks later and loses.  Either way the holder
 * gives way instead, for that once (the rollback gives back only the lock
 * it waited for), and waits again.  At most RP_MAX_YIELDS times, so that
 * its waits (3d each) end before a wait that holds nothing looks for a
 * cycle (10d): PostgreSQL's detector would fail that one, queued behind
 * the holder.  Then, as for a cycle with an older holder or with a batch
 * waiting for one stripe (which keeps its user locks), PostgreSQL's
 * verdict stands, and the loss starts or continues this backend's losing
 * streak (HolderAge).
 */
#define RP_MAX_YIELDS 2

/* Is entry e a lock of ours of that kind, held (or, with wait, awaited)? */
static bool
IsOurs(const LockInstanceData *e, RpLockKind kind)
{
	return e->locktag.locktag_type == LOCKTAG_ADVISORY &&
		e->locktag.locktag_field1 == MyDatabaseId &&
		e->locktag.locktag_field4 == (uint16) kind && e->holdMask != 0;
}

/* The backends, in the lock table snapshot, that walk and wait for a stripe we hold. */
static int
WalkersOfMine(const LockData *data, int *walkers)
{
	int			n = 0;

	for (int m = 0; m < data->nelements; m++)
	{
		const LockInstanceData *marker = &data->locks[m];

		if (!IsOurs(marker, RP_LOCK_WALKER))
			continue;
		for (int i = 0; i < data->nelements; i++)
		{
			const LockInstanceData *mine = &data->locks[i];

			if (mine->pid == MyProcPid && IsOurs(mine, RP_LOCK_STRIPE) &&
				mine->locktag.locktag_field2 == marker->locktag.locktag_field2 &&
				mine->locktag.locktag_field3 == marker->locktag.locktag_field3)
			{
				walkers[n++] = marker->pid;
				break;
			}
		}
	}
	return n;
}

/* Add the holders of tag (but us and those already seen) to seen[]. */
static int
AddHolders(const LockData *data, const LOCKTAG *tag, int *seen, int nseen)
{
	for (int i = 0; i < data->nelements; i++)
	{
		const LockInstanceData *e = &data->locks[i];
		bool		known = e->pid == MyProcPid;

		if (e->holdMask == 0 || memcmp(&e->locktag, tag, sizeof(LOCKTAG)) != 0)
			continue;
		for (int k = 0; k < nseen && !known; k++)
			known = seen[k] == e->pid;
		if (!known)
			seen[nseen++] = e->pid;
	}
	return nseen;
}

/*
 * Complete seen[] (backends, nseen of them so far) with the holders of the
 * locks each backend in it waits for, and so on: every backend the first
 * ones wait for, directly or through others (never us: AddHolders).
 */
static int
AddWaitedFor(const LockData *data, int *seen, int nseen)
{
	for (int k = 0; k < nseen; k++)
		for (int i = 0; i < data->nelements; i++)
			if (data->locks[i].pid == seen[k] && data->locks[i].waitLockMode != NoLock)
				nseen = AddHolders(data, &data->locks[i].locktag, seen, nseen);
	return nseen;
}

static bool
InSeen(const int *seen, int nseen, int pid)
{
	for (int k = 0; k < nseen; k++)
		if (seen[k] == pid)
			return true;
	return false;
}

/*
 * Do we hold that lock, one a walk's rollback gives back (a stripe, a user
 * or bucket lock, the gather lock; not a batch's gate slot, taken before)?
 */
static bool
HeldByUs(const LockData *data, const LOCKTAG *tag)
{
	uint16		kind = tag->locktag_field4;

	if (tag->locktag_type != LOCKTAG_ADVISORY || tag->locktag_field1 != MyDatabaseId ||
		!(kind == RP_LOCK_STRIPE || kind == RP_LOCK_USER || kind == RP_LOCK_BUCKET ||
		  kind == RP_LOCK_GATHER))
		return false;
	for (int i = 0; i < data->nelements; i++)
		if (data->locks[i].pid == MyProcPid && data->locks[i].holdMask != 0 &&
			memcmp(&data->locks[i].locktag, tag, sizeof(LOCKTAG)) == 0)
			return true;
	return false;
}

/*
 * Rule 7's question: does a holder waiting on the activity (one holding its
 * holder marker) wait for a lock we took, or for a lock held by a backend
 * that waits for one, and so on?  From a snapshot of the lock table.
 */
static bool
HolderWaitsForUs(int64 activity)
{
	LockData   *data = GetLockStatusData();
	int		   *seen = palloc(sizeof(int) * (data->nelements + 1));
	int			nseen;
	LOCKTAG		marker;
	bool		found = false;

	RpLockTag(&marker, RP_LOCK_HOLDER, activity, 0);
	nseen = AddWaitedFor(data, seen, AddHolders(data, &marker, seen, 0));
	for (int i = 0; i < data->nelements && !found; i++)
		found = data->locks[i].waitLockMode != NoLock &&
			InSeen(seen, nseen, data->locks[i].pid) &&
			HeldByUs(data, &data->locks[i].locktag);
	pfree(seen);
	pfree(data->locks);
	pfree(data);
	return found;
}

/* The age an age marker in the lock table holds (AgeMarker). */
static TimestampTz
AgeOf(const LockInstanceData *e)
{
	return (TimestampTz) (((uint64) e->locktag.locktag_field2 << 32) |
						  e->locktag.locktag_field3);
}

/*
 * Should the wait for *waited give way to the cycle PostgreSQL just found
 * it in?  From a snapshot of the lock table: the backends reached from the
 * holders of *waited by following, from each backend reached, the holders
 * of the lock it waits for.  Yes when a walk waiting for a stripe we hold
 * is among them (rule 6: it has an edge to us, so it is in the cycle), or
 * when waits of rule 4 are among them and every one is younger than ours
 * (rule 8; the same age goes to the lower pid).  A walk merely queued
 * behind us while we are in a cycle of holders (or with a batch waiting
 * for one stripe, which keeps its user locks) is not reached: then giving
 * way would only make the cycle last.
 */
static bool
GiveWayInCycle(const LOCKTAG *waited)
{
	LockData   *data = GetLockStatusData();
	int		   *walkers = palloc(sizeof(int) * (data->nelements + 1));
	int		   *seen = palloc(sizeof(int) * (data->nelements + 1));
	int			nwalkers = WalkersOfMine(data, walkers);
	int			nseen = AddWaitedFor(data, seen, AddHolders(data, waited, seen, 0));
	TimestampTz ours = HolderAge();
	bool		walker = false;
	bool		younger = false;
	bool		older = false;

	for (int w = 0; w < nwalkers && !walker; w++)
		walker = InSeen(seen, nseen, walkers[w]);
	for (int i = 0; i < data->nelements; i++)
	{
		const LockInstanceData *e = &data->locks[i];

		if (!IsOurs(e, RP_LOCK_AGE) || !InSeen(seen, nseen, e->pid))
			continue;
		if (AgeOf(e) < ours || (AgeOf(e) == ours && e->pid < MyProcPid))
			older = true;
		else
			younger = true;
	}
	pfree(walkers);
	pfree(seen);
	pfree(data->locks);
	pfree(data);
	return walker || (younger && !older);
}

static bool
HolderRun(RpSubCall *call)
{
	RpPatientBegin(call->activity);
	(void) RpLockMode(call->kind, call->activity, call->sub, call->mode, true);
	RpPatientEnd();
	return true;
}

static bool
HolderGaveWay(RpSubCall *call, int sqlerrcode)
{
	LOCKTAG		waited;

	patient = false;			/* the rollback undid its deadlock_timeout */
	if (sqlerrcode != ERRCODE_T_R_DEADLOCK_DETECTED)
		return false;
	RpLockTag(&waited, call->kind, call->activity, call->sub);
	if (call->yields_left > 0 && GiveWayInCycle(&waited))
	{
		call->yields_left--;
		return true;
	}
	if (streak_start == 0)
		streak_start = GetCurrentTransactionStartTimestamp();
	return false;
}

static void
HolderWait(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	RpSubCall	call = {0};

	call.run = HolderRun;
	call.gave_way = HolderGaveWay;
	call.kind = kind;
	call.activity = activity;
	call.sub = sub;
	call.mode = mode;
	call.yields_left = RP_MAX_YIELDS;

	while (InSubTransaction(&call) == RP_STEP_RESTART)
		ereport(DEBUG1,
				(errmsg_internal("redpacket: a wait on activity " INT64_FORMAT " closed a cycle with a restartable walk, which gives way; waits again",
								 activity)));
}

/*
 * Rule 3: holding nothing, become the gatherer: the gather lock, then the
 * claim's user lock, then every stripe in stripe order (restartable, rule
 * 5).  False, holding none of them, when the claim must answer busy
 * instead.
 */
static bool
GatherStep(const RpActivity *act, const void *arg)
{
	uint32		user_hash = *(const uint32 *) arg;

	if (!RpWaitLock(RP_LOCK_GATHER, act->id, 0, ExclusiveLock))
		return false;
	if (RpLockUser(act->id, user_hash, true))
	{
		if (AllStripesStep(act, 0))
			return true;
		RpUnlockUser(act->id, user_hash);
	}
	RpUnlock(RP_LOCK_GATHER, act->id, 0);
	return false;
}

bool
RpGatherBegin(const RpActivity *act, uint32 user_hash)
{
	return Restartable(GatherStep, act, &user_hash);
}

/*
 * Rule 0: admission.  A batch takes one of the activity's gate slots (as
 * many as it has stripes, at most RP_BATCH_GATE_SLOTS) before its user
 * locks and keeps it to the end of its transaction, like the stripes it
 * writes (a batch that wrote none gives it back, RpBatchGateLeave).  So
 * at most that many transactions hold batch user locks and compete for
 * stripes at once; the other batches wait for a slot holding
 * no lock of the activity: one lock each, however many users they carry.
 * Without it, hundreds of batches waited for a few stripes holding ~150
 * user and bucket locks each.  A transaction that holds locks
 * of earlier claims on the activity (rule 4), including a slot of its own,
 * passes: it never waits for the gate.
 */
#define RP_BATCH_GATE_SLOTS 64

int
RpBatchGateEnter(const RpActivity *act)
{
	uint32		slots = (uint32) Max(Min(act->stripes, RP_BATCH_GATE_SLOTS), 1);
	uint32		start = (uint32) RpMyProcNumber % slots;

	if (RpHeldEarlier(act->id))
		return -1;
	for (uint32 i = 0; i < slots; i++)
		if (RpLock(RP_LOCK_GATE, act->id, (start + i) % slots, false))
			return (int) ((start + i) % slots);
	if (!RpWaitLock(RP_LOCK_GATE, act->id, start, ExclusiveLock))
		return RP_GATE_BUSY;
	return (int) start;
}

/*
 * A batch that wrote no stripe gives its slot back when its call ends: it
 * holds no stripe another batch could wait for, and kept to the end of an
 * idle or prepared transaction the slot would turn batches of other users
 * away (only its user locks stay, rule 2).
 */
void
RpBatchGateLeave(int64 activity, int slot)
{
	if (slot >= 0)
		RpUnlock(RP_LOCK_GATE, activity, (uint32) slot);
}

/* Let go of what RpGatherBegin took (the stripes written stay locked). */
void
RpGatherEnd(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
	RpUnlock(RP_LOCK_GATHER, act->id, 0);
}

/* The protocol's setting: called from _PG_init. */
void
RpLocksInit(void)
{
	DefineCustomIntVariable("redpacket.max_waiting",
							"Most claims that may wait for a lock of one activity; further ones answer busy.",
							"A claim or batch that would wait for a stripe, the gather lock or a batch gate slot while this many claims of the activity already wait answers busy at once, having written nothing. 0 means no limit.",
							&rp_max_waiting,
							RP_DEFAULT_MAX_WAITING, RP_MIN_MAX_WAITING, RP_MAX_MAX_WAITING,
							PGC_USERSET, 0, NULL, NULL, NULL);
	RegisterXactCallback(StreakEndsAtCommit, NULL);
}
