/*
 * alloc.c
 *		The allocator: where the money and the packet of one claim come from.
 *		RpAllocate is a pure function of the stripes' state and the request;
 *		it reads and writes nothing else (see alloc.h).
 *
 *		Words.  A stripe's money and packets are *dealt* when they belong to
 *		lucky-draw amounts already drawn for the whole activity and handed to
 *		that stripe (dealt, next first), *undealt* otherwise.  Fixed amounts
 *		are paid from undealt money and packets; a lucky draw takes the next
 *		dealt amount.  The *pool* is stripe 0 when it holds all the undealt
 *		money and packets of the activity: once lucky draws have begun it
 *		does, and each block of amounts is drawn from it.
 *
 *		The rules, in order:
 *		1. A stripe that can pay the whole claim alone pays it: the first one
 *		   in the caller's spread order among those it holds.  For a fixed
 *		   amount, one with that much undealt money (and an undealt packet,
 *		   if the activity counts them); for a lucky draw, one with a dealt
 *		   amount, or, when nothing is dealt (one stripe, or a catalog older
 *		   than 1.4), one with a packet and money, which draws the double
 *		   mean of its own balance and packets -- for one stripe that is the
 *		   whole activity.
 *		2. A lucky draw on the stripes held, none with a dealt amount, when
 *		   the caller holds the pool (stripe 0, holding every undealt money
 *		   and packet: the caller vouches for the stripes it does not hold,
 *		   others_clear) and the pool has money and a packet: the next
 *		   blocks are drawn from the pool (Refill) by the double-mean
 *		   method, one amount after the other, the last packet of the
 *		   activity taking the exact remainder, and dealt to the stripes
 *		   held, a block each in spread order (the pool too can be dealt
 *		   to); the claim takes the first amount.  A block is RP_DEAL_BLOCK
 *		   amounts, fewer as the pool runs low (a share of the stripes'
 *		   count), so that the last packets are spread.
 *		3. Otherwise, when the caller holds only some of the stripes, it must
 *		   lock them all and ask again (RP_ALLOC_NEED_ALL).
 *		4. With every stripe held, the activity's totals decide, so nothing
 *		   is exhausted while the stripes together could pay:
 *		   - a fixed amount is paid when all the money together covers it
 *		     (and a packet is left), from the undealt money and packets of
 *		     every stripe taken together (the dealt amounts returned first,
 *		     when the undealt part is too small); the rest is spread over as
 *		     many stripes as can each pay the same amount again alone, so the
 *		     next claims of that size need no gathering.
 *		   - a lucky draw (no stripe has a dealt amount, or rule 1 would
 *		     have paid) is refused only when no money or no packet is left.
 *		     Every stripe's undealt money and packets move to the pool, and
 *		     rule 2 deals.  Without dealing (a catalog older than 1.4) the
 *		     draw is the double mean of the totals, its money taken from the
 *		     primary, then the fullest.
 *		So every amount of a lucky draw is the next draw of the method run on
 *		one pool, the whole activity's, whatever the stripe count, and only
 *		the first draw (and one after a fixed claim or a reversal spread
 *		undealt money) gathers: a deal holds the pool and the stripes it deals
 *		to, and waits at most for the pool (stripe.c).  Claims made one
 *		after the other in one transaction take the amounts in the order
 *		they were drawn (concurrent claims on other stripes need not):
 *		blocks are dealt in spread order, claims go on in spread order, and
 *		a deal comes only when nothing dealt is left to them.
 *
 *		Why the pool is the whole activity.  The caller of rule 2 that does
 *		not hold every stripe reads the others after it locked the pool and
 *		finds no undealt money or packet on them.  Every change that adds
 *		undealt money or packets to a stripe other than the pool is made
 *		holding every stripe, the pool among them (a gather, a reversal, a
 *		live change, a repair), or by the creating transaction; so none can
 *		be under way while the caller holds the pool, and one that committed
 *		before is seen by the caller's read (a snapshot taken after it locked
 *		the pool: READ COMMITTED only; under REPEATABLE READ the caller does
 *		not vouch, stripe.c).  Were a future writer
 *		to break that, the draw would be the method over part of the
 *		undealt money: within its bounds, never more than the stripes hold.
 */
#include "postgres.h"

#include "alloc.h"

static bool
Visible(const RpAllocIn *in, int s)
{
	return in->visible == NULL || in->visible[s];
}

static int64
DealtUnits(const RpStripeState *st)
{
	int64		sum = 0;

	for (int i = 0; i < st->ndealt; i++)
		sum += st->dealt[i];
	return sum;
}

static int64
UndealtUnits(const RpStripeState *st)
{
	return st->balance - DealtUnits(st);
}

static int64
UndealtPackets(const RpStripeState *st)
{
	return st->packets - st->ndealt;
}

/* Pay units (and a packet, if counted) from next[s]. */
static void
Pay(const RpAllocIn *in, RpAllocOut *out, int s, int64 units)
{
	out->next[s].balance -= units;
	if (in->capped)
		out->next[s].packets -= 1;
	out->changed[s] = true;
	out->primary = s;
	out->units = units;
}

/* Take the next dealt amount of next[s]. */
static void
PayDealt(const RpAllocIn *in, RpAllocOut *out, int s)
{
	int64		x = out->next[s].dealt[0];

	out->next[s].dealt++;
	out->next[s].ndealt--;
	Pay(in, out, s, x);
}

/* Rule 1: one stripe pays it all; false if none can. */
static bool
AllocAlone(const RpAllocIn *in, RpAllocOut *out)
{
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;
		const RpStripeState *st = &in->stripes[s];

		if (!Visible(in, s))
			continue;
		if (in->units > 0)
		{
			if (RpFixedFits(UndealtUnits(st), UndealtPackets(st), in->capped, in->units))
			{
				Pay(in, out, s, in->units);
				return true;
			}
		}
		else if (st->ndealt > 0)
		{
			PayDealt(in, out, s);
			return true;
		}
		else if (!in->deal && st->packets > 0 && st->balance > 0)
		{
			Pay(in, out, s, in->draw(st->balance, st->packets));
			return true;
		}
	}
	return false;
}

/*
 * Spread money and packets over the first m stripes in spread order from
 * start (the others get none), evenly, as undealt shares added to next[].
 */
static void
SpreadUndealt(const RpAllocIn *in, RpAllocOut *out, int m, int64 money, int64 packets)
{
	for (int i = 0; i < m; i++)
	{
		int			s = (in->start + i) % in->n;

		out->next[s].balance += money / m + (i < money % m ? 1 : 0);
		out->next[s].packets += packets / m + (i < packets % m ? 1 : 0);
		out->changed[s] = true;
	}
}

/*
 * Rule 4, a fixed amount: the claim is paid from every stripe's undealt
 * money and packets taken together (every dealt amount returned first, when
 * the undealt part is too small: a fixed claim on an activity whose packets
 * are dealt to lucky draws).  The rest is then spread over as many stripes
 * as can each pay the same amount again alone (at least one), the first in
 * spread order: a claim no single stripe could pay leaves the activity laid
 * out so that the next ones of its size need no gathering, and as many
 * stripes as the money allows still share the claims.
 */
static void
AllocFixedAll(const RpAllocIn *in, RpAllocOut *out, bool undeal)
{
	int64		money = 0;
	int64		packets = 0;
	int64		m;

	for (int s = 0; s < in->n; s++)
	{
		RpStripeState *nx = &out->next[s];
		int64		take_m = undeal ? nx->balance : UndealtUnits(nx);
		int64		take_p = undeal ? nx->packets : UndealtPackets(nx);

		if (undeal && nx->ndealt > 0)
		{
			nx->ndealt = 0;
			nx->dealt = NULL;
			out->changed[s] = true;
		}
		if (take_m != 0 || take_p != 0)
			out->changed[s] = true;
		nx->balance -= take_m;
		nx->packets -= take_p;
		money += take_m;
		packets += take_p;
	}
	money -= in->units;
	if (in->capped)
		packets -= 1;
	m = Min(money / in->units, (int64) in->n);
	if (in->capped && packets > 0)
		m = Min(m, packets);
	m = Max(m, 1);
	SpreadUndealt(in, out, (int) m, money, packets);
	out->primary = in->start % in->n;
	out->units = in->units;
	out->changed[out->primary] = true;
}

/* The block each stripe gets: RP_DEAL_BLOCK, or a share of the stripes when the pool runs low. */
static int64
BlockSize(int n, int64 pool_packets)
{
	return Min((int64) RP_DEAL_BLOCK, Max((int64) 1, pool_packets / n));
}

/*
 * Deal the next block from the pool (stripe 0 of next[]: every undealt money
 * and packet of the activity) to stripe t (nothing dealt, no
 * undealt money or packet; the pool itself when t is 0): amounts drawn one
 * after the other by the double-mean method over what the pool still holds,
 * the last packet taking the exact remainder; their money and packets move
 * from the pool to t.  block is the most amounts to deal; they go to
 * amounts (room for RP_DEAL_BLOCK).  Returns how many were dealt.
 */
static int
DealBlock(RpStripeState *next, int t, int64 block, int64 (*draw) (int64, int64),
		  int64 *amounts)
{
	int64		money = UndealtUnits(&next[0]);
	int64		packets = UndealtPackets(&next[0]);
	int			k = 0;

	while (k < block && money > 0 && packets > 0)
	{
		amounts[k] = draw(money, packets);
		money -= amounts[k];
		packets--;
		if (t != 0)
		{
			next[0].balance -= amounts[k];
			next[0].packets -= 1;
			next[t].balance += amounts[k];
			next[t].packets += 1;
		}
		k++;
	}
	next[t].dealt = amounts;
	next[t].ndealt = k;
	return k;
}

/*
 * Rule 2 without the claim: when the caller holds the pool and it
 * holds every undealt money and packet (of the stripes held, as seen here;
 * of the others, as the caller vouches, others_clear), with money and a
 * packet left, deal a block to each stripe held with nothing dealt, in
 * spread order, as long as the pool lasts.  Returns the first stripe dealt
 * to, or -1 (nothing changed).
 */
static int
Refill(const RpAllocIn *in, RpAllocOut *out)
{
	int64		block;
	int			first = -1;

	if (in->units > 0 || !in->deal || !Visible(in, 0))
		return -1;
	if (UndealtUnits(&out->next[0]) <= 0 || UndealtPackets(&out->next[0]) <= 0)
		return -1;
	for (int s = 0; s < in->n; s++)
	{
		if (!Visible(in, s))
		{
			if (!in->others_clear)
				return -1;		/* undealt money elsewhere is not ruled out */
			continue;
		}
		if (s != 0 && (UndealtUnits(&out->next[s]) != 0 || UndealtPackets(&out->next[s]) != 0))
			return -1;			/* undealt money outside the pool */
	}
	block = BlockSize(in->n, out->next[0].packets);
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;

		if (!Visible(in, s) || out->next[s].ndealt > 0)
			continue;
		if (DealBlock(out->next, s, block, in->draw, in->scratch + (int64) s * RP_DEAL_BLOCK) == 0)
			break;				/* the pool is empty */
		out->changed[s] = true;
		if (first < 0)
			first = s;
	}
	out->changed[0] = true;
	return first;
}

/* Rule 2: deal a block, pay its first amount. */
static bool
AllocRefill(const RpAllocIn *in, RpAllocOut *out)
{
	int			t = Refill(in, out);

	if (t < 0)
		return false;
	PayDealt(in, out, t);
	return true;
}

/*
 * Rule 4, a lucky draw with dealing: nothing is dealt; every undealt money
 * and packet moves to the pool, then rule 2 deals (it can: the caller found
 * money and a packet left).
 */
static bool
AllocGatherPool(const RpAllocIn *in, RpAllocOut *out)
{
	for (int s = 1; s < in->n; s++)
	{
		RpStripeState *nx = &out->next[s];

		if (nx->balance == 0 && nx->packets == 0)
			continue;
		out->next[0].balance += nx->balance;
		out->next[0].packets += nx->packets;
		nx->balance = 0;
		nx->packets = 0;
		out->changed[s] = true;
	}
	out->changed[0] = true;
	return AllocRefill(in, out);	/* the pool has money and a packet */
}

/*
 * Rule 4, a lucky draw without dealing: the double mean of the totals; the
 * packet from a stripe that has one (with money, if one has both), the
 * money from it first, then from the fullest stripes.
 */
static void
AllocDrawSplit(const RpAllocIn *in, RpAllocOut *out, int64 money, int64 packets)
{
	int			primary = -1;
	int64		left;

	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;

		if (in->stripes[s].packets > 0 &&
			(primary < 0 || (in->stripes[primary].balance == 0 && in->stripes[s].balance > 0)))
			primary = s;
	}
	Assert(primary >= 0);
	out->units = in->draw(money, packets);
	left = out->units;
	while (left > 0)
	{
		int			best = primary;
		int64		more;

		if (out->next[primary].balance == 0)
			for (int s = 0; s < in->n; s++)
				if (out->next[s].balance > 0 &&
					(best == primary || out->next[s].balance > out->next[best].balance))
					best = s;
		Assert(out->next[best].balance > 0);
		more = Min(out->next[best].balance, left);
		out->next[best].balance -= more;
		out->changed[best] = true;
		left -= more;
	}
	out->next[primary].packets -= 1;
	out->changed[primary] = true;
	out->primary = primary;
}

static void
Start(const RpAllocIn *in, RpAllocOut *out)
{
	out->primary = -1;
	out->units = 0;
	for (int s = 0; s < in->n; s++)
	{
		out->next[s] = in->stripes[s];
		out->changed[s] = false;
	}
}

int
RpAllocDeal(const RpAllocIn *in, RpAllocOut *out)
{
	Start(in, out);
	return Refill(in, out);
}

RpAllocResult
RpAllocate(const RpAllocIn *in, RpAllocOut *out)
{
	int64		money = 0;
	int64		packets = 0;
	int64		undealt_money = 0;
	int64		undealt_packets = 0;

	Start(in, out);
	if (AllocAlone(in, out) || AllocRefill(in, out))
		return RP_ALLOC_PAID;
	for (int s = 0; s < in->n; s++)
		if (!Visible(in, s))
			return RP_ALLOC_NEED_ALL;

	for (int s = 0; s < in->n; s++)
	{
		money += in->stripes[s].balance;
		packets += in->stripes[s].packets;
		undealt_money += UndealtUnits(&in->stripes[s]);
		undealt_packets += UndealtPackets(&in->stripes[s]);
	}
	if (in->units > 0)
	{
		if (money < in->units || (in->capped && packets < 1))
			return RP_ALLOC_EXHAUSTED;
		AllocFixedAll(in, out, undealt_money < in->units || (in->capped && undealt_packets < 1));
		return RP_ALLOC_PAID;
	}
	if (money == 0 || packets == 0)
		return RP_ALLOC_EXHAUSTED;
	if (!in->deal)
		AllocDrawSplit(in, out, money, packets);
	else if (!AllocGatherPool(in, out))
		return RP_ALLOC_EXHAUSTED;
	return RP_ALLOC_PAID;
}
