/*
 * criulog.c - see criulog.h. Owns the resolved print_on_level pointer and the mutex
 * that serializes log lines from the coordinator's threads.
 */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "criulog.h"

#define LOG_PREFIX "cuinterpose: "

typedef void (*print_on_level_fn)(unsigned int loglevel, const char *format, ...);

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static print_on_level_fn criu_print;
static int verbose;

static void log_resolve(void)
{
	criu_print = (print_on_level_fn)dlsym(RTLD_DEFAULT, "print_on_level");
}

void cuip_log_set_verbose(int on)
{
	verbose = on;
}

void cuip_log(unsigned level, const char *fmt, ...)
{
	char line[2048];
	va_list ap;

	pthread_once(&log_once, log_resolve);
	if (level == CUIP_LOG_DEBUG && verbose)
		level = CUIP_LOG_INFO;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&log_lock);
	if (criu_print)
		criu_print(level, LOG_PREFIX "%s\n", line);
	else if (level <= CUIP_LOG_WARN || verbose || getenv("CUINTERPOSE_TEST_LOG"))
		fprintf(stderr, LOG_PREFIX "%s\n", line);
	pthread_mutex_unlock(&log_lock);
}

double cuip_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
