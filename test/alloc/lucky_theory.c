/*
 * lucky_theory.c
 *		The figures sql/lucky_group.sql checks its lucky draws against, for
 *		the double-mean method over one pool of T minor units in P packets:
 *		draw k (1..P) is uniform on 1..m, m = max(1, min(floor(2R/P'),
 *		R - (P'-1))) with R units and P' packets left, and the last packet
 *		takes the rest.
 *
 *		Exact, by dynamic programming over the remaining units: the mean
 *		and standard deviation of each draw, and the expected variance of
 *		one activity's P amounts (their sample variance; the amounts sum to
 *		T, so it is (sum of squares - T^2/P) / (P-1) and its expectation
 *		follows from each draw's second moment).  By simulation (10^6
 *		activities): the standard deviation of that per-activity variance,
 *		which the exact marginals do not give.
 *
 *		Run by `make lucky-theory`; prints one block per (T, P) given as
 *		arguments, default 20000 5, 20000 20, 20000 100.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t
MaxDraw(int64_t r, int64_t p)
{
	int64_t		m = (2 * r) / p;

	if (m > r - (p - 1))
		m = r - (p - 1);
	return m < 1 ? 1 : m;
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static uint64_t
Next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Exact per-draw moments; returns the expected per-activity variance. */
static double
Exact(int64_t t, int p)
{
	double	   *prob = calloc(t + 1, sizeof(double));
	double	   *next = calloc(t + 2, sizeof(double));
	double		sumsq = 0;

	prob[t] = 1.0;
	printf("pos mean_units sd_units\n");
	for (int k = 1; k <= p; k++)
	{
		int			left = p - k + 1;
		double		e1 = 0,
					e2 = 0;

		memset(next, 0, (t + 2) * sizeof(double));
		for (int64_t r = left; r <= t; r++)
		{
			double		q = prob[r];

			if (q == 0)
				continue;
			if (left == 1)
			{
				e1 += q * r;
				e2 += q * (double) r * r;
				continue;
			}
			{
				int64_t		m = MaxDraw(r, left);

				e1 += q * (m + 1) / 2.0;
				e2 += q * (m + 1) * (2.0 * m + 1) / 6.0;
				/* R - u for u in 1..m: R-m .. R-1, each q/m (difference array) */
				next[r - m] += q / m;
				next[r] -= q / m;
			}
		}
		for (int64_t r = 1; r <= t; r++)
			next[r] += next[r - 1];
		memcpy(prob, next, (t + 1) * sizeof(double));
		sumsq += e2;
		printf("%d %.3f %.3f\n", k, e1, sqrt(e2 - e1 * e1));
	}
	free(prob);
	free(next);
	return (sumsq - (double) t * t / p) / (p - 1);
}

/* The sd of the per-activity variance over many simulated activities. */
static double
SimulatedSd(int64_t t, int p, int runs, double *mean)
{
	double		s1 = 0,
				s2 = 0;

	for (int i = 0; i < runs; i++)
	{
		int64_t		r = t;
		double		sq = 0,
					v;

		for (int left = p; left >= 1; left--)
		{
			int64_t		u = left == 1 ? r : 1 + (int64_t) (Next() % (uint64_t) MaxDraw(r, left));

			sq += (double) u * u;
			r -= u;
		}
		v = (sq - (double) t * t / p) / (p - 1);
		s1 += v;
		s2 += v * v;
	}
	*mean = s1 / runs;
	return sqrt(s2 / runs - *mean * *mean);
}

int
main(int argc, char **argv)
{
	static const char *const dflt[] = {"20000", "5", "20000", "20", "20000", "100"};
	const char *const *args = argc > 1 ? (const char *const *) argv + 1 : dflt;
	int			nargs = argc > 1 ? argc - 1 : 6;

	for (int i = 0; i + 1 < nargs; i += 2)
	{
		int64_t		t = atoll(args[i]);
		int			p = atoi(args[i + 1]);
		double		ev,
					simmean,
					sd;

		printf("== T = %lld units, P = %d packets\n", (long long) t, p);
		ev = Exact(t, p);
		sd = SimulatedSd(t, p, 1000000, &simmean);
		printf("expected per-activity variance %.1f (simulated %.1f), its sd %.1f\n",
			   ev, simmean, sd);
	}
	return 0;
}
