/*
 * eligible.c
 *		Eligibility lists: a restricted activity (rp_create_activity(...,
 *		restricted => true)) pays only the users on its list,
 *		redpacket.eligible; anyone else gets not_eligible (the claim
 *		engine's rules.c).  rp_allow and rp_disallow change the list in bulk.
 *
 *		Locks.  A claim decides eligibility holding its user's lock and
 *		bucket (locks.c).  rp_allow and rp_disallow hold the activity lock
 *		shared, as a claim does, and the buckets of the users they list in
 *		ExclusiveLock, as a large batch does: at most RP_USER_BUCKETS locks
 *		whatever the size of the list, taken in bucket order holding nothing
 *		else of the activity (rule 3 in locks.c), kept to the end of the
 *		transaction.  So a claim of a listed user is
 *		either wholly before a change of the list or wholly after it: it
 *		never pays after a removal that committed before it, and a removal
 *		never touches a claim already made (a retry answers duplicate,
 *		which is checked first).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "claim/claim.h"
#include "scaleout/scaleout.h"

PG_FUNCTION_INFO_V1(rp_allow);
PG_FUNCTION_INFO_V1(rp_disallow);

static RpPlan list_state = {
	"SELECT a.restricted, a.closed_at IS NOT NULL FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

/* Listed once: a user already on the list, or twice in the array, is skipped. */
static RpPlan insert_list = {
	"INSERT INTO redpacket.eligible (activity_id, user_id)"
	" SELECT $1, u FROM pg_catalog.unnest($2::pg_catalog.text[]) u"
	" ON CONFLICT (activity_id, user_id) DO NOTHING",
	2, {INT8OID, TEXTARRAYOID}
};

static RpPlan delete_list = {
	"DELETE FROM redpacket.eligible e"
	" WHERE e.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND e.user_id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])",
	2, {INT8OID, TEXTARRAYOID}
};

/*
 * The list of a restricted activity that is not settled may change:
 * P0002 for an unknown activity, 55000 otherwise.
 */
static void
CheckListChangeable(int64 activity, const char *func)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;

	if (RpExec(&list_state, &id, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read activity " INT64_FORMAT, activity);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("activity " INT64_FORMAT " does not exist", activity)));
	if (!DatumGetBool(RpGetDatum(0, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is not restricted", activity),
				 errdetail("Every user may claim from it; %s changes the list of a restricted activity.", func),
				 errhint("Create the activity with restricted => true to pay only the users on its list.")));
	if (DatumGetBool(RpGetDatum(0, 2, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is settled", activity),
				 errdetail("Its list can no longer change: nobody can claim from it.")));
}

/*
 * The user ids of the array argument, checked as rp_claim checks one: an
 * error before anything is locked or written.
 */
static Datum *
UserIds(FunctionCallInfo fcinfo, int argno, ArrayType **array, int *n)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;

	RpNoNull(PG_ARGISNULL(argno), "user_ids");
	arr = *array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("user_ids must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, n);
	for (int i = 0; i < *n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("user_ids[%d] must not be NULL", i + 1)));
		RpCheckUserId(DatumGetTextPP(elems[i]), "user_ids", i + 1);
	}
	return elems;
}

/*
 * The activity lock shared, then the buckets of the users in ExclusiveLock
 * and bucket order (at most RP_USER_BUCKETS locks), kept to the end of the
 * transaction.  Outside a claim's busy scope no wait is refused.
 */
static void
LockBuckets(int64 activity, const Datum *users, int n)
{
	bool		used[RP_USER_BUCKETS] = {false};
	RpCall		call;

	(void) RpCallBegin(&call, activity);

	for (int i = 0; i < n; i++)
		used[RpUserHash(DatumGetTextPP(users[i])) % RP_USER_BUCKETS] = true;
	for (uint32 b = 0; b < RP_USER_BUCKETS; b++)
		if (used[b])
			(void) RpWaitLock(RP_LOCK_BUCKET, activity, b, ExclusiveLock);
	RpCallEnd(&call, true);
}

/* rp_allow (allow) and rp_disallow: the number of users added or removed. */
static int64
ChangeList(FunctionCallInfo fcinfo, bool allow)
{
	const char *func = allow ? "rp_allow" : "rp_disallow";
	int64		activity;
	ArrayType  *array;
	Datum	   *users;
	int			n;
	Datum		values[2];
	int64		changed;

	RpNoNull(PG_ARGISNULL(0), "activity");
	activity = PG_GETARG_INT64(0);
	users = UserIds(fcinfo, 1, &array, &n);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(activity);
	CheckListChangeable(activity, func);
	if (n == 0)
	{
		SPI_finish();
		return 0;
	}
	LockBuckets(activity, users, n);
	CheckListChangeable(activity, func);	/* settled while we waited? */

	values[0] = Int64GetDatum(activity);
	values[1] = PointerGetDatum(array);
	if (RpExec(allow ? &insert_list : &delete_list, values, NULL, false, 0) !=
		(allow ? SPI_OK_INSERT : SPI_OK_DELETE))
		elog(ERROR, "could not change the eligibility list of activity " INT64_FORMAT, activity);
	changed = (int64) SPI_processed;
	if (changed > 0)
		RpRecordChange(activity, allow ? "allow" : "disallow", NULL,
					   psprintf("{\"users\": %d, \"%s\": " INT64_FORMAT "}", n,
								allow ? "added" : "removed", changed),
					   NULL);
	SPI_finish();
	return changed;
}

Datum
rp_allow(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(ChangeList(fcinfo, true));
}

Datum
rp_disallow(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(ChangeList(fcinfo, false));
}
