/*
 * change.c
 *		Every change of an activity after its creation, whatever made it (an
 *		operator's function or the reconciler), is one row of the append-only
 *		redpacket.activity_change, written in the transaction that makes the
 *		change: who, when, what it was before, what it is after, and why.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "base.h"
#include "change.h"

static RpPlan insert_change = {
	"INSERT INTO redpacket.activity_change (activity_id, kind, before, after, reason, changed_at)"
	" VALUES ($1, $2, $3::pg_catalog.jsonb, $4::pg_catalog.jsonb, $5,"
	"         pg_catalog.transaction_timestamp())",
	5, {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
};

void
RpRecordChange(int64 activity, const char *kind, const char *before, const char *after,
			   const char *reason)
{
	Datum		values[5];
	char		nulls[5] = {' ', ' ', before ? ' ' : 'n', after ? ' ' : 'n', reason ? ' ' : 'n'};

	if (RpCatalogVersion() < RP_CATALOG_1_4)
		return;
	values[0] = Int64GetDatum(activity);
	values[1] = CStringGetTextDatum(kind);
	values[2] = before ? CStringGetTextDatum(before) : (Datum) 0;
	values[3] = after ? CStringGetTextDatum(after) : (Datum) 0;
	values[4] = reason ? CStringGetTextDatum(reason) : (Datum) 0;
	if (RpExec(&insert_change, values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the change of activity " INT64_FORMAT, activity);
}
