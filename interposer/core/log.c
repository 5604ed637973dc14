/*
 * log.c - the interposer's log: one line per event on stderr, prefixed with
 * the pid, at the level CUINTERPOSE_LOG sets (read once at load).
 *
 * Base layer: calls nothing of the interposer; every module uses it. Each
 * line is one write(2). While held (cuip_log_hold: the process is being
 * restored from images, from its LOAD or REBUILD to RESUME), lines are kept
 * in memory instead and written when the hold ends: CRIU restores a
 * process's open files at the sizes they had at dump and refuses any that
 * changed, so a line written into a log file by a restore that is then
 * killed (criu dying part-way) would make every later restore of the same
 * images fail. A tree killed before RESUME takes its held lines with it;
 * the plugin's own log has the replies and errors. Past HELD_BYTES the
 * rest are counted, not kept, so what is kept is always the first lines.
 * A forked child starts with nothing held.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "settings.h"

#define HELD_BYTES (64u << 10)

int cuip_log_level = 1;

static atomic_bool holding;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static char held[HELD_BYTES]; /* under held_lock, as the two below */
static size_t held_len;
static unsigned held_dropped;

/* Keep a line while held; false when the hold ended meanwhile. */
static bool keep(const char *line, size_t n)
{
	bool kept = false;

	pthread_mutex_lock(&held_lock);
	if (atomic_load(&holding)) {
		kept = true;
		if (!held_dropped && held_len + n <= sizeof(held)) {
			memcpy(held + held_len, line, n);
			held_len += n;
		} else {
			held_dropped++;
		}
	}
	pthread_mutex_unlock(&held_lock);
	return kept;
}

/* The highest level CUINTERPOSE_LOG lets through (its numbers are the
 * user's: 1 errors, 2 info, 3 debug; warnings go with errors). */
static unsigned threshold(void)
{
	int u = cuip_log_level;

	return u <= 0 ? 0 : u == 1 ? CUIP_LOG_WARN : u == 2 ? CUIP_LOG_INFO : CUIP_LOG_DEBUG;
}

void cuip_log(unsigned level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	if (level > threshold())
		return;
	n = snprintf(buf, sizeof(buf), "cuinterpose[%d]: ", (int)getpid());
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (atomic_load(&holding) && keep(buf, (size_t)n))
		return;
	(void)!write(STDERR_FILENO, buf, (size_t)n);
}

void cuip_log_hold(bool on)
{
	unsigned dropped = 0;

	if (atomic_load(&holding) == on)
		return; /* only the op thread changes it */
	pthread_mutex_lock(&held_lock);
	if (!on && atomic_load(&holding)) {
		/* Under the lock, so that a line logged meanwhile comes after these. */
		for (size_t off = 0; off < held_len;) {
			ssize_t w = write(STDERR_FILENO, held + off, held_len - off);

			if (w <= 0)
				break;
			off += (size_t)w;
		}
		dropped = held_dropped;
		held_len = 0;
		held_dropped = 0;
	}
	atomic_store(&holding, on);
	pthread_mutex_unlock(&held_lock);
	if (dropped)
		cuip_log(1, "%u log lines of the restore dropped (more than %u KiB held)", dropped, HELD_BYTES >> 10);
}

/* The child of a fork has only the forking thread: nothing held, and the
 * lock as if new (another thread may have held it). */
static void log_fork_child(void)
{
	pthread_mutex_init(&held_lock, NULL);
	atomic_store(&holding, false);
	held_len = 0;
	held_dropped = 0;
}

__attribute__((constructor)) static void log_init(void)
{
	/* A bad value makes the first cuInit fail (runtime.c) and leaves the
	 * table's default here. */
	uint64_t level = 0;
	char err[160];

	cuip_setting_number("CUINTERPOSE_LOG", &level, err, sizeof(err));
	cuip_log_level = (int)level;
	pthread_atfork(NULL, NULL, log_fork_child);
}
