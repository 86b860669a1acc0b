/*
 * locks.c
 *		The locking protocol of rp_claim and rp_claim_batch.
 *
 *		Locks.  A single claim holds its user's lock (activity, hash of the
 *		user) and, in RowExclusiveLock, the user's bucket (hash modulo
 *		RP_USER_BUCKETS).  A small batch does the same for each of its users;
 *		a batch of many users holds their buckets in ExclusiveLock instead,
 *		so it needs at most RP_USER_BUCKETS user locks whatever its size, and
 *		still excludes every single claim of its users (batch.c).  Money is taken under stripe locks, kept to the end of the
 *		transaction for the stripes written.
 *
 *		Waiting.  Which waits are allowed, and why a transaction that makes a
 *		single rp_claim call is never part of a deadlock:
 *		1. A claim or batch never waits for a stripe while holding a lock it
 *		   took itself: it gives everything back, waits for the busy stripe,
 *		   keeps it, and takes the rest only if they are free (else gives
 *		   back again).  A single claim waits for its user and bucket locks
 *		   holding nothing of its own either (RpLockUser).
 *		2. A batch waits for its buckets in bucket order, then for its users
 *		   in hash order, holding only lower ones of its own.
 *		3. A claim or batch that needs every stripe and holds nothing from
 *		   earlier claims on the activity in its transaction (a gatherer)
 *		   gives everything back, takes the activity's gather lock, waits
 *		   for every stripe in stripe order and then for its user or bucket
 *		   locks.  The lock queues are fair, so it is served in bounded time
 *		   while other claims keep coming.  Close, freeze and reconciliation
 *		   also wait for the stripes in stripe order, holding nothing else.
 *		4. A transaction that holds locks of earlier claims on the activity
 *		   is not a gatherer: it gathers by rule 1.
 *		A cycle of waits needs someone who waits while holding a lock that
 *		another waiter in the cycle wants.  By 1 that is never a single
 *		claim's own lock.  Gatherers are serialized by the gather lock and,
 *		with close, freeze and reconciliation, take stripes in one order;
 *		batches take user locks in one order.  So a cycle needs a
 *		transaction that holds locks of earlier claims (out of that order)
 *		and waits: two such transactions, or one and a gatherer (which a
 *		single rp_claim call can be), or one and close/freeze.  PostgreSQL's
 *		deadlock detector fails one of them with 40P01.  An earlier version
 *		refused such a transaction's wait up front while a gatherer was
 *		about (a share lock on the gather lock); under the stress run that
 *		failed about 4% of the two-claim transactions, far more often than
 *		the deadlocks it prevents, so it was dropped.
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "storage/proc.h"
#include "utils/guc.h"

#include "redpacket.h"

uint32
RpUserHash(text *user_id)
{
	return hash_bytes((const unsigned char *) VARDATA_ANY(user_id),
					  VARSIZE_ANY_EXHDR(user_id));
}

/*
 * The activities on which this transaction has kept locks from a claim or
 * a batch (a few; past that, every activity counts as held).
 */
#define RP_HELD_MAX 8
static LocalTransactionId held_lxid = InvalidLocalTransactionId;
static int	held_n = 0;
static bool held_overflow = false;
static int64 held_ids[RP_HELD_MAX];

bool
RpHeldEarlier(int64 activity)
{
	if (held_lxid != MyProc->lxid)
		return false;
	if (held_overflow)
		return true;
	for (int i = 0; i < held_n; i++)
		if (held_ids[i] == activity)
			return true;
	return false;
}

/* A claim or batch on the activity is done and keeps its locks. */
void
RpNoteHeld(int64 activity)
{
	if (held_lxid != MyProc->lxid)
	{
		held_lxid = MyProc->lxid;
		held_n = 0;
		held_overflow = false;
	}
	if (RpHeldEarlier(activity))
		return;
	if (held_n < RP_HELD_MAX)
		held_ids[held_n++] = activity;
	else
		held_overflow = true;
}

/*
 * Wait for a lock of the activity (every wait of the claim paths comes
 * through here; see rule 4 above).
 */
void
RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode)
{
	(void) RpLockMode(kind, activity, sub, mode, true);
}

/*
 * Take a single claim's user lock and bucket lock.  Without wait, only if
 * both are free.  With wait, each wait holds neither (rule 1), except for a
 * gatherer, which holds its stripes (rule 3).
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
		RpWaitLock(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
		if (RpLock(RP_LOCK_USER, activity, user_hash, false))
			return true;
		RpUnlockMode(RP_LOCK_BUCKET, activity, bucket, RowExclusiveLock);
		RpWaitLock(RP_LOCK_USER, activity, user_hash, ExclusiveLock);
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

/* Rule 3: holding nothing, become the gatherer and wait for every stripe. */
static int	gather_guc_level = 0;

/*
 * A gatherer waits holding the stripes it already has, so a transaction
 * that holds a later stripe from an earlier claim and then waits for one of
 * them closes a cycle (rule 4).  The waiter whose deadlock_timeout runs out
 * first finds the cycle and is the one PostgreSQL fails with 40P01; the
 * gatherer waits with ten times the timeout, so the victim is the
 * transaction that made earlier claims, not the gatherer (which may be a
 * single rp_claim call).  The setting is undone in RpGatherEnd, or by the
 * transaction's end on an error.
 */
void
RpGatherBegin(const RpActivity *act)
{
	gather_guc_level = NewGUCNestLevel();
	(void) set_config_option("deadlock_timeout",
							 psprintf("%d", Min(DeadlockTimeout, PG_INT32_MAX / 10) * 10),
							 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	RpWaitLock(RP_LOCK_GATHER, act->id, 0, ExclusiveLock);
	RpLockAllStripes(act);
}

/* Let go of what RpGatherBegin took (the stripes written stay locked). */
void
RpGatherEnd(const RpActivity *act)
{
	for (int s = 0; s < act->stripes; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
	RpUnlock(RP_LOCK_GATHER, act->id, 0);
	AtEOXact_GUC(true, gather_guc_level);
}
