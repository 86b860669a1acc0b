/*
 * ids.h
 *		Ids that never repeat in a database (ids.c): the positions of the
 *		extension's sequences, kept in a database-level setting that outlives
 *		DROP EXTENSION.
 */
#ifndef RP_IDS_H
#define RP_IDS_H

#include "postgres.h"

/* Define the setting redpacket.id_marks (from _PG_init). */
extern void RpIdsInit(void);

/*
 * Record where the sequences stand now.  dropped: the extension is about to
 * be dropped (the drop guard); the extension's tables are locked first, so
 * no row can commit an id past the positions.  Inside SPI_connect.
 */
extern void RpIdsRecord(bool dropped);

/*
 * Start the sequences past the ids of an earlier installation when the
 * marks describe one (new_installation: the install script; or marks left
 * by a drop), and write the marks again when they no longer bound the
 * positions.  Returns whether it wrote them.  Inside SPI_connect.
 */
extern bool RpIdsKeep(bool new_installation);

/* RpIdsKeep(false) on a 1.4 catalog: the reconciler, after each pass. */
extern void RpIdsKeepUp(void);

#endif							/* RP_IDS_H */
