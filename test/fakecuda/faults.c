/*
 * Fault injection: FAKECUDA_FAIL=<api>:<n>[:<CUresult name>][,...] makes the
 * n-th call of <api> (base name, as passed to fk_enter) in this process fail
 * with that result (default CUDA_ERROR_UNKNOWN) before doing anything.
 * Parsed once (pthread_once); counters are atomics, so no lock.
 *
 * FAKECUDA_FAIL_DIR=<dir> arms faults in a running process (a job under
 * test, or one CRIU restored): every call stats <dir>/<pid> (else
 * <dir>/any) and, when that file changed (inode, size or mtime), reloads
 * its content in the FAKECUDA_FAIL syntax, counting calls from the reload.
 * A missing file disarms. file_mu serializes the reload and the check.
 *
 * HANG in place of the result makes that call never return (a device copy
 * that never completes: cuStreamSynchronize:1:HANG). Armed by file, it
 * first creates <dir>/hung.<pid> and says nothing on stderr: a restored
 * process's stderr is often a file whose size CRIU checks at the next
 * restore of the same images.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define MAX_FAULTS 32

static struct fault {
	char api[64];
	long n;
	CUresult result;
	bool hang; /* HANG: the call never returns */
	atomic_long calls;
} faults[MAX_FAULTS];
static int nfaults;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct fault file_faults[MAX_FAULTS];
static int nfile;
static const char *fail_dir;
static struct stat file_st;
static pthread_mutex_t file_mu = PTHREAD_MUTEX_INITIALIZER;

static void parse_spec(const char *s, struct fault *tab, int *out)
{
	int n = 0;

	while (s && *s && n < MAX_FAULTS) {
		const char *end = strchr(s, ','), *c1, *c2;
		struct fault *f = &tab[n];
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
			f->hang = c2 && end - c2 - 1 == 4 && !memcmp(c2 + 1, "HANG", 4);
			if (c2 && !f->hang && fk_err_from_name(c2 + 1, (size_t)(end - c2 - 1), &f->result) < 0)
				fprintf(stderr,
					"fakecuda: FAKECUDA_FAIL: unknown CUresult '%.*s', using CUDA_ERROR_UNKNOWN\n",
					(int)(end - c2 - 1), c2 + 1);
			if (f->n > 0)
				n++;
		}
		s = *end ? end + 1 : end;
	}
	*out = n;
}

static void parse(void)
{
	parse_spec(getenv("FAKECUDA_FAIL"), faults, &nfaults);
	fail_dir = getenv("FAKECUDA_FAIL_DIR");
}

/* Under file_mu: reload <dir>/<pid> or <dir>/any when it changed. */
static void file_reload(void)
{
	char path[4096], buf[1024];
	struct stat st;
	ssize_t len;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%d", fail_dir, (int)getpid());
	if (stat(path, &st)) {
		snprintf(path, sizeof(path), "%s/any", fail_dir);
		if (stat(path, &st)) {
			nfile = 0;
			memset(&file_st, 0, sizeof(file_st));
			return;
		}
	}
	if (st.st_ino == file_st.st_ino && st.st_size == file_st.st_size &&
	    st.st_mtim.tv_sec == file_st.st_mtim.tv_sec && st.st_mtim.tv_nsec == file_st.st_mtim.tv_nsec)
		return;
	file_st = st;
	memset(file_faults, 0, sizeof(file_faults));
	nfile = 0;
	f = fopen(path, "re");
	if (!f)
		return;
	len = (ssize_t)fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len > 0 ? len : 0] = 0;
	buf[strcspn(buf, "\n")] = 0;
	parse_spec(buf, file_faults, &nfile);
}

void faults_init(void)
{
	pthread_once(&once, parse);
}

/* An injected hang: this call never returns (the process ends by a signal). */
static void hang(const char *api)
{
	char path[4096];
	int fd;

	if (fail_dir) {
		snprintf(path, sizeof(path), "%s/hung.%d", fail_dir, (int)getpid());
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dprintf(fd, "%s\n", api);
			close(fd);
		}
	} else {
		fprintf(stderr, "fakecuda: pid %d: %s hangs (injected, FAKECUDA_FAIL)\n", (int)getpid(), api);
	}
	for (;;)
		pause();
}

CUresult faults_check(const char *api)
{
	CUresult r = CUDA_SUCCESS;
	bool hung = false;

	for (int i = 0; i < nfaults; i++) {
		if (strcmp(faults[i].api, api) || atomic_fetch_add(&faults[i].calls, 1) + 1 != faults[i].n)
			continue;
		if (faults[i].hang)
			hang(api);
		return faults[i].result;
	}
	if (!fail_dir)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&file_mu);
	file_reload();
	for (int i = 0; i < nfile && r == CUDA_SUCCESS && !hung; i++) {
		if (strcmp(file_faults[i].api, api) ||
		    atomic_fetch_add(&file_faults[i].calls, 1) + 1 != file_faults[i].n)
			continue;
		r = file_faults[i].result;
		hung = file_faults[i].hang;
	}
	pthread_mutex_unlock(&file_mu);
	if (hung)
		hang(api);
	if (r != CUDA_SUCCESS)
		fprintf(stderr, "fakecuda: pid %d: injected failure of %s (FAKECUDA_FAIL_DIR)\n", (int)getpid(), api);
	return r;
}
