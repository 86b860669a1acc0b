/*
 * guard.c
 *		Event triggers the extension owns, which keep its money records and
 *		its publication safe across DDL.
 *
 *		The drop guard, fired at
 *		ddl_command_start for DROP EXTENSION, DROP SCHEMA and DROP OWNED,
 *		refuses a command that would remove redpacket's tables while they
 *		hold any claim or ledger entry, unless redpacket.allow_drop is on.
 *		An event trigger (rather than a ProcessUtility hook) because it works
 *		whether or not the library is loaded in the session: calling the
 *		trigger function loads it.  It looks at the parse tree, so it can
 *		tell which extension, schema or role a command names before anything
 *		is dropped, and count the rows while the tables still exist.
 *
 *		The publication keeper.  PostgreSQL 15 cannot make a publication an
 *		extension member, and pg_dump writes a publication without the
 *		extension tables in it; restoring such a dump into a database where
 *		CREATE EXTENSION already made redpacket_events would fail ("already
 *		exists") or leave it empty.  So at ddl_command_start of
 *		CREATE PUBLICATION redpacket_events the keeper drops the one the
 *		extension made (the command recreates it with the dump's options), and
 *		at ddl_command_end puts claim, ledger, activity_change and
 *		claim_settlement (those the catalog has) back into it.  Event triggers
 *		are restored last by pg_dump and pg_upgrade, so neither fires while a
 *		binary upgrade recreates the publication with its tables.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "nodes/parsenodes.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "redpacket.h"

PG_FUNCTION_INFO_V1(rp_drop_guard);
PG_FUNCTION_INFO_V1(rp_publication_keeper);

#define RP_PUBLICATION "redpacket_events"

static RpPlan money_rows = {
	"SELECT (SELECT pg_catalog.count(*) FROM redpacket.claim),"
	"       (SELECT pg_catalog.count(*) FROM redpacket.ledger)",
	0, {InvalidOid}
};

static RpPlan extension_info = {
	"SELECT e.extowner, n.nspname::pg_catalog.text"
	"  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n"
	"    ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
	" WHERE e.oid OPERATOR(pg_catalog.=) $1",
	1, {OIDOID}
};

/* The role that owns the extension, and its schema (inside SPI_connect). */
static void
ExtensionInfo(Oid extoid, Oid *owner, char **schema)
{
	Datum		ext = ObjectIdGetDatum(extoid);
	bool		isnull;

	if (RpExec(&extension_info, &ext, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read the owner and schema of extension redpacket");
	*owner = DatumGetObjectId(RpGetDatum(0, 1, &isnull));
	*schema = TextDatumGetCString(RpGetDatum(0, 2, &isnull));
}

/* Does a list of String nodes name this one? */
static bool
NamesIt(List *names, const char *name)
{
	ListCell   *lc;

	foreach(lc, names)
	{
		Node	   *n = (Node *) lfirst(lc);

		if (IsA(n, String) && strcmp(strVal(n), name) == 0)
			return true;
	}
	return false;
}

/* Would this statement drop the extension (and so its tables)?  Inside SPI. */
static bool
DropsRedpacket(Node *parsetree, Oid extoid)
{
	Oid			owner;
	char	   *schema;
	ListCell   *lc;

	ExtensionInfo(extoid, &owner, &schema);
	if (IsA(parsetree, DropStmt))
	{
		DropStmt   *stmt = (DropStmt *) parsetree;

		if (stmt->removeType == OBJECT_EXTENSION)
			return NamesIt(stmt->objects, "redpacket");
		/* without CASCADE, the dependency check refuses it anyway */
		if (stmt->removeType == OBJECT_SCHEMA && stmt->behavior == DROP_CASCADE)
			return NamesIt(stmt->objects, schema);
		return false;
	}
	if (IsA(parsetree, DropOwnedStmt))
	{
		foreach(lc, ((DropOwnedStmt *) parsetree)->roles)
		{
			Oid			role = get_rolespec_oid(lfirst_node(RoleSpec, lc), true);

			if (OidIsValid(role) && role == owner)
				return true;
		}
	}
	return false;
}

/*
 * The event trigger function.  Quiet unless the command would drop
 * redpacket while money records exist and redpacket.allow_drop is off.
 */
Datum
rp_drop_guard(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	Oid			extoid;
	int64		claims,
				entries;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rp_drop_guard must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;

	extoid = get_extension_oid("redpacket", true);
	if (rp_allow_drop || !OidIsValid(extoid))
		PG_RETURN_VOID();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!DropsRedpacket(trigdata->parsetree, extoid))
	{
		SPI_finish();
		PG_RETURN_VOID();
	}
	if (RpExec(&money_rows, NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count the money records of redpacket");
	claims = RpGetInt64(0, 1, 0);
	entries = RpGetInt64(0, 2, 0);
	SPI_finish();

	if (claims > 0 || entries > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("%s would delete " INT64_FORMAT " claims and " INT64_FORMAT " ledger entries of extension redpacket",
						GetCommandTagName(trigdata->tag), claims, entries),
				 errdetail("The claims and the ledger are money records; dropping the extension drops its tables with every row in them."),
				 errhint("Dump them first, e.g. pg_dump -Fc -n redpacket -e redpacket -f redpacket.dump %s; then SET redpacket.allow_drop = on and run the command again.",
						 quote_identifier(get_database_name(MyDatabaseId)))));
	PG_RETURN_VOID();
}

static RpPlan publication_exists = {
	"SELECT 1 FROM pg_catalog.pg_publication p"
	" WHERE p.pubname OPERATOR(pg_catalog.=) '" RP_PUBLICATION "'",
	0, {InvalidOid}
};

/*
 * The extension's published tables that are not (yet) in the publication;
 * those of a later version than the catalog's do not exist and are skipped.
 */
static RpPlan publication_missing = {
	"SELECT t.name FROM (VALUES ('claim'), ('ledger'), ('activity_change'),"
	"                           ('claim_settlement')) t(name)"
	" WHERE pg_catalog.to_regclass('redpacket.' OPERATOR(pg_catalog.||) t.name) IS NOT NULL"
	"   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r"
	"                     JOIN pg_catalog.pg_publication p ON p.oid OPERATOR(pg_catalog.=) r.prpubid"
	"                    WHERE p.pubname OPERATOR(pg_catalog.=) '" RP_PUBLICATION "'"
	"                      AND r.prrelid OPERATOR(pg_catalog.=)"
	"                          pg_catalog.to_regclass('redpacket.' OPERATOR(pg_catalog.||) t.name))"
	" ORDER BY 1",
	0, {InvalidOid}
};

static void
RunUtility(const char *sql)
{
	if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not run \"%s\"", sql);
}

/*
 * Event trigger function for CREATE PUBLICATION: see the file header.
 * Quiet for every publication but redpacket_events.
 */
Datum
rp_publication_keeper(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	CreatePublicationStmt *stmt;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rp_publication_keeper must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;
	if (IsBinaryUpgrade || !IsA(trigdata->parsetree, CreatePublicationStmt))
		PG_RETURN_VOID();
	stmt = (CreatePublicationStmt *) trigdata->parsetree;
	if (strcmp(stmt->pubname, RP_PUBLICATION) != 0 || stmt->for_all_tables)
		PG_RETURN_VOID();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (strcmp(trigdata->event, "ddl_command_start") == 0)
	{
		if (RpExec(&publication_exists, NULL, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not look up publication " RP_PUBLICATION);
		if (SPI_processed > 0)
			RunUtility("DROP PUBLICATION " RP_PUBLICATION);
	}
	else
	{
		uint64		n;
		char	  **names;

		if (RpExec(&publication_missing, NULL, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the tables of publication " RP_PUBLICATION);
		n = SPI_processed;
		names = palloc(sizeof(char *) * Max(n, 1));
		for (uint64 i = 0; i < n; i++)
			names[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		for (uint64 i = 0; i < n; i++)
			RunUtility(psprintf("ALTER PUBLICATION " RP_PUBLICATION " ADD TABLE redpacket.%s",
								names[i]));
	}
	SPI_finish();
	PG_RETURN_VOID();
}
