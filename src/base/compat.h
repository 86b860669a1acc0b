/*
 * compat.h
 *		Version shims: every difference between the PostgreSQL majors that
 *		redpacket builds against (15 to 18) is a macro here, so the code
 *		reads the same on each.  Macros only, expanded where they are used,
 *		so that this file needs no header of its own.
 */
#ifndef REDPACKET_COMPAT_H
#define REDPACKET_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "redpacket requires PostgreSQL 15 or later"
#endif

/*
 * This backend's PGPROC number, and its local transaction id (a new value
 * in every transaction): 17 made the first MyProcNumber and moved the
 * second into MyProc->vxid.
 */
#if PG_VERSION_NUM >= 170000
#define RpMyProcNumber MyProcNumber
#define RpMyLocalXid (MyProc->vxid.lxid)
#else
#define RpMyProcNumber (MyProc->pgprocno)
#define RpMyLocalXid (MyProc->lxid)
#endif

/* LockHeldByMe takes whether a stronger mode counts too since 17. */
#if PG_VERSION_NUM >= 170000
#define RpLockHeldByMe(tag, mode) LockHeldByMe(tag, mode, false)
#else
#define RpLockHeldByMe(tag, mode) LockHeldByMe(tag, mode)
#endif

/* index_beginscan takes the scan's instrumentation (or NULL) since 18. */
#if PG_VERSION_NUM >= 180000
#define RpIndexBeginScan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan(heap, index, snapshot, NULL, nkeys, norderbys)
#else
#define RpIndexBeginScan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan(heap, index, snapshot, nkeys, norderbys)
#endif

/*
 * Which indexes an updated row needs entries in: table_tuple_update says
 * all or none before 16; since 16 all, none or only the summarizing ones
 * (BRIN, after a HOT update), and ExecInsertIndexTuples takes that as
 * onlySummarizing.  RpExecInsertIndexTuples inserts a row's entries without
 * arbiter indexes (no ON CONFLICT).
 */
#if PG_VERSION_NUM >= 160000
#define RpUpdateIndexes TU_UpdateIndexes
#define RpUpdateNeedsIndexes(u) ((u) != TU_None)
#define RpUpdateOnlySummarizing(u) ((u) == TU_Summarizing)
#define RpExecInsertIndexTuples(rri, slot, estate, update, only_summarizing) \
	ExecInsertIndexTuples(rri, slot, estate, update, false, NULL, NIL, only_summarizing)
#else
#define RpUpdateIndexes bool
#define RpUpdateNeedsIndexes(u) (u)
#define RpUpdateOnlySummarizing(u) false
#define RpExecInsertIndexTuples(rri, slot, estate, update, only_summarizing) \
	ExecInsertIndexTuples(rri, slot, estate, update, false, NULL, NIL)
#endif

/*
 * A table's CHECK constraints as the executor keeps them compiled in a
 * ResultRelInfo, and whether one is enforced (NOT ENFORCED and virtual
 * generated columns are new in 18).
 */
#if PG_VERSION_NUM >= 180000
#define RpCheckExprs(rri) ((rri)->ri_CheckConstraintExprs)
#define RpCheckEnforced(check) ((check).ccenforced)
#define RpHasGenerated(constr) ((constr)->has_generated_stored || (constr)->has_generated_virtual)
#else
#define RpCheckExprs(rri) ((rri)->ri_ConstraintExprs)
#define RpCheckEnforced(check) true
#define RpHasGenerated(constr) ((constr)->has_generated_stored)
#endif

#endif							/* REDPACKET_COMPAT_H */
