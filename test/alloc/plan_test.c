/*
 * plan_test.c
 *		Tests of the allocator (src/claim/alloc.c) without a server: named cases,
 *		then many generated ones checked against the rules stated in
 *		alloc.c.  Built and run by `make alloc-test`; not part of the
 *		installed extension.  Prints "N passed, M failed" and exits non-zero
 *		on any failure.
 */
#include "postgres.h"

#include <stdio.h>
#include <stdlib.h>

#include "claim/alloc.h"

/* a program of its own: the C library's printf, not libpgport's */
#undef printf
#undef snprintf

#define MAXN 8
#define MAXD 6

static int	passed = 0;
static int	failed = 0;
static uint64 rng = 0x9E3779B97F4A7C15ULL;

static uint64
Next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static int64
Rand(int64 lo, int64 hi)
{
	return lo + (int64) (Next() % (uint64) (hi - lo + 1));
}

/*
 * A draw as RpDrawUnits bounds it (1 .. twice the mean, a unit left for each
 * other packet, the last takes the rest), recording what it was asked.
 */
#define MAXDRAWS (MAXN * RP_DEAL_BLOCK)
static int	ndraws;
static int64 draw_money[MAXDRAWS];
static int64 draw_packets[MAXDRAWS];
static int64 draw_result[MAXDRAWS];

static int64
Draw(int64 balance, int64 packets)
{
	int64		max = (balance / packets) * 2 + ((balance % packets) * 2) / packets;
	int64		x;

	if (max > balance - (packets - 1))
		max = balance - (packets - 1);
	if (max < 1)
		max = 1;
	x = packets == 1 ? balance : Rand(1, max);
	if (ndraws < MAXDRAWS)
	{
		draw_money[ndraws] = balance;
		draw_packets[ndraws] = packets;
		draw_result[ndraws] = x;
	}
	ndraws++;
	return x;
}

static void
Check(bool ok, const char *what, int n_case)
{
	if (ok)
		passed++;
	else
	{
		failed++;
		if (failed <= 20)
			printf("not ok: case %d: %s\n", n_case, what);
	}
}

static int64
DealtSum(const RpStripeState *st)
{
	int64		sum = 0;

	for (int i = 0; i < st->ndealt; i++)
		sum += st->dealt[i];
	return sum;
}

/* Can stripe s pay the request alone (rule 1)? */
static bool
PaysAlone(const RpAllocIn *in, int s)
{
	const RpStripeState *st = &in->stripes[s];

	if (in->units > 0)
		return st->balance - DealtSum(st) >= in->units &&
			(!in->capped || st->packets - st->ndealt > 0);
	return st->ndealt > 0 || (!in->deal && st->packets > 0 && st->balance > 0);
}

static int
Alone(const RpAllocIn *in)
{
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;

		if ((in->visible == NULL || in->visible[s]) && PaysAlone(in, s))
			return s;
	}
	return -1;
}

static bool
Undealt(const RpStripeState *st)
{
	return st->balance != DealtSum(st) || st->packets != st->ndealt;
}

/* Rule 2 applies: the pool (stripe 0) is held, holds every undealt money and packet, and can deal. */
static bool
Refills(const RpAllocIn *in)
{
	const RpStripeState *pool = &in->stripes[0];

	if (in->units > 0 || !in->deal || (in->visible && !in->visible[0]))
		return false;
	for (int s = 1; s < in->n; s++)
	{
		bool		seen = in->visible == NULL || in->visible[s];

		if (seen ? Undealt(&in->stripes[s]) : !in->others_clear)
			return false;
	}
	return pool->balance - DealtSum(pool) > 0 && pool->packets - pool->ndealt > 0;
}

/* A deal from money and packets: one chain of draws, a block to each stripe held in spread order. */
static void
CheckBlock(const RpAllocIn *in, const RpAllocOut *out, int64 money, int64 packets,
		   const char *rule, int n_case)
{
	int64		block = Min((int64) RP_DEAL_BLOCK, Max((int64) 1, packets / in->n));
	bool		chain = ndraws >= 1 && draw_money[0] == money && draw_packets[0] == packets;
	bool		blocks = true;
	int			first = -1;
	int64		j = 0;
	char		what[200];

	for (int i = 1; chain && i < ndraws && i < MAXDRAWS; i++)
		chain = draw_money[i] == draw_money[i - 1] - draw_result[i - 1] &&
			draw_packets[i] == draw_packets[i - 1] - 1;
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;
		int			paid = 0;
		int			k;

		if (in->visible && !in->visible[s])
		{
			blocks &= out->next[s].ndealt == in->stripes[s].ndealt;
			continue;
		}
		if (first < 0)
			first = s;
		paid = s == first ? 1 : 0;
		k = out->next[s].ndealt + paid;
		blocks &= k == Min(block, (int64) ndraws - j);
		for (int q = paid; q < k; q++)
			blocks &= out->next[s].dealt[q - paid] == draw_result[j + q];
		j += k;
	}
	snprintf(what, sizeof(what), "%s: one chain of draws from the pool, the claim its first", rule);
	Check(chain && first >= 0 && out->primary == first && out->units == draw_result[0], what,
		  n_case);
	snprintf(what, sizeof(what), "%s: a block to each stripe held in spread order, of "
			 "RP_DEAL_BLOCK or a share of the stripes, while the pool lasts", rule);
	Check(blocks && j == ndraws && (j % block == 0 || draw_money[ndraws - 1] == draw_result[ndraws - 1]),
		  what, n_case);
}

/* Check one answer against the rules. */
static void
Verify(const RpAllocIn *in, int n_case)
{
	RpStripeState next[MAXN];
	bool		changed[MAXN];
	RpAllocOut	out = {0, 0, next, changed};
	RpAllocResult r;
	int			alone = Alone(in);
	bool		partial = false;
	int64		tb = 0,
				tp = 0,
				nb = 0,
				np = 0;
	bool		sane = true;

	ndraws = 0;
	r = RpAllocate(in, &out);
	for (int s = 0; s < in->n; s++)
	{
		partial |= in->visible && !in->visible[s];
		tb += in->stripes[s].balance;
		tp += in->stripes[s].packets;
	}

	if (alone >= 0)
	{
		const RpStripeState *st = &in->stripes[alone];
		bool		others_same = true;

		Check(r == RP_ALLOC_PAID && out.primary == alone,
			  "rule 1: the first stripe that can pay alone pays", n_case);
		if (r != RP_ALLOC_PAID)
			return;
		for (int s = 0; s < in->n; s++)
			others_same &= s == alone || !changed[s];
		Check(others_same, "rule 1: no other stripe changes", n_case);
		if (in->units > 0)
			Check(out.units == in->units && next[alone].balance == st->balance - in->units,
				  "rule 1: a fixed amount is paid from that stripe", n_case);
		else if (st->ndealt > 0)
			Check(out.units == st->dealt[0] && next[alone].ndealt == st->ndealt - 1 &&
				  next[alone].balance == st->balance - st->dealt[0] && ndraws == 0,
				  "rule 1: a lucky draw takes the stripe's next dealt amount", n_case);
		else
			Check(ndraws == 1 && draw_money[0] == st->balance && draw_packets[0] == st->packets,
				  "rule 1: without dealing a lucky draw draws over its stripe", n_case);
		return;
	}
	if (Refills(in))
	{
		bool		others_same = true;

		Check(r == RP_ALLOC_PAID, "rule 2: the pool deals", n_case);
		if (r != RP_ALLOC_PAID)
			return;
		for (int s = 0; s < in->n; s++)
			others_same &= s == 0 || in->visible == NULL || in->visible[s] || !changed[s];
		for (int s = 0; s < in->n; s++)
		{
			nb += next[s].balance;
			np += next[s].packets;
		}
		Check(others_same && nb == tb - out.units && np == tp - 1,
			  "rule 2: the money moves from the pool to the dealt stripe, no other changes",
			  n_case);
		CheckBlock(in, &out, in->stripes[0].balance - DealtSum(&in->stripes[0]),
				   in->stripes[0].packets - in->stripes[0].ndealt, "rule 2", n_case);
		return;
	}
	if (partial)
	{
		Check(r == RP_ALLOC_NEED_ALL, "rule 3: a partial view asks for every stripe", n_case);
		return;
	}
	if (in->units > 0 ? tb < in->units || (in->capped && tp == 0) : tb == 0 || tp == 0)
	{
		Check(r == RP_ALLOC_EXHAUSTED, "rule 4: exhausted only when the totals cannot pay", n_case);
		return;
	}
	Check(r == RP_ALLOC_PAID, "rule 4: the totals pay", n_case);
	if (r != RP_ALLOC_PAID)
		return;

	for (int s = 0; s < in->n; s++)
	{
		nb += next[s].balance;
		np += next[s].packets;
		sane &= next[s].balance >= 0 && next[s].packets >= 0 &&
			next[s].ndealt <= next[s].packets && DealtSum(&next[s]) <= next[s].balance;
		if (!changed[s])
			sane &= next[s].balance == in->stripes[s].balance &&
				next[s].packets == in->stripes[s].packets;
	}
	Check(nb == tb - out.units && np == tp - (in->capped ? 1 : 0),
		  "rule 4: exactly the claim's money and packet leave the stripes", n_case);
	Check(sane, "rule 4: stripes stay whole, dealt within them, unchanged ones untouched",
		  n_case);
	if (in->units > 0)
	{
		bool		laid_out = true;
		int64		rest = 0;

		for (int s = 0; s < in->n; s++)
			rest += next[s].balance - DealtSum(&next[s]);
		for (int s = 0; s < in->n; s++)
			if (rest >= in->units && next[s].balance - DealtSum(&next[s]) > 0)
				laid_out &= next[s].balance - DealtSum(&next[s]) >= in->units;
		Check(out.units == in->units, "rule 4: a fixed amount is paid exactly", n_case);
		Check(laid_out, "rule 4: every stripe left with money can pay the amount again", n_case);
		return;
	}
	if (!in->deal)
	{
		Check(ndraws == 1 && draw_money[0] == tb && draw_packets[0] == tp,
			  "rule 4: without dealing the draw uses the totals", n_case);
		return;
	}
	CheckBlock(in, &out, tb, tp, "rule 4", n_case);
}

/* A fixed 0.10 whose packet is on one stripe and money on another. */
static void
Named(void)
{
	int64		scratch[3 * RP_DEAL_BLOCK];
	RpStripeState st[3] = {{0, 1, 0, NULL}, {0, 0, 0, NULL}, {10, 0, 0, NULL}};
	bool		vis[3] = {true, false, false};
	RpStripeState next[3];
	bool		changed[3];
	RpAllocIn	in = {3, st, NULL, true, false, false, 0, 0, Draw, scratch};
	RpAllocOut	out = {0, 0, next, changed};

	Check(RpAllocate(&in, &out) == RP_ALLOC_PAID && out.units == 10 && out.primary == 0,
		  "the last packet draws the 0.10 held by another stripe", -1);
	in.visible = vis;
	Check(RpAllocate(&in, &out) == RP_ALLOC_NEED_ALL, "holding one stripe it asks for all", -2);
	in.visible = NULL;
	in.units = 10;
	Check(RpAllocate(&in, &out) == RP_ALLOC_PAID && out.primary == 0 &&
		  next[0].balance == 0 && next[2].balance == 0,
		  "a fixed 0.10 takes the packet from one stripe and the money from another", -3);
	in.units = 11;
	Check(RpAllocate(&in, &out) == RP_ALLOC_EXHAUSTED, "0.11 is more than is left", -4);
	st[0].packets = 0;
	in.units = 0;
	Check(RpAllocate(&in, &out) == RP_ALLOC_EXHAUSTED, "no packet left: exhausted", -5);
}

/*
 * A first lucky draw of 20 packets over 2 stripes, starting at stripe 1,
 * gathers the pool on stripe 0 and deals 10 to each stripe, stripe 1 first;
 * holding both (as a partial view), the claims take stripe 1's, then stripe
 * 0's, in the order they were drawn, and pay exactly the total.
 */
static void
NamedDeal(void)
{
	int64		scratch[2 * RP_DEAL_BLOCK];
	RpStripeState st[2] = {{10000, 10, 0, NULL}, {10000, 10, 0, NULL}};
	RpStripeState next[2];
	bool		changed[2];
	bool		vis[2] = {true, true};
	RpAllocIn	in = {2, st, NULL, true, true, false, 1, 0, Draw, scratch};
	RpAllocOut	out = {0, 0, next, changed};
	int64		drawn[20];
	int64		kept[2][RP_DEAL_BLOCK];
	int			claims = 0;
	bool		in_order = true;

	ndraws = 0;
	Check(RpAllocate(&in, &out) == RP_ALLOC_PAID && out.primary == 1 && ndraws == 20 &&
		  draw_money[0] == 20000 && draw_packets[0] == 20 && out.units == draw_result[0] &&
		  next[1].ndealt == 9 && next[0].ndealt == 10 && next[0].dealt[0] == draw_result[10] &&
		  next[0].balance + next[1].balance == 20000 - out.units &&
		  draw_result[19] == draw_money[19],
		  "the first draw gathers the pool and deals 10 to each stripe, its own first", -6);
	memcpy(drawn, draw_result, sizeof(drawn));
	in.visible = vis;
	for (;;)
	{
		in_order &= out.units == drawn[claims];
		claims++;
		in.start = out.primary;		/* sticky, as stripe.c */
		for (int s = 0; s < 2; s++)
		{
			st[s] = next[s];
			if (next[s].ndealt > 0)
				memmove(kept[s], next[s].dealt, sizeof(int64) * next[s].ndealt);
			st[s].dealt = kept[s];
		}
		if (RpAllocate(&in, &out) != RP_ALLOC_PAID)
			break;
	}
	Check(claims == 20 && in_order && st[0].balance == 0 && st[1].balance == 0 &&
		  st[0].packets == 0 && st[1].packets == 0,
		  "twenty claims take the draws in order, then the activity is exhausted", -7);
}

int
main(int argc, char **argv)
{
	int			cases = argc > 1 ? atoi(argv[1]) : 200000;

	Named();
	NamedDeal();
	for (int c = 0; c < cases; c++)
	{
		RpStripeState st[MAXN];
		int64		dealt[MAXN][MAXD];
		int64		scratch[MAXN * RP_DEAL_BLOCK];
		bool		vis[MAXN];
		RpAllocIn	in;

		in.n = (int) Rand(1, MAXN);
		in.capped = Rand(0, 1) == 1;
		in.deal = in.capped && in.n > 1 && Rand(0, 2) != 0;
		bool		pooled = in.deal && Rand(0, 2) == 0;

		for (int s = 0; s < in.n; s++)
		{
			int64		undealt = (Rand(0, 3) == 0 || (pooled && s > 0)) ? 0 : Rand(0, 30);
			int64		dsum = 0;

			st[s].ndealt = in.deal ? (int) Rand(0, MAXD) : 0;
			if (Rand(0, 2) == 0)
				st[s].ndealt = 0;
			for (int i = 0; i < st[s].ndealt; i++)
			{
				dealt[s][i] = Rand(1, 12);
				dsum += dealt[s][i];
			}
			st[s].dealt = dealt[s];
			st[s].balance = undealt + dsum;
			st[s].packets = in.capped ? st[s].ndealt + (pooled && s > 0 ? 0 : Rand(0, 3)) : 0;
			vis[s] = Rand(0, 2) != 0;
		}
		in.stripes = st;
		in.visible = Rand(0, 1) ? vis : NULL;
		in.others_clear = pooled && Rand(0, 3) != 0;
		in.start = (int) Rand(0, in.n - 1);
		in.units = in.capped && Rand(0, 2) == 0 ? 0 : Rand(1, 60);
		in.draw = Draw;
		in.scratch = scratch;
		Verify(&in, c);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed == 0 ? 0 : 1;
}
