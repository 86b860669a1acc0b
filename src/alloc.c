/*
 * alloc.c
 *		The allocator: where the money and the packet of one claim come from.
 *		RpPlanClaim is a pure function of the stripes' balances and packets
 *		and the request; it reads and writes nothing else, so the single
 *		claim (stripe.c), its gather and the batch (batch.c) decide alike, and
 *		test/alloc/ checks it over generated cases without a server.
 *
 *		The rules, in order:
 *		1. A stripe that can pay the whole claim alone pays it: the first one
 *		   in the caller's spread order among those it holds.  For a lucky
 *		   draw that is a stripe with a packet and money, and the draw is the
 *		   double mean of that stripe alone.
 *		2. Otherwise, when the caller holds only some of the stripes, it must
 *		   lock them all and ask again (RP_PLAN_NEED_ALL).
 *		3. With every stripe held, the activity's totals decide: a fixed
 *		   amount is paid when the balances together cover it (and a packet
 *		   is left, if the activity counts them); a lucky draw is the double
 *		   mean of the total balance over the total packets, so a draw is
 *		   refused only when no money or no packet is left.  The packet and
 *		   the claim are counted on one stripe that has a packet (the primary);
 *		   the money comes from the primary first, then from the fullest
 *		   stripes, so it moves between stripes as needed.
 */
#include "postgres.h"

#include "redpacket.h"

static bool
Visible(const RpPlanIn *in, int s)
{
	return in->visible == NULL || in->visible[s];
}

/* Rule 1: one stripe pays it all; returns the stripe or -1. */
static int
PlanOneStripe(const RpPlanIn *in, RpPlanOut *out)
{
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;
		int64		bal = in->balance[s];
		int64		pk = in->packets[s];

		if (!Visible(in, s))
			continue;
		if (in->units > 0 ? bal >= in->units && (!in->capped || pk > 0)
			: pk > 0 && bal > 0)
		{
			out->units = in->units > 0 ? in->units : in->draw(bal, pk);
			out->take[s] = out->units;
			return s;
		}
	}
	return -1;
}

/*
 * Rule 3: with every stripe held, pay out->units from the primary first,
 * then from the fullest stripes (the lowest-numbered among equals).  The
 * caller has checked that the balances together cover it.
 */
static void
PlanSplit(const RpPlanIn *in, RpPlanOut *out, int primary)
{
	int64		left = out->units;

	out->take[primary] = Min(in->balance[primary], left);
	left -= out->take[primary];
	while (left > 0)
	{
		int			best = -1;
		int64		more;

		for (int s = 0; s < in->n; s++)
			if (in->balance[s] - out->take[s] > 0 &&
				(best < 0 || in->balance[s] - out->take[s] >
				 in->balance[best] - out->take[best]))
				best = s;
		Assert(best >= 0);
		more = Min(in->balance[best] - out->take[best], left);
		out->take[best] += more;
		left -= more;
	}
}

RpPlanResult
RpPlanClaim(const RpPlanIn *in, RpPlanOut *out)
{
	int64		total_balance = 0;
	int64		total_packets = 0;
	int			primary = -1;

	out->primary = -1;
	out->units = 0;
	for (int s = 0; s < in->n; s++)
		out->take[s] = 0;

	out->primary = PlanOneStripe(in, out);
	if (out->primary >= 0)
		return RP_PLAN_PAID;
	if (in->visible != NULL)
	{
		for (int s = 0; s < in->n; s++)
			if (!in->visible[s])
				return RP_PLAN_NEED_ALL;
	}

	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;

		total_balance += in->balance[s];
		total_packets += in->packets[s];
		/* the primary: a packet (money, if uncapped), and money if it can */
		if (in->capped ? in->packets[s] > 0 : in->balance[s] > 0)
		{
			if (primary < 0 || (in->balance[primary] == 0 && in->balance[s] > 0))
				primary = s;
		}
	}
	if (primary < 0 || total_balance < Max(in->units, 1))
		return RP_PLAN_EXHAUSTED;
	out->units = in->units > 0 ? in->units : in->draw(total_balance, total_packets);
	PlanSplit(in, out, primary);
	out->primary = primary;
	return RP_PLAN_PAID;
}
