/*
 * stats.c
 *		Per-activity counters of claim answers and events.  Placeholder until
 *		the shared-memory implementation lands: counting is a no-op.
 */
#include "postgres.h"

#include "redpacket.h"

void
RpStatsCount(int64 activity, int event)
{
}
