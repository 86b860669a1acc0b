/*
 * alert.c
 *		What the reconciliation pass tells people about a check that did
 *		not pass: a WARNING in the server log with what was expected and
 *		what was found, and a NOTIFY on redpacket_alert whose JSON payload
 *		is enough to triage.  Any role can NOTIFY on any channel, so the
 *		reconciliation table stays the authority; the payload is a wake-up.
 */
#include "postgres.h"

#include "commands/async.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/numeric.h"

#include "alert.h"
#include "check.h"

/* Longest error message kept in a NOTIFY payload (payloads stop at 8000 bytes). */
#define RP_ALERT_ERROR_MAX 1000

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
