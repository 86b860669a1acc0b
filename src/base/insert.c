/*
 * insert.c
 *		Rows written into our tables as INSERT would write them (insert.h),
 *		through the executor's simple-relation insert, which logical
 *		replication's apply uses too: the table's CHECK and NOT NULL
 *		constraints, every index (unique ones checked), the row WAL-logged
 *		and decoded like any other.  A column the caller does not set takes
 *		its column default, evaluated like the executor's (nextval, now(),
 *		session_user, or whatever an administrator set), or NULL.
 *
 *		What a statement would read from the catalog each time, the default
 *		and CHECK expressions, is read and planned once per catalog
 *		generation (catalog.c: any relcache invalidation of our tables moves
 *		it), as the SQL statement's kept plan holds them; one that calls a
 *		user-defined function (which the planner could inline or fold, and
 *		which can change without an invalidation of our tables) is planned
 *		for every call, as a new INSERT statement plans it.  Each call
 *		compiles them once for its rows.  What can change without an
 *		invalidation is checked on every call from the relcache entry at
 *		hand: triggers, rules, row security, inheritance, generated columns,
 *		privileges.
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "insert.h"

/* What insert.c learned of a target's table, for one catalog generation. */
typedef struct RpInsertShape
{
	uint64		generation;
	bool		usable;
	MemoryContext cxt;			/* holds this struct and what follows */
	AttrNumber	att[RP_INSERT_MAXCOLS]; /* of the target's names */
	int			natts;
	Expr	  **defaults;		/* per attribute not given: its default */
	bool	   *default_planned;
	int			ncheck;
	Expr	  **checks;			/* the CHECK constraints (NULL: not enforced) */
	bool	   *check_planned;
} RpInsertShape;

/* A function an administrator could replace: not one of the built-in ones. */
static bool
UserFunction(Oid func, void *context)
{
	return func >= FirstUnpinnedObjectId;
}

/* Whether the expression calls a user-defined function anywhere. */
static bool
CallsUserFunction(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (check_functions_in_node(node, UserFunction, context))
		return true;
	return expression_tree_walker(node, CallsUserFunction, context);
}

/*
 * An expression of the catalog, planned once (planned true) unless it
 * calls a user-defined function or its plan depends on more than our
 * tables: a user function could be inlined or, when immutable, folded into
 * a constant, and CREATE OR REPLACE of it invalidates nothing of ours; a
 * domain's constraints change with ALTER DOMAIN (the planner reports that
 * one).  Planned once, an expression is what the SQL statement's kept
 * (generic) plan holds: what the planner folded from built-in functions
 * stays folded for the catalog generation, as there (a setting such as
 * bytea_output read by a folded output function, a type's comparison
 * function reached through the type cache).  Planning every expression on
 * every call made creation 15% slower.
 */
static Expr *
Prepared(Node *parsed, bool *planned)
{
	List	   *relations = NIL;
	List	   *items = NIL;
	Expr	   *plan;

	*planned = false;
	if (parsed == NULL)
		return NULL;
	if (CallsUserFunction(parsed, NULL))
		return (Expr *) parsed;
	plan = expression_planner_with_deps((Expr *) copyObject(parsed), &relations, &items);
	if (items != NIL)
		return (Expr *) parsed;
	*planned = true;
	return plan;
}

/*
 * Inserters open in this backend (RpInsertBegin to RpInsertEnd): a
 * column default's function can create an activity while an outer
 * creation is using the shapes it opened.  Reset at the end of every
 * transaction, so that an error between the two errs on the safe side
 * (shapes replaced are kept to the end of the transaction) and no further.
 */
static int	open_inserters = 0;
static bool xact_callback = false;

static void
InsertersAtEnd(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		open_inserters = 0;
}

/*
 * A shape replaced by a newer one: freed at once unless another inserter
 * than the caller's is open (it may be using it), then at the end of the
 * transaction.
 */
static void
ShapeRetire(RpInsertShape *s)
{
	if (open_inserters > 1)
		MemoryContextSetParent(s->cxt, TopTransactionContext);
	else
		MemoryContextDelete(s->cxt);
}

bool
RpColumnIs(Form_pg_attribute fa, const char *name, Oid type, bool set)
{
	return !fa->attisdropped && strcmp(NameStr(fa->attname), name) == 0 &&
		fa->atttypid == type && fa->atttypmod == -1 &&
		!(set && fa->attidentity == ATTRIBUTE_IDENTITY_ALWAYS);
}

/* The named columns exist, as RpColumnIs says. */
static bool
FindNamed(const RpInsertTarget *t, TupleDesc desc, AttrNumber *att)
{
	for (int c = 0; c < t->ncols; c++)
	{
		att[c] = InvalidAttrNumber;
		for (int a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute fa = TupleDescAttr(desc, a);

			if (RpColumnIs(fa, t->names[c], t->types[c], c < t->ngiven))
				att[c] = fa->attnum;
		}
		if (att[c] == InvalidAttrNumber)
			return false;
	}
	return true;
}

/*
 * Read the table's defaults and checks into s (Prepared).  A column of a
 * domain type makes the table unusable here: its domain's constraints and
 * default can change without an invalidation of the table.
 */
static bool
ShapeBuild(const RpInsertTarget *t, RpInsertShape *s, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	TupleConstr *constr = desc->constr;
	bool	   *given;

	s->natts = desc->natts;
	s->defaults = palloc0(sizeof(Expr *) * Max(desc->natts, 1));
	s->default_planned = palloc0(sizeof(bool) * Max(desc->natts, 1));
	given = palloc0(sizeof(bool) * Max(desc->natts, 1));
	if (!FindNamed(t, desc, s->att))
		return false;
	for (int c = 0; c < t->ngiven; c++)
		given[s->att[c] - 1] = true;
	for (int a = 0; a < desc->natts; a++)
	{
		Form_pg_attribute fa = TupleDescAttr(desc, a);

		if (fa->attisdropped)
			continue;
		if (get_typtype(fa->atttypid) == TYPTYPE_DOMAIN)
			return false;
		if (!given[a])
			s->defaults[a] = Prepared(build_column_default(rel, a + 1),
									  &s->default_planned[a]);
	}
	s->ncheck = constr ? constr->num_check : 0;
	s->checks = palloc0(sizeof(Expr *) * Max(s->ncheck, 1));
	s->check_planned = palloc0(sizeof(bool) * Max(s->ncheck, 1));
	for (int i = 0; i < s->ncheck; i++)
		if (RpCheckEnforced(constr->check[i]))
			s->checks[i] = Prepared(stringToNode(constr->check[i].ccbin),
									&s->check_planned[i]);
	return true;
}

/*
 * The shape of t's table for this generation, built when it moved.  A
 * shape is never changed once built; the one it replaces is retired.
 */
static RpInsertShape *
ShapeReady(RpInsertTarget *t, Relation rel, uint64 generation)
{
	RpInsertShape *s = t->shape;
	MemoryContext cxt;
	MemoryContext old;

	if (s != NULL && s->generation == generation)
		return s;
	/* built under the transaction, so that an error frees it */
	cxt = AllocSetContextCreate(TopTransactionContext, "redpacket insert shape",
								ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);
	s = palloc0(sizeof(RpInsertShape));
	s->cxt = cxt;
	s->usable = ShapeBuild(t, s, rel);
	MemoryContextSwitchTo(old);
	MemoryContextSetParent(cxt, TopMemoryContext);
	s->generation = generation;
	if (t->shape != NULL)
		ShapeRetire(t->shape);
	t->shape = s;
	return s;
}

bool
RpPlainTable(Relation rel)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;

	return rel->rd_rel->relkind == RELKIND_RELATION && !rel->rd_rel->relhasrules &&
		!rel->rd_rel->relrowsecurity && !rel->rd_rel->relhassubclass &&
		!rel->rd_rel->relispartition && (constr == NULL || !RpHasGenerated(constr));
}

bool
RpNoInsertTriggers(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;

	return td == NULL ||
		!(td->trig_insert_before_row || td->trig_insert_after_row ||
		  td->trig_insert_instead_row || td->trig_insert_before_statement ||
		  td->trig_insert_after_statement || td->trig_insert_new_table);
}

bool
RpPermitted(Relation rel, AclMode need)
{
	return pg_class_aclmask(RelationGetRelid(rel), GetUserId(), need, ACLMASK_ALL) == need;
}

ResultRelInfo *
RpOpenTarget(Oid relid)
{
	Relation	rel = OidIsValid(relid) ? try_relation_open(relid, RowExclusiveLock) : NULL;
	ResultRelInfo *rri;

	if (rel == NULL)
		return NULL;			/* dropped since it was named */
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 0, NULL, 0);
	ExecOpenIndices(rri, false);
	return rri;
}

void
RpCloseTarget(ResultRelInfo *rri)
{
	if (rri == NULL)
		return;
	ExecCloseIndices(rri);
	table_close(rri->ri_RelationDesc, NoLock);
}

/*
 * A prepared expression compiled for this call, planned first when it was
 * not (ExecPrepareExpr: what an INSERT does with it).
 */
static ExprState *
Compiled(Expr *expr, bool planned, EState *estate)
{
	if (planned)
		return ExecInitExpr(expr, NULL);
	return ExecPrepareExpr(copyObject(expr), estate);
}

/* The defaults of the columns the caller does not set, for this call. */
static ExprState **
CompileDefaults(const RpInsertShape *s, EState *estate)
{
	ExprState **states = palloc0(sizeof(ExprState *) * Max(s->natts, 1));

	for (int a = 0; a < s->natts; a++)
		if (s->defaults[a] != NULL)
			states[a] = Compiled(s->defaults[a], s->default_planned[a], estate);
	return states;
}

/* The CHECK constraints of the table, planned and compiled for this call. */
static void
CompileChecks(ResultRelInfo *rri, const RpInsertShape *s, EState *estate)
{
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
	ExprState **states;

	if (s->ncheck == 0 || constr == NULL || constr->num_check != s->ncheck ||
		RpCheckExprs(rri) != NULL)
		return;					/* the executor compiles them itself */
	states = palloc0(sizeof(ExprState *) * s->ncheck);
	for (int i = 0; i < s->ncheck; i++)
		if (s->checks[i] != NULL)
			states[i] = Compiled(s->checks[i], s->check_planned[i], estate);
	RpCheckExprs(rri) = states;
}

/* Open target i; false when it cannot be written here. */
static bool
OpenOne(RpInserter *ins, RpInsertTarget *t, uint64 generation)
{
	ResultRelInfo *rri = RpOpenTarget(RpRelid(t->rel));
	Relation	rel;
	RpInsertShape *s;

	if (rri == NULL)
		return false;
	rel = rri->ri_RelationDesc;
	ins->targets[ins->ntargets] = t;
	ins->rris[ins->ntargets] = rri;
	ins->slots[ins->ntargets] = table_slot_create(rel, &ins->estate->es_tupleTable);
	s = ShapeReady(t, rel, generation);
	ins->shapes[ins->ntargets] = s;
	ins->ntargets++;
	if (!(s->usable && RpPlainTable(rel) && RpNoInsertTriggers(rel) &&
		  RpPermitted(rel, ACL_INSERT | (t->returning ? ACL_SELECT : 0))))
		return false;
	ins->defaults[ins->ntargets - 1] = CompileDefaults(s, ins->estate);
	CompileChecks(rri, s, ins->estate);
	return true;
}

bool
RpInsertBegin(RpInserter *ins, RpInsertTarget **targets, int n)
{
	uint64		generation = RpCatalogGeneration();

	Assert(n <= RP_INSERT_MAXTARGETS);
	memset(ins, 0, sizeof(*ins));
	/* a read-only transaction (or a standby): the SQL raises 25006 */
	if (XactReadOnly || IsInParallelMode() || ExecutorCheckPerms_hook != NULL)
		return false;
	if (!xact_callback)
	{
		RegisterXactCallback(InsertersAtEnd, NULL);
		xact_callback = true;
	}
	ins->estate = CreateExecutorState();
	open_inserters++;
	ins->caller_cxt = MemoryContextSwitchTo(ins->estate->es_query_cxt);
	for (int i = 0; i < n; i++)
		if (!OpenOne(ins, targets[i], generation))
			return false;

	/*
	 * Taking the tables' locks may have waited for an ALTER and processed
	 * its invalidation: what was learned may be stale, and the SQL serves
	 * this call.
	 */
	if (RpCatalogGeneration() != generation)
		return false;
	/* as SPI does for each statement: see our own earlier writes */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	ins->snapshot_pushed = true;
	ins->estate->es_snapshot = GetActiveSnapshot();
	ins->estate->es_output_cid = GetCurrentCommandId(true);
	return true;
}

TupleTableSlot *
RpInsertRow(RpInserter *ins, int i, const Datum *values, const bool *isnull)
{
	RpInsertTarget *t = ins->targets[i];
	RpInsertShape *s = ins->shapes[i];
	TupleTableSlot *slot = ins->slots[i];
	ExprContext *econtext = GetPerTupleExprContext(ins->estate);

	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * s->natts);
	for (int c = 0; c < t->ngiven; c++)
	{
		slot->tts_values[s->att[c] - 1] = values[c];
		slot->tts_isnull[s->att[c] - 1] = isnull[c];
	}
	for (int a = 0; a < s->natts; a++)
		if (ins->defaults[i][a] != NULL)
			slot->tts_values[a] = ExecEvalExpr(ins->defaults[i][a], econtext,
											   &slot->tts_isnull[a]);
	ExecStoreVirtualTuple(slot);
	ExecSimpleRelationInsert(ins->rris[i], ins->estate, slot);
	return slot;
}

Datum
RpInsertedValue(RpInserter *ins, int i, int c, bool *isnull)
{
	return slot_getattr(ins->slots[i], ins->shapes[i]->att[c], isnull);
}

void
RpInsertEnd(RpInserter *ins)
{
	if (ins->estate == NULL)
		return;
	if (ins->snapshot_pushed)
		PopActiveSnapshot();
	ExecResetTupleTable(ins->estate->es_tupleTable, false);
	for (int i = 0; i < ins->ntargets; i++)
		RpCloseTarget(ins->rris[i]);
	MemoryContextSwitchTo(ins->caller_cxt);
	FreeExecutorState(ins->estate);
	ins->estate = NULL;
	if (open_inserters > 0)
		open_inserters--;
}
