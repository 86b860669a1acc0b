/*
 * claim.h
 *		The claim engine (src/claim/) as the rest of redpacket sees it.  The
 *		engine takes money from an activity's stripes for single claims
 *		(claim.c) and batches (batch.c), under the lock protocol of locks.c,
 *		through the write backend that applies (take.h).  Besides the SQL
 *		entry points it offers: the stripes of a new activity and the checks
 *		of existing ones, holding an activity still for a walker (close,
 *		freeze, live changes, reversals, the reconciler), and a call's hold
 *		on an activity for a change that claims must see.
 */
#ifndef RP_CLAIM_H
#define RP_CLAIM_H

#include "base/base.h"

/* redpacket.stripes, redpacket.direct_claims and the lock settings */
#define RP_DEFAULT_STRIPES 64
#define RP_MIN_STRIPES 1
#define RP_MAX_STRIPES 1024
extern int	rp_default_stripes;
extern bool rp_direct_claims;
extern void RpLocksInit(void);

/* stripe.c: the stripe count of a new activity, and its stripes */
extern int	RpStripesFor(bool given, int stripes, int64 total_units, int32 packets);
extern void RpCreateStripes(int64 activity, int64 units, int32 packets, int stripes, int64 unit);

/*
 * The spread of a new activity over its stripes: stripe g of n holds
 * total / n, and the first total % n stripes one more (budget in minor
 * units and packets alike; nothing dealt), except that the packets of an
 * equal split (unit > 0 minor units each) bring exactly their money, so
 * that no stripe holds a packet it cannot pay.  RpStripeSpread gives the
 * balances (int8[]) and packets (int4[]; 0 when there is no cap, for NULL)
 * of every stripe, as a statement's parameters.
 */
extern int64 RpStripeShare(int64 total, int n, int g);
extern int64 RpStripeBalance(int64 units, int32 packets, int stripes, int g, int64 unit);
extern void RpStripeSpread(int64 units, int32 packets, int stripes, int64 unit,
						   Datum *balances, Datum *packs);

/* An activity's stripe rows all there, else an error; halted set from the activity. */
extern void RpCheckStripeRows(const RpActivity *act);
extern void RpSyncHalt(int64 activity);

/* locks.c: a walker holds the activity still */
extern void RpWalk(const RpActivity *act);
extern bool RpWalkTry(const RpActivity *act, int *busy);
extern void RpWalkEnd(const RpActivity *act);
extern bool RpHeldEarlier(int64 activity);
#define RP_USER_BUCKETS 64		/* user-lock buckets of an activity, for batches */
extern uint32 RpUserHash(text *user_id);

/* locks.c: a call's hold on its activity (rules 1 and 4 in locks.c) */
typedef struct RpCall
{
	int64		activity;
	bool		earlier;		/* the transaction kept locks of it before */
	bool		shared;			/* this call holds the activity lock shared */
} RpCall;
extern bool RpCallBegin(RpCall *call, int64 activity);
extern void RpCallEnd(RpCall *call, bool keep);
extern bool RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);

/*
 * split.c: how an activity's claims are paid, a term fixed at its creation
 * (1.6; any before): lucky, equal (*unit, in minor units, each) or caller;
 * any is 1.5's rule, an amount named is paid and none draws.
 */
typedef enum RpSplit
{
	RP_SPLIT_ANY, RP_SPLIT_LUCKY, RP_SPLIT_EQUAL, RP_SPLIT_CALLER
} RpSplit;
extern RpSplit RpSplitFromName(const char *name);
extern const char *RpSplitName(RpSplit split);
extern RpSplit RpActivitySplit(const RpActivity *act, int64 *unit);

#endif							/* RP_CLAIM_H */
