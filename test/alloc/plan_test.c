/*
 * plan_test.c
 *		Tests of the allocator (src/alloc.c) without a server: named cases,
 *		then many generated ones checked against the rules stated in
 *		alloc.c.  Built and run by `make alloc-test`; not part of the
 *		installed extension.  Prints "N passed, M failed" and exits non-zero
 *		on any failure.
 */
#include "postgres.h"

#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"

/* a program of its own: the C library's printf, not libpgport's */
#undef printf

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
	if (partial)
	{
		Check(r == RP_ALLOC_NEED_ALL, "rule 2: a partial view asks for every stripe", n_case);
		return;
	}
	if (in->units > 0 ? tb < in->units || (in->capped && tp == 0) : tb == 0 || tp == 0)
	{
		Check(r == RP_ALLOC_EXHAUSTED, "rule 3: exhausted only when the totals cannot pay", n_case);
		return;
	}
	Check(r == RP_ALLOC_PAID, "rule 3: the totals pay", n_case);
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
		  "rule 3: exactly the claim's money and packet leave the stripes", n_case);
	Check(sane, "rule 3: stripes stay whole, dealt within them, unchanged ones untouched",
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
		Check(out.units == in->units, "rule 3: a fixed amount is paid exactly", n_case);
		Check(laid_out, "rule 3: every stripe left with money can pay the amount again", n_case);
		return;
	}
	if (!in->deal)
	{
		Check(ndraws == 1 && draw_money[0] == tb && draw_packets[0] == tp,
			  "rule 3: without dealing the draw uses the totals", n_case);
		return;
	}
	{
		bool		chain = ndraws >= 1 && draw_money[0] == tb && draw_packets[0] == tp;

		for (int i = 1; chain && i < ndraws && i < MAXDRAWS; i++)
			chain = draw_money[i] == draw_money[i - 1] - draw_result[i - 1] &&
				draw_packets[i] == draw_packets[i - 1] - 1;
		Check(chain && out.units == draw_result[0] && out.primary == 0,
			  "rule 3: a deal draws one pool after the other, stripe 0 pays the first",
			  n_case);
		Check(ndraws == Min(tp, (int64) in->n * RP_DEAL_BLOCK) || draw_money[ndraws - 1] ==
			  draw_result[ndraws - 1],
			  "rule 3: a deal deals a block to every stripe, or all that is left", n_case);
	}
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
	RpAllocIn	in = {3, st, NULL, true, false, 0, 0, Draw, scratch};
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

/* A deal of 20 packets over 2 stripes: round the stripes, the total exact. */
static void
NamedDeal(void)
{
	int64		scratch[2 * RP_DEAL_BLOCK];
	RpStripeState next[2];
	int64		sum = 0;

	ndraws = 0;
	RpDeal(2, 0, 20000, 20, Draw, scratch, next);
	for (int s = 0; s < 2; s++)
		sum += DealtSum(&next[s]);
	Check(next[0].ndealt == 10 && next[1].ndealt == 10 && sum == 20000 &&
		  next[0].balance + next[1].balance == 20000 && ndraws == 20 &&
		  draw_packets[19] == 1 && draw_result[19] == draw_money[19],
		  "20 packets deal 10 to each stripe, the last takes the rest", -6);
	Check(next[0].dealt[0] == draw_result[0] && next[1].dealt[0] == draw_result[1] &&
		  next[0].dealt[1] == draw_result[2],
		  "the j-th draw goes to stripe j % 2", -7);
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
		for (int s = 0; s < in.n; s++)
		{
			int64		undealt = Rand(0, 3) == 0 ? 0 : Rand(0, 30);
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
			st[s].packets = in.capped ? st[s].ndealt + Rand(0, 3) : 0;
			vis[s] = Rand(0, 2) != 0;
		}
		in.stripes = st;
		in.visible = Rand(0, 1) ? vis : NULL;
		in.start = (int) Rand(0, in.n - 1);
		in.units = in.capped && Rand(0, 2) == 0 ? 0 : Rand(1, 60);
		in.draw = Draw;
		in.scratch = scratch;
		Verify(&in, c);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed == 0 ? 0 : 1;
}
