/*
 * refund.c
 *		Paying funders back, acknowledged once (1.6).  Every ledger entry
 *		that gives money back to the funder (a withdrawal, the return of the
 *		remainder, a refund of a claim reversed after settlement) is written
 *		with a row of redpacket.refund in the same transaction (activity.c,
 *		settle.c), so nothing owed can exist without one.  The row is
 *		pending until the wallet says it paid it back (rp_refunded), then
 *		keeps when, who and the wallet's reference; it never goes back to
 *		pending.  rp_pending_refunds (SQL) reads the pending rows through a
 *		partial index that holds only them.
 *
 *		rp_refunded locks the listed rows in entry order before it changes
 *		them: two acknowledgements of overlapping lists wait for each other
 *		in the same order (never a deadlock), and the second finds the rows
 *		acknowledged and counts nothing twice.
 */
#include "postgres.h"

#include "catalog/pg_type.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "campaign.h"

PG_FUNCTION_INFO_V1(rp_refunded);

/* The listed refunds of the activity, locked in entry order. */
static RpPlan lock_refunds = {
	"SELECT r.entry_id FROM redpacket.refund r"
	" WHERE r.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND r.entry_id OPERATOR(pg_catalog.=) ANY ($2)"
	" ORDER BY r.entry_id FOR UPDATE",
	2, {INT8OID, INT8ARRAYOID}, NULL, true
};

static RpPlan acknowledge = {
	"UPDATE redpacket.refund r"
	"   SET refunded_at = pg_catalog.now(), refunded_by = pg_catalog.session_user(), reference = $3"
	" WHERE r.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND r.entry_id OPERATOR(pg_catalog.=) ANY ($2)"
	"   AND r.refunded_at IS NULL",
	3, {INT8OID, INT8ARRAYOID, TEXTOID}, NULL, true
};

/* The first id of the list, in its order, that owes the funder nothing. */
static RpPlan first_unknown = {
	"SELECT x.id FROM pg_catalog.unnest($2) WITH ORDINALITY AS x(id, ord)"
	" WHERE NOT EXISTS (SELECT FROM redpacket.refund r"
	"                    WHERE r.activity_id OPERATOR(pg_catalog.=) $1"
	"                      AND r.entry_id OPERATOR(pg_catalog.=) x.id)"
	" ORDER BY x.ord LIMIT 1",
	2, {INT8OID, INT8ARRAYOID}, NULL, true
};

static void
RefuseUnknown(int64 activity, Datum *values)
{
	if (RpExecOn(&first_unknown, RpDistributed(), values, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not read the refunds of activity " INT64_FORMAT, activity);
	ereport(ERROR,
			(errcode(ERRCODE_NO_DATA_FOUND),
			 errmsg("ledger entry " INT64_FORMAT " of activity " INT64_FORMAT " owes the funder nothing",
					RpGetInt64(0, 1, 0), activity),
			 errdetail("Only a withdrawal, a return or a refund of an amount above zero is paid back. Nothing was acknowledged by this call."),
			 errhint("Acknowledge only entries that redpacket.rp_pending_refunds listed for the activity given.")));
}

/*
 * rp_refunded(activity, entry_ids, reference): the wallet paid these ledger
 * entries back to the funder.  Returns how many were newly acknowledged;
 * all or nothing.
 */
Datum
rp_refunded(PG_FUNCTION_ARGS)
{
	Datum		values[3];
	char		nulls[3];
	int			n = RpAcknowledgement(fcinfo, "entry_ids", values, nulls);
	int64		activity = DatumGetInt64(values[0]);
	int64		acknowledged = 0;

	if (n > 0)
	{
		if (RpExecOn(&lock_refunds, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not lock the refunds of activity " INT64_FORMAT, activity);
		if (SPI_processed < (uint64) n)
			RefuseUnknown(activity, values);
		if (RpExecOn(&acknowledge, RpDistributed(), values, nulls, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not acknowledge refunds of activity " INT64_FORMAT, activity);
		acknowledged = (int64) SPI_processed;
	}
	SPI_finish();
	PG_RETURN_INT64(acknowledged);
}
