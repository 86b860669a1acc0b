/*
 * livechange.c
 *		Changing a live activity: rp_top_up adds money (and packets) to the
 *		budget, rp_withdraw gives unclaimed money back to the funder,
 *		rp_set_window moves the schedule.  Each runs like rp_close_activity:
 *		every stripe lock of the activity in stripe order, holding nothing
 *		else of it (locks.c), so no claim sees half a change; then the
 *		activity row, read again and locked; refused once the activity is
 *		closed or settled.  Each is one row of activity_change, and the
 *		money ones one ledger entry (top_up, withdraw).
 *
 *		Money an operator adds or takes is undealt (lucky draws deal
 *		amounts ahead to the stripes, in dealt, which balance and packets
 *		include): a top-up adds to balance and packets only, a withdrawal
 *		takes only from balance - dealt_units, and leaves a capped activity
 *		at least one undealt minor unit for each undealt packet, so every
 *		remaining packet stays claimable.  When the undealt money cannot
 *		cover a withdrawal, the dealt amounts first go back to the undealt
 *		pool, as they do for a fixed claim that needs them (alloc.c, rule
 *		3): the next lucky draw deals again from what is left.  A small
 *		lucky-draw activity is dealt whole at creation, so without this
 *		nothing of it could be withdrawn.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/int.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "claim/claim.h"
#include "reconcile/reconcile.h"
#include "scaleout/scaleout.h"
#include "campaign.h"

PG_FUNCTION_INFO_V1(rp_top_up);
PG_FUNCTION_INFO_V1(rp_withdraw);
PG_FUNCTION_INFO_V1(rp_set_window);

/* The fields each change records before and after it. */
#define RP_MONEY_FIELDS "funded,packets,remaining,remaining_packets"
#define RP_WINDOW_FIELDS "starts_at,ends_at"

enum
{
	ST_STRIPE = 1, ST_BALANCE, ST_DEALT_UNITS, ST_PACKETS, ST_DEALT_COUNT
};

/*
 * The stripes as they are now, with every stripe lock held: locked rows,
 * so that under REPEATABLE READ a stripe a claim changed after the
 * snapshot is a serialization failure, not a stale sum (even a stripe the
 * change would not write).
 */
static RpPlan read_stripes = {
	"SELECT s.stripe, s.balance, s.dealt_units, COALESCE(s.packets, 0), s.dealt_count"
	"  FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1"
	" ORDER BY s.stripe FOR NO KEY UPDATE",
	1, {INT8OID}
};

/*
 * Add units ($3, negative: take) and packets ($4) to the stripes $2,
 * never into dealt money; with $5, bring them to that revision.
 */
static RpPlan adjust_stripes = {
	"UPDATE redpacket.stripe s"
	"   SET balance = s.balance OPERATOR(pg_catalog.+) d.units,"
	"       packets = s.packets OPERATOR(pg_catalog.+) d.packets,"
	"       revision = COALESCE($5, s.revision)"
	"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]),"
	"                  pg_catalog.unnest($3::pg_catalog.int8[]),"
	"                  pg_catalog.unnest($4::pg_catalog.int4[])) AS d(stripe, units, packets)"
	" WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.stripe OPERATOR(pg_catalog.=) d.stripe"
	"   AND s.balance OPERATOR(pg_catalog.+) d.units OPERATOR(pg_catalog.>=) s.dealt_units",
	5, {INT8OID, INT4ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, INT8OID}
};

/*
 * The activity as it is now, its row locked against the other changes
 * (under REPEATABLE READ one committed after the snapshot is a
 * serialization failure); the live changes exist from 1.4 on.
 */
static RpPlan lock_activity = {
	"SELECT " RP_ACTIVITY_SELECT_14 " FROM redpacket.activity a"
	" WHERE a.id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
	1, {INT8OID}
};

/* Every dealt amount back to the undealt pool (balance and packets keep them). */
static RpPlan undeal = {
	"UPDATE redpacket.stripe s SET dealt = NULL, dealt_units = 0, dealt_count = 0"
	" WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.dealt_count OPERATOR(pg_catalog.<>) 0",
	1, {INT8OID}
};

static RpPlan bump_revision = {
	"UPDATE redpacket.activity SET revision = revision OPERATOR(pg_catalog.+) 1"
	" WHERE id OPERATOR(pg_catalog.=) $1 RETURNING revision",
	1, {INT8OID}
};

static RpPlan bump_stripes = {
	"UPDATE redpacket.stripe s SET revision = $2 WHERE s.activity_id OPERATOR(pg_catalog.=) $1",
	2, {INT8OID, INT8OID}
};

static RpPlan set_window = {
	"UPDATE redpacket.activity SET starts_at = $2, ends_at = $3,"
	"       revision = revision OPERATOR(pg_catalog.+) 1"
	" WHERE id OPERATOR(pg_catalog.=) $1 RETURNING revision",
	3, {INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

/* Today's funded total: the funding plus the top-ups less the withdrawals. */
static RpPlan funded_total = {
	"SELECT COALESCE(pg_catalog.sum(CASE WHEN l.kind OPERATOR(pg_catalog.=) 'withdraw'"
	"                                    THEN OPERATOR(pg_catalog.-) l.amount ELSE l.amount END), 0)"
	"  FROM redpacket.ledger l WHERE l.activity_id OPERATOR(pg_catalog.=) $1"
	"   AND l.kind OPERATOR(pg_catalog.=) ANY ('{fund,top_up,withdraw}')",
	1, {INT8OID}
};

/* What the stripes of the activity hold, and of it what is undealt. */
typedef struct Stripes
{
	int			n;
	int32	   *stripe;
	int64	   *balance;
	int64	   *undealt;		/* balance - dealt_units */
	int64	   *undealt_packets;	/* packets - dealt_count */
	int64		total;			/* sum of balance */
	int64		total_undealt;
	int64		total_packets;
	int64		total_undealt_packets;
} Stripes;

static void
ReadStripes(const RpActivity *act, Stripes *st)
{
	Datum		id = Int64GetDatum(act->id);

	if (RpExec(&read_stripes, &id, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the stripes of activity " INT64_FORMAT, act->id);
	st->n = (int) SPI_processed;
	st->stripe = palloc(sizeof(int32) * Max(st->n, 1));
	st->balance = palloc(sizeof(int64) * Max(st->n, 1));
	st->undealt = palloc(sizeof(int64) * Max(st->n, 1));
	st->undealt_packets = palloc(sizeof(int64) * Max(st->n, 1));
	st->total = st->total_undealt = st->total_packets = st->total_undealt_packets = 0;
	for (int i = 0; i < st->n; i++)
	{
		bool		isnull;
		int64		packets = RpGetInt64(i, ST_PACKETS, 0);

		st->stripe[i] = DatumGetInt32(RpGetDatum(i, ST_STRIPE, &isnull));
		st->balance[i] = RpGetInt64(i, ST_BALANCE, 0);
		st->undealt[i] = st->balance[i] - RpGetInt64(i, ST_DEALT_UNITS, 0);
		st->undealt_packets[i] = packets - DatumGetInt32(RpGetDatum(i, ST_DEALT_COUNT, &isnull));
		/* what a stripe holds fits in int64; the sums do, as the budget did */
		if (pg_add_s64_overflow(st->total, st->balance[i], &st->total))
			elog(ERROR, "the stripes of activity " INT64_FORMAT " hold more than 2^63 minor units",
				 act->id);
		st->total_undealt += st->undealt[i];
		st->total_packets += packets;
		st->total_undealt_packets += st->undealt_packets[i];
	}
}

/*
 * Add units[i] and packets[i] to the stripes (those with nothing to add are
 * left alone, unless they go to a new revision, revision > 0).
 */
static void
AdjustStripes(const RpActivity *act, const Stripes *st, const int64 *units,
			  const int32 *packets, int64 revision)
{
	Datum	   *ds = palloc(sizeof(Datum) * Max(st->n, 1));
	Datum	   *du = palloc(sizeof(Datum) * Max(st->n, 1));
	Datum	   *dp = palloc(sizeof(Datum) * Max(st->n, 1));
	int			m = 0;
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', revision > 0 ? ' ' : 'n'};

	for (int i = 0; i < st->n; i++)
	{
		if (units[i] == 0 && packets[i] == 0 && revision == 0)
			continue;
		ds[m] = Int32GetDatum(st->stripe[i]);
		du[m] = Int64GetDatum(units[i]);
		dp[m] = Int32GetDatum(packets[i]);
		m++;
	}
	values[0] = Int64GetDatum(act->id);
	values[1] = PointerGetDatum(construct_array(ds, m, INT4OID, 4, true, TYPALIGN_INT));
	values[2] = PointerGetDatum(construct_array(du, m, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[3] = PointerGetDatum(construct_array(dp, m, INT4OID, 4, true, TYPALIGN_INT));
	values[4] = Int64GetDatum(revision);
	if (RpExec(&adjust_stripes, values, nulls, false, 0) != SPI_OK_UPDATE || SPI_processed != m)
		elog(ERROR, "could not adjust the stripes of activity " INT64_FORMAT, act->id);
}

static int64
BumpRevision(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	if (RpExec(&bump_revision, &id, NULL, false, 1) != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not update activity " INT64_FORMAT, activity);
	return RpGetInt64(0, 1, 0);
}

static void
LockActivityRow(RpActivity *act)
{
	Datum		id = Int64GetDatum(act->id);

	if (RpExec(&lock_activity, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not lock activity " INT64_FORMAT, act->id);
	RpActivityFromRow(act->id, 1, act);
}

static void
RefuseSettled(const RpActivity *act, const char *func)
{
	if (act->closed)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is closed", act->id),
				 errdetail("It was closed or settled, and its remainder returned; %s changes a live activity.",
						   func)));
}

/*
 * The activity of a change, before its locks: P0002 when unknown, 55000
 * when closed (so the caller does not wait for locks to be refused).
 */
static void
ChangeBegin(int64 activity, const char *func, RpActivity *act)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(activity);
	(void) RpFetchActivity(activity, act, false);
	RefuseSettled(act, func);
}

/*
 * The activity as a walker holds it, kept to the end of the transaction
 * (locks.c); then the row as it is now, still open.
 */
static void
ChangeLock(RpActivity *act, const char *func)
{
	RpWalk(act);
	LockActivityRow(act);
	RefuseSettled(act, func);
	RpRefuseWrongBooks(act->id, func);
	RpCheckStripeRows(act);
}

static char *
Reason(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/*
 * Level down: take amount (at most the sum of avail) from the stripes with
 * the most available first, so that they end as even as possible.
 * take[i] <= avail[i]; avail[i] >= 0.
 */
static int
CompareAvailDesc(const void *a, const void *b, void *arg)
{
	const int64 *avail = arg;
	int64		x = avail[*(const int *) a];
	int64		y = avail[*(const int *) b];

	return (x < y) - (x > y);
}

static void
LevelDown(int n, const int64 *avail, int64 amount, int64 *take)
{
	int		   *order;
	int64		sum = 0;
	int64		keep;
	int			k;

	memset(take, 0, sizeof(int64) * n);
	if (amount <= 0 || n == 0)
		return;
	order = palloc(sizeof(int) * n);
	for (int i = 0; i < n; i++)
		order[i] = i;
	qsort_arg(order, n, sizeof(int), CompareAvailDesc, (void *) avail);

	/*
	 * The k richest come down to a common level, no lower than the next
	 * one's: the least k whose excess over the next covers the amount.
	 * k * next <= sum of the k richest, which fits (the budget did).
	 */
	for (k = 1; k <= n; k++)
	{
		int64		next = k < n ? avail[order[k]] : 0;

		sum += avail[order[k - 1]];
		if (sum - next * k >= amount)
			break;
	}
	if (k > n)
		elog(ERROR, "cannot take " INT64_FORMAT " minor units from %d stripes holding " INT64_FORMAT,
			 amount, n, sum);
	keep = sum - amount;
	for (int i = 0; i < k; i++)
		take[order[i]] = avail[order[i]] - (keep / k + (i < keep % k ? 1 : 0));
	pfree(order);
}

/*
 * The withdrawal's take from each stripe: first from what each stripe has
 * beyond one undealt unit per undealt packet (a capped activity), evenly;
 * then, if the stripes that have more must make up for those that have
 * less, from the rest of the undealt money.  The caller checked that
 * amount <= total_undealt - total_undealt_packets (capped) or total_undealt.
 */
static void
PlanWithdraw(const Stripes *st, bool capped, int64 amount, int64 *take)
{
	int64	   *avail = palloc(sizeof(int64) * Max(st->n, 1));
	int64	   *more = palloc(sizeof(int64) * Max(st->n, 1));
	int64		taken = 0;

	for (int i = 0; i < st->n; i++)
		avail[i] = Max(st->undealt[i] - (capped ? Max(st->undealt_packets[i], 0) : 0), 0);
	for (int i = 0; i < st->n; i++)
		taken += avail[i];
	LevelDown(st->n, avail, Min(amount, taken), take);
	if (amount > taken)
	{
		for (int i = 0; i < st->n; i++)
			avail[i] = Max(st->undealt[i] - take[i], 0);
		LevelDown(st->n, avail, amount - taken, more);
		for (int i = 0; i < st->n; i++)
			take[i] += more[i];
	}
}

static Datum
FundedTotal(int64 activity)
{
	Datum		id = Int64GetDatum(activity);
	bool		isnull;

	if (RpExec(&funded_total, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the ledger of activity " INT64_FORMAT, activity);
	return SPI_datumTransfer(RpGetDatum(0, 1, &isnull), false, -1);
}

/*
 * rp_top_up(activity, amount, packets DEFAULT NULL, reason DEFAULT NULL):
 * both spread evenly over the stripes (the first ones take the remainders),
 * as at creation; returns the new funded total.
 */
Datum
rp_top_up(PG_FUNCTION_ARGS)
{
	RpActivity	act;
	int64		units;
	int32		packets = 0;
	Stripes		st;
	int64	   *add_units;
	int32	   *add_packets;
	int64		revision = 0;
	char	   *before;
	char	   *reason = Reason(fcinfo, 3);
	Datum		funded;
	int64		unit;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "amount");
	ChangeBegin(PG_GETARG_INT64(0), "rp_top_up", &act);
	units = RpAmountToUnits(PG_GETARG_NUMERIC(1), act.scale, "amount");
	if (act.packets != 0 && PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("packets is required for activity " INT64_FORMAT, act.id),
				 errdetail("The activity caps its packets: say how many the top-up adds to the cap."),
				 errhint("Pass packets => 0 to add money only.")));
	if (act.packets == 0 && !PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("packets must be NULL for activity " INT64_FORMAT, act.id),
				 errdetail("The activity has no packet cap to add to.")));
	if (!PG_ARGISNULL(2))
	{
		packets = PG_GETARG_INT32(2);
		if (packets < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("packets must not be negative"),
					 errdetail("Got %d.", packets)));
		if (packets > units)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("amount is too small for %d more packets", packets),
					 errdetail("Every packet a top-up adds brings at least one minor unit of it: this one adds " INT64_FORMAT ".",
							   units)));
	}

	if (RpActivitySplit(&act, &unit) == RP_SPLIT_EQUAL && units != unit * packets)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("amount must be %d equal packets of activity " INT64_FORMAT, packets, act.id),
				 errdetail("The activity pays every packet %s.",
						   DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(RpUnitsToAmount(unit, act.scale))))),
				 errhint("Top up a multiple of the packet with as many packets.")));

	ChangeLock(&act, "rp_top_up");
	ReadStripes(&act, &st);
	if (st.total > PG_INT64_MAX - units || st.total_packets > PG_INT32_MAX - packets)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("the top-up would take activity " INT64_FORMAT " out of range", act.id),
				 errdetail("What an activity holds must fit in 64-bit minor units and 2^31 - 1 packets.")));
	if (act.packets != 0 && st.total_undealt + units < st.total_undealt_packets + packets)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("amount is too small for %d more packets", packets),
				 errdetail("Every packet keeps at least one minor unit: activity " INT64_FORMAT " would hold " INT64_FORMAT " minor units for " INT64_FORMAT " packets.",
						   act.id, st.total_undealt + units, st.total_undealt_packets + packets)));

	before = RpActivityState(act.id, RP_MONEY_FIELDS);
	add_units = palloc(sizeof(int64) * Max(st.n, 1));
	add_packets = palloc(sizeof(int32) * Max(st.n, 1));
	for (int i = 0; i < st.n; i++)
	{
		add_packets[i] = packets / st.n + (i < packets % st.n ? 1 : 0);
		add_units[i] = unit > 0 ? unit * add_packets[i] : units / st.n + (i < units % st.n ? 1 : 0);
	}
	if (packets > 0)
		revision = BumpRevision(act.id);	/* the cap changed */
	AdjustStripes(&act, &st, add_units, add_packets, revision);
	RpInsertLedger(act.id, "top_up", units, act.scale, packets, reason ? reason : "topped up");
	RpRecordChange(act.id, "top_up", before, RpActivityState(act.id, RP_MONEY_FIELDS), reason);
	funded = FundedTotal(act.id);
	SPI_finish();
	PG_RETURN_DATUM(funded);
}

/*
 * The most a withdrawal may take: the money less a minor unit for each
 * packet (capped), of the undealt part only or of all of it.
 */
static int64
Withdrawable(const Stripes *st, bool capped, bool with_dealt)
{
	if (with_dealt)
		return st->total - (capped ? st->total_packets : 0);
	return st->total_undealt - (capped ? st->total_undealt_packets : 0);
}

static void
Undeal(const RpActivity *act)
{
	Datum		id = Int64GetDatum(act->id);

	if (RpExec(&undeal, &id, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not update the stripes of activity " INT64_FORMAT, act->id);
}

/*
 * rp_withdraw(activity, amount, reason DEFAULT NULL): back to the funder;
 * returns the remaining budget.
 */
Datum
rp_withdraw(PG_FUNCTION_ARGS)
{
	RpActivity	act;
	int64		units;
	Stripes		st;
	bool		capped;
	int64	   *take;
	char	   *before;
	char	   *reason = Reason(fcinfo, 2);
	int64		remaining;
	int64		unit;

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "amount");
	ChangeBegin(PG_GETARG_INT64(0), "rp_withdraw", &act);
	units = RpAmountToUnits(PG_GETARG_NUMERIC(1), act.scale, "amount");
	if (RpActivitySplit(&act, &unit) == RP_SPLIT_EQUAL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot withdraw from activity " INT64_FORMAT, act.id),
				 errdetail("The activity pays equal packets: every packet left keeps its share."),
				 errhint("Close the activity to return what is left to the funder.")));

	ChangeLock(&act, "rp_withdraw");
	capped = act.packets != 0;
	ReadStripes(&act, &st);
	if (units > Withdrawable(&st, capped, true))
	{
		char	   *most = DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(RpUnitsToAmount(Max(Withdrawable(&st, capped, true), 0), act.scale))));

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot withdraw %s from activity " INT64_FORMAT,
						DatumGetCString(DirectFunctionCall1(numeric_out, PG_GETARG_DATUM(1))), act.id),
				 capped ?
				 errdetail("At most %s can be withdrawn: the remaining budget less one minor unit for each of its " INT64_FORMAT " remaining packets.",
						   most, st.total_packets) :
				 errdetail("At most %s can be withdrawn: the remaining budget.", most)));
	}
	if (units > Withdrawable(&st, capped, false))
	{
		Undeal(&act);
		ReadStripes(&act, &st);
	}

	before = RpActivityState(act.id, RP_MONEY_FIELDS);
	take = palloc(sizeof(int64) * Max(st.n, 1));
	PlanWithdraw(&st, capped, units, take);
	for (int i = 0; i < st.n; i++)
		take[i] = -take[i];
	AdjustStripes(&act, &st, take, palloc0(sizeof(int32) * Max(st.n, 1)), 0);
	RpInsertLedger(act.id, "withdraw", units, act.scale, 0, reason ? reason : "withdrawn");
	RpRecordChange(act.id, "withdraw", before, RpActivityState(act.id, RP_MONEY_FIELDS), reason);
	remaining = st.total - units;
	SPI_finish();
	PG_RETURN_NUMERIC(RpUnitsToAmount(remaining, act.scale));
}

/*
 * rp_set_window(activity, starts_at, ends_at, reason DEFAULT NULL): ends_at
 * NULL is no end.  Bumps the revision of the activity and of every stripe,
 * so that claims that keep the old schedule read it again.
 */
Datum
rp_set_window(PG_FUNCTION_ARGS)
{
	RpActivity	act;
	TimestampTz starts_at;
	TimestampTz ends_at;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', PG_ARGISNULL(2) ? 'n' : ' '};
	char	   *before;
	char	   *reason = Reason(fcinfo, 3);
	Datum		v[2];

	RpNoNull(PG_ARGISNULL(0), "activity");
	RpNoNull(PG_ARGISNULL(1), "starts_at");
	starts_at = PG_GETARG_TIMESTAMPTZ(1);
	ends_at = PG_ARGISNULL(2) ? DT_NOEND : PG_GETARG_TIMESTAMPTZ(2);
	if (!PG_ARGISNULL(2) && ends_at <= starts_at)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ends_at must be after starts_at")));
	ChangeBegin(PG_GETARG_INT64(0), "rp_set_window", &act);
	ChangeLock(&act, "rp_set_window");
	if (act.starts_at == starts_at && act.ends_at == ends_at)
	{
		SPI_finish();			/* nothing changes */
		PG_RETURN_VOID();
	}

	before = RpActivityState(act.id, RP_WINDOW_FIELDS);
	values[0] = Int64GetDatum(act.id);
	values[1] = TimestampTzGetDatum(starts_at);
	values[2] = TimestampTzGetDatum(ends_at);
	if (RpExec(&set_window, values, nulls, false, 1) != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
		elog(ERROR, "could not update activity " INT64_FORMAT, act.id);
	v[0] = Int64GetDatum(act.id);
	v[1] = Int64GetDatum(RpGetInt64(0, 1, 0));
	if (RpExec(&bump_stripes, v, NULL, false, 0) != SPI_OK_UPDATE || SPI_processed != act.stripes)
		elog(ERROR, "could not update the stripes of activity " INT64_FORMAT, act.id);
	RpRecordChange(act.id, "set_window", before, RpActivityState(act.id, RP_WINDOW_FIELDS), reason);
	SPI_finish();
	PG_RETURN_VOID();
}
