/*
 * ctx.c - contexts the application creates itself (cuCtxCreate*), so that
 * QUIESCE can synchronize every context, not only the primary ones. The
 * wrappers forward unchanged and record the context only on success.
 * ctx_mu protects the set; it is never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>

#include "ctx.h"
#include "cuip.h"
#include "driver.h"
#include "runtime.h"

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext *ctxs;
static size_t nctx, capctx;
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

static void fork_child(void)
{
	free(ctxs);
	ctxs = NULL;
	nctx = capctx = 0;
	pthread_mutex_init(&ctx_mu, NULL);
}
CUIP_FORK_HOOK(ctx, NULL, NULL, fork_child);

CUIP_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CUresult r;

	cuip_driver_init();
	if (!real.cuCtxCreate_v2)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuCtxCreate_v2(pctx, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
					 unsigned int flags, CUdevice dev)
{
	CUresult r;

	cuip_driver_init();
	if (!real.cuCtxCreate_v3)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
					 CUdevice dev)
{
	CUresult r;

	cuip_driver_init();
	if (!real.cuCtxCreate_v4)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev);
	if (r == CUDA_SUCCESS)
		remember(*pctx);
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
	CUresult r;

	cuip_driver_init();
	if (!real.cuCtxDestroy_v2)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuCtxDestroy_v2(ctx);
	if (r == CUDA_SUCCESS)
		forget(ctx);
	return r;
}
