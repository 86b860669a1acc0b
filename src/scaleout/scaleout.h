/*
 * scaleout.h
 *		Scale-out (src/scaleout/): on a Citus cluster, whether and where this
 *		node holds an activity, and the shard tables it holds of it
 *		(scaleout.c).
 */
#ifndef RP_SCALEOUT_H
#define RP_SCALEOUT_H

#include "base/base.h"

extern bool RpDistributed(void);
extern bool RpActivityIsLocal(int64 activity);
extern bool RpActivityPlacement(int64 activity, char **where);
extern void RpRequireLocalActivity(int64 activity);
extern bool RpShardTables(int64 activity, Oid *claim_rel, Oid *stripe_rel, Oid *claim_seq);

#endif							/* RP_SCALEOUT_H */
