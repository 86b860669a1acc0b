/*
 * fast.h
 *		The fast path: a claim under READ COMMITTED checked, paid and
 *		recorded in one attempt on one stripe (fast.c), by the backend that
 *		applies (take.h).
 */
#ifndef RP_FAST_H
#define RP_FAST_H

#include "rules.h"
#include "take.h"

/*
 * One attempt on a stripe whose lock the caller holds, with the user's
 * locks held, under READ COMMITTED.  It pays and records the claim, or
 * writes nothing when any of these fails: no claim under the key, room
 * under the user's limit, the user on a restricted activity's list, the
 * stripe not halted and at the revision of act, enough undealt money and an
 * undealt packet.  On false the careful path decides (and says why).
 */
extern bool RpFastTake(const RpActivity *act, int stripe, RpFastClaim *fc);

#endif							/* RP_FAST_H */
