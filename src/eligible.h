/*
 * eligible.h
 *		Eligibility lists (1.4): a restricted activity pays only the users on
 *		its list, redpacket.eligible.
 */
#ifndef RP_ELIGIBLE_H
#define RP_ELIGIBLE_H

#include "postgres.h"

#include "redpacket.h"

/*
 * May the user claim from the activity as far as its list goes?  True for
 * an unrestricted activity (decided from the backend's activity cache,
 * RpActivityMeta: no statement), else one index probe of the list.  The
 * caller holds the user's lock and bucket (locks.c), which rp_allow and
 * rp_disallow exclude, so the answer holds until the caller's transaction
 * ends.  Under REPEATABLE READ or SERIALIZABLE an answer that a change
 * committed after the snapshot would make different is a serialization
 * failure (40001).  Must be called inside SPI_connect.
 */
extern bool RpUserEligible(const RpActivity *act, text *user_id);

/*
 * The same for n users of one activity in one statement: eligible[i] for
 * user_ids[i] (eligible has n entries, owned by the caller).
 */
extern void RpUsersEligible(const RpActivity *act, text *const *user_ids, int n,
							bool *eligible);

#endif							/* RP_ELIGIBLE_H */
