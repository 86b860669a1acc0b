/*
 * unfreeze.c
 *		When a frozen activity may take claims again.
 *
 *		The ledger and the claims are the money records; the stripes are
 *		derived from them.  Unfreezing an activity the reconciler froze, or
 *		whose last check failed, would let the next claim be paid from
 *		books that are wrong, so rp_unfreeze then needs a full check that
 *		passes at that moment (RpUnfreezeCheck); an operator's own hold on
 *		books that balance lifts as before.  The check is the reconciler's
 *		own, run through SQL (redpacket.rp_reconcile(activity, true)), so
 *		"the books balance" means exactly what it means to the reconciler,
 *		whatever it checks, and this file stays below the activity and
 *		reconciliation code (it calls neither).  rp_repair_stripes
 *		(repair.c) ends with the same check.
 *
 *		Both hold the reconciliation lock (a pass takes it before any
 *		stripe, so under it no pass freezes the activity or records a check
 *		meanwhile) and then every stripe lock of the activity, as close does,
 *		until the transaction ends.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "claim/claim.h"
#include "scaleout/scaleout.h"
#include "unfreeze.h"

/* What the reconciler writes as frozen_reason when a check fails. */
#define RP_RECONCILER_FREEZE "reconciliation mismatch"

/* Whether a full check is needed, and what the locks need to know. */
static RpPlan hold_state = {
	"SELECT a.stripes, a.frozen_reason,"
	"       (SELECT r.ok FROM redpacket.reconciliation r"
	"         WHERE r.activity_id OPERATOR(pg_catalog.=) a.id ORDER BY r.pass_id DESC LIMIT 1)"
	"  FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

/* A full check by the reconciler: its row, and the columns a refusal names. */
enum
{
	FC_ROW = 1, FC_OK, FC_PROBLEMS, FC_ERROR, FC_EXPECTED, FC_ACTUAL, FC_EXP_PACKETS,
	FC_ACT_PACKETS, FC_EXP_CLAIMS, FC_ACT_CLAIMS, FC_NEGATIVE
};

static RpPlan full_check = {
	"SELECT r, r.ok, r.problems, r.error, r.expected, r.actual, r.expected_packets,"
	"       r.actual_packets, r.expected_claims, r.actual_claims, r.negative_stripes"
	"  FROM redpacket.rp_reconcile($1, true) r",
	1, {INT8OID}
};

/*
 * The reconciliation lock and the activity as a walker holds it, kept to
 * the end of the transaction.  A pass takes the reconciliation lock before
 * any activity, so this does too; a transaction that already holds locks
 * of the activity (it froze it, or claimed) waits for the reconciliation
 * lock holding them, out of that order, as an earlier call does for
 * stripes (locks.c: PostgreSQL may fail it with 40P01).
 */
void
RpHoldActivity(const RpActivity *act)
{
	bool		held = RpHeldEarlier(act->id);

	if (!held)
		(void) RpLock(RP_LOCK_RECONCILE, 0, 0, true);
	RpWalk(act);
	if (held)
		(void) RpLock(RP_LOCK_RECONCILE, 0, 0, true);
}

static char *
ColumnText(int col)
{
	char	   *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col);

	return v ? v : "NULL";
}

/* "money (expected 95.00, the stripes hold 94.95); claims (...)" */
static char *
FailedChecks(void)
{
	StringInfoData s;
	bool		isnull;
	Datum		d = RpGetDatum(0, FC_PROBLEMS, &isnull);
	Datum	   *names;
	int			n = 0;

	initStringInfo(&s);
	if (!isnull)
		deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
						  &names, NULL, &n);
	for (int i = 0; i < n; i++)
	{
		char	   *p = TextDatumGetCString(names[i]);

		appendStringInfo(&s, "%s%s", i > 0 ? "; " : "", p);
		if (strcmp(p, "money") == 0)
			appendStringInfo(&s, " (expected %s, the stripes hold %s)",
							 ColumnText(FC_EXPECTED), ColumnText(FC_ACTUAL));
		else if (strcmp(p, "packets") == 0)
			appendStringInfo(&s, " (expected %s, the stripes hold %s)",
							 ColumnText(FC_EXP_PACKETS), ColumnText(FC_ACT_PACKETS));
		else if (strcmp(p, "claims") == 0)
			appendStringInfo(&s, " (%s claims, the stripes count %s)",
							 ColumnText(FC_EXP_CLAIMS), ColumnText(FC_ACT_CLAIMS));
		else if (strcmp(p, "negative") == 0)
			appendStringInfo(&s, " (%s stripes)", ColumnText(FC_NEGATIVE));
		else
		{
			(void) RpGetDatum(0, FC_ERROR, &isnull);
			if (!isnull)
				appendStringInfo(&s, " (%s)", ColumnText(FC_ERROR));
		}
	}
	if (n == 0)
		appendStringInfoString(&s, "no check named");
	return s.data;
}

/*
 * A full check of the activity, now, by the reconciler (with every lock
 * HoldActivity takes): an error naming what failed unless it passes (what
 * says what is refused).  Returns the reconciliation row, in the caller's
 * memory context.
 */
Datum
RpRequireFullCheck(int64 activity, const char *what)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;

	if (RpExec(&full_check, &id, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not check activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " cannot be %s: no full check could run", activity, what),
				 errdetail("redpacket.restoring is on for this session or database."),
				 errhint("Finish the restore with redpacket.rp_post_restore() first.")));
	if (!DatumGetBool(RpGetDatum(0, FC_OK, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " cannot be %s: its books do not balance", activity, what),
				 errdetail("A full check now fails: %s.", FailedChecks()),
				 errhint("If the ledger and the claims are right, rebuild the stripes from them with redpacket.rp_repair_stripes(activity, reason), then unfreeze.")));
	return SPI_datumTransfer(RpGetDatum(0, FC_ROW, &isnull), false, -1);
}

/*
 * Does lifting the hold need a full check?  The reconciler froze it, or its
 * last check failed.  Stable while every stripe lock is held: a pass checks
 * and freezes an activity holding them all.
 */
static bool
NeedsFullCheck(int64 activity)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;
	Datum		d;
	bool		needed;

	if (RpExec(&hold_state, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read activity " INT64_FORMAT, activity);
	d = RpGetDatum(0, 3, &isnull);
	needed = !isnull && !DatumGetBool(d);
	d = RpGetDatum(0, 2, &isnull);
	if (!isnull && strncmp(TextDatumGetCString(d), RP_RECONCILER_FREEZE,
						   strlen(RP_RECONCILER_FREEZE)) == 0)
		needed = true;
	return needed;
}

/*
 * Close, top-ups, withdrawals and window moves settle or move money: on
 * books the reconciler found wrong they would pay out what the ledger does
 * not hold, and a closed activity can no longer be repaired.  The caller
 * holds the activity as a walker does.
 */
static RpPlan wrong_books = {
	"SELECT COALESCE(pg_catalog.starts_with(a.frozen_reason, '" RP_RECONCILER_FREEZE "'), false)"
	"       OR COALESCE((SELECT NOT r.last_ok FROM redpacket.reconcile_state r"
	"                     WHERE r.activity_id OPERATOR(pg_catalog.=) a.id), false)"
	"  FROM redpacket.activity a WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

void
RpRefuseWrongBooks(int64 activity, const char *func)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;

	if (RpCatalogVersion() < RP_CATALOG_1_4)
		return;
	if (RpExec(&wrong_books, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read activity " INT64_FORMAT, activity);
	if (!DatumGetBool(RpGetDatum(0, 1, &isnull)))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s cannot change activity " INT64_FORMAT ": its books were found wrong",
					func, activity),
			 errdetail("The reconciler froze it, or its latest check that ran failed; closing it, topping it up, withdrawing from it or moving its window would move money by books that do not balance."),
			 errhint("Freeze it if it is not (redpacket.rp_freeze), rebuild the stripes with redpacket.rp_repair_stripes(activity, reason), then redpacket.rp_unfreeze.")));
}

void
RpUnfreezeCheck(int64 activity)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull = true;
	bool		held;
	bool		needed;
	RpActivity	act = {.id = activity, .frozen = true};

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (RpCatalogVersion() < RP_CATALOG_1_4)
	{
		SPI_finish();
		return;
	}
	RpRequireLocalActivity(activity);
	if (RpExec(&hold_state, &id, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read activity " INT64_FORMAT, activity);
	if (SPI_processed == 1)
		(void) RpGetDatum(0, 2, &isnull);
	if (isnull)
	{
		/* not frozen, or unknown: SetFrozen's to answer */
		SPI_finish();
		return;
	}
	act.stripes = DatumGetInt32(RpGetDatum(0, 1, &isnull));

	/*
	 * The activity as a walker holds it, as SetFrozen takes it next: enough
	 * for an operator's hold on books that balance.  A full check needs the
	 * reconciliation lock too, which a pass takes before any activity: try
	 * it, and when a pass has it, give back what was taken here and take
	 * both in the pass's order (a transaction that held the activity
	 * already waits holding it, as in RpHoldActivity).
	 */
	held = RpHeldEarlier(activity);
	RpWalk(&act);
	needed = NeedsFullCheck(activity);
	if (needed && !RpLock(RP_LOCK_RECONCILE, 0, 0, false))
	{
		if (!held)
			RpWalkEnd(&act);
		(void) RpLock(RP_LOCK_RECONCILE, 0, 0, true);
		RpWalk(&act);
		needed = NeedsFullCheck(activity);
	}
	if (needed)
		(void) RpRequireFullCheck(activity, "unfrozen");
	SPI_finish();
}
