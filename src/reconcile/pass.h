/*
 * pass.h
 *		The reconciliation pass as its drivers run it: the steps the
 *		background worker (worker.c) runs a pass with, one transaction per
 *		step, and the pass over a whole Citus cluster (cluster.c).
 */
#ifndef RP_PASS_H
#define RP_PASS_H

#include "utils/tuplestore.h"

#include "reconcile.h"

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

/*
 * The window of the next size activity ids after *from (from the start
 * again when none is after it: *from becomes 0), up to *to; returns where
 * the window after it starts (0: the start again).  Inside SPI_connect.
 */
extern int64 RpActivityWindow(int64 *from, int size, int64 *to);

/* rp_reconcile() without an activity on a Citus cluster; inside SPI_connect */
extern void RpReconcileCluster(bool full_check, Tuplestorestate *out);

#endif							/* RP_PASS_H */
