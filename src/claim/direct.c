/*
 * direct.c
 *		The fast path's executor-direct backend (take.h), on this node's own
 *		tables or, on a Citus node that holds the activity, on its shard
 *		tables (scaleout/scaleout.c names them, holding Citus's shard metadata locks):
 *		what the SPI backend's one statement (fast.c) does, in the same order
 *		and with the same visibility, without planning, plan revalidation or executor
 *		start-up, which are most of the SPI path's cost.  After the user's
 *		and the stripe's locks, a fresh snapshot; the duplicate probe on the
 *		claim's unique key; for a restricted activity, the user's row in
 *		eligible; the stripe row found by its key and updated only when it is
 *		not halted, at the revision the caller read and has the undealt money
 *		and packet (a row updated concurrently is followed to its newest
 *		version and checked again, as READ COMMITTED does); the claim
 *		inserted through the executor's simple-relation interface (as
 *		logical replication's apply does: its constraints and every index),
 *		with claim_id from its column default's sequence and claimed_at =
 *		now().
 *
 *		It steps aside (RP_DIRECT_UNUSED: the SPI backend runs) when
 *		redpacket.direct_claims is off, the transaction is read-only, the
 *		activity allows more than one claim per user, or a table is not the
 *		plain table the SQL statement would write the same way: user
 *		triggers on INSERT into claim or UPDATE of stripe, rules, row-level
 *		security, inheritance children or a parent, generated or extra
 *		columns, a column typmod, a changed claim_id default, a missing
 *		privilege; or when an auditing or access-control module hooks the
 *		executor's permission checks, or the tables changed while the call
 *		waited for their locks.  What it learns of the tables' shape is kept
 *		until the catalog's generation moves (catalog.c), for shards until an
 *		invalidation of one of them (a shard move).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/int.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "base/base.h"
#include "scaleout/scaleout.h"
#include "rules.h"
#include "stripe.h"
#include "take.h"

bool		rp_direct_claims = true;

/* The columns the direct path reads and writes, by name. */
enum
{
	C_ACTIVITY, C_CLAIM_ID, C_USER, C_REQUEST, C_KEY, C_AMOUNT, C_STRIPE, C_CLAIMED_AT,
	C_NCOLS
};
enum
{
	S_ACTIVITY, S_STRIPE, S_BALANCE, S_PACKETS, S_CLAIMS, S_HALTED,
	S_NREQUIRED,				/* 1.0 to 1.3 have these; 1.4 has the rest too */
	S_REVISION = S_NREQUIRED, S_DEALT, S_DEALT_UNITS, S_DEALT_COUNT, S_NCOLS
};
enum
{
	E_ACTIVITY, E_USER, E_NCOLS
};
static const char *const claim_cols[C_NCOLS] = {
	"activity_id", "claim_id", "user_id", "request_id", "idempotency_key", "amount",
	"stripe", "claimed_at"
};
static const Oid claim_types[C_NCOLS] = {
	INT8OID, INT8OID, TEXTOID, TEXTOID, TEXTOID, NUMERICOID, INT4OID, TIMESTAMPTZOID
};
static const char *const stripe_cols[S_NCOLS] = {
	"activity_id", "stripe", "balance", "packets", "claims", "halted",
	"revision", "dealt", "dealt_units", "dealt_count"
};
static const Oid stripe_types[S_NCOLS] = {
	INT8OID, INT4OID, INT8OID, INT4OID, INT8OID, BOOLOID,
	INT8OID, INT8ARRAYOID, INT8OID, INT4OID
};

/* What the direct path knows about the tables, for one catalog generation. */
typedef struct DirectCache
{
	uint64		generation;		/* 0: not built */
	bool		usable;			/* the tables have the expected shape */
	Oid			claim;
	Oid			claim_key;		/* unique (activity_id, user_id, idempotency_key) */
	Oid			claim_seq;		/* the sequence of claim_id's default */
	Oid			stripe;
	Oid			stripe_key;		/* primary key (activity_id, stripe) */
	Oid			eligible;		/* 1.4 */
	Oid			eligible_key;	/* primary key (activity_id, user_id) */
	AttrNumber	c[C_NCOLS];
	AttrNumber	s[S_NCOLS];
	Oid			key_coll[3];	/* collations of the claim key's columns */
	Oid			eligible_coll[2];
} DirectCache;

static DirectCache cache;		/* this node's own tables */

/* The tables of a Citus node's shards, one entry per claim shard. */
typedef struct DirectShards
{
	Oid			claim;			/* hash key: the claim shard */
	Oid			stripe;			/* the stripe shard and the sequence asked for */
	Oid			seq;
	bool		valid;			/* not invalidated since it was built */
	DirectCache c;
} DirectShards;

#define RP_DIRECT_SHARDS_MAX 256	/* entries kept; then the cache starts over */

static HTAB *shard_cache = NULL;
static bool shard_callback = false;

/* The shape of the tables the current call writes (RpDirectTake). */
static const DirectCache *dc = NULL;
static DirectShards *dc_shards = NULL;	/* its entry, when they are shards */

/*
 * Column numbers of the named columns, checking their types; the first
 * nrequired must exist, the others may be absent (InvalidAttrNumber).
 */
static bool
FindColumns(Relation rel, const char *const *names, const Oid *types, int n,
			int nrequired, AttrNumber *out)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			live = 0;
	int			found = 0;

	for (int i = 0; i < n; i++)
	{
		out[i] = InvalidAttrNumber;
		for (int a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, a);

			/* written or updated, each one (the keys too: the safe side) */
			if (RpColumnIs(att, names[i], types[i], true))
				out[i] = att->attnum;
		}
		if (out[i] != InvalidAttrNumber)
			found++;
		else if (i < nrequired)
			return false;
	}
	/* no other live column: the SQL would fill it from its default */
	for (int a = 0; a < desc->natts; a++)
		live += TupleDescAttr(desc, a)->attisdropped ? 0 : 1;
	return live == found;
}

/* The sequence of a "nextval('seq'::regclass)" column default, or InvalidOid. */
static Oid
DefaultSequence(Relation rel, AttrNumber attnum)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;

	for (int i = 0; constr != NULL && i < constr->num_defval; i++)
	{
		Node	   *expr;
		FuncExpr   *f;
		Const	   *c;

		if (constr->defval[i].adnum != attnum)
			continue;
		expr = stringToNode(constr->defval[i].adbin);
		if (!IsA(expr, FuncExpr))
			return InvalidOid;
		f = (FuncExpr *) expr;
		if (f->funcid != F_NEXTVAL || list_length(f->args) != 1 ||
			!IsA(linitial(f->args), Const))
			return InvalidOid;
		c = (Const *) linitial(f->args);
		if (c->consttype != REGCLASSOID || c->constisnull)
			return InvalidOid;
		return DatumGetObjectId(c->constvalue);
	}
	return InvalidOid;
}

/*
 * The btree index of rel whose key columns are exactly keys (of types
 * keytypes, by the default equality of their opclass), unique, valid and
 * without expressions or a predicate; InvalidOid if there is none.
 */
static Oid
FindKeyIndex(Relation rel, const AttrNumber *keys, const Oid *keytypes, int n,
			 Oid *collations)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	Oid			found = InvalidOid;

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = idx->rd_index;
		bool		match = ind->indisunique && ind->indisvalid && ind->indimmediate &&
			idx->rd_rel->relam == BTREE_AM_OID &&
			IndexRelationGetNumberOfKeyAttributes(idx) == n &&
			RelationGetIndexExpressions(idx) == NIL &&
			RelationGetIndexPredicate(idx) == NIL;

		for (int k = 0; match && k < n; k++)
			match = ind->indkey.values[k] == keys[k] && idx->rd_opcintype[k] == keytypes[k];
		if (match && !OidIsValid(found))
		{
			found = RelationGetRelid(idx);
			for (int k = 0; collations && k < n; k++)
				collations[k] = idx->rd_indcollation[k];
		}
		index_close(idx, AccessShareLock);
	}
	list_free(indexes);
	return found;
}

/* The eligible table's primary key, when the catalog has the table. */
static void
FindEligibleKey(DirectCache *c)
{
	static const Oid types[E_NCOLS] = {INT8OID, TEXTOID};
	Relation	rel;
	AttrNumber	keys[E_NCOLS];

	if (!OidIsValid(c->eligible))
		return;
	rel = table_open(c->eligible, AccessShareLock);
	for (int k = 0; k < E_NCOLS; k++)
		keys[k] = (AttrNumber) (k + 1);
	c->eligible_key = FindKeyIndex(rel, keys, types, E_NCOLS, c->eligible_coll);
	table_close(rel, AccessShareLock);
}

/*
 * Check the shape of the tables claim_rel and stripe_rel (eligible_rel may
 * be InvalidOid); claim_seq is the sequence of claim ids, or InvalidOid for
 * claim_id's column default.
 */
static bool
DirectCacheBuild(DirectCache *c, Oid claim_rel, Oid stripe_rel, Oid eligible_rel,
				 Oid claim_seq)
{
	Relation	claim;
	Relation	stripe;
	AttrNumber	keys[3];
	Oid			keytypes[3] = {INT8OID, TEXTOID, TEXTOID};
	Oid			pktypes[2] = {INT8OID, INT4OID};

	memset(c, 0, sizeof(*c));
	c->claim = claim_rel;
	c->stripe = stripe_rel;
	c->eligible = eligible_rel;
	if (!OidIsValid(c->claim) || !OidIsValid(c->stripe))
		return false;

	claim = try_table_open(c->claim, AccessShareLock);
	stripe = claim ? try_table_open(c->stripe, AccessShareLock) : NULL;
	if (stripe == NULL)
	{
		if (claim)
			table_close(claim, AccessShareLock);
		return false;			/* dropped since it was named (a shard moved away) */
	}
	if (claim->rd_rel->relkind == RELKIND_RELATION &&
		stripe->rd_rel->relkind == RELKIND_RELATION &&
		FindColumns(claim, claim_cols, claim_types, C_NCOLS, C_NCOLS, c->c) &&
		FindColumns(stripe, stripe_cols, stripe_types, S_NCOLS, S_NREQUIRED, c->s))
	{
		c->claim_seq = OidIsValid(claim_seq) ? claim_seq
			: DefaultSequence(claim, c->c[C_CLAIM_ID]);
		keys[0] = c->c[C_ACTIVITY];
		keys[1] = c->c[C_USER];
		keys[2] = c->c[C_KEY];
		c->claim_key = FindKeyIndex(claim, keys, keytypes, 3, c->key_coll);
		keys[0] = c->s[S_ACTIVITY];
		keys[1] = c->s[S_STRIPE];
		c->stripe_key = FindKeyIndex(stripe, keys, pktypes, 2, NULL);
	}
	table_close(stripe, AccessShareLock);
	table_close(claim, AccessShareLock);
	FindEligibleKey(c);
	return OidIsValid(c->claim_seq) && OidIsValid(c->claim_key) && OidIsValid(c->stripe_key);
}

/* True when the shape of this node's own tables is known for the generation and fit. */
static bool
DirectCacheReady(void)
{
	uint64		generation = RpCatalogGeneration();
	DirectCache built;

	if (cache.generation == generation)
		return cache.usable;
	built.usable = DirectCacheBuild(&built, RpRelid(RP_REL_CLAIM), RpRelid(RP_REL_STRIPE),
									RpRelid(RP_REL_ELIGIBLE), InvalidOid);
	/* an invalidation while building means the result may be stale already */
	built.generation = RpCatalogGeneration() == generation ? generation : 0;
	cache = built;
	return built.usable && built.generation != 0;
}

/* A shard entry is stale after an invalidation of one of its relations. */
static void
ShardInvalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS scan;
	DirectShards *e;

	if (shard_cache == NULL)
		return;
	hash_seq_init(&scan, shard_cache);
	while ((e = hash_seq_search(&scan)) != NULL)
		if (relid == InvalidOid || relid == e->c.claim || relid == e->c.claim_key ||
			relid == e->c.claim_seq || relid == e->c.stripe || relid == e->c.stripe_key)
			e->valid = false;
}

/*
 * The shape of a Citus node's shard tables of an activity (scaleout/scaleout.c
 * names them, holding Citus's shard metadata locks), or NULL when not fit.  The
 * sequence is redpacket.claim_id_seq, what the distributed table's default
 * draws (a shard has no column default).
 */
static const DirectCache *
ShardCacheReady(Oid claim_rel, Oid stripe_rel, Oid claim_seq)
{
	DirectShards *e;
	bool		found;

	if (!shard_callback)
	{
		RpOnRelcacheInvalidation(ShardInvalidate);
		shard_callback = true;
	}
	if (shard_cache != NULL && hash_get_num_entries(shard_cache) >= RP_DIRECT_SHARDS_MAX &&
		hash_search(shard_cache, &claim_rel, HASH_FIND, NULL) == NULL)
	{
		hash_destroy(shard_cache);
		shard_cache = NULL;
	}
	if (shard_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(DirectShards);
		ctl.hcxt = TopMemoryContext;
		shard_cache = hash_create("redpacket direct shards", 16, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	e = hash_search(shard_cache, &claim_rel, HASH_ENTER, &found);
	if (!found || !e->valid || e->stripe != stripe_rel || e->seq != claim_seq)
	{
		e->stripe = stripe_rel;
		e->seq = claim_seq;
		e->valid = true;
		e->c.usable = DirectCacheBuild(&e->c, claim_rel, stripe_rel, InvalidOid, claim_seq);
		if (!e->valid)
			return NULL;		/* invalidated while it was built */
	}
	dc_shards = e;
	return e->c.usable ? &e->c : NULL;
}

/*
 * The shape of the tables this claim writes: this node's own, or on a
 * Citus node the activity's shards; NULL when the direct path cannot write
 * them.
 */
static const DirectCache *
TablesFor(const RpActivity *act)
{
	Oid			claim_rel;
	Oid			stripe_rel;
	Oid			claim_seq;

	dc_shards = NULL;
	if (!RpDistributed())
		return DirectCacheReady() ? &cache : NULL;
	if (!RpShardTables(act->id, &claim_rel, &stripe_rel, &claim_seq))
		return NULL;
	return ShardCacheReady(claim_rel, stripe_rel, claim_seq);
}

/* What TablesFor answered is still true (no invalidation since). */
static bool
TablesStill(uint64 generation)
{
	return dc_shards ? dc_shards->valid : RpCatalogGeneration() == generation;
}

/*
 * Whether the opened tables are written exactly as the SQL statement would
 * write them (insert.h's rules), with no trigger on UPDATE of stripe
 * either but the guard, which lets the extension's own changes through.
 * Checked on every call (the relcache entries are at hand), so a trigger
 * created or dropped is seen at once.
 */
static bool
PlainTables(Relation claim, Relation stripe)
{
	return RpOnlyGuardOnUpdate(stripe) && RpPlainTable(claim) && RpPlainTable(stripe) &&
		RpNoInsertTriggers(claim);
}

/*
 * The privileges the SQL statement would need (the function runs as the
 * tables' owner, who has them unless revoked); without them the SQL runs
 * and raises the error.
 */
static bool
Permitted(Relation claim, Relation stripe)
{
	return RpPermitted(claim, ACL_INSERT | ACL_SELECT) &&
		RpPermitted(stripe, ACL_UPDATE | ACL_SELECT);
}

/*
 * Find the row of the index key (equality on every key column) visible to
 * the snapshot into slot.  Returns false if there is none.
 */
static bool
FetchByKey(Relation rel, Oid index, Snapshot snap, ScanKey keys, int nkeys,
		   TupleTableSlot *slot)
{
	Relation	idx = index_open(index, RowExclusiveLock);
	IndexScanDesc scan = RpIndexBeginScan(rel, idx, snap, nkeys, 0);
	bool		found;

	index_rescan(scan, keys, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	index_close(idx, NoLock);
	return found;
}

/* An optional column's int64 value, 0 when the catalog has no such column. */
static int64
OptionalInt(TupleTableSlot *slot, AttrNumber att)
{
	bool		isnull;
	Datum		d;

	if (att == InvalidAttrNumber)
		return 0;
	d = slot_getattr(slot, att, &isnull);
	if (isnull)
		return 0;
	return TupleDescAttr(slot->tts_tupleDescriptor, att - 1)->atttypid == INT4OID ?
		DatumGetInt32(d) : DatumGetInt64(d);
}

/* The stripe row's dealt amounts, next first (none when NULL). */
static Datum *
DealtOf(TupleTableSlot *slot, int *n)
{
	bool		isnull;
	Datum		d;
	Datum	   *elems = NULL;

	*n = 0;
	if (dc->s[S_DEALT] == 0)
		return NULL;
	d = slot_getattr(slot, dc->s[S_DEALT], &isnull);
	if (!isnull)
		deconstruct_array(DatumGetArrayTypeP(d), INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
						  &elems, NULL, n);
	return elems;
}

/*
 * What the stripe row in slot pays the claim, in minor units; 0 when it
 * cannot (halted, at another revision than the claim read the activity
 * with, or not enough).  A fixed amount (units > 0) needs that much undealt
 * money and an undealt packet (never what is dealt to lucky draws).  A
 * lucky draw (units 0) takes the next amount dealt to the stripe, or, on an
 * activity that does not deal (deal false), draws the double mean of the
 * stripe's balance and packets; a dealing activity's stripe with nothing
 * dealt cannot pay here (the careful path deals).
 */
static int64
StripePays(TupleTableSlot *slot, int64 units, int64 revision, bool deal)
{
	bool		isnull;
	Datum		d;
	int64		balance;
	int32		packets;

	d = slot_getattr(slot, dc->s[S_HALTED], &isnull);
	if (isnull || DatumGetBool(d))
		return 0;
	if (OptionalInt(slot, dc->s[S_REVISION]) != revision)
		return 0;
	d = slot_getattr(slot, dc->s[S_BALANCE], &isnull);
	if (isnull)
		return 0;
	balance = DatumGetInt64(d);
	d = slot_getattr(slot, dc->s[S_PACKETS], &isnull);
	packets = isnull ? -1 : DatumGetInt32(d);
	if (units > 0)
		return RpFixedFits(balance - OptionalInt(slot, dc->s[S_DEALT_UNITS]),
						   packets - OptionalInt(slot, dc->s[S_DEALT_COUNT]), packets >= 0,
						   units) ? units : 0;
	if (OptionalInt(slot, dc->s[S_DEALT_COUNT]) > 0)
	{
		int			n;
		Datum	   *dealt = DealtOf(slot, &n);

		return n > 0 ? DatumGetInt64(dealt[0]) : 0;
	}
	if (deal || packets <= 0 || balance <= 0)
		return 0;
	return RpDrawUnits(balance, packets);
}

/*
 * The row of old with units, one packet and one more claim taken; a lucky
 * draw's dealt amount (dealt) leaves the stripe's dealt amounts too.
 */
static void
StripeDebited(TupleTableSlot *old, TupleTableSlot *new, int64 units, bool dealt)
{
	int64		claims;

	slot_getallattrs(old);
	ExecClearTuple(new);
	memcpy(new->tts_values, old->tts_values, sizeof(Datum) * old->tts_nvalid);
	memcpy(new->tts_isnull, old->tts_isnull, sizeof(bool) * old->tts_nvalid);
	new->tts_values[dc->s[S_BALANCE] - 1] =
		Int64GetDatum(DatumGetInt64(old->tts_values[dc->s[S_BALANCE] - 1]) - units);
	if (!old->tts_isnull[dc->s[S_PACKETS] - 1])
		new->tts_values[dc->s[S_PACKETS] - 1] =
			Int32GetDatum(DatumGetInt32(old->tts_values[dc->s[S_PACKETS] - 1]) - 1);
	if (pg_add_s64_overflow(DatumGetInt64(old->tts_values[dc->s[S_CLAIMS] - 1]), 1, &claims))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	new->tts_values[dc->s[S_CLAIMS] - 1] = Int64GetDatum(claims);
	if (dealt)
	{
		int			n;
		Datum	   *rest = DealtOf(old, &n);

		new->tts_isnull[dc->s[S_DEALT] - 1] = n <= 1;
		if (n > 1)
			new->tts_values[dc->s[S_DEALT] - 1] =
				PointerGetDatum(construct_array(rest + 1, n - 1, INT8OID, 8, FLOAT8PASSBYVAL,
												TYPALIGN_DOUBLE));
		new->tts_values[dc->s[S_DEALT_UNITS] - 1] =
			Int64GetDatum(DatumGetInt64(old->tts_values[dc->s[S_DEALT_UNITS] - 1]) - units);
		new->tts_values[dc->s[S_DEALT_COUNT] - 1] =
			Int32GetDatum(DatumGetInt32(old->tts_values[dc->s[S_DEALT_COUNT] - 1]) - 1);
	}
	ExecStoreVirtualTuple(new);
}

/*
 * The stripe's conditional decrement: UPDATE ... WHERE key AND balance >=
 * units AND packets left AND NOT halted, under READ COMMITTED.  A row
 * updated since the snapshot is locked in its newest version and checked
 * again, as the executor's EvalPlanQual does.  Returns false, having
 * written nothing, when the stripe cannot pay or is gone.
 */
static bool
DebitStripe(ResultRelInfo *rri, EState *estate, const RpActivity *act, int stripe,
			int64 *units)
{
	bool		deal = RpActivityDeals(act);
	Relation	rel = rri->ri_RelationDesc;
	TupleTableSlot *old = table_slot_create(rel, &estate->es_tupleTable);
	TupleTableSlot *new = table_slot_create(rel, &estate->es_tupleTable);
	ScanKeyData keys[2];
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	RpUpdateIndexes update_indexes;

	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(act->id));
	ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(stripe));
	if (!FetchByKey(rel, dc->stripe_key, estate->es_snapshot, keys, 2, old))
		return false;

	for (;;)
	{
		TM_Result	r;
		ItemPointerData tid = old->tts_tid;
		bool		isnull;

		int64		pays = StripePays(old, *units, act->revision, deal);

		if (pays == 0)
			return false;
		StripeDebited(old, new, pays, *units == 0 && OptionalInt(old, dc->s[S_DEALT_COUNT]) > 0);
		if (RelationGetDescr(rel)->constr)
			ExecConstraints(rri, new, estate);
		r = table_tuple_update(rel, &tid, new, estate->es_output_cid,
							   estate->es_snapshot, InvalidSnapshot, true,
							   &tmfd, &lockmode, &update_indexes);
		if (r == TM_Ok)
			break;
		if (r == TM_Deleted)
			return false;
		if (r == TM_SelfModified)
		{
			/* as ExecUpdate: a row a trigger of ours changed is an error */
			if (tmfd.cmax != estate->es_output_cid)
				ereport(ERROR,
						(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
						 errmsg("stripe %d of activity " INT64_FORMAT " was already modified by an operation triggered by the current command",
								stripe, act->id)));
			return false;
		}
		if (r != TM_Updated)
			elog(ERROR, "unexpected result %d updating stripe %d", (int) r, stripe);

		/* READ COMMITTED: lock the newest version and check it again */
		r = table_tuple_lock(rel, &tid, estate->es_snapshot, old,
							 estate->es_output_cid, lockmode, LockWaitBlock,
							 TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (r == TM_Deleted)
			return false;
		if (r != TM_Ok)
			elog(ERROR, "unexpected result %d locking stripe %d", (int) r, stripe);
		if (DatumGetInt64(slot_getattr(old, dc->s[S_ACTIVITY], &isnull)) != act->id ||
			DatumGetInt32(slot_getattr(old, dc->s[S_STRIPE], &isnull)) != stripe)
			return false;
	}
	if (RpUpdateNeedsIndexes(update_indexes) && rri->ri_NumIndices > 0)
		list_free(RpExecInsertIndexTuples(rri, new, estate, true,
										  RpUpdateOnlySummarizing(update_indexes)));
	*units = DatumGetInt64(old->tts_values[dc->s[S_BALANCE] - 1]) -
		DatumGetInt64(new->tts_values[dc->s[S_BALANCE] - 1]);
	return true;
}

/* Is there a claim under the claim's key visible to the snapshot? */
static bool
ClaimExists(Relation rel, Snapshot snap, int64 activity, const RpFastClaim *fc,
			TupleTableSlot *slot)
{
	ScanKeyData keys[3];

	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(activity));
	ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(fc->user_id));
	ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(fc->key));
	for (int k = 0; k < 3; k++)
		keys[k].sk_collation = dc->key_coll[k];
	return FetchByKey(rel, dc->claim_key, snap, keys, 3, slot);
}

/* Is the user on the restricted activity's list, as the snapshot sees it? */
static bool
UserEligible(EState *estate, int64 activity, const RpFastClaim *fc)
{
	Relation	rel;
	TupleTableSlot *slot;
	ScanKeyData keys[2];
	bool		found;

	if (!OidIsValid(dc->eligible_key))
		return false;
	rel = table_open(dc->eligible, AccessShareLock);
	slot = table_slot_create(rel, &estate->es_tupleTable);
	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(activity));
	ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(fc->user_id));
	keys[1].sk_collation = dc->eligible_coll[1];
	found = FetchByKey(rel, dc->eligible_key, estate->es_snapshot, keys, 2, slot);
	table_close(rel, NoLock);
	return found;
}

/*
 * INSERT INTO redpacket.claim ... VALUES (..., nextval, ..., now()), through
 * the executor's simple-relation insert (constraints, every index).
 */
static void
InsertClaim(ResultRelInfo *rri, EState *estate, TupleTableSlot *slot, int64 activity,
			int stripe, RpFastClaim *fc)
{
	int			natts = RelationGetDescr(rri->ri_RelationDesc)->natts;

	fc->claim_id = nextval_internal(dc->claim_seq, true);
	fc->claimed_at = GetCurrentTransactionStartTimestamp();

	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * natts);
	slot->tts_values[dc->c[C_ACTIVITY] - 1] = Int64GetDatum(activity);
	slot->tts_values[dc->c[C_CLAIM_ID] - 1] = Int64GetDatum(fc->claim_id);
	slot->tts_values[dc->c[C_USER] - 1] = PointerGetDatum(fc->user_id);
	slot->tts_values[dc->c[C_REQUEST] - 1] = PointerGetDatum(fc->request_id);
	slot->tts_values[dc->c[C_KEY] - 1] = PointerGetDatum(fc->key);
	slot->tts_values[dc->c[C_AMOUNT] - 1] = NumericGetDatum(fc->amount);
	slot->tts_values[dc->c[C_STRIPE] - 1] = Int32GetDatum(stripe);
	slot->tts_values[dc->c[C_CLAIMED_AT] - 1] = TimestampTzGetDatum(fc->claimed_at);
	for (int i = 0; i < C_NCOLS; i++)
		slot->tts_isnull[dc->c[i] - 1] = false;
	slot->tts_isnull[dc->c[C_REQUEST] - 1] = (fc->request_id == NULL);
	ExecStoreVirtualTuple(slot);
	ExecSimpleRelationInsert(rri, estate, slot);
}

/* The checks, the decrement and the insert, with the tables open. */
static RpDirectResult
DirectWrite(EState *estate, ResultRelInfo *claim, ResultRelInfo *stripe,
			const RpActivity *act, int stripe_no, RpFastClaim *fc)
{
	TupleTableSlot *cslot = table_slot_create(claim->ri_RelationDesc, &estate->es_tupleTable);

	if (ClaimExists(claim->ri_RelationDesc, estate->es_snapshot, act->id, fc, cslot))
		return RP_DIRECT_DIVERT;
	if (act->restricted && !UserEligible(estate, act->id, fc))
		return RP_DIRECT_DIVERT;
	CheckCmdReplicaIdentity(stripe->ri_RelationDesc, CMD_UPDATE);
	if (!DebitStripe(stripe, estate, act, stripe_no, &fc->units))
		return RP_DIRECT_DIVERT;
	fc->amount = RpUnitsToAmount(fc->units, act->scale);
	InsertClaim(claim, estate, cslot, act->id, stripe_no, fc);
	return RP_DIRECT_TOOK;
}

/*
 * The fast path's one attempt on a stripe whose lock the caller holds,
 * with the user's lock held and under READ COMMITTED: RP_DIRECT_TOOK (the
 * stripe paid and the claim is inserted, claim_id and claimed_at set),
 * RP_DIRECT_DIVERT (nothing written: the careful path tells why), or
 * RP_DIRECT_UNUSED (the direct path does not apply: another backend runs).
 */
RpDirectResult
RpDirectTake(const RpActivity *act, int stripe, RpFastClaim *fc)
{
	EState	   *estate;
	MemoryContext old;
	ResultRelInfo *claim;
	ResultRelInfo *stripes;
	RpDirectResult result = RP_DIRECT_UNUSED;
	uint64		generation;

	/* a read-only transaction (or a standby): the SQL raises 25006 */
	if (!rp_direct_claims || act->per_user_limit != 1 || XactReadOnly ||
		IsInParallelMode())
		return RP_DIRECT_UNUSED;
	/* an auditing or access-control module checks what the executor writes */
	if (ExecutorCheckPerms_hook != NULL)
		return RP_DIRECT_UNUSED;
	dc = TablesFor(act);
	if (dc == NULL)
	{
		ereport(DEBUG1,
				(errmsg_internal("redpacket: claim takes the SPI path: redpacket.claim or redpacket.stripe is not shaped as the direct path expects")));
		return RP_DIRECT_UNUSED;
	}
	generation = RpCatalogGeneration();

	estate = CreateExecutorState();
	old = MemoryContextSwitchTo(estate->es_query_cxt);
	claim = RpOpenTarget(dc->claim);
	stripes = claim ? RpOpenTarget(dc->stripe) : NULL;

	/*
	 * Taking the tables' locks may have waited for an ALTER and processed
	 * its invalidation: what was learned before may be stale.  The SQL path
	 * serves this call; the next one learns again.
	 */
	if (claim && stripes && TablesStill(generation) &&
		PlainTables(claim->ri_RelationDesc, stripes->ri_RelationDesc) &&
		Permitted(claim->ri_RelationDesc, stripes->ri_RelationDesc))
	{
		/* as SPI does for each statement: see our own earlier writes */
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		estate->es_snapshot = GetActiveSnapshot();
		estate->es_output_cid = GetCurrentCommandId(true);
		result = DirectWrite(estate, claim, stripes, act, stripe, fc);
		PopActiveSnapshot();
		ereport(DEBUG1, (errmsg_internal("redpacket: claim took the direct path (%s)",
										 result == RP_DIRECT_TOOK ? "paid" : "diverted")));
	}
	else
		ereport(DEBUG1,
				(errmsg_internal("redpacket: claim takes the SPI path: redpacket.claim or redpacket.stripe changed, or has triggers, rules, row security, inheritance or generated columns, or a privilege is missing")));
	ExecResetTupleTable(estate->es_tupleTable, false);
	RpCloseTarget(stripes);
	RpCloseTarget(claim);
	MemoryContextSwitchTo(old);
	FreeExecutorState(estate);
	return result;
}
