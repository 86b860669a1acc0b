/*
 * redpacket.c
 *		Module entry point: the module magic, the GUCs and _PG_init, which
 *		only defines the GUCs and, when preloading, asks for the counters'
 *		shared memory and registers the launcher.  Nothing below this
 *		file calls into it.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "locks.h"
#include "redpacket.h"

PG_MODULE_MAGIC;

int			rp_default_stripes = RP_DEFAULT_STRIPES;
int			rp_reconcile_interval = RP_DEFAULT_RECONCILE_INTERVAL;
char	   *rp_database = NULL;
bool		rp_freeze_on_mismatch = true;
bool		rp_restoring = false;
int			rp_full_check_interval = RP_DEFAULT_FULL_CHECK_INTERVAL;
bool		rp_allow_drop = false;
int			rp_max_workers = RP_DEFAULT_MAX_WORKERS;

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

	DefineCustomBoolVariable("redpacket.direct_claims",
							 "Let single claims take the executor-direct fast path on this node's tables or shards.",
							 "A developer switch: off forces the fast path's SQL statement (the SPI path) everywhere, to test both paths.",
							 &rp_direct_claims,
							 true,
							 PGC_SUSET, GUC_NOT_IN_SAMPLE, NULL, NULL, NULL);

	DefineCustomBoolVariable("redpacket.track_stats",
							 "Count claim answers and events per activity in shared memory.",
							 "Takes effect only when redpacket is in shared_preload_libraries.",
							 &rp_track_stats,
							 true,
							 PGC_SUSET, 0, NULL, NULL, NULL);

	/*
	 * Postmaster-level settings can only be defined while preloading; they
	 * only matter to shared memory and the workers, which exist only then.
	 */
	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomStringVariable("redpacket.database",
								   "Obsolete and ignored: the launcher reconciles every database with the extension.",
								   NULL,
								   &rp_database,
								   "",
								   PGC_POSTMASTER, 0, NULL, NULL, NULL);
		DefineCustomIntVariable("redpacket.max_workers",
								"Most reconcilers (one per database) running at once.",
								"Each takes a max_worker_processes slot while it runs.",
								&rp_max_workers,
								RP_DEFAULT_MAX_WORKERS, RP_MIN_MAX_WORKERS, RP_MAX_MAX_WORKERS,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
		DefineCustomIntVariable("redpacket.stats_max_activities",
								"Most activities whose claim counters are kept in shared memory.",
								"Events of further activities are counted as untracked until rp_stats_reset().",
								&rp_stats_max_activities,
								RP_DEFAULT_STATS_MAX_ACTIVITIES, RP_MIN_STATS_MAX_ACTIVITIES,
								RP_MAX_STATS_MAX_ACTIVITIES,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
	}

	RpLocksInit();

	MarkGUCPrefixReserved("redpacket");

	if (process_shared_preload_libraries_in_progress)
	{
		RpStatsInit();
		RpLauncherInit();
	}
}
