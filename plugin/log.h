/*
 * log.h - the plugin's logging, routed into CRIU's log.
 *
 * Inside criu every line goes through CRIU's print_on_level (resolved with
 * dlsym, so unit tests without criu fall back to stderr), prefixed with
 * "cuinterpose: " and terminated with a newline here. Calls are serialized
 * by a mutex because the coordinator logs from several threads and CRIU's
 * logger is not thread-safe.
 */
#ifndef CUIP_PLUGIN_LOG_H
#define CUIP_PLUGIN_LOG_H

#include <errno.h>
#include <string.h>

/* CRIU's levels (criu/include/log.h; that header is not installed). */
enum {
	CUIP_LOG_MSG = 0,
	CUIP_LOG_ERROR = 1,
	CUIP_LOG_WARN = 2,
	CUIP_LOG_INFO = 3,
	CUIP_LOG_DEBUG = 4,
};

void cuip_log(unsigned level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Verbose mode (CUINTERPOSE_VERBOSE=1) promotes debug lines to info. */
void cuip_log_set_verbose(int on);

#define pr_err(fmt, ...)    cuip_log(CUIP_LOG_ERROR, fmt, ##__VA_ARGS__)
#define pr_warn(fmt, ...)   cuip_log(CUIP_LOG_WARN, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...)   cuip_log(CUIP_LOG_INFO, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...)  cuip_log(CUIP_LOG_DEBUG, fmt, ##__VA_ARGS__)
#define pr_perror(fmt, ...) cuip_log(CUIP_LOG_ERROR, fmt ": %s", ##__VA_ARGS__, strerror(errno))

/* Monotonic seconds, for the per-phase timing lines. */
double cuip_now(void);

#endif /* CUIP_PLUGIN_LOG_H */
