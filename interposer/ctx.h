/*
 * ctx.h - contexts the application creates (ctx.c), synchronized at
 * QUIESCE. ctx_mu protects the set.
 */
#ifndef CUIP_CTX_H
#define CUIP_CTX_H

#include <stddef.h>
#include <cuda.h>

/* Snapshot of the live contexts created with cuCtxCreate*; returns the count. */
size_t cuip_contexts(CUcontext *out, size_t max);

#endif /* CUIP_CTX_H */
