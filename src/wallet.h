/*
 * wallet.h
 *		Settling claims with the wallet service that pays users (1.4): what
 *		the rest of the extension may call.  The SQL functions rp_credited,
 *		rp_reverse (wallet.c) and rp_pending_credits (pending.c) need no
 *		declaration here.
 */
#ifndef RP_WALLET_H
#define RP_WALLET_H

#include "postgres.h"

#include "utils/timestamp.h"

/* The claims of one activity that are neither credited nor reversed. */
typedef struct RpUncredited
{
	int64		count;			/* how many */
	int64		oldest_claim_id;	/* the oldest of them (0 when none) */
	TimestampTz oldest_claimed_at;	/* its claimed_at (0 when none) */
} RpUncredited;

/*
 * Count the pending claims of the activity claimed at or before
 * claimed_before (DT_NOEND: all of them) and find the oldest, at a cost that
 * follows the pending claims rather than the settled ones (see pending.c).
 * For the reconciler's "uncredited" problem; it may hold the activity's
 * stripe locks.  Must be called inside SPI_connect; a catalog older than
 * 1.4 has no settlements: then every field is 0.
 */
extern void RpCountUncredited(int64 activity, TimestampTz claimed_before, RpUncredited *out);

/*
 * A claim of the activity is about to be credited: make the row that
 * records how far its claims are settled, if it is missing (pending.c).
 * Inside SPI_connect.
 */
extern void RpSettlementBegun(int64 activity);

#endif							/* RP_WALLET_H */
