/*
 * uncredited.c
 *		The uncredited alert: claims neither credited nor reversed longer
 *		than redpacket.credit_deadline (seconds, 0: off) mean the wallet is
 *		not paying.  After each pass over all, the pass looks at the next
 *		RP_CREDIT_WINDOW activities by id, in turn from
 *		reconciler.credit_probed_through, and again at every activity it
 *		reported: each one's claims that rp_pending_credits lists as older
 *		than the deadline, counted, with the oldest.  rp_pending_credits
 *		reads only what is not settled (it moves the activity's settlement
 *		frontier past what is), so a look costs what is pending, not the
 *		settled history, and a pass costs at most a window of them.
 *
 *		An activity that has such claims is the problem uncredited in
 *		reconcile_problem, told when it begins (WARNING and a NOTIFY on
 *		redpacket_alert with the count and the oldest claim); its detail
 *		follows the count without telling again.  One that has none any
 *		more is cleared and logged once.  Nothing is frozen: the money is in
 *		the claims, and the books are right.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/timestamp.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "pass.h"
#include "uncredited.h"

#define RP_CREDIT_WINDOW 256
#define RP_MAX_CREDIT_DEADLINE (86400 * 365)

int			rp_credit_deadline = 0;

void
RpUncreditedInit(void)
{
	DefineCustomIntVariable("redpacket.credit_deadline",
							"Seconds after which a claim neither credited nor reversed is reported as uncredited.",
							"The reconciliation passes report each activity with such claims once, as the problem uncredited (WARNING, NOTIFY redpacket_alert), and clear it when they are settled; 0 turns the alert off.",
							&rp_credit_deadline,
							0, 0, RP_MAX_CREDIT_DEADLINE,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
}

static RpPlan window_start = {
	"SELECT r.credit_probed_through FROM redpacket.reconciler r", 0, {InvalidOid}
};

static RpPlan window_record = {
	"UPDATE redpacket.reconciler SET credit_probed_through = $1", 1, {INT8OID}
};

/*
 * The window's activities (ids after $1 up to $4) and the reported ones
 * ($2 the deadline, $3 now): the problems noted or cleared, and which to tell.
 * Rows: told (a new problem) or cleared, the activity, the count, the
 * oldest claim and when it was claimed (told), or since when (cleared).
 * The insert runs whether or not the result reads it (a data-modifying
 * WITH always does).
 */
static RpPlan look = {
	"WITH old AS (SELECT q.activity_id FROM redpacket.reconcile_problem q"
	"              WHERE q.problem OPERATOR(pg_catalog.=) 'uncredited'),"
	"     w AS (SELECT a.id FROM redpacket.activity a"
	"            WHERE (a.id OPERATOR(pg_catalog.>) $1 AND a.id OPERATOR(pg_catalog.<=) $4)"
	"               OR EXISTS (SELECT FROM old WHERE old.activity_id OPERATOR(pg_catalog.=) a.id)),"
	"     p AS (SELECT w.id, pg_catalog.count(c.claim_id) AS n,"
	"                  (pg_catalog.array_agg(c.claim_id ORDER BY c.claimed_at, c.claim_id))[1] AS first,"
	"                  pg_catalog.min(c.claimed_at) AS oldest"
	"             FROM w LEFT JOIN LATERAL redpacket.rp_pending_credits(w.id, $2) c ON true"
	"            GROUP BY w.id),"
	"     gone AS (DELETE FROM redpacket.reconcile_problem q USING p"
	"               WHERE q.activity_id OPERATOR(pg_catalog.=) p.id"
	"                 AND q.problem OPERATOR(pg_catalog.=) 'uncredited' AND p.n OPERATOR(pg_catalog.=) 0"
	"              RETURNING q.activity_id, q.since),"
	"     noted AS (INSERT INTO redpacket.reconcile_problem AS q"
	"                      (activity_id, problem, detail, since, reported_at)"
	"               SELECT p.id, 'uncredited',"
	"                      pg_catalog.format('%s claims neither credited nor reversed after %s; the oldest is claim %s, claimed at %s',"
	"                                        p.n, $2, p.first, p.oldest), $3, $3"
	"                 FROM p WHERE p.n OPERATOR(pg_catalog.>) 0"
	"               ON CONFLICT (activity_id, problem) DO UPDATE"
	"                  SET detail = EXCLUDED.detail, reported_at = EXCLUDED.reported_at"
	"                WHERE q.detail IS DISTINCT FROM EXCLUDED.detail"
	"               RETURNING q.activity_id)"
	" SELECT true, p.id, p.n, p.first, p.oldest FROM p"
	"  WHERE p.n OPERATOR(pg_catalog.>) 0"
	"    AND NOT EXISTS (SELECT FROM old WHERE old.activity_id OPERATOR(pg_catalog.=) p.id)"
	" UNION ALL"
	" SELECT false, g.activity_id, 0, NULL, g.since FROM gone g",
	4, {INT8OID, INTERVALOID, TIMESTAMPTZOID, INT8OID}
};

/* WARNING and NOTIFY for an activity whose claims became uncredited. */
static void
Tell(int64 activity, int64 n, int64 first, TimestampTz oldest)
{
	StringInfoData s;

	ereport(WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("redpacket: " INT64_FORMAT " claims of activity " INT64_FORMAT " are neither credited nor reversed after redpacket.credit_deadline",
					n, activity),
			 errdetail("The oldest is claim " INT64_FORMAT ", claimed at %s.",
					   first, timestamptz_to_str(oldest)),
			 errhint("The wallet has not acknowledged them with redpacket.rp_credited; redpacket.rp_pending_credits lists them. Nothing is frozen.")));
	initStringInfo(&s);
	appendStringInfoString(&s, "{\"database\":");
	escape_json(&s, get_database_name(MyDatabaseId));
	appendStringInfo(&s, ",\"activity\":" INT64_FORMAT ",\"kind\":\"uncredited\",\"uncredited\":" INT64_FORMAT
					 ",\"oldest_claim\":" INT64_FORMAT ",\"oldest_claimed_at\":",
					 activity, n, first);
	escape_json(&s, timestamptz_to_str(oldest));
	appendStringInfoChar(&s, '}');
	Async_Notify("redpacket_alert", s.data);
}

void
RpUncreditedLook(void)
{
	Interval   *deadline;
	Datum		v[4];
	int64		from = 0;
	int64		to;
	int64		next;

	/*
	 * Not in a caller's transaction block: the look moves settlement
	 * frontiers, whose rows a wallet's rp_credited would wait for until
	 * that transaction ends.
	 */
	if (rp_credit_deadline <= 0 || RpCatalogVersion() < RP_CATALOG_1_5 || RpDistributed() ||
		IsTransactionBlock())
		return;
	deadline = palloc0(sizeof(Interval));
	deadline->time = (int64) rp_credit_deadline * USECS_PER_SEC;
	if (RpExec(&window_start, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read where the uncredited look stopped");
	if (SPI_processed == 1)
		from = RpGetInt64(0, 1, 0);
	next = RpActivityWindow(&from, RP_CREDIT_WINDOW, &to);
	v[0] = Int64GetDatum(from);
	v[1] = IntervalPGetDatum(deadline);
	v[2] = TimestampTzGetDatum(GetCurrentTimestamp());
	v[3] = Int64GetDatum(to);
	if (RpExec(&look, v, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not look for uncredited claims");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int64		activity = RpGetInt64(r, 2, 0);
		TimestampTz at = DatumGetTimestampTz(RpGetDatum(r, 5, &isnull));

		if (DatumGetBool(RpGetDatum(r, 1, &isnull)))
			Tell(activity, RpGetInt64(r, 3, 0), RpGetInt64(r, 4, 0), at);
		else
			ereport(LOG,
					(errmsg("redpacket: the claims of activity " INT64_FORMAT " are credited again", activity),
					 errdetail("Some were uncredited past redpacket.credit_deadline since %s.",
							   timestamptz_to_str(at))));
	}
	v[0] = Int64GetDatum(next);
	if (RpExec(&window_record, v, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not record where the uncredited look stopped");
}
