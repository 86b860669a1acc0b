/*
 * unfreeze.h
 *		When a frozen activity may take claims again (unfreeze.c).
 */
#ifndef RP_UNFREEZE_H
#define RP_UNFREEZE_H

#include "reconcile.h"

/*
 * The reconciliation lock, then every stripe lock of the activity, kept to
 * the end of the transaction.
 */
extern void RpHoldActivity(const RpActivity *act);

/*
 * The reconciler's full check of the activity, now, under RpHoldActivity:
 * an error (55000) naming what failed unless it passes; what is what is
 * refused ("unfrozen", "repaired").  Returns the reconciliation row, in the
 * caller's memory context.  Inside SPI_connect.
 */
extern Datum RpRequireFullCheck(int64 activity, const char *what);

#endif							/* RP_UNFREEZE_H */
