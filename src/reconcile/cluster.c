/*
 * cluster.c
 *		rp_reconcile() over a whole Citus cluster: every node's own pass,
 *		collected by the node that runs it.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "base/base.h"
#include "pass.h"

/*
 * rp_reconcile() without an activity on a Citus cluster.  Each node checks
 * only the activities it holds (RpReconcilePass skips the others), and
 * Citus delegates a plain call without an activity to whichever node holds
 * the shard of a NULL key, so the pass would check that node's share only.
 * Instead the node that runs it asks every node, itself included, for its
 * own share (rp_reconcile(0): activity 0 never exists, and on a
 * distributed cluster it means "this node's activities"), in a connection
 * of its own (each share commits there), and returns every row they report:
 * each activity is checked once, where it lives.  A node whose pass fails
 * or cannot be reached is reported with a WARNING and the others go on;
 * within a node's pass a failing activity is a failed row, as on a single
 * node.  The WHERE clause keeps Citus from delegating the inner call.  Must
 * be called inside SPI_connect.
 */
static RpPlan node_passes = {
	"SELECT n.nodename, n.nodeport, w.success, w.result"
	"  FROM pg_catalog.run_command_on_all_nodes($1) w"
	"  JOIN pg_catalog.pg_dist_node n ON n.nodeid OPERATOR(pg_catalog.=) w.nodeid"
	" ORDER BY n.groupid",
	1, {TEXTOID}
};

static RpPlan node_rows = {
	"SELECT x.* FROM pg_catalog.json_populate_recordset(NULL::redpacket.reconciliation,"
	"                                                   $1::pg_catalog.json) x",
	1, {TEXTOID}
};

void
RpReconcileCluster(bool full_check, Tuplestorestate *out)
{
	Datum		cmd;
	SPITupleTable *nodes;
	uint64		n;

	cmd = CStringGetTextDatum(psprintf("SELECT pg_catalog.json_agg(r)"
									   "  FROM redpacket.rp_reconcile(0, %s) r"
									   " WHERE r.activity_id IS NOT NULL",
									   full_check ? "true" : "false"));
	if (RpExec(&node_passes, &cmd, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not run the reconciliation on the nodes");
	nodes = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	t = nodes->vals[i];
		char	   *node = SPI_getvalue(t, nodes->tupdesc, 1);
		char	   *port = SPI_getvalue(t, nodes->tupdesc, 2);
		char	   *ok = SPI_getvalue(t, nodes->tupdesc, 3);
		char	   *result = SPI_getvalue(t, nodes->tupdesc, 4);
		Datum		json;

		if (ok == NULL || strcmp(ok, "t") != 0)
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("redpacket reconciliation failed on node %s:%s", node, port),
					 errdetail("The node answered: %s", result ? result : "nothing."),
					 errhint("The other nodes' results are returned; run the pass again for this one.")));
			continue;
		}
		if (result == NULL || result[0] == '\0')
			continue;			/* nothing pending there, or its own pass was running */
		json = CStringGetTextDatum(result);
		if (RpExec(&node_rows, &json, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the reconciliation of node %s:%s", node, port);
		for (uint64 r = 0; r < SPI_processed; r++)
			tuplestore_puttuple(out, SPI_tuptable->vals[r]);
	}
}
