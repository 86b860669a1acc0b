/*
 * rules.h
 *		The rules of a claim, written once for rp_claim and every element of
 *		rp_claim_batch (rules.c): the request and its checks, the
 *		idempotency key, and the order of the statuses a claim can get before
 *		any money is looked at.
 */
#ifndef RP_RULES_H
#define RP_RULES_H

#include "claim.h"

/* One claim as asked: by rp_claim, or one element of rp_claim_batch. */
typedef struct RpClaimRequest
{
	text	   *user_id;
	text	   *request_id;		/* NULL when not given */
	Numeric		amount;			/* NULL: a lucky draw */
	int			elem;			/* 1-based element of a batch, 0 for rp_claim */
	/* set by RpResolveRequest, with the activity at hand: */
	int64		units;			/* the fixed amount in minor units; 0 for a lucky draw */
	text	   *key;			/* the idempotency key */
	uint32		user_hash;
} RpClaimRequest;

/* Checks that need no activity (user and request ids); errors are 22023. */
extern void RpCheckRequest(const RpClaimRequest *r);

/*
 * Checks that need the activity, and what follows from them: the amount in
 * the activity's minor units (22023/22003), a lucky draw only with packets,
 * a request id when the activity allows several claims per user, and the
 * idempotency key: (activity, user) when per_user_limit is 1, (activity,
 * user, request_id) otherwise.
 */
extern void RpResolveRequest(RpClaimRequest *r, const RpActivity *act);

/*
 * What a claim's status depends on before money: whether its key holds a
 * claim already, and, asked only when the order reaches them, whether the
 * user is on a restricted activity's list and how many claims the user
 * holds (per_user_limit > 1).
 */
typedef struct RpClaimFacts
{
	bool		has_claim;
	bool		(*eligible) (void *arg);
	int64		(*held) (void *arg);
	void	   *arg;
} RpClaimFacts;

/* RpStatusBeforeMoney's answer when the claim goes on to take money. */
#define RP_TAKE_MONEY (-1)

/*
 * The status a claim gets before money, in the documented order
 * (duplicate, frozen, not_started, ended, not_eligible, user_limit), or
 * RP_TAKE_MONEY.  now is the caller's transaction start.
 */
extern int	RpStatusBeforeMoney(const RpActivity *act, const RpClaimFacts *facts,
								TimestampTz now);

/* The activity takes claims at now: not frozen or closed, inside its window. */
extern bool RpActivityRunning(const RpActivity *act, TimestampTz now);

/*
 * Are the activity's lucky draws dealt to its stripes from one pool
 * (alloc.c)?  With more than one stripe on a 1.4 catalog; otherwise a lucky
 * draw is the double mean of its stripe's balance and packets.
 */
extern bool RpActivityDeals(const RpActivity *act);

/*
 * A stripe held was halted (a freeze or close committed after the activity
 * was read, or a halted flag set behind the extension's back): the status
 * to answer, frozen or ended, from the activity as it is now.  A halted
 * stripe of an activity neither frozen nor closed answers frozen.
 */
extern RpStatus RpHaltedStatus(int64 activity);

/* claim.c: a claim's outcome, and as SQL columns */
typedef struct RpOutcome
{
	RpStatus	status;
	int64		claim_id;
	int64		units;
	int			scale;
	TimestampTz claimed_at;
} RpOutcome;

extern Datum RpStatusDatum(Oid enumtype, RpStatus status);
extern void RpOutcomeColumns(const RpOutcome *o, Oid statustype, Datum *values, bool *nulls);

/*
 * One claim of the request on the activity, in the caller's transaction,
 * inside SPI_connect; bad input is an error, every business outcome a
 * status in *out (claim.c: what rp_claim runs, and what rp_claim_batch
 * runs for each element under REPEATABLE READ or SERIALIZABLE).
 */
extern void RpClaimOne(int64 activity, RpClaimRequest *req, RpOutcome *out);

#endif							/* RP_RULES_H */
