/*
 * take.h
 *		What the claim engine's write backends share: the claim and stripe
 *		SQL written once for every statement, the claim a fast attempt
 *		inserts, and each backend's entry.  The backends are the
 *		executor-direct one on a single node (direct.c, fixed amounts and
 *		lucky draws), one prepared SQL statement (fast.c, the SPI path), and
 *		the same statements on a Citus node's shard tables (shard.c), these
 *		two for fixed amounts; fast.c chooses among them.
 */
#ifndef RP_TAKE_H
#define RP_TAKE_H

#include "claim.h"

/*
 * The claim row's columns, and the claim of a user under an idempotency
 * key, written once for every statement that inserts or looks one up: c
 * qualifies the claim's columns ("c." or ""), the other arguments are SQL
 * expressions for the activity, the user and the key.
 */
#define RP_SQL_CLAIM_COLUMNS \
	"activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at"
#define RP_SQL_CLAIM_UNDER_KEY(c, activity, user, key) \
	" " c "activity_id OPERATOR(pg_catalog.=) " activity \
	" AND " c "user_id OPERATOR(pg_catalog.=) " user \
	" AND " c "idempotency_key OPERATOR(pg_catalog.=) " key

/*
 * SQL shared by batch.c's claim insert and its Citus shard twin (shard.c):
 * the rows of a batch's claims from its arrays $2..$6.
 */
#define RP_SQL_BATCH_ROWS \
	"   FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[])," \
	"                   pg_catalog.unnest($3::pg_catalog.text[])," \
	"                   pg_catalog.unnest($4::pg_catalog.text[])," \
	"                   pg_catalog.unnest($5::pg_catalog.numeric[])," \
	"                   pg_catalog.unnest($6::pg_catalog.int4[]))" \
	"        WITH ORDINALITY AS k(user_id, request_id, idem, amount, stripe, ord)" \
	"  ORDER BY k.ord" \
	" RETURNING claim_id, claimed_at"

/*
 * The fast decision in SQL, written once for the SPI statement (fast.c)
 * and the shard statements (shard.c): the stripe's debit, and whether
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

/* direct.c: the executor-direct backend. */
typedef enum RpDirectResult
{
	RP_DIRECT_TOOK,				/* paid and claimed */
	RP_DIRECT_DIVERT,			/* nothing written: the careful path decides */
	RP_DIRECT_UNUSED			/* not applicable: another backend runs it */
} RpDirectResult;

extern RpDirectResult RpDirectTake(const RpActivity *act, int stripe, RpFastClaim *fc);

/* shard.c: the Citus shard backend, for fixed claims and batches. */
extern bool RpShardFastClaim(const RpActivity *act, int stripe, int64 units,
							 RpFastClaim *fast);
extern int	RpShardInsertClaims(int64 activity, Datum *values);

#endif							/* RP_TAKE_H */
