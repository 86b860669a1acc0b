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
 *		dealt amount.
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
 *		2. Otherwise, when the caller holds only some of the stripes, it must
 *		   lock them all and ask again (RP_ALLOC_NEED_ALL).
 *		3. With every stripe held, the activity's totals decide, so nothing
 *		   is exhausted while the stripes together could pay:
 *		   - a fixed amount is paid when all the money together covers it
 *		     (and a packet is left), from the undealt money and packets of
 *		     every stripe taken together (the dealt amounts returned first,
 *		     when the undealt part is too small); the rest is spread over as
 *		     many stripes as can each pay the same amount again alone, so the
 *		     next claims of that size need no gathering.
 *		   - a lucky draw (no stripe has a dealt amount, or rule 1 would
 *		     have paid) is refused only when no money or no packet is left.
 *		     The next RP_DEAL_BLOCK amounts of every stripe are drawn (as
 *		     they are when the activity is created: RpDeal), one
 *		     after the other, by the double-mean method over the activity's
 *		     whole undealt money and packets, the last packet taking the
 *		     exact remainder, and dealt round the stripes from stripe 0;
 *		     what is not dealt is spread evenly over the stripes; then the
 *		     claim takes stripe 0's first amount.  So
 *		     every amount of the activity is a draw of the method run on
 *		     one pool, whatever the stripe count.  Without dealing (a
 *		     catalog older than 1.4) the draw is the double mean of the
 *		     totals, its money taken from the primary, then the fullest.
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
			if (UndealtUnits(st) >= in->units && (!in->capped || UndealtPackets(st) > 0))
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
 * Rule 3, a fixed amount: the claim is paid from every stripe's undealt
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

/*
 * Deal the next block of every stripe (up to RP_DEAL_BLOCK amounts each)
 * from a pool of money and packets, nothing being dealt before: the amounts
 * drawn one after the other by the double-mean method over what the pool
 * still holds (the last packet taking the exact remainder) and dealt round
 * the stripes, the j-th to stripe (start + j) % n, so that small activities
 * spread over every stripe; what is not dealt is spread evenly.  next[]
 * gets every stripe's state, its dealt amounts in scratch (room for
 * n * RP_DEAL_BLOCK).
 */
void
RpDeal(int n, int start, int64 money, int64 packets, int64 (*draw) (int64, int64),
	   int64 *scratch, RpStripeState *next)
{
	int64		deal = Min(packets, (int64) n * RP_DEAL_BLOCK);

	for (int s = 0; s < n; s++)
	{
		next[s].dealt = scratch + s * RP_DEAL_BLOCK;
		next[s].ndealt = 0;
		next[s].balance = 0;
		next[s].packets = 0;
	}
	for (int64 j = 0; j < deal && money > 0; j++)
	{
		RpStripeState *nx = &next[(start + j) % n];
		int64		x = draw(money, packets);

		((int64 *) nx->dealt)[nx->ndealt++] = x;
		nx->balance += x;
		nx->packets++;
		money -= x;
		packets--;
	}
	for (int i = 0; i < n; i++)
	{
		RpStripeState *nx = &next[(start + i) % n];

		nx->balance += money / n + (i < money % n ? 1 : 0);
		nx->packets += packets / n + (i < packets % n ? 1 : 0);
	}
}

/*
 * Rule 3, a lucky draw with dealing: deal (from stripe 0 on, as at
 * creation: the order the amounts were drawn in is then known from the
 * stripes), then the first amount of stripe 0.
 */
static void
AllocDeal(const RpAllocIn *in, RpAllocOut *out, int64 money, int64 packets)
{
	RpDeal(in->n, 0, money, packets, in->draw, in->scratch, out->next);
	for (int s = 0; s < in->n; s++)
		out->changed[s] = true;
	PayDealt(in, out, 0);
}

/*
 * Rule 3, a lucky draw without dealing: the double mean of the totals; the
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

RpAllocResult
RpAllocate(const RpAllocIn *in, RpAllocOut *out)
{
	int64		money = 0;
	int64		packets = 0;
	int64		undealt_money = 0;
	int64		undealt_packets = 0;

	out->primary = -1;
	out->units = 0;
	for (int s = 0; s < in->n; s++)
	{
		out->next[s] = in->stripes[s];
		out->changed[s] = false;
	}

	if (AllocAlone(in, out))
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
	if (in->deal)
		AllocDeal(in, out, money, packets);
	else
		AllocDrawSplit(in, out, money, packets);
	return RP_ALLOC_PAID;
}
