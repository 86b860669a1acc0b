/*
 * launcher.h
 *		The long-lived launcher (launcher.c) that starts a reconciler in
 *		every database every redpacket.reconcile_interval seconds; its
 *		settings, and the report a reconciler leaves it before it exits.
 */
#ifndef RP_LAUNCHER_H
#define RP_LAUNCHER_H

#include "postgres.h"

/* redpacket.reconcile_interval, seconds; 0 pauses */
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

#endif							/* RP_LAUNCHER_H */
