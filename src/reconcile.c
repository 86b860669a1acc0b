/*
 * reconcile.c
 *		The reconciliation pass, shared by rp_reconcile() and the background
 *		worker.  For each activity it proves the ledger identity
 *		funded - returned - sum(claims) = sum(stripe balances), the packet
 *		identity, the claim count and that no stripe is negative, while it
 *		holds every stripe lock of that activity (so no claim is in flight and
 *		what it reads is one consistent state).  It is incremental: a
 *		per-activity watermark keeps the running sums of claims already
 *		checked, so a pass reads only claims newer than the last one.  Claim ids
 *		come from an uncached sequence and are drawn under a stripe lock, so
 *		every claim committed after the pass has a larger id than the
 *		watermark.  The same pass settles expired activities.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/datum.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_reconcile);

/*
 * Activities that changed since their last pass: never checked, due for
 * settlement (closed, or past ends_at), claims past the watermark, or stripe
 * sums other than the last pass saw (which is how a balance changed behind
 * the extension's back shows up).  A full check takes every activity.
 */
static RpPlan pending = {
	"SELECT a.id FROM redpacket.activity a"
	"  LEFT JOIN redpacket.reconcile_state r ON r.activity_id = a.id"
	"  CROSS JOIN LATERAL (SELECT sum(balance) AS balance, sum(packets) AS packets,"
	"                             sum(claims)::bigint AS claims"
	"                        FROM redpacket.stripe s WHERE s.activity_id = a.id) s"
	" WHERE $1 OR r.last_pass_at IS NULL"	/* also: no state row at all */
	"    OR (NOT r.settled AND (a.closed_at IS NOT NULL OR a.ends_at <= now()))"
	"    OR (s.balance, s.packets, s.claims)"
	"       IS DISTINCT FROM (r.last_balance, r.last_packets, r.last_claims)"
	"    OR EXISTS (SELECT 1 FROM redpacket.claim c"
	"                WHERE c.activity_id = a.id AND c.claim_id > r.last_claim_id)"
	" ORDER BY a.id",
	1, {BOOLOID}
};

/* A lost state row is recreated; that pass then re-sums every claim. */
static RpPlan recreate_state = {
	"INSERT INTO redpacket.reconcile_state (activity_id) VALUES ($1)"
	" ON CONFLICT (activity_id) DO NOTHING",
	1, {INT8OID}
};

static RpPlan read_state = {
	"SELECT last_claim_id, claimed, claim_count FROM redpacket.reconcile_state"
	" WHERE activity_id = $1",
	1, {INT8OID}
};

/*
 * One statement computes the whole check from the watermark ($2, $3, $4:
 * last claim id, claimed sum and claim count up to it).
 */
static RpPlan check = {
	"WITH l AS (SELECT coalesce(sum(amount) FILTER (WHERE kind = 'fund'), 0) AS funded,"
	"                  coalesce(sum(amount) FILTER (WHERE kind = 'return'), 0) AS returned"
	"             FROM redpacket.ledger WHERE activity_id = $1),"
	"     c AS (SELECT coalesce(sum(amount), 0) AS amount, count(*) AS n,"
	"                  coalesce(max(claim_id), $2) AS last_id"
	"             FROM redpacket.claim WHERE activity_id = $1 AND claim_id > $2),"
	"     s AS (SELECT coalesce(sum(balance), 0) AS balance, sum(packets) AS packets,"
	"                  coalesce(sum(claims), 0)::bigint AS claims,"
	"                  count(*) FILTER (WHERE balance < 0 OR packets < 0) AS negative"
	"             FROM redpacket.stripe WHERE activity_id = $1)"
	" SELECT l.funded - l.returned - ($3 + c.amount) AS expected,"
	"        round(s.balance / (10::numeric ^ a.scale), a.scale) AS actual,"
	"        a.packets - ($4 + c.n) AS expected_packets,"
	"        s.packets::bigint AS actual_packets,"
	"        $4 + c.n AS expected_claims, s.claims AS actual_claims,"
	"        s.negative, c.n AS new_claims, c.last_id, $3 + c.amount AS claimed,"
	"        s.balance AS balance_units"
	"   FROM redpacket.activity a, l, c, s WHERE a.id = $1",
	4, {INT8OID, INT8OID, NUMERICOID, INT8OID}
};

static RpPlan record = {
	"INSERT INTO redpacket.reconciliation"
	"       (activity_id, checked_at, full_check, expected, actual, drift,"
	"        expected_packets, actual_packets, expected_claims, actual_claims,"
	"        negative_stripes, new_claims, ok)"
	" VALUES ($1, $2, $3, $4, $5, $5 - $4, $6, $7, $8, $9, $10, $11,"
	"         $4 = $5 AND $6 IS NOT DISTINCT FROM $7 AND $8 = $9 AND $10 = 0)"
	" RETURNING *",
	11, {INT8OID, TIMESTAMPTZOID, BOOLOID, NUMERICOID, NUMERICOID, INT8OID, INT8OID,
	INT8OID, INT8OID, INT4OID, INT8OID}
};

static RpPlan advance = {
	"UPDATE redpacket.reconcile_state"
	"   SET last_claim_id = $2, claimed = $3, claim_count = $4, settled = $5,"
	"       last_pass_at = $6, last_balance = $7, last_packets = $8, last_claims = $9"
	" WHERE activity_id = $1",
	9, {INT8OID, INT8OID, NUMERICOID, INT8OID, BOOLOID, TIMESTAMPTZOID, NUMERICOID,
	INT8OID, INT8OID}
};

static RpPlan alert = {
	"SELECT pg_notify('redpacket_alert', json_build_object("
	"         'activity', $1, 'expected', $2, 'actual', $3, 'drift', $3 - $2,"
	"         'checked_at', $4, 'pass_id', $5)::text)",
	5, {INT8OID, NUMERICOID, NUMERICOID, TIMESTAMPTZOID, INT8OID}
};

static RpPlan freeze = {
	"UPDATE redpacket.activity"
	"   SET frozen_reason = $2, frozen_at = now()"
	" WHERE id = $1 AND frozen_reason IS NULL",
	2, {INT8OID, TEXTOID}
};

static char *
NumText(Datum n)
{
	return DatumGetCString(DirectFunctionCall1(numeric_out, n));
}

/* Reconcile one activity; returns the recorded row's ok flag. */
static bool
ReconcileOne(int64 activity, bool full_check, Tuplestorestate *out)
{
	RpActivity	act;
	Datum		values[11];
	char		nulls[11];
	bool		isnull;
	bool		settled;
	bool		ok;
	TimestampTz checked_at = GetCurrentTimestamp();
	Datum		expected,
				actual;
	int64		pass_id;

	(void) RpFetchActivity(activity, &act, false);
	RpLockAllStripes(&act);

	/* settle an activity whose time is up (exactly once: see RpSettle) */
	settled = act.closed;
	if (!act.closed && act.ends_at <= GetCurrentTransactionStartTimestamp())
	{
		(void) RpSettle(&act, "expired");
		settled = true;
	}

	values[0] = Int64GetDatum(activity);
	if (full_check)
	{
		values[1] = Int64GetDatum(0);
		values[2] = NumericGetDatum(int64_to_numeric(0));
		values[3] = Int64GetDatum(0);
	}
	else
	{
		if (RpExec(&read_state, values, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read reconciliation state");
		if (SPI_processed == 1)
		{
			values[1] = Int64GetDatum(RpGetInt64(0, 1, 0));
			values[2] = datumCopy(RpGetDatum(0, 2, &isnull), false, -1);
			values[3] = Int64GetDatum(RpGetInt64(0, 3, 0));
		}
		else
		{
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("activity " INT64_FORMAT " had no reconciliation state", activity),
					 errdetail("The state row was recreated and this pass re-sums every claim.")));
			if (RpExec(&recreate_state, values, NULL, false, 0) != SPI_OK_INSERT)
				elog(ERROR, "could not recreate reconciliation state");
			full_check = true;
			values[1] = Int64GetDatum(0);
			values[2] = NumericGetDatum(int64_to_numeric(0));
			values[3] = Int64GetDatum(0);
		}
	}
	if (RpExec(&check, values, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reconciliation check of activity " INT64_FORMAT " returned no row", activity);

	/* $1 activity, $2 checked_at, $3 full, $4.. from the check's columns */
	memset(nulls, ' ', sizeof(nulls));
	values[0] = Int64GetDatum(activity);
	values[1] = TimestampTzGetDatum(checked_at);
	values[2] = BoolGetDatum(full_check);
	for (int col = 1; col <= 8; col++)
	{
		Datum		d = RpGetDatum(0, col, &isnull);

		if (col <= 2)
			d = isnull ? d : datumCopy(d, false, -1);
		values[2 + col] = d;
		nulls[2 + col] = isnull ? 'n' : ' ';
	}
	{
		/* watermark for the next pass, and the stripe sums seen */
		Datum		adv[9];
		char		advnulls[9];

		adv[0] = Int64GetDatum(activity);
		adv[1] = Int64GetDatum(RpGetInt64(0, 9, 0));
		adv[2] = datumCopy(RpGetDatum(0, 10, &isnull), false, -1);
		adv[3] = Int64GetDatum(RpGetInt64(0, 5, 0));
		adv[4] = BoolGetDatum(settled);
		adv[5] = TimestampTzGetDatum(checked_at);
		adv[6] = datumCopy(RpGetDatum(0, 11, &isnull), false, -1);
		adv[7] = values[6];		/* actual_packets, may be NULL */
		adv[8] = values[8];		/* actual_claims */
		memset(advnulls, ' ', sizeof(advnulls));
		advnulls[7] = nulls[6];

		/* the type of negative_stripes is integer in the record */
		values[9] = Int32GetDatum((int32) DatumGetInt64(values[9]));

		if (RpExec(&record, values, nulls, false, 1) != SPI_OK_INSERT_RETURNING)
			elog(ERROR, "could not record reconciliation");
		if (out)
			tuplestore_puttuple(out, SPI_tuptable->vals[0]);
		ok = DatumGetBool(RpGetDatum(0, 14, &isnull));
		pass_id = RpGetInt64(0, 2, 0);

		if (RpExec(&advance, adv, advnulls, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not advance reconciliation state");
	}

	expected = values[3];
	actual = values[4];
	if (!ok)
	{
		Datum		a[5];

		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("redpacket reconciliation of activity " INT64_FORMAT " failed", activity),
				 errdetail("Expected balance %s, stripes hold %s (drift %s); packets expected %s, held %s; claims %s, counted on stripes %s; %d negative stripes.",
						   NumText(expected), NumText(actual),
						   NumText(DirectFunctionCall2(numeric_sub, actual, expected)),
						   nulls[5] == 'n' ? "-" : psprintf(INT64_FORMAT, DatumGetInt64(values[5])),
						   nulls[6] == 'n' ? "-" : psprintf(INT64_FORMAT, DatumGetInt64(values[6])),
						   psprintf(INT64_FORMAT, DatumGetInt64(values[7])),
						   psprintf(INT64_FORMAT, DatumGetInt64(values[8])),
						   DatumGetInt32(values[9])),
				 errhint("The activity is frozen when redpacket.freeze_on_mismatch is on; investigate, then call redpacket.rp_unfreeze.")));

		a[0] = Int64GetDatum(activity);
		a[1] = expected;
		a[2] = actual;
		a[3] = TimestampTzGetDatum(checked_at);
		a[4] = Int64GetDatum(pass_id);
		if (RpExec(&alert, a, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not send redpacket_alert");

		if (rp_freeze_on_mismatch)
		{
			a[1] = CStringGetTextDatum(psprintf("reconciliation mismatch at pass " INT64_FORMAT,
												pass_id));
			if (RpExec(&freeze, a, NULL, false, 0) != SPI_OK_UPDATE)
				elog(ERROR, "could not freeze activity");
			RpSyncHalt(activity);
		}
	}

	/* Keep the locks of stripes this pass wrote (settled or frozen them). */
	if (ok && !(settled && !act.closed))
		for (int s = 0; s < act.stripes; s++)
			RpUnlock(RP_LOCK_STRIPE, act.id, (uint32) s);
	return ok;
}

/*
 * One pass over one activity, or all pending ones when activity is NULL.  Returns
 * the number of activities checked, or -1 when another pass holds the
 * reconciliation lock.  Must be called inside SPI_connect.
 */
int
RpReconcilePass(const int64 *activity, bool full_check, Tuplestorestate *out)
{
	int64	   *ids;
	int			n;

	if (activity != NULL)
		RpRequireLocalActivity(*activity);
	if (!RpLock(RP_LOCK_RECONCILE, 0, 0, false))
		return -1;

	if (activity != NULL)
	{
		ids = palloc(sizeof(int64));
		ids[0] = *activity;
		n = 1;
	}
	else
	{
		Datum		all = BoolGetDatum(full_check);

		if (RpExec(&pending, &all, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not list activities to reconcile");
		n = (int) SPI_processed;
		ids = palloc(sizeof(int64) * Max(n, 1));
		for (int i = 0; i < n; i++)
			ids[i] = RpGetInt64(i, 1, 0);
	}

	/* on a Citus cluster, each node checks the activities it holds */
	for (int i = 0; i < n; i++)
		if (activity != NULL || RpActivityIsLocal(ids[i]))
			(void) ReconcileOne(ids[i], full_check, out);
	return n;
}

Datum
rp_reconcile(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		full_check = PG_ARGISNULL(1) ? false : PG_GETARG_BOOL(1);

	/*
	 * Each check reads with a snapshot taken after it holds the stripe locks;
	 * a transaction snapshot taken earlier could miss a claim that commits
	 * while the pass waits, and the watermark would then pass over it.
	 */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("rp_reconcile must run in a READ COMMITTED transaction"),
				 errdetail("The pass reads each activity with a fresh snapshot after it has locked the activity's stripes."),
				 errhint("Call it outside an explicit REPEATABLE READ or SERIALIZABLE transaction.")));

	InitMaterializedSRF(fcinfo, 0);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	{
		int64		one = PG_ARGISNULL(0) ? 0 : PG_GETARG_INT64(0);

		(void) RpReconcilePass(PG_ARGISNULL(0) ? NULL : &one, full_check, rsinfo->setResult);
	}
	SPI_finish();
	return (Datum) 0;
}
