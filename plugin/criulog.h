/*
 * criulog.h - the plugin's log sink (criulog.c), routed into CRIU's log;
 * the levels and pr_* are the shared ones (protocol/loglevels.h).
 *
 * Inside criu every line goes through CRIU's print_on_level (resolved with
 * dlsym, so unit tests without criu fall back to stderr), prefixed with
 * "cuinterpose: " and terminated with a newline here. Calls are serialized
 * by a mutex because the coordinator logs from several threads and CRIU's
 * logger is not thread-safe.
 */
#ifndef CUIP_PLUGIN_CRIULOG_H
#define CUIP_PLUGIN_CRIULOG_H

/* CRIU's levels (criu/include/log.h; that header is not installed) are the
 * shared ones: criu's print_on_level takes them as they are. */
#include "loglevels.h"

/* Verbose mode (CUINTERPOSE_LOG=2 or more) promotes debug lines to info. */
void cuip_log_set_verbose(int on);

/* Monotonic seconds, for the per-phase timing lines. */
double cuip_now(void);

#endif /* CUIP_PLUGIN_CRIULOG_H */
