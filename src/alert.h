/*
 * alert.h
 *		Telling people about a check that did not pass (alert.c).
 */
#ifndef RP_ALERT_H
#define RP_ALERT_H

#include "check.h"

extern void RpAlert(const RpCheck *c);

#endif							/* RP_ALERT_H */
