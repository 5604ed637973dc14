/*
 * ctx.c - the process's contexts: those the application creates itself
 * (cuCtxCreate*), so that QUIESCE can synchronize every context, not only
 * the primary ones; the walk over all of them (cuip_each_context); and
 * their stack reservations around NVIDIA's native checkpoint (a slice,
 * slice.h: lowered after PREPARE_UNICAST, set back at RESUME).
 *
 * The wrappers forward unchanged and record the context only on success.
 * ctx_mu protects the set; it is never held across a driver call. The
 * stack table (stacks[]) is the op thread's only.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctx.h"
#include "cuip.h"
#include "driver.h"
#include "runtime.h"
#include "slice.h"

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

/* ---- every context ---------------------------------------------------------- */

CUresult cuip_each_context(CUresult (*fn)(CUcontext c, void *arg), void *arg, struct cuip_ctx_at *at)
{
	CUcontext cs[256], prev = NULL;
	CUresult r = CUDA_SUCCESS;
	size_t nc;

	real.cuCtxGetCurrent(&prev);
	for (int i = 0; i < self.ndev && !r; i++) {
		unsigned flags;
		int active = 0;
		CUcontext c = NULL;
		CUdevice dev;

		*at = (struct cuip_ctx_at){.ordinal = self.dev[i].ordinal};
		if (real.cuDeviceGet(&dev, self.dev[i].ordinal) != CUDA_SUCCESS ||
		    real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
			continue;
		r = real.cuDevicePrimaryCtxRetain(&c, dev);
		if (r != CUDA_SUCCESS)
			break;
		at->ctx = c;
		r = real.cuCtxSetCurrent(c);
		if (r == CUDA_SUCCESS)
			r = fn(c, arg);
		real.cuDevicePrimaryCtxRelease_v2(dev);
	}
	nc = r ? 0 : cuip_contexts(cs, 256);
	for (size_t i = 0; i < nc && !r; i++) {
		*at = (struct cuip_ctx_at){.ordinal = -1, .ctx = cs[i]};
		r = real.cuCtxSetCurrent(cs[i]);
		if (r == CUDA_SUCCESS)
			r = fn(cs[i], arg);
	}
	real.cuCtxSetCurrent(prev);
	return r;
}

/* ---- stacks around the native checkpoint --------------------------------------- */

/*
 * Each context reserves device memory for the stacks of every thread the
 * device can hold at once: CU_LIMIT_STACK_SIZE bytes each, 1024 by default,
 * 264 MiB of an H200 context's 526 (132 SMs x 2048 threads). NVIDIA's
 * native checkpoint copies that reservation into the process's memory like
 * any other, and CRIU then writes it into the images. Between kernels the
 * stacks hold nothing, so PREPARE_UNICAST (quiesced, drained) lowers the
 * limit to CUIP_STACK_SMALL (0: the H200 takes it, and the context then
 * holds 262 MiB) and RESUME sets each context's own value back;
 * a kernel that needs more in between would get it anyway (the driver
 * raises the limit per launch as needed).
 */
#define CUIP_STACK_SMALL 0

static struct {
	CUcontext ctx;
	size_t stack;
} stacks[64];
static size_t nstacks;
static uint64_t stacks_freed; /* device bytes the lowering freed, for the log */

static uint64_t used_now(void)
{
	size_t freeb = 0, total = 0;

	if (!real.cuMemGetInfo_v2 || real.cuMemGetInfo_v2(&freeb, &total) != CUDA_SUCCESS)
		return 0;
	return total - freeb;
}

static CUresult lower_one(CUcontext c, void *arg)
{
	uint64_t before;
	size_t v = 0;
	CUresult r;

	(void)arg;
	if (!real.cuCtxGetLimit || !real.cuCtxSetLimit)
		return CUDA_SUCCESS;
	r = real.cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE);
	if (r != CUDA_SUCCESS || v <= CUIP_STACK_SMALL)
		return r;
	if (nstacks == sizeof(stacks) / sizeof(stacks[0]))
		return CUDA_SUCCESS; /* the rest keep theirs */
	before = used_now();
	r = real.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, CUIP_STACK_SMALL);
	if (r != CUDA_SUCCESS)
		return r;
	stacks[nstacks].ctx = c;
	stacks[nstacks++].stack = v;
	if (before) {
		uint64_t after = used_now();
		stacks_freed += after && after < before ? before - after : 0;
	}
	return CUDA_SUCCESS;
}

static void stacks_restore(void);

/* 0, or -EIO with msg filled and every limit set back. */
static int stacks_lower(char *msg, size_t len)
{
	struct cuip_ctx_at at;
	CUresult r;

	if (!cuip_stacks_lower || nstacks)
		return 0;
	stacks_freed = 0;
	r = cuip_each_context(lower_one, NULL, &at);
	if (r != CUDA_SUCCESS) {
		if (at.ordinal >= 0)
			snprintf(msg, len, "lowering the stack limit of device %d's primary context failed: %s",
				 at.ordinal, cuip_cuerr(r));
		else
			snprintf(msg, len, "lowering the stack limit of context %p failed: %s", (void *)at.ctx,
				 cuip_cuerr(r));
		stacks_restore();
		return -EIO;
	}
	if (nstacks)
		pr_info("stacks of %zu context(s) lowered to %d bytes per thread: %" PRIu64
			" MiB less device memory for the native checkpoint",
			nstacks, CUIP_STACK_SMALL, stacks_freed >> 20);
	return 0;
}

/* Every lowered context's own limit again (a failure is logged: kernels
 * still get their stacks at launch). */
static void stacks_restore(void)
{
	CUcontext prev = NULL;

	if (!nstacks)
		return;
	real.cuCtxGetCurrent(&prev);
	for (size_t i = 0; i < nstacks; i++) {
		CUresult r = real.cuCtxSetCurrent(stacks[i].ctx);

		if (r == CUDA_SUCCESS)
			r = real.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stacks[i].stack);
		if (r != CUDA_SUCCESS)
			pr_err("context %p: setting its stack limit back to %zu bytes failed: %s (kernels still get "
			       "theirs at launch)",
			       (void *)stacks[i].ctx, stacks[i].stack, cuip_cuerr(r));
	}
	real.cuCtxSetCurrent(prev);
	nstacks = 0;
}

/* The slice's hooks (slice.h): lowering is the last step before the native
 * lock, and a failure only means the native checkpoint copies the stacks. */
static void stacks_before_native(void)
{
	char msg[256];

	if (stacks_lower(msg, sizeof(msg)))
		pr_err("%s; the native checkpoint copies the stacks too", msg);
}

CUIP_SLICE(ctx_stacks, .name = "context stacks", .before_native = stacks_before_native, .resume = stacks_restore);

static void fork_child(void)
{
	free(ctxs);
	ctxs = NULL;
	nctx = capctx = 0;
	nstacks = 0; /* the parent's contexts */
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
