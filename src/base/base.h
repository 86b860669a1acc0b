/*
 * base.h
 *		The base every subsystem of redpacket stands on (src/base/): money
 *		in minor units, the extension's lock space, prepared SPI plans, what
 *		the installed catalog is, the activity row, argument checks, and its
 *		parts (catalog.h, change.h, insert.h).  Nothing here calls up into
 *		another subsystem.
 */
#ifndef RP_BASE_H
#define RP_BASE_H

#include "fmgr.h"
#include "executor/spi.h"
#include "storage/lock.h"
#include "utils/inval.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "compat.h"			/* the version shims */

/* Bounds of an activity's fields and of the ids a caller passes. */
#define RP_MIN_SCALE 0
#define RP_MAX_SCALE 4
#define RP_MAX_USER_ID_BYTES 256	/* also the limit for request ids */

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
	RP_LOCK_WAITING = 0x5207,	/* held by a claim while it waits (locks.c) */
	RP_LOCK_REQUEST = 0x5208	/* a creation's (funder, request id), hashed:
								 * the first lock of rp_create_activity */
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
extern bool RpOwnStatement(void);
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
#define RP_CATALOG_1_5 105
#define RP_CATALOG_1_6 106
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
extern HTAB *RpActivityCache(HTAB **cache, uint64 *generation, const char *name,
							 Size entrysize);

/* args.c: argument checks shared by the SQL entry points */
/* The ledger kinds that give money back to the funder (owed from 1.6 on). */
#define RP_OWED_KINDS "'{withdraw,return,refund}'::pg_catalog.text[]"

/*
 * 1.6: the last claim of activity act made before settlement tracking began
 * (settlement_start; 0 when none): the claims up to it are not pending
 * credits and cannot be reversed until rp_track_claims brings them in.
 */
#define RP_UNTRACKED_THROUGH(act) \
	"COALESCE((SELECT u.untracked_through FROM redpacket.settlement_start u" \
	"           WHERE u.activity_id OPERATOR(pg_catalog.=) " act "), 0)"

#define RP_MAX_BATCH 10000		/* elements of one rp_claim_batch call */
extern void RpNoNull(bool isnull, const char *what);
/* name the argument; elem: its 1-based element in an array, 0 for none */
extern void RpCheckUserId(text *user_id, const char *name, int elem);
extern void RpCheckRequestId(text *request_id, const char *name, int elem);
extern void RpCheckBatchSize(int n);

/* The statuses a claim can get (claim.c, rules.c) and counters count (stats.c). */
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

/* The base's parts: our relations, the change record, executor inserts. */
#include "catalog.h"
#include "change.h"
#include "insert.h"

#endif							/* RP_BASE_H */
