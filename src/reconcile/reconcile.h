/*
 * reconcile.h
 *		The reconciler (src/reconcile/) as the rest of redpacket sees it:
 *		its settings and init, the restore flag, settlement of activities
 *		that are due, and the check an unfreeze must pass.  The pass itself
 *		(reconcile.c), its checks, alerts, repairs and the background worker
 *		are behind it.
 */
#ifndef RP_RECONCILE_H
#define RP_RECONCILE_H

#include "base/base.h"

/* redpacket.full_check_interval, seconds */
#define RP_DEFAULT_FULL_CHECK_INTERVAL 3600
#define RP_MIN_FULL_CHECK_INTERVAL 0
#define RP_MAX_FULL_CHECK_INTERVAL (86400 * 365)

extern int	rp_full_check_interval;

extern void RpReconcileInit(void);
extern bool RpRestoring(void);

/*
 * settle.c: settle activities in one statement, the remainder of each back
 * to the funder once; the caller holds every stripe lock of each and has
 * checked their stripe rows.
 */
extern void RpSettleMany(const int64 *ids, int n, TimestampTz at, const char *reason,
						 bool record, int64 *units);

/*
 * unfreeze.c: called by rp_unfreeze before it lifts the hold: when the reconciler froze
 * the activity, or its last check failed, a full check must pass now
 * (SQLSTATE 55000 naming what failed otherwise).  Takes the locks of
 * RpHoldActivity.  Does nothing under a catalog older than 1.4, or for an
 * activity that is not frozen.
 */
extern void RpUnfreezeCheck(int64 activity);

/*
 * unfreeze.c: refuse (55000) a close, top-up, withdrawal or window move
 * (func names it) of an activity the reconciler froze, or whose latest
 * check that ran failed (reconcile_state.last_ok; a check that could not
 * run does not count).  The caller holds the activity as a walker does.
 */
extern void RpRefuseWrongBooks(int64 activity, const char *func);

#endif							/* RP_RECONCILE_H */
