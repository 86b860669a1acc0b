/*
 * redpacket.c
 *		Module entry point: the module magic, the GUCs and _PG_init, which
 *		only defines the GUCs and registers the worker.  Nothing below this
 *		file calls into it.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "redpacket.h"

PG_MODULE_MAGIC;

int			rp_default_stripes = RP_DEFAULT_STRIPES;
int			rp_reconcile_interval = RP_DEFAULT_RECONCILE_INTERVAL;
char	   *rp_database = NULL;
bool		rp_freeze_on_mismatch = true;
bool		rp_restoring = false;
int			rp_full_check_interval = RP_DEFAULT_FULL_CHECK_INTERVAL;
bool		rp_allow_drop = false;

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

	DefineCustomIntVariable("redpacket.reconcile_interval",
							"Seconds between reconciliation passes of the background worker.",
							"0 pauses the worker without stopping it.",
							&rp_reconcile_interval,
							RP_DEFAULT_RECONCILE_INTERVAL, RP_MIN_RECONCILE_INTERVAL,
							RP_MAX_RECONCILE_INTERVAL,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomIntVariable("redpacket.full_check_interval",
							"Seconds within which the worker fully checks every activity.",
							"Each worker pass re-sums every claim of its share of the activities whose last full check is older; 0 turns automatic full checks off.",
							&rp_full_check_interval,
							RP_DEFAULT_FULL_CHECK_INTERVAL, RP_MIN_FULL_CHECK_INTERVAL,
							RP_MAX_FULL_CHECK_INTERVAL,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.freeze_on_mismatch",
							 "Freeze an activity whose reconciliation fails.",
							 NULL,
							 &rp_freeze_on_mismatch,
							 true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.restoring",
							 "Pause every reconciliation pass in this session or database.",
							 "Set by redpacket.rp_pre_restore() for the database while a dump is restored; rp_post_restore() clears it.",
							 &rp_restoring,
							 false,
							 PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.allow_drop",
							 "Allow DROP EXTENSION redpacket (or DROP SCHEMA redpacket CASCADE) while claims or ledger entries exist.",
							 "Off by default: the drop guard refuses a command that would delete money records.",
							 &rp_allow_drop,
							 false,
							 PGC_SUSET, 0, NULL, NULL, NULL);

	/*
	 * A postmaster-level setting can only be defined while preloading; it
	 * only matters to the worker, which exists only then.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomStringVariable("redpacket.database",
								   "Database the reconciliation worker connects to.",
								   NULL,
								   &rp_database,
								   "postgres",
								   PGC_POSTMASTER, 0, NULL, NULL, NULL);

	MarkGUCPrefixReserved("redpacket");

	if (process_shared_preload_libraries_in_progress)
		RpRegisterWorker();
}
