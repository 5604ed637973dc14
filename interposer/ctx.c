/*
 * ctx.c - contexts the application creates itself (cuCtxCreate*), so that
 * QUIESCE can synchronize every context, not only the primary ones. The
 * wrappers forward unchanged and record the context only on success.
 * ctx_mu protects the set; it is never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>

#include "cuip.h"

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
				CUdevice dev);

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext *ctxs;
static size_t nctx, capctx;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static struct {
	__typeof__(&cuCtxCreate_v2) v2;
	__typeof__(&cuCtxCreate_v3) v3;
	__typeof__(&cuCtxCreate_v4) v4;
	__typeof__(&cuCtxDestroy_v2) destroy;
} rc;

static void ctx_init(void)
{
	void *h;

	if (cuip_driver_init())
		return;
	h = cuip_driver_handle();
	rc.v2 = (__typeof__(rc.v2))cuip_real_dlsym(h, "cuCtxCreate_v2");
	rc.v3 = (__typeof__(rc.v3))cuip_real_dlsym(h, "cuCtxCreate_v3");
	rc.v4 = (__typeof__(rc.v4))cuip_real_dlsym(h, "cuCtxCreate_v4");
	rc.destroy = (__typeof__(rc.destroy))cuip_real_dlsym(h, "cuCtxDestroy_v2");
}

static void remember(CUcontext c)
{
	pthread_mutex_lock(&ctx_mu);
	if (nctx == capctx) {
		size_t cap = capctx ? capctx * 2 : 8;
		CUcontext *n = realloc(ctxs, cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&ctx_mu);
			pr_err("out of memory: context %p will not be synchronized at checkpoint", (void *)c);
			return;
		}
		ctxs = n;
		capctx = cap;
	}
	ctxs[nctx++] = c;
	pthread_mutex_unlock(&ctx_mu);
}

static void forget(CUcontext c)
{
	pthread_mutex_lock(&ctx_mu);
	for (size_t i = 0; i < nctx; i++) {
		if (ctxs[i] == c) {
			ctxs[i] = ctxs[--nctx];
			break;
		}
	}
	pthread_mutex_unlock(&ctx_mu);
}

size_t cuip_contexts(CUcontext *out, size_t max)
{
	size_t n;

	pthread_mutex_lock(&ctx_mu);
	n = nctx < max ? nctx : max;
	for (size_t i = 0; i < n; i++)
		out[i] = ctxs[i];
	pthread_mutex_unlock(&ctx_mu);
	return n;
}

void cuip_ctx_reset(void)
{
	free(ctxs);
	ctxs = NULL;
	nctx = capctx = 0;
	pthread_mutex_init(&ctx_mu, NULL);
}

CUIP_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CUresult r;

	pthread_once(&ctx_once, ctx_init);
	if (!rc.v2)
		return CUDA_ERROR_NOT_FOUND;
	r = rc.v2(pctx, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
					 unsigned int flags, CUdevice dev)
{
	CUresult r;

	pthread_once(&ctx_once, ctx_init);
	if (!rc.v3)
		return CUDA_ERROR_NOT_FOUND;
	r = rc.v3(pctx, paramsArray, numParams, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
					 CUdevice dev)
{
	CUresult r;

	pthread_once(&ctx_once, ctx_init);
	if (!rc.v4)
		return CUDA_ERROR_NOT_FOUND;
	r = rc.v4(pctx, ctxCreateParams, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
	CUresult r;

	pthread_once(&ctx_once, ctx_init);
	if (!rc.destroy)
		return CUDA_ERROR_NOT_FOUND;
	r = rc.destroy(ctx);
	if (r == CUDA_SUCCESS)
		forget(ctx);
	return r;
}
