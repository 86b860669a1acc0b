/*
 * pending.c
 *		Finding the claims no one settled yet: rp_pending_credits, which a
 *		wallet consumer re-drives after it lost messages.  Its cost follows
 *		the pending claims, not the millions an activity may have settled
 *		before.
 *
 *		The frontier.  Per activity, settlement_state.settled_through is a
 *		claim id up to which every claim is settled except those listed in
 *		settlement_gap; the pending claims are the unsettled ones of that
 *		list and of the claims after it.  Advance reads the claims after it
 *		once: it moves to the last settled claim among them, lists the
 *		unsettled ones it passes (claims the wallet skipped) as gaps, and
 *		deletes the gaps settled since.  A consumer that credits in the order
 *		of the stream leaves few gaps, and the claims after the frontier are
 *		mostly the pending ones themselves.
 *
 *		The frontier may pass only claims that can no longer commit: a claim
 *		in flight already has its id but is invisible, and a frontier beyond
 *		it would hide it for good.  A claim draws its id under a stripe lock
 *		and keeps the lock to its commit (the reconciliation watermark relies
 *		on the same), so the claims visible after taking every stripe lock of
 *		the activity are all the claims with smaller ids there will ever be.
 *		Advance therefore passes claims only (a) of a settled activity (no
 *		claim can come any more), (b) up to the last claim it sees while it
 *		holds the activity for a moment as a walker does (locks.c), tried
 *		without waiting (it reads that claim's id and gives the locks back
 *		before its scan; it skips this part when a claim holds the
 *		activity), or (c) up to the
 *		reconciliation watermark (reconcile_state.last_claim_id, which a pass
 *		sets holding every stripe lock).  It never waits for a lock, and only
 *		one transaction advances an activity at a time (its settlement_state
 *		row, locked with SKIP LOCKED, which the first credit makes).  It runs
 *		only where it can write and sees the latest rows: not on a standby, in a
 *		read-only transaction, under REPEATABLE READ or during a restore.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "claim/claim.h"
#include "reconcile/reconcile.h"
#include "scaleout/scaleout.h"
#include "campaign.h"

PG_FUNCTION_INFO_V1(rp_pending_credits);
PG_FUNCTION_INFO_V1(rp_track_claims);

/*
 * Every statement below looks a settlement (or a gap's claim) up by its
 * whole key through a LATERAL subquery with LIMIT 1: an index probe per
 * row, whatever the estimates.  A plain join, planned when the tables were
 * small or from a generic plan, can pick an inner scan of every settlement
 * of the activity per claim (a nested loop with the key as a join filter),
 * which is quadratic in an activity's claims.
 */
#define RP_SETTLED_PROBE(act, claim) \
	"LEFT JOIN LATERAL (SELECT true AS found FROM redpacket.claim_settlement s" \
	"                    WHERE s.activity_id OPERATOR(pg_catalog.=) " act \
	"                      AND s.claim_id OPERATOR(pg_catalog.=) " claim \
	"                    LIMIT 1) s ON true"

/*
 * 1.6: the claims before settlement tracking began (settlement_start) are
 * behind every frontier: the frontier starts after them.
 */
#define RP_NO_START(act) "0::pg_catalog.int8"
#define RP_START(act) RP_UNTRACKED_THROUGH(act)

/*
 * The frontier, and whether advancing it could move it (a settlement after
 * it: max() is one descent of the index, where an EXISTS over the range may
 * be planned as a scan that reads every settlement when there is none) or
 * delete a gap.
 */
static RpPlan advance_due = {
	"SELECT COALESCE(f.settled_through, 0),"
	"       COALESCE((SELECT pg_catalog.max(s.claim_id) FROM redpacket.claim_settlement s"
	"                  WHERE s.activity_id OPERATOR(pg_catalog.=) $1)"
	"                OPERATOR(pg_catalog.>) COALESCE(f.settled_through, 0), false)"
	"       OR EXISTS (SELECT FROM redpacket.settlement_gap g"
	"                  " RP_SETTLED_PROBE("$1", "g.claim_id")
	"                   WHERE g.activity_id OPERATOR(pg_catalog.=) $1 AND s.found)"
	"  FROM (SELECT) AS one"
	"  LEFT JOIN redpacket.settlement_state f ON f.activity_id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}, NULL, true
};

/*
 * 1.6: the claims made before settlement tracking began (settlement_start)
 * are behind every frontier: the frontier starts after them.  Read holding
 * the frontier, the start is the latest (rp_track_claims removes it holding
 * the frontier too).
 */
static RpPlan start_of = {
	"SELECT " RP_START("$1"), 1, {INT8OID}, NULL, true
};

static RpPlan lock_state = {
	"SELECT f.settled_through FROM redpacket.settlement_state f"
	" WHERE f.activity_id OPERATOR(pg_catalog.=) $1 FOR UPDATE SKIP LOCKED",
	1, {INT8OID}, NULL, true
};

static RpPlan insert_state = {
	"INSERT INTO redpacket.settlement_state (activity_id) VALUES ($1)"
	" ON CONFLICT (activity_id) DO NOTHING",
	1, {INT8OID}, NULL, true
};

static RpPlan watermark = {
	"SELECT r.last_claim_id FROM redpacket.reconcile_state r"
	" WHERE r.activity_id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}, NULL, true
};

/* The last claim of activity $1 (NULL: none), read holding the activity. */
static RpPlan last_claim = {
	"SELECT pg_catalog.max(c.claim_id) FROM redpacket.claim c"
	" WHERE c.activity_id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}, NULL, true
};

/*
 * Move the frontier $2 of activity $1 to the last settled claim after it,
 * up to $3 (NULL: no limit), listing the unsettled claims it passes.  This
 * and the statements that read the claims after a frontier are planned per
 * call, knowing the frontier: a generic plan estimates a third of the
 * activity's claims after it, and at millions of claims that estimate
 * alone made PostgreSQL compile the statement (JIT) for longer than it ran.
 */
static RpPlan advance = {
	"WITH scan AS MATERIALIZED ("
	"       SELECT c.claim_id, s.found IS NOT NULL AS settled"
	"         FROM redpacket.claim c"
	"         " RP_SETTLED_PROBE("$1", "c.claim_id")
	"        WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"          AND c.claim_id OPERATOR(pg_catalog.>) $2"
	"          AND ($3::pg_catalog.int8 IS NULL OR c.claim_id OPERATOR(pg_catalog.<=) $3)),"
	"     top AS (SELECT pg_catalog.max(scan.claim_id) AS through FROM scan WHERE scan.settled),"
	"     gaps AS (INSERT INTO redpacket.settlement_gap (activity_id, claim_id)"
	"              SELECT $1, scan.claim_id FROM scan, top"
	"               WHERE NOT scan.settled AND scan.claim_id OPERATOR(pg_catalog.<) top.through"
	"              ON CONFLICT DO NOTHING)"
	" UPDATE redpacket.settlement_state f"
	"    SET settled_through = top.through, advanced_at = pg_catalog.now()"
	"   FROM top"
	"  WHERE f.activity_id OPERATOR(pg_catalog.=) $1 AND top.through IS NOT NULL",
	3, {INT8OID, INT8OID, INT8OID}
};

/* Gaps settled since (a gap is a few rows: the join back is by row id). */
static RpPlan delete_settled_gaps = {
	"DELETE FROM redpacket.settlement_gap g"
	" USING (SELECT x.ctid AS row_id FROM redpacket.settlement_gap x"
	"        " RP_SETTLED_PROBE("$1", "x.claim_id")
	"         WHERE x.activity_id OPERATOR(pg_catalog.=) $1 AND s.found) d"
	" WHERE g.ctid OPERATOR(pg_catalog.=) d.row_id",
	1, {INT8OID}, NULL, true
};

/*
 * The pending claims of activity ACT whose frontier is THROUGH (SQL
 * expressions): the unsettled claims after the frontier, and the unsettled
 * gaps before it.
 */
#define RP_PENDING_ROWS(act, through) \
	"SELECT k.activity_id, k.claim_id, k.user_id, k.amount, k.claimed_at" \
	"  FROM redpacket.claim k" \
	"  " RP_SETTLED_PROBE(act, "k.claim_id") \
	" WHERE k.activity_id OPERATOR(pg_catalog.=) " act \
	"   AND k.claim_id OPERATOR(pg_catalog.>) " through \
	"   AND s.found IS NULL" \
	" UNION ALL" \
	" SELECT k.activity_id, k.claim_id, k.user_id, k.amount, k.claimed_at" \
	"  FROM redpacket.settlement_gap g" \
	"  CROSS JOIN LATERAL (SELECT c.activity_id, c.claim_id, c.user_id, c.amount, c.claimed_at" \
	"                        FROM redpacket.claim c" \
	"                       WHERE c.activity_id OPERATOR(pg_catalog.=) g.activity_id" \
	"                         AND c.claim_id OPERATOR(pg_catalog.=) g.claim_id LIMIT 1) k" \
	"  " RP_SETTLED_PROBE(act, "g.claim_id") \
	" WHERE g.activity_id OPERATOR(pg_catalog.=) " act \
	"   AND g.claim_id OPERATOR(pg_catalog.<=) " through \
	"   AND s.found IS NULL"

/*
 * The pending claims of activity $1 claimed at or before $2 (NULL: any
 * time), its frontier being $3.
 */
#define RP_PENDING_OF_ONE \
	"SELECT p.activity_id, p.claim_id, p.user_id::pg_catalog.text, p.amount, p.claimed_at" \
	"  FROM (" RP_PENDING_ROWS("$1", "$3") ") p" \
	" WHERE $2::pg_catalog.timestamptz IS NULL OR p.claimed_at OPERATOR(pg_catalog.<=) $2"

static RpPlan pending_one = {
	RP_PENDING_OF_ONE " ORDER BY p.claimed_at, p.claim_id",
	3, {INT8OID, TIMESTAMPTZOID, INT8OID}
};

#define RP_FRONTIER(START) \
	"SELECT GREATEST(COALESCE((SELECT f.settled_through FROM redpacket.settlement_state f" \
	"                                      WHERE f.activity_id OPERATOR(pg_catalog.=) $1), 0)," \
	"                           " START("$1") ")"

/* [catalog: 1.4, 1.6] */
static RpPlan frontier[2] = {
	{RP_FRONTIER(RP_NO_START), 1, {INT8OID}, NULL, true},
	{RP_FRONTIER(RP_START), 1, {INT8OID}, NULL, true}
};

/* Every activity's pending claims, oldest first: the function on each. */
static RpPlan pending_all = {
	"SELECT p.activity_id, p.claim_id, p.user_id, p.amount, p.claimed_at"
	"  FROM redpacket.activity a"
	" CROSS JOIN LATERAL redpacket.rp_pending_credits(a.id, $1) p"
	" ORDER BY p.claimed_at, p.activity_id, p.claim_id",
	1, {INTERVALOID}, NULL, true
};

/* Can this transaction move a frontier (see the file header)? */
static bool
CanAdvance(void)
{
	return !RecoveryInProgress() && !XactReadOnly && !IsolationUsesXactSnapshot()
		&& !RpRestoring();
}

/*
 * The activity's settlement_state row is made by its first credit
 * (RpSettlementBegun), never here: a transaction that inserts it holds it,
 * invisibly, until it ends, and an advance that met it would wait, perhaps
 * holding the activity's stripe locks (a reconciliation pass).  Until the
 * row exists nothing is credited, and every claim after the frontier (0)
 * is pending but the reversed ones anyway.
 */
void
RpSettlementBegun(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	/* under REPEATABLE READ a row committed after the snapshot is a 40001 */
	if (IsolationUsesXactSnapshot())
		return;
	if (RpExecOn(&insert_state, RpDistributed(), &id, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not make the settlement state of activity " INT64_FORMAT, activity);
}

/*
 * Lock the activity's settlement_state row without waiting for another
 * advance; false when one holds it, or when there is none yet.
 */
static bool
LockFrontier(int64 activity, int64 *through)
{
	Datum		id = Int64GetDatum(activity);

	if (RpExecOn(&lock_state, RpDistributed(), &id, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not lock the settlement state of activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		return false;
	*through = RpGetInt64(0, 1, 0);
	return true;
}

/*
 * How far the frontier may move (see (b) and (c) in the header) into
 * values[2] and nulls[2]; an open activity always has a limit.
 */
static void
AdvanceLimit(const RpActivity *act, Datum *values, char *nulls)
{
	RpPlan	   *plan = &watermark;
	int			busy;
	bool		isnull = true;
	Datum		last = (Datum) 0;

	if (act->closed)
		return;
	if (RpWalkTry(act, &busy))
		plan = &last_claim;
	if (RpExecOn(plan, RpDistributed(), values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read how far the claims of activity " INT64_FORMAT " are done",
			 act->id);
	if (plan == &last_claim)
		RpWalkEnd(act);
	if (SPI_processed == 1)
		last = RpGetDatum(0, 1, &isnull);
	values[2] = isnull ? Int64GetDatum(0) : last;
	nulls[2] = ' ';
}

/* Where the activity's frontier starts (1.6: after the untracked claims). */
static int64
Start(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	if (RpCatalogVersion() < RP_CATALOG_1_6)
		return 0;
	if (RpExecOn(&start_of, RpDistributed(), &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read where the settlements of activity " INT64_FORMAT " start", activity);
	return RpGetInt64(0, 1, 0);
}

/* Move the activity's frontier as far as is safe (see the file header). */
static void
Advance(int64 activity)
{
	RpActivity	act;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', 'n'};
	int64		through;
	int64		start;
	bool		isnull;

	if (!CanAdvance() || !RpFetchActivity(activity, &act, true))
		return;
	values[0] = Int64GetDatum(activity);
	if (RpExecOn(&advance_due, RpDistributed(), values, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the settlement state of activity " INT64_FORMAT, activity);
	if (!DatumGetBool(RpGetDatum(0, 2, &isnull)) || !LockFrontier(activity, &through))
		return;
	start = Start(activity);
	AdvanceLimit(&act, values, nulls);
	values[1] = Int64GetDatum(Max(through, start));
	if (RpExec(&advance, values, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not advance the settlement state of activity " INT64_FORMAT, activity);
	if (RpExecOn(&delete_settled_gaps, RpDistributed(), values, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not delete settled gaps of activity " INT64_FORMAT, activity);
}

/* The activity's frontier as this statement sees it (0: none yet). */
static int64
Frontier(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	if (RpExecOn(&frontier[RpCatalogVersion() >= RP_CATALOG_1_6], RpDistributed(), &id, NULL,
				 false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the settlement state of activity " INT64_FORMAT, activity);
	return RpGetInt64(0, 1, 0);
}

/* The time claims must be at or before to be older than older_than; NOEND: any. */
static TimestampTz
Cutoff(Interval *older_than)
{
	Interval	zero = {0};
	int			cmp = DatumGetInt32(DirectFunctionCall2(interval_cmp,
														IntervalPGetDatum(older_than),
														IntervalPGetDatum(&zero)));

	if (cmp < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("older_than must not be negative")));
	if (cmp == 0)
		return DT_NOEND;
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
												   TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
												   IntervalPGetDatum(older_than)));
}

/*
 * rp_pending_credits(activity, older_than): the claims of one activity (or,
 * NULL, of all: this function on each) neither credited nor reversed,
 * claimed at least older_than ago, oldest first.
 */
Datum
rp_pending_credits(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz cutoff;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};

	RpNoNull(PG_ARGISNULL(1), "older_than");
	cutoff = Cutoff(PG_GETARG_INTERVAL_P(1));
	InitMaterializedSRF(fcinfo, 0);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (PG_ARGISNULL(0))
	{
		values[0] = PG_GETARG_DATUM(1);
		if (RpExecOn(&pending_all, RpDistributed(), values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the pending claims");
	}
	else
	{
		RpActivity	act;

		RpRequireLocalActivity(PG_GETARG_INT64(0));
		(void) RpFetchActivity(PG_GETARG_INT64(0), &act, false);
		Advance(act.id);
		values[0] = Int64GetDatum(act.id);
		values[1] = TimestampTzGetDatum(cutoff);
		nulls[1] = cutoff == DT_NOEND ? 'n' : ' ';
		values[2] = Int64GetDatum(Frontier(act.id));
		if (RpExec(&pending_one, values, nulls, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the pending claims of activity " INT64_FORMAT, act.id);
	}
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		row[5];
		bool		rnulls[5];

		for (int c = 0; c < 5; c++)
			row[c] = RpGetDatum(r, c + 1, &rnulls[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, rnulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/* ---- rp_track_claims (1.6) ---------------------------------------------- */

static RpPlan untracked = {
	"SELECT u.activity_id FROM redpacket.settlement_start u"
	" WHERE $1::pg_catalog.int8 IS NULL OR u.activity_id OPERATOR(pg_catalog.=) $1"
	" ORDER BY u.activity_id",
	1, {INT8OID}, NULL, true
};

static RpPlan lock_frontier_wait = {
	"SELECT f.settled_through FROM redpacket.settlement_state f"
	" WHERE f.activity_id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
	1, {INT8OID}, NULL, true
};

/*
 * Bring the untracked claims of activity $1 in, its frontier being $2: the
 * unsettled ones at or below the frontier become gaps (the claims after it
 * are pending anyway once the start is gone).  Returns how many are pending
 * now.
 */
static RpPlan track = {
	"WITH u AS (DELETE FROM redpacket.settlement_start u"
	"            WHERE u.activity_id OPERATOR(pg_catalog.=) $1 RETURNING u.untracked_through),"
	"     c AS (SELECT c.claim_id FROM u, redpacket.claim c"
	"            " RP_SETTLED_PROBE("$1", "c.claim_id")
	"            WHERE c.activity_id OPERATOR(pg_catalog.=) $1"
	"              AND c.claim_id OPERATOR(pg_catalog.<=) u.untracked_through AND s.found IS NULL),"
	"     g AS (INSERT INTO redpacket.settlement_gap (activity_id, claim_id)"
	"           SELECT $1, c.claim_id FROM c WHERE c.claim_id OPERATOR(pg_catalog.<=) $2"
	"           ON CONFLICT DO NOTHING)"
	" SELECT pg_catalog.count(*) FROM c",
	2, {INT8OID, INT8OID}
};

/*
 * Holding the activity's frontier (waiting for an advance, or for the
 * transaction of the first credit), so that no advance reads the start
 * this removes.
 */
static int64
TrackActivity(int64 activity)
{
	Datum		values[2] = {Int64GetDatum(activity), Int64GetDatum(0)};

	/* a first credit in flight inserts the row: wait for it to commit */
	RpSettlementBegun(activity);
	if (RpExecOn(&lock_frontier_wait, RpDistributed(), values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not lock the settlement state of activity " INT64_FORMAT, activity);
	if (SPI_processed == 1)
		values[1] = Int64GetDatum(RpGetInt64(0, 1, 0));
	if (RpExecOn(&track, RpDistributed(), values, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not track the claims of activity " INT64_FORMAT, activity);
	return RpGetInt64(0, 1, 0);
}

/*
 * rp_track_claims(activity): the claims of the activity (NULL: of every
 * activity) made before settlement tracking began become pending credits
 * unless settled; returns how many did.
 */
Datum
rp_track_claims(PG_FUNCTION_ARGS)
{
	Datum		id = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	char		nulls[1] = {PG_ARGISNULL(0) ? 'n' : ' '};
	int64	   *ids;
	uint64		n;
	int64		brought = 0;

	/* a snapshot older than the update that wrote the starts sees none */
	(void) RpCatalogVersion();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!PG_ARGISNULL(0))
		RpRequireLocalActivity(PG_GETARG_INT64(0));
	if (RpExecOn(&untracked, RpDistributed(), &id, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the untracked claims");
	n = SPI_processed;
	ids = palloc(sizeof(int64) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
		ids[i] = RpGetInt64(i, 1, 0);
	for (uint64 i = 0; i < n; i++)
		brought += TrackActivity(ids[i]);
	SPI_finish();
	PG_RETURN_INT64(brought);
}
