/*
 * fast.h
 *		The fast path: a claim under READ COMMITTED checked, paid and
 *		recorded in one attempt on one stripe, by one of three backends
 *		chosen in one place (fast.c): the executor-direct one on a single
 *		node (direct.c, fixed amounts and lucky draws), one prepared SQL
 *		statement (fast.c, the SPI path), or the same statements on a Citus
 *		node's shard tables (scaleout.c), these two for fixed amounts.
 */
#ifndef RP_FAST_H
#define RP_FAST_H

#include "rules.h"

/*
 * The fast decision in SQL, written once for the SPI statement (fast.c)
 * and the shard statements (scaleout.c): the stripe's debit, and whether
 * it can pay, on the 1.3 catalog and on 1.4 (at the activity's revision,
 * from undealt money and packets only).  s qualifies the stripe's columns
 * ("s." or ""), the other arguments are SQL expressions (parameters).
 */
#define RP_SQL_DEBIT(s, units) \
	" SET balance = " s "balance OPERATOR(pg_catalog.-) " units "," \
	"     packets = " s "packets OPERATOR(pg_catalog.-) 1," \
	"     claims = " s "claims OPERATOR(pg_catalog.+) 1::pg_catalog.int8"
#define RP_SQL_STRIPE_OPEN(s, activity, stripe) \
	" WHERE " s "activity_id OPERATOR(pg_catalog.=) " activity \
	"   AND " s "stripe OPERATOR(pg_catalog.=) " stripe " AND NOT " s "halted"
#define RP_SQL_CAN_PAY_13(s, units) \
	" AND " s "balance OPERATOR(pg_catalog.>=) " units \
	" AND (" s "packets IS NULL OR " s "packets OPERATOR(pg_catalog.>) 0)"
#define RP_SQL_CAN_PAY_14(s, units, revision) \
	" AND " s "revision OPERATOR(pg_catalog.=) " revision \
	" AND " s "balance OPERATOR(pg_catalog.-) " s "dealt_units OPERATOR(pg_catalog.>=) " units \
	" AND (" s "packets IS NULL" \
	"      OR " s "packets OPERATOR(pg_catalog.-) " s "dealt_count OPERATOR(pg_catalog.>) 0)"

/* The claim a fast attempt inserts, and what it got. */
typedef struct RpFastClaim
{
	text	   *user_id;
	text	   *request_id;		/* may be NULL */
	text	   *key;			/* idempotency key */
	Numeric		amount;
	int64		units;
	int64		claim_id;		/* out */
	TimestampTz claimed_at;		/* out */
} RpFastClaim;

/*
 * One attempt on a stripe whose lock the caller holds, with the user's
 * locks held, under READ COMMITTED.  It pays and records the claim, or
 * writes nothing when any of these fails: no claim under the key, room
 * under the user's limit, the user on a restricted activity's list, the
 * stripe not halted and at the revision of act, enough undealt money and an
 * undealt packet.  On false the careful path decides (and says why).
 */
extern bool RpFastTake(const RpActivity *act, int stripe, RpFastClaim *fc);

/* direct.c: the executor-direct backend. */
typedef enum RpDirectResult
{
	RP_DIRECT_TOOK,				/* paid and claimed */
	RP_DIRECT_DIVERT,			/* nothing written: the careful path decides */
	RP_DIRECT_UNUSED			/* not applicable: another backend runs it */
} RpDirectResult;

extern bool rp_direct_claims;
extern RpDirectResult RpDirectTake(const RpActivity *act, int stripe, RpFastClaim *fc);

/* scaleout.c: the Citus shard backend. */
extern bool RpShardFastClaim(const RpActivity *act, int stripe, int64 units,
							 RpFastClaim *fast);

#endif							/* RP_FAST_H */
