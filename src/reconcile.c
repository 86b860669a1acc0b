/*
 * reconcile.c
 *		The reconciliation pass, shared by rp_reconcile() and the background
 *		worker (RpWorkerPass).  For each activity, while it holds every stripe
 *		lock of that activity (so no claim is in flight and what it reads is one
 *		consistent state), it proves the ledger identity
 *		funded - returned - sum(claims) = sum(stripe balances), the packet
 *		identity, the claim count, that no stripe is negative, and that a
 *		closed activity is empty.  It is incremental: a per-activity watermark
 *		keeps the running sums of claims already checked, so a pass reads only
 *		claims newer than the last one.  Claim ids come from an uncached
 *		sequence and are drawn under a stripe lock, so every claim committed
 *		after the pass has a larger id than the watermark.  The same pass
 *		settles expired activities.
 *
 * What a pass never does: act on an activity it cannot fully see (stripe
 * rows missing, no funding entry, no state row, a sequence behind the ids in
 * its table: what a restore in progress looks like), write anything while a
 * restore is announced (RpRestoring), hold the stripe locks of more than a
 * constant number of stripes, or stop at the first activity whose check
 * raises an error (each activity is checked in a subtransaction; the error
 * is recorded and the pass goes on).
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_reconcile);

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

/* Longest error message kept in a NOTIFY payload (payloads stop at 8000 bytes). */
#define RP_ALERT_ERROR_MAX 1000

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

/*
 * Can the pass see the whole activity?  Every stripe row, the funding
 * entry, the state row, and sequences ahead of the ids in their tables (a
 * restore sets sequences only after all data, so a sequence behind means a
 * restore is under way, and an insert now could collide with its rows).
 */
static RpPlan completeness = {
	"SELECT (SELECT pg_catalog.count(*) FROM redpacket.stripe s"
	"         WHERE s.activity_id OPERATOR(pg_catalog.=) $1),"
	"       EXISTS (SELECT FROM redpacket.ledger l WHERE l.activity_id OPERATOR(pg_catalog.=) $1"
	"                  AND l.kind OPERATOR(pg_catalog.=) 'fund'),"
	"       EXISTS (SELECT FROM redpacket.reconcile_state r"
	"                WHERE r.activity_id OPERATOR(pg_catalog.=) $1),"
	"       COALESCE((SELECT pg_catalog.max(c.claim_id) FROM redpacket.claim c"
	"                  WHERE c.activity_id OPERATOR(pg_catalog.=) $1)"
	"                OPERATOR(pg_catalog.>) COALESCE(pg_catalog.pg_sequence_last_value("
	"                   'redpacket.claim_id_seq'::pg_catalog.regclass), 0), false),"
	"       COALESCE((SELECT pg_catalog.max(l.entry_id) FROM redpacket.ledger l"
	"                  WHERE l.activity_id OPERATOR(pg_catalog.=) $1)"
	"                OPERATOR(pg_catalog.>) COALESCE(pg_catalog.pg_sequence_last_value("
	"                   'redpacket.ledger_entry_id_seq'::pg_catalog.regclass), 0), false),"
	"       COALESCE((SELECT pg_catalog.max(x.pass_id) FROM redpacket.reconciliation x"
	"                  WHERE x.activity_id OPERATOR(pg_catalog.=) $1)"
	"                OPERATOR(pg_catalog.>) COALESCE(pg_catalog.pg_sequence_last_value("
	"                   'redpacket.reconciliation_pass_id_seq'::pg_catalog.regclass), 0), false)",
	1, {INT8OID}
};

/* Only an explicit full check of one named activity recreates a lost state row. */
static RpPlan recreate_state = {
	"INSERT INTO redpacket.reconcile_state (activity_id) VALUES ($1)"
	" ON CONFLICT (activity_id) DO NOTHING",
	1, {INT8OID}
};

static RpPlan read_state = {
	"SELECT r.last_claim_id, r.claimed, r.claim_count FROM redpacket.reconcile_state r"
	" WHERE r.activity_id OPERATOR(pg_catalog.=) $1",
	1, {INT8OID}
};

/*
 * One statement computes the whole check from the watermark ($2, $3, $4:
 * last claim id, claimed sum and claim count up to it).  $5: the 1.1 rules
 * for a closed activity (every stripe empty, packets expected 0, the return
 * equal to funded - claims); under a 1.0 catalog a closed activity settled
 * by 1.0, whose stripes kept their packet counts, is accepted too.
 */
enum
{
	CK_EXPECTED = 1, CK_ACTUAL, CK_EXP_PACKETS, CK_ACT_PACKETS, CK_EXP_CLAIMS,
	CK_ACT_CLAIMS, CK_NEGATIVE, CK_NEW_CLAIMS, CK_LAST_ID, CK_CLAIMED,
	CK_BALANCE_UNITS, CK_NOT_EMPTY, CK_NONEMPTY_STRIPES, CK_RETURNED, CK_RETURN_DUE
};

static RpPlan check = {
	"WITH l AS (SELECT COALESCE(pg_catalog.sum(x.amount) FILTER"
	"                     (WHERE x.kind OPERATOR(pg_catalog.=) 'fund'), 0) AS funded,"
	"                  pg_catalog.sum(x.amount) FILTER"
	"                     (WHERE x.kind OPERATOR(pg_catalog.=) 'return') AS returned"
	"             FROM redpacket.ledger x WHERE x.activity_id OPERATOR(pg_catalog.=) $1),"
	"     c AS (SELECT COALESCE(pg_catalog.sum(x.amount), 0) AS amount, pg_catalog.count(*) AS n,"
	"                  COALESCE(pg_catalog.max(x.claim_id), $2) AS last_id"
	"             FROM redpacket.claim x WHERE x.activity_id OPERATOR(pg_catalog.=) $1"
	"              AND x.claim_id OPERATOR(pg_catalog.>) $2),"
	"     s AS (SELECT COALESCE(pg_catalog.sum(x.balance), 0) AS balance,"
	"                  pg_catalog.sum(x.packets) AS packets,"
	"                  COALESCE(pg_catalog.sum(x.claims), 0)::pg_catalog.int8 AS claims,"
	"                  pg_catalog.count(*) FILTER (WHERE x.balance OPERATOR(pg_catalog.<) 0"
	"                                          OR x.packets OPERATOR(pg_catalog.<) 0) AS negative,"
	"                  pg_catalog.count(*) FILTER (WHERE x.balance OPERATOR(pg_catalog.<>) 0"
	"                                          OR x.packets OPERATOR(pg_catalog.<>) 0) AS nonempty"
	"             FROM redpacket.stripe x WHERE x.activity_id OPERATOR(pg_catalog.=) $1),"
	"     t AS (SELECT $3 OPERATOR(pg_catalog.+) c.amount AS claimed,"
	"                  $4 OPERATOR(pg_catalog.+) c.n AS claims FROM c)"
	" SELECT l.funded OPERATOR(pg_catalog.-) COALESCE(l.returned, 0)"
	"                 OPERATOR(pg_catalog.-) t.claimed,"
	"        pg_catalog.round(s.balance OPERATOR(pg_catalog./)"
	"                         pg_catalog.power(10::pg_catalog.numeric, a.scale::pg_catalog.numeric),"
	"                         a.scale),"
	"        CASE WHEN a.packets IS NULL THEN NULL"
	"             WHEN a.closed_at IS NOT NULL AND ($5 OR s.packets OPERATOR(pg_catalog.=) 0) THEN 0"
	"             ELSE a.packets OPERATOR(pg_catalog.-) t.claims END,"
	"        s.packets::pg_catalog.int8,"
	"        t.claims, s.claims, s.negative, c.n, c.last_id, t.claimed, s.balance,"
	"        $5 AND a.closed_at IS NOT NULL"
	"           AND (s.nonempty OPERATOR(pg_catalog.<>) 0 OR l.returned IS NULL"
	"                OR l.returned OPERATOR(pg_catalog.<>) (l.funded OPERATOR(pg_catalog.-) t.claimed)),"
	"        s.nonempty, l.returned, l.funded OPERATOR(pg_catalog.-) t.claimed"
	"   FROM redpacket.activity a, l, c, s, t WHERE a.id OPERATOR(pg_catalog.=) $1",
	5, {INT8OID, INT8OID, NUMERICOID, INT8OID, BOOLOID}
};

#define RP_RECORD_COLUMNS \
	"(activity_id, checked_at, full_check, expected, actual, drift," \
	" expected_packets, actual_packets, expected_claims, actual_claims," \
	" negative_stripes, new_claims, ok"
#define RP_RECORD_VALUES \
	" VALUES ($1, $2, $3, $4, $5, $5 OPERATOR(pg_catalog.-) $4, $6, $7, $8, $9, $10, $11, $12"

static RpPlan record_10 = {
	"INSERT INTO redpacket.reconciliation " RP_RECORD_COLUMNS ")" RP_RECORD_VALUES ")"
	" RETURNING *",
	12, {INT8OID, TIMESTAMPTZOID, BOOLOID, NUMERICOID, NUMERICOID, INT8OID, INT8OID,
	INT8OID, INT8OID, INT4OID, INT8OID, BOOLOID}
};

static RpPlan record_11 = {
	"INSERT INTO redpacket.reconciliation " RP_RECORD_COLUMNS ", problems, error)"
	RP_RECORD_VALUES ", $13, $14)"
	" RETURNING *",
	14, {INT8OID, TIMESTAMPTZOID, BOOLOID, NUMERICOID, NUMERICOID, INT8OID, INT8OID,
	INT8OID, INT8OID, INT4OID, INT8OID, BOOLOID, TEXTARRAYOID, TEXTOID}
};

#define RP_ADVANCE \
	"UPDATE redpacket.reconcile_state" \
	"   SET last_claim_id = $2, claimed = $3, claim_count = $4, settled = $5," \
	"       last_pass_at = $6, last_balance = $7, last_packets = $8, last_claims = $9"

static RpPlan advance_10 = {
	RP_ADVANCE " WHERE activity_id OPERATOR(pg_catalog.=) $1",
	10, {INT8OID, INT8OID, NUMERICOID, INT8OID, BOOLOID, TIMESTAMPTZOID, NUMERICOID,
	INT8OID, INT8OID, BOOLOID}
};

static RpPlan advance_11 = {
	RP_ADVANCE ", last_full_check_at = CASE WHEN $10 THEN $6 ELSE last_full_check_at END"
	" WHERE activity_id OPERATOR(pg_catalog.=) $1",
	10, {INT8OID, INT8OID, NUMERICOID, INT8OID, BOOLOID, TIMESTAMPTZOID, NUMERICOID,
	INT8OID, INT8OID, BOOLOID}
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

/* The problems a check can name (reconciliation.problems). */
typedef enum RpProblem
{
	RP_PROBLEM_MONEY,
	RP_PROBLEM_PACKETS,
	RP_PROBLEM_CLAIMS,
	RP_PROBLEM_NEGATIVE,
	RP_PROBLEM_NOT_EMPTY,
	RP_PROBLEM_INCOMPLETE,
	RP_PROBLEM_ERROR,
	RP_NPROBLEMS
} RpProblem;

static const char *const problem_names[RP_NPROBLEMS] = {
	"money", "packets", "claims", "negative", "not_empty", "incomplete", "error"
};

/* What one check of one activity found. */
typedef struct RpCheck
{
	int64		activity;
	bool		full;
	TimestampTz checked_at;
	bool		failed[RP_NPROBLEMS];
	bool		ok;
	bool		frozen;			/* the activity is frozen after this check */
	bool		froze;			/* this check froze it (wrote activity and stripes) */
	bool		recorded;		/* a reconciliation row was written */
	int64		pass_id;
	Datum		expected;		/* numeric; everything below only after a check */
	Datum		actual;
	bool		has_packets;
	int64		expected_packets;
	int64		actual_packets;
	int64		expected_claims;
	int64		actual_claims;
	int64		negative;
	int64		new_claims;
	int64		nonempty;
	Datum		returned;		/* numeric; 0 when no return entry */
	Datum		return_due;
	int64		last_id;		/* the watermark for the next pass: */
	Datum		claimed;		/* numeric */
	Datum		balance_units;	/* numeric */
	bool		packets_null;	/* actual_packets is NULL */
	char	   *detail;			/* incomplete: what is missing; error: the message */
	HeapTuple	row;			/* for rp_reconcile's result, or NULL */
} RpCheck;

/* A pass over a list of activities. */
typedef struct RpPass
{
	bool		one;			/* an explicit check of one named activity */
	bool		repair;			/* an explicit full check of one activity */
	int			kept_locks;		/* stripe locks this pass keeps until the transaction ends */
	int			checked;
	int			failures;
	bool		budget_stop;	/* the lock budget left activities pending */
	Tuplestorestate *out;
	TupleDesc	outdesc;
} RpPass;

static char *
NumText(Datum n)
{
	return DatumGetCString(DirectFunctionCall1(numeric_out, n));
}

static Datum
CopyNumeric(int col)
{
	bool		isnull;
	Datum		d = RpGetDatum(0, col, &isnull);

	return isnull ? NumericGetDatum(int64_to_numeric(0)) : datumCopy(d, false, -1);
}

/*
 * Read the completeness of an activity; returns NULL when the pass may act
 * on it, else a sentence saying what it cannot see.  With repair, a lost
 * state row is recreated (with a WARNING) instead.
 */
static char *
Incomplete(const RpActivity *act, bool repair)
{
	Datum		id = Int64GetDatum(act->id);
	StringInfoData why;
	int64		rows;
	bool		isnull;

	if (RpExec(&completeness, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the completeness of activity " INT64_FORMAT, act->id);
	initStringInfo(&why);
	rows = RpGetInt64(0, 1, 0);
	if (rows != act->stripes)
		appendStringInfo(&why, " It has " INT64_FORMAT " of its %d stripe rows.", rows, act->stripes);
	if (!DatumGetBool(RpGetDatum(0, 2, &isnull)))
		appendStringInfoString(&why, " It has no funding entry in the ledger.");
	if (DatumGetBool(RpGetDatum(0, 4, &isnull)))
		appendStringInfoString(&why, " Its claim ids are ahead of redpacket.claim_id_seq.");
	if (DatumGetBool(RpGetDatum(0, 5, &isnull)))
		appendStringInfoString(&why, " Its ledger entry ids are ahead of redpacket.ledger_entry_id_seq.");
	if (DatumGetBool(RpGetDatum(0, 6, &isnull)))
		appendStringInfoString(&why, " Its pass ids are ahead of redpacket.reconciliation_pass_id_seq.");
	if (!DatumGetBool(RpGetDatum(0, 3, &isnull)))
	{
		if (why.len == 0 && repair)
		{
			ereport(WARNING,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("activity " INT64_FORMAT " had no reconciliation state", act->id),
					 errdetail("The state row was recreated and this check re-sums every claim.")));
			if (RpExec(&recreate_state, &id, NULL, false, 0) != SPI_OK_INSERT)
				elog(ERROR, "could not recreate reconciliation state");
		}
		else
			appendStringInfoString(&why, " It has no reconcile_state row.");
	}
	return why.len > 0 ? why.data + 1 : NULL;
}

/* Run the check statement from the watermark and fill *c from its row. */
static void
RunCheck(RpCheck *c, bool strict_closed)
{
	Datum		v[5];
	bool		isnull;
	Datum		d;

	v[0] = Int64GetDatum(c->activity);
	v[1] = Int64GetDatum(0);
	v[2] = NumericGetDatum(int64_to_numeric(0));
	v[3] = Int64GetDatum(0);
	v[4] = BoolGetDatum(strict_closed);
	if (!c->full)
	{
		if (RpExec(&read_state, v, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not read reconciliation state of activity " INT64_FORMAT, c->activity);
		v[1] = Int64GetDatum(RpGetInt64(0, 1, 0));
		v[2] = CopyNumeric(2);
		v[3] = Int64GetDatum(RpGetInt64(0, 3, 0));
	}
	if (RpExec(&check, v, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reconciliation check of activity " INT64_FORMAT " returned no row", c->activity);

	c->expected = CopyNumeric(CK_EXPECTED);
	c->actual = CopyNumeric(CK_ACTUAL);
	d = RpGetDatum(0, CK_EXP_PACKETS, &isnull);
	c->has_packets = !isnull;
	c->expected_packets = isnull ? 0 : DatumGetInt64(d);
	c->actual_packets = RpGetInt64(0, CK_ACT_PACKETS, 0);
	c->expected_claims = RpGetInt64(0, CK_EXP_CLAIMS, 0);
	c->actual_claims = RpGetInt64(0, CK_ACT_CLAIMS, 0);
	c->negative = RpGetInt64(0, CK_NEGATIVE, 0);
	c->new_claims = RpGetInt64(0, CK_NEW_CLAIMS, 0);
	c->nonempty = RpGetInt64(0, CK_NONEMPTY_STRIPES, 0);
	c->returned = CopyNumeric(CK_RETURNED);
	c->return_due = CopyNumeric(CK_RETURN_DUE);
	c->last_id = RpGetInt64(0, CK_LAST_ID, 0);
	c->claimed = CopyNumeric(CK_CLAIMED);
	c->balance_units = CopyNumeric(CK_BALANCE_UNITS);

	c->failed[RP_PROBLEM_MONEY] = !DatumGetBool(DirectFunctionCall2(numeric_eq, c->expected, c->actual));
	(void) RpGetDatum(0, CK_ACT_PACKETS, &isnull);
	c->packets_null = isnull;
	c->failed[RP_PROBLEM_PACKETS] = c->has_packets
		? (isnull || c->expected_packets != c->actual_packets) : !isnull;
	c->failed[RP_PROBLEM_CLAIMS] = c->expected_claims != c->actual_claims;
	c->failed[RP_PROBLEM_NEGATIVE] = c->negative != 0;
	c->failed[RP_PROBLEM_NOT_EMPTY] = DatumGetBool(RpGetDatum(0, CK_NOT_EMPTY, &isnull));
}

/* reconciliation.problems of a check: the names of what failed. */
static Datum
ProblemsArray(const RpCheck *c)
{
	Datum		names[RP_NPROBLEMS];
	int			n = 0;

	for (int p = 0; p < RP_NPROBLEMS; p++)
		if (c->failed[p])
			names[n++] = CStringGetTextDatum(problem_names[p]);
	return PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * Write the reconciliation row of a check (or of an error, when the check
 * could not run) and keep a copy of it for rp_reconcile's result.
 */
static void
RecordCheck(RpCheck *c, bool v11)
{
	bool		error = c->failed[RP_PROBLEM_ERROR];
	Datum		v[14];
	char		n[14];

	memset(n, error ? 'n' : ' ', sizeof(n));
	v[0] = Int64GetDatum(c->activity);
	v[1] = TimestampTzGetDatum(c->checked_at);
	v[2] = BoolGetDatum(c->full);
	v[3] = c->expected;
	v[4] = c->actual;
	v[5] = Int64GetDatum(c->expected_packets);
	v[6] = Int64GetDatum(c->actual_packets);
	v[7] = Int64GetDatum(c->expected_claims);
	v[8] = Int64GetDatum(c->actual_claims);
	v[9] = Int32GetDatum((int32) c->negative);
	v[10] = Int64GetDatum(c->new_claims);
	v[11] = BoolGetDatum(c->ok);
	v[12] = ProblemsArray(c);
	v[13] = c->detail ? CStringGetTextDatum(c->detail) : (Datum) 0;
	n[0] = n[1] = n[2] = n[11] = n[12] = ' ';
	n[13] = c->detail ? ' ' : 'n';
	if (!error && !c->has_packets)
		n[5] = 'n';
	if (!error && c->packets_null)
		n[6] = 'n';
	if (RpExec(v11 ? &record_11 : &record_10, v, n, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not record reconciliation");
	c->recorded = true;
	c->pass_id = RpGetInt64(0, 2, 0);
	c->row = SPI_copytuple(SPI_tuptable->vals[0]);
}

/* Advance the watermark to what this check read, and remember the stripe sums. */
static void
Advance(const RpCheck *c, bool settled, bool v11)
{
	Datum		v[10];
	char		n[10];

	memset(n, ' ', sizeof(n));
	v[0] = Int64GetDatum(c->activity);
	v[1] = Int64GetDatum(c->last_id);
	v[2] = c->claimed;
	v[3] = Int64GetDatum(c->expected_claims);
	v[4] = BoolGetDatum(settled);
	v[5] = TimestampTzGetDatum(c->checked_at);
	v[6] = c->balance_units;
	v[7] = Int64GetDatum(c->actual_packets);
	n[7] = c->packets_null ? 'n' : ' ';
	v[8] = Int64GetDatum(c->actual_claims);
	v[9] = BoolGetDatum(c->full);
	if (RpExec(v11 ? &advance_11 : &advance_10, v, n, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not advance reconciliation state");
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
	bool		measured = !c->failed[RP_PROBLEM_ERROR] && !c->failed[RP_PROBLEM_INCOMPLETE];

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
			appendStringInfo(&s, "%s\"%s\"", n++ ? "," : "", problem_names[p]);
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

/* WARNING, NOTIFY and (for a failed check, when configured) the freeze. */
static void
Alert(RpCheck *c, const RpActivity *act)
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
		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("redpacket reconciliation of activity " INT64_FORMAT " failed", c->activity),
				 errdetail("%s", what.data),
				 errhint("The activity is frozen when redpacket.freeze_on_mismatch is on; investigate, then call redpacket.rp_unfreeze.")));
	}
	Async_Notify("redpacket_alert", AlertPayload(c));
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
	bool		settled;
	bool		wrote = false;
	RpActivity	locked;

	RpWaitAllStripes(act);
	/* the schedule under the locks: rp_set_window may have moved the end */
	(void) RpFetchActivity(act->id, &locked, false);
	settled = locked.closed;
	c->checked_at = GetCurrentTimestamp();
	c->detail = Incomplete(act, pass->repair && c->full);
	if (c->detail != NULL)
	{
		c->failed[RP_PROBLEM_INCOMPLETE] = true;
		c->ok = false;
	}
	else
	{
		/* settle an activity whose time is up (exactly once: see RpSettle) */
		if (!locked.closed && locked.ends_at <= GetCurrentTransactionStartTimestamp())
		{
			(void) RpSettle(act, "expired");
			settled = wrote = true;
		}
		RunCheck(c, v11);
		c->ok = true;
		for (int p = 0; p < RP_NPROBLEMS; p++)
			c->ok = c->ok && !c->failed[p];
		RecordCheck(c, v11);
		Advance(c, settled, v11);
	}
	if (!c->ok)
	{
		Alert(c, act);
		wrote = wrote || c->froze;
	}
	if (wrote)
		return act->stripes;
	for (int s = 0; s < act->stripes; s++)
		RpUnlock(RP_LOCK_STRIPE, act->id, (uint32) s);
	return 0;
}

/*
 * A row for rp_reconcile's result that was not written to the table (an
 * incomplete activity, or an error under which nothing could be written).
 */
static HeapTuple
UnrecordedRow(const RpCheck *c, TupleDesc desc)
{
	Datum	   *v = palloc0(sizeof(Datum) * desc->natts);
	bool	   *n = palloc(sizeof(bool) * desc->natts);

	for (int i = 0; i < desc->natts; i++)
	{
		const char *name = NameStr(TupleDescAttr(desc, i)->attname);

		n[i] = false;
		if (strcmp(name, "activity_id") == 0)
			v[i] = Int64GetDatum(c->activity);
		else if (strcmp(name, "checked_at") == 0)
			v[i] = TimestampTzGetDatum(c->checked_at);
		else if (strcmp(name, "full_check") == 0)
			v[i] = BoolGetDatum(c->full);
		else if (strcmp(name, "ok") == 0)
			v[i] = BoolGetDatum(false);
		else if (strcmp(name, "problems") == 0)
			v[i] = ProblemsArray(c);
		else if (strcmp(name, "error") == 0 && c->detail)
			v[i] = CStringGetTextDatum(c->detail);
		else
			n[i] = true;
	}
	return heap_form_tuple(desc, v, n);
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
		RecordCheck(st->c, true);
	Alert(st->c, st->act);
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
			c->row = UnrecordedRow(c, pass->outdesc);
		if (c->row != NULL)
			tuplestore_puttuple(pass->out, c->row);
	}
	return true;
}

/*
 * The activities a pass over all visits, with whether each gets a full
 * check; allocated in cxt (SPI calls leave CurrentMemoryContext at SPI's).
 */
static int
ListPending(bool full_all, TimestampTz full_before, Datum full_share,
			MemoryContext cxt, int64 **ids, bool **full)
{
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
	*ids = MemoryContextAlloc(cxt, sizeof(int64) * Max(count, 1));
	*full = MemoryContextAlloc(cxt, sizeof(bool) * Max(count, 1));
	for (int i = 0; i < count; i++)
	{
		bool		isnull;

		(*ids)[i] = RpGetInt64(i, 1, 0);
		(*full)[i] = DatumGetBool(RpGetDatum(i, 2, &isnull));
	}
	return count;
}

/* Overwrite the reconciler's status row (1.1) after a pass over all. */
static void
RecordPass(TimestampTz started, const RpPass *pass)
{
	TimestampTz finished = GetCurrentTimestamp();
	Datum		v[5];

	if (RpCatalogVersion() < RP_CATALOG_1_1)
		return;
	v[0] = TimestampTzGetDatum(started);
	v[1] = TimestampTzGetDatum(finished);
	v[2] = DirectFunctionCall2(numeric_div,
							   NumericGetDatum(int64_to_numeric(finished - started)),
							   NumericGetDatum(int64_to_numeric(1000)));
	v[3] = Int32GetDatum(pass->checked);
	v[4] = Int32GetDatum(pass->failures);
	if (RpExec(&pass_status, v, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not record the reconciliation pass");
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
int
RpReconcilePass(const int64 *activity, bool full_check, Tuplestorestate *out, TupleDesc desc)
{
	RpPass		pass = {0};
	TimestampTz started = GetCurrentTimestamp();
	int64	   *ids;
	bool	   *full;
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

	pass.out = out;
	pass.outdesc = desc;
	if (kept_lxid != MyProc->lxid)
	{
		kept_lxid = MyProc->lxid;
		kept_in_xact = 0;
	}
	if (activity != NULL)
	{
		RequireLockBudget(*activity);
		pass.one = true;
		pass.repair = full_check;
		(void) ReconcileGuarded(*activity, full_check, &pass);
		kept_in_xact += pass.kept_locks;
		return pass.checked;
	}

	n = ListPending(full_check, 0, (Datum) 0, CurrentMemoryContext, &ids, &full);
	for (i = 0; i < n; i++)
	{
		RpActivity	act;

		/* on a Citus cluster each node checks the activities it holds */
		if (!RpActivityIsLocal(ids[i]) || !RpFetchActivity(ids[i], &act, true))
			continue;
		if (kept_in_xact > 0 && kept_in_xact + act.stripes > RP_PASS_LOCK_BUDGET)
			break;
		pass.kept_locks = 0;
		(void) ReconcileGuarded(ids[i], full[i], &pass);
		kept_in_xact += pass.kept_locks;
	}
	if (i < n)
		ereport(NOTICE,
				(errmsg("redpacket reconciliation checked %d activities and left %d for the next pass",
						pass.checked, n - i),
				 errdetail("A transaction keeps the stripe locks of the activities its passes settled or froze until it ends, and stops at %d of them.",
						   RP_PASS_LOCK_BUDGET),
				 errhint("Call redpacket.rp_reconcile() again, each call in its own transaction.")));
	RecordPass(started, &pass);
	return pass.checked;
}

/*
 * Run fn(arg) in a transaction of its own, READ COMMITTED (each check reads
 * with a snapshot taken after it holds the stripe locks), inside SPI.
 */
static void
InTransaction(void (*fn) (void *), void *arg)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	XactIsoLevel = XACT_READ_COMMITTED;
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	fn(arg);
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
}

/* The state of a worker pass, kept across its transactions. */
typedef struct RpWorkerState
{
	MemoryContext cxt;
	bool		go;				/* false: nothing to do (or stop) */
	TimestampTz started;
	int64	   *ids;
	bool	   *full;
	int			n;
	int			next;
	RpPass		pass;
} RpWorkerState;

/*
 * May a worker transaction act?  The extension is installed, the server is
 * not in recovery, no restore is announced, and no other pass is running
 * (the reconciliation lock, held to this transaction's end).
 */
static bool
WorkerMayAct(void)
{
	return !RecoveryInProgress() &&
		OidIsValid(get_extension_oid("redpacket", true)) &&
		!RpRestoring() && RpDatabaseWanted() &&
		RpLock(RP_LOCK_RECONCILE, 0, 0, false);
}

static void
WorkerList(void *arg)
{
	RpWorkerState *w = arg;
	TimestampTz full_before = 0;
	Datum		full_share = (Datum) 0;

	w->go = WorkerMayAct();
	if (!w->go)
		return;
	if (rp_full_check_interval > 0)
	{
		/* spread: each pass fully checks its share of the interval */
		full_before = GetCurrentTransactionStartTimestamp() -
			(TimestampTz) rp_full_check_interval * USECS_PER_SEC;
		full_share = DirectFunctionCall2(numeric_div,
										 NumericGetDatum(int64_to_numeric(Max(rp_reconcile_interval, 1))),
										 NumericGetDatum(int64_to_numeric(rp_full_check_interval)));
	}
	w->n = ListPending(false, full_before, full_share, w->cxt, &w->ids, &w->full);
}

static void
WorkerOne(void *arg)
{
	RpWorkerState *w = arg;

	w->go = WorkerMayAct();
	if (!w->go || !RpActivityIsLocal(w->ids[w->next]))
		return;
	pgstat_report_activity(STATE_RUNNING, "redpacket reconciliation pass");
	if (!ReconcileGuarded(w->ids[w->next], w->full[w->next], &w->pass))
		elog(DEBUG1, "activity " INT64_FORMAT " disappeared before its check", w->ids[w->next]);
	w->pass.kept_locks = 0;		/* the commit releases them */
}

static void
WorkerRecord(void *arg)
{
	RpWorkerState *w = arg;

	if (WorkerMayAct())
		RecordPass(w->started, &w->pass);
}

/*
 * List what is pending, or give the pass up when the tables stay locked
 * longer than the worker's lock timeout: DDL on them, or rp_distribute()
 * converting them on a Citus cluster.  That is no failure of the pass, only
 * a late one; the next pass comes after redpacket.reconcile_interval.  Any
 * other error ends the worker as before.
 */
static void
WorkerListOrSkip(RpWorkerState *w)
{
	MemoryContext outer = CurrentMemoryContext;

	PG_TRY();
	{
		InTransaction(WorkerList, w);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(outer);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			PG_RE_THROW();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("redpacket reconciler skipped a pass: its tables stayed locked for %s",
						RP_WORKER_LOCK_TIMEOUT),
				 errdetail("Listing the pending activities failed: %s.", edata->message),
				 errhint("The next pass follows after redpacket.reconcile_interval.")));
		FreeErrorData(edata);
		w->go = false;
	}
	PG_END_TRY();
}

/*
 * One pass of the background worker in the current database: list what is
 * pending, then check each activity in a transaction of its own, so the
 * pass holds the stripe locks of one activity at a time however many
 * activities expire together.  Called with no transaction open.  Returns
 * quietly when the extension is not installed, in recovery, while
 * RpRestoring(), or while another pass runs (that pass is stopped between
 * two activities as soon as one of those becomes true).
 *
 * The search_path of the calling process is pinned here, for the process's
 * whole life and above any database or role setting (PGC_S_OVERRIDE): the
 * worker runs as a superuser, and nothing it runs may resolve a name through
 * a schema a database owner can write.
 */
void
RpWorkerPass(void)
{
	RpWorkerState w;

	SetConfigOption("search_path", RP_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);

	memset(&w, 0, sizeof(w));
	w.cxt = AllocSetContextCreate(TopMemoryContext, "redpacket worker pass",
								  ALLOCSET_DEFAULT_SIZES);
	w.started = GetCurrentTimestamp();
	WorkerListOrSkip(&w);
	for (w.next = 0; w.go && w.next < w.n; w.next++)
	{
		CHECK_FOR_INTERRUPTS();
		InTransaction(WorkerOne, &w);
	}
	if (w.go)
	{
		/* also when nothing was due: the status shows the reconciler alive */
		InTransaction(WorkerRecord, &w);
		if (w.n > 0)
			elog(DEBUG1, "redpacket reconciler checked %d activities", w.pass.checked);
	}
	MemoryContextDelete(w.cxt);
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
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
		(void) RpReconcilePass(NULL, full_check, rsinfo->setResult, rsinfo->setDesc);
	else
		(void) RpReconcilePass(PG_ARGISNULL(0) ? NULL : &one, full_check,
							   rsinfo->setResult, rsinfo->setDesc);
	SPI_finish();
	return (Datum) 0;
}
