/*
 * change.h
 *		The record of changes made to an activity after its creation
 *		(redpacket.activity_change, 1.4).
 */
#ifndef RP_CHANGE_H
#define RP_CHANGE_H

#include "postgres.h"

/*
 * Append one change of the activity: kind is one of the kinds the table
 * allows; before and after are JSON text or NULL; reason may be NULL.  A
 * catalog older than 1.4 has no such table: then nothing is recorded.  Must
 * be called inside SPI_connect, in the transaction that makes the change.
 */
extern void RpRecordChange(int64 activity, const char *kind, const char *before,
						   const char *after, const char *reason);

#endif							/* RP_CHANGE_H */
