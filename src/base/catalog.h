/*
 * catalog.h
 *		The OIDs of the extension's own relations, found by name once per
 *		backend and forgotten together on any relcache invalidation of one of
 *		them (one cache, one callback: catalog.c).
 */
#ifndef RP_CATALOG_H
#define RP_CATALOG_H

#include "postgres.h"

typedef enum RpRel
{
	RP_REL_ACTIVITY,
	RP_REL_STRIPE,
	RP_REL_CLAIM,
	RP_REL_ELIGIBLE,			/* 1.4 */
	RP_REL_LEDGER,
	RP_REL_RECONCILE_STATE,
	RP_NRELS
} RpRel;

/*
 * The OID of one of our relations in this database, InvalidOid when there
 * is none (the extension is not installed, or its catalog predates the
 * relation).  Needs a transaction.
 */
extern Oid	RpRelid(RpRel rel);

/*
 * A number that changes whenever what RpRelid answers may have changed (a
 * relcache invalidation of one of our relations, or of all): caches built
 * from our relations' shape remember it and rebuild when it moved.
 */
extern uint64 RpCatalogGeneration(void);

#endif							/* RP_CATALOG_H */
