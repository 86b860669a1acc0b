/*
 * stats.h
 *		Per-activity counters of answers and events (stats.c), kept in
 *		shared memory when the library is preloaded (a no-op otherwise).
 *		The answers are counted by their RpStatus; the events that are not
 *		answers follow.
 */
#ifndef RP_STATS_H
#define RP_STATS_H

#include "postgres.h"

#include "redpacket.h"

/* redpacket.stats_max_activities */
#define RP_DEFAULT_STATS_MAX_ACTIVITIES 5000
#define RP_MIN_STATS_MAX_ACTIVITIES 100
#define RP_MAX_STATS_MAX_ACTIVITIES 1000000

typedef enum RpStatEvent
{
	RP_STAT_WAIT = RP_NSTATUS,	/* waited for a busy stripe */
	RP_STAT_GATHER,				/* locked every stripe to pay one claim */
	RP_STAT_ERROR,				/* a claim call that raised an error */
	RP_NSTATS
} RpStatEvent;

/* The name of a counter: a status label, or stripe_waits, gathers, errors. */
extern const char *RpStatName(int event);

extern void RpStatsInit(void);
extern void RpStatsCount(int64 activity, int event);
extern void RpStatsFold(const int64 *activities, int n);

#endif							/* RP_STATS_H */
