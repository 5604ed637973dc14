/*
 * failalloc.h - out-of-memory injection for the unit tests (the n-th
 * allocation fails, as SQLite's tests do): compiled in front of the code
 * under test with `-include`, it sends that code's malloc, calloc, realloc,
 * strdup and strndup through counters (failalloc.c). Free stays the C
 * library's. Nothing outside the tests is built with it. A program built
 * with it is also armed from its environment (FAILALLOC_NTH, and
 * FAILALLOC_REPORT for the count at exit; failalloc.c). The three control
 * functions keep default visibility, so that a shared object built with it
 * (interposer/'s libcuinterpose-oom, under -fvisibility=hidden) exports them
 * to the test that preloads it.
 */
#ifndef CUIP_TEST_FAILALLOC_H
#define CUIP_TEST_FAILALLOC_H

#include "config.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void *failalloc_malloc(size_t n);
void *failalloc_calloc(size_t k, size_t n);
void *failalloc_realloc(void *p, size_t n);
char *failalloc_strdup(const char *s);
char *failalloc_strndup(const char *s, size_t n);

#define FAILALLOC_API __attribute__((visibility("default")))

/* From now, the n-th allocation through the counters fails (n >= 1; 0:
 * none fails), once. Counters are process-wide and atomic. */
FAILALLOC_API void failalloc_arm(unsigned long n);
/* Whether the armed allocation was reached (and failed) since arm. */
FAILALLOC_API bool failalloc_fired(void);
/* Allocations counted since the last arm. */
FAILALLOC_API unsigned long failalloc_count(void);
/* The calling thread's allocations are neither counted nor failed from
 * now on (a test's own servers beside the code under test). */
FAILALLOC_API void failalloc_exempt_thread(void);

#ifndef CUIP_FAILALLOC_IMPL
#define malloc(n)     failalloc_malloc(n)
#define calloc(k, n)  failalloc_calloc(k, n)
#define realloc(p, n) failalloc_realloc(p, n)
#define strdup(s)     failalloc_strdup(s)
#define strndup(s, n) failalloc_strndup(s, n)
#endif

#endif /* CUIP_TEST_FAILALLOC_H */
