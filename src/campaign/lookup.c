/*
 * lookup.c
 *		Read-only lookups for applications: what a user holds in an activity
 *		without claiming (rp_user_claims).  They check their arguments as
 *		rp_claim does (args.c) and read with one index probe: the claim's
 *		unique index on (activity_id, user_id, idempotency_key), by its
 *		first two columns, and one of claim_settlement's primary key per
 *		claim found (a reversed claim is not held).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "reconcile/books.h"
#include "scaleout/scaleout.h"

PG_FUNCTION_INFO_V1(rp_user_claims);

/* A generic plan: the probe whatever the statistics say (see base.c). */
static RpPlan user_claims = {
	"SELECT c.claim_id, c.amount, c.claimed_at, c.request_id"
	"  FROM redpacket.claim c"
	" WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND c.user_id OPERATOR(pg_catalog.=) $2"
	"   AND " RP_SQL_BOOKS_LIVE("c")
	" ORDER BY c.claim_id",
	2, {INT8OID, TEXTOID}, NULL, true
};

static RpPlan activity_exists = {
	"SELECT 1 FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}, NULL, true
};

/*
 * redpacket.rp_user_claims(activity bigint, user_id text) RETURNS TABLE
 * (claim_id, amount, claimed_at, request_id): the claims the user holds in
 * the activity (not reversed), oldest first; no row when the user has none;
 * P0002 when the activity does not exist.
 */
Datum
rp_user_claims(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *user_id;
	Datum		v[2];
	bool		distributed;
	uint64		rows;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "user_id");
	user_id = PG_GETARG_TEXT_PP(1);
	RpCheckUserId(user_id, "user_id", 0);

	InitMaterializedSRF(fcinfo, 0);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	distributed = RpDistributed();
	v[0] = PG_GETARG_DATUM(0);
	v[1] = PointerGetDatum(user_id);
	if (RpExecOn(&user_claims, distributed, v, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the claims of activity " INT64_FORMAT, PG_GETARG_INT64(0));
	rows = SPI_processed;
	for (uint64 r = 0; r < rows; r++)
	{
		Datum		values[4];
		bool		nulls[4];

		for (int c = 0; c < 4; c++)
			values[c] = RpGetDatum((int) r, c + 1, &nulls[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	/* no claim: the activity may not exist either */
	if (rows == 0 &&
		(RpExecOn(&activity_exists, distributed, v, NULL, true, 1) != SPI_OK_SELECT ||
		 SPI_processed == 0))
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("activity " INT64_FORMAT " does not exist", PG_GETARG_INT64(0))));
	SPI_finish();
	return (Datum) 0;
}
