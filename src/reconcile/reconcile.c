/*
 * reconcile.c
 *		The reconciliation pass, shared by rp_reconcile() and the background
 *		worker (worker.c).  It lists the activities that need a look
 *		(RpPassList), then checks them in batches: it takes every stripe
 *		lock of every activity of a batch (without waiting: an activity
 *		whose stripe is busy with a claim in flight is checked on its own
 *		afterwards, waiting for it), and then, in one subtransaction, one
 *		statement says what it may see of each (check.c), one settles those
 *		whose time is up (settle.c), one proves the identities of each from
 *		its watermark and records the result (check.c, where the argument
 *		for the watermark under a batch is written down), and an activity
 *		whose check failed is frozen when redpacket.freeze_on_mismatch is on;
 *		alert.c tells people.  So a pass costs a few statements per batch
 *		of up to RP_PASS_BATCH_MAX activities instead of a round trip each.
 *
 * What a pass never does: act on an activity it cannot fully see (stripe
 * rows missing, no funding entry, no state row, a sequence behind the ids in
 * its table: what a restore in progress looks like), write anything while a
 * restore is announced (RpRestoring), keep the stripe locks of more than
 * RP_PASS_LOCK_BUDGET stripes in one transaction (nor hold more at once), or
 * stop at the first activity whose check raises an error (a batch whose
 * statements fail is checked again activity by activity, each in a
 * subtransaction of its own: the error is recorded for that activity and
 * the pass goes on).
 *
 * The worker runs each step (a batch, or one busy activity) in a
 * transaction of its own, so the stripe locks it keeps for what it settled
 * or froze go at each commit; rp_reconcile() runs all of them in its
 * caller's transaction and stops at RP_PASS_LOCK_BUDGET kept locks.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/array.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "base/base.h"
#include "claim/claim.h"
#include "ops/ops.h"
#include "scaleout/scaleout.h"
#include "alert.h"
#include "check.h"
#include "pass.h"
#include "uncredited.h"

PG_FUNCTION_INFO_V1(rp_reconcile);
PG_FUNCTION_INFO_V1(rp_reconcile_step);
PG_FUNCTION_INFO_V1(rp_verify);

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

/* How long rp_reconcile waits for a running pass when lock_timeout is 0. */
#define RP_PASS_LOCK_WAIT_MS 60000

static LocalTransactionId kept_lxid = InvalidLocalTransactionId;
static int	kept_in_xact = 0;

/*
 * The planner settings of a pass, at a GUC nest level of their own (pop
 * with AtEOXact_GUC(true, level)): no JIT.  A pass's statements are many
 * small index probes whose generic plans the planner costs for arrays of
 * unknown length, far above jit_above_cost; compiling them cost a listing
 * of 8,000 activities 0.7 s of its 1 s.  The worker sets the same for its
 * whole life (worker.c).
 */
static int
RpPassSettings(void)
{
	int			level = NewGUCNestLevel();

	(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
}


/*
 * Activities that changed since their last pass: never checked (or no
 * state row), due for settlement, claims past the watermark, or stripe sums
 * other than the last pass saw (which is how a balance changed behind the
 * extension's back shows up).  $1 takes every activity (a full check), $2
 * is the time of the pass.  The listing gives each activity's id, its
 * stripe count, and whether to re-sum every claim (PENDING_*).  Catalogs
 * up to 1.3 look at every activity; 1.4 at those not settled (and the
 * automatic full checks), through indexes, so a pass does not grow with
 * the history of activities either.
 */
enum
{
	PENDING_ID = 1, PENDING_STRIPES, PENDING_FULL
};

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
#define RP_PENDING_ARGS 4, {BOOLOID, TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID}

static RpPlan pending_10 = {
	"SELECT a.id, a.stripes, $1" RP_PENDING_FROM
	" WHERE $1 OR " RP_PENDING_CHANGED
	" ORDER BY a.id",
	RP_PENDING_ARGS
};

/*
 * 1.1 adds automatic full checks: besides what changed, the share $4 of all
 * activities whose last full check is older than $3 (oldest first) gets
 * one, so a pass never re-sums everything at once.  $3 NULL: none.
 */
static RpPlan pending_11 = {
	"WITH p AS (SELECT a.id, a.stripes, r.last_full_check_at AS lf, " RP_PENDING_CHANGED " AS changed"
	RP_PENDING_FROM "),"
	"     f AS (SELECT p.id FROM p"
	"            WHERE $3 IS NOT NULL"
	"              AND (p.lf IS NULL OR p.lf OPERATOR(pg_catalog.<) $3)"
	"            ORDER BY p.lf NULLS FIRST, p.id"
	"            LIMIT (SELECT pg_catalog.ceil(pg_catalog.count(*)::pg_catalog.numeric"
	"                                          OPERATOR(pg_catalog.*) $4)::pg_catalog.int8 FROM p))"
	" SELECT p.id, p.stripes, $1 OR f.id IS NOT NULL"
	"   FROM p LEFT JOIN f ON f.id OPERATOR(pg_catalog.=) p.id"
	"  WHERE $1 OR p.changed OR f.id IS NOT NULL"
	"  ORDER BY p.id",
	RP_PENDING_ARGS
};

/*
 * 1.4: the candidates are the activities not settled yet
 * (reconcile_state_unsettled) and the oldest share of full checks
 * (reconcile_state_full_check: a share of the estimated number of
 * activities, at most RP_FULL_CHECKS_MAX a pass).  Of the first, those
 * that changed: never checked, due for settlement, or a claim, a ledger
 * entry or a reversal with an id past what the last check saw; each of
 * those tests is one probe of an index.  Reading an activity's stripes
 * costs a page per stripe, so their sums are compared with what the last
 * check saw for one slice of the candidates a pass, in turn, of about
 * RP_PASS_STRIPE_ROWS stripes (all of them while they have no more): a
 * balance changed behind the extension's back is seen within as many
 * passes as there are slices, and by the activity's next check in any
 * case.  A settled activity changes only by a reversal (a refund entry) or
 * behind the extension's back: the full checks find both.  $5 counts the
 * passes (reconciler.passes), which picks the slice.  Nothing hides from
 * the candidates: a state row whose activity row is gone is one (its check
 * says incomplete), and each pass probes the next RP_PASS_STATE_PROBE
 * activities after reconciler.probed_through ($6, up to $7) for one that
 * lost its state row, so a lost row is found within as many passes as the
 * activities fill windows.
 */
#define RP_FULL_CHECKS_MAX 10000
#define RP_PASS_STRIPE_ROWS 8192
#define RP_PASS_STATE_PROBE 8192
#define RP_PENDING_14_HEAD \
	"WITH f AS (SELECT r.activity_id AS id FROM redpacket.reconcile_state r" \
	"            WHERE $3 IS NOT NULL" \
	"              AND (r.last_full_check_at IS NULL OR r.last_full_check_at OPERATOR(pg_catalog.<) $3)" \
	"            ORDER BY r.last_full_check_at NULLS FIRST, r.activity_id" \
	"            LIMIT (SELECT LEAST(pg_catalog.ceil(" \
	"                            (CASE WHEN c.reltuples OPERATOR(pg_catalog.>=) 0 THEN c.reltuples::pg_catalog.numeric" \
	"                                  ELSE (SELECT pg_catalog.count(*) FROM redpacket.reconcile_state)::pg_catalog.numeric" \
	"                             END) OPERATOR(pg_catalog.*) $4), " CppAsString2(RP_FULL_CHECKS_MAX) ")::pg_catalog.int8" \
	"                     FROM pg_catalog.pg_class c" \
	"                    WHERE c.oid OPERATOR(pg_catalog.=) 'redpacket.reconcile_state'::pg_catalog.regclass))," \
	"     q AS (SELECT r.activity_id, r.last_pass_at, r.last_claim_id, r.last_entry_id," \
	"                  r.last_settlement_id, r.last_balance, r.last_packets, r.last_claims" \
	"             FROM redpacket.reconcile_state r WHERE NOT r.settled" \
	"           UNION ALL" \
	"           SELECT r.activity_id, r.last_pass_at, r.last_claim_id, r.last_entry_id," \
	"                  r.last_settlement_id, r.last_balance, r.last_packets, r.last_claims" \
	"             FROM f CROSS JOIN LATERAL (" \
	"                  SELECT x.* FROM redpacket.reconcile_state x" \
	"                   WHERE x.activity_id OPERATOR(pg_catalog.=) f.id AND x.settled OFFSET 0) r" \
	"           UNION ALL" \
	"           SELECT y.id, NULL, 0, 0, 0, NULL, NULL, NULL FROM redpacket.activity y" \
	"            WHERE y.id OPERATOR(pg_catalog.>) $6 AND y.id OPERATOR(pg_catalog.<=) $7" \
	"              AND NOT EXISTS (SELECT FROM redpacket.reconcile_state x" \
	"                               WHERE x.activity_id OPERATOR(pg_catalog.=) y.id))," \
	"     p AS (SELECT q.*, COALESCE(a.stripes, 0) AS stripes, a.closed_at, a.ends_at," \
	"                  a.stripes IS NULL AS gone FROM q" \
	"            LEFT JOIN LATERAL (SELECT x.stripes, x.closed_at, x.ends_at FROM redpacket.activity x" \
	"                                WHERE x.id OPERATOR(pg_catalog.=) q.activity_id OFFSET 0) a ON true)," \
	"     m AS (SELECT GREATEST(pg_catalog.ceil(pg_catalog.sum(p.stripes)::pg_catalog.numeric" \
	"                           OPERATOR(pg_catalog./) " CppAsString2(RP_PASS_STRIPE_ROWS) "), 1)::pg_catalog.int8 AS slices" \
	"             FROM p)" \
	" SELECT p.activity_id, p.stripes, f.id IS NOT NULL" \
	"   FROM p CROSS JOIN m" \
	"   LEFT JOIN f ON f.id OPERATOR(pg_catalog.=) p.activity_id" \
	"  WHERE f.id IS NOT NULL OR p.last_pass_at IS NULL OR p.gone" \
	"     OR p.closed_at IS NOT NULL OR p.ends_at OPERATOR(pg_catalog.<=) $2" \
	"     OR EXISTS (SELECT FROM redpacket.claim c" \
	"                 WHERE c.activity_id OPERATOR(pg_catalog.=) p.activity_id" \
	"                   AND c.claim_id OPERATOR(pg_catalog.>) p.last_claim_id)" \
	"     OR EXISTS (SELECT FROM redpacket.ledger l" \
	"                 WHERE l.activity_id OPERATOR(pg_catalog.=) p.activity_id" \
	"                   AND l.entry_id OPERATOR(pg_catalog.>) p.last_entry_id)"
#define RP_PENDING_14_REVERSALS \
	"     OR EXISTS (SELECT FROM redpacket.claim_settlement v" \
	"                 WHERE v.activity_id OPERATOR(pg_catalog.=) p.activity_id" \
	"                   AND v.state OPERATOR(pg_catalog.=) 'reversed'" \
	"                   AND v.settlement_id OPERATOR(pg_catalog.>) p.last_settlement_id)"
#define RP_PENDING_14_STRIPES \
	"     OR ((p.activity_id OPERATOR(pg_catalog.%) m.slices)" \
	"           OPERATOR(pg_catalog.=) ($5 OPERATOR(pg_catalog.%) m.slices)" \
	"         AND EXISTS (SELECT FROM (SELECT pg_catalog.sum(st.balance) AS balance," \
	"                                         pg_catalog.sum(st.packets) AS packets," \
	"                                         pg_catalog.sum(st.claims)::pg_catalog.int8 AS claims" \
	"                                    FROM redpacket.stripe st" \
	"                                   WHERE st.activity_id OPERATOR(pg_catalog.=) p.activity_id) s" \
	"                      WHERE (s.balance, s.packets, s.claims)" \
	"                            IS DISTINCT FROM (p.last_balance, p.last_packets, p.last_claims)))" \
	" ORDER BY p.activity_id"
#define RP_PENDING_14_ARGS 7, {BOOLOID, TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID, INT8OID, \
	INT8OID, INT8OID}

static RpPlan pending_14 = {
	RP_PENDING_14_HEAD RP_PENDING_14_STRIPES, RP_PENDING_14_ARGS
};

static RpPlan pending_14s = {
	RP_PENDING_14_HEAD RP_PENDING_14_REVERSALS RP_PENDING_14_STRIPES, RP_PENDING_14_ARGS
};

/*
 * Every activity a full check of everything sees: those of the activity
 * table and any other that still has money or rows (its funding entry,
 * stripes or state), so that an activity row deleted behind the
 * extension's back is reported (incomplete) instead of leaving its money
 * out of every check.
 */
#define RP_ALL_ACTIVITIES \
	"SELECT DISTINCT x.id FROM (" \
	"  SELECT y.id FROM redpacket.activity y" \
	"  UNION ALL SELECT l.activity_id FROM redpacket.ledger l" \
	"             WHERE l.kind OPERATOR(pg_catalog.=) 'fund'" \
	"  UNION ALL SELECT r.activity_id FROM redpacket.reconcile_state r" \
	"  UNION ALL SELECT s.activity_id FROM redpacket.stripe s) x"

static RpPlan pending_all = {
	"SELECT x.id, COALESCE(a.stripes, 0), true FROM (" RP_ALL_ACTIVITIES ") x"
	"  LEFT JOIN redpacket.activity a ON a.id OPERATOR(pg_catalog.=) x.id"
	" ORDER BY x.id", 0, {InvalidOid}
};

static RpPlan freeze = {
	"UPDATE redpacket.activity"
	"   SET frozen_reason = $2, frozen_at = $3"
	" WHERE id OPERATOR(pg_catalog.=) $1 AND frozen_reason IS NULL",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

#define RP_PASS_STATUS \
	"UPDATE redpacket.reconciler" \
	"   SET last_pass_started_at = $1, last_pass_finished_at = $2," \
	"       last_pass_ms = $3, activities_checked = $4, failures = $5"

static RpPlan pass_status_11 = {
	RP_PASS_STATUS,
	5, {TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID, INT4OID, INT4OID}
};

/*
 * 1.4: the counters (the passes over all, then what every pass checked,
 * also of one activity: $6 checks, $7 mismatches, $8 unchecked told, $9
 * settlements) and what the last pass over all found ($10, $11); 1.5
 * also where the next one probes for lost state rows ($12).
 */
#define RP_PASS_COUNTERS \
	"       checks = checks OPERATOR(pg_catalog.+) $6," \
	"       mismatches = mismatches OPERATOR(pg_catalog.+) $7," \
	"       unchecked = unchecked OPERATOR(pg_catalog.+) $8," \
	"       settlements = settlements OPERATOR(pg_catalog.+) $9"
#define RP_PASS_ARGS_14 \
	12, {TIMESTAMPTZOID, TIMESTAMPTZOID, NUMERICOID, INT4OID, INT4OID, INT8OID, INT8OID, \
	INT8OID, INT8OID, INT4OID, INT4OID, INT8OID}

#define RP_PASS_STATUS_14 \
	RP_PASS_STATUS ", passes = passes OPERATOR(pg_catalog.+) 1," \
	RP_PASS_COUNTERS ", last_pass_mismatches = $10, last_pass_unchecked = $11"

static RpPlan pass_status_14 = {RP_PASS_STATUS_14, RP_PASS_ARGS_14};
static RpPlan pass_status_15 = {
	RP_PASS_STATUS_14 ", probed_through = $12", RP_PASS_ARGS_14
};

static RpPlan pass_counts_14 = {
	"UPDATE redpacket.reconciler SET"
	RP_PASS_COUNTERS,
	RP_PASS_ARGS_14
};

static RpPlan any_problems = {
	"SELECT EXISTS (SELECT 1 FROM redpacket.reconcile_problem)", 0, {InvalidOid}
};

/*
 * Activities checked together: their stripe locks are taken together, and
 * one subtransaction looks, settles, checks and records all of them.  A
 * batch holds at most RP_PASS_LOCK_BUDGET stripe locks and
 * RP_PASS_BATCH_MAX activities.  A pass starts with batches of one and
 * doubles them while a batch takes less than RP_PASS_BATCH_MS (halving them
 * when one takes more than twice that), so that the worker still gives way
 * between two batches soon, even where a trigger or a lock makes each
 * activity slow (DROP DATABASE waits only 5 s for it).
 */
#define RP_PASS_BATCH_MAX 256
#define RP_PASS_BATCH_MS 100

/* Activities whose failed check a pass names (rp_reconcile_strict's message). */
#define RP_PASS_FAILED_MAX 100

/* A pass over a list of activities. */
struct RpPass
{
	MemoryContext cxt;			/* where the pass and its list live */
	bool		verify;			/* read only: no lock, nothing written */
	bool		one;			/* an explicit check of one named activity */
	bool		repair;			/* an explicit full check of one activity */
	int			kept_locks;		/* stripe locks this pass keeps until the transaction ends */
	int			checked;		/* activities looked at */
	int			failures;		/* ... not ok: mismatches + unchecked */
	int			mismatches;		/* ... checked and wrong */
	int			unchecked;		/* ... could not be checked (error, incomplete) */
	int			told_unchecked; /* ... of which told people (incomplete: once per change) */
	int			settlements;
	bool		problems;		/* reconcile_problem may have rows */
	int64		probe_next;		/* reconciler.probed_through after a pass over all */
	int64		failed_ids[RP_PASS_FAILED_MAX]; /* the first mismatches and unchecked */
	int			nfailed;
	Tuplestorestate *out;
	TupleDesc	outdesc;
	TimestampTz started;
	int64	   *ids;			/* the listed activities (RpPassList) */
	int		   *stripes;
	bool	   *full;
	int			n;
	int			next;
	int			batch;			/* activities in the next batch */
	int64	   *busy;			/* activities a batch found busy, checked one by one */
	int		   *busy_stripes;
	bool	   *busy_full;
	int			nbusy;
	int			batches;		/* batches checked, and ... */
	int			alone;			/* ... activities checked on their own */
	long		list_ms;		/* time spent listing */
	long		batch_ms;		/* ... and in the batches' statements */
};

/* The activities of one unit of work, in one subtransaction. */
typedef struct RpUnit
{
	RpPass	   *pass;
	int			n;
	RpCheck    *checks;			/* activity and full set by the caller */
	RpLook	   *looks;
	bool		wait;			/* a unit of one that takes its stripes, waiting */
	int			stripes;		/* ... that many */
} RpUnit;

/*
 * A failed check freezes the activity when redpacket.freeze_on_mismatch is
 * on (claims answer frozen until an operator calls rp_unfreeze).  Sets
 * c->froze when this check froze it, c->frozen when it is frozen now.
 */
static void
FreezeOnMismatch(RpCheck *c, bool was_frozen)
{
	c->frozen = was_frozen;
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
		{
			RpSyncHalt(c->activity);
			RpRecordChange(c->activity, "freeze", "{\"frozen_reason\": null}",
						   psprintf("{\"frozen_reason\": \"reconciliation mismatch at pass " INT64_FORMAT "\"}",
									c->pass_id),
						   "reconciliation mismatch");
		}
	}
	c->frozen = was_frozen || c->froze;
}

/*
 * The work of a unit, in its subtransaction: (for a unit that waits) hold
 * the activity as a walker does (locks.c), look at each activity, settle those whose time is up
 * (exactly once: see settle.c), check and record the complete ones, freeze
 * those that failed.  Nothing is written for an incomplete activity.
 */
static void
UnitStep(void *arg)
{
	RpUnit	   *u = arg;
	RpPass	   *pass = u->pass;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int64	   *ids = palloc(sizeof(int64) * u->n);
	int64	   *due = palloc(sizeof(int64) * u->n);
	RpCheck   **todo = palloc(sizeof(RpCheck *) * u->n);
	RpCheck    *run;
	int			ndue = 0;
	int			ntodo = 0;

	if (u->wait)
	{
		RpActivity	act = {.id = u->checks[0].activity,.stripes = u->stripes};

		Assert(u->n == 1);
		RpWalk(&act);
	}
	for (int i = 0; i < u->n; i++)
		ids[i] = u->checks[i].activity;
	RpCheckLook(ids, u->n, now, pass->verify, u->looks);
	for (int i = 0; i < u->n; i++)
	{
		RpLook	   *l = &u->looks[i];
		RpCheck    *c = &u->checks[i];

		c->checked_at = GetCurrentTimestamp();
		if (!l->exists)
			continue;
		if (l->no_state && pass->repair && c->full && !pass->verify)
		{
			RpCheckRecreateState(c->activity);
			l->incomplete = NULL;
		}
		if (l->incomplete != NULL)
		{
			c->failed[RP_PROBLEM_INCOMPLETE] = true;
			c->detail = l->incomplete;
			c->frozen = l->frozen;
			continue;
		}
		/* books known wrong are not settled: repaired and unfrozen first */
		if (l->due && !l->failing && !pass->verify)
		{
			c->settled = true;
			due[ndue++] = c->activity;
		}
		todo[ntodo++] = c;
	}
	RpSettleMany(due, ndue, now, "expired", RpCatalogVersion() >= RP_CATALOG_1_4, NULL);

	/* the checks, in one statement; their results copied back */
	run = palloc0(sizeof(RpCheck) * Max(ntodo, 1));
	for (int i = 0; i < ntodo; i++)
		run[i] = *todo[i];
	RpCheckRun(run, ntodo, GetCurrentTimestamp(), !pass->verify, pass->out ? pass->outdesc : NULL);
	for (int i = 0; i < ntodo; i++)
	{
		*todo[i] = run[i];
		if (!todo[i]->ok && !pass->verify)
		{
			bool		was_frozen = false;

			for (int k = 0; k < u->n; k++)
				if (u->looks[k].activity == todo[i]->activity)
					was_frozen = u->looks[k].frozen;
			FreezeOnMismatch(todo[i], was_frozen);
		}
		else
			todo[i]->frozen = false;
	}
	/* a unit that took its locks gives back what it need not keep */
	if (u->wait && !(u->checks[0].settled || u->checks[0].froze))
	{
		RpActivity	act = {.id = u->checks[0].activity,.stripes = u->stripes};

		RpWalkEnd(&act);
	}
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

static void
RecordErrorStep(void *arg)
{
	RpUnit	   *u = arg;

	if (RpCatalogVersion() >= RP_CATALOG_1_1)
		RpCheckRecordError(&u->checks[0], u->pass->out ? u->pass->outdesc : NULL);
}

/*
 * What a unit found, for people and for the pass: alerts (the freezes are
 * done), the result rows, the counts.
 */
/* What a unit has to tell people, told in a subtransaction of its own. */
typedef struct RpTell
{
	RpCheck   **incomplete;
	int			nincomplete;
	int64	   *complete;
	int			ncomplete;
	int			told;
} RpTell;

static void
TellStep(void *arg)
{
	RpTell	   *t = arg;

	t->told = RpAlertIncomplete(t->incomplete, t->nincomplete);
	RpAlertComplete(t->complete, t->ncomplete);
}

static void
UnitReport(RpUnit *u)
{
	RpPass	   *pass = u->pass;
	int64	   *closed = palloc(sizeof(int64) * Max(u->n, 1));
	int			nclosed = 0;
	RpTell		tell = {0};
	ErrorData  *err;

	tell.incomplete = palloc(sizeof(RpCheck *) * Max(u->n, 1));
	tell.complete = palloc(sizeof(int64) * Max(u->n, 1));
	for (int i = 0; i < u->n; i++)
	{
		RpCheck    *c = &u->checks[i];

		if (!u->looks[i].exists)
		{
			elog(DEBUG1, "activity " INT64_FORMAT " disappeared before its check", c->activity);
			continue;
		}
		pass->checked++;
		if (c->settled)
			pass->settlements++;
		if (c->closed && c->recorded)
			closed[nclosed++] = c->activity;
		if (RpCheckMeasured(c))
			tell.complete[tell.ncomplete++] = c->activity;
		if (!c->ok)
		{
			pass->failures++;
			if (pass->nfailed < RP_PASS_FAILED_MAX)
				pass->failed_ids[pass->nfailed++] = c->activity;
			if (RpCheckMeasured(c))
				pass->mismatches++;
			else
				pass->unchecked++;
			if (pass->verify)
				;				/* a verification only returns its rows */
			else if (c->failed[RP_PROBLEM_INCOMPLETE])
				tell.incomplete[tell.nincomplete++] = c;
			else if (RpCheckMeasured(c) && u->looks[i].failing && !c->froze)
				;				/* the same incident: it was told when it began */
			else
			{
				RpAlert(c);
				pass->told_unchecked += !RpCheckMeasured(c);
			}
		}
		if (pass->out)
		{
			if (c->row == NULL && RpCatalogVersion() >= RP_CATALOG_1_1)
				c->row = RpCheckUnrecordedRow(c, pass->outdesc);
			if (c->row != NULL)
				tuplestore_puttuple(pass->out, c->row);
		}
	}
	if (pass->verify)
		return;
	/* incomplete ones are told once per change; those seen whole again are cleared */
	if (!pass->problems)
		tell.ncomplete = 0;
	if (tell.nincomplete > 0 || tell.ncomplete > 0)
	{
		err = InSubtransaction(TellStep, &tell);
		if (err != NULL)
			ereport(WARNING,
					(errcode(err->sqlerrcode),
					 errmsg("could not note the incomplete activities of a reconciliation pass: %s",
							err->message)));
		pass->told_unchecked += tell.told;
		pass->problems = pass->problems || tell.told > 0;
	}
	/* a settled activity's counters leave shared memory */
	RpStatsFold(closed, nclosed);
}

/*
 * A unit of one activity whose check raised an error: it is recorded as a
 * failed check with its message (in a subtransaction of its own) and
 * announced; it freezes nothing and is checked again next pass.
 */
static void
UnitFailed(RpUnit *u, ErrorData *err)
{
	RpCheck    *c = &u->checks[0];

	memset(c->failed, 0, sizeof(c->failed));
	c->failed[RP_PROBLEM_ERROR] = true;
	c->ok = c->froze = c->recorded = false;
	c->row = NULL;
	c->detail = err->message;
	c->frozen = u->looks[0].frozen;
	c->checked_at = GetCurrentTimestamp();
	u->looks[0].exists = true;
	if (!u->pass->verify)
	{
		err = InSubtransaction(RecordErrorStep, u);
		if (err != NULL)
			ereport(WARNING,
					(errcode(err->sqlerrcode),
					 errmsg("could not record the failed check of activity " INT64_FORMAT ": %s",
							c->activity, err->message)));
	}
}

static RpUnit *
NewUnit(RpPass *pass, int n)
{
	RpUnit	   *u = palloc0(sizeof(RpUnit));

	u->pass = pass;
	u->n = n;
	u->checks = palloc0(sizeof(RpCheck) * Max(n, 1));
	u->looks = palloc0(sizeof(RpLook) * Max(n, 1));
	return u;
}

/*
 * The locks the unit keeps to the end of the transaction (those of what it
 * settled or froze, which claims read: held, so that a later call of the
 * transaction on the activity is an earlier one), giving back the
 * others (stripes[i] of activity i: a batch's, taken at this level; a unit
 * that waited gives its own back inside its subtransaction, in UnitStep).
 * Returns how many stripe locks it keeps.
 */
static int
UnitKeep(RpUnit *u, const int *stripes)
{
	int			kept = 0;

	for (int i = 0; i < u->n; i++)
	{
		RpCheck    *c = &u->checks[i];
		RpActivity	act = {.id = c->activity,.stripes = u->wait ? u->stripes : stripes[i]};
		bool		keep = u->looks[i].exists && (c->settled || c->froze);

		if (keep)
			kept += act.stripes;
		else if (!u->wait)
			RpWalkEnd(&act);
	}
	return kept;
}

/*
 * Check one activity in a subtransaction of its own, waiting for its
 * stripes (unless the caller holds them: held_stripes > 0).  Returns false
 * when the activity no longer exists; an explicit check of an unknown
 * activity is an error.
 */
static bool
CheckOne(RpPass *pass, int64 activity, bool full, int held_stripes)
{
	RpUnit	   *u = NewUnit(pass, 1);
	ErrorData  *err;
	bool		exists;

	pass->alone++;
	u->checks[0].activity = activity;
	u->checks[0].full = full;
	if (held_stripes == 0)
	{
		RpActivity	act;

		if (!RpFetchActivity(activity, &act, !pass->one))
			return false;
		u->wait = !pass->verify;
		u->stripes = u->wait ? act.stripes : 0;
	}
	err = InSubtransaction(UnitStep, u);
	if (err != NULL)
	{
		UnitFailed(u, err);
		/* its locks went with the subtransaction, or the caller still holds them */
		if (held_stripes > 0)
		{
			RpActivity	act = {.id = activity,.stripes = held_stripes};

			RpWalkEnd(&act);
		}
	}
	else if (!pass->verify)
		pass->kept_locks += UnitKeep(u, &held_stripes);
	exists = u->looks[0].exists;
	UnitReport(u);
	return exists;
}

/* The size of the next batch, after one of n activities took ms. */
static void
AdaptBatch(RpPass *pass, int n, long ms)
{
	if (RpDistributed())
		pass->batch = 1;		/* on Citus each statement is routed for one activity */
	else if (ms > 2 * RP_PASS_BATCH_MS)
		pass->batch = Max(pass->batch / 2, 1);
	else if (ms < RP_PASS_BATCH_MS && n >= pass->batch)
		pass->batch = Min(pass->batch * 2, RP_PASS_BATCH_MAX);
}

/*
 * Check the activities from index from of the list, as many as fit in a
 * batch, taking their stripe locks without waiting: one statement looks at,
 * settles and checks all of them.  An activity whose stripes are busy (a
 * claim in flight) is left to CheckOne, which waits; when the batch's
 * statements fail, each activity of it is checked on its own, so an error
 * is the error of one activity.  Returns the index after the batch.
 */
static int
CheckBatch(RpPass *pass, int from, int budget)
{
	int			n = 0;
	int			locks = 0;
	int			end;
	RpUnit	   *u;
	int		   *stripes;
	ErrorData  *err;
	TimestampTz started;

	for (end = from; end < pass->n && n < pass->batch; end++)
	{
		if (n > 0 && locks + pass->stripes[end] > budget)
			break;
		locks += pass->stripes[end];
		n++;
	}
	u = NewUnit(pass, n);
	stripes = palloc(sizeof(int) * Max(n, 1));
	n = 0;
	for (int i = from; i < end; i++)
	{
		int			busy;
		RpActivity	act = {.id = pass->ids[i],.stripes = pass->stripes[i]};

		/* on a Citus cluster each node checks the activities it holds */
		if (!RpActivityIsLocal(act.id))
			continue;
		if (!pass->verify && !RpWalkTry(&act, &busy))
		{
			pass->busy[pass->nbusy] = act.id;
			pass->busy_stripes[pass->nbusy] = act.stripes;
			pass->busy_full[pass->nbusy++] = pass->full[i];
			continue;
		}
		u->checks[n].activity = act.id;
		u->checks[n].full = pass->full[i];
		stripes[n++] = act.stripes;
	}
	u->n = n;
	if (n == 0)
		return end;

	started = GetCurrentTimestamp();
	err = InSubtransaction(UnitStep, u);
	pass->batches++;
	pass->batch_ms += TimestampDifferenceMilliseconds(started, GetCurrentTimestamp());
	AdaptBatch(pass, end - from, TimestampDifferenceMilliseconds(started, GetCurrentTimestamp()));
	if (err == NULL)
	{
		if (!pass->verify)
			pass->kept_locks += UnitKeep(u, stripes);
		UnitReport(u);
		return end;
	}
	/* one by one, with the locks this level holds */
	elog(DEBUG1, "redpacket reconciliation checks %d activities one by one: %s", n, err->message);
	FreeErrorData(err);
	for (int i = 0; i < n; i++)
		(void) CheckOne(pass, u->checks[i].activity, u->checks[i].full,
						pass->verify ? 0 : stripes[i]);
	return end;
}

/* 1.4 keeps no probe position: each pass probes from the start */
static RpPlan passes_so_far_14 = {
	"SELECT r.passes, 0::pg_catalog.int8 FROM redpacket.reconciler r", 0, {InvalidOid}
};
static RpPlan passes_so_far_15 = {
	"SELECT r.passes, r.probed_through FROM redpacket.reconciler r", 0, {InvalidOid}
};

/* The end of the window of $2 activity ids after $1 (NULL: none after it). */
static RpPlan id_window = {
	"SELECT pg_catalog.max(w.id), pg_catalog.count(*) FROM (SELECT y.id FROM redpacket.activity y"
	"  WHERE y.id OPERATOR(pg_catalog.>) $1 ORDER BY y.id LIMIT $2) w",
	2, {INT8OID, INT4OID}
};

int64
RpActivityWindow(int64 *from, int size, int64 *to)
{
	Datum		v[2];
	int64		seen;

	v[1] = Int32GetDatum(size);
	for (;;)
	{
		v[0] = Int64GetDatum(*from);
		if (RpExec(&id_window, v, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not read a window of activity ids");
		*to = RpGetInt64(0, 1, *from);
		seen = RpGetInt64(0, 2, 0);
		if (seen > 0 || *from == 0)
			break;
		*from = 0;				/* past the last: from the start */
	}
	return seen < size ? 0 : *to;
}

/* Has the reconciler told of problems it still sees (1.4)? */
static bool
AnyProblems(void)
{
	bool		isnull;

	if (RpExec(&any_problems, NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the reconciler's problems");
	return DatumGetBool(RpGetDatum(0, 1, &isnull));
}

/*
 * Passes over all recorded so far (1.4), which picks a pass's slice, and
 * the window of activity ids it probes for a lost state row: after *from,
 * up to *to (the next RP_PASS_STATE_PROBE activities, from the start again
 * after the last); *next is where the following pass starts.
 */
static int64
PassesSoFar(int64 *from, int64 *to, int64 *next)
{
	int64		passes;

	if (RpExec(RpCatalogVersion() >= RP_CATALOG_1_5 ? &passes_so_far_15 : &passes_so_far_14,
			   NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the reconciler's status");
	passes = SPI_processed == 1 ? RpGetInt64(0, 1, 0) : 0;
	*from = SPI_processed == 1 ? RpGetInt64(0, 2, 0) : 0;
	*next = RpActivityWindow(from, RP_PASS_STATE_PROBE, to);
	return passes;
}

/*
 * List the activities a pass over all visits, with their stripe counts
 * and whether each gets a full check, into the pass (allocated in its
 * context: SPI calls leave CurrentMemoryContext at SPI's).  full_before (0:
 * none) and full_share are the automatic full checks of 1.1.  Returns how
 * many.
 */
int
RpPassList(RpPass *pass, bool full_all, TimestampTz full_before, Datum full_share)
{
	MemoryContext cxt = pass->cxt;
	Datum		v[7];
	char		n[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int64		from = 0;
	int64		to = 0;
	int			version = RpCatalogVersion();
	RpPlan	   *plan;
	int			count;
	TimestampTz started = GetCurrentTimestamp();

	/*
	 * Decide how to list only once the tables cannot change under the
	 * listing, and with a snapshot taken after that: rp_distribute()
	 * converts them holding an exclusive lock, and a pass that waited for
	 * it must see them distributed (RpDistributed()) as Citus's planner
	 * will.
	 */
	(void) RangeVarGetRelid(makeRangeVar("redpacket", "activity", -1), AccessShareLock, false);
	PushActiveSnapshot(GetTransactionSnapshot());
	v[4] = Int64GetDatum(version >= RP_CATALOG_1_4 ? PassesSoFar(&from, &to, &pass->probe_next) : 0);
	v[5] = Int64GetDatum(from);
	v[6] = Int64GetDatum(to);
	pass->problems = version >= RP_CATALOG_1_4 && AnyProblems();
	v[0] = BoolGetDatum(full_all);
	v[1] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	v[2] = TimestampTzGetDatum(full_before);
	n[2] = full_before == 0 ? 'n' : ' ';
	v[3] = full_before == 0 ? NumericGetDatum(int64_to_numeric(0)) : full_share;
	if (version >= RP_CATALOG_1_4 && !RpDistributed())
		plan = full_all ? &pending_all
			: RpSettlementsExist() ? &pending_14s : &pending_14;
	else						/* Citus pushes these down to every node */
		plan = version >= RP_CATALOG_1_1 ? &pending_11 : &pending_10;
	if (plan == &pending_14 || plan == &pending_14s)
	{
		/*
		 * The candidates come from the partial index of the activities not
		 * settled yet, whatever the statistics say: their estimate lags
		 * behind a table whose rows leave that index by the thousand a
		 * minute, and a scan of reconcile_state would cost a pass the whole
		 * history of activities.
		 */
		int			level = NewGUCNestLevel();

		(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		if (RpExec(plan, v, n, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not list activities to reconcile");
		AtEOXact_GUC(true, level);
	}
	else if (RpExec(plan, v, n, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list activities to reconcile");
	PopActiveSnapshot();
	count = (int) SPI_processed;
	pass->ids = MemoryContextAlloc(cxt, sizeof(int64) * Max(count, 1));
	pass->stripes = MemoryContextAlloc(cxt, sizeof(int) * Max(count, 1));
	pass->full = MemoryContextAlloc(cxt, sizeof(bool) * Max(count, 1));
	pass->busy = MemoryContextAlloc(cxt, sizeof(int64) * Max(count, 1));
	pass->busy_stripes = MemoryContextAlloc(cxt, sizeof(int) * Max(count, 1));
	pass->busy_full = MemoryContextAlloc(cxt, sizeof(bool) * Max(count, 1));
	for (int i = 0; i < count; i++)
	{
		bool		isnull;

		pass->ids[i] = RpGetInt64(i, PENDING_ID, 0);
		pass->stripes[i] = DatumGetInt32(RpGetDatum(i, PENDING_STRIPES, &isnull));
		pass->full[i] = DatumGetBool(RpGetDatum(i, PENDING_FULL, &isnull));
	}
	pass->n = count;
	pass->next = 0;
	pass->nbusy = 0;
	pass->list_ms += TimestampDifferenceMilliseconds(started, GetCurrentTimestamp());
	return count;
}

/*
 * Record a pass in the reconciler's status row (1.1): after a pass over
 * all, its start, end and findings; after the check of one activity (over
 * false), only the counters (1.4).
 */
static void
RecordPass(const RpPass *pass, bool over)
{
	TimestampTz finished = GetCurrentTimestamp();
	Datum		v[12];
	int			version = RpCatalogVersion();

	if (version < RP_CATALOG_1_1 || (!over && version < RP_CATALOG_1_4))
		return;
	v[0] = TimestampTzGetDatum(pass->started);
	v[1] = TimestampTzGetDatum(finished);
	v[2] = NumericGetDatum(RpUnitsToAmount(finished - pass->started, 3));	/* us as ms */
	v[3] = Int32GetDatum(pass->checked);
	v[4] = Int32GetDatum(pass->failures);
	v[5] = Int64GetDatum(pass->checked - pass->unchecked);
	v[6] = Int64GetDatum(pass->mismatches);
	v[7] = Int64GetDatum(pass->told_unchecked);
	v[8] = Int64GetDatum(pass->settlements);
	v[9] = Int32GetDatum(pass->mismatches);
	v[10] = Int32GetDatum(pass->unchecked);
	v[11] = Int64GetDatum(pass->probe_next);
	if (RpExec(version < RP_CATALOG_1_4 ? &pass_status_11 : !over ? &pass_counts_14
			   : version < RP_CATALOG_1_5 ? &pass_status_14 : &pass_status_15,
			   v, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not record the reconciliation pass");
}

/* After a pass over all: its record in the reconciler's status row. */
void
RpPassRecord(const RpPass *pass)
{
	RecordPass(pass, true);
	RpUncreditedLook();
	if (pass->checked > 0)
		elog(DEBUG1, "redpacket reconciliation pass: %d activities (%d settled) in %d batches and %d alone, %ld ms (listing %ld ms, batches %ld ms)",
			 pass->checked, pass->settlements, pass->batches, pass->alone,
			 (long) TimestampDifferenceMilliseconds(pass->started, GetCurrentTimestamp()),
			 pass->list_ms, pass->batch_ms);
}

/* A pass, allocated in cxt; its list and counts live there too. */
RpPass *
RpPassCreate(MemoryContext cxt)
{
	RpPass	   *pass = MemoryContextAllocZero(cxt, sizeof(RpPass));

	pass->cxt = cxt;
	pass->started = GetCurrentTimestamp();
	pass->batch = 1;
	return pass;
}

/*
 * The worker's step, in a transaction of its own (whose commit releases
 * what it kept): the next batch of the list, or one activity a batch found
 * busy.  Returns whether work is left for further steps.  Must be called
 * inside SPI_connect.
 */
bool
RpPassStep(RpPass *pass)
{
	if (pass->nbusy > 0)
	{
		pass->nbusy--;
		(void) CheckOne(pass, pass->busy[pass->nbusy], pass->busy_full[pass->nbusy], 0);
	}
	else if (pass->next < pass->n)
		pass->next = CheckBatch(pass, pass->next, RP_PASS_LOCK_BUDGET);
	pass->kept_locks = 0;		/* the commit releases them */
	return pass->nbusy > 0 || pass->next < pass->n;
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
 * The pass over all pending activities past after (0: all), in the caller's
 * transaction, as far as RP_PASS_LOCK_BUDGET allows: returns how many of
 * the listed activities it left for the next pass, and in *last the id of
 * the last activity it reached.
 */
static int
PassInCallerXact(RpPass *pass, bool full_check, int64 after, int64 *last)
{
	int			n = RpPassList(pass, full_check, 0, (Datum) 0);

	while (pass->next < n && pass->ids[pass->next] <= after)
		pass->next++;
	*last = after;
	while (pass->next < n || pass->nbusy > 0)
	{
		int			room = RP_PASS_LOCK_BUDGET - kept_in_xact;

		pass->kept_locks = 0;
		if (pass->nbusy > 0)
		{
			/* one alone is always allowed; after others, only within the budget */
			pass->nbusy--;
			if (kept_in_xact > 0 && pass->busy_stripes[pass->nbusy] > room)
			{
				pass->nbusy++;
				break;
			}
			(void) CheckOne(pass, pass->busy[pass->nbusy], pass->busy_full[pass->nbusy], 0);
		}
		else
		{
			if (kept_in_xact > 0 && pass->stripes[pass->next] > room)
				break;
			pass->next = CheckBatch(pass, pass->next, Max(room, pass->stripes[pass->next]));
			*last = pass->ids[pass->next - 1];
		}
		kept_in_xact += pass->kept_locks;
	}
	/* the busy ones left are below *last: the next call starts before them */
	for (int i = 0; i < pass->nbusy; i++)
		*last = Min(*last, pass->busy[i] - 1);
	RpPassRecord(pass);
	return n - pass->next + pass->nbusy;
}

/* Count this transaction's kept stripe locks from here (a new transaction: none). */
static void
KeptInThisXact(void)
{
	if (kept_lxid != RpMyLocalXid)
	{
		kept_lxid = RpMyLocalXid;
		kept_in_xact = 0;
	}
}

static void WaitForPassLock(int lock_wait_ms);

/*
 * One pass in the caller's transaction (rp_reconcile): over one activity,
 * or all pending ones when activity is NULL.  While another pass holds the
 * reconciliation lock it waits for it, lock_timeout at most (a minute when
 * that is 0), then fails with 55P03: a pass that checked nothing never
 * looks like one that found nothing wrong.  Returns the number of
 * activities checked, or -1 when a restore is running.  The stripe locks it keeps stay within
 * RP_PASS_LOCK_BUDGET; activities past it are left for the next pass.  Must
 * be called inside SPI_connect.
 */
static int
ReconcileInCallerXact(const int64 *activity, bool full_check, Tuplestorestate *out,
					  TupleDesc desc)
{
	RpPass	   *pass;
	int64		last;
	int			left;

	if (RpRestoring())
	{
		ereport(NOTICE,
				(errmsg("redpacket reconciliation skipped: a restore is in progress"),
				 errdetail("redpacket.restoring is on for this session or database."),
				 errhint("Run the pass after redpacket.rp_post_restore().")));
		return -1;
	}
	/* on a Citus cluster, refuse before any lock: see scaleout/scaleout.c */
	if (activity != NULL)
		RpRequireLocalActivity(*activity);
	WaitForPassLock(LockTimeout > 0 ? LockTimeout : RP_PASS_LOCK_WAIT_MS);

	pass = RpPassCreate(CurrentMemoryContext);
	pass->out = out;
	pass->outdesc = desc;
	KeptInThisXact();
	if (activity != NULL)
	{
		RequireLockBudget(*activity);
		pass->one = true;
		pass->repair = full_check;
		pass->problems = RpCatalogVersion() >= RP_CATALOG_1_4 && AnyProblems();
		(void) CheckOne(pass, *activity, full_check, 0);
		kept_in_xact += pass->kept_locks;
		RecordPass(pass, false);
		return pass->checked;
	}

	left = PassInCallerXact(pass, full_check, 0, &last);
	if (left > 0)
		ereport(NOTICE,
				(errmsg("redpacket reconciliation checked %d activities and left %d for the next pass",
						pass->checked, left),
				 errdetail("A transaction keeps the stripe locks of the activities its passes settled or froze until it ends, and stops at %d of them.",
						   RP_PASS_LOCK_BUDGET),
				 errhint("Call redpacket.rp_reconcile() again, each call in its own transaction.")));
	return pass->checked;
}

/* Take the reconciliation lock, waiting at most lock_wait_ms (in a subtransaction). */
typedef struct RpLockWait
{
	int			ms;
} RpLockWait;

static void
LockWaitStep(void *arg)
{
	RpLockWait *w = arg;
	int			level = NewGUCNestLevel();

	(void) set_config_option("lock_timeout", psprintf("%d", Max(w->ms, 1)), PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) RpLock(RP_LOCK_RECONCILE, 0, 0, true);
	AtEOXact_GUC(true, level);
}

/*
 * Wait for the reconciliation lock (another pass runs: the worker's, or a
 * scheduler's), queued like any lock, so the worker gives way at the end of
 * its step; fail with 55P03 when it is not granted within lock_wait_ms.
 */
static void
WaitForPassLock(int lock_wait_ms)
{
	RpLockWait	w = {lock_wait_ms};
	ErrorData  *err;

	if (RpLock(RP_LOCK_RECONCILE, 0, 0, false))
		return;
	err = InSubtransaction(LockWaitStep, &w);
	if (err == NULL)
		return;
	if (err->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("another redpacket reconciliation pass kept running for %d ms", lock_wait_ms),
				 errdetail("This pass waited that long for the reconciliation lock, and checked nothing."),
				 errhint("A long pass of the worker or of another scheduled job holds it; try again later, or wait longer.")));
	ReThrowError(err);
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

	RpUncreditedInit();
}

Datum
rp_reconcile(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		full_check;
	int64		one;
	int			level;

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
	level = RpPassSettings();
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
	AtEOXact_GUC(true, level);
	return (Datum) 0;
}

/*
 * One step of rp_reconcile_strict (the procedure commits between steps):
 * wait at most lock_wait for the reconciliation lock, then run the pass
 * over the pending activities past after_activity (NULL: from the first)
 * in this transaction, as far as the lock budget allows.  Returns what it
 * checked and found, the activities it named as failed, the last activity
 * it reached, and how many it left for the next step.  Refuses a restore
 * in progress (nothing can be checked) and, like rp_reconcile, a standby,
 * a read-only transaction or a transaction snapshot.
 */
Datum
rp_reconcile_step(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		v[6];
	bool		n[6] = {false, false, false, false, false, false};
	RpPass	   *pass;
	Interval   *wait;
	int64		wait_ms;
	int64		last = 0;
	int			left;
	Datum	   *failed;
	int			level;

	RpNoNull(PG_ARGISNULL(0), "full_check");
	RpNoNull(PG_ARGISNULL(1), "lock_wait");
	PreventCommandIfReadOnly("rp_reconcile_strict()");
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("rp_reconcile_strict must run in a READ COMMITTED transaction"),
				 errdetail("The pass reads each activity with a fresh snapshot after it has locked the activity's stripes.")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "rp_reconcile_step must return a record");
	wait = PG_GETARG_INTERVAL_P(1);
	wait_ms = (wait->time + (int64) (wait->day + wait->month * 30) * USECS_PER_DAY) / 1000;
	wait_ms = Min(Max(wait_ms, 0), INT_MAX);

	level = RpPassSettings();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (RpRestoring())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("redpacket reconciliation cannot run: a restore is in progress"),
				 errdetail("redpacket.restoring is on for this session or database."),
				 errhint("Run the pass after redpacket.rp_post_restore().")));
	WaitForPassLock((int) wait_ms);

	pass = RpPassCreate(CurrentMemoryContext);
	KeptInThisXact();
	left = PassInCallerXact(pass, PG_GETARG_BOOL(0), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2),
							&last);
	SPI_finish();
	AtEOXact_GUC(true, level);

	failed = palloc(sizeof(Datum) * Max(pass->nfailed, 1));
	for (int i = 0; i < pass->nfailed; i++)
		failed[i] = Int64GetDatum(pass->failed_ids[i]);
	v[0] = Int64GetDatum(pass->checked);
	v[1] = Int64GetDatum(pass->mismatches);
	v[2] = Int64GetDatum(pass->unchecked);
	v[3] = PointerGetDatum(construct_array(failed, pass->nfailed, INT8OID, sizeof(int64), true,
										   TYPALIGN_DOUBLE));
	v[4] = Int64GetDatum(last);
	v[5] = Int64GetDatum(left);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), v, n)));
}

/* Activities by id from $1 on, at most $2: the chunks a verification of all reads. */
static RpPlan verify_chunk = {
	"SELECT x.id, COALESCE(a.stripes, 0), $3 FROM (" RP_ALL_ACTIVITIES ") x"
	"  LEFT JOIN redpacket.activity a ON a.id OPERATOR(pg_catalog.=) x.id"
	" WHERE x.id OPERATOR(pg_catalog.>) $1 ORDER BY x.id LIMIT $2",
	3, {INT8OID, INT8OID, BOOLOID}
};

#define RP_VERIFY_CHUNK 4096

/*
 * rp_verify(activity, full_check): the checks of rp_reconcile, with the
 * same result rows (pass_id NULL), writing nothing and taking no lock: it
 * reads one snapshot of committed data (the caller's statement's), in
 * which every activity's books are consistent, so it runs in a read-only
 * transaction and on a standby.  Without an activity it checks every
 * activity, in chunks of RP_VERIFY_CHUNK by id.
 */
Datum
rp_verify(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	RpPass	   *pass;
	bool		full;
	int			level;

	RpNoNull(PG_ARGISNULL(1), "full_check");
	full = PG_GETARG_BOOL(1);
	InitMaterializedSRF(fcinfo, 0);
	level = RpPassSettings();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	pass = RpPassCreate(CurrentMemoryContext);
	pass->verify = true;
	pass->out = rsinfo->setResult;
	pass->outdesc = rsinfo->setDesc;
	if (!PG_ARGISNULL(0))
	{
		pass->one = true;
		RpRequireLocalActivity(PG_GETARG_INT64(0));
		(void) CheckOne(pass, PG_GETARG_INT64(0), full, 0);
	}
	else
	{
		int64		after = 0;

		for (;;)
		{
			Datum		v[3] = {Int64GetDatum(after), Int64GetDatum(RP_VERIFY_CHUNK), BoolGetDatum(full)};
			int			count;

			if (RpExec(&verify_chunk, v, NULL, true, 0) != SPI_OK_SELECT)
				elog(ERROR, "could not list activities to verify");
			count = (int) SPI_processed;
			if (count == 0)
				break;
			pass->ids = palloc(sizeof(int64) * count);
			pass->stripes = palloc(sizeof(int) * count);
			pass->full = palloc(sizeof(bool) * count);
			for (int i = 0; i < count; i++)
			{
				bool		isnull;

				pass->ids[i] = RpGetInt64(i, PENDING_ID, 0);
				pass->stripes[i] = DatumGetInt32(RpGetDatum(i, PENDING_STRIPES, &isnull));
				pass->full[i] = DatumGetBool(RpGetDatum(i, PENDING_FULL, &isnull));
			}
			pass->n = count;
			pass->next = 0;
			after = pass->ids[count - 1];
			while (pass->next < pass->n)
			{
				CHECK_FOR_INTERRUPTS();
				pass->next = CheckBatch(pass, pass->next, RP_PASS_LOCK_BUDGET);
			}
		}
	}
	SPI_finish();
	AtEOXact_GUC(true, level);
	return (Datum) 0;
}
