/*
 * ctx.h - the process's contexts (ctx.c): those the application creates,
 * synchronized at QUIESCE (ctx_mu protects the set), the walk over every
 * context, and the stack reservations lowered for the native checkpoint.
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

/* PREPARE_UNICAST: lower every context's stack limit so that the native
 * checkpoint does not copy the idle stack reservation (unless
 * CUINTERPOSE_STACKS=keep); once until the restore. 0, or -EIO with msg
 * filled and every limit set back. Op thread only. */
int cuip_ctx_stacks_lower(char *msg, size_t len);
/* RESUME: every lowered context's own stack limit again (a failure is
 * logged: kernels still get their stacks at launch). Op thread only. */
void cuip_ctx_stacks_restore(void);

#endif /* CUIP_CTX_H */
