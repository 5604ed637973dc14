/*
 * stub.c - deferred-copy stand-in for the driver (see stub.h). One mutex
 * guards everything; streams are small fixed tables of pending copies.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "stub.h"

#define MAX_STREAMS 256
#define MAX_PENDING 8

struct copy {
	void *dst;
	const void *src;
	size_t n;
};

struct stream {
	int used;
	CUresult sticky; /* error reported by the next synchronize */
	int npending;
	struct copy pending[MAX_PENDING];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct stream streams[MAX_STREAMS];
static struct stub_counts cnt;
static int fail_at[STUB_NFN];
static CUresult fail_rc[STUB_NFN];
static __thread CUcontext cur;

/* Count a call; nonzero if it is the one chosen to fail. Under lock. */
static CUresult tick(enum stub_fn fn)
{
	cnt.calls[fn]++;
	if (fail_at[fn] && cnt.calls[fn] == fail_at[fn])
		return fail_rc[fn];
	return CUDA_SUCCESS;
}

void stub_reset(void)
{
	pthread_mutex_lock(&lock);
	memset(&cnt, 0, sizeof(cnt));
	memset(fail_at, 0, sizeof(fail_at));
	memset(streams, 0, sizeof(streams));
	pthread_mutex_unlock(&lock);
}

void stub_fail(enum stub_fn fn, int n, CUresult rc)
{
	pthread_mutex_lock(&lock);
	fail_at[fn] = (int)cnt.calls[fn] + n;
	fail_rc[fn] = rc;
	pthread_mutex_unlock(&lock);
}

void stub_get(struct stub_counts *c)
{
	pthread_mutex_lock(&lock);
	*c = cnt;
	pthread_mutex_unlock(&lock);
}

static CUresult get_ctx(CUcontext *c)
{
	*c = cur;
	return CUDA_SUCCESS;
}

static CUresult set_ctx(CUcontext c)
{
	CUresult rc;

	pthread_mutex_lock(&lock);
	rc = tick(STUB_SET_CTX);
	pthread_mutex_unlock(&lock);
	if (rc == CUDA_SUCCESS)
		cur = c;
	return rc;
}

static CUresult host_alloc(void **p, size_t n, unsigned flags)
{
	CUresult rc;
	size_t *h;

	pthread_mutex_lock(&lock);
	rc = tick(STUB_HOST_ALLOC);
	pthread_mutex_unlock(&lock);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!cur)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Garbage fill: a carrier must never rely on staging contents. */
	/* mmap, not malloc: freed staging really leaves the process (no
	 * sanitizer quarantine), so resident-memory bounds can be checked. */
	h = mmap(NULL, n + 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (h == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memset(h, 0xA5, n + 16);
	h[0] = n;
	pthread_mutex_lock(&lock);
	cnt.pinned_bytes += n;
	cnt.host_allocs++;
	if (cnt.pinned_bytes > cnt.pinned_peak)
		cnt.pinned_peak = cnt.pinned_bytes;
	pthread_mutex_unlock(&lock);
	*p = (char *)h + 16;
	return CUDA_SUCCESS;
}

static CUresult alloc_host(void **p, size_t n)
{
	return host_alloc(p, n, 0);
}

static CUresult free_host(void *p)
{
	size_t *h = (size_t *)((char *)p - 16);

	pthread_mutex_lock(&lock);
	cnt.pinned_bytes -= h[0];
	cnt.host_allocs--;
	pthread_mutex_unlock(&lock);
	munmap(h, h[0] + 16);
	return CUDA_SUCCESS;
}

static CUresult stream_create(CUstream *s, unsigned flags)
{
	CUresult rc;

	pthread_mutex_lock(&lock);
	rc = tick(STUB_STREAM_CREATE);
	if (rc == CUDA_SUCCESS) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		for (int i = 0; i < MAX_STREAMS; i++) {
			if (!streams[i].used) {
				memset(&streams[i], 0, sizeof(streams[i]));
				streams[i].used = 1;
				cnt.streams++;
				*s = (CUstream)&streams[i];
				rc = CUDA_SUCCESS;
				break;
			}
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

static void drain(struct stream *st)
{
	for (int i = 0; i < st->npending; i++)
		memcpy(st->pending[i].dst, st->pending[i].src, st->pending[i].n);
	st->npending = 0;
}

static CUresult stream_sync(CUstream s)
{
	struct stream *st = (struct stream *)s;
	CUresult rc;

	pthread_mutex_lock(&lock);
	rc = tick(STUB_SYNC);
	drain(st);
	if (rc == CUDA_SUCCESS) {
		rc = st->sticky;
		st->sticky = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

static CUresult stream_destroy(CUstream s)
{
	struct stream *st = (struct stream *)s;

	pthread_mutex_lock(&lock);
	drain(st);
	st->used = 0;
	cnt.streams--;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

static CUresult enqueue(enum stub_fn fn, void *dst, const void *src, size_t n, CUstream s)
{
	struct stream *st = (struct stream *)s;
	CUresult rc;

	if (cur != STUB_CTX)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	rc = tick(fn);
	if (rc == CUDA_SUCCESS) {
		if (st->npending == MAX_PENDING)
			drain(st);
		st->pending[st->npending++] = (struct copy){dst, src, n};
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	return enqueue(STUB_DTOH, dst, (const void *)(uintptr_t)src, n, s);
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	return enqueue(STUB_HTOD, (void *)(uintptr_t)dst, src, n, s);
}

static CUresult err_name(CUresult rc, const char **s)
{
	*s = rc == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_STUB";
	return CUDA_SUCCESS;
}

const struct carrier_ops stub_ops = {
	.ctx_get_current = get_ctx,
	.ctx_set_current = set_ctx,
	.mem_host_alloc = host_alloc,
	.mem_alloc_host = alloc_host,
	.mem_free_host = free_host,
	.stream_create = stream_create,
	.stream_destroy = stream_destroy,
	.stream_synchronize = stream_sync,
	.memcpy_dtoh_async = dtoh,
	.memcpy_htod_async = htod,
	.get_error_name = err_name,
};
