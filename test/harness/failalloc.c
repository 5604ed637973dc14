/*
 * failalloc.c - the counters behind failalloc.h: every allocation of the
 * code compiled with it takes a number; the armed one returns NULL with
 * errno ENOMEM.
 */
#define CUIP_FAILALLOC_IMPL 1
#include "failalloc.h"

/* The C library's own, even when the build put failalloc.h in front. */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_ulong counted, armed;
static atomic_bool fired;
static __thread bool exempt;

void failalloc_arm(unsigned long n)
{
	atomic_store(&counted, 0);
	atomic_store(&fired, false);
	atomic_store(&armed, n);
}

bool failalloc_fired(void)
{
	return atomic_load(&fired);
}

unsigned long failalloc_count(void)
{
	return atomic_load(&counted);
}

void failalloc_exempt_thread(void)
{
	exempt = true;
}

/* Whether this allocation is the one to fail. */
static bool fail_now(void)
{
	if (exempt)
		return false;
	unsigned long k = atomic_fetch_add(&counted, 1) + 1, n = atomic_load(&armed);

	if (!n || k != n)
		return false;
	atomic_store(&fired, true);
	errno = ENOMEM;
	return true;
}

void *failalloc_malloc(size_t n)
{
	return fail_now() ? NULL : malloc(n);
}

void *failalloc_calloc(size_t k, size_t n)
{
	return fail_now() ? NULL : calloc(k, n);
}

void *failalloc_realloc(void *p, size_t n)
{
	return fail_now() ? NULL : realloc(p, n);
}

char *failalloc_strdup(const char *s)
{
	return fail_now() ? NULL : strdup(s);
}

char *failalloc_strndup(const char *s, size_t n)
{
	return fail_now() ? NULL : strndup(s, n);
}

static void report(void)
{
	fprintf(stderr, "failalloc: %lu allocations%s\n", failalloc_count(),
		atomic_load(&armed) ? (failalloc_fired() ? ", the armed one failed" : ", the armed one not reached")
				    : "");
}

/* A program built with the counters is armed from its environment:
 * FAILALLOC_NTH=n fails its n-th allocation; with FAILALLOC_REPORT set it
 * prints the count at exit (a test's clean run learns how many to try). */
__attribute__((constructor)) static void arm_from_environment(void)
{
	const char *n = getenv("FAILALLOC_NTH");

	if (n && *n)
		failalloc_arm(strtoul(n, NULL, 10));
	if (getenv("FAILALLOC_REPORT"))
		atexit(report);
}
