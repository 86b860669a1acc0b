/*
 * locks.h
 *		The claim paths' locking protocol (locks.c, whose file comment has the
 *		rules and why they never make a single call part of a deadlock), and
 *		load shedding with redpacket.max_waiting.
 */
#ifndef RP_LOCKS_H
#define RP_LOCKS_H

#include "redpacket.h"

#define RP_DEFAULT_MAX_WAITING 0
#define RP_MIN_MAX_WAITING 0
#define RP_MAX_MAX_WAITING 10000
extern int	rp_max_waiting;
extern void RpLocksInit(void);

/* Inside the scope a wait may be refused for busy; returns the outer scope. */
extern bool RpBusyScope(bool on);

extern bool RpLockUser(int64 activity, uint32 user_hash, bool wait);
extern void RpUnlockUser(int64 activity, uint32 user_hash);
extern bool RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);

/* A batch's user locks (rule 2 in locks.c). */
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
extern bool RpWaitUsersAndAllStripes(const RpActivity *act, const RpUserLocks *ul);
extern bool RpGatherBegin(const RpActivity *act, uint32 user_hash);
extern void RpGatherEnd(const RpActivity *act);
extern void RpPatientBegin(int64 activity);
extern void RpPatientEnd(void);

#define RP_GATE_BUSY (-2)
extern int	RpBatchGateEnter(const RpActivity *act);
extern void RpBatchGateLeave(int64 activity, int slot);

#endif							/* RP_LOCKS_H */
