/*
 * settle.c
 *		Settlement: the unclaimed remainder of an activity goes back to the
 *		funder in the ledger exactly once, every stripe is emptied (balance,
 *		packets and, from 1.4, what was dealt to it) and halted, and the
 *		activity is marked closed.  One statement settles any number of
 *		activities, so that the reconciliation pass settles the expired
 *		activities of a batch at once; rp_close_activity settles one
 *		(RpSettle).  The caller holds every stripe lock of every activity
 *		(so no claim is in flight and no other settlement can run) and has
 *		checked that their stripe rows are all there.  An activity settled
 *		before gets nothing more: the ledger's unique index would refuse a
 *		second return anyway.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "reconcile.h"

/*
 * $1 the activities, $2 when (closed_at), $3 the reason of the return.
 * i: the activities, and whether they have no return yet (their money goes
 * back: empty_it); t: what their stripes hold, which is the remainder; u:
 * the stripes written, emptied for those and halted for all; the return,
 * inserted only if none exists (under READ COMMITTED the caller saw none with every stripe
 * locked, so a conflict is a bug; under REPEATABLE READ a return committed
 * after the caller's snapshot is a conflict it cannot see, which
 * PostgreSQL reports as 40001 rather than the 23505 a plain INSERT would
 * raise).  1.4 empties dealt too, and records a 'settle' change ($4).
 */
#define RP_SETTLE_HEAD(IN, A, ANY_OF, FUNDER) \
	"WITH i AS (SELECT x.id, x.ord, a.scale" FUNDER("a.") "," \
	"                  NOT EXISTS (SELECT FROM redpacket.ledger l" \
	"                               WHERE l.activity_id OPERATOR(pg_catalog.=) " A \
	"                                 AND l.kind OPERATOR(pg_catalog.=) 'return') AS empty_it" \
	"             FROM " IN \
	"            CROSS JOIN LATERAL (SELECT y.scale" FUNDER("y.") " FROM redpacket.activity y" \
	"                                 WHERE y.id OPERATOR(pg_catalog.=) " A " OFFSET 0) a)," \
	"     t AS (SELECT s.activity_id AS id, pg_catalog.sum(s.balance)::pg_catalog.int8 AS units" \
	"             FROM redpacket.stripe s" \
	"            WHERE s.activity_id " ANY_OF " GROUP BY s.activity_id)," \
	"     u AS (UPDATE redpacket.stripe s" \
	"              SET balance = CASE WHEN i.empty_it THEN 0 ELSE s.balance END," \
	"                  packets = CASE WHEN i.empty_it AND s.packets IS NOT NULL THEN 0" \
	"                                 ELSE s.packets END,"
#define RP_SETTLE_ZERO_10(ANY_OF) \
	"                  halted = true" \
	"             FROM i WHERE s.activity_id " ANY_OF \
	"              AND s.activity_id OPERATOR(pg_catalog.=) i.id" \
	"              AND (NOT s.halted OR (i.empty_it AND (s.balance OPERATOR(pg_catalog.<>) 0" \
	"                                    OR s.packets OPERATOR(pg_catalog.<>) 0)))" \
	"            RETURNING s.activity_id),"
#define RP_SETTLE_ZERO_14(ANY_OF) \
	"                  dealt = CASE WHEN i.empty_it THEN NULL ELSE s.dealt END," \
	"                  dealt_units = CASE WHEN i.empty_it THEN 0 ELSE s.dealt_units END," \
	"                  dealt_count = CASE WHEN i.empty_it THEN 0 ELSE s.dealt_count END," \
	"                  halted = true" \
	"             FROM i WHERE s.activity_id " ANY_OF \
	"              AND s.activity_id OPERATOR(pg_catalog.=) i.id" \
	"              AND (NOT s.halted OR (i.empty_it AND (s.balance OPERATOR(pg_catalog.<>) 0" \
	"                                    OR s.packets OPERATOR(pg_catalog.<>) 0" \
	"                                    OR s.dealt_count OPERATOR(pg_catalog.<>) 0)))" \
	"            RETURNING s.activity_id),"
#define RP_SETTLE_TAIL(ANY_OF, FUNDER) \
	"     r AS (INSERT INTO redpacket.ledger (activity_id, kind, amount, reason" FUNDER("") ")" \
	"           SELECT i.id, 'return'," \
	"                  pg_catalog.round(COALESCE(t.units, 0)::pg_catalog.numeric OPERATOR(pg_catalog./)" \
	"                                   pg_catalog.power(10::pg_catalog.numeric, i.scale::pg_catalog.numeric)," \
	"                                   i.scale), $3" FUNDER("i.") \
	"             FROM i LEFT JOIN t ON t.id OPERATOR(pg_catalog.=) i.id WHERE i.empty_it" \
	"           ON CONFLICT (activity_id, kind) WHERE kind OPERATOR(pg_catalog.=) 'return' DO NOTHING" \
	"           RETURNING activity_id, entry_id, amount)," \
	"     c AS (UPDATE redpacket.activity a SET closed_at = COALESCE(a.closed_at, $2)" \
	"            WHERE a.id " ANY_OF " RETURNING a.id)"
#define RP_SETTLE_RESULT \
	" SELECT i.id, CASE WHEN i.empty_it THEN COALESCE(t.units, 0) ELSE 0 END, i.empty_it," \
	"        r.activity_id IS NOT NULL," \
	"        EXISTS (SELECT FROM c WHERE c.id OPERATOR(pg_catalog.=) i.id)" \
	"   FROM i LEFT JOIN t ON t.id OPERATOR(pg_catalog.=) i.id" \
	"          LEFT JOIN r ON r.activity_id OPERATOR(pg_catalog.=) i.id" \
	"  ORDER BY i.ord"

enum
{
	SETTLE_ID = 1, SETTLE_UNITS, SETTLE_EMPTIED, SETTLE_RETURNED, SETTLE_CLOSED
};

#define RP_SETTLE_SET_IN "pg_catalog.unnest($1::pg_catalog.int8[]) WITH ORDINALITY AS x(id, ord)"
#define RP_SETTLE_SET_ANY "OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.int8[])"
#define RP_SETTLE_ONE_IN "(SELECT $1::pg_catalog.int8 AS id, 1 AS ord) x"
#define RP_SETTLE_ONE_ANY "OPERATOR(pg_catalog.=) $1"
/* 1.6: the return names the activity's funder (FUNDER("a."): ", a.funder") */
#define RP_NO_FUNDER(ALIAS) ""
#define RP_FUNDER(ALIAS) ", " ALIAS "funder"
#define RP_SETTLE_10(IN, A, ANY_OF) \
	RP_SETTLE_HEAD(IN, A, ANY_OF, RP_NO_FUNDER) RP_SETTLE_ZERO_10(ANY_OF) \
	RP_SETTLE_TAIL(ANY_OF, RP_NO_FUNDER) RP_SETTLE_RESULT
/* 1.6: a return of money is owed to the funder until the wallet pays it back */
#define RP_NOT_OWED ""
#define RP_OWED \
	"     o AS (INSERT INTO redpacket.refund (activity_id, entry_id)" \
	"           SELECT r.activity_id, r.entry_id FROM r WHERE r.amount OPERATOR(pg_catalog.>) 0),"
#define RP_SETTLE_14(IN, A, ANY_OF, FUNDER, OWED) \
	RP_SETTLE_HEAD(IN, A, ANY_OF, FUNDER) RP_SETTLE_ZERO_14(ANY_OF) RP_SETTLE_TAIL(ANY_OF, FUNDER) "," \
	OWED \
	"     k AS (INSERT INTO redpacket.activity_change (activity_id, kind, before, after, reason, changed_at)" \
	"           SELECT r.activity_id, 'settle', '{\"closed_at\": null}'::pg_catalog.jsonb," \
	"                  pg_catalog.jsonb_build_object('closed_at', $2, 'returned', r.amount), $3," \
	"                  pg_catalog.transaction_timestamp()" \
	"             FROM r WHERE $4)" \
	RP_SETTLE_RESULT

/*
 * [form][catalog: 1.0, 1.4, 1.6]: the set form on a single node; one
 * activity, named in every table it reads, on Citus (which routes it to
 * the node that holds it).
 */
static RpPlan settle_plans[2][3] = {
	{
		{RP_SETTLE_10(RP_SETTLE_SET_IN, "x.id", RP_SETTLE_SET_ANY),
		3, {INT8ARRAYOID, TIMESTAMPTZOID, TEXTOID}, NULL, true},
		{RP_SETTLE_14(RP_SETTLE_SET_IN, "x.id", RP_SETTLE_SET_ANY, RP_NO_FUNDER, RP_NOT_OWED),
		4, {INT8ARRAYOID, TIMESTAMPTZOID, TEXTOID, BOOLOID}, NULL, true},
		{RP_SETTLE_14(RP_SETTLE_SET_IN, "x.id", RP_SETTLE_SET_ANY, RP_FUNDER, RP_OWED),
		4, {INT8ARRAYOID, TIMESTAMPTZOID, TEXTOID, BOOLOID}, NULL, true},
	},
	{
		{RP_SETTLE_10(RP_SETTLE_ONE_IN, "$1", RP_SETTLE_ONE_ANY),
		3, {INT8OID, TIMESTAMPTZOID, TEXTOID}},
		{RP_SETTLE_14(RP_SETTLE_ONE_IN, "$1", RP_SETTLE_ONE_ANY, RP_NO_FUNDER, RP_NOT_OWED),
		4, {INT8OID, TIMESTAMPTZOID, TEXTOID, BOOLOID}},
		{RP_SETTLE_14(RP_SETTLE_ONE_IN, "$1", RP_SETTLE_ONE_ANY, RP_FUNDER, RP_OWED),
		4, {INT8OID, TIMESTAMPTZOID, TEXTOID, BOOLOID}},
	}
};

/*
 * Settle the n activities ids[] (closed_at = at unless already set), with
 * reason on their return entries; with record (1.4), each return is also an
 * activity_change 'settle' row.  units[i], when units is not NULL, is the
 * remainder returned for ids[i] in minor units (0 when it had a return
 * already).  Must be called inside SPI_connect.
 */
void
RpSettleMany(const int64 *ids, int n, TimestampTz at, const char *reason, bool record,
			 int64 *units)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));
	Datum		v[4];
	int			version = RpCatalogVersion();
	int			form = version >= RP_CATALOG_1_6 ? 2 : version >= RP_CATALOG_1_4 ? 1 : 0;
	bool		one;
	uint64		rows;

	if (n == 0)
		return;
	one = RpDistributed();
	if (one && n != 1)
		elog(ERROR, "a settlement on a Citus cluster is of one activity at a time");
	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(ids[i]);
	v[0] = one ? elems[0]
		: PointerGetDatum(construct_array(elems, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE));
	v[1] = TimestampTzGetDatum(at);
	v[2] = CStringGetTextDatum(reason);
	v[3] = BoolGetDatum(record);
	if (RpExec(&settle_plans[one][form], v, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not settle activities");
	rows = SPI_processed;
	if (rows != (uint64) n)
		elog(ERROR, "settled " UINT64_FORMAT " of %d activities", rows, n);
	for (uint64 r = 0; r < rows; r++)
	{
		bool		isnull;
		int64		id = RpGetInt64(r, SETTLE_ID, 0);

		if (id != ids[r])
			elog(ERROR, "settlement of activity " INT64_FORMAT " returned activity " INT64_FORMAT,
				 ids[r], id);
		if (DatumGetBool(RpGetDatum(r, SETTLE_EMPTIED, &isnull)) &&
			!DatumGetBool(RpGetDatum(r, SETTLE_RETURNED, &isnull)))
			elog(ERROR, "activity " INT64_FORMAT " already had a return entry", id);
		if (!DatumGetBool(RpGetDatum(r, SETTLE_CLOSED, &isnull)))
			elog(ERROR, "could not close activity " INT64_FORMAT, id);
		if (units != NULL)
			units[r] = RpGetInt64(r, SETTLE_UNITS, 0);
	}
}
