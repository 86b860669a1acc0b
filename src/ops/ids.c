/*
 * ids.c
 *		Ids that never repeat in a database, across DROP EXTENSION and
 *		CREATE EXTENSION too.
 *
 *		Every id redpacket hands out (activity, claim, ledger entry, pass,
 *		activity change, settlement...) comes from a sequence of the
 *		extension, and a logical consumer keys on them: a claim is
 *		(activity_id, claim_id) for the life of the database.  DROP EXTENSION
 *		drops the sequences with the tables, and a new CREATE EXTENSION would
 *		start them at 1 again, so the stream would carry a second claim (1, 1).
 *		What survives the extension is a database-level setting,
 *		redpacket.id_marks (ALTER DATABASE ... SET, pg_db_role_setting): it
 *		records where the sequences stand, and the install script starts them
 *		past it (RpIdsKeep with new_installation).
 *
 *		The marks are "<lsn> <state> <sequence>=<position> ...", where a
 *		position is the last id handed out (0 for none), lsn the WAL insert
 *		position read just before the positions, and state one of:
 *		- dropped: written by the drop guard (guard.c) at the start of a DROP
 *		  that removes the extension, after it locked every table of the
 *		  extension, so no id past these positions is in any committed row.
 *		  The next installation starts each sequence right after its position.
 *		- installed: written by CREATE EXTENSION, ALTER EXTENSION UPDATE,
 *		  rp_post_restore and the reconciler (RpIdsKeepUp) while the extension
 *		  lives.  If the extension then disappears without the guard seeing
 *		  it (event triggers disabled, PostgreSQL 17's event_triggers = off,
 *		  single-user mode), the next installation cannot know the positions
 *		  it reached.  It bounds them instead: each sequence (INCREMENT 1,
 *		  no CACHE, as the extension makes them) writes a WAL record of more
 *		  than 33 bytes for every 33 values it hands out (the value and the
 *		  32 it logs ahead), so after the marks it handed out at most
 *		  32 + (WAL bytes written since lsn) values; the installation starts
 *		  each sequence at position + WAL bytes + RP_IDS_SLACK.  The bound
 *		  holds while the WAL position only grows, which it does on a primary,
 *		  across a standby's promotion and across pg_upgrade (which starts
 *		  the new cluster's WAL after the old one's); and only for growth by
 *		  nextval: a setval jump (a restore, rp_node_sequences on Citus, a
 *		  hand-made setval) makes the marks stale, so whoever can see one
 *		  writes them again: rp_post_restore, and the reconciler at the end of
 *		  every pass when the positions went past what the marks bound.  The
 *		  marks are also rewritten after 1 GB of WAL, so that the bound stays
 *		  small.  A sequence found below its installed mark (set back by a
 *		  restore of an older dump) is moved forward to it: ids up to the
 *		  mark may have been handed out.
 *		A database without marks (a new one, a copy made with CREATE DATABASE
 *		... TEMPLATE, which does not copy settings) gets them from the first
 *		of those writers.  pg_dump/pg_restore into a new database carries
 *		the positions in the sequences' data (setval); pg_dump --create and
 *		pg_upgrade carry the setting too.
 *
 *		The setting is PGC_SUSET, so only a superuser can set or reset it,
 *		also as a placeholder when the library is not loaded; it is read from
 *		the catalog (pg_db_role_setting), never from a session's copy.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "common/int.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "base/base.h"
#include "ops.h"

PG_FUNCTION_INFO_V1(rp_keep_ids);

#define RP_IDS_SETTING "redpacket.id_marks"

/*
 * What an installation adds to the positions of marks it did not write
 * (installed ones, whose drop went unseen): more than the 32 values a
 * sequence logs ahead of its last WAL record.
 */
#define RP_IDS_SLACK 1000

/* Installed marks are written again after this much WAL. */
#define RP_IDS_REFRESH_BYTES ((uint64) 1 << 30)

/* The extension's sequences that marks can name; far more than it has. */
#define RP_IDS_MAX 64

typedef struct RpIdMark
{
	char		name[NAMEDATALEN];	/* the sequence, in schema redpacket */
	Oid			relid;			/* its OID (positions read now only) */
	int64		position;		/* the last id handed out, 0 for none */
} RpIdMark;

typedef struct RpIdMarks
{
	XLogRecPtr	lsn;
	bool		dropped;
	int			n;
	RpIdMark	seq[RP_IDS_MAX];
} RpIdMarks;

static char *rp_id_marks = NULL;	/* the session's copy: never trusted */

/* Parse marks; false when the text is not marks (state of *m undefined). */
static bool
ParseMarks(const char *text, RpIdMarks *m)
{
	char	   *copy = pstrdup(text);
	char	   *save = NULL;
	char	   *tok;
	uint32		hi,
				lo;
	char		tail;

	memset(m, 0, sizeof(*m));
	tok = strtok_r(copy, " ", &save);
	if (tok == NULL || sscanf(tok, "%X/%X%c", &hi, &lo, &tail) != 2)
		return false;
	m->lsn = ((uint64) hi << 32) | lo;
	tok = strtok_r(NULL, " ", &save);
	if (tok == NULL || (strcmp(tok, "dropped") != 0 && strcmp(tok, "installed") != 0))
		return false;
	m->dropped = strcmp(tok, "dropped") == 0;
	while ((tok = strtok_r(NULL, " ", &save)) != NULL)
	{
		char	   *eq = strchr(tok, '=');
		char	   *end;
		long long	v;

		if (eq == NULL || eq == tok || eq - tok >= NAMEDATALEN || m->n >= RP_IDS_MAX)
			return false;
		for (char *c = tok; c < eq; c++)
			if (!(islower((unsigned char) *c) || isdigit((unsigned char) *c) || *c == '_'))
				return false;
		errno = 0;
		v = strtoll(eq + 1, &end, 10);
		if (errno != 0 || end == eq + 1 || *end != '\0' || v < 0)
			return false;
		memcpy(m->seq[m->n].name, tok, eq - tok);
		m->seq[m->n].name[eq - tok] = '\0';
		m->seq[m->n].position = (int64) v;
		m->n++;
	}
	return true;
}

static char *
FormatMarks(const RpIdMarks *m)
{
	StringInfoData s;

	initStringInfo(&s);
	appendStringInfo(&s, "%X/%X %s", LSN_FORMAT_ARGS(m->lsn),
					 m->dropped ? "dropped" : "installed");
	for (int i = 0; i < m->n; i++)
		appendStringInfo(&s, " %s=" INT64_FORMAT, m->seq[i].name, m->seq[i].position);
	return s.data;
}

/* The position marks give a sequence; 0 when they do not name it. */
static int64
Marked(const RpIdMarks *m, const char *name)
{
	for (int i = 0; i < m->n; i++)
		if (strcmp(m->seq[i].name, name) == 0)
			return m->seq[i].position;
	return 0;
}

/* GUC check hook: the setting holds marks, or nothing. */
static bool
CheckIdMarks(char **newval, void **extra, GucSource source)
{
	RpIdMarks	m;

	if (*newval == NULL || **newval == '\0' || ParseMarks(*newval, &m))
		return true;
	GUC_check_errdetail("redpacket.id_marks is written by the extension: \"<lsn> dropped|installed <sequence>=<position> ...\".");
	return false;
}

void
RpIdsInit(void)
{
	DefineCustomStringVariable(RP_IDS_SETTING,
							   "Where this database's redpacket id sequences stand (written by the extension).",
							   "Set per database by CREATE EXTENSION, the drop guard and the reconciler, so that ids never repeat in the database; not for setting by hand.",
							   &rp_id_marks,
							   "",
							   PGC_SUSET, GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE,
							   CheckIdMarks, NULL, NULL);
}

static RpPlan read_setting = {
	"SELECT pg_catalog.substr(c, pg_catalog.length('" RP_IDS_SETTING "=') OPERATOR(pg_catalog.+) 1)"
	"  FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) c"
	" WHERE s.setdatabase OPERATOR(pg_catalog.=) $1"
	"   AND s.setrole OPERATOR(pg_catalog.=) 0::pg_catalog.oid"
	"   AND pg_catalog.starts_with(c, '" RP_IDS_SETTING "=')",
	1, {OIDOID}
};

/* The extension's own relations of one kind ('S' or 'r'), by OID. */
static RpPlan members = {
	"SELECT c.oid, c.relname::pg_catalog.text"
	"  FROM pg_catalog.pg_depend d"
	"  JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid"
	"  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid"
	" WHERE e.extname OPERATOR(pg_catalog.=) 'redpacket'"
	"   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass"
	"   AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
	"   AND d.deptype OPERATOR(pg_catalog.=) 'e'"
	"   AND c.relkind OPERATOR(pg_catalog.=) $1"
	" ORDER BY c.oid",
	1, {CHAROID}
};

static RpPlan advance = {
	"SELECT pg_catalog.setval($1, $2, true)",
	2, {REGCLASSOID, INT8OID}
};

/*
 * The marks stored for this database: false when there are none; *valid
 * says whether they parse.
 */
static bool
ReadMarks(RpIdMarks *m, bool *valid)
{
	Datum		db = ObjectIdGetDatum(MyDatabaseId);
	bool		isnull;

	if (RpExec(&read_setting, &db, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the settings of the database");
	if (SPI_processed == 0)
		return false;
	*valid = ParseMarks(TextDatumGetCString(RpGetDatum(0, 1, &isnull)), m);
	return true;
}

/*
 * The extension's sequences and where they stand now.  The WAL position is
 * read first: an id handed out after a position was read comes with WAL
 * written after lsn (see the file header).
 */
static void
ReadPositions(RpIdMarks *now)
{
	Datum		kind = CharGetDatum('S');
	StringInfoData q;
	uint64		n;

	memset(now, 0, sizeof(*now));
	now->lsn = GetXLogInsertRecPtr();
	if (RpExec(&members, &kind, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list the sequences of extension redpacket");
	n = SPI_processed;
	if (n > RP_IDS_MAX)
		elog(ERROR, "extension redpacket has more than %d sequences", RP_IDS_MAX);
	initStringInfo(&q);
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		Oid			relid = DatumGetObjectId(RpGetDatum(i, 1, &isnull));
		char	   *name = TextDatumGetCString(RpGetDatum(i, 2, &isnull));

		now->seq[i].relid = relid;
		strlcpy(now->seq[i].name, name, NAMEDATALEN);
		/* the last value handed out; a sequence never called has none yet */
		appendStringInfo(&q, "%sSELECT %d, CASE WHEN s.is_called THEN s.last_value"
						 " ELSE s.last_value OPERATOR(pg_catalog.-) 1 END FROM %s s",
						 i == 0 ? "" : " UNION ALL ", (int) i,
						 quote_qualified_identifier("redpacket", name));
	}
	now->n = (int) n;
	if (n == 0)
		return;
	if (SPI_execute(q.data, true, 0) != SPI_OK_SELECT || SPI_processed != n)
		elog(ERROR, "could not read the sequences of extension redpacket");
	for (uint64 r = 0; r < n; r++)
	{
		bool		isnull;
		int			i = DatumGetInt32(RpGetDatum(r, 1, &isnull));

		now->seq[i].position = Max(RpGetInt64(r, 2, 0), 0);
	}
}

/*
 * The marks are this node's: on a Citus cluster each node has its own
 * sequences (rp_node_sequences), and Citus would refuse ALTER DATABASE on a
 * worker and carry the coordinator's to every worker.  So the statement
 * runs with Citus's DDL propagation off, when Citus is loaded.
 */
static void
WriteMarks(const RpIdMarks *m)
{
	char	   *sql = psprintf("ALTER DATABASE %s SET " RP_IDS_SETTING " = %s",
							   quote_identifier(get_database_name(MyDatabaseId)),
							   quote_literal_cstr(FormatMarks(m)));
	bool		citus = GetConfigOption("citus.enable_ddl_propagation", true, false) != NULL;
	int			level = 0;

	if (citus)
	{
		level = NewGUCNestLevel();
		(void) set_config_option("citus.enable_ddl_propagation", "off", PGC_USERSET,
								 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	}
	if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not record the positions of redpacket's sequences");
	if (citus)
		AtEOXact_GUC(true, level);
}

/*
 * Lock every table of the extension: no row can commit an id after this.
 * The extension itself first, as the DROP will: a reconciler pass holds a
 * share lock on it from its start and then uses the tables, so taking the
 * tables first would deadlock with a pass under way (worker.c).
 */
static void
LockTables(void)
{
	Datum		kind = CharGetDatum('r');
	Oid			ext = get_extension_oid("redpacket", true);
	StringInfoData q;

	if (OidIsValid(ext))
		LockDatabaseObject(ExtensionRelationId, ext, 0, AccessExclusiveLock);
	if (RpExec(&members, &kind, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list the tables of extension redpacket");
	if (SPI_processed == 0)
		return;
	initStringInfo(&q);
	appendStringInfoString(&q, "LOCK TABLE ");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		appendStringInfo(&q, "%s%s", i == 0 ? "" : ", ",
						 quote_qualified_identifier("redpacket",
													TextDatumGetCString(RpGetDatum(i, 2, &isnull))));
	}
	appendStringInfoString(&q, " IN ACCESS EXCLUSIVE MODE");
	if (SPI_execute(q.data, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not lock the tables of extension redpacket");
}

void
RpIdsRecord(bool dropped)
{
	RpIdMarks	now;

	if (dropped)
		LockTables();
	ReadPositions(&now);
	now.dropped = dropped;
	WriteMarks(&now);
}

/*
 * Start every sequence at least add past its marked position; the
 * positions in *now follow.
 */
static void
ApplyFloors(const RpIdMarks *m, int64 add, RpIdMarks *now)
{
	for (int i = 0; i < now->n; i++)
	{
		int64		floor;
		Datum		v[2];

		if (pg_add_s64_overflow(Marked(m, now->seq[i].name), add, &floor))
			ereport(ERROR,
					(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
					 errmsg("the recorded position of sequence redpacket.%s is too large",
							now->seq[i].name)));
		if (floor <= now->seq[i].position)
			continue;
		v[0] = ObjectIdGetDatum(now->seq[i].relid);
		v[1] = Int64GetDatum(floor);
		if (RpExec(&advance, v, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not advance sequence redpacket.%s", now->seq[i].name);
		now->seq[i].position = floor;
	}
}

/* Do installed marks still bound every position (see the file header)? */
static bool
Covers(const RpIdMarks *m, const RpIdMarks *now)
{
	uint64		wal;

	if (now->lsn < m->lsn)
		return false;			/* another WAL history: the marks say nothing */
	wal = now->lsn - m->lsn;
	if (wal > RP_IDS_REFRESH_BYTES)
		return false;
	for (int i = 0; i < now->n; i++)
		if ((uint64) now->seq[i].position > (uint64) Marked(m, now->seq[i].name) + wal)
			return false;
	return true;
}

bool
RpIdsKeep(bool new_installation)
{
	RpIdMarks	m;
	RpIdMarks	now;
	bool		valid = false;
	bool		have = ReadMarks(&m, &valid);

	ReadPositions(&now);
	if (have && !valid)
	{
		if (new_installation)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s of database %s is not what redpacket wrote", RP_IDS_SETTING,
							quote_identifier(get_database_name(MyDatabaseId))),
					 errdetail("It says where the ids of an earlier installation stopped, so that this one does not hand them out again."),
					 errhint("If no earlier installation's ids can be in use anywhere, ALTER DATABASE %s RESET %s; then try again.",
							 quote_identifier(get_database_name(MyDatabaseId)), RP_IDS_SETTING)));
		ereport(WARNING,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of database %s is not what redpacket wrote: writing it again",
						RP_IDS_SETTING, quote_identifier(get_database_name(MyDatabaseId)))));
	}
	else if (have && (m.dropped || new_installation))
	{
		/*
		 * Marks of an earlier installation: dropped ones are exact; installed
		 * ones are a bound, WAL bytes since they were written plus the slack.
		 */
		int64		add = 0;

		if (!m.dropped)
			add = (now.lsn > m.lsn ? (int64) Min(now.lsn - m.lsn, (uint64) PG_INT64_MAX / 2) : 0)
				+ RP_IDS_SLACK;
		ApplyFloors(&m, add, &now);
	}
	else if (have)
	{
		/*
		 * Marks of this installation: ids up to them may have been handed
		 * out, so a sequence set back below them (a restore of an older
		 * dump after a DROP and CREATE EXTENSION) goes forward again.
		 */
		ApplyFloors(&m, 0, &now);
		if (Covers(&m, &now))
			return false;
	}
	RpIdsRecord(false);
	return true;
}

void
RpIdsKeepUp(void)
{
	if (RpCatalogVersion() >= RP_CATALOG_1_4)
		(void) RpIdsKeep(false);
}

/*
 * SQL: redpacket.rp_keep_ids(new_installation boolean): the install script
 * calls it with true, the upgrade script and rp_post_restore with false.
 * Returns whether it wrote the marks.
 */
Datum
rp_keep_ids(PG_FUNCTION_ARGS)
{
	bool		wrote;

	RpNoNull(PG_ARGISNULL(0), "new_installation");
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	wrote = RpIdsKeep(PG_GETARG_BOOL(0));
	SPI_finish();
	PG_RETURN_BOOL(wrote);
}
