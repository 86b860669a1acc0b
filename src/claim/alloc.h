/*
 * alloc.h
 *		The allocator: where the money and the packet of one claim come from,
 *		as a pure function of the stripes' state and the request (alloc.c).
 *		The single claim (stripe.c) and every element of a batch (batch.c)
 *		decide with it, and test/alloc/ checks it over generated cases
 *		without a server.
 */
#ifndef RP_ALLOC_H
#define RP_ALLOC_H

#include "postgres.h"

/* Lucky-draw amounts drawn ahead from the pool and dealt to a stripe at a time. */
#define RP_DEAL_BLOCK 32

/*
 * One stripe as the allocator sees it.  balance and packets include the
 * dealt amounts (packets is 0 when the activity has no cap); dealt holds the
 * ndealt amounts dealt to the stripe, next first.
 */
typedef struct RpStripeState
{
	int64		balance;
	int64		packets;
	int			ndealt;
	const int64 *dealt;
} RpStripeState;

typedef enum RpAllocResult
{
	RP_ALLOC_PAID,
	RP_ALLOC_NEED_ALL,			/* the stripes held cannot pay: hold them all */
	RP_ALLOC_EXHAUSTED			/* every stripe held, and together they cannot pay */
} RpAllocResult;

typedef struct RpAllocIn
{
	int			n;
	const RpStripeState *stripes;	/* n of them */
	const bool *visible;		/* the stripes the caller holds; NULL: all */
	bool		capped;			/* the activity counts packets */
	bool		deal;			/* lucky draws are drawn for the whole activity and
								 * dealt (more than one stripe, a 1.4 catalog) */
	bool		others_clear;	/* the stripes not visible hold no undealt money
								 * or packet (read after the pool was locked) */
	int			start;			/* first stripe to look at */
	int64		units;			/* the fixed amount, or 0 for a lucky draw */
	int64		(*draw) (int64 balance, int64 packets);
	int64	   *scratch;		/* room for n * RP_DEAL_BLOCK dealt amounts */
} RpAllocIn;

/*
 * On RP_ALLOC_PAID: the claim's amount, the stripe that counts its packet
 * and its claim, and every stripe's state after it (next, n of them, owned
 * by the caller; a next[s].dealt may point into the input's dealt arrays or
 * into scratch); changed[s] says whether stripe s must be written.
 */
typedef struct RpAllocOut
{
	int			primary;
	int64		units;
	RpStripeState *next;
	bool	   *changed;
} RpAllocOut;

extern RpAllocResult RpAllocate(const RpAllocIn *in, RpAllocOut *out);

/*
 * Can a stripe with this much undealt money and undealt packets pay a
 * fixed amount alone?  The one rule of rule 1 of alloc.c, of the careful
 * path's guess (stripe.c) and of the executor's fast take (direct.c); the
 * SQL statements spell it as RP_SQL_CAN_PAY_14 (take.h).
 */
static inline bool
RpFixedFits(int64 undealt_units, int64 undealt_packets, bool capped, int64 units)
{
	return undealt_units >= units && (!capped || undealt_packets > 0);
}

/*
 * Rule 2 of alloc.c without a claim: deal a block from the pool (stripe 0)
 * to each stripe held with nothing dealt, when the pool holds every undealt
 * money and packet.  Returns the first stripe dealt to, or -1 when nothing
 * was dealt; out as for RpAllocate (no claim: primary -1, units 0).
 */
extern int	RpAllocDeal(const RpAllocIn *in, RpAllocOut *out);

#endif							/* RP_ALLOC_H */
