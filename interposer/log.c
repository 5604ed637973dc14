/*
 * log.c - the interposer's log: one line per event on stderr, prefixed with
 * the pid, at the level CUINTERPOSE_LOG sets (read once at load).
 *
 * Base layer: calls nothing of the interposer; every module uses it. No
 * state but the level (written by the constructor before any other thread
 * runs) and no lock: each line is one write(2).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

int cuip_log_level = 1;

void cuip_log(int level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	if (level > cuip_log_level)
		return;
	n = snprintf(buf, sizeof(buf), "cuinterpose[%d]: ", (int)getpid());
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	(void)!write(STDERR_FILENO, buf, (size_t)n);
}

__attribute__((constructor)) static void log_init(void)
{
	const char *l = getenv("CUINTERPOSE_LOG");

	if (l && *l)
		cuip_log_level = atoi(l);
}
