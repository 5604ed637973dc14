/*
 * Contexts: created and primary contexts, the per-thread current-context
 * stack, peer access between contexts, cuCtxSynchronize.  Context objects live
 * in G.ctx, a table that grows (G.lock); the current-context stack is thread-local.
 */
#include <string.h>

#include "fake.h"

#define STACK_MAX 32

static __thread struct fk_ctx *stack[STACK_MAX];
static __thread int depth;

int ctx_valid(struct fk_ctx *c)
{
	return table_index(&G.ctx, c) >= 0 && c->magic == FK_CTX_MAGIC && c->used;
}

struct fk_ctx *ctx_current(void)
{
	struct fk_ctx *c = depth ? stack[depth - 1] : NULL;

	return ctx_valid(c) ? c : NULL;
}

CUresult ctx_require(struct fk_ctx **out)
{
	struct fk_ctx *c = ctx_current();

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*out = c;
	return CUDA_SUCCESS;
}

void ctx_note_use(int ord)
{
	G.used_ord |= 1u << ord;
}

static struct fk_ctx *ctx_new(int ord, unsigned int flags, int primary)
{
	int i = table_new(&G.ctx);
	struct fk_ctx *c;

	if (i < 0)
		return NULL;
	c = FK_AT(&G.ctx, struct fk_ctx, i);
	c->used = 1;
	c->magic = FK_CTX_MAGIC;
	c->ord = ord;
	c->flags = flags;
	c->primary = primary;
	/* The defaults NVIDIA's driver reports on the H200 (ctxrss.py). */
	c->limit[CU_LIMIT_STACK_SIZE] = 1024;
	c->limit[CU_LIMIT_PRINTF_FIFO_SIZE] = 8650752;
	c->limit[CU_LIMIT_MALLOC_HEAP_SIZE] = 8u << 20;
	c->limit[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
	c->launched = 0;
	ctx_note_use(ord);
	return c;
}

/* Frees what the context owns (linear memory, streams, events, modules).  G.lock held. */
static void ctx_free_resources(struct fk_ctx *c)
{
	int i;

	for (i = 0; i < atomic_load(&G.strm.n); i++) {
		struct fk_stream *s = FK_AT(&G.strm, struct fk_stream, i);

		if (s->used && s->ctx == c)
			memset(s, 0, sizeof(*s));
	}
	for (i = 0; i < atomic_load(&G.evt.n); i++) {
		struct fk_event *e = FK_AT(&G.evt, struct fk_event, i);

		if (e->used && e->ctx == c)
			memset(e, 0, sizeof(*e));
	}
	for (i = 0; i < FK_MAX_MOD; i++)
		if (G.mod[i].used && G.mod[i].ctx == c)
			memset(&G.mod[i], 0, sizeof(G.mod[i]));
	linear_free_ctx(c);
}

static void ctx_kill(struct fk_ctx *c)
{
	ctx_free_resources(c);
	c->magic = 0;
	c->used = 0;
	for (int i = 0; i < depth; i++)
		if (stack[i] == c)
			stack[i] = NULL;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct fk_ctx *c;

	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (depth >= STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stream_sync_all();
	LOCK();
	c = ctx_new(dev, flags, 0);
	UNLOCK();
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stack[depth++] = c;
	*pctx = (CUcontext)c;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FK_CALL("cuCtxCreate", ctx_create(pctx, flags, dev));
}

FK_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
				       unsigned int flags, CUdevice dev)
{
	FK_CALL("cuCtxCreate", ctx_create(pctx, flags, dev));
}

FK_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
				       CUdevice dev)
{
	FK_CALL("cuCtxCreate", ctx_create(pctx, flags, dev));
}

static CUresult ctx_destroy(CUcontext ctx)
{
	struct fk_ctx *c = (struct fk_ctx *)ctx;
	CUresult r = CUDA_SUCCESS;

	stream_sync_all();
	LOCK();
	if (!ctx_valid(c))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (c->primary)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		ctx_kill(c);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
	FK_CALL("cuCtxDestroy", ctx_destroy(ctx));
}

static CUresult get_current(CUcontext *pctx)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = (CUcontext)ctx_current();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	FK_CALL("cuCtxGetCurrent", get_current(pctx));
}

static CUresult set_current(CUcontext ctx)
{
	struct fk_ctx *c = (struct fk_ctx *)ctx;

	if (c && !ctx_valid(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == 0) {
		if (!c)
			return CUDA_SUCCESS;
		depth = 1;
	}
	stack[depth - 1] = c;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	FK_CALL("cuCtxSetCurrent", set_current(ctx));
}

static CUresult push_current(CUcontext ctx)
{
	struct fk_ctx *c = (struct fk_ctx *)ctx;

	if (!ctx_valid(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth >= STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stack[depth++] = c;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
	FK_CALL("cuCtxPushCurrent", push_current(ctx));
}

static CUresult pop_current(CUcontext *pctx)
{
	if (depth == 0 || !ctx_valid(stack[depth - 1]))
		return CUDA_ERROR_INVALID_CONTEXT;
	depth--;
	if (pctx)
		*pctx = (CUcontext)stack[depth];
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
	FK_CALL("cuCtxPopCurrent", pop_current(pctx));
}

static CUresult get_device(CUdevice *device)
{
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = c->ord;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
	FK_CALL("cuCtxGetDevice", get_device(device));
}

static CUresult ctx_sync(void)
{
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	return stream_sync_all();
}

FK_API CUresult CUDAAPI cuCtxSynchronize(void)
{
	FK_CALL("cuCtxSynchronize", ctx_sync());
}

static CUresult enable_peer(CUcontext peerContext, unsigned int flags)
{
	struct fk_ctx *c, *p = (struct fk_ctx *)peerContext;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	if (!ctx_valid(p))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (p->ord == c->ord)
		r = CUDA_ERROR_INVALID_DEVICE;
	else if (c->peer & (1u << p->ord))
		r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	else
		c->peer |= 1u << p->ord;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	FK_CALL("cuCtxEnablePeerAccess", enable_peer(peerContext, Flags));
}

static CUresult disable_peer(CUcontext peerContext)
{
	struct fk_ctx *c, *p = (struct fk_ctx *)peerContext;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	LOCK();
	if (!ctx_valid(p))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (!(c->peer & (1u << p->ord)))
		r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
	else
		c->peer &= ~(1u << p->ord);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
	FK_CALL("cuCtxDisablePeerAccess", disable_peer(peerContext));
}

/* --- primary contexts ------------------------------------------------------------ */

static CUresult prim_retain(CUcontext *pctx, CUdevice dev)
{
	struct fk_primary *p;
	CUresult r = CUDA_SUCCESS;

	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	p = &G.prim[dev];
	if (p->ctx < 0) {
		struct fk_ctx *c = ctx_new(dev, p->flags, 1);

		if (!c)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			p->ctx = table_index(&G.ctx, c);
	}
	if (!r) {
		p->refs++;
		*pctx = (CUcontext)FK_AT(&G.ctx, struct fk_ctx, p->ctx);
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FK_CALL("cuDevicePrimaryCtxRetain", prim_retain(pctx, dev));
}

static CUresult prim_release(CUdevice dev)
{
	struct fk_primary *p;
	CUresult r = CUDA_SUCCESS;

	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	p = &G.prim[dev];
	if (p->refs == 0 || p->ctx < 0) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (--p->refs == 0) {
		UNLOCK();
		stream_sync_all();
		LOCK();
		if (p->refs == 0 && p->ctx >= 0) {
			ctx_kill(FK_AT(&G.ctx, struct fk_ctx, p->ctx));
			p->ctx = -1;
		}
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	FK_CALL("cuDevicePrimaryCtxRelease", prim_release(dev));
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v1(CUdevice dev)
{
	FK_CALL("cuDevicePrimaryCtxRelease", prim_release(dev));
}

static CUresult prim_reset(CUdevice dev)
{
	struct fk_primary *p;

	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	stream_sync_all();
	LOCK();
	p = &G.prim[dev];
	if (p->ctx >= 0)
		ctx_free_resources(FK_AT(&G.ctx, struct fk_ctx, p->ctx));
	if (p->ctx >= 0 && p->refs == 0) {
		ctx_kill(FK_AT(&G.ctx, struct fk_ctx, p->ctx));
		p->ctx = -1;
	}
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	FK_CALL("cuDevicePrimaryCtxReset", prim_reset(dev));
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev)
{
	FK_CALL("cuDevicePrimaryCtxReset", prim_reset(dev));
}

static CUresult prim_state(CUdevice dev, unsigned int *flags, int *active)
{
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	*flags = G.prim[dev].flags;
	*active = G.prim[dev].ctx >= 0 && G.prim[dev].refs > 0;
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	FK_CALL("cuDevicePrimaryCtxGetState", prim_state(dev, flags, active));
}

static CUresult prim_set_flags(CUdevice dev, unsigned int flags)
{
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (flags & ~0x1fu)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	G.prim[dev].flags = flags;
	if (G.prim[dev].ctx >= 0)
		FK_AT(&G.ctx, struct fk_ctx, G.prim[dev].ctx)->flags = flags;
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	FK_CALL("cuDevicePrimaryCtxSetFlags", prim_set_flags(dev, flags));
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v1(CUdevice dev, unsigned int flags)
{
	FK_CALL("cuDevicePrimaryCtxSetFlags", prim_set_flags(dev, flags));
}

/* ---- limits ------------------------------------------------------------------ */

static CUresult get_limit(size_t *pvalue, CUlimit limit)
{
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if (!pvalue)
		return CUDA_ERROR_INVALID_VALUE;
	if ((unsigned)limit >= sizeof(c->limit) / sizeof(c->limit[0]) || limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
		return CUDA_ERROR_UNSUPPORTED_LIMIT;
	*pvalue = c->limit[limit];
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
	FK_CALL("cuCtxGetLimit", get_limit(pvalue, limit));
}

/*
 * As measured on the H200 (test/gpu/ctxrss.py; `all` for the printf FIFO
 * and the heap): the stack size is taken as asked (0 and 16 bytes per
 * thread read back as such) and takes effect at once, after the device's
 * work completes; a printf FIFO below 512 KiB and a malloc heap below 4 MiB
 * are raised to those; the printf FIFO cannot change once a kernel ran in
 * the context (CUDA_ERROR_INVALID_VALUE, seen after PyTorch's kernels). The
 * heap stays changeable: the fake's kernels never use device malloc. The
 * device runtime's sync depth is refused both ways
 * (CUDA_ERROR_UNSUPPORTED_LIMIT, bare and PyTorch contexts alike), its
 * pending launch count (2048) goes down to 32. None of them but the stack
 * changes the memory the context holds (262 MiB after the stack).
 */
static CUresult set_limit(CUlimit limit, size_t value)
{
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if ((unsigned)limit >= sizeof(c->limit) / sizeof(c->limit[0]) || limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
		return CUDA_ERROR_UNSUPPORTED_LIMIT;
	switch (limit) {
	case CU_LIMIT_STACK_SIZE:
		stream_sync_all();
		break;
	case CU_LIMIT_PRINTF_FIFO_SIZE:
		if (c->launched)
			return CUDA_ERROR_INVALID_VALUE;
		value = value < (512u << 10) ? 512u << 10 : value;
		break;
	case CU_LIMIT_MALLOC_HEAP_SIZE:
		value = value < (4u << 20) ? 4u << 20 : value;
		break;
	case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
		value = value < 32 ? 32 : value;
		break;
	default:
		break;
	}
	LOCK();
	c->limit[limit] = value;
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value)
{
	FK_CALL("cuCtxSetLimit", set_limit(limit, value));
}
