/*
 * redpacket.h
 *		Declarations shared by the redpacket subsystems: GUCs, money
 *		conversion, the extension's lock space, stripe operations, cached SPI
 *		plans, the reconciliation pass and the background worker.
 */
#ifndef REDPACKET_H
#define REDPACKET_H

#include "fmgr.h"
#include "executor/spi.h"
#include "storage/lock.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* Version shims: keep anything major-specific here. */
#if PG_VERSION_NUM < 150000
#error "redpacket requires PostgreSQL 15 or later"
#endif

#if PG_VERSION_NUM >= 170000
#define RpMyProcNumber MyProcNumber
#else
#define RpMyProcNumber (MyProc->pgprocno)
#endif

/* GUC bounds and defaults */
#define RP_DEFAULT_STRIPES 64
#define RP_MIN_STRIPES 1
#define RP_MAX_STRIPES 1024
#define RP_DEFAULT_RECONCILE_INTERVAL 60
#define RP_MIN_RECONCILE_INTERVAL 0
#define RP_MAX_RECONCILE_INTERVAL 86400
#define RP_DEFAULT_FULL_CHECK_INTERVAL 3600
#define RP_MIN_FULL_CHECK_INTERVAL 0
#define RP_MAX_FULL_CHECK_INTERVAL (86400 * 365)
#define RP_MIN_SCALE 0
#define RP_MAX_SCALE 4
#define RP_MAX_USER_ID_BYTES 256	/* also the limit for request ids */
#define RP_DEFAULT_STATS_MAX_ACTIVITIES 5000
#define RP_MIN_STATS_MAX_ACTIVITIES 100
#define RP_MAX_STATS_MAX_ACTIVITIES 1000000
#define RP_DEFAULT_MAX_WORKERS 2
#define RP_MIN_MAX_WORKERS 1
#define RP_MAX_MAX_WORKERS 64
#define RP_WORKER_LOCK_TIMEOUT "5s"	/* a reconciler's longest lock wait */

extern int	rp_default_stripes;
extern int	rp_reconcile_interval;
extern char *rp_database;
extern bool rp_freeze_on_mismatch;
extern bool rp_restoring;
extern int	rp_full_check_interval;
extern bool rp_allow_drop;
extern bool rp_track_stats;
extern int	rp_stats_max_activities;
extern int	rp_max_workers;
extern bool rp_direct_claims;

/*
 * Lock space.  Every lock redpacket takes is a transaction-scoped
 * LOCKTAG_ADVISORY whose field4 is one of these kinds.  pg_advisory_lock()
 * uses field4 = 1 (bigint key) and 2 (two int4 keys) only, so no key an
 * application picks can collide with ours.
 */
typedef enum RpLockKind
{
	RP_LOCK_STRIPE = 0x5201,	/* one stripe of one activity */
	RP_LOCK_USER = 0x5202,		/* one (activity, user) pair, hashed */
	RP_LOCK_RECONCILE = 0x5203,	/* the single reconciliation pass */
	RP_LOCK_BUCKET = 0x5204,	/* a bucket of an activity's users (batches) */
	RP_LOCK_GATHER = 0x5205,	/* one claim or batch waits for every stripe */
	RP_LOCK_GATE = 0x5206		/* a batch's admission slot (locks.c) */
} RpLockKind;

extern bool RpLock(RpLockKind kind, int64 activity, uint32 sub, bool wait);
extern void RpUnlock(RpLockKind kind, int64 activity, uint32 sub);
extern bool RpLockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode,
					   bool wait);
extern void RpUnlockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);

/* money.c: numeric <-> integer minor units, no float anywhere */
extern int64 RpAmountToUnits(Numeric amount, int scale, const char *what);
extern Numeric RpUnitsToAmount(int64 units, int scale);
extern int64 RpScaleFactor(int scale);

/* base.c: the search path our SQL runs under (the worker pins it for good) */
#define RP_SEARCH_PATH "pg_catalog, pg_temp"
extern int	RpPinSearchPath(void);
extern void RpUnpinSearchPath(int level);

/* A plan prepared once per backend and kept across calls. */
typedef struct RpPlan
{
	const char *sql;
	int			nargs;
	Oid			argtypes[16];
	SPIPlanPtr	plan;
	bool		generic;		/* a generic plan, except on Citus (RpPreparedOn) */
	SPIPlanPtr	plan_citus;		/* generic: the per-call plan for Citus */
} RpPlan;

extern SPIPlanPtr RpPrepared(RpPlan *p);
extern SPIPlanPtr RpPreparedOn(RpPlan *p, bool distributed);
extern int	RpExec(RpPlan *p, Datum *values, const char *nulls, bool read_only, long count);
extern int	RpExecOn(RpPlan *p, bool distributed, Datum *values, const char *nulls,
					 bool read_only, long count);
extern Datum RpGetDatum(int row, int col, bool *isnull);
extern int64 RpGetInt64(int row, int col, int64 if_null);

/* base.c: what the installed catalog is, and whether a restore is running */
#define RP_CATALOG_1_0 100
#define RP_CATALOG_1_1 101
#define RP_CATALOG_1_2 102
#define RP_CATALOG_1_3 103
#define RP_CATALOG_1_4 104
extern int	RpCatalogVersion(void);
extern bool RpRestoring(void);

/* The activity row as rp_claim and friends need it. */
typedef struct RpActivity
{
	int64		id;
	int32		packets;		/* 0 when there is no packet cap */
	int			scale;
	int			stripes;
	int			per_user_limit;
	TimestampTz starts_at;
	TimestampTz ends_at;		/* DT_NOEND when open-ended */
	bool		closed;
	bool		frozen;
	bool		restricted;		/* 1.4: pays only the users on its list (eligible.h) */
} RpActivity;

/* activity.c */
extern void RpActivityFromRow(int64 id, RpActivity *act);
extern bool RpFetchActivity(int64 id, RpActivity *act, bool missing_ok);
extern bool RpActivityMeta(int64 id, RpActivity *act);
extern void RpLockActivityRow(int64 id, RpActivity *act);
extern int64 RpSettle(const RpActivity *act, const char *reason);
extern void RpSyncHalt(int64 activity);
extern void RpCheckStripeRows(const RpActivity *act);
extern void RpInsertLedger(int64 activity, const char *kind, int64 units, int scale,
						   int32 packets, const char *reason);
extern char *RpActivityState(int64 activity, const char *keys);

/* args.c: argument checks shared by the SQL entry points */
#define RP_MAX_BATCH 10000		/* elements of one rp_claim_batch call */
extern void RpNoNull(bool isnull, const char *what);
extern void RpCheckUserId(text *user_id);
extern void RpCheckRequestId(text *request_id);
extern void RpCheckBatchSize(int n);

/*
 * alloc.c: the allocator, a pure function.  balance and packets are what is
 * left in each stripe (packets 0 when the activity does not count them);
 * visible marks the stripes the caller holds (NULL: all of them); units is
 * the fixed amount, or 0 for a lucky draw, drawn by draw(balance, packets).
 * On RP_PLAN_PAID, take[s] is what stripe s pays (take has n entries, owned
 * by the caller) and primary the stripe that counts the packet and claim.
 */
typedef enum RpPlanResult
{
	RP_PLAN_PAID,
	RP_PLAN_NEED_ALL,			/* the stripes held cannot pay: hold them all */
	RP_PLAN_EXHAUSTED			/* every stripe held, and they cannot pay */
} RpPlanResult;

typedef struct RpPlanIn
{
	int			n;
	const int64 *balance;
	const int64 *packets;
	const bool *visible;
	bool		capped;			/* the activity counts packets */
	int			start;			/* first stripe to look at */
	int64		units;
	int64		(*draw) (int64 balance, int64 packets);
} RpPlanIn;

typedef struct RpPlanOut
{
	int			primary;
	int64		units;
	int64	   *take;
} RpPlanOut;

extern RpPlanResult RpPlanClaim(const RpPlanIn *in, RpPlanOut *out);

/*
 * SQL shared by the single-node statements and their Citus shard twins
 * (scaleout.c): the fast decrement's SET and WHERE clauses, and the rows of
 * a batch's claim insert from its arrays $2..$6.
 */
#define RP_SQL_TAKE_FIXED \
	"   SET balance = balance OPERATOR(pg_catalog.-) $3," \
	"       packets = packets OPERATOR(pg_catalog.-) 1," \
	"       claims = claims OPERATOR(pg_catalog.+) 1::pg_catalog.int8" \
	" WHERE activity_id OPERATOR(pg_catalog.=) $1 AND stripe OPERATOR(pg_catalog.=) $2" \
	"   AND balance OPERATOR(pg_catalog.>=) $3" \
	"   AND (packets IS NULL OR packets OPERATOR(pg_catalog.>) 0) AND NOT halted"
#define RP_SQL_BATCH_ROWS \
	"   FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[])," \
	"                   pg_catalog.unnest($3::pg_catalog.text[])," \
	"                   pg_catalog.unnest($4::pg_catalog.text[])," \
	"                   pg_catalog.unnest($5::pg_catalog.numeric[])," \
	"                   pg_catalog.unnest($6::pg_catalog.int4[]))" \
	"        WITH ORDINALITY AS k(user_id, request_id, idem, amount, stripe, ord)" \
	"  ORDER BY k.ord" \
	" RETURNING claim_id, claimed_at"

/* stripe.c: picking, decrementing and gathering stripes of one activity */
typedef enum RpTakeResult
{
	RP_TAKE_OK,
	RP_TAKE_EXHAUSTED,
	RP_TAKE_FROZEN,				/* frozen since the activity was read */
	RP_TAKE_ENDED,				/* closed since the activity was read */
	RP_TAKE_DIVERT,				/* fast path gave up: use the careful path */
	RP_TAKE_WAIT,				/* stripe *stripe is busy: wait for it, then retry */
	RP_TAKE_GATHER				/* needs every stripe, *stripe is busy: gather */
} RpTakeResult;

/*
 * The claim a fast-path take inserts in the same statement as its stripe
 * decrement (see stripe.c).
 */
typedef struct RpFastClaim
{
	text	   *user_id;
	text	   *request_id;		/* may be NULL */
	text	   *key;			/* idempotency key */
	Numeric		amount;
	int64		claim_id;		/* out */
	TimestampTz claimed_at;		/* out */
} RpFastClaim;

extern RpTakeResult RpTake(const RpActivity *act, int64 *units, int *stripe,
						   RpFastClaim *fast);
extern void RpLockAllStripes(const RpActivity *act);
extern bool RpTryLockAllStripes(const RpActivity *act, int *busy);
extern int	RpStartStripe(const RpActivity *act);
extern void RpRememberStripe(const RpActivity *act, int stripe);
extern int64 RpDrawUnits(int64 balance, int64 packets);

/* direct.c: the fast path through the executor, on a single node */
typedef enum RpDirectResult
{
	RP_DIRECT_TOOK,				/* paid and claimed */
	RP_DIRECT_DIVERT,			/* nothing written: the careful path decides */
	RP_DIRECT_UNUSED			/* not applicable: run the fast path's SQL */
} RpDirectResult;

extern RpDirectResult RpDirectTake(const RpActivity *act, int stripe, int64 units,
								   RpFastClaim *fast);

/* locks.c: the claim paths' locking protocol (see the comment there) */
#define RP_USER_BUCKETS 64		/* user-lock buckets of an activity, for batches */
extern uint32 RpUserHash(text *user_id);
extern bool RpLockUser(int64 activity, uint32 user_hash, bool wait);
extern void RpUnlockUser(int64 activity, uint32 user_hash);
extern void RpWaitLock(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);
extern void RpGatherBegin(const RpActivity *act, uint32 user_hash);
extern void RpPatientBegin(int64 activity);
extern void RpPatientEnd(void);
extern void RpWaitAllStripes(const RpActivity *act);
extern void RpGatherEnd(const RpActivity *act);
extern int	RpBatchGateEnter(const RpActivity *act);
extern void RpBatchGateLeave(int64 activity, int slot);
extern bool RpHeldEarlier(int64 activity);
extern void RpNoteHeld(int64 activity);

/* claim.c: one claim, and its outcome as SQL columns */
typedef enum RpStatus			/* the labels of the SQL enum claim_status */
{
	RP_DUPLICATE,
	RP_FROZEN,
	RP_NOT_STARTED,
	RP_ENDED,
	RP_USER_LIMIT,
	RP_EXHAUSTED,
	RP_CLAIMED,
	RP_NOT_ELIGIBLE,			/* 1.4 */
	RP_BUSY,					/* 1.4 */
	RP_NSTATUS
} RpStatus;

typedef struct RpOutcome
{
	RpStatus	status;
	int64		claim_id;
	int64		units;
	int			scale;
	TimestampTz claimed_at;
} RpOutcome;

extern void RpClaimOne(int64 activity, text *user_id, Numeric amount, text *request_id,
					   RpOutcome *out);
extern Datum RpStatusDatum(Oid enumtype, RpStatus status);
extern void RpOutcomeColumns(const RpOutcome *o, Oid statustype, Datum *values, bool *nulls);

/*
 * stats.c: per-activity counters of answers and events, kept in shared
 * memory when the library is preloaded (a no-op otherwise).  The answers
 * are counted by their RpStatus; the events that are not answers follow.
 */
typedef enum RpStatEvent
{
	RP_STAT_WAIT = RP_NSTATUS,	/* waited for a busy stripe */
	RP_STAT_GATHER,				/* locked every stripe to pay one claim */
	RP_STAT_ERROR,				/* a claim call that raised an error */
	RP_NSTATS
} RpStatEvent;

/* The name of a counter: a status label, or stripe_waits, gathers, errors. */
extern const char *RpStatName(int event);

extern void RpStatsInit(void);
extern void RpStatsCount(int64 activity, int event);

/* reconcile.c */
extern int	RpReconcilePass(const int64 *activity, bool full_check, Tuplestorestate *out,
							TupleDesc outdesc);
extern void RpWorkerPass(void);

/* scaleout.c: on a Citus cluster, is the activity held by this node? */
extern bool RpDistributed(void);
extern bool RpActivityIsLocal(int64 activity);
extern bool RpActivityPlacement(int64 activity, char **where);
extern void RpRequireLocalActivity(int64 activity);
extern bool RpShardFastClaim(const RpActivity *act, int stripe, int64 units,
							 RpFastClaim *fast);
extern int	RpShardInsertClaims(int64 activity, Datum *values);
extern void RpReconcileCluster(bool full_check, Tuplestorestate *out);

/* worker.c: one short-lived reconciler, one pass in one database */
PGDLLEXPORT extern void RpWorkerMain(Datum main_arg);
extern bool RpDatabaseWanted(void);

/*
 * launcher.c: the long-lived launcher that starts a reconciler in every
 * database every interval; reconcilers report what they found.
 */
typedef enum RpWorkerResult
{
	RP_WORKER_NONE = 0,			/* no report: failed before the end */
	RP_WORKER_ABSENT,			/* the extension is not installed there */
	RP_WORKER_PASSED			/* the extension is there: a pass ran */
} RpWorkerResult;

extern void RpLauncherInit(void);
extern void RpLauncherReport(int slot, Oid dboid, RpWorkerResult result);
PGDLLEXPORT extern void RpLauncherMain(Datum main_arg);

#endif							/* REDPACKET_H */
