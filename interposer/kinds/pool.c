/*
 * pool.c - stream-ordered memory pools (cuMemPool*, cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync): tracked, passed through to the
 * driver, and either left to native checkpoint or refused; around the
 * native checkpoint every pool gives back its cache and takes it again.
 *
 * Decision (README.md "Memory pools", FACTS in test/fakecuda/README): a
 * private pool (never exported or imported) stays with native checkpoint,
 * which saves and restores its memory at the same addresses (measured on the
 * H200). A pool shared by FD cannot be rebuilt with its pointers at the same
 * addresses: cuMemAllocFromPoolAsync and cuMemPoolImportPointer choose the
 * address themselves and take no placement, and a pool's memory cannot be
 * mapped at a chosen VA (no cuMemMap path), so the plugin refuses such a
 * process at preflight (from INSPECT's pools), and QUIESCE refuses it again
 * with the gate closed (pool_refusal, the slice's refuse), naming pid, pool
 * and reason, before anything changes.
 * The H200 shows what happens otherwise: the native restore in place fails
 * with CUDA_ERROR_OPERATING_SYSTEM and the process's CUDA state is lost.
 *
 * A pool counts as shared from its export or import until it was destroyed
 * and nothing allocated from it or imported through it is live; so blocks
 * of shareable pools (handle type POSIX) and imported pointers are tracked
 * by address until freed (cuMemFreeAsync, or cuMemFree through ipc.c).
 *
 * Callers: the application through the entry points below (gated like
 * launches: stream-ordered allocation is device work), inspect.c (state)
 * and ops.c (QUIESCE). Lock: pool_lock, a leaf below state_lock; this file
 * never takes state_lock and calls the driver without pool_lock held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "pool.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"

struct pool {
	CUmemoryPool drv;
	uint64_t serial;
	int device;
	unsigned handle_types;
	bool exported, imported, destroyed;
	uint32_t ptr_exports, live; /* pointers exported; blocks/imports not yet freed */
	struct pool *next;
};

/* A live block of a shareable pool, or a pointer imported through a pool. */
struct blk {
	uint64_t va;
	struct pool *p;
	struct blk *next;
};

#define NBUCKET 1024

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool *pools;
static struct blk *bucket[NBUCKET];
static uint64_t next_serial = 1;
static CUmemoryPool current[64]; /* cuDeviceSetMemPool, per ordinal */
static _Atomic uint32_t nblocks; /* fast path: frees look nothing up while 0 */
/* Pools trimmed before the native checkpoint (op thread only; see below). */
#define NTRIM 128
static struct trimmed {
	CUmemoryPool drv;
	int device;
	uint64_t held, after; /* reserved before and after the trim */
	bool taken;	      /* RESUME took the cache back (a device's contexts share its pools) */
} trimmed[NTRIM];
static size_t ntrimmed;

static void fork_child(void)
{
	pthread_mutex_init(&pool_lock, NULL);
	pools = NULL; /* the child starts with no CUDA state (leaked, never used) */
	memset(bucket, 0, sizeof(bucket));
	memset(current, 0, sizeof(current));
	nblocks = 0;
	ntrimmed = 0;
}

CUIP_FORK_HOOK(pool, NULL, NULL, fork_child);

/* Resolve, check the real entry point exists, enter the gate. */
static CUresult enter(void *fnp)
{
	if (cuip_driver_init())
		return CUDA_ERROR_NOT_FOUND;
	if (!*(void **)fnp)
		return CUDA_ERROR_NOT_FOUND;
	return cuip_gate_enter();
}

/* pool_lock held. */
static struct pool *find(CUmemoryPool drv)
{
	for (struct pool *p = pools; p; p = p->next)
		if (p->drv == drv && !p->destroyed)
			return p;
	return NULL;
}

static struct pool *add(CUmemoryPool drv, int device, unsigned handle_types, bool imported)
{
	struct pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->drv = drv;
	p->device = device;
	p->handle_types = handle_types;
	p->imported = imported;
	pthread_mutex_lock(&pool_lock);
	p->serial = next_serial++;
	p->next = pools;
	pools = p;
	pthread_mutex_unlock(&pool_lock);
	return p;
}

static bool shared(const struct pool *p)
{
	return p->exported || p->imported;
}

/* Unlink a destroyed pool nothing names any more.  pool_lock held. */
static void reap(void)
{
	for (struct pool **pp = &pools; *pp;) {
		struct pool *p = *pp;

		if (p->destroyed && !p->live) {
			*pp = p->next;
			free(p);
		} else {
			pp = &p->next;
		}
	}
}

static size_t hash(uint64_t va)
{
	return (size_t)((va >> 12) * 0x9E3779B97F4A7C15ull >> 54) % NBUCKET;
}

/* Record a live block of p at va (after the driver succeeded). */
static void blk_add(struct pool *p, uint64_t va)
{
	struct blk *b = malloc(sizeof(*b));
	size_t h = hash(va);

	pthread_mutex_lock(&pool_lock);
	if (!b) {
		/* Untracked would let a shared pool look released: keep it forever. */
		p->live++;
		pthread_mutex_unlock(&pool_lock);
		pr_err("out of memory tracking pool %" PRIu64 " block %#" PRIx64 "; the pool stays shared", p->serial,
		       va);
		return;
	}
	b->va = va;
	b->p = p;
	b->next = bucket[h];
	bucket[h] = b;
	p->live++;
	nblocks++;
	pthread_mutex_unlock(&pool_lock);
}

void cuip_pool_freed(uint64_t va)
{
	struct blk **bp;

	if (!nblocks)
		return;
	pthread_mutex_lock(&pool_lock);
	for (bp = &bucket[hash(va)]; *bp; bp = &(*bp)->next)
		if ((*bp)->va == va) {
			struct blk *b = *bp;

			*bp = b->next;
			b->p->live--;
			nblocks--;
			free(b);
			reap();
			break;
		}
	pthread_mutex_unlock(&pool_lock);
}

/* ---- entry points ---------------------------------------------------------- */

CUIP_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	CUresult r = enter(&real.cuMemPoolCreate);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolCreate(pool, props);
	if (r == CUDA_SUCCESS && !add(*pool, props->location.id, props->handleTypes, false)) {
		real.cuMemPoolDestroy(*pool);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
	struct pool *p;
	CUresult r = enter(&real.cuMemPoolDestroy);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolDestroy(pool);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&pool_lock);
		p = find(pool);
		if (p)
			p->destroyed = true;
		for (size_t d = 0; d < sizeof(current) / sizeof(current[0]); d++)
			if (current[d] == pool)
				current[d] = NULL;
		reap();
		pthread_mutex_unlock(&pool_lock);
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
							   CUmemAllocationHandleType type, unsigned long long flags)
{
	struct pool *p;
	CUresult r = enter(&real.cuMemPoolExportToShareableHandle);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolExportToShareableHandle(handle_out, pool, type, flags);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&pool_lock);
		p = find(pool);
		if (p)
			p->exported = true;
		pthread_mutex_unlock(&pool_lock);
		if (!p)
			pr_info("exported memory pool %p that was created before the interposer tracked pools",
				(void *)pool);
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
							     CUmemAllocationHandleType type, unsigned long long flags)
{
	CUresult r = enter(&real.cuMemPoolImportFromShareableHandle);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolImportFromShareableHandle(pool_out, handle, type, flags);
	if (r == CUDA_SUCCESS && !add(*pool_out, -1, type, true)) {
		real.cuMemPoolDestroy(*pool_out);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *out, CUdeviceptr ptr)
{
	struct blk *b;
	CUresult r = enter(&real.cuMemPoolExportPointer);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolExportPointer(out, ptr);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&pool_lock);
		for (b = bucket[hash(ptr)]; b && b->va != ptr; b = b->next)
			;
		if (b)
			b->p->ptr_exports++;
		pthread_mutex_unlock(&pool_lock);
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData *data)
{
	struct pool *p;
	CUresult r = enter(&real.cuMemPoolImportPointer);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemPoolImportPointer(ptr_out, pool, data);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&pool_lock);
		p = find(pool);
		pthread_mutex_unlock(&pool_lock);
		if (p)
			blk_add(p, *ptr_out);
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	CUresult r = enter(&real.cuDeviceSetMemPool);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuDeviceSetMemPool(dev, pool);
	if (r == CUDA_SUCCESS && dev >= 0 && (size_t)dev < sizeof(current) / sizeof(current[0])) {
		pthread_mutex_lock(&pool_lock);
		current[dev] = pool;
		pthread_mutex_unlock(&pool_lock);
	}
	cuip_gate_exit();
	return r;
}

/* The tracked shareable pool p names, or NULL (pool_lock held). */
static struct pool *shareable(CUmemoryPool drv)
{
	struct pool *p = drv ? find(drv) : NULL;

	return p && (p->handle_types || shared(p)) ? p : NULL;
}

static void note_alloc(CUmemoryPool drv, uint64_t va)
{
	struct pool *p;

	pthread_mutex_lock(&pool_lock);
	p = shareable(drv);
	pthread_mutex_unlock(&pool_lock);
	if (p)
		blk_add(p, va);
}

/* cuMemAllocAsync serves from the device's current pool: the current
 * context's device (a stream of another context is not looked at). */
static CUmemoryPool current_pool(void)
{
	CUdevice dev = -1;
	CUmemoryPool drv = NULL;
	bool any = false;

	pthread_mutex_lock(&pool_lock);
	for (size_t d = 0; d < sizeof(current) / sizeof(current[0]); d++)
		any = any || current[d];
	pthread_mutex_unlock(&pool_lock);
	if (!any || !real.cuCtxGetDevice || real.cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 ||
	    (size_t)dev >= sizeof(current) / sizeof(current[0]))
		return NULL;
	pthread_mutex_lock(&pool_lock);
	drv = current[dev];
	pthread_mutex_unlock(&pool_lock);
	return drv;
}

static CUresult alloc_async(__typeof__(&cuMemAllocAsync) fn, CUdeviceptr *dptr, size_t size, CUstream st)
{
	CUresult r = enter(&fn);

	if (r != CUDA_SUCCESS)
		return r;
	r = fn(dptr, size, st);
	if (r == CUDA_SUCCESS) {
		CUmemoryPool cur = current_pool();

		if (cur)
			note_alloc(cur, *dptr);
	}
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	cuip_driver_init();
	return alloc_async(real.cuMemAllocAsync, dptr, bytesize, hStream);
}

CUIP_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	cuip_driver_init();
	return alloc_async(real.cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
}

static CUresult alloc_pool(__typeof__(&cuMemAllocFromPoolAsync) fn, CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
			   CUstream st)
{
	CUresult r = enter(&fn);

	if (r != CUDA_SUCCESS)
		return r;
	r = fn(dptr, size, pool, st);
	if (r == CUDA_SUCCESS)
		note_alloc(pool, *dptr);
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						  CUstream hStream)
{
	cuip_driver_init();
	return alloc_pool(real.cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
}

CUIP_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						       CUstream hStream)
{
	cuip_driver_init();
	return alloc_pool(real.cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
}

static CUresult free_async(__typeof__(&cuMemFreeAsync) fn, CUdeviceptr dptr, CUstream st)
{
	CUresult r = enter(&fn);

	if (r != CUDA_SUCCESS)
		return r;
	r = fn(dptr, st);
	if (r == CUDA_SUCCESS)
		cuip_pool_freed(dptr);
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	cuip_driver_init();
	return free_async(real.cuMemFreeAsync, dptr, hStream);
}

CUIP_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	cuip_driver_init();
	return free_async(real.cuMemFreeAsync_ptsz, dptr, hStream);
}

/* ---- checkpoint side ------------------------------------------------------- */

static const char *why(const struct pool *p)
{
	if (p->imported)
		return "imported by FD (cuMemPoolImportFromShareableHandle)";
	return "exported by FD (cuMemPoolExportToShareableHandle)";
}

/* QUIESCE (slice.h): how many pools are shared; msg names the first. */
static int pool_refusal(char *msg, size_t len)
{
	int n = 0;

	pthread_mutex_lock(&pool_lock);
	for (struct pool *p = pools; p; p = p->next) {
		if (!shared(p))
			continue;
		if (!n++)
			snprintf(msg, len,
				 "pid %d memory pool %" PRIu64 " is %s%s with %u live pointer(s): a shared "
				 "stream-ordered pool cannot be checkpointed (the driver places pool allocations "
				 "itself, so its pointers cannot be rebuilt at the same addresses, and native "
				 "restore loses the process's CUDA state); free its pointers and destroy the pool "
				 "(cuMemPoolDestroy) in every process that shares it, then checkpoint again",
				 self.pid, p->serial, why(p), p->destroyed ? ", destroyed" : "", p->live);
	}
	pthread_mutex_unlock(&pool_lock);
	return n;
}

static int pool_slice_state(Cuip__ProcessState *st)
{
	size_t n = 0, i = 0;

	cuip_state_assert_held();
	pthread_mutex_lock(&pool_lock);
	for (struct pool *p = pools; p; p = p->next)
		n++;
	st->pools = cuip_zalloc(sizeof(*st->pools) * (n ? n : 1));
	if (!st->pools) {
		pthread_mutex_unlock(&pool_lock);
		return -1;
	}
	for (struct pool *p = pools; p && i < n; p = p->next) {
		Cuip__Pool *m = cuip_zalloc(sizeof(*m));

		if (!m) {
			pthread_mutex_unlock(&pool_lock);
			return -1;
		}
		cuip__pool__init(m);
		m->serial = p->serial;
		m->device = p->device;
		m->handle_types = p->handle_types;
		m->has_exported = m->exported = p->exported;
		m->has_imported = m->imported = p->imported;
		m->has_destroyed = m->destroyed = p->destroyed;
		m->has_live = 1;
		m->live = p->live;
		m->has_pointer_exports = 1;
		m->pointer_exports = p->ptr_exports;
		st->pools[i++] = m;
	}
	st->n_pools = i;
	pthread_mutex_unlock(&pool_lock);
	return 0;
}

/* ---- around the native checkpoint: what the pools cache ------------------ */

/*
 * A pool keeps freed memory reserved up to its release threshold: JAX's
 * cuda_async allocator sets the default pool's threshold to the size it
 * preallocates (75% of the GPU) and frees the block, so the pool holds that
 * much, written or not. NVIDIA's native checkpoint copies every byte a pool
 * holds into the process, where criu writes it (60 GB of images for a JAX
 * job on the H200). Before the native checkpoint each pool of the process
 * (its devices' default and current pools, the ones it created) gives back
 * what no live allocation uses (cuMemPoolTrimTo after QUIESCE drained the
 * device); at RESUME (after a restore, or a dump that lets the job run on)
 * the pool takes as much again, one allocation freed at once, so that it
 * holds what it held before, as its threshold asks. Only the size
 * of the cache is the job's: its bytes were free memory.
 */
static void trim_note(CUmemoryPool drv, int device)
{
	for (size_t i = 0; i < ntrimmed; i++)
		if (trimmed[i].drv == drv)
			return;
	if (drv && ntrimmed < NTRIM)
		trimmed[ntrimmed++] = (struct trimmed){.drv = drv, .device = device};
}

/* The default and the current pool of the current context's device. */
static CUresult trim_collect(CUcontext c, void *arg)
{
	CUmemoryPool p = NULL;
	CUdevice dev;

	(void)c;
	(void)arg;
	if (real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return CUDA_SUCCESS;
	if (real.cuDeviceGetDefaultMemPool(&p, dev) == CUDA_SUCCESS)
		trim_note(p, (int)dev);
	if (real.cuDeviceGetMemPool(&p, dev) == CUDA_SUCCESS)
		trim_note(p, (int)dev);
	return CUDA_SUCCESS;
}

static uint64_t reserved(CUmemoryPool p)
{
	cuuint64_t v = 0;

	return real.cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS ? v : 0;
}

static void pools_before_native(void)
{
	struct cuip_ctx_at at;
	uint64_t before = 0, after = 0;
	size_t n = 0;

	ntrimmed = 0;
	if (!real.cuMemPoolTrimTo || !real.cuMemPoolGetAttribute || !real.cuDeviceGetDefaultMemPool ||
	    !real.cuDeviceGetMemPool)
		return;
	cuip_each_context(trim_collect, NULL, &at);
	pthread_mutex_lock(&pool_lock);
	for (struct pool *p = pools; p; p = p->next)
		if (!p->destroyed && !p->imported)
			trim_note(p->drv, p->device);
	pthread_mutex_unlock(&pool_lock);
	for (size_t i = 0; i < ntrimmed; i++) {
		struct trimmed *t = &trimmed[i];
		CUresult r;

		t->held = t->after = reserved(t->drv);
		if (!t->held)
			continue;
		r = real.cuMemPoolTrimTo(t->drv, 0);
		if (r != CUDA_SUCCESS) {
			pr_err("memory pool %p of device %d: cuMemPoolTrimTo failed: %s (the native checkpoint copies "
			       "its %" PRIu64 " MiB)",
			       (void *)t->drv, t->device, cuip_cuerr(r), t->held >> 20);
			continue;
		}
		t->after = reserved(t->drv);
		if (t->after < t->held) {
			n++;
			before += t->held;
			after += t->after;
		}
	}
	if (n)
		pr_info("memory pools: %zu pool(s) gave back %" PRIu64 " MiB they cached but no allocation used "
			"(%" PRIu64 " MiB still in use) before the native checkpoint; they take it again at RESUME",
			n, (before - after) >> 20, after >> 20);
}

/* Takes back what each trimmed pool of the current context's device gave. */
static CUresult regrow_device(CUcontext c, void *arg)
{
	uint64_t *taken = arg;
	CUstream st = NULL;
	CUdevice dev;

	(void)c;
	if (real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return CUDA_SUCCESS;
	for (size_t i = 0; i < ntrimmed; i++) {
		struct trimmed *t = &trimmed[i];
		uint64_t now = reserved(t->drv);
		CUdeviceptr va = 0;
		CUresult r;

		if (t->device != (int)dev || t->taken || t->after >= t->held || now >= t->held)
			continue;
		if (!st && (r = real.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
			pr_err("device %d: no stream to refill its memory pools: %s (they grow again on demand)",
			       (int)dev, cuip_cuerr(r));
			return CUDA_SUCCESS;
		}
		r = real.cuMemAllocFromPoolAsync(&va, t->held - now, t->drv, st);
		if (r == CUDA_SUCCESS)
			r = real.cuMemFreeAsync(va, st);
		if (r == CUDA_SUCCESS)
			r = real.cuStreamSynchronize(st);
		if (r != CUDA_SUCCESS) {
			pr_err("memory pool %p of device %d: taking back %" PRIu64 " MiB failed: %s (it grows again "
			       "on demand)",
			       (void *)t->drv, t->device, (t->held - now) >> 20, cuip_cuerr(r));
			continue;
		}
		/* a pool whose release threshold is below what it held gives
		 * the memory back at the synchronize: say so */
		{
			uint64_t got = reserved(t->drv);

			if (got < t->held)
				pr_info("memory pool %p of device %d holds %" PRIu64 " MiB after taking back, %" PRIu64
					" MiB before the checkpoint (its release threshold keeps no more)",
					(void *)t->drv, t->device, got >> 20, t->held >> 20);
			*taken += got > now ? got - now : 0;
		}
		t->taken = true;
	}
	if (st)
		real.cuStreamDestroy_v2(st);
	return CUDA_SUCCESS;
}

static void pools_resume(void)
{
	struct cuip_ctx_at at;
	uint64_t taken = 0;

	if (!ntrimmed)
		return;
	cuip_each_context(regrow_device, &taken, &at);
	if (taken)
		pr_info("memory pools: took back the %" PRIu64 " MiB they cached before the checkpoint", taken >> 20);
	ntrimmed = 0;
}

/* Pools keep no state across a checkpoint but what INSPECT reports; shared
 * ones refuse QUIESCE; around the native checkpoint they give back their
 * cache and take it again. */
CUIP_SLICE(pool, .name = "pool", .inspect = pool_slice_state, .refuse = pool_refusal,
	   .before_native = pools_before_native, .resume = pools_resume);
