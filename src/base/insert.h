/*
 * insert.h
 *		Rows written into our tables as an INSERT statement would write them,
 *		through the executor's simple-relation interface (insert.c): every
 *		column the caller does not set takes its column default, and every
 *		CHECK, NOT NULL and index of the table applies.  Used where planning
 *		and starting an SQL statement would cost more than the writes.  A
 *		table whose INSERT would do more than that (a trigger, a rule, row
 *		security, inheritance, a generated or domain-typed column, a
 *		missing privilege) is not written here: the caller runs its SQL.
 */
#ifndef RP_INSERT_H
#define RP_INSERT_H

#include "executor/executor.h"

#include "catalog.h"

#define RP_INSERT_MAXCOLS 16	/* named columns of one target */
#define RP_INSERT_MAXTARGETS 4	/* tables of one RpInserter */

/*
 * One of our tables and the columns a caller names: the first ngiven are
 * set by the caller (in this order), the others are read back after the
 * insert (their defaults filled them).  Static in the caller; insert.c
 * keeps what it learns of the table's shape in shape.
 */
typedef struct RpInsertTarget
{
	RpRel		rel;
	bool		returning;		/* the SQL reads the row back: needs SELECT */
	int			ncols;
	int			ngiven;
	const char *names[RP_INSERT_MAXCOLS];
	Oid			types[RP_INSERT_MAXCOLS];
	struct RpInsertShape *shape;	/* insert.c */
} RpInsertTarget;

/* The tables of one writing call, opened together. */
typedef struct RpInserter
{
	EState	   *estate;
	MemoryContext caller_cxt;
	int			ntargets;
	RpInsertTarget *targets[RP_INSERT_MAXTARGETS];
	ResultRelInfo *rris[RP_INSERT_MAXTARGETS];
	TupleTableSlot *slots[RP_INSERT_MAXTARGETS];
	struct RpInsertShape *shapes[RP_INSERT_MAXTARGETS];
	ExprState **defaults[RP_INSERT_MAXTARGETS];	/* per attribute, this call's */
	bool		snapshot_pushed;
} RpInserter;

/*
 * Open the n targets for writing and tell whether every one can be written
 * here; when false nothing was written and the caller runs its SQL.
 * Either way RpInsertEnd follows.  The caller is in a transaction that may
 * write.
 */
extern bool RpInsertBegin(RpInserter *ins, RpInsertTarget **targets, int n);

/*
 * Insert one row into target i: values/isnull for its given columns.
 * Returns the row as written (valid until RpInsertEnd).
 */
extern TupleTableSlot *RpInsertRow(RpInserter *ins, int i, const Datum *values,
								   const bool *isnull);

/* Column c of target i's names in the row RpInsertRow returned. */
extern Datum RpInsertedValue(RpInserter *ins, int i, int c, bool *isnull);

extern void RpInsertEnd(RpInserter *ins);

/*
 * The rules by which any writer of our tables through the executor (the
 * fast claim too) decides that it writes a table as SQL would.
 */

/*
 * A plain table: no rule, row security, inheritance, partitioning or
 * generated column.  Triggers are the caller's to check, for what it does.
 */
extern bool RpPlainTable(Relation rel);

/* No trigger on INSERT (a foreign key is one). */
extern bool RpNoInsertTriggers(Relation rel);

/* rowguard.c: no UPDATE trigger but the guard of the rows only the extension changes */
extern bool RpOnlyGuardOnUpdate(Relation rel);

/* The current user has the privileges need on rel (the SQL's checks). */
extern bool RpPermitted(Relation rel, AclMode need);

/*
 * A column as the caller names it: its name and type with no typmod (the
 * SQL would coerce), and, when the caller sets it, not GENERATED ALWAYS AS
 * IDENTITY (INSERT and UPDATE refuse a value for one).
 */
extern bool RpColumnIs(Form_pg_attribute fa, const char *name, Oid type, bool set);

/* rel opened for writing with its indexes (NULL: dropped), and closed. */
extern ResultRelInfo *RpOpenTarget(Oid relid);
extern void RpCloseTarget(ResultRelInfo *rri);

#endif							/* RP_INSERT_H */
