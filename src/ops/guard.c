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
 *		is dropped, and count the rows while the tables still exist.  Any
 *		drop it lets through first records where the extension's sequences
 *		stand (ids.c), so that a later CREATE EXTENSION hands out none of
 *		those ids again.
 *
 *		The publication keeper.  PostgreSQL 15 cannot make a publication an
 *		extension member, and pg_dump writes a publication without the
 *		extension tables in it; restoring such a dump into a database where
 *		CREATE EXTENSION already made redpacket_events would fail ("already
 *		exists") or leave it empty.  So at ddl_command_start of
 *		CREATE PUBLICATION redpacket_events the keeper drops the one the
 *		extension made (the command recreates it with the dump's options), and
 *		at ddl_command_end puts claim, ledger, activity_change and
 *		claim_settlement (those the catalog has) back into it.  The pg_dump
 *		of PostgreSQL 18 also writes the publication's tables, as
 *		ALTER PUBLICATION redpacket_events ADD TABLE ONLY redpacket.claim
 *		after the CREATE PUBLICATION, which would fail ("already member"):
 *		from 1.4 the keeper also fires at ddl_command_start of
 *		ALTER PUBLICATION and, for such a command, first drops a table it
 *		put in (a plain member: no column list, no row filter), so that the
 *		command adds it as the dump says.  Event triggers are restored last
 *		by pg_dump and pg_upgrade, so none fires while a binary upgrade
 *		recreates the publication with its tables.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "nodes/parsenodes.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/base.h"
#include "ops.h"

bool		rp_allow_drop = false;

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
	if (!OidIsValid(extoid))
		PG_RETURN_VOID();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!DropsRedpacket(trigdata->parsetree, extoid))
	{
		SPI_finish();
		PG_RETURN_VOID();
	}
	if (!rp_allow_drop)
	{
		if (RpExec(&money_rows, NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "could not count the money records of redpacket");
		claims = RpGetInt64(0, 1, 0);
		entries = RpGetInt64(0, 2, 0);
		if (claims > 0 || entries > 0)
			ereport(ERROR,
					(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
					 errmsg("%s would delete " INT64_FORMAT " claims and " INT64_FORMAT " ledger entries of extension redpacket",
							GetCommandTagName(trigdata->tag), claims, entries),
					 errdetail("The claims and the ledger are money records; dropping the extension drops its tables with every row in them."),
					 errhint("Dump them first, e.g. pg_dump -Fc -n redpacket -e redpacket -f redpacket.dump %s; then SET redpacket.allow_drop = on and run the command again.",
							 quote_identifier(get_database_name(MyDatabaseId)))));
	}
	/* the next installation in this database continues after these ids */
	RpIdsRecord(true);
	SPI_finish();
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

/* Is the table ($1) in the publication with no column list and no row filter? */
static RpPlan publication_plain_member = {
	"SELECT 1 FROM pg_catalog.pg_publication_rel r"
	"  JOIN pg_catalog.pg_publication p ON p.oid OPERATOR(pg_catalog.=) r.prpubid"
	" WHERE p.pubname OPERATOR(pg_catalog.=) '" RP_PUBLICATION "'"
	"   AND r.prrelid OPERATOR(pg_catalog.=) $1"
	"   AND r.prqual IS NULL AND r.prattrs IS NULL",
	1, {OIDOID}
};

static void
RunUtility(const char *sql)
{
	if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not run \"%s\"", sql);
}

/*
 * At ddl_command_start of ALTER PUBLICATION redpacket_events ADD TABLE:
 * drop from the publication each of the extension's published tables that
 * the command adds and that is in it already as a plain member.  Inside
 * SPI_connect.
 */
static void
ReaddTables(AlterPublicationStmt *stmt)
{
	static const char *const tables[] = {"claim", "ledger", "activity_change", "claim_settlement"};
	Oid			nsp = get_namespace_oid("redpacket", true);
	ListCell   *lc;

	if (stmt->action != AP_AddObjects || !OidIsValid(nsp))
		return;
	foreach(lc, stmt->pubobjects)
	{
		PublicationObjSpec *obj = (PublicationObjSpec *) lfirst(lc);
		Oid			relid;

		if (obj->pubobjtype != PUBLICATIONOBJ_TABLE || obj->pubtable == NULL)
			continue;
		relid = RangeVarGetRelid(obj->pubtable->relation, NoLock, true);
		for (int i = 0; i < lengthof(tables); i++)
		{
			Datum		arg = ObjectIdGetDatum(relid);

			if (!OidIsValid(relid) || relid != get_relname_relid(tables[i], nsp))
				continue;
			if (RpExec(&publication_plain_member, &arg, NULL, false, 1) != SPI_OK_SELECT)
				elog(ERROR, "could not read the tables of publication " RP_PUBLICATION);
			if (SPI_processed > 0)
				RunUtility(psprintf("ALTER PUBLICATION " RP_PUBLICATION " DROP TABLE redpacket.%s",
									tables[i]));
		}
	}
}

/*
 * Event trigger function for CREATE PUBLICATION and (from 1.4)
 * ALTER PUBLICATION: see the file header.  Quiet for every publication
 * but redpacket_events.
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
	if (IsBinaryUpgrade)
		PG_RETURN_VOID();
	if (IsA(trigdata->parsetree, AlterPublicationStmt))
	{
		AlterPublicationStmt *alter = (AlterPublicationStmt *) trigdata->parsetree;

		if (strcmp(alter->pubname, RP_PUBLICATION) != 0 ||
			strcmp(trigdata->event, "ddl_command_start") != 0)
			PG_RETURN_VOID();
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		ReaddTables(alter);
		SPI_finish();
		PG_RETURN_VOID();
	}
	if (!IsA(trigdata->parsetree, CreatePublicationStmt))
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
