/*
 * rules.c
 *		The rules of a claim (rules.h), written once: rp_claim and every
 *		element of rp_claim_batch resolve their requests and order their
 *		statuses here, so the single claim and the batch cannot drift apart.
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "base/base.h"
#include "rules.h"

/* "amount" for rp_claim, "amounts[3]" for a batch's third element. */
static const char *
ArgName(const RpClaimRequest *r, const char *single, const char *array)
{
	return r->elem == 0 ? single : psprintf("%s[%d]", array, r->elem);
}

void
RpCheckRequest(const RpClaimRequest *r)
{
	RpCheckUserId(r->user_id, r->elem == 0 ? "user_id" : "user_ids", r->elem);
	RpCheckRequestId(r->request_id, r->elem == 0 ? "request_id" : "request_ids", r->elem);
}

/*
 * The amount of the claim in minor units (0: a lucky draw), as the
 * activity's split says: a lucky or equal activity pays what the server
 * decides and refuses a named amount; a caller one needs it; any pays an
 * amount named and draws without one, where there are packets.
 */
static int64
ClaimUnits(const RpClaimRequest *r, const RpActivity *act)
{
	int64		unit;
	RpSplit		split = RpActivitySplit(act, &unit);
	const char *arg = ArgName(r, "amount", "amounts");

	if (r->amount != NULL && (split == RP_SPLIT_LUCKY || split == RP_SPLIT_EQUAL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be NULL for activity " INT64_FORMAT, arg, act->id),
				 errdetail(split == RP_SPLIT_LUCKY
						   ? "The activity is a lucky draw: the server draws every amount."
						   : "The activity pays every packet the same share of its total."),
				 errhint("Claim without an amount.")));
	if (split == RP_SPLIT_EQUAL)
		return unit;
	if (r->amount != NULL)
		return RpAmountToUnits(r->amount, act->scale, arg);
	if (split == RP_SPLIT_CALLER || act->packets == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be given for activity " INT64_FORMAT, arg, act->id),
				 split == RP_SPLIT_CALLER
				 ? errdetail("The activity pays every claim the amount it names.")
				 : errdetail("A lucky draw (amount NULL) needs an activity created with packets."),
				 errhint("Pass the amount to claim.")));
	return 0;
}

void
RpResolveRequest(RpClaimRequest *r, const RpActivity *act)
{
	r->units = ClaimUnits(r, act);
	if (act->per_user_limit > 1 && r->request_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is required for activity " INT64_FORMAT,
						ArgName(r, "request_id", "request_ids"), act->id),
				 errdetail("The activity allows %d claims per user, so each claim is identified by its request_id.",
						   act->per_user_limit),
				 errhint("Pass a request id that stays the same when the claim is retried.")));
	r->key = act->per_user_limit == 1 ? cstring_to_text("") : r->request_id;
	r->user_hash = RpUserHash(r->user_id);
}

bool
RpActivityRunning(const RpActivity *act, TimestampTz now)
{
	return !act->frozen && !act->closed && now >= act->starts_at && now < act->ends_at;
}

int
RpStatusBeforeMoney(const RpActivity *act, const RpClaimFacts *facts, TimestampTz now)
{
	if (facts->has_claim)
		return RP_DUPLICATE;
	if (act->frozen)
		return RP_FROZEN;
	if (now < act->starts_at)
		return RP_NOT_STARTED;
	if (act->closed || now >= act->ends_at)
		return RP_ENDED;
	if (act->restricted && !facts->eligible(facts->arg))
		return RP_NOT_ELIGIBLE;
	if (act->per_user_limit > 1 && facts->held(facts->arg) >= act->per_user_limit)
		return RP_USER_LIMIT;
	return RP_TAKE_MONEY;
}

RpStatus
RpHaltedStatus(int64 activity)
{
	RpActivity	now;

	(void) RpFetchActivity(activity, &now, false);
	return now.closed && !now.frozen ? RP_ENDED : RP_FROZEN;
}

bool
RpActivityDeals(const RpActivity *act)
{
	return act->stripes > 1 && RpCatalogVersion() >= RP_CATALOG_1_4;
}
