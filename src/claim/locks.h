/*
 * locks.h
 *		The claim paths' side of the lock protocol (locks.c, whose file
 *		comment has the protocol and why no single call closes a cycle; the
 *		walkers' side is in claim.h), and load shedding with
 *		redpacket.max_waiting.
 */
#ifndef RP_LOCKS_H
#define RP_LOCKS_H

#include "claim.h"

#define RP_DEFAULT_MAX_WAITING 0
#define RP_MIN_MAX_WAITING 0
#define RP_MAX_MAX_WAITING 10000
extern int	rp_max_waiting;

/* Inside the scope a wait may be refused for busy; returns the outer scope. */
extern bool RpBusyScope(bool on);

extern bool RpGatherBegin(RpCall *call, const RpActivity *act);
extern void RpGatherEnd(RpCall *call, const RpActivity *act);

/* A lock found busy, whose holders' ends a call holding nothing waits for. */
typedef struct RpBusyLock
{
	int64		activity;
	RpLockKind	kind;
	uint32		sub;
	LOCKMODE	mode;			/* the mode the call wanted */
} RpBusyLock;
extern void RpBusyIs(RpBusyLock *busy, RpLockKind kind, int64 activity, uint32 sub,
					 LOCKMODE mode);
extern bool RpWaitHolders(const RpBusyLock *busy);

extern bool RpLockUser(int64 activity, uint32 user_hash);
extern bool RpTryUser(int64 activity, uint32 user_hash, RpBusyLock *busy);
extern void RpUnlockUser(int64 activity, uint32 user_hash);

/* A batch's user locks (rule 3 in locks.c). */
typedef struct RpUserLocks
{
	int64		activity;
	uint32	   *buckets;		/* distinct, ascending */
	int			nbuckets;
	uint32	   *users;			/* distinct user hashes, ascending; NULL: exclusive buckets */
	int			nusers;
} RpUserLocks;
extern bool RpLockUsers(const RpUserLocks *ul);
extern void RpUnlockUsers(const RpUserLocks *ul);

/* Try to lock every stripe, all or none (busy: one that was not free). */
extern bool RpTryLockAllStripes(const RpActivity *act, int *busy);

#define RP_GATE_BUSY (-2)
extern int	RpBatchGateEnter(const RpActivity *act, const RpCall *call);
extern void RpBatchGateLeave(int64 activity, int slot);

#endif							/* RP_LOCKS_H */
