/*
 * check.c
 *		The check of one activity, which the pass (reconcile.c) runs while it
 *		holds every stripe lock of that activity: whether the pass can see
 *		the whole activity (RpCheckIncomplete), the statement that proves the
 *		identities from the activity's watermark (RpCheckRun), the
 *		reconciliation row it records and the watermark it advances.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/numeric.h"

#include "check.h"
#include "redpacket.h"

/*
 * Can the pass see the whole activity?  Every stripe row, the funding
 * entry, the state row, and sequences ahead of the ids in their tables (a
 * restore sets sequences only after all data, so a sequence behind means a
 * restore is under way, and an insert now could collide with its rows).
 */
enum
{
	CC_STRIPE_ROWS = 1, CC_HAS_FUND, CC_HAS_STATE, CC_CLAIMS_AHEAD, CC_ENTRIES_AHEAD,
	CC_PASSES_AHEAD
};

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

enum
{
	RS_LAST_CLAIM_ID = 1, RS_CLAIMED, RS_CLAIM_COUNT
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

/* reconciliation.pass_id in the row RETURNING * gives back */
#define RECORD_PASS_ID 2

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

static const char *const problem_names[RP_NPROBLEMS] = {
	"money", "packets", "claims", "negative", "not_empty", "incomplete", "error"
};

const char *
RpProblemName(RpProblem p)
{
	Assert(p >= 0 && p < RP_NPROBLEMS);
	return problem_names[p];
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
char *
RpCheckIncomplete(const RpActivity *act, bool repair)
{
	Datum		id = Int64GetDatum(act->id);
	StringInfoData why;
	int64		rows;
	bool		isnull;

	if (RpExec(&completeness, &id, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the completeness of activity " INT64_FORMAT, act->id);
	initStringInfo(&why);
	rows = RpGetInt64(0, CC_STRIPE_ROWS, 0);
	if (rows != act->stripes)
		appendStringInfo(&why, " It has " INT64_FORMAT " of its %d stripe rows.", rows, act->stripes);
	if (!DatumGetBool(RpGetDatum(0, CC_HAS_FUND, &isnull)))
		appendStringInfoString(&why, " It has no funding entry in the ledger.");
	if (DatumGetBool(RpGetDatum(0, CC_CLAIMS_AHEAD, &isnull)))
		appendStringInfoString(&why, " Its claim ids are ahead of redpacket.claim_id_seq.");
	if (DatumGetBool(RpGetDatum(0, CC_ENTRIES_AHEAD, &isnull)))
		appendStringInfoString(&why, " Its ledger entry ids are ahead of redpacket.ledger_entry_id_seq.");
	if (DatumGetBool(RpGetDatum(0, CC_PASSES_AHEAD, &isnull)))
		appendStringInfoString(&why, " Its pass ids are ahead of redpacket.reconciliation_pass_id_seq.");
	if (!DatumGetBool(RpGetDatum(0, CC_HAS_STATE, &isnull)))
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
void
RpCheckRun(RpCheck *c, bool strict_closed)
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
		v[1] = Int64GetDatum(RpGetInt64(0, RS_LAST_CLAIM_ID, 0));
		v[2] = CopyNumeric(RS_CLAIMED);
		v[3] = Int64GetDatum(RpGetInt64(0, RS_CLAIM_COUNT, 0));
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
Datum
RpCheckProblems(const RpCheck *c)
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
void
RpCheckRecord(RpCheck *c, bool v11)
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
	v[12] = RpCheckProblems(c);
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
	c->pass_id = RpGetInt64(0, RECORD_PASS_ID, 0);
	c->row = SPI_copytuple(SPI_tuptable->vals[0]);
}

/* Advance the watermark to what this check read, and remember the stripe sums. */
void
RpCheckAdvance(const RpCheck *c, bool settled, bool v11)
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

/*
 * A row for rp_reconcile's result that was not written to the table (an
 * incomplete activity, or an error under which nothing could be written).
 */
HeapTuple
RpCheckUnrecordedRow(const RpCheck *c, TupleDesc desc)
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
			v[i] = RpCheckProblems(c);
		else if (strcmp(name, "error") == 0 && c->detail)
			v[i] = CStringGetTextDatum(c->detail);
		else
			n[i] = true;
	}
	return heap_form_tuple(desc, v, n);
}
