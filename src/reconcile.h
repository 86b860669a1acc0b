/*
 * reconcile.h
 *		The reconciliation pass (reconcile.c): its settings, the restore
 *		flag, and the steps the background worker (worker.c) runs a pass
 *		with, one transaction per step.
 */
#ifndef RP_RECONCILE_H
#define RP_RECONCILE_H

#include "postgres.h"

#include "utils/timestamp.h"

/* redpacket.full_check_interval, seconds */
#define RP_DEFAULT_FULL_CHECK_INTERVAL 3600
#define RP_MIN_FULL_CHECK_INTERVAL 0
#define RP_MAX_FULL_CHECK_INTERVAL (86400 * 365)

extern int	rp_full_check_interval;

extern void RpReconcileInit(void);
extern bool RpRestoring(void);

/*
 * A pass over all pending activities, kept across the worker's
 * transactions: create it in a long-lived context, list what is pending,
 * check it step by step (each step in a transaction, inside SPI), record
 * the pass.
 */
typedef struct RpPass RpPass;

extern RpPass *RpPassCreate(MemoryContext cxt);
extern int	RpPassList(RpPass *pass, bool full_all, TimestampTz full_before, Datum full_share);
extern bool RpPassStep(RpPass *pass);
extern void RpPassRecord(const RpPass *pass);

#endif							/* RP_RECONCILE_H */
