/*
 * claim.h
 *		One claim (claim.c): what rp_claim runs, and what rp_claim_batch runs
 *		for each element under REPEATABLE READ or SERIALIZABLE.
 */
#ifndef RP_CLAIM_H
#define RP_CLAIM_H

#include "rules.h"

/*
 * One claim of the request on the activity, in the caller's transaction,
 * inside SPI_connect; bad input is an error, every business outcome a
 * status in *out.
 */
extern void RpClaimOne(int64 activity, RpClaimRequest *req, RpOutcome *out);

#endif							/* RP_CLAIM_H */
