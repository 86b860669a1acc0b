/*
 * ops.h
 *		Operations (src/ops/): ids that never repeat in a database (ids.c),
 *		the drop guard (guard.c), the launcher that starts a reconciler in
 *		every database (launcher.c), and the shared claim counters
 *		(stats.c).
 */
#ifndef RP_OPS_H
#define RP_OPS_H

#include "base/base.h"

/* ids.c: define the setting redpacket.id_marks (from _PG_init). */
extern void RpIdsInit(void);

/*
 * Record where the sequences stand now.  dropped: the extension is about to
 * be dropped (the drop guard); the extension's tables are locked first, so
 * no row can commit an id past the positions.  Inside SPI_connect.
 */
extern void RpIdsRecord(bool dropped);

/*
 * Start the sequences past the ids of an earlier installation when the
 * marks describe one (new_installation: the install script; or marks left
 * by a drop), and write the marks again when they no longer bound the
 * positions.  Returns whether it wrote them.  Inside SPI_connect.
 */
extern bool RpIdsKeep(bool new_installation);

/* RpIdsKeep(false) on a 1.4 catalog: the reconciler, after each pass. */
extern void RpIdsKeepUp(void);

/* guard.c: redpacket.allow_drop */
extern bool rp_allow_drop;

/* launcher.c: redpacket.reconcile_interval, seconds; 0 pauses */
#define RP_DEFAULT_RECONCILE_INTERVAL 60
#define RP_MIN_RECONCILE_INTERVAL 0
#define RP_MAX_RECONCILE_INTERVAL 86400

/* redpacket.max_workers: reconcilers running at once */
#define RP_DEFAULT_MAX_WORKERS 2
#define RP_MIN_MAX_WORKERS 1
#define RP_MAX_MAX_WORKERS 64

extern int	rp_reconcile_interval;

typedef enum RpWorkerResult
{
	RP_WORKER_NONE = 0,			/* no report: failed before the end */
	RP_WORKER_ABSENT,			/* the extension is not installed there */
	RP_WORKER_PASSED			/* the extension is there: a pass ran */
} RpWorkerResult;

extern void RpLauncherInit(void);
extern void RpLauncherReport(int slot, Oid dboid, RpWorkerResult result);
PGDLLEXPORT extern void RpLauncherMain(Datum main_arg);

/* stats.c: redpacket.stats_max_activities */
#define RP_DEFAULT_STATS_MAX_ACTIVITIES 5000
#define RP_MIN_STATS_MAX_ACTIVITIES 100
#define RP_MAX_STATS_MAX_ACTIVITIES 1000000

typedef enum RpStatEvent
{
	RP_STAT_WAIT = RP_NSTATUS,	/* waited for a busy stripe */
	RP_STAT_GATHER,				/* locked every stripe to pay one claim */
	RP_STAT_ERROR,				/* a claim call that raised an error, but ... */
	RP_STAT_RETRYABLE,			/* ... one its caller retries (RpStatsCountFailure) */
	RP_NSTATS
} RpStatEvent;

/* The name of a counter: a status label, or stripe_waits, gathers, errors, retryable. */
extern const char *RpStatName(int event);

extern void RpStatsInit(void);
extern void RpStatsCount(int64 activity, int event);
extern void RpStatsCountFailure(int64 activity);
extern void RpStatsFold(const int64 *activities, int n);

#endif							/* RP_OPS_H */
