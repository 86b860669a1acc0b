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

#include "redpacket.h"

/* a program of its own: the C library's printf, not libpgport's */
#undef printf

#define MAXN 8

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

/* A draw as RpDrawUnits bounds it: 1..balance, a unit left per other packet. */
static int64 last_draw_balance;
static int64 last_draw_packets;

static int64
Draw(int64 balance, int64 packets)
{
	int64		max = packets == 1 ? balance : balance - (packets - 1);

	last_draw_balance = balance;
	last_draw_packets = packets;
	if (max < 1)
		max = 1;
	return packets == 1 ? balance : Rand(1, max);
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

/* The first visible stripe, in start order, that can pay alone, or -1. */
static int
Alone(const RpPlanIn *in)
{
	for (int i = 0; i < in->n; i++)
	{
		int			s = (in->start + i) % in->n;

		if (in->visible && !in->visible[s])
			continue;
		if (in->units > 0 ? in->balance[s] >= in->units && (!in->capped || in->packets[s] > 0)
			: in->packets[s] > 0 && in->balance[s] > 0)
			return s;
	}
	return -1;
}

/* Check one answer against the rules. */
static void
Verify(const RpPlanIn *in, int n_case)
{
	int64		take[MAXN];
	RpPlanOut	out;
	RpPlanResult r;
	int			alone = Alone(in);
	bool		partial = false;
	int64		tb = 0,
				tp = 0,
				sum = 0;
	bool		within = true;

	out.take = take;
	last_draw_balance = last_draw_packets = -1;
	r = RpPlanClaim(in, &out);
	for (int s = 0; s < in->n; s++)
	{
		partial |= in->visible && !in->visible[s];
		tb += in->balance[s];
		tp += in->packets[s];
	}

	if (alone >= 0)
	{
		Check(r == RP_PLAN_PAID && out.primary == alone && take[alone] == out.units,
			  "rule 1: the first stripe that can pay alone pays it all", n_case);
		return;
	}
	if (partial)
	{
		Check(r == RP_PLAN_NEED_ALL, "rule 2: a partial view asks for every stripe", n_case);
		return;
	}
	if (in->units > 0 ? tb < in->units || (in->capped && tp == 0) : tb == 0 || tp == 0)
	{
		Check(r == RP_PLAN_EXHAUSTED, "rule 3: exhausted only when the totals cannot pay", n_case);
		return;
	}
	Check(r == RP_PLAN_PAID, "rule 3: the totals pay", n_case);
	if (r != RP_PLAN_PAID)
		return;
	for (int s = 0; s < in->n; s++)
	{
		within &= take[s] >= 0 && take[s] <= in->balance[s];
		sum += take[s];
	}
	Check(within && sum == out.units, "takes are within balances and add up", n_case);
	Check(out.primary >= 0 && (in->capped ? in->packets[out.primary] > 0
							   : in->balance[out.primary] > 0),
		  "the primary has a packet (or money)", n_case);
	if (in->units > 0)
		Check(out.units == in->units, "a fixed amount is paid exactly", n_case);
	else
		Check(last_draw_balance == tb && last_draw_packets == tp && out.units >= 1 &&
			  out.units <= tb, "a draw over every stripe uses the totals", n_case);
}

/* The case: (0.00, 1 packet), (0.00, 0), (0.10, 0). */
static void
Named(void)
{
	int64		bal[3] = {0, 0, 10};
	int64		pk[3] = {1, 0, 0};
	bool		vis[3] = {true, false, false};
	int64		take[3];
	RpPlanIn	in = {3, bal, pk, NULL, true, 0, 0, Draw};
	RpPlanOut	out = {0, 0, take};

	Check(RpPlanClaim(&in, &out) == RP_PLAN_PAID && out.units == 10 && out.primary == 0 &&
		  take[2] == 10, "the last packet draws the 0.10 held by another stripe", -1);
	in.visible = vis;
	Check(RpPlanClaim(&in, &out) == RP_PLAN_NEED_ALL, "holding one stripe it asks for all", -2);
	in.visible = NULL;
	in.units = 10;
	Check(RpPlanClaim(&in, &out) == RP_PLAN_PAID && take[2] == 10 && out.primary == 0,
		  "a fixed 0.10 takes the packet from one stripe and the money from another", -3);
	in.units = 11;
	Check(RpPlanClaim(&in, &out) == RP_PLAN_EXHAUSTED, "0.11 is more than is left", -4);
	pk[0] = 0;
	in.units = 0;
	Check(RpPlanClaim(&in, &out) == RP_PLAN_EXHAUSTED, "no packet left: exhausted", -5);
}

int
main(int argc, char **argv)
{
	int			cases = argc > 1 ? atoi(argv[1]) : 200000;

	Named();
	for (int c = 0; c < cases; c++)
	{
		int64		bal[MAXN];
		int64		pk[MAXN];
		bool		vis[MAXN];
		RpPlanIn	in;

		in.n = (int) Rand(1, MAXN);
		in.capped = Rand(0, 1) == 1;
		for (int s = 0; s < in.n; s++)
		{
			bal[s] = Rand(0, 3) == 0 ? 0 : Rand(0, 30);
			pk[s] = in.capped ? Rand(0, 3) : 0;
			vis[s] = Rand(0, 2) != 0;
		}
		in.balance = bal;
		in.packets = pk;
		in.visible = Rand(0, 1) ? vis : NULL;
		in.start = (int) Rand(0, in.n - 1);
		in.units = in.capped && Rand(0, 2) == 0 ? 0 : Rand(1, 60);
		in.draw = Draw;
		Verify(&in, c);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed == 0 ? 0 : 1;
}
