/*
 * stripe.h
 *		Taking money from an activity's stripes (stripe.c): where a claim
 *		starts (spread), the stripes one claim or batch holds and decides
 *		over (a stripe set: lock, read, allocate, write), gathering every
 *		stripe, and the careful path's take.
 */
#ifndef RP_STRIPE_H
#define RP_STRIPE_H

#include "alloc.h"
#include "claim.h"

/* The stripe count of a new activity at most one per this many packets. */
#define RP_PACKETS_PER_STRIPE 64

/* Where a claim starts probing; inside one transaction, the stripe it holds. */
extern int	RpStartStripe(const RpActivity *act);
extern void RpRememberStripe(const RpActivity *act, int stripe);

/* The double-mean draw in minor units (uniform in 1 .. twice the mean). */
extern int64 RpDrawUnits(int64 balance, int64 packets);

/* The outcome of an attempt to take money (single claims and batches). */
typedef enum RpTakeResult
{
	RP_TAKE_OK,
	RP_TAKE_EXHAUSTED,
	RP_TAKE_HALTED,				/* a stripe held is halted: frozen or closed since
								 * the activity was read (or marked so by hand) */
	RP_TAKE_STALE,				/* a stripe held is at a newer revision: the
								 * schedule changed since the activity was read */
	RP_TAKE_DIVERT,				/* the fast path gave up: the careful path decides */
	RP_TAKE_WAIT,				/* the stripe *wait is busy: wait for it, then retry */
	RP_TAKE_GATHER,				/* every stripe is needed, *wait is busy: gather */
	RP_TAKE_BUSY				/* it would have waited, and too many wait already */
} RpTakeResult;

/*
 * The stripes of one activity that one claim, or one batch, holds and
 * decides over.  read is each stripe as read (under its lock, or a guess
 * read without locks); now is after the decisions so far, which claims
 * counts per stripe; decisions are undone with RpStripeSetReset.
 */
typedef struct RpStripeSet
{
	const RpActivity *act;
	int			n;
	bool		all;			/* every stripe is locked by this set */
	bool	   *locked;
	bool	   *halted;			/* as read */
	int64	   *revision;		/* as read */
	RpStripeState *read;		/* dealt amounts only of the stripes held */
	int64	   *dealt_units;	/* as read, of every stripe read */
	int64	   *dealt_count;
	RpStripeState *now;
	int64	   *claims;			/* claims the decisions so far count on each stripe */
	bool	   *changed;		/* now differs from read */
	bool		deal;			/* lucky draws are dealt (more than one stripe, 1.4) */
	bool		deal_ahead;		/* a first call on the activity: may deal ahead */
	bool		others_clear;	/* as read: the stripes not held hold no undealt
								 * money or packet (alloc.h) */
	int			last_primary;	/* the stripe the last decision counted, or -1 */
	RpStripeState *next;		/* scratch of one allocation */
	bool	   *next_changed;
	int64	   *scratch;		/* the allocator's, RP_DEAL_BLOCK amounts */
	MemoryContext cxt;
} RpStripeSet;

extern void RpStripeSetInit(RpStripeSet *set, const RpActivity *act);
extern bool RpStripeSetTryLock(RpStripeSet *set, int s);
extern bool RpStripeSetLockAll(RpStripeSet *set, int *busy);
extern void RpStripeSetHoldAll(RpStripeSet *set);
extern void RpStripeSetRelease(RpStripeSet *set);
extern void RpStripeSetRead(RpStripeSet *set, bool guess);
extern void RpStripeSetReset(RpStripeSet *set);
extern RpTakeResult RpStripeSetStale(const RpStripeSet *set);
extern RpAllocResult RpStripeSetTake(RpStripeSet *set, int64 units, int start, int *primary,
									 int64 *amount);
extern void RpStripeSetWrite(RpStripeSet *set);


/*
 * The careful path's take for one claim of units (0: a lucky draw): on
 * RP_TAKE_OK the stripe that counts it and the amount; the stripes written
 * stay locked to the end of the transaction, every other lock it took is
 * given back.  On RP_TAKE_WAIT / RP_TAKE_GATHER nothing is held or written.
 */
extern RpTakeResult RpTakeCareful(const RpActivity *act, int64 units, bool all_held,
								  bool earlier, int *stripe, int64 *amount, int *wait);

#endif							/* RP_STRIPE_H */
