/*
 * alert.c
 *		What the reconciliation pass tells people about a check that did
 *		not pass: a WARNING in the server log with what was expected and
 *		what was found, and a NOTIFY on redpacket_alert whose JSON payload
 *		is enough to triage.  Any role can NOTIFY on any channel, so the
 *		reconciliation table stays the authority; the payload is a wake-up.
 *		A check that found the books wrong (kind "mismatch") is told apart
 *		from one that could not run ("unchecked": an error, a lock timeout)
 *		and from an activity the pass cannot fully see ("incomplete"),
 *		which is told once per change of what is missing (1.4, through
 *		redpacket.reconcile_problem), not once per pass.  Books found wrong
 *		are told when an incident begins: a check of an activity whose
 *		latest recorded check failed already (a refused rp_unfreeze, the
 *		next full check) tells nothing new unless it froze the activity.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/numeric.h"

#include "base/base.h"
#include "alert.h"
#include "check.h"

/* Longest error message kept in a NOTIFY payload (payloads stop at 8000 bytes). */
#define RP_ALERT_ERROR_MAX 1000

/* mismatch (the books are wrong), unchecked (the check could not run), incomplete */
const char *
RpAlertKind(const RpCheck *c)
{
	return c->failed[RP_PROBLEM_INCOMPLETE] ? "incomplete"
		: c->failed[RP_PROBLEM_ERROR] ? "unchecked" : "mismatch";
}

static char *
NumText(Datum n)
{
	return DatumGetCString(DirectFunctionCall1(numeric_out, n));
}

/* JSON helpers for the alert payload */
static void
JsonKey(StringInfo s, const char *key)
{
	if (s->data[s->len - 1] != '{')
		appendStringInfoChar(s, ',');
	escape_json(s, key);
	appendStringInfoChar(s, ':');
}

static void
JsonPair(StringInfo s, const char *key, const char *expected, const char *actual)
{
	JsonKey(s, key);
	appendStringInfo(s, "{\"expected\":%s,\"actual\":%s}", expected, actual);
}

static char *
Int64Text(int64 v)
{
	return psprintf(INT64_FORMAT, v);
}

/*
 * The redpacket_alert payload: the database, the activity, every failed
 * check with expected and actual, whether this check froze the activity.
 * Any role can NOTIFY on any channel, so the reconciliation table is the
 * authority; the payload is a wake-up with enough to triage.
 */
static char *
AlertPayload(const RpCheck *c)
{
	StringInfoData s;
	bool		measured = RpCheckMeasured(c);

	initStringInfo(&s);
	appendStringInfoChar(&s, '{');
	JsonKey(&s, "database");
	escape_json(&s, get_database_name(MyDatabaseId));
	JsonKey(&s, "activity");
	appendStringInfoString(&s, Int64Text(c->activity));
	JsonKey(&s, "pass_id");
	appendStringInfoString(&s, c->recorded ? Int64Text(c->pass_id) : "null");
	JsonKey(&s, "checked_at");
	escape_json(&s, timestamptz_to_str(c->checked_at));
	JsonKey(&s, "kind");
	escape_json(&s, RpAlertKind(c));
	JsonKey(&s, "frozen");
	appendStringInfoString(&s, c->frozen ? "true" : "false");
	JsonKey(&s, "problems");
	appendStringInfoChar(&s, '[');
	for (int p = 0, n = 0; p < RP_NPROBLEMS; p++)
		if (c->failed[p])
			appendStringInfo(&s, "%s\"%s\"", n++ ? "," : "", RpProblemName(p));
	appendStringInfoChar(&s, ']');
	if (measured)
	{
		/* the 1.0 payload's keys, kept for existing consumers */
		JsonKey(&s, "expected");
		appendStringInfoString(&s, NumText(c->expected));
		JsonKey(&s, "actual");
		appendStringInfoString(&s, NumText(c->actual));
		JsonKey(&s, "drift");
		appendStringInfoString(&s, NumText(DirectFunctionCall2(numeric_sub, c->actual, c->expected)));
	}
	JsonKey(&s, "checks");
	appendStringInfoChar(&s, '{');
	if (c->failed[RP_PROBLEM_MONEY])
		JsonPair(&s, "money", NumText(c->expected), NumText(c->actual));
	if (c->failed[RP_PROBLEM_PACKETS])
		JsonPair(&s, "packets", Int64Text(c->expected_packets), Int64Text(c->actual_packets));
	if (c->failed[RP_PROBLEM_CLAIMS])
		JsonPair(&s, "claims", Int64Text(c->expected_claims), Int64Text(c->actual_claims));
	if (c->failed[RP_PROBLEM_NEGATIVE])
		JsonPair(&s, "negative", "0", Int64Text(c->negative));
	if (c->failed[RP_PROBLEM_NOT_EMPTY])
	{
		JsonPair(&s, "not_empty", "0", Int64Text(c->nonempty));
		JsonPair(&s, "returned", NumText(c->return_due), NumText(c->returned));
	}
	appendStringInfoChar(&s, '}');
	if (c->detail)
	{
		JsonKey(&s, c->failed[RP_PROBLEM_ERROR] ? "error" : "incomplete");
		escape_json(&s, pnstrdup(c->detail, Min(strlen(c->detail), RP_ALERT_ERROR_MAX)));
	}
	appendStringInfoChar(&s, '}');
	return s.data;
}

/*
 * WARNING and NOTIFY for a check that did not pass.  A failed check was
 * frozen (or not) by the caller before: the payload says which.
 */
void
RpAlert(const RpCheck *c)
{
	StringInfoData what;

	if (c->failed[RP_PROBLEM_ERROR] || c->failed[RP_PROBLEM_INCOMPLETE])
		ereport(WARNING,
				(errcode(c->failed[RP_PROBLEM_ERROR] ? ERRCODE_INTERNAL_ERROR
						 : ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("redpacket reconciliation of activity " INT64_FORMAT " %s", c->activity,
						c->failed[RP_PROBLEM_ERROR] ? "could not run" : "skipped an incomplete activity"),
				 errdetail("%s", c->detail),
				 c->failed[RP_PROBLEM_INCOMPLETE]
				 ? errhint("Nothing was written for it. When no restore is running, restore the missing rows or sequences; redpacket.rp_reconcile(activity, true) recreates a lost reconcile_state row.")
				 : errhint("The pass went on with the next activity; this one is checked again next time.")));
	else
	{
		initStringInfo(&what);
		appendStringInfo(&what, "Expected balance %s, stripes hold %s (drift %s); packets expected %s, held %s; claims %s, counted on stripes %s; %d negative stripes.",
						 NumText(c->expected), NumText(c->actual),
						 NumText(DirectFunctionCall2(numeric_sub, c->actual, c->expected)),
						 c->has_packets ? Int64Text(c->expected_packets) : "-",
						 c->has_packets ? Int64Text(c->actual_packets) : "-",
						 Int64Text(c->expected_claims), Int64Text(c->actual_claims),
						 (int) c->negative);
		if (c->failed[RP_PROBLEM_NOT_EMPTY])
			appendStringInfo(&what, " The activity is closed but " INT64_FORMAT " stripes are not empty, or the return (%s) is not funded - claims (%s).",
							 c->nonempty, NumText(c->returned), NumText(c->return_due));
		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("redpacket reconciliation of activity " INT64_FORMAT " failed", c->activity),
				 errdetail("%s", what.data),
				 errhint("The activity is frozen when redpacket.freeze_on_mismatch is on; investigate, then call redpacket.rp_unfreeze.")));
	}
	Async_Notify("redpacket_alert", AlertPayload(c));
}

/* Remember what was reported; RETURNING: the new and the changed. */
static RpPlan note_problems = {
	"INSERT INTO redpacket.reconcile_problem AS p (activity_id, problem, detail, since, reported_at)"
	" SELECT x.id, $3, x.detail, $4, $4"
	"   FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]),"
	"                   pg_catalog.unnest($2::pg_catalog.text[])) AS x(id, detail)"
	" ON CONFLICT (activity_id, problem) DO UPDATE"
	"    SET detail = EXCLUDED.detail, reported_at = EXCLUDED.reported_at"
	"  WHERE p.detail IS DISTINCT FROM EXCLUDED.detail"
	" RETURNING p.activity_id",
	4, {INT8ARRAYOID, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID}
};

static RpPlan clear_problems = {
	"DELETE FROM redpacket.reconcile_problem p"
	" WHERE p.problem OPERATOR(pg_catalog.=) $2"
	"   AND p.activity_id OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.int8[])"
	" RETURNING p.activity_id, p.since",
	2, {INT8ARRAYOID, TEXTOID}
};

/*
 * The incomplete activities of a unit: each is told (WARNING and NOTIFY)
 * when it was not reported incomplete before, or what is missing changed
 * (1.4; every time with an older catalog).  Returns how many were told.
 * Must be called inside SPI_connect.
 */
int
RpAlertIncomplete(RpCheck **checks, int n)
{
	Datum	   *ids;
	Datum	   *details;
	Datum		v[4];
	int			told = 0;

	if (n == 0)
		return 0;
	if (RpCatalogVersion() < RP_CATALOG_1_4)
	{
		for (int i = 0; i < n; i++)
			RpAlert(checks[i]);
		return n;
	}
	ids = palloc(sizeof(Datum) * n);
	details = palloc(sizeof(Datum) * n);
	for (int i = 0; i < n; i++)
	{
		ids[i] = Int64GetDatum(checks[i]->activity);
		details[i] = CStringGetTextDatum(checks[i]->detail);
	}
	v[0] = PointerGetDatum(construct_array(ids, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE));
	v[1] = PointerGetDatum(construct_array(details, n, TEXTOID, -1, false, TYPALIGN_INT));
	v[2] = CStringGetTextDatum(RpProblemName(RP_PROBLEM_INCOMPLETE));
	v[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (RpExec(&note_problems, v, NULL, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not note incomplete activities");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int64		id = RpGetInt64(r, 1, 0);

		for (int i = 0; i < n; i++)
			if (checks[i]->activity == id)
			{
				RpAlert(checks[i]);
				told++;
			}
	}
	return told;
}

/*
 * These activities of a unit were checked: any that was reported
 * incomplete is complete again, which is logged once (1.4).  Must be
 * called inside SPI_connect.
 */
void
RpAlertComplete(const int64 *activities, int n)
{
	Datum	   *ids;
	Datum		v[2];

	if (n == 0 || RpCatalogVersion() < RP_CATALOG_1_4)
		return;
	ids = palloc(sizeof(Datum) * n);
	for (int i = 0; i < n; i++)
		ids[i] = Int64GetDatum(activities[i]);
	v[0] = PointerGetDatum(construct_array(ids, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE));
	v[1] = CStringGetTextDatum(RpProblemName(RP_PROBLEM_INCOMPLETE));
	if (RpExec(&clear_problems, v, NULL, false, 0) != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "could not clear incomplete activities");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;

		ereport(LOG,
				(errmsg("redpacket reconciliation: activity " INT64_FORMAT " is complete again",
						RpGetInt64(r, 1, 0)),
				 errdetail("It was incomplete since %s; it was checked now.",
						   timestamptz_to_str(DatumGetTimestampTz(RpGetDatum(r, 2, &isnull))))));
	}
}
