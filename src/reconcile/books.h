/*
 * books.h
 *		The identities of an activity's books (1.4), as SQL fragments, so that
 *		every statement that computes what an activity's stripes must hold
 *		from its money records computes it the same way: the rebuild of
 *		rp_repair_stripes (repair.c) uses them, and so can the reconciler's
 *		check.
 *
 *		money:   fund + top_up - withdraw - return - refund - live claims
 *		         = sum(stripe balance)
 *		packets: activity.packets + top_up packets - count(live claims)
 *		         = sum(stripe packets), for an open activity with a cap
 *		claims:  count(live claims) = sum(stripe claims)
 *
 *		A live claim is one no reversal took back (claim_settlement).  Each
 *		fragment is a complete SELECT over one activity, named by the SQL
 *		text act (e.g. "$1"), written for the pinned search path with every
 *		operator qualified.
 */
#ifndef RP_BOOKS_H
#define RP_BOOKS_H

/*
 * The ledger's side, one row: net (currency units the ledger leaves for
 * claims and stripes) and added_packets (what top-ups added to the cap).
 */
#define RP_SQL_BOOKS_LEDGER(act) \
	"SELECT COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"         (WHERE x.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up}'::pg_catalog.text[])), 0)" \
	"       OPERATOR(pg_catalog.-) COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"         (WHERE x.kind OPERATOR(pg_catalog.=) ANY (" RP_OWED_KINDS ")), 0)" \
	"         AS net," \
	"       COALESCE(pg_catalog.sum(x.packets) FILTER" \
	"         (WHERE x.kind OPERATOR(pg_catalog.=) 'top_up'), 0)::pg_catalog.int8 AS added_packets" \
	"  FROM redpacket.ledger x WHERE x.activity_id OPERATOR(pg_catalog.=) " act

/*
 * The activity's funding entry (at most one row): what the activity row
 * copies from it (amount as total, packets as the cap, created_at,
 * created_by).
 */
#define RP_SQL_BOOKS_FUND(act) \
	"SELECT f.amount, f.packets, f.created_at, f.created_by FROM redpacket.ledger f" \
	" WHERE f.activity_id OPERATOR(pg_catalog.=) " act \
	"   AND f.kind OPERATOR(pg_catalog.=) 'fund'"

/* The claim row c was not taken back by a reversal. */
#define RP_SQL_BOOKS_LIVE(c) \
	"NOT EXISTS (SELECT FROM redpacket.claim_settlement z" \
	"             WHERE z.activity_id OPERATOR(pg_catalog.=) " c ".activity_id" \
	"               AND z.claim_id OPERATOR(pg_catalog.=) " c ".claim_id" \
	"               AND z.state OPERATOR(pg_catalog.=) 'reversed')"

/*
 * The live claims of the activity by the stripe that counts them (the
 * claim's stripe): stripe, n, amount (currency units).  live is
 * RP_SQL_BOOKS_LIVE("x"), or "true" for a catalog without settlements.
 */
#define RP_SQL_BOOKS_CLAIMS(act, live) \
	"SELECT x.stripe, pg_catalog.count(*) AS n, pg_catalog.sum(x.amount) AS amount" \
	"  FROM redpacket.claim x WHERE x.activity_id OPERATOR(pg_catalog.=) " act \
	"   AND " live " GROUP BY x.stripe"

#endif							/* RP_BOOKS_H */
