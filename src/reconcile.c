/*
 * reconcile.c
 *		The reconciliation pass, shared by rp_reconcile() and the background
 *		worker (worker.c).  For each activity, while it holds every stripe
 *		lock of that activity (so no claim is in flight and what it reads is one
 *		consistent state), it proves the ledger identity
 *		funded - returned - sum(claims) = sum(stripe balances), the packet
 *		identity, the claim count, that no stripe is negative, and that a
 *		closed activity is empty (check.c).  It is incremental: a per-activity
 *		watermark keeps the running sums of claims already checked, so a pass
 *		reads only claims newer than the last one.  Claim ids come from an
 *		uncached sequence and are drawn under a stripe lock, so every claim
 *		committed after the pass has a larger id than the watermark.  The
 *		same pass settles expired activities, and freezes an activity whose
 *		check failed (when redpacket.freeze_on_mismatch is on); alert.c tells
 *		people.
 *
 * What a pass never does: act on an activity it cannot fully see (stripe
 * rows missing, no funding entry, no state row, a sequence behind the ids in
 * its table: what a restore in progress looks like), write anything while a
 * restore is announced (RpRestoring), hold the stripe locks of more than a
 * constant number of stripes, or stop at the first activity whose check
 * raises an error (each activity is checked in a subtransaction; the error
 * is recorded and the pass goes on).
 *
 * A pass over all activities lists what is pending (RpPassList), then
 * checks the listed activities one step at a time (RpPassStep): the worker
 * runs each step in a transaction of its own, rp_reconcile() all of them in
 * its caller's transaction, within RP_PASS_LOCK_BUDGET.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "alert.h"
#include "check.h"
#include "reconcile.h"
#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_reconcile);

int			rp_full_check_interval = RP_DEFAULT_FULL_CHECK_INTERVAL;
static bool rp_freeze_on_mismatch = true;
static bool rp_restoring = false;

/*
 * Stripe locks the passes of one transaction may keep until it ends (those
 * of the activities they settled or froze).  The activity that would go
 * past it is left pending for the next pass; one activity alone is always
 * allowed (it has at most RP_MAX_STRIPES stripes).  Counted per transaction,
 * so that calling rp_reconcile() again in the same transaction does not
 * take more.
 */
#define RP_PASS_LOCK_BUDGET RP_MAX_STRIPES

static LocalTransactionId kept_lxid = InvalidLocalTransactionId;
static int	kept_in_xact = 0;


/*
 * Activities that changed since their last pass: never checked (or no
 * state row), due for settlement, claims past the watermark, or stripe sums
 * other than the last pass saw (which is how a balance changed behind the
 * extension's back shows up).  $1 takes every activity (a full check), $2
 * is the time of the pass.  Column 2 says whether to re-sum every claim.
 */
#define RP_PENDING_FROM \
	"  FROM redpacket.activity a" \
	"  LEFT JOIN redpacket.reconcile_state r ON r.activity_id OPERATOR(pg_catalog.=) a.id" \
	"  CROSS JOIN LATERAL (SELECT pg_catalog.sum(st.balance) AS balance," \
	"                             pg_catalog.sum(st.packets) AS packets," \
	"                             pg_catalog.sum(st.claims)::pg_catalog.int8 AS claims" \
	"                        FROM redpacket.stripe st" \
	"                       WHERE st.activity_id OPERATOR(pg_catalog.=) a.id) s"
#define RP_PENDING_CHANGED \
	"r.last_pass_at IS NULL" \
	" OR (NOT r.settled AND (a.closed_at IS NOT NULL OR a.ends_at OPERATOR(pg_catalog.<=) $2))" \
	" OR (s.balance, s.packets, s.claims)" \
	"    IS DISTINCT FROM (r.last_balance, r.last_packets, r.last_claims)" \
	" OR EXISTS (SELECT FROM redpacket.claim c" \
	"             WHERE c.activity_id OPERATOR(pg_catalog.=) a.id" \
	"               AND c.claim_id OPERATOR(pg_catalog.>) r.last_claim_id)"

static RpPlan pending_10 = {
	"SELECT a.id, $1" RP_PENDING_FROM
	" WHERE $1 OR " RP_PENDING_CHANGED
	" ORDER BY a.id",
	2, {BOOLOID, TIMESTAMPTZOID}
};

/*
 * 1.1 adds automatic full checks: besides what changed, the share $4 of all
 * activities whose last full check is older than $3 (oldest first) gets
 * one, so a pass never re-sums everything at once.  $3 NULL: none.
 */
static RpPlan pending_11 = {
	"WITH p AS (SELECT a.id, r.last_full_check_at AS lf, " RP_PENDING_CHANGED " AS changed"
	RP_PENDING_FROM "),"
	"     f AS (SELECT p.id FROM p"
	"            WHERE $3 IS NOT NULL"
	"              AND (p.lf IS NULL OR p.lf OPERATOR(pg_catalog.<) $3)"
	"            ORDER BY p.lf NULLS FIRST, p.id"
	"            LIMIT (SELECT pg_catalog.ceil(pg_catalog.count(*)::pg_catalog.numeric"
	"                                          OPERATOR(pg_catalog.*) $4)::pg_catalog.int8 FROM p))"
	" SELECT p.id, $1 OR f.id IS NOT NULL FROM p LEFT JOIN f ON f.id OPERATOR(pg_catalog.=) p.id"
	"  WHERE $1 OR p.changed OR f.id IS NOT NULL"
	"  ORDER BY p.id",
	4, {BOOLOID, TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID}
};

static RpPlan freeze = {
	"UPDATE redpacket.activity"
	"   SET frozen_reason = $2, frozen_at = $3"
	" WHERE id OPERATOR(pg_catalog.=) $1 AND frozen_reason IS NULL",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static RpPlan pass_status = {
	"UPDATE redpacket.reconciler"
	"   SET last_pass_started_at = $1, last_pass_finished_at = $2,"
	"       last_pass_ms = $3, activities_checked = $4, failures = $5",
	5, {TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID, INT4OID, INT4OID}
};

/* A pass over a list of activities. */
struct RpPass
{
	bool		one;			/* an explicit check of one named activity */
	bool		repair;			/* an explicit full check of one activity */
	int			kept_locks;		/* stripe locks this pass keeps until the transaction ends */
	int			checked;
	int			failures;
	bool		budget_stop;	/* the lock budget left activities pending */
	Tuplestorestate *out;
	TupleDesc	outdesc;
	MemoryContext cxt;			/* where the pass and its list live */
	TimestampTz started;
	int64	   *ids;			/* the listed activities (RpPassList) */
	bool	   *full;
	int			n;
	int			next;
};

enum
{
	PENDING_ID = 1, PENDING_FULL
};

/*
 * A failed check freezes the activity when redpacket.freeze_on_mismatch is
 * on (claims answer frozen until an operator calls rp_unfreeze).  Sets
 * c->froze when this check froze it, c->frozen when it is frozen now.
 */
static void
FreezeOnMismatch(RpCheck *c, const RpActivity *act)
{
	c->frozen = act->frozen;
	if (rp_freeze_on_mismatch)
	{
		Datum		v[3];

		v[0] = Int64GetDatum(c->activity);
		v[1] = CStringGetTextDatum(psprintf("reconciliation mismatch at pass " INT64_FORMAT,
											c->pass_id));
		v[2] = TimestampTzGetDatum(c->checked_at);
		if (RpExec(&freeze, v, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "could not freeze activity");
		c->froze = SPI_processed > 0;
		if (c->froze)
			RpSyncHalt(act->id);
	}
	c->frozen = act->frozen || c->froze;
}

/*
 * Check one activity, with every stripe lock held: settle it first when its
 * time is up, record the check, advance the watermark, alert on failure.
 * Stripe locks are kept (until the transaction ends) only when this wrote
 * what claims read: a settlement or a freeze.  Returns the stripes kept.
 */
static int
ReconcileOne(RpCheck *c, const RpActivity *act, const RpPass *pass)
{
	bool		v11 = RpCatalogVersion() >= RP_CATALOG_1_1;
	bool		settled = act->closed;
	bool		wrote = false;

	RpWaitAllStripes(act);
	c->checked_at = GetCurrentTimestamp();
	c->detail = RpCheckIncomplete(act, pass->repair && c->full);
	if (c->detail != NULL)
	{
		c->failed[RP_PROBLEM_INCOMPLETE] = true;
		c->ok = false;
	}
	else
	{
		/* settle an activity whose time is up (exactly once: see RpSettle) */
		if (!act->closed && act->ends_at <= GetCurrentTransactionStartTimestamp())
		{
			(void) RpSettle(act, "expired");
			settled = wrote = true;
		}
		RpCheckRun(c, v11);
		c->ok = true;
		for (int p = 0; p < RP_NPROBLEMS; p++)
			c->ok = c->ok && !c->failed[p];
		RpCheckRecord(c, v11);
		RpCheckAdvance(c, settled, v11);
	}
	if (!c->ok)
	{
		if (c->detail == NULL)
			FreezeOnMismatch(c, act);
		RpAlert(c);
		wrote = wrote || c->froze;
	}
	if (wrote)
		return act->stripes;
	for (int s = 0; s < act->stripes; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
	return 0;
}

/* What the steps run in subtransactions work on. */
typedef struct RpStep
{
	RpCheck    *c;
	RpActivity *act;
	RpPass	   *pass;
} RpStep;

static void
CheckStep(void *arg)
{
	RpStep	   *st = arg;

	st->pass->kept_locks += ReconcileOne(st->c, st->act, st->pass);
}

static void
RecordErrorStep(void *arg)
{
	RpStep	   *st = arg;

	if (RpCatalogVersion() >= RP_CATALOG_1_1)
		RpCheckRecord(st->c, true);
	RpAlert(st->c);
}

/*
 * Run fn(arg) in a subtransaction.  On an error other than a cancel, a
 * shutdown or a read-only transaction (nothing about one activity), roll the
 * subtransaction back (with the locks it took) and return the error; NULL
 * when fn succeeded.
 */
static ErrorData *
InSubtransaction(void (*fn) (void *), void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
			edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN ||
			edata->sqlerrcode == ERRCODE_READ_ONLY_SQL_TRANSACTION)
			PG_RE_THROW();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_END_TRY();
	return edata;
}

/*
 * Check one activity in a subtransaction: an error in it is caught, logged,
 * recorded as a failed check with its message (in a second subtransaction),
 * and the pass goes on.  Returns false when the activity no longer exists.
 */
static bool
ReconcileGuarded(int64 activity, bool full, RpPass *pass)
{
	RpCheck    *c = palloc0(sizeof(RpCheck));
	RpActivity	act;
	RpStep		st = {c, &act, pass};
	ErrorData  *err;

	c->activity = activity;
	c->full = full;
	c->checked_at = GetCurrentTimestamp();
	if (!RpFetchActivity(activity, &act, !pass->one))
		return false;

	err = InSubtransaction(CheckStep, &st);
	if (err != NULL)
	{
		memset(c->failed, 0, sizeof(c->failed));
		c->failed[RP_PROBLEM_ERROR] = true;
		c->ok = c->frozen = c->froze = c->recorded = false;
		c->row = NULL;
		c->detail = err->message;
		c->frozen = act.frozen;
		err = InSubtransaction(RecordErrorStep, &st);
		if (err != NULL)
			ereport(WARNING,
					(errcode(err->sqlerrcode),
					 errmsg("could not record the failed check of activity " INT64_FORMAT ": %s",
							activity, err->message)));
	}

	pass->checked++;
	if (!c->ok)
		pass->failures++;
	if (pass->out)
	{
		if (c->row == NULL && RpCatalogVersion() >= RP_CATALOG_1_1)
			c->row = RpCheckUnrecordedRow(c, pass->outdesc);
		if (c->row != NULL)
			tuplestore_puttuple(pass->out, c->row);
	}
	return true;
}

/*
 * List the activities a pass over all visits, with whether each gets a full
 * check, into the pass (allocated in cxt: SPI calls leave
 * CurrentMemoryContext at SPI's).  full_before (0: none) and full_share are
 * the automatic full checks of 1.1 (pending_11).  Returns how many.
 */
int
RpPassList(RpPass *pass, bool full_all, TimestampTz full_before, Datum full_share)
{
	MemoryContext cxt = pass->cxt;
	Datum		v[4];
	char		n[4] = {' ', ' ', ' ', ' '};
	bool		v11 = RpCatalogVersion() >= RP_CATALOG_1_1;
	int			count;

	v[0] = BoolGetDatum(full_all);
	v[1] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	v[2] = TimestampTzGetDatum(full_before);
	n[2] = full_before == 0 ? 'n' : ' ';
	v[3] = full_before == 0 ? NumericGetDatum(int64_to_numeric(0)) : full_share;
	if (RpExec(v11 ? &pending_11 : &pending_10, v, n, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list activities to reconcile");
	count = (int) SPI_processed;
	pass->ids = MemoryContextAlloc(cxt, sizeof(int64) * Max(count, 1));
	pass->full = MemoryContextAlloc(cxt, sizeof(bool) * Max(count, 1));
	for (int i = 0; i < count; i++)
	{
		bool		isnull;

		pass->ids[i] = RpGetInt64(i, PENDING_ID, 0);
		pass->full[i] = DatumGetBool(RpGetDatum(i, PENDING_FULL, &isnull));
	}
	pass->n = count;
	pass->next = 0;
	return count;
}

/* Overwrite the reconciler's status row (1.1) after a pass over all. */
void
RpPassRecord(const RpPass *pass)
{
	TimestampTz finished = GetCurrentTimestamp();
	Datum		v[5];

	if (RpCatalogVersion() < RP_CATALOG_1_1)
		return;
	v[0] = TimestampTzGetDatum(pass->started);
	v[1] = TimestampTzGetDatum(finished);
	v[2] = DirectFunctionCall2(numeric_div,
							   NumericGetDatum(int64_to_numeric(finished - pass->started)),
							   NumericGetDatum(int64_to_numeric(1000)));
	v[3] = Int32GetDatum(pass->checked);
	v[4] = Int32GetDatum(pass->failures);
	if (RpExec(&pass_status, v, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not record the reconciliation pass");
}

/* A pass, allocated in cxt; its list and counts live there too. */
RpPass *
RpPassCreate(MemoryContext cxt)
{
	RpPass	   *pass = MemoryContextAllocZero(cxt, sizeof(RpPass));

	pass->cxt = cxt;
	pass->started = GetCurrentTimestamp();
	return pass;
}

int
RpPassChecked(const RpPass *pass)
{
	return pass->checked;
}

/*
 * Check the next listed activity in the current transaction (the worker's
 * step: the commit releases what it kept).  Returns whether activities are
 * left for further steps.  Must be called inside SPI_connect.
 */
bool
RpPassStep(RpPass *pass)
{
	int64		activity;

	if (pass->next >= pass->n)
		return false;
	activity = pass->ids[pass->next];
	/* on a Citus cluster each node checks the activities it holds */
	if (RpActivityIsLocal(activity) &&
		!ReconcileGuarded(activity, pass->full[pass->next], pass))
		elog(DEBUG1, "activity " INT64_FORMAT " disappeared before its check", activity);
	pass->kept_locks = 0;		/* the commit releases them */
	pass->next++;
	return pass->next < pass->n;
}

/*
 * An explicit check of one activity may have to keep its stripe locks (when
 * it settles or freezes it): refuse it when that could take this
 * transaction past RP_PASS_LOCK_BUDGET, rather than fill the lock table
 * with a query that reconciles many activities one by one.
 */
static void
RequireLockBudget(int64 activity)
{
	RpActivity	act;

	if (kept_in_xact > 0 && RpFetchActivity(activity, &act, true) &&
		kept_in_xact + act.stripes > RP_PASS_LOCK_BUDGET)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("this transaction already keeps %d stripe locks of activities it reconciled",
						kept_in_xact),
				 errdetail("Reconciling activity " INT64_FORMAT " could keep %d more, and a transaction keeps at most %d.",
						   activity, act.stripes, RP_PASS_LOCK_BUDGET),
				 errhint("Reconcile each activity in a transaction of its own, or call redpacket.rp_reconcile() without an activity.")));
}

/*
 * One pass in the caller's transaction (rp_reconcile): over one activity,
 * or all pending ones when activity is NULL.  Returns the number of
 * activities checked, or -1 when another pass holds the reconciliation lock
 * or a restore is running.  The stripe locks it keeps stay within
 * RP_PASS_LOCK_BUDGET; activities past it are left for the next pass.  Must
 * be called inside SPI_connect.
 */
static int
ReconcileInCallerXact(const int64 *activity, bool full_check, Tuplestorestate *out,
					  TupleDesc desc)
{
	RpPass	   *pass;
	int			n;
	int			i;

	if (RpRestoring())
	{
		ereport(NOTICE,
				(errmsg("redpacket reconciliation skipped: a restore is in progress"),
				 errdetail("redpacket.restoring is on for this session or database."),
				 errhint("Run the pass after redpacket.rp_post_restore().")));
		return -1;
	}
	/* on a Citus cluster, refuse before any lock: see scaleout.c */
	if (activity != NULL)
		RpRequireLocalActivity(*activity);
	if (!RpLock(RP_LOCK_RECONCILE, 0, 0, false))
		return -1;

	pass = RpPassCreate(CurrentMemoryContext);
	pass->out = out;
	pass->outdesc = desc;
	if (kept_lxid != MyProc->lxid)
	{
		kept_lxid = MyProc->lxid;
		kept_in_xact = 0;
	}
	if (activity != NULL)
	{
		RequireLockBudget(*activity);
		pass->one = true;
		pass->repair = full_check;
		(void) ReconcileGuarded(*activity, full_check, pass);
		kept_in_xact += pass->kept_locks;
		return pass->checked;
	}

	n = RpPassList(pass, full_check, 0, (Datum) 0);
	for (i = 0; i < n; i++)
	{
		RpActivity	act;

		/* on a Citus cluster each node checks the activities it holds */
		if (!RpActivityIsLocal(pass->ids[i]) || !RpFetchActivity(pass->ids[i], &act, true))
			continue;
		if (kept_in_xact > 0 && kept_in_xact + act.stripes > RP_PASS_LOCK_BUDGET)
			break;
		pass->kept_locks = 0;
		(void) ReconcileGuarded(pass->ids[i], pass->full[i], pass);
		kept_in_xact += pass->kept_locks;
	}
	if (i < n)
		ereport(NOTICE,
				(errmsg("redpacket reconciliation checked %d activities and left %d for the next pass",
						pass->checked, n - i),
				 errdetail("A transaction keeps the stripe locks of the activities its passes settled or froze until it ends, and stops at %d of them.",
						   RP_PASS_LOCK_BUDGET),
				 errhint("Call redpacket.rp_reconcile() again, each call in its own transaction.")));
	RpPassRecord(pass);
	return pass->checked;
}

static RpPlan database_restoring = {
	"SELECT true FROM pg_catalog.pg_db_role_setting s"
	" WHERE s.setdatabase OPERATOR(pg_catalog.=) $1"
	"   AND s.setrole OPERATOR(pg_catalog.=) 0::pg_catalog.oid"
	"   AND 'redpacket.restoring=on' OPERATOR(pg_catalog.=) ANY (s.setconfig)",
	1, {OIDOID}
};

/*
 * True while a restore is in progress: redpacket.restoring is on in this
 * session, or set for this database (rp_pre_restore does that).  The
 * database setting is read from the catalog, not the session's copy, so a
 * long-lived worker sees it as soon as it is committed.  Must be called
 * inside SPI_connect.
 */
bool
RpRestoring(void)
{
	Datum		db = ObjectIdGetDatum(MyDatabaseId);

	if (rp_restoring)
		return true;
	if (RpExec(&database_restoring, &db, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the settings of the database");
	return SPI_processed > 0;
}

/* The reconciliation's settings; called from _PG_init. */
void
RpReconcileInit(void)
{
	DefineCustomIntVariable("redpacket.full_check_interval",
							"Seconds within which the worker fully checks every activity.",
							"Each worker pass re-sums every claim of its share of the activities whose last full check is older; 0 turns automatic full checks off.",
							&rp_full_check_interval,
							RP_DEFAULT_FULL_CHECK_INTERVAL, RP_MIN_FULL_CHECK_INTERVAL,
							RP_MAX_FULL_CHECK_INTERVAL,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.freeze_on_mismatch",
							 "Freeze an activity whose reconciliation fails.",
							 NULL,
							 &rp_freeze_on_mismatch,
							 true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.restoring",
							 "Pause every reconciliation pass in this session or database.",
							 "Set by redpacket.rp_pre_restore() for the database while a dump is restored; rp_post_restore() clears it.",
							 &rp_restoring,
							 false,
							 PGC_SUSET, 0, NULL, NULL, NULL);
}

Datum
rp_reconcile(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		full_check;
	int64		one;

	RpNoNull(PG_ARGISNULL(1), "full_check");
	full_check = PG_GETARG_BOOL(1);
	/* a pass writes: on a standby or in a read-only transaction, say so first */
	PreventCommandIfReadOnly("rp_reconcile()");

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
	one = PG_ARGISNULL(0) ? 0 : PG_GETARG_INT64(0);
	if (RpDistributed() && PG_ARGISNULL(0))
		RpReconcileCluster(full_check, rsinfo->setResult);	/* Citus: every node */
	else if (RpDistributed() && one == 0)
		(void) ReconcileInCallerXact(NULL, full_check, rsinfo->setResult, rsinfo->setDesc);
	else
		(void) ReconcileInCallerXact(PG_ARGISNULL(0) ? NULL : &one, full_check,
									 rsinfo->setResult, rsinfo->setDesc);
	SPI_finish();
	return (Datum) 0;
}
