/*
 * worker.h
 *		One short-lived reconciler (worker.c), started by the launcher.
 */
#ifndef RP_WORKER_H
#define RP_WORKER_H

#include "postgres.h"

PGDLLEXPORT extern void RpWorkerMain(Datum main_arg);

#endif							/* RP_WORKER_H */
