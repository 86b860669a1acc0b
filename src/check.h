/*
 * check.h
 *		The check of one activity by the reconciliation pass (check.c): what
 *		it found, the problems it can name, and the steps that read and
 *		record it.  Used by the pass driver (reconcile.c) and the alerts
 *		(alert.c).
 */
#ifndef RP_CHECK_H
#define RP_CHECK_H

#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "utils/timestamp.h"

#include "redpacket.h"

/* The problems a check can name (reconciliation.problems). */
typedef enum RpProblem
{
	RP_PROBLEM_MONEY,
	RP_PROBLEM_PACKETS,
	RP_PROBLEM_CLAIMS,
	RP_PROBLEM_NEGATIVE,
	RP_PROBLEM_NOT_EMPTY,
	RP_PROBLEM_INCOMPLETE,
	RP_PROBLEM_ERROR,
	RP_NPROBLEMS
} RpProblem;

extern const char *RpProblemName(RpProblem p);

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
	int64		pass_id;
	Datum		expected;		/* numeric; everything below only after a check */
	Datum		actual;
	bool		has_packets;
	int64		expected_packets;
	int64		actual_packets;
	int64		expected_claims;
	int64		actual_claims;
	int64		negative;
	int64		new_claims;
	int64		nonempty;
	Datum		returned;		/* numeric; 0 when no return entry */
	Datum		return_due;
	int64		last_id;		/* the watermark for the next pass: */
	Datum		claimed;		/* numeric */
	Datum		balance_units;	/* numeric */
	bool		packets_null;	/* actual_packets is NULL */
	char	   *detail;			/* incomplete: what is missing; error: the message */
	HeapTuple	row;			/* for rp_reconcile's result, or NULL */
} RpCheck;

extern char *RpCheckIncomplete(const RpActivity *act, bool repair);
extern void RpCheckRun(RpCheck *c, bool strict_closed);
extern void RpCheckRecord(RpCheck *c, bool v11);
extern void RpCheckAdvance(const RpCheck *c, bool settled, bool v11);
extern Datum RpCheckProblems(const RpCheck *c);
extern HeapTuple RpCheckUnrecordedRow(const RpCheck *c, TupleDesc desc);

#endif							/* RP_CHECK_H */
