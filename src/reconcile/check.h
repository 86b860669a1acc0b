/*
 * check.h
 *		The checks of the reconciliation pass (check.c), many activities per
 *		statement: what the pass may see of them (RpCheckLook), the
 *		identities (RpCheckRun), and what a check found, for the pass driver
 *		(reconcile.c) and the alerts (alert.c).
 */
#ifndef RP_CHECK_H
#define RP_CHECK_H

#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "utils/timestamp.h"

/*
 * The problems a check can name (reconciliation.problems), in the order
 * they are listed.  The first RP_NMEASURED are measured by the check
 * statement; incomplete and error say that it could not run.
 */
typedef enum RpProblem
{
	RP_PROBLEM_MONEY,
	RP_PROBLEM_PACKETS,
	RP_PROBLEM_CLAIMS,
	RP_PROBLEM_NEGATIVE,
	RP_PROBLEM_NOT_EMPTY,
	RP_PROBLEM_DEALT,
	RP_PROBLEM_COPIES,
	RP_PROBLEM_INCOMPLETE,
	RP_PROBLEM_ERROR,
	RP_NPROBLEMS
} RpProblem;

#define RP_NMEASURED (RP_PROBLEM_COPIES + 1)

extern const char *RpProblemName(RpProblem p);

/* What the pass may know of an activity before it checks it. */
typedef struct RpLook
{
	int64		activity;
	bool		exists;
	int			stripes;
	bool		closed;
	bool		frozen;
	bool		due;			/* open, and its ends_at has passed: settle it */
	bool		failing;		/* its latest recorded check failed (1.4) */
	bool		no_state;		/* complete but for its reconcile_state row */
	char	   *incomplete;		/* what the pass cannot see, or NULL */
} RpLook;

/* What one check of one activity found. */
typedef struct RpCheck
{
	int64		activity;
	bool		full;
	TimestampTz checked_at;
	bool		failed[RP_NPROBLEMS];
	bool		ok;
	bool		frozen;			/* the activity is frozen after this check */
	bool		froze;			/* this check froze it (wrote activity and stripes) */
	bool		recorded;		/* a reconciliation row was written */
	bool		settled;		/* this pass settled it just before the check */
	bool		closed;			/* it is closed (settled) after the check */
	int64		pass_id;
	Datum		expected;		/* numeric; everything below only after a check */
	Datum		actual;
	bool		has_packets;
	int64		expected_packets;
	int64		actual_packets;
	int64		expected_claims;
	int64		actual_claims;
	int64		negative;
	int64		nonempty;
	Datum		returned;		/* numeric; 0 when no return entry */
	Datum		return_due;
	char	   *detail;			/* incomplete: what is missing; error: the message */
	HeapTuple	row;			/* for the SQL function's result, or NULL */
} RpCheck;

extern bool RpCheckMeasured(const RpCheck *c);
extern bool RpSettlementsExist(void);
extern void RpCheckLook(const int64 *ids, int n, TimestampTz now, bool read_only, RpLook *out);
extern void RpCheckRecreateState(int64 activity);
extern void RpCheckRun(RpCheck *checks, int n, TimestampTz at, bool record, TupleDesc outdesc);
extern void RpCheckRecordError(RpCheck *c, TupleDesc outdesc);
extern HeapTuple RpCheckUnrecordedRow(const RpCheck *c, TupleDesc desc);

#endif							/* RP_CHECK_H */
