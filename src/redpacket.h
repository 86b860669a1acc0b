/*
 * redpacket.h
 *		Declarations shared by the redpacket subsystems: GUCs, money
 *		conversion, the extension's lock space, stripe operations, cached SPI
 *		plans.  The reconciler's subsystems have headers of their own
 *		(reconcile.h, check.h, alert.h, worker.h, launcher.h, stats.h).
 */
#ifndef REDPACKET_H
#define REDPACKET_H

#include "fmgr.h"
#include "executor/spi.h"
#include "storage/lock.h"
#include "utils/inval.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "compat.h"			/* the version shims */

/*
 * GUC bounds and defaults (the reconciler's, the launcher's and the
 * counters' are in reconcile.h, launcher.h and stats.h)
 */
#define RP_DEFAULT_STRIPES 64
#define RP_MIN_STRIPES 1
#define RP_MAX_STRIPES 1024
#define RP_MIN_SCALE 0
#define RP_MAX_SCALE 4
#define RP_MAX_USER_ID_BYTES 256	/* also the limit for request ids */

extern int	rp_default_stripes;
extern bool rp_allow_drop;
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
	RP_LOCK_ACTIVITY = 0x5205,	/* the activity: shared by claims, exclusive
								 * for walkers (locks.c) */
	RP_LOCK_GATE = 0x5206,		/* a batch's admission slot (locks.c) */
	RP_LOCK_WAITING = 0x5207	/* held by a claim while it waits (locks.c) */
} RpLockKind;

extern bool RpLock(RpLockKind kind, int64 activity, uint32 sub, bool wait);
extern void RpUnlock(RpLockKind kind, int64 activity, uint32 sub);
extern bool RpLockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode,
					   bool wait);
extern void RpUnlockMode(RpLockKind kind, int64 activity, uint32 sub, LOCKMODE mode);
extern void RpLockTag(LOCKTAG *tag, RpLockKind kind, int64 activity, uint32 sub);
extern int	RpLockHolders(RpLockKind kind, int64 activity, uint32 sub);

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

extern SPIPlanPtr RpPreparedOn(RpPlan *p, bool distributed);
extern int	RpExec(RpPlan *p, Datum *values, const char *nulls, bool read_only, long count);
extern int	RpExecOn(RpPlan *p, bool distributed, Datum *values, const char *nulls,
					 bool read_only, long count);
extern Datum RpGetDatum(int row, int col, bool *isnull);
extern int64 RpGetInt64(int row, int col, int64 if_null);

/* base.c: the library's one relcache invalidation callback, shared by its caches */
extern void RpOnRelcacheInvalidation(RelcacheCallbackFunction fn);

/* catalog.c: what the installed catalog is */
#define RP_CATALOG_1_0 100
#define RP_CATALOG_1_1 101
#define RP_CATALOG_1_2 102
#define RP_CATALOG_1_3 103
#define RP_CATALOG_1_4 104
extern int	RpCatalogVersion(void);

/* The activity row as rp_claim and friends need it. */
typedef struct RpActivity
{
	int64		id;
	int32		packets;		/* the cap it was created with; 0 when there is none */
	int			scale;
	int			stripes;
	int			per_user_limit;
	TimestampTz starts_at;
	TimestampTz ends_at;		/* DT_NOEND when open-ended */
	bool		closed;
	bool		frozen;
	int64		revision;		/* 0 before 1.4 */
	bool		restricted;		/* false before 1.4 */
} RpActivity;

/*
 * meta.c: every statement that reads an activity selects these columns,
 * in this order, from redpacket.activity a (the 1.3 form fills the 1.4
 * columns with their defaults); RpActivityFromRow reads them from row 0 of
 * the last SPI result starting at column first, RP_ACT_<name> places after.
 */
enum
{
	RP_ACT_TOTAL, RP_ACT_PACKETS, RP_ACT_SCALE, RP_ACT_STRIPES, RP_ACT_PER_USER_LIMIT,
	RP_ACT_STARTS_AT, RP_ACT_ENDS_AT, RP_ACT_CLOSED, RP_ACT_FROZEN, RP_ACT_REVISION,
	RP_ACT_RESTRICTED, RP_ACT_NCOLS
};
#define RP_ACTIVITY_SELECT_13 \
	"a.total, a.packets, a.scale, a.stripes, a.per_user_limit, a.starts_at, a.ends_at," \
	" a.closed_at IS NOT NULL, a.frozen_reason IS NOT NULL, 0::pg_catalog.int8, false"
#define RP_ACTIVITY_SELECT_14 \
	"a.total, a.packets, a.scale, a.stripes, a.per_user_limit, a.starts_at, a.ends_at," \
	" a.closed_at IS NOT NULL, a.frozen_reason IS NOT NULL, a.revision, a.restricted"
extern void RpActivityFromRow(int64 id, int first, RpActivity *act);
extern bool RpFetchActivity(int64 id, RpActivity *act, bool missing_ok);
extern bool RpActivityMeta(int64 id, RpActivity *act);
extern void RpActivityMetaRemember(const RpActivity *act);

/* activity.c */
extern int64 RpSettle(const RpActivity *act, const char *reason);
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
 * SQL shared by batch.c's claim insert and its Citus shard twin
 * (scaleout.c): the rows of a batch's claims from its arrays $2..$6.
 */
/*
 * The claim row's columns, and the claim of a user under an idempotency
 * key, written once for every statement that inserts or looks one up: c
 * qualifies the claim's columns ("c." or ""), the other arguments are SQL
 * expressions for the activity, the user and the key.
 */
#define RP_SQL_CLAIM_COLUMNS \
	"activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at"
#define RP_SQL_CLAIM_UNDER_KEY(c, activity, user, key) \
	" " c "activity_id OPERATOR(pg_catalog.=) " activity \
	" AND " c "user_id OPERATOR(pg_catalog.=) " user \
	" AND " c "idempotency_key OPERATOR(pg_catalog.=) " key

#define RP_SQL_BATCH_ROWS \
	"   FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[])," \
	"                   pg_catalog.unnest($3::pg_catalog.text[])," \
	"                   pg_catalog.unnest($4::pg_catalog.text[])," \
	"                   pg_catalog.unnest($5::pg_catalog.numeric[])," \
	"                   pg_catalog.unnest($6::pg_catalog.int4[]))" \
	"        WITH ORDINALITY AS k(user_id, request_id, idem, amount, stripe, ord)" \
	"  ORDER BY k.ord" \
	" RETURNING claim_id, claimed_at"

/* locks.c (locks.h declares the claim paths' side) */
extern void RpWalk(const RpActivity *act);
extern bool RpWalkTry(const RpActivity *act, int *busy);
extern void RpWalkEnd(const RpActivity *act);
extern bool RpHeldEarlier(int64 activity);
#define RP_USER_BUCKETS 64		/* user-lock buckets of an activity, for batches */
extern uint32 RpUserHash(text *user_id);

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

extern Datum RpStatusDatum(Oid enumtype, RpStatus status);
extern void RpOutcomeColumns(const RpOutcome *o, Oid statustype, Datum *values, bool *nulls);

/* scaleout.c: on a Citus cluster, is the activity held by this node? */
extern bool RpDistributed(void);
extern bool RpActivityIsLocal(int64 activity);
extern bool RpActivityPlacement(int64 activity, char **where);
extern void RpRequireLocalActivity(int64 activity);
extern bool RpShardTables(int64 activity, Oid *claim_rel, Oid *stripe_rel, Oid *claim_seq);
extern int	RpShardInsertClaims(int64 activity, Datum *values);
extern void RpReconcileCluster(bool full_check, Tuplestorestate *out);

#endif							/* REDPACKET_H */
