/*
 * campaign.h
 *		The campaign and wallet functions (src/campaign/): activities and
 *		their changes, eligibility, lookups, and settling claims with the
 *		wallet; what these files share.
 */
#ifndef RP_CAMPAIGN_H
#define RP_CAMPAIGN_H

#include "base/base.h"
#include "fmgr.h"

/* activity.c */
extern Datum RpActivityFunder(int64 activity, bool *isnull);
extern int64 RpInsertLedger(int64 activity, const char *kind, int64 units, int scale,
							int32 packets, const char *reason);
extern char *RpActivityState(int64 activity, const char *keys);

/* pending.c (1.4) */
/*
 * A claim of the activity is about to be credited: make the row that
 * records how far its claims are settled, if it is missing (pending.c).
 * Inside SPI_connect.
 */
extern void RpSettlementBegun(int64 activity);

/* wallet.c: the checked arguments of rp_credited or rp_refunded, in SPI */
extern int	RpAcknowledgement(FunctionCallInfo fcinfo, const char *ids_name, Datum *values,
							  char *nulls);

#endif							/* RP_CAMPAIGN_H */
