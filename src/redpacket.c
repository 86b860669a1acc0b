/*
 * redpacket.c
 *		Module entry point: the module magic and _PG_init, which defines the
 *		settings of the claim engine and the drop guard and calls each
 *		subsystem's init (the claim locks', the reconciler's, the
 *		launcher's, the counters'),
 *		which define their own settings and, when preloading, ask for their
 *		shared memory and background workers.  Nothing below this file
 *		calls into it.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "base/base.h"
#include "claim/claim.h"
#include "ops/ops.h"
#include "reconcile/reconcile.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	if (IsBinaryUpgrade)
		return;

	DefineCustomIntVariable("redpacket.stripes",
							"Number of stripes (sub-balances) for new activities.",
							"More stripes let more concurrent claims on one activity proceed without waiting.",
							&rp_default_stripes,
							RP_DEFAULT_STRIPES, RP_MIN_STRIPES, RP_MAX_STRIPES,
							PGC_USERSET, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.allow_drop",
							 "Allow DROP EXTENSION redpacket (or DROP SCHEMA redpacket CASCADE) while claims or ledger entries exist.",
							 "Off by default: the drop guard refuses a command that would delete money records.",
							 &rp_allow_drop,
							 false,
							 PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.direct_claims",
							 "Let single claims and activity creation write through the executor directly, on this node's tables or shards.",
							 "A developer switch: off forces their SQL statements (the SPI path) everywhere, to test both paths.",
							 &rp_direct_claims,
							 true,
							 PGC_SUSET, GUC_NOT_IN_SAMPLE, NULL, NULL, NULL);

	RpIdsInit();
	RpLocksInit();
	RpReconcileInit();
	RpLauncherInit();
	RpStatsInit();

	MarkGUCPrefixReserved("redpacket");
}
