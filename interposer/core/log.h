/*
 * log.h - the interposer's log (log.c): one line per event on stderr,
 * prefixed "cuinterpose[pid]: ". Base layer: calls nothing of the
 * interposer; every module may use it. One write(2) per line, or kept in
 * memory while held.
 */
#ifndef CUIP_LOG_H
#define CUIP_LOG_H

#include <stdbool.h>

#include "loglevels.h" /* the levels and pr_*, shared with the plugin */

/* CUINTERPOSE_LOG: 0 quiet, 1 errors (default), 2 info, 3 debug; lines of
 * a level above what it lets through are dropped. */
extern int cuip_log_level;
/* on: keep lines in memory (the first 64 KiB; the rest are counted); off:
 * write the kept lines out, in order, and the count. Op thread only: ops.c
 * holds for a restore from images, the phase machine ends it at RESUME. */
void cuip_log_hold(bool on);

#endif /* CUIP_LOG_H */
