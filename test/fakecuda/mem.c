/*
 * Linear device memory (cuMemAlloc/cuMemFree), page-locked host memory, and
 * the copy/set family (cuMemcpy*, cuMemset*).  Copies are classified by
 * unified addressing: a VA in a device mapping or reservation is device
 * memory, anything else is host memory.  Synchronous forms drain the queue
 * and run inline; asynchronous forms are validated now and queued
 * (stream.c).  Tables under G.lock.
 *
 * As the real driver (docs/driver-facts.md, "Small allocations": 1,000 x 4 KiB cost 4.0 MiB, 1,000 x 64 KiB
 * 64 MiB of cuMemGetInfo), requests under LINEAR_CHUNK are packed into
 * LINEAR_CHUNK-sized devd allocations of their context and device, first
 * fit at PIECE_ALIGN (the spacing of the driver's small allocations): the
 * chunk is one fk_alloc slot and one VA reservation, each allocation one
 * mapping of it at its offset, and the chunk goes when its last mapping is
 * freed.  Larger requests are a devd allocation each.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake.h"

#define LINEAR_ALIGN (2ul << 20)
#define LINEAR_CHUNK (2ul << 20)
#define PIECE_ALIGN  512ul

/* Chunk slot -> its VA (valid while the slot is a used linear chunk). */
static uint64_t chunk_va[FK_MAX_ALLOC];
static int chunk_hint = -1;

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) / pg * pg;
}

static int is_chunk(int slot, const struct fk_ctx *c)
{
	const struct fk_alloc *a = &G.alloc[slot];

	return a->used && a->kind == FK_A_LINEAR && a->size == LINEAR_CHUNK && a->ctx == c && a->win &&
	       chunk_va[slot] && a->map_refs > 0;
}

/* First offset in chunk slot where size bytes fit, or -1.  G.lock held. */
static long chunk_fit(int slot, size_t size)
{
	uint64_t base = chunk_va[slot], at = base, end = base + LINEAR_CHUNK;

	for (int i = map_lower(base); i < G.nmap; i++) {
		const struct fk_map *m = &G.map[G.map_by_va[i]];

		if (m->va >= end)
			break;
		if (at + size <= m->va)
			return (long)(at - base);
		at = (m->va + m->size + PIECE_ALIGN - 1) & ~(PIECE_ALIGN - 1);
	}
	return at + size <= end ? (long)(at - base) : -1;
}

/* A small request: a piece of a chunk of context c with room, else a new
 * chunk (one devd allocation of LINEAR_CHUNK).  G.lock held. */
static CUresult piece_alloc(struct fk_ctx *c, CUdeviceptr *dptr, size_t size)
{
	struct fkw_req q = {.op = FKW_ALLOC, .flags = FKW_AF_LINEAR};
	struct fkw_resp r;
	struct fk_alloc *a;
	long off = -1;
	int slot = -1;
	uint64_t va;
	CUresult res;

	if (chunk_hint >= 0 && is_chunk(chunk_hint, c) && G.alloc[chunk_hint].ord == c->ord)
		off = chunk_fit(slot = chunk_hint, size);
	for (int i = 0; off < 0 && i < FK_MAX_ALLOC; i++)
		if (i != chunk_hint && is_chunk(i, c) && G.alloc[i].ord == c->ord)
			off = chunk_fit(slot = i, size);
	if (off >= 0) {
		if (map_add(chunk_va[slot] + (uint64_t)off, size, 0, slot, (size_t)off, ~0u) < 0)
			return CUDA_ERROR_OUT_OF_MEMORY;
		chunk_hint = slot;
		*dptr = chunk_va[slot] + (uint64_t)off;
		return CUDA_SUCCESS;
	}
	slot = alloc_slot_new();
	if (slot < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = &G.alloc[slot];
	q.dev = (uint32_t)dev_phys(c->ord);
	q.size = LINEAR_CHUNK;
	res = alloc_open(slot, &q, q.dev, LINEAR_CHUNK, LINEAR_ALIGN, size, &r, &va);
	if (res)
		return res;
	a->kind = FK_A_LINEAR;
	a->ord = c->ord;
	a->size = LINEAR_CHUNK;
	a->dflags = FKW_AF_LINEAR;
	a->ctx = c;
	chunk_va[slot] = va;
	chunk_hint = slot;
	*dptr = va;
	return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct fkw_req q = {.op = FKW_ALLOC, .flags = FKW_AF_LINEAR};
	struct fkw_resp r;
	struct fk_alloc *a;
	struct fk_ctx *c;
	size_t size = page_round(bytesize);
	CUresult res = ctx_require(&c);
	uint64_t va = 0;
	int slot;

	if (res)
		return res;
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	if (bytesize < LINEAR_CHUNK) {
		res = piece_alloc(c, dptr, (bytesize + PIECE_ALIGN - 1) & ~(PIECE_ALIGN - 1));
		goto out;
	}
	slot = alloc_slot_new();
	if (slot < 0) {
		res = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	a = &G.alloc[slot];
	q.dev = (uint32_t)dev_phys(c->ord);
	q.size = size;
	res = alloc_open(slot, &q, q.dev, size, LINEAR_ALIGN, size, &r, &va);
	if (res)
		goto out;
	a->kind = FK_A_LINEAR;
	a->ord = c->ord;
	a->size = size;
	a->dflags = FKW_AF_LINEAR;
	a->ctx = c;
	a->handle_refs = 1;
	*dptr = va;
out:
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	FK_CALL("cuMemAlloc", mem_alloc(dptr, bytesize));
}

/* Frees one linear allocation by its mapping; a chunk goes with its last
 * piece.  G.lock held. */
static void linear_free(struct fk_map *m)
{
	struct fk_alloc *a = &G.alloc[m->slot];
	uint64_t base = m->va - m->off;
	int slot = m->slot;

	map_del(m);
	if (--a->map_refs > 0)
		return;
	va_release(base, a->size);
	chunk_va[slot] = 0;
	a->handle_refs = 0;
	alloc_slot_put(slot);
}

void linear_free_ctx(struct fk_ctx *c)
{
	for (int i = 0; i < FK_MAX_MAP; i++) {
		struct fk_map *m = &G.map[i];

		if (m->used && !m->is_mc && G.alloc[m->slot].kind == FK_A_LINEAR && G.alloc[m->slot].ctx == c)
			linear_free(m);
	}
}

static CUresult mem_free(CUdeviceptr dptr)
{
	struct fk_map *m;
	CUresult r = CUDA_SUCCESS;

	stream_sync_all(); /* cuMemFree synchronizes, as on a real device */
	LOCK();
	m = map_find(dptr);
	if (!m || m->va != dptr || m->is_mc || G.alloc[m->slot].kind != FK_A_LINEAR)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		linear_free(m);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
	FK_CALL("cuMemFree", mem_free(dptr));
}

static CUresult get_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct fk_map *m;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	m = map_find(dptr);
	if (!m) {
		r = CUDA_ERROR_NOT_FOUND;
	} else {
		if (pbase)
			*pbase = m->va;
		if (psize)
			*psize = m->size;
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	FK_CALL("cuMemGetAddressRange", get_range(pbase, psize, dptr));
}

/* --- page-locked host memory ---------------------------------------------------- */

static struct fk_hostmem *host_find(const void *p)
{
	for (int i = 0; i < FK_MAX_HOST; i++)
		if (G.host[i].used && G.host[i].p == p)
			return &G.host[i];
	return NULL;
}

static struct fk_hostmem *host_new(void)
{
	for (int i = 0; i < FK_MAX_HOST; i++)
		if (!G.host[i].used)
			return &G.host[i];
	return NULL;
}

static CUresult host_alloc(void **pp, size_t size, unsigned int flags)
{
	struct fk_hostmem *h;
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);
	void *p;

	if (r)
		return r;
	if (!pp || size == 0 || (flags & ~0xfu))
		return CUDA_ERROR_INVALID_VALUE;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	LOCK();
	h = host_new();
	if (h) {
		h->used = 1;
		h->p = p;
		h->size = size;
		h->registered = 0;
		*pp = p;
	}
	UNLOCK();
	if (!h) {
		munmap(p, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	FK_CALL("cuMemAllocHost", host_alloc(pp, bytesize, 0));
}

FK_API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	FK_CALL("cuMemHostAlloc", host_alloc(pp, bytesize, Flags));
}

static CUresult host_free(void *p)
{
	struct fk_hostmem *h;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	h = host_find(p);
	if (!h || h->registered) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		munmap(h->p, h->size);
		h->used = 0;
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemFreeHost(void *p)
{
	FK_CALL("cuMemFreeHost", host_free(p));
}

static CUresult host_register(void *p, size_t size, unsigned int flags)
{
	struct fk_hostmem *h;
	CUresult r = CUDA_SUCCESS;
	struct fk_ctx *c;

	r = ctx_require(&c);
	if (r)
		return r;
	if (!p || size == 0 || (flags & ~0xfu))
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	for (int i = 0; i < FK_MAX_HOST; i++) {
		h = &G.host[i];
		if (h->used && (char *)p < (char *)h->p + h->size && (char *)h->p < (char *)p + size) {
			UNLOCK();
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	}
	h = host_new();
	if (!h) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		h->used = 1;
		h->p = p;
		h->size = size;
		h->registered = 1;
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	FK_CALL("cuMemHostRegister", host_register(p, bytesize, Flags));
}

static CUresult host_unregister(void *p)
{
	struct fk_hostmem *h;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	h = host_find(p);
	if (!h || !h->registered)
		r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	else
		h->used = 0;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	FK_CALL("cuMemHostUnregister", host_unregister(p));
}

/* --- copies and sets ------------------------------------------------------------ */

enum side { ANY, HOST, DEV };

/* Every byte of [va, va+n) is in an accessible device mapping.  G.lock held. */
static int range_ok(uint64_t va, size_t n)
{
	while (n > 0) {
		struct fk_map *m = map_find(va);
		size_t k;

		if (!m || !m->access)
			return 0;
		k = m->va + m->size - va;
		if (k >= n)
			return 1;
		va += k;
		n -= k;
	}
	return 1;
}

/* Runs or queues a prepared op.  async: hStream is used; else runs inline after draining the queue. */
static CUresult submit(struct fk_op *op, int async, CUstream hStream)
{
	struct fk_stream *s;
	CUresult r;

	if (!async) {
		r = stream_sync_all();
		if (r)
			return r;
		LOCK();
		r = op_execute(op);
		UNLOCK();
		return r;
	}
	LOCK();
	r = stream_resolve(hStream, &s);
	if (!r)
		r = stream_enqueue(op, s);
	UNLOCK();
	return r;
}

static CUresult copy(uint64_t dst, uint64_t src, size_t n, enum side ds, enum side ss, int async, CUstream st)
{
	struct fk_op op = {.n = n, .dst = dst, .src = src};
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);
	int dd, sd;

	if (r)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	dd = devmem_is_device(dst);
	sd = devmem_is_device(src);
	if ((ds == DEV && !dd) || (ss == DEV && !sd) || (ds == HOST && dd) || (ss == HOST && sd) ||
	    (dd && !range_ok(dst, n)) || (sd && !range_ok(src, n))) {
		UNLOCK();
		return CUDA_ERROR_INVALID_VALUE;
	}
	UNLOCK();
	if (dd && sd) {
		op.type = OP_COPY;
	} else if (dd) {
		op.type = OP_HOST_TO_DEV;
		op.host = (void *)(uintptr_t)src;
	} else if (sd) {
		op.type = OP_DEV_TO_HOST;
		op.host = (void *)(uintptr_t)dst;
	} else {
		op.type = OP_HOST_COPY;
	}
	if (dd != sd)
		op.delay_us = (uint32_t)(((uint64_t)n * fk_copy_us_per_mb) >> 20);
	return submit(&op, async, st);
}

FK_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	FK_CALL("cuMemcpy", copy(dst, src, ByteCount, ANY, ANY, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	FK_CALL("cuMemcpyAsync", copy(dst, src, ByteCount, ANY, ANY, 1, hStream));
}

FK_API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	FK_CALL("cuMemcpyHtoD", copy(dstDevice, (uintptr_t)srcHost, ByteCount, DEV, ANY, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	FK_CALL("cuMemcpyDtoH", copy((uintptr_t)dstHost, srcDevice, ByteCount, ANY, DEV, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	FK_CALL("cuMemcpyDtoD", copy(dstDevice, srcDevice, ByteCount, DEV, DEV, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
					     CUstream hStream)
{
	FK_CALL("cuMemcpyHtoDAsync", copy(dstDevice, (uintptr_t)srcHost, ByteCount, DEV, ANY, 1, hStream));
}

FK_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	FK_CALL("cuMemcpyDtoHAsync", copy((uintptr_t)dstHost, srcDevice, ByteCount, ANY, DEV, 1, hStream));
}

FK_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
					     CUstream hStream)
{
	FK_CALL("cuMemcpyDtoDAsync", copy(dstDevice, srcDevice, ByteCount, DEV, DEV, 1, hStream));
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, int async,
			  CUstream st)
{
	int ok;

	LOCK();
	ok = ctx_valid((struct fk_ctx *)dctx) && ctx_valid((struct fk_ctx *)sctx);
	UNLOCK();
	if (!ok)
		return CUDA_ERROR_INVALID_CONTEXT;
	return copy(dst, src, n, DEV, DEV, async, st);
}

FK_API CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				     CUcontext srcContext, size_t ByteCount)
{
	FK_CALL("cuMemcpyPeer", copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
					  CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	FK_CALL("cuMemcpyPeerAsync", copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, 1, hStream));
}

static CUresult memset_any(CUdeviceptr dst, uint32_t value, size_t psize, size_t count, int async, CUstream st)
{
	struct fk_op op = {.type = OP_FILL, .dst = dst, .pattern = value, .psize = psize, .n = count};
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);
	int ok;

	if (r)
		return r;
	if (dst % psize)
		return CUDA_ERROR_INVALID_VALUE;
	if (count == 0)
		return CUDA_SUCCESS;
	LOCK();
	ok = range_ok(dst, count * psize);
	UNLOCK();
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(&op, async, st);
}

FK_API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	FK_CALL("cuMemsetD8", memset_any(dstDevice, uc, 1, N, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	FK_CALL("cuMemsetD16", memset_any(dstDevice, us, 2, N, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	FK_CALL("cuMemsetD32", memset_any(dstDevice, ui, 4, N, 0, NULL));
}

FK_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	FK_CALL("cuMemsetD8Async", memset_any(dstDevice, uc, 1, N, 1, hStream));
}

FK_API CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
	FK_CALL("cuMemsetD16Async", memset_any(dstDevice, us, 2, N, 1, hStream));
}

FK_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	FK_CALL("cuMemsetD32Async", memset_any(dstDevice, ui, 4, N, 1, hStream));
}
