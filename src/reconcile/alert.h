/*
 * alert.h
 *		Telling people about a check that did not pass (alert.c).
 */
#ifndef RP_ALERT_H
#define RP_ALERT_H

#include "check.h"

extern void RpAlert(const RpCheck *c);
extern const char *RpAlertKind(const RpCheck *c);
extern int	RpAlertIncomplete(RpCheck **checks, int n);
extern void RpAlertComplete(const int64 *activities, int n);

#endif							/* RP_ALERT_H */
