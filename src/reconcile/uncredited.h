/*
 * uncredited.h
 *		The uncredited alert (uncredited.c): claims neither credited nor
 *		reversed longer than redpacket.credit_deadline.
 */
#ifndef RP_UNCREDITED_H
#define RP_UNCREDITED_H

/* redpacket.credit_deadline, seconds; 0: off */
extern int	rp_credit_deadline;

extern void RpUncreditedInit(void);

/*
 * After a pass over all: look at the next window of activities and at those
 * reported before, report and clear.  Inside SPI_connect.
 */
extern void RpUncreditedLook(void);

#endif							/* RP_UNCREDITED_H */
