/*
 * repair.c
 *		rp_repair_stripes(activity, reason): the recorded repair of the case
 *		the reconciler finds most, stripe rows that no longer match the
 *		ledger.
 *
 *		The ledger and the claims are the money records; the stripes are
 *		derived from them (the identities of books.h).  The repair rebuilds
 *		every stripe of a frozen, open activity from the ledger and the live
 *		claims: the balance and the packets spread evenly (the first stripes
 *		take the remainders, as at creation), each stripe's claim counter
 *		from the claims it counts, lucky draws dealt ahead cleared (the
 *		engine deals again), the revision bumped, every stripe halted (the
 *		activity is frozen) and the activity's total, cap, creation time and
 *		creator its funding entry's again.
 *		It records who did it and why (activity_change, kind repair, with the
 *		totals and the stripes that changed, before and after) and ends with
 *		the reconciler's full check (unfreeze.c), which must pass or nothing
 *		is written.  The
 *		activity stays frozen until rp_unfreeze.  Under the reconciliation
 *		lock and every stripe lock of the activity, as close.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "claim/claim.h"
#include "scaleout/scaleout.h"
#include "books.h"
#include "unfreeze.h"

PG_FUNCTION_INFO_V1(rp_repair_stripes);

/*
 * What the stripes of the activity must hold together: units (NULL when
 * the ledger and the claims do not come to whole minor units), the packets
 * (NULL without a cap; the cap is the funding entry's, from 1.4) and the
 * claims.
 */
#define RP_SQL_WANT(live) \
	"WITH l AS (" RP_SQL_BOOKS_LEDGER("$1") ")," \
	"     c AS (" RP_SQL_BOOKS_CLAIMS("$1", live) ")," \
	"     t AS (SELECT (l.net OPERATOR(pg_catalog.-)" \
	"                   COALESCE((SELECT pg_catalog.sum(c.amount) FROM c), 0))" \
	"                  OPERATOR(pg_catalog.*)" \
	"                  pg_catalog.power(10::pg_catalog.numeric, a.scale::pg_catalog.numeric) AS units," \
	"                  COALESCE((SELECT f.packets FROM (" RP_SQL_BOOKS_FUND("$1") ") f)," \
	"                           a.packets)::pg_catalog.int8" \
	"                    OPERATOR(pg_catalog.+) l.added_packets" \
	"                  OPERATOR(pg_catalog.-) COALESCE((SELECT pg_catalog.sum(c.n) FROM c), 0) AS packets," \
	"                  COALESCE((SELECT pg_catalog.sum(c.n) FROM c), 0)::pg_catalog.int8 AS claims" \
	"             FROM redpacket.activity a, l WHERE a.id OPERATOR(pg_catalog.=) $1)" \
	" SELECT CASE WHEN t.units OPERATOR(pg_catalog.=) pg_catalog.trunc(t.units)" \
	"             THEN t.units::pg_catalog.int8 END, t.packets::pg_catalog.int8, t.claims," \
	"        pg_catalog.round(t.units, 0) FROM t"

static RpPlan want_live = {RP_SQL_WANT(RP_SQL_BOOKS_LIVE("x")), 1, {INT8OID}};
static RpPlan want_all = {RP_SQL_WANT("true"), 1, {INT8OID}};

/*
 * Rebuild the stripes to hold $2 units and $3 packets together, spread as
 * rp_create_activity spreads them, each counting the live claims whose
 * stripe it is (claims naming no existing stripe go to the first); bump the
 * revision; return the totals and the stripes that changed, before and
 * after, as JSON ($4: the scale).
 */
#define RP_SQL_REBUILD(live) \
	"WITH c AS (" RP_SQL_BOOKS_CLAIMS("$1", live) ")," \
	"     o AS (SELECT s.stripe, s.balance, s.packets, s.claims, s.dealt_count," \
	"                  pg_catalog.row_number() OVER (ORDER BY s.stripe) OPERATOR(pg_catalog.-) 1 AS i," \
	"                  pg_catalog.count(*) OVER () AS k" \
	"             FROM redpacket.stripe s WHERE s.activity_id OPERATOR(pg_catalog.=) $1)," \
	"     n AS (SELECT o.stripe," \
	"                  ($2 OPERATOR(pg_catalog./) o.k) OPERATOR(pg_catalog.+)" \
	"                  CASE WHEN o.i OPERATOR(pg_catalog.<) ($2 OPERATOR(pg_catalog.%) o.k) THEN 1 ELSE 0 END" \
	"                    AS balance," \
	"                  (($3 OPERATOR(pg_catalog./) o.k) OPERATOR(pg_catalog.+)" \
	"                   CASE WHEN o.i OPERATOR(pg_catalog.<) ($3 OPERATOR(pg_catalog.%) o.k) THEN 1 ELSE 0 END)" \
	"                    ::pg_catalog.int4 AS packets," \
	"                  (COALESCE((SELECT c.n FROM c WHERE c.stripe OPERATOR(pg_catalog.=) o.stripe), 0)" \
	"                   OPERATOR(pg_catalog.+) CASE WHEN o.i OPERATOR(pg_catalog.=) 0" \
	"                     THEN COALESCE((SELECT pg_catalog.sum(c.n) FROM c WHERE NOT EXISTS" \
	"                            (SELECT FROM o p WHERE p.stripe OPERATOR(pg_catalog.=) c.stripe)), 0)" \
	"                     ELSE 0 END)::pg_catalog.int8 AS claims" \
	"             FROM o)," \
	"     r AS (UPDATE redpacket.activity a SET revision = a.revision OPERATOR(pg_catalog.+) 1," \
	"                  total = COALESCE(f.amount, a.total), packets = COALESCE(f.packets, a.packets)," \
	"                  created_at = COALESCE(f.created_at, a.created_at)," \
	"                  created_by = COALESCE(f.created_by, a.created_by)" \
	"             FROM (SELECT) one LEFT JOIN LATERAL (" RP_SQL_BOOKS_FUND("$1") ") f ON true" \
	"            WHERE a.id OPERATOR(pg_catalog.=) $1 RETURNING a.revision)," \
	"     u AS (UPDATE redpacket.stripe s" \
	"              SET balance = n.balance, packets = n.packets, claims = n.claims," \
	"                  dealt = NULL, dealt_units = 0, dealt_count = 0, revision = r.revision," \
	"                  halted = true" \
	"             FROM n, r" \
	"            WHERE s.activity_id OPERATOR(pg_catalog.=) $1 AND s.stripe OPERATOR(pg_catalog.=) n.stripe" \
	"           RETURNING s.stripe)," \
	"     d AS (SELECT o.stripe, o.balance AS ob, o.packets AS op, o.claims AS oc, o.dealt_count AS od," \
	"                  n.balance AS nb, n.packets AS np, n.claims AS nc" \
	"             FROM o JOIN n USING (stripe))" \
	" SELECT pg_catalog.jsonb_build_object(" \
	"          'balance', " RP_SQL_AMOUNT("pg_catalog.sum(d.ob)") "," \
	"          'packets', pg_catalog.sum(d.op), 'claims', pg_catalog.sum(d.oc)," \
	"          'dealt_count', pg_catalog.sum(d.od)," \
	"          'stripes', COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(" \
	"              'stripe', d.stripe, 'balance', " RP_SQL_AMOUNT("d.ob") "," \
	"              'packets', d.op, 'claims', d.oc, 'dealt_count', d.od) ORDER BY d.stripe)" \
	"            FILTER (WHERE " RP_SQL_CHANGED "), '[]'))::pg_catalog.text," \
	"        pg_catalog.jsonb_build_object(" \
	"          'balance', " RP_SQL_AMOUNT("pg_catalog.sum(d.nb)") "," \
	"          'packets', pg_catalog.sum(d.np), 'claims', pg_catalog.sum(d.nc)," \
	"          'dealt_count', 0," \
	"          'stripes', COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(" \
	"              'stripe', d.stripe, 'balance', " RP_SQL_AMOUNT("d.nb") "," \
	"              'packets', d.np, 'claims', d.nc, 'dealt_count', 0) ORDER BY d.stripe)" \
	"            FILTER (WHERE " RP_SQL_CHANGED "), '[]'))::pg_catalog.text," \
	"        (SELECT pg_catalog.count(*) FROM u)" \
	"   FROM d"
#define RP_SQL_AMOUNT(units) \
	"pg_catalog.round((" units ")::pg_catalog.numeric OPERATOR(pg_catalog./)" \
	" pg_catalog.power(10::pg_catalog.numeric, $4::pg_catalog.numeric), $4)"
#define RP_SQL_CHANGED \
	"(d.ob, d.op, d.oc, d.od) IS DISTINCT FROM (d.nb, d.np, d.nc, 0)"

static RpPlan rebuild_live = {RP_SQL_REBUILD(RP_SQL_BOOKS_LIVE("x")), 4,
{INT8OID, INT8OID, INT8OID, INT4OID}};
static RpPlan rebuild_all = {RP_SQL_REBUILD("true"), 4, {INT8OID, INT8OID, INT8OID, INT4OID}};

static RpPlan has_settlements = {
	"SELECT pg_catalog.to_regclass('redpacket.claim_settlement') IS NOT NULL",
	0, {InvalidOid}
};

/* Does the catalog record reversals (claims that are no longer live)? */
static bool
HasSettlements(void)
{
	bool		isnull;

	if (RpExec(&has_settlements, NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not look for redpacket.claim_settlement");
	return DatumGetBool(RpGetDatum(0, 1, &isnull));
}

static text *
ReasonArg(FunctionCallInfo fcinfo, int argno)
{
	text	   *reason;

	RpNoNull(PG_ARGISNULL(argno), "reason");
	reason = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(reason) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reason must not be empty"),
				 errhint("Say what was wrong and how the ledger and the claims were verified.")));
	return reason;
}

/* What the stripes must hold together, from the ledger and the live claims. */
static void
Wanted(const RpActivity *act, bool live, int64 *units, int64 *packets, bool *capped)
{
	Datum		id = Int64GetDatum(act->id);
	bool		isnull;
	Datum		d;

	if (RpExec(live ? &want_live : &want_all, &id, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not read the books of activity " INT64_FORMAT, act->id);
	d = RpGetDatum(0, 1, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("the books of activity " INT64_FORMAT " do not come to whole minor units", act->id),
				 errdetail("An amount in the ledger or the claims has more than %d fractional digits.",
						   act->scale)));
	*units = DatumGetInt64(d);
	d = RpGetDatum(0, 2, &isnull);
	*capped = !isnull;
	*packets = isnull ? 0 : DatumGetInt64(d);
	if (*units < 0 || *packets < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("the books of activity " INT64_FORMAT " leave the stripes less than nothing", act->id),
				 errdetail("The ledger and the claims say the stripes hold %s and " INT64_FORMAT " packets: more was claimed than funded.",
						   DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(RpUnitsToAmount(*units, act->scale)))),
						   *packets),
				 errhint("No rebuild of the stripes can fix that; find the claims or ledger entries that are wrong.")));
}

Datum
rp_repair_stripes(PG_FUNCTION_ARGS)
{
	RpActivity	act;
	text	   *reason;
	int64		units;
	int64		packets;
	bool		capped;
	bool		live;
	Datum		v[4];
	char		n[4] = {' ', ' ', ' ', ' '};
	bool		isnull;
	char	   *before;
	char	   *after;
	Datum		row;

	RpNoNull(PG_ARGISNULL(0), "activity");
	reason = ReasonArg(fcinfo, 1);
	/* it reads the books after its locks, as a pass does */
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("rp_repair_stripes must run in a READ COMMITTED transaction"),
				 errdetail("It reads the ledger and the claims with a fresh snapshot after it has locked the activity's stripes."),
				 errhint("Call it outside an explicit REPEATABLE READ or SERIALIZABLE transaction.")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RpRequireLocalActivity(PG_GETARG_INT64(0));
	(void) RpFetchActivity(PG_GETARG_INT64(0), &act, false);
	if (act.closed)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is closed", act.id),
				 errdetail("Its remainder went back to the funder when it was settled; the stripes of a settled activity stay empty.")));
	if (!act.frozen)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("activity " INT64_FORMAT " is not frozen", act.id),
				 errhint("Freeze it first with redpacket.rp_freeze(activity, reason): it stays frozen after the repair until redpacket.rp_unfreeze.")));
	RpHoldActivity(&act);
	RpCheckStripeRows(&act);

	live = HasSettlements();
	Wanted(&act, live, &units, &packets, &capped);
	v[0] = Int64GetDatum(act.id);
	v[1] = Int64GetDatum(units);
	v[2] = Int64GetDatum(packets);
	n[2] = capped ? ' ' : 'n';
	v[3] = Int32GetDatum(act.scale);
	if (RpExec(live ? &rebuild_live : &rebuild_all, v, n, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1 || RpGetInt64(0, 3, 0) != act.stripes)
		elog(ERROR, "could not rebuild the stripes of activity " INT64_FORMAT, act.id);
	before = TextDatumGetCString(RpGetDatum(0, 1, &isnull));
	after = TextDatumGetCString(RpGetDatum(0, 2, &isnull));
	RpSyncHalt(act.id);
	RpRecordChange(act.id, "repair", before, after, text_to_cstring(reason));

	/* the rebuilt books must pass, or nothing of this is written */
	row = RpRequireFullCheck(act.id, "repaired");
	SPI_finish();
	PG_RETURN_DATUM(row);
}
