/*
 * check.c
 *		The checks of the reconciliation pass, many activities per
 *		statement.  The pass (reconcile.c) holds every stripe lock of every
 *		activity it hands here; then one statement tells what it may see of
 *		each (RpCheckLook: is the activity complete, is it due for
 *		settlement), and one statement proves, for each, from its
 *		watermark, the identities of the catalog (RpCheckRun):
 *
 *		money	  sum(fund) + sum(top_up) - sum(withdraw) - sum(return)
 *				  - sum(refund) - sum(live claims) = sum(stripe balances)
 *		packets	  activity.packets + sum(top_up packets) - count(live claims)
 *				  = sum(stripe packets) while open, 0 once closed (capped)
 *		claims	  count(live claims) = sum(stripe claims)
 *		negative  no stripe balance or packet count below 0
 *		not_empty a closed activity's stripes are empty and its return is
 *				  what was not claimed
 *		dealt	  (full checks, 1.4) each stripe's dealt_units and
 *				  dealt_count are the sum and number of its dealt amounts,
 *				  within its balance and packets
 *		copies	  (1.4) what the activity's rows copy from each other: every
 *				  stripe halted exactly when the activity is frozen or
 *				  closed and at the activity's revision, the activity's
 *				  total, packet cap (from 1.4), creation time and creator
 *				  its funding entry's; in full checks, every
 *				  settlement the amount of its claim, and the settlement
 *				  frontier (settlement_state, settlement_gap) hiding no
 *				  unsettled claim, the reconcile_state row settled only
 *				  once closed, and the eligibility list as long as its
 *				  recorded changes made it
 *
 *		where live claims are claims without a 'reversed' settlement (1.4,
 *		when redpacket.claim_settlement exists).  A reversal while the
 *		activity is open gives the claim's stripe its money, packet and
 *		claim back; after settlement it is a refund entry, and the stripe
 *		gives back the claim only (it holds no money any more).  The same
 *		statement records a reconciliation row per activity and advances its
 *		watermark, or (verification) only returns the rows.
 *
 *		Watermarks.  reconcile_state keeps, per activity, the running sums
 *		of its claims up to last_claim_id and of its reversals up to
 *		last_settlement_id, so a check reads only what is newer and its
 *		cost does not grow with the history.  Claim ids come from an
 *		uncached sequence and are drawn under a stripe lock of the activity;
 *		reversals draw their settlement ids under every stripe lock.  The
 *		statement's snapshot is taken after the pass holds every stripe lock
 *		of every activity of the batch, so for each of them no claim or
 *		reversal is in flight: every id drawn before is committed and
 *		visible, and every id drawn later is larger than the largest the
 *		statement saw, which becomes the watermark.  That holds for each
 *		activity of a batch as it does for one alone, because the locks of
 *		all of them are taken before the statement starts.  A verification
 *		takes no lock and advances nothing: one snapshot of committed data
 *		is consistent (a claim commits its stripe and its row together),
 *		and every claim up to a watermark it reads committed before the
 *		state row that holds the watermark.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "books.h"
#include "check.h"

static const char *const problem_names[RP_NPROBLEMS] = {
	"money", "packets", "claims", "negative", "not_empty", "dealt", "copies", "incomplete",
	"error"
};

const char *
RpProblemName(RpProblem p)
{
	Assert(p >= 0 && p < RP_NPROBLEMS);
	return problem_names[p];
}

/* Did the check run (and measure), as opposed to incomplete or error? */
bool
RpCheckMeasured(const RpCheck *c)
{
	return !c->failed[RP_PROBLEM_ERROR] && !c->failed[RP_PROBLEM_INCOMPLETE];
}

/*
 * Is there a redpacket.claim_settlement (1.4, the wallet's)?  Looked up
 * once per transaction.
 */
bool
RpSettlementsExist(void)
{
	static LocalTransactionId cached_lxid = InvalidLocalTransactionId;
	static bool cached = false;

	if (cached_lxid != RpMyLocalXid)
	{
		Oid			nsp = get_namespace_oid("redpacket", true);

		cached = RpCatalogVersion() >= RP_CATALOG_1_4 && OidIsValid(nsp) &&
			OidIsValid(get_relname_relid("claim_settlement", nsp));
		cached_lxid = RpMyLocalXid;
	}
	return cached;
}

static Datum
Int8Array(const int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE));
}

/* --- What the pass may see ------------------------------------------------ */

/*
 * Can the pass see the whole activity?  Every stripe row, the funding
 * entry, the state row, and sequences ahead of the ids in their tables (a
 * restore sets sequences only after all data, so a sequence behind means a
 * restore is under way, and an insert now could collide with its rows).
 * And is it due for settlement ($2: the time of the pass)?
 */
#define RP_LOOK_SELECT(A) \
	"SELECT x.id, a.id IS NOT NULL, a.stripes, a.closed_at IS NOT NULL," \
	"       a.frozen_reason IS NOT NULL," \
	"       COALESCE(a.closed_at IS NULL AND a.ends_at OPERATOR(pg_catalog.<=) $2, false)," \
	"       (SELECT pg_catalog.count(*) FROM redpacket.stripe s" \
	"         WHERE s.activity_id OPERATOR(pg_catalog.=) " A \
	"           AND (a.id IS NULL OR s.stripe OPERATOR(pg_catalog.<) a.stripes" \
	"                AND s.stripe OPERATOR(pg_catalog.>=) 0))," \
	"       EXISTS (SELECT FROM redpacket.ledger l WHERE l.activity_id OPERATOR(pg_catalog.=) " A \
	"                  AND l.kind OPERATOR(pg_catalog.=) 'fund')," \
	"       EXISTS (SELECT FROM redpacket.reconcile_state r" \
	"                WHERE r.activity_id OPERATOR(pg_catalog.=) " A ")," \
	"       COALESCE((SELECT pg_catalog.max(c.claim_id) FROM redpacket.claim c" \
	"                  WHERE c.activity_id OPERATOR(pg_catalog.=) " A ")" \
	"                OPERATOR(pg_catalog.>) q.claims, false)," \
	"       COALESCE((SELECT pg_catalog.max(l.entry_id) FROM redpacket.ledger l" \
	"                  WHERE l.activity_id OPERATOR(pg_catalog.=) " A ")" \
	"                OPERATOR(pg_catalog.>) q.entries, false)," \
	"       COALESCE((SELECT pg_catalog.max(p.pass_id) FROM redpacket.reconciliation p" \
	"                  WHERE p.activity_id OPERATOR(pg_catalog.=) " A ")" \
	"                OPERATOR(pg_catalog.>) q.passes, false)"
#define RP_LOOK_CHANGES(A) \
	",      COALESCE((SELECT pg_catalog.max(k.change_id) FROM redpacket.activity_change k" \
	"                  WHERE k.activity_id OPERATOR(pg_catalog.=) " A ")" \
	"                OPERATOR(pg_catalog.>) q.changes, false)"
#define RP_LOOK_NO_CHANGES ", false"
/* 1.4: whether its latest recorded check failed (a known incident) */
#define RP_LOOK_FAILING(A) \
	",      COALESCE((SELECT NOT r.last_ok FROM redpacket.reconcile_state r" \
	"                  WHERE r.activity_id OPERATOR(pg_catalog.=) " A "), false)"
#define RP_LOOK_NO_FAILING ", false"
#define RP_LOOK_SEQ(seq) \
	"COALESCE(pg_catalog.pg_sequence_last_value('redpacket." seq "'::pg_catalog.regclass), 0)"
#define RP_LOOK_FROM_SET \
	"  FROM pg_catalog.unnest($1::pg_catalog.int8[]) WITH ORDINALITY AS x(id, ord)" \
	"  LEFT JOIN LATERAL (SELECT y.* FROM redpacket.activity y" \
	"                      WHERE y.id OPERATOR(pg_catalog.=) x.id OFFSET 0) a ON true"
#define RP_LOOK_FROM_ONE \
	"  FROM (SELECT $1::pg_catalog.int8 AS id, 1 AS ord) x" \
	"  LEFT JOIN LATERAL (SELECT y.* FROM redpacket.activity y" \
	"                      WHERE y.id OPERATOR(pg_catalog.=) $1 OFFSET 0) a ON true"
#define RP_LOOK_SEQS_10 \
	"  CROSS JOIN (SELECT " RP_LOOK_SEQ("claim_id_seq") " AS claims," \
	"                     " RP_LOOK_SEQ("ledger_entry_id_seq") " AS entries," \
	"                     " RP_LOOK_SEQ("reconciliation_pass_id_seq") " AS passes) q" \
	" ORDER BY x.ord"
/* 1.4: the pass also writes activity_change rows (settle, freeze) */
#define RP_LOOK_SEQS_14 \
	"  CROSS JOIN (SELECT " RP_LOOK_SEQ("claim_id_seq") " AS claims," \
	"                     " RP_LOOK_SEQ("ledger_entry_id_seq") " AS entries," \
	"                     " RP_LOOK_SEQ("reconciliation_pass_id_seq") " AS passes," \
	"                     " RP_LOOK_SEQ("activity_change_id_seq") " AS changes) q" \
	" ORDER BY x.ord"

enum
{
	LOOK_ID = 1, LOOK_EXISTS, LOOK_STRIPES, LOOK_CLOSED, LOOK_FROZEN, LOOK_DUE,
	LOOK_STRIPE_ROWS, LOOK_HAS_FUND, LOOK_HAS_STATE, LOOK_CLAIMS_AHEAD, LOOK_ENTRIES_AHEAD,
	LOOK_PASSES_AHEAD, LOOK_CHANGES_AHEAD, LOOK_FAILING
};

/* [form: set, one][catalog: up to 1.3, 1.4] */
static RpPlan look_plans[2][2] = {
	{
		{RP_LOOK_SELECT("x.id") RP_LOOK_NO_CHANGES RP_LOOK_NO_FAILING RP_LOOK_FROM_SET RP_LOOK_SEQS_10,
		2, {INT8ARRAYOID, TIMESTAMPTZOID}, NULL, true},
		{RP_LOOK_SELECT("x.id") RP_LOOK_CHANGES("x.id") RP_LOOK_FAILING("x.id") RP_LOOK_FROM_SET RP_LOOK_SEQS_14,
		2, {INT8ARRAYOID, TIMESTAMPTZOID}, NULL, true},
	},
	{
		{RP_LOOK_SELECT("$1") RP_LOOK_NO_CHANGES RP_LOOK_NO_FAILING RP_LOOK_FROM_ONE RP_LOOK_SEQS_10,
		2, {INT8OID, TIMESTAMPTZOID}},
		{RP_LOOK_SELECT("$1") RP_LOOK_CHANGES("$1") RP_LOOK_FAILING("$1") RP_LOOK_FROM_ONE RP_LOOK_SEQS_14,
		2, {INT8OID, TIMESTAMPTZOID}},
	}
};

/* Only an explicit full check of one named activity recreates a lost state row. */
static RpPlan recreate_state = {
	"INSERT INTO redpacket.reconcile_state (activity_id) VALUES ($1)"
	" ON CONFLICT (activity_id) DO NOTHING",
	1, {INT8OID}
};

static bool
LookFlag(uint64 row, int col)
{
	bool		isnull;
	Datum		d = RpGetDatum(row, col, &isnull);

	return !isnull && DatumGetBool(d);
}

/*
 * What the pass may see of the n activities ids[] (every stripe lock of
 * each held, or a verification's snapshot): out[i] for ids[i].  now is the
 * time of the pass (due for settlement when ends_at <= now).  Must be
 * called inside SPI_connect.
 */
void
RpCheckLook(const int64 *ids, int n, TimestampTz now, bool read_only, RpLook *out)
{
	Datum		v[2];
	bool		v14 = RpCatalogVersion() >= RP_CATALOG_1_4;
	bool		one = RpDistributed();

	if (one && n != 1)
		elog(ERROR, "a check on a Citus cluster is of one activity at a time");
	v[0] = one ? Int64GetDatum(ids[0]) : Int8Array(ids, n);
	v[1] = TimestampTzGetDatum(now);
	if (RpExec(&look_plans[one][v14], v, NULL, read_only, 0) != SPI_OK_SELECT ||
		SPI_processed != (uint64) n)
		elog(ERROR, "could not read the completeness of %d activities", n);
	for (int i = 0; i < n; i++)
	{
		RpLook	   *l = &out[i];
		StringInfoData why;
		int64		rows;
		bool		isnull;

		memset(l, 0, sizeof(*l));
		l->activity = RpGetInt64(i, LOOK_ID, 0);
		Assert(l->activity == ids[i]);
		l->exists = LookFlag(i, LOOK_EXISTS);
		if (!l->exists)
		{
			/* its row is gone, not its money: nothing a check could balance */
			if (RpGetInt64(i, LOOK_STRIPE_ROWS, 0) == 0 && !LookFlag(i, LOOK_HAS_FUND) &&
				!LookFlag(i, LOOK_HAS_STATE))
				continue;
			l->exists = true;
			l->incomplete = "It has no activity row, but its funding entry, stripes or reconciliation state are still there.";
			continue;
		}
		l->stripes = DatumGetInt32(RpGetDatum(i, LOOK_STRIPES, &isnull));
		l->closed = LookFlag(i, LOOK_CLOSED);
		l->frozen = LookFlag(i, LOOK_FROZEN);
		l->due = LookFlag(i, LOOK_DUE);
		l->failing = LookFlag(i, LOOK_FAILING);

		initStringInfo(&why);
		rows = RpGetInt64(i, LOOK_STRIPE_ROWS, 0);
		if (rows != l->stripes)
			appendStringInfo(&why, " It has " INT64_FORMAT " of its %d stripe rows.", rows, l->stripes);
		if (!LookFlag(i, LOOK_HAS_FUND))
			appendStringInfoString(&why, " It has no funding entry in the ledger.");
		if (LookFlag(i, LOOK_CLAIMS_AHEAD))
			appendStringInfoString(&why, " Its claim ids are ahead of redpacket.claim_id_seq.");
		if (LookFlag(i, LOOK_ENTRIES_AHEAD))
			appendStringInfoString(&why, " Its ledger entry ids are ahead of redpacket.ledger_entry_id_seq.");
		if (LookFlag(i, LOOK_PASSES_AHEAD))
			appendStringInfoString(&why, " Its pass ids are ahead of redpacket.reconciliation_pass_id_seq.");
		if (LookFlag(i, LOOK_CHANGES_AHEAD))
			appendStringInfoString(&why, " Its change ids are ahead of redpacket.activity_change_id_seq.");
		if (!LookFlag(i, LOOK_HAS_STATE))
		{
			l->no_state = why.len == 0;
			appendStringInfoString(&why, " It has no reconcile_state row.");
		}
		l->incomplete = why.len > 0 ? why.data + 1 : NULL;
	}
}

/* Recreate a lost state row (an explicit full check of that one activity). */
void
RpCheckRecreateState(int64 activity)
{
	Datum		id = Int64GetDatum(activity);

	ereport(WARNING,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("activity " INT64_FORMAT " had no reconciliation state", activity),
			 errdetail("The state row was recreated and this check re-sums every claim.")));
	if (RpExec(&recreate_state, &id, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not recreate reconciliation state");
}

/* --- The check statement --------------------------------------------------- */

/*
 * $1 the activities, $2 whether each gets a full check (every claim and
 * reversal re-summed), $3 the rules of 1.1 for a closed activity (its
 * stripes empty, packets expected 0, the return what was not claimed; a
 * 1.0 catalog's closed activity settled by 1.0 kept its packet counts), $4
 * the names of the measured problems in RpProblem order, $5 the time of the
 * check.  w: where each activity's sums start (0 for a full check).
 */
#define CHK_INPUT_SET \
	"WITH i AS (SELECT x.id, x.f AS full" \
	"             FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[])," \
	"                             pg_catalog.unnest($2::pg_catalog.bool[])) AS x(id, f)),"
#define CHK_INPUT_ONE \
	"WITH i AS (SELECT $1::pg_catalog.int8 AS id, $2::pg_catalog.bool AS full),"
#define CHK_W_COMMON \
	"     w AS (SELECT i.id, i.full," \
	"                  CASE WHEN i.full THEN 0 ELSE r.last_claim_id END AS claim_from," \
	"                  CASE WHEN i.full THEN 0 ELSE r.claimed END AS claimed_to," \
	"                  CASE WHEN i.full THEN 0 ELSE r.claim_count END AS count_to,"
#define CHK_W_10(A) \
	CHK_W_COMMON \
	"                  0::pg_catalog.int8 AS rev_from, 0::pg_catalog.numeric AS reversed_to," \
	"                  0::pg_catalog.int8 AS rev_count_to" \
	"             FROM i CROSS JOIN LATERAL (SELECT x.* FROM redpacket.reconcile_state x" \
	"                                         WHERE x.activity_id OPERATOR(pg_catalog.=) " A " OFFSET 0) r),"
#define CHK_W_14(A) \
	CHK_W_COMMON \
	"                  CASE WHEN i.full THEN 0 ELSE r.last_settlement_id END AS rev_from," \
	"                  CASE WHEN i.full THEN 0 ELSE r.reversed END AS reversed_to," \
	"                  CASE WHEN i.full THEN 0 ELSE r.reversed_count END AS rev_count_to," \
	"                  r.settled AS st_settled" \
	"             FROM i CROSS JOIN LATERAL (SELECT x.* FROM redpacket.reconcile_state x" \
	"                                         WHERE x.activity_id OPERATOR(pg_catalog.=) " A " OFFSET 0) r),"

/* k: per activity, what the check reads past the watermarks */
#define CHK_K_HEAD(A, ACOLS) \
	"     k AS (SELECT w.id, w.full, w.claim_from, w.rev_from, a.scale, a.packets AS cap," \
	"                  a.closed_at IS NOT NULL AS closed, c.n AS new_claims, c.last_id," \
	"                  w.claimed_to OPERATOR(pg_catalog.+) c.amount AS claimed," \
	"                  w.count_to OPERATOR(pg_catalog.+) c.n AS claim_count," \
	"                  v.last_id AS rev_last," \
	"                  w.reversed_to OPERATOR(pg_catalog.+) v.amount AS reversed," \
	"                  w.rev_count_to OPERATOR(pg_catalog.+) v.n AS reversed_count," \
	"                  s.balance, s.packets, s.claims, s.negative, s.nonempty, s.dealt_bad," \
	"                  s.copies_bad, s.spread_bad, l.total_bad, v.settle_bad, z.state_bad," \
	"                  l.funded, l.returned, l.refunded, l.topup_packets, l.last_entry" \
	"             FROM w CROSS JOIN LATERAL (SELECT x.scale, x.packets, x.closed_at" ACOLS \
	"                                          FROM redpacket.activity x" \
	"                                         WHERE x.id OPERATOR(pg_catalog.=) " A " OFFSET 0) a" \
	"            CROSS JOIN LATERAL (" \
	"                  SELECT COALESCE(pg_catalog.sum(x.amount), 0) AS amount, pg_catalog.count(*) AS n," \
	"                         COALESCE(pg_catalog.max(x.claim_id), w.claim_from) AS last_id" \
	"                    FROM redpacket.claim x WHERE x.activity_id OPERATOR(pg_catalog.=) " A "" \
	"                     AND x.claim_id OPERATOR(pg_catalog.>) w.claim_from) c"
#define CHK_K_NO_REVERSALS(A) \
	"            CROSS JOIN LATERAL (SELECT 0::pg_catalog.numeric AS amount, 0::pg_catalog.int8 AS n," \
	"                                       w.rev_from AS last_id, 0::pg_catalog.int8 AS settle_bad) v"
/*
 * (full checks) settlements that copy no claim's amount, and claims the
 * settlement frontier hides: at or below settled_through, neither settled
 * nor listed as a gap, a gap that is no claim below it, or a frontier that
 * is not a settled claim (it only ever moves to one)
 */
#define CHK_SETTLE_BAD(A, UNTRACKED, MORE) \
	"(SELECT pg_catalog.count(*) FROM redpacket.claim_settlement z" \
	"   LEFT JOIN redpacket.claim c ON c.activity_id OPERATOR(pg_catalog.=) z.activity_id" \
	"                              AND c.claim_id OPERATOR(pg_catalog.=) z.claim_id" \
	"  WHERE z.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND c.amount IS DISTINCT FROM z.amount)" \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.claim c" \
	"   JOIN redpacket.settlement_state t ON t.activity_id OPERATOR(pg_catalog.=) c.activity_id" \
	"  WHERE c.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND c.claim_id OPERATOR(pg_catalog.<=) t.settled_through" UNTRACKED(A) \
	"    AND NOT EXISTS (SELECT FROM redpacket.claim_settlement z" \
	"                     WHERE z.activity_id OPERATOR(pg_catalog.=) c.activity_id" \
	"                       AND z.claim_id OPERATOR(pg_catalog.=) c.claim_id)" \
	"    AND NOT EXISTS (SELECT FROM redpacket.settlement_gap g" \
	"                     WHERE g.activity_id OPERATOR(pg_catalog.=) c.activity_id" \
	"                       AND g.claim_id OPERATOR(pg_catalog.=) c.claim_id))" \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.settlement_gap g" \
	"   LEFT JOIN redpacket.settlement_state t ON t.activity_id OPERATOR(pg_catalog.=) g.activity_id" \
	"  WHERE g.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND (g.claim_id OPERATOR(pg_catalog.>) t.settled_through OR t.settled_through IS NULL" \
	"         OR NOT EXISTS (SELECT FROM redpacket.claim c" \
	"                         WHERE c.activity_id OPERATOR(pg_catalog.=) g.activity_id" \
	"                           AND c.claim_id OPERATOR(pg_catalog.=) g.claim_id)))" \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.settlement_state t" \
	"  WHERE t.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND t.settled_through OPERATOR(pg_catalog.<>) 0" \
	"    AND NOT EXISTS (SELECT FROM redpacket.claim_settlement z" \
	"                     WHERE z.activity_id OPERATOR(pg_catalog.=) t.activity_id" \
	"                       AND z.claim_id OPERATOR(pg_catalog.=) t.settled_through))" MORE(A)
#define CHK_NONE(A) ""
/*
 * 1.6: claims made before settlement tracking are not hidden by the
 * frontier; every entry that gives money back has its refund row and every
 * refund row such an entry; the untracked claims all predate their start
 */
#define CHK_UNTRACKED_16(A) \
	"    AND c.claim_id OPERATOR(pg_catalog.>) " RP_UNTRACKED_THROUGH("c.activity_id")
#define CHK_OWED_KIND(L) \
	"    " L ".kind OPERATOR(pg_catalog.=) ANY (" RP_OWED_KINDS ")" \
	"    AND " L ".amount OPERATOR(pg_catalog.>) 0"
#define CHK_OWED_16(A) \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.ledger l" \
	"  WHERE l.activity_id OPERATOR(pg_catalog.=) " A " AND " CHK_OWED_KIND("l") \
	"    AND NOT EXISTS (SELECT FROM redpacket.refund o" \
	"                     WHERE o.activity_id OPERATOR(pg_catalog.=) l.activity_id" \
	"                       AND o.entry_id OPERATOR(pg_catalog.=) l.entry_id))" \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.refund o" \
	"  WHERE o.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND NOT EXISTS (SELECT FROM redpacket.ledger l" \
	"                     WHERE l.activity_id OPERATOR(pg_catalog.=) o.activity_id" \
	"                       AND l.entry_id OPERATOR(pg_catalog.=) o.entry_id AND " CHK_OWED_KIND("l") "))" \
	" OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM redpacket.settlement_start u" \
	"   JOIN redpacket.claim c ON c.activity_id OPERATOR(pg_catalog.=) u.activity_id" \
	"                         AND c.claim_id OPERATOR(pg_catalog.<=) u.untracked_through" \
	"  WHERE u.activity_id OPERATOR(pg_catalog.=) " A \
	"    AND c.claimed_at OPERATOR(pg_catalog.>) u.recorded_at)"
#define CHK_K_REVERSALS_AS(A, UNTRACKED, MORE) \
	"            CROSS JOIN LATERAL (" \
	"                  SELECT COALESCE(pg_catalog.sum(y.amount), 0) AS amount, pg_catalog.count(*) AS n," \
	"                         COALESCE(pg_catalog.max(x.settlement_id), w.rev_from) AS last_id," \
	"                         CASE WHEN w.full THEN " CHK_SETTLE_BAD(A, UNTRACKED, MORE) " ELSE 0 END AS settle_bad" \
	"                    FROM redpacket.claim_settlement x" \
	"                    JOIN redpacket.claim y ON y.activity_id OPERATOR(pg_catalog.=) x.activity_id" \
	"                                          AND y.claim_id OPERATOR(pg_catalog.=) x.claim_id" \
	"                   WHERE x.activity_id OPERATOR(pg_catalog.=) " A "" \
	"                     AND x.state OPERATOR(pg_catalog.=) 'reversed'" \
	"                     AND x.settlement_id OPERATOR(pg_catalog.>) w.rev_from) v"
#define CHK_K_REVERSALS(A) CHK_K_REVERSALS_AS(A, CHK_NONE, CHK_NONE)
#define CHK_K_REVERSALS_16(A) CHK_K_REVERSALS_AS(A, CHK_UNTRACKED_16, CHK_OWED_16)
#define CHK_K_STRIPES_HEAD \
	"            CROSS JOIN LATERAL (" \
	"                  SELECT COALESCE(pg_catalog.sum(x.balance), 0) AS balance," \
	"                         pg_catalog.sum(x.packets) AS packets," \
	"                         COALESCE(pg_catalog.sum(x.claims), 0)::pg_catalog.int8 AS claims," \
	"                         pg_catalog.count(*) FILTER (WHERE x.balance OPERATOR(pg_catalog.<) 0" \
	"                                                 OR x.packets OPERATOR(pg_catalog.<) 0) AS negative," \
	"                         pg_catalog.count(*) FILTER (WHERE x.balance OPERATOR(pg_catalog.<>) 0" \
	"                                                 OR x.packets OPERATOR(pg_catalog.<>) 0) AS nonempty,"
#define CHK_K_STRIPES_10(A) \
	CHK_K_STRIPES_HEAD \
	"                         0::pg_catalog.int8 AS dealt_bad, 0::pg_catalog.int8 AS copies_bad," \
	"                         0::pg_catalog.int8 AS spread_bad" \
	"                    FROM redpacket.stripe x WHERE x.activity_id OPERATOR(pg_catalog.=) " A ") s"
/*
 * what was dealt is checked by full checks (and first checks) only; so is
 * each stripe's claim counter against the live claims that name the stripe
 * (LIVE: RP_SQL_BOOKS_LIVE, or "true" without settlements)
 */
#define CHK_K_STRIPES_14(A, LIVE) \
	CHK_K_STRIPES_HEAD \
	"                         pg_catalog.count(*) FILTER (WHERE x.dealt_sum IS DISTINCT FROM x.dealt_units" \
	"                              OR COALESCE(pg_catalog.cardinality(x.dealt), 0) OPERATOR(pg_catalog.<>) x.dealt_count" \
	"                              OR x.dealt_units OPERATOR(pg_catalog.>) x.balance" \
	"                              OR x.dealt_count OPERATOR(pg_catalog.>) COALESCE(x.packets, 0)" \
	"                              OR x.dealt_low) AS dealt_bad," \
	"                         pg_catalog.count(*) FILTER (WHERE x.halted IS DISTINCT FROM" \
	"                                (a.frozen_reason IS NOT NULL OR a.closed_at IS NOT NULL)" \
	"                              OR x.revision IS DISTINCT FROM a.revision) AS copies_bad," \
	"                         CASE WHEN w.full THEN (" \
	"                           SELECT pg_catalog.count(*) FROM redpacket.stripe y" \
	"                             LEFT JOIN (" RP_SQL_BOOKS_CLAIMS(A, LIVE) ") q" \
	"                                    ON q.stripe OPERATOR(pg_catalog.=) y.stripe" \
	"                            WHERE y.activity_id OPERATOR(pg_catalog.=) " A \
	"                              AND y.claims OPERATOR(pg_catalog.<>) COALESCE(q.n, 0))" \
	"                         ELSE 0 END AS spread_bad" \
	"                    FROM (SELECT z.*," \
	"                                 CASE WHEN w.full OR w.claim_from OPERATOR(pg_catalog.=) 0 THEN" \
	"                                   COALESCE((SELECT pg_catalog.sum(d) FROM pg_catalog.unnest(z.dealt) d), 0)" \
	"                                 ELSE z.dealt_units END AS dealt_sum," \
	"                                 (w.full OR w.claim_from OPERATOR(pg_catalog.=) 0) AND EXISTS (" \
	"                                   SELECT FROM pg_catalog.unnest(z.dealt) d" \
	"                                    WHERE d IS NULL OR d OPERATOR(pg_catalog.<) 1) AS dealt_low" \
	"                            FROM redpacket.stripe z" \
	"                           WHERE z.activity_id OPERATOR(pg_catalog.=) " A ") x) s"
/*
 * (full checks) the state row is one the checks could have written:
 * settled only once closed (a settled activity leaves the passes' list;
 * its sums need no check of their own: a check from the watermark that
 * adds to wrong ones finds the money wrong); and the eligibility list
 * holds as many users as its recorded changes added less those they
 * removed.  Its times are not compared with the clock: a clock stepped
 * back would make every recent check look wrong.
 */
#define CHK_K_STATE_10(A) \
	"            CROSS JOIN LATERAL (SELECT false AS state_bad) z"
#define CHK_K_STATE_14(A) \
	"            CROSS JOIN LATERAL (SELECT w.full AND (" \
	"                  (w.st_settled AND a.closed_at IS NULL)" \
	"                  OR (SELECT pg_catalog.count(*) FROM redpacket.eligible x" \
	"                       WHERE x.activity_id OPERATOR(pg_catalog.=) " A ")" \
	"                     OPERATOR(pg_catalog.<>) (" \
	"                       SELECT COALESCE(pg_catalog.sum(CASE WHEN x.kind OPERATOR(pg_catalog.=) 'allow'" \
	"                                 THEN (x.after OPERATOR(pg_catalog.->>) 'added')::pg_catalog.int8" \
	"                                 ELSE OPERATOR(pg_catalog.-)" \
	"                                      (x.after OPERATOR(pg_catalog.->>) 'removed')::pg_catalog.int8 END), 0)" \
	"                         FROM redpacket.activity_change x" \
	"                        WHERE x.activity_id OPERATOR(pg_catalog.=) " A \
	"                          AND x.kind OPERATOR(pg_catalog.=) ANY ('{allow,disallow}'::pg_catalog.text[]))" \
	"                  ) AS state_bad) z"
#define CHK_K_LEDGER_10(A) \
	"            CROSS JOIN LATERAL (" \
	"                  SELECT COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'fund'), 0) AS funded," \
	"                         pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'return') AS returned," \
	"                         0::pg_catalog.numeric AS refunded," \
	"                         0::pg_catalog.int8 AS topup_packets, false AS total_bad," \
	"                         COALESCE(pg_catalog.max(x.entry_id), 0) AS last_entry" \
	"                    FROM redpacket.ledger x WHERE x.activity_id OPERATOR(pg_catalog.=) " A ") l),"
#define CHK_K_LEDGER_14(A) \
	"            CROSS JOIN LATERAL (" \
	"                  SELECT COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'fund'" \
	"                                        OR x.kind OPERATOR(pg_catalog.=) 'top_up'), 0)" \
	"                         OPERATOR(pg_catalog.-) COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'withdraw'), 0) AS funded," \
	"                         pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'return') AS returned," \
	"                         COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'refund'), 0) AS refunded," \
	"                         COALESCE(pg_catalog.sum(x.packets) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'top_up'), 0)::pg_catalog.int8" \
	"                           AS topup_packets," \
	"                         COALESCE(pg_catalog.sum(x.amount) FILTER" \
	"                                    (WHERE x.kind OPERATOR(pg_catalog.=) 'fund'), a.total)" \
	"                           IS DISTINCT FROM a.total" \
	"                         OR COALESCE(pg_catalog.bool_or(x.kind OPERATOR(pg_catalog.=) 'fund' AND" \
	"                               (x.created_at IS DISTINCT FROM a.created_at" \
	"                                OR x.created_by IS DISTINCT FROM a.created_by" \
	"                                OR (x.packets IS NOT NULL AND x.packets IS DISTINCT FROM a.packets))), false)" \
	"                           AS total_bad," \
	"                         COALESCE(pg_catalog.max(x.entry_id), 0) AS last_entry" \
	"                    FROM redpacket.ledger x WHERE x.activity_id OPERATOR(pg_catalog.=) " A ") l),"

/* f: the identities, and the names of those that failed */
#define CHK_F \
	"     t AS (SELECT k.*, k.claimed OPERATOR(pg_catalog.-) k.reversed AS live," \
	"                  k.claim_count OPERATOR(pg_catalog.-) k.reversed_count AS live_n FROM k)," \
	"     e AS (SELECT t.*," \
	"                  t.funded OPERATOR(pg_catalog.-) COALESCE(t.returned, 0)" \
	"                    OPERATOR(pg_catalog.-) t.refunded OPERATOR(pg_catalog.-) t.live AS expected," \
	"                  pg_catalog.round(t.balance OPERATOR(pg_catalog./)" \
	"                                   pg_catalog.power(10::pg_catalog.numeric, t.scale::pg_catalog.numeric)," \
	"                                   t.scale) AS actual," \
	"                  CASE WHEN t.cap IS NULL THEN NULL" \
	"                       WHEN t.closed AND ($3 OR t.packets OPERATOR(pg_catalog.=) 0) THEN 0" \
	"                       ELSE t.cap OPERATOR(pg_catalog.+) t.topup_packets OPERATOR(pg_catalog.-) t.live_n" \
	"                  END AS expected_packets," \
	"                  t.packets::pg_catalog.int8 AS actual_packets," \
	"                  t.live_n AS expected_claims," \
	"                  t.claims AS actual_claims," \
	"                  $3 AND t.closed AND (t.nonempty OPERATOR(pg_catalog.<>) 0 OR t.returned IS NULL" \
	"                       OR t.returned OPERATOR(pg_catalog.<>) (t.funded OPERATOR(pg_catalog.-) t.refunded" \
	"                                                       OPERATOR(pg_catalog.-) t.live)) AS not_empty," \
	"                  t.funded OPERATOR(pg_catalog.-) t.refunded OPERATOR(pg_catalog.-) t.live AS return_due" \
	"             FROM t)," \
	"     f AS (SELECT e.*, ARRAY(SELECT $4[u.k::pg_catalog.int4] FROM pg_catalog.unnest(ARRAY[" \
	"                    e.expected OPERATOR(pg_catalog.<>) e.actual," \
	"                    e.expected_packets IS DISTINCT FROM e.actual_packets," \
	"                    e.expected_claims OPERATOR(pg_catalog.<>) e.actual_claims" \
	"                      OR e.spread_bad OPERATOR(pg_catalog.<>) 0," \
	"                    e.negative OPERATOR(pg_catalog.<>) 0, e.not_empty," \
	"                    e.dealt_bad OPERATOR(pg_catalog.<>) 0," \
	"                    e.copies_bad OPERATOR(pg_catalog.<>) 0 OR e.total_bad" \
	"                      OR e.settle_bad OPERATOR(pg_catalog.<>) 0 OR e.state_bad])" \
	"                   WITH ORDINALITY AS u(bad, k)" \
	"                   WHERE u.bad ORDER BY u.k) AS found FROM e)"

/*
 * The set form reads the activities of $1 through the batch's own rows;
 * the form for one activity names $1 in every table it reads, which is
 * what lets Citus route the statement to the node that holds it.
 */
#define CHK_10(IN, AI, AW) \
	IN CHK_W_10(AI) CHK_K_HEAD(AW, "") CHK_K_NO_REVERSALS(AW) CHK_K_STRIPES_10(AW) CHK_K_STATE_10(AW) \
	CHK_K_LEDGER_10(AW) CHK_F
#define CHK_14(IN, AI, AW, REVERSALS, LIVE) \
	IN CHK_W_14(AI) CHK_K_HEAD(AW, ", x.frozen_reason, x.revision, x.total, x.created_at, x.created_by") REVERSALS(AW) \
	CHK_K_STRIPES_14(AW, LIVE) \
	CHK_K_STATE_14(AW) CHK_K_LEDGER_14(AW) CHK_F
#define CHK_SET_10 CHK_10(CHK_INPUT_SET, "i.id", "w.id")
#define CHK_ONE_10 CHK_10(CHK_INPUT_ONE, "$1", "$1")
#define CHK_SET_14 CHK_14(CHK_INPUT_SET, "i.id", "w.id", CHK_K_NO_REVERSALS, "true")
#define CHK_ONE_14 CHK_14(CHK_INPUT_ONE, "$1", "$1", CHK_K_NO_REVERSALS, "true")
#define CHK_SET_14S CHK_14(CHK_INPUT_SET, "i.id", "w.id", CHK_K_REVERSALS, RP_SQL_BOOKS_LIVE("x"))
#define CHK_ONE_14S CHK_14(CHK_INPUT_ONE, "$1", "$1", CHK_K_REVERSALS, RP_SQL_BOOKS_LIVE("x"))
#define CHK_SET_16 CHK_14(CHK_INPUT_SET, "i.id", "w.id", CHK_K_REVERSALS_16, RP_SQL_BOOKS_LIVE("x"))
#define CHK_ONE_16 CHK_14(CHK_INPUT_ONE, "$1", "$1", CHK_K_REVERSALS_16, RP_SQL_BOOKS_LIVE("x"))

/* The row recorded for each activity, and the watermark it advances to. */
#define CHK_RECORD_COLUMNS \
	"INSERT INTO redpacket.reconciliation (activity_id, checked_at, full_check, expected, actual," \
	"       drift, expected_packets, actual_packets, expected_claims, actual_claims," \
	"       negative_stripes, new_claims, ok"
#define CHK_RECORD_VALUES \
	" SELECT f.id, $5, f.full, f.expected, f.actual, f.actual OPERATOR(pg_catalog.-) f.expected," \
	"        f.expected_packets, f.actual_packets, f.expected_claims, f.actual_claims," \
	"        f.negative::pg_catalog.int4, f.new_claims," \
	"        pg_catalog.cardinality(f.found) OPERATOR(pg_catalog.=) 0"
#define CHK_RECORD_10 \
	", rec AS (" CHK_RECORD_COLUMNS ")" CHK_RECORD_VALUES " FROM f ORDER BY f.id RETURNING *),"
#define CHK_RECORD_11 \
	", rec AS (" CHK_RECORD_COLUMNS ", problems, error)" CHK_RECORD_VALUES ", f.found, NULL" \
	" FROM f ORDER BY f.id RETURNING *),"
#define CHK_ADVANCE_HEAD \
	"  adv AS (UPDATE redpacket.reconcile_state r" \
	"             SET last_claim_id = f.last_id, claimed = f.claimed, claim_count = f.claim_count," \
	"                 settled = f.closed, last_pass_at = $5, last_balance = f.balance," \
	"                 last_packets = f.packets, last_claims = f.claims"
#define CHK_ADVANCE_11 \
	", last_full_check_at = CASE WHEN f.full OR (f.claim_from OPERATOR(pg_catalog.=) 0" \
	"                                            AND f.rev_from OPERATOR(pg_catalog.=) 0)" \
	"                           THEN $5 ELSE r.last_full_check_at END"
#define CHK_ADVANCE_14 \
	", last_settlement_id = f.rev_last, reversed = f.reversed, reversed_count = f.reversed_count," \
	"  last_entry_id = f.last_entry," \
	"  last_ok = pg_catalog.cardinality(f.found) OPERATOR(pg_catalog.=) 0"
#define CHK_ADVANCE_TAIL(A) \
	"    FROM f WHERE r.activity_id OPERATOR(pg_catalog.=) " A ")"
#define CHK_EXTRAS \
	", f.nonempty, f.returned AS returned_amount, f.return_due, f.found, f.closed AS closed_now"
#define CHK_RESULT \
	" SELECT rec.*" CHK_EXTRAS " FROM rec JOIN f ON f.id OPERATOR(pg_catalog.=) rec.activity_id" \
	"  ORDER BY rec.activity_id"

/* A verification returns the same rows, without pass ids, and writes nothing. */
#define CHK_VERIFY \
	" SELECT f.id AS activity_id, NULL::pg_catalog.int8 AS pass_id, $5 AS checked_at," \
	"        f.full AS full_check, f.expected, f.actual," \
	"        f.actual OPERATOR(pg_catalog.-) f.expected AS drift, f.expected_packets," \
	"        f.actual_packets, f.expected_claims, f.actual_claims," \
	"        f.negative::pg_catalog.int4 AS negative_stripes, f.new_claims," \
	"        pg_catalog.cardinality(f.found) OPERATOR(pg_catalog.=) 0 AS ok," \
	"        f.found AS problems, NULL::pg_catalog.text AS error" CHK_EXTRAS \
	"   FROM f ORDER BY f.id"

#define CHK_WRITE_10(A) CHK_RECORD_10 CHK_ADVANCE_HEAD CHK_ADVANCE_TAIL(A) CHK_RESULT
#define CHK_WRITE_11(A) CHK_RECORD_11 CHK_ADVANCE_HEAD CHK_ADVANCE_11 CHK_ADVANCE_TAIL(A) CHK_RESULT
#define CHK_WRITE_14(A) \
	CHK_RECORD_11 CHK_ADVANCE_HEAD CHK_ADVANCE_11 CHK_ADVANCE_14 CHK_ADVANCE_TAIL(A) CHK_RESULT

#define CHK_ARGS_SET 5, {INT8ARRAYOID, BOOLARRAYOID, BOOLOID, TEXTARRAYOID, TIMESTAMPTZOID}, NULL, true
#define CHK_ARGS_ONE 5, {INT8OID, BOOLOID, BOOLOID, TEXTARRAYOID, TIMESTAMPTZOID}

/* The plans, [form][catalog]: record (1.0, 1.1, 1.4, 1.4 with reversals, 1.6) or verify */
enum
{
	CHK_RECORD_V10, CHK_RECORD_V11, CHK_RECORD_V14, CHK_RECORD_V14S, CHK_RECORD_V16,
	CHK_VERIFY_V14, CHK_VERIFY_V14S, CHK_VERIFY_V16, CHK_NPLANS
};

static RpPlan check_plans[2][CHK_NPLANS] = {
	{
		{CHK_SET_10 CHK_WRITE_10("f.id"), CHK_ARGS_SET},
		{CHK_SET_10 CHK_WRITE_11("f.id"), CHK_ARGS_SET},
		{CHK_SET_14 CHK_WRITE_14("f.id"), CHK_ARGS_SET},
		{CHK_SET_14S CHK_WRITE_14("f.id"), CHK_ARGS_SET},
		{CHK_SET_16 CHK_WRITE_14("f.id"), CHK_ARGS_SET},
		{CHK_SET_14 CHK_VERIFY, CHK_ARGS_SET},
		{CHK_SET_14S CHK_VERIFY, CHK_ARGS_SET},
		{CHK_SET_16 CHK_VERIFY, CHK_ARGS_SET},
	},
	{
		{CHK_ONE_10 CHK_WRITE_10("$1"), CHK_ARGS_ONE},
		{CHK_ONE_10 CHK_WRITE_11("$1"), CHK_ARGS_ONE},
		{CHK_ONE_14 CHK_WRITE_14("$1"), CHK_ARGS_ONE},
		{CHK_ONE_14S CHK_WRITE_14("$1"), CHK_ARGS_ONE},
		{CHK_ONE_16 CHK_WRITE_14("$1"), CHK_ARGS_ONE},
		{CHK_ONE_14 CHK_VERIFY, CHK_ARGS_ONE},
		{CHK_ONE_14S CHK_VERIFY, CHK_ARGS_ONE},
		{CHK_ONE_16 CHK_VERIFY, CHK_ARGS_ONE},
	}
};

/* The error row of a check that could not run (1.1). */
static RpPlan record_error = {
	"INSERT INTO redpacket.reconciliation (activity_id, checked_at, full_check, ok, problems, error)"
	" VALUES ($1, $2, $3, false, $4, $5) RETURNING *",
	5, {INT8OID, TIMESTAMPTZOID, BOOLOID, TEXTARRAYOID, TEXTOID}
};

/* The column of a result by name; the rows' layout depends on the catalog. */
static int
Col(const char *name)
{
	int			col = SPI_fnumber(SPI_tuptable->tupdesc, name);

	if (col <= 0)
		elog(ERROR, "reconciliation result has no column \"%s\"", name);
	return col;
}

static Datum
ColNumeric(uint64 row, int col)
{
	bool		isnull;
	Datum		d = RpGetDatum(row, col, &isnull);

	return isnull ? NumericGetDatum(int64_to_numeric(0)) : datumCopy(d, false, -1);
}

/*
 * A row of the SQL function's result (desc: the rowtype of
 * redpacket.reconciliation as installed) from row of the last SPI result,
 * whose columns are found by name.
 */
static HeapTuple
ResultRow(uint64 row, TupleDesc desc)
{
	Datum	   *v = palloc0(sizeof(Datum) * desc->natts);
	bool	   *n = palloc(sizeof(bool) * desc->natts);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		int			col = att->attisdropped ? SPI_ERROR_NOATTRIBUTE
			: SPI_fnumber(SPI_tuptable->tupdesc, NameStr(att->attname));

		n[i] = true;
		if (col > 0)
			v[i] = RpGetDatum(row, col, &n[i]);
	}
	return heap_form_tuple(desc, v, n);
}

static Datum
NamesArray(int n)
{
	Datum		names[RP_NPROBLEMS];

	for (int p = 0; p < n; p++)
		names[p] = CStringGetTextDatum(problem_names[p]);
	return PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * Check the n activities of checks[] (activity and full set; every stripe
 * lock of each held, each complete) in one statement at time at.  With
 * record, write their reconciliation rows and advance their watermarks;
 * without, verify (read only, nothing written, in the caller's snapshot).
 * Fills the rest of each RpCheck, and its result row when outdesc is given.
 * Must be called inside SPI_connect.
 */
void
RpCheckRun(RpCheck *checks, int n, TimestampTz at, bool record, TupleDesc outdesc)
{
	int64	   *ids = palloc(sizeof(int64) * Max(n, 1));
	Datum	   *full = palloc(sizeof(Datum) * Max(n, 1));
	Datum		v[5];
	int			version = RpCatalogVersion();
	bool		v14 = version >= RP_CATALOG_1_4;
	bool		one;
	RpPlan	   *plan;
	int			c_id,
				c_pass,
				c_expected,
				c_actual,
				c_exp_packets,
				c_act_packets,
				c_exp_claims,
				c_act_claims,
				c_negative,
				c_nonempty,
				c_returned,
				c_return_due,
				c_found,
				c_closed;

	if (n == 0)
		return;
	for (int i = 0; i < n; i++)
	{
		ids[i] = checks[i].activity;
		full[i] = BoolGetDatum(checks[i].full);
	}
	one = RpDistributed();
	if (one && n != 1)
		elog(ERROR, "a check on a Citus cluster is of one activity at a time");
	if (!record)
		plan = &check_plans[one][version >= RP_CATALOG_1_6 ? CHK_VERIFY_V16
								 : RpSettlementsExist() ? CHK_VERIFY_V14S : CHK_VERIFY_V14];
	else if (v14)
		plan = &check_plans[one][version >= RP_CATALOG_1_6 ? CHK_RECORD_V16
								 : RpSettlementsExist() ? CHK_RECORD_V14S : CHK_RECORD_V14];
	else
		plan = &check_plans[one][version >= RP_CATALOG_1_1 ? CHK_RECORD_V11 : CHK_RECORD_V10];
	v[0] = one ? Int64GetDatum(ids[0]) : Int8Array(ids, n);
	v[1] = one ? full[0] : PointerGetDatum(construct_array(full, n, BOOLOID, 1, true, TYPALIGN_CHAR));
	v[2] = BoolGetDatum(version >= RP_CATALOG_1_1);
	v[3] = NamesArray(RP_NMEASURED);
	v[4] = TimestampTzGetDatum(at);
	if (RpExec(plan, v, NULL, !record, 0) != SPI_OK_SELECT || SPI_processed != (uint64) n)
		elog(ERROR, "reconciliation check of %d activities returned " UINT64_FORMAT " rows",
			 n, SPI_processed);

	c_id = Col("activity_id");
	c_pass = Col("pass_id");
	c_expected = Col("expected");
	c_actual = Col("actual");
	c_exp_packets = Col("expected_packets");
	c_act_packets = Col("actual_packets");
	c_exp_claims = Col("expected_claims");
	c_act_claims = Col("actual_claims");
	c_negative = Col("negative_stripes");
	c_nonempty = Col("nonempty");
	c_returned = Col("returned_amount");
	c_return_due = Col("return_due");
	c_found = Col("found");
	c_closed = Col("closed_now");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int64		id = RpGetInt64(r, c_id, 0);
		RpCheck    *c = NULL;
		bool		isnull;
		Datum		d;
		ArrayType  *found;
		Datum	   *names;
		int			nnames;

		for (int i = 0; i < n && c == NULL; i++)
			if (checks[i].activity == id)
				c = &checks[i];
		if (c == NULL)
			elog(ERROR, "reconciliation check returned activity " INT64_FORMAT, id);
		c->checked_at = at;
		c->expected = ColNumeric(r, c_expected);
		c->actual = ColNumeric(r, c_actual);
		d = RpGetDatum(r, c_exp_packets, &isnull);
		c->has_packets = !isnull;
		c->expected_packets = isnull ? 0 : DatumGetInt64(d);
		c->actual_packets = RpGetInt64(r, c_act_packets, 0);
		c->expected_claims = RpGetInt64(r, c_exp_claims, 0);
		c->actual_claims = RpGetInt64(r, c_act_claims, 0);
		c->negative = DatumGetInt32(RpGetDatum(r, c_negative, &isnull));
		c->nonempty = RpGetInt64(r, c_nonempty, 0);
		c->returned = ColNumeric(r, c_returned);
		c->return_due = ColNumeric(r, c_return_due);
		c->closed = DatumGetBool(RpGetDatum(r, c_closed, &isnull));
		c->recorded = record;
		c->pass_id = RpGetInt64(r, c_pass, 0);

		found = DatumGetArrayTypeP(RpGetDatum(r, c_found, &isnull));
		deconstruct_array(found, TEXTOID, -1, false, TYPALIGN_INT, &names, NULL, &nnames);
		memset(c->failed, 0, sizeof(c->failed));
		for (int k = 0; k < nnames; k++)
		{
			char	   *name = TextDatumGetCString(names[k]);

			for (int p = 0; p < RP_NMEASURED; p++)
				if (strcmp(name, problem_names[p]) == 0)
					c->failed[p] = true;
		}
		c->ok = nnames == 0;
		c->row = outdesc ? ResultRow(r, outdesc) : NULL;
	}
}

/*
 * Record the check that could not run (1.1: problems {error} and the
 * message) and keep its row for the SQL function's result.
 */
void
RpCheckRecordError(RpCheck *c, TupleDesc outdesc)
{
	Datum		v[5];
	Datum		name = CStringGetTextDatum(problem_names[RP_PROBLEM_ERROR]);

	v[0] = Int64GetDatum(c->activity);
	v[1] = TimestampTzGetDatum(c->checked_at);
	v[2] = BoolGetDatum(c->full);
	v[3] = PointerGetDatum(construct_array(&name, 1, TEXTOID, -1, false, TYPALIGN_INT));
	v[4] = CStringGetTextDatum(c->detail);
	if (RpExec(&record_error, v, NULL, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "could not record reconciliation");
	c->recorded = true;
	c->pass_id = RpGetInt64(0, Col("pass_id"), 0);
	c->row = outdesc ? ResultRow(0, outdesc) : NULL;
}

/*
 * A row for the SQL function's result that was not written to the table
 * (an incomplete activity, an error under which nothing could be written,
 * a verification that could not run).
 */
HeapTuple
RpCheckUnrecordedRow(const RpCheck *c, TupleDesc desc)
{
	Datum	   *v = palloc0(sizeof(Datum) * desc->natts);
	bool	   *n = palloc(sizeof(bool) * desc->natts);
	Datum		names[RP_NPROBLEMS];
	int			nnames = 0;

	for (int p = 0; p < RP_NPROBLEMS; p++)
		if (c->failed[p])
			names[nnames++] = CStringGetTextDatum(problem_names[p]);
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
			v[i] = PointerGetDatum(construct_array(names, nnames, TEXTOID, -1, false, TYPALIGN_INT));
		else if (strcmp(name, "error") == 0 && c->detail)
			v[i] = CStringGetTextDatum(c->detail);
		else
			n[i] = true;
	}
	return heap_form_tuple(desc, v, n);
}
