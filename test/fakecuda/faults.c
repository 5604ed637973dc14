/*
 * Fault injection: FAKECUDA_FAIL=<api>:<n>[:<CUresult name>][,...] makes the
 * n-th call of <api> (base name, as passed to fk_enter) in this process fail
 * with that result (default CUDA_ERROR_UNKNOWN) before doing anything.
 * Parsed once (pthread_once); counters are atomics, so no lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

#define MAX_FAULTS 32

static struct fault {
	char api[64];
	long n;
	CUresult result;
	atomic_long calls;
} faults[MAX_FAULTS];
static int nfaults;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void parse(void)
{
	const char *s = getenv("FAKECUDA_FAIL");

	while (s && *s && nfaults < MAX_FAULTS) {
		const char *end = strchr(s, ','), *c1, *c2;
		struct fault *f = &faults[nfaults];
		size_t len;

		if (!end)
			end = s + strlen(s);
		c1 = memchr(s, ':', (size_t)(end - s));
		if (c1) {
			len = (size_t)(c1 - s);
			if (len >= sizeof(f->api))
				len = sizeof(f->api) - 1;
			memcpy(f->api, s, len);
			f->n = strtol(c1 + 1, NULL, 10);
			f->result = CUDA_ERROR_UNKNOWN;
			c2 = memchr(c1 + 1, ':', (size_t)(end - c1 - 1));
			if (c2 && fk_err_from_name(c2 + 1, (size_t)(end - c2 - 1), &f->result) < 0)
				fprintf(stderr,
					"fakecuda: FAKECUDA_FAIL: unknown CUresult '%.*s', using CUDA_ERROR_UNKNOWN\n",
					(int)(end - c2 - 1), c2 + 1);
			if (f->n > 0)
				nfaults++;
		}
		s = *end ? end + 1 : end;
	}
}

void faults_init(void)
{
	pthread_once(&once, parse);
}

CUresult faults_check(const char *api)
{
	for (int i = 0; i < nfaults; i++)
		if (!strcmp(faults[i].api, api) && atomic_fetch_add(&faults[i].calls, 1) + 1 == faults[i].n)
			return faults[i].result;
	return CUDA_SUCCESS;
}
