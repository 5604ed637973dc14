/*
 * loglevels.h - the one logging vocabulary of cuinterpose: the levels (the
 * numbers of CRIU's logger, which the plugin hands them to as they are)
 * and the pr_* macros every part writes with. Each binary brings its own
 * sink, cuip_log(): the interposer writes to the job's stderr
 * (interposer/core/log.c), the plugin and the CLI into CRIU's log or
 * stderr (plugin/criulog.c). Declarations only.
 */
#ifndef CUIP_LOGLEVELS_H
#define CUIP_LOGLEVELS_H

#include <errno.h>
#include <string.h>

enum {
	CUIP_LOG_MSG = 0,
	CUIP_LOG_ERROR = 1,
	CUIP_LOG_WARN = 2,
	CUIP_LOG_INFO = 3,
	CUIP_LOG_DEBUG = 4,
};

void cuip_log(unsigned level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define pr_err(fmt, ...)    cuip_log(CUIP_LOG_ERROR, fmt, ##__VA_ARGS__)
#define pr_warn(fmt, ...)   cuip_log(CUIP_LOG_WARN, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...)   cuip_log(CUIP_LOG_INFO, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...)  cuip_log(CUIP_LOG_DEBUG, fmt, ##__VA_ARGS__)
#define pr_perror(fmt, ...) cuip_log(CUIP_LOG_ERROR, fmt ": %s", ##__VA_ARGS__, strerror(errno))

#endif /* CUIP_LOGLEVELS_H */
