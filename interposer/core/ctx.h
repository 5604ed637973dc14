/*
 * ctx.h - the process's contexts (ctx.c): those the application creates,
 * synchronized at QUIESCE (ctx_mu protects the set), and the walk over
 * every context. The stack lowering around the native checkpoint is ctx.c's
 * own slice (slice.h).
 */
#ifndef CUIP_CTX_H
#define CUIP_CTX_H

#include <stddef.h>
#include <cuda.h>

/* Snapshot of the live contexts created with cuCtxCreate*; returns the count. */
size_t cuip_contexts(CUcontext *out, size_t max);

/* Where a walk stopped: a primary context (its device's ordinal) or a
 * created one (ordinal -1). */
struct cuip_ctx_at {
	int ordinal;
	CUcontext ctx;
};
/* Calls fn with each context current on the calling thread: every active
 * primary context (retained for the call), then every created one; the
 * thread's own current context afterwards. CUDA_SUCCESS, or the first
 * failure (reaching a context or fn's), with *at where it was. */
CUresult cuip_each_context(CUresult (*fn)(CUcontext c, void *arg), void *arg, struct cuip_ctx_at *at);

#endif /* CUIP_CTX_H */
