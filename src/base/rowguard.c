/*
 * rowguard.c
 *		The guard of the tables whose rows only the extension changes.
 *
 *		Activities, stripes, reconciliation state, settlement progress, the
 *		eligibility lists, open problems and the reconciler's own row change
 *		as claims, passes and operators' calls go; every such change is a
 *		statement the extension prepared and runs (RpExecOn) or a direct
 *		update of a stripe, which fires no trigger.  So one statement-level
 *		trigger on each of those tables refuses every UPDATE and DELETE that
 *		is not one of the extension's own statements (or of its install and
 *		upgrade scripts), and every TRUNCATE: a superuser's hand-made change
 *		is an error instead of books the checks might not cover.  An INSERT
 *		into a table pg_dump writes out is let through (pg_restore writes the
 *		rows back with COPY), and the checks report a row that does not
 *		belong; on the tables that are not dumped the trigger fires on INSERT
 *		too.  With session_replication_role = replica no trigger fires,
 *		as on a logical replica applying the publisher's changes; then the
 *		checks are all there is.  The append-only tables (claims, ledger,
 *		history) keep their own trigger, which refuses even the extension.
 *		The direct claim path, which updates a stripe without the executor,
 *		takes the guard for what it is: no trigger of the user's.
 */
#include "postgres.h"

#include "catalog/pg_trigger.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "base/base.h"
#include "base/insert.h"

PG_FUNCTION_INFO_V1(rp_guard);

/* The OID of redpacket.rp_guard() as last seen (the extension can be re-created). */
static Oid	guard_function = InvalidOid;

/*
 * Whether every UPDATE trigger of rel is the guard: BEFORE, for each
 * statement, named guard and calling redpacket.rp_guard().
 */
bool
RpOnlyGuardOnUpdate(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;

	if (td == NULL)
		return true;
	for (int i = 0; i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];
		char	   *fn;
		char	   *ns;
		bool		guard;

		if (!TRIGGER_FOR_UPDATE(t->tgtype))
			continue;
		if (TRIGGER_FOR_ROW(t->tgtype) || !TRIGGER_FOR_BEFORE(t->tgtype) ||
			strcmp(t->tgname, "guard") != 0)
			return false;
		if (t->tgfoid == guard_function)
			continue;
		fn = get_func_name(t->tgfoid);
		ns = get_namespace_name(get_func_namespace(t->tgfoid));
		guard = fn && ns && strcmp(fn, "rp_guard") == 0 && strcmp(ns, "redpacket") == 0;
		if (!guard)
			return false;
		guard_function = t->tgfoid;
	}
	return true;
}

/* Is this statement one of the extension's, or of its script being run? */
static bool
OwnChange(void)
{
	return RpOwnStatement() ||
		(creating_extension && CurrentExtensionObject == get_extension_oid("redpacket", true));
}

static const char *
Operation(TriggerEvent event)
{
	if (TRIGGER_FIRED_BY_UPDATE(event))
		return "UPDATE";
	if (TRIGGER_FIRED_BY_DELETE(event))
		return "DELETE";
	if (TRIGGER_FIRED_BY_TRUNCATE(event))
		return "TRUNCATE";
	return "INSERT";
}

Datum
rp_guard(PG_FUNCTION_ARGS)
{
	TriggerData *td;
	Relation	rel;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rp_guard must be called as a trigger")));
	td = (TriggerData *) fcinfo->context;
	if (OwnChange() && !TRIGGER_FIRED_BY_TRUNCATE(td->tg_event))
		return PointerGetDatum(NULL);

	rel = td->tg_relation;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("%s on %s.%s is not allowed", Operation(td->tg_event),
					get_namespace_name(RelationGetNamespace(rel)),
					RelationGetRelationName(rel)),
			 errdetail("The rows of this table change only through the redpacket functions, which keep them consistent with the claims and the ledger."),
			 errhint("Close, freeze or unfreeze an activity with its function; redpacket.rp_repair_stripes rebuilds wrong stripes.")));
	PG_RETURN_NULL();			/* not reached */
}
