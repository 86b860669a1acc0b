/*
 * settle.h
 *		Settlement of activities, many per statement (settle.c): used by
 *		rp_close_activity (RpSettle, one activity) and by the reconciliation
 *		pass (the expired activities of a batch).
 */
#ifndef RP_SETTLE_H
#define RP_SETTLE_H

#include "postgres.h"

#include "utils/timestamp.h"

extern void RpSettleMany(const int64 *ids, int n, TimestampTz at, const char *reason,
						 bool record, int64 *units);

#endif							/* RP_SETTLE_H */
