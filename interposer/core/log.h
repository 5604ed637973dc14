/*
 * log.h - the interposer's log (log.c): one line per event on stderr,
 * prefixed "cuinterpose[pid]: ". Base layer: calls nothing of the
 * interposer; every module may use it. One write(2) per line, or kept in
 * memory while held.
 */
#ifndef CUIP_LOG_H
#define CUIP_LOG_H

#include <stdbool.h>

extern int cuip_log_level; /* CUINTERPOSE_LOG: 0 quiet, 1 errors (default), 2 info, 3 debug */
void cuip_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* on: keep lines in memory (the first 64 KiB; the rest are counted); off:
 * write the kept lines out, in order, and the count. Op thread only: ops.c
 * holds for a restore from images, the phase machine ends it at RESUME. */
void cuip_log_hold(bool on);
#define pr_err(fmt, ...)   cuip_log(1, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...)  cuip_log(2, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...) cuip_log(3, fmt, ##__VA_ARGS__)

#endif /* CUIP_LOG_H */
