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

/*
 * A claim of the activity is about to be credited: make the row that
 * records how far its claims are settled, if it is missing (pending.c).
 * Inside SPI_connect.
 */
extern void RpSettlementBegun(int64 activity);

#endif							/* RP_WALLET_H */
