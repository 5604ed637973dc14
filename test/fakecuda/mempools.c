/*
 * Stream-ordered memory pools (cuMemPool*, cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync, cuDevice{Get,Set,GetDefault}MemPool)
 * and their sharing across processes (cuMemPoolExportToShareableHandle /
 * ImportFromShareableHandle, cuMemPoolExportPointer / ImportPointer), with
 * the behaviour measured on the H200 (docs/driver-facts.md, README here).
 *
 * A pool block is a linear allocation of the fake (FK_A_LINEAR, no owning
 * context), so native checkpoint saves and restores its bytes at the same
 * address like any cuMemAlloc memory; a freed block stays in its pool (the
 * same address is handed out again) while the pool holds no more than its
 * release threshold.  An imported pointer is opened through devd's IPC
 * tokens (FK_A_IPC).  A pool that is shared (exported or imported, until it
 * is destroyed and nothing allocated from or imported through it is live)
 * makes the process hold one more devd connection, the "pool channel"
 * (pool_chan): native checkpoint leaves it open, so CRIU cannot dump the
 * process, and a native restore fails with CUDA_ERROR_OPERATING_SYSTEM
 * (restore_thread.c asks pool_shared()), as the real driver's leftover
 * 195:255 descriptor does. The channel also keeps a descriptor of the
 * device node (devnode.c) open, that descriptor's equivalent.
 *
 * Callers: the application, through the exported entry points.  State: the
 * static tables below, under G.lock; pool_shared() is read by the restore
 * thread without it (LOCKED: no thread is inside the API).
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fake.h"

#define FK_MAX_POOL    64
#define FK_MAX_PBLK    8192
#define FK_POOL_MAGIC  0x4c4f4f50u /* "POOL" */
#define POOL_FD_MAGIC  0x44465046u /* "FPFD" */
#define POOL_PTR_MAGIC 0x52545046u /* "FPTR" */

struct fk_pool {
	uint32_t magic;
	int used;
	int ord; /* device ordinal of its location */
	int is_default;
	int exported, imported, destroyed;
	CUmemPoolProps props;
	uint64_t token;	 /* names the pool across processes */
	int32_t src_pid; /* imported: the exporter */
	uint64_t threshold;
	int reuse[3]; /* FOLLOW_EVENT_DEPENDENCIES, ALLOW_OPPORTUNISTIC, ALLOW_INTERNAL_DEPENDENCIES */
	uint64_t reserved, in_use, reserved_high, used_high;
	uint32_t access; /* ordinals with read-write access (beside its own) */
	int nlive;	 /* blocks handed out or imported, not yet freed */
};

/* One block of a pool: handed out, cached (freed into the pool) or imported. */
struct fk_pblk {
	int used;
	int pool;
	int cached;
	int imported;
	uint64_t va;
	size_t size;
	int slot; /* fk_alloc */
};

/* What an exported pool's FD holds (a sealed memfd: any process may read it). */
struct pool_fd_rec {
	uint32_t magic;
	int32_t pid;
	uint64_t token;
	uint32_t phys;
	uint32_t handle_types;
};

/* CUmemPoolPtrExportData as the fake fills it. */
struct pool_ptr_rec {
	uint32_t magic;
	int32_t pid;
	uint64_t pool_token;
	uint64_t id, ipc_token, size;
	uint32_t phys;
};
_Static_assert(sizeof(struct pool_ptr_rec) <= sizeof(CUmemPoolPtrExportData), "pointer export data too large");

static struct fk_pool pools[FK_MAX_POOL];
static struct fk_pblk blks[FK_MAX_PBLK];
static int def_pool[FKW_MAX_DEV] = {[0 ... FKW_MAX_DEV - 1] = -1};
static int cur_pool[FKW_MAX_DEV] = {[0 ... FKW_MAX_DEV - 1] = -1};
static int pool_chan = -1;
static int pool_node = -1; /* the channel's descriptor of the device node */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Lock-free: the restore thread asks while the process is LOCKED. */
int pool_shared(void)
{
	for (int i = 0; i < FK_MAX_POOL; i++) {
		const struct fk_pool *p = &pools[i];

		if (p->used && (p->exported || p->imported) && (!p->destroyed || p->nlive > 0))
			return 1;
	}
	return 0;
}

/* A forked child cannot use CUDA: it must not keep the parent's channel. */
static void chan_fork_child(void)
{
	if (pool_chan >= 0)
		close(pool_chan);
	pool_chan = -1;
	if (pool_node >= 0)
		close(pool_node);
	pool_node = -1;
	memset(pools, 0, sizeof(pools));
	memset(blks, 0, sizeof(blks));
	for (int i = 0; i < FKW_MAX_DEV; i++)
		def_pool[i] = cur_pool[i] = -1;
}

static void atfork_setup(void)
{
	pthread_atfork(NULL, NULL, chan_fork_child);
}

/* Open or close the pool channel to match pool_shared().  G.lock held. */
static CUresult chan_sync(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	pthread_once(&atfork_once, atfork_setup);
	if (!pool_shared()) {
		if (pool_chan >= 0)
			close(pool_chan);
		pool_chan = -1;
		if (pool_node >= 0)
			close(pool_node);
		pool_node = -1;
		return CUDA_SUCCESS;
	}
	if (pool_chan >= 0)
		return CUDA_SUCCESS;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", G.sockpath);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	pool_chan = fd;
	pool_node = devnode_dup();
	return CUDA_SUCCESS;
}

static struct fk_pool *pool_get(CUmemoryPool h)
{
	struct fk_pool *p = (struct fk_pool *)h;

	if (!p || p < pools || p >= pools + FK_MAX_POOL || (uintptr_t)((char *)p - (char *)pools) % sizeof(*p) ||
	    p->magic != FK_POOL_MAGIC || !p->used || p->destroyed)
		return NULL;
	return p;
}

static int pool_new(void)
{
	for (int i = 0; i < FK_MAX_POOL; i++)
		if (!pools[i].used) {
			memset(&pools[i], 0, sizeof(pools[i]));
			pools[i].used = 1;
			pools[i].magic = FK_POOL_MAGIC;
			pools[i].reuse[0] = pools[i].reuse[1] = pools[i].reuse[2] = 1;
			return i;
		}
	return -1;
}

/* A pool slot nothing names any more is reused.  G.lock held. */
static void pool_put(int i)
{
	if (pools[i].destroyed && pools[i].nlive == 0)
		memset(&pools[i], 0, sizeof(pools[i]));
}

static struct fk_pblk *blk_at(uint64_t va)
{
	for (int i = 0; i < FK_MAX_PBLK; i++)
		if (blks[i].used && !blks[i].cached && blks[i].va == va)
			return &blks[i];
	return NULL;
}

static struct fk_pblk *blk_new(void)
{
	for (int i = 0; i < FK_MAX_PBLK; i++)
		if (!blks[i].used) {
			memset(&blks[i], 0, sizeof(blks[i]));
			blks[i].used = 1;
			return &blks[i];
		}
	return NULL;
}

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) / pg * pg;
}

/* Releases a block's memory (owned or imported).  G.lock held. */
static void blk_release(struct fk_pblk *b)
{
	struct fk_map *m = map_find(b->va);
	struct fk_alloc *a = &G.alloc[b->slot];

	if (m && m->va == b->va) {
		va_release(m->va, m->size);
		map_del(m);
		a->map_refs--;
	}
	a->handle_refs = 0;
	a->ipc_open_refs = 0;
	alloc_slot_put(b->slot);
	b->used = 0;
}

/* A new linear allocation of `size` bytes on ordinal ord for a pool.  G.lock held. */
static CUresult blk_create(int ord, size_t size, int *slotp, uint64_t *vap)
{
	struct fkw_req q = {.op = FKW_ALLOC, .flags = FKW_AF_LINEAR};
	struct fkw_resp r;
	struct fk_alloc *a;
	uint64_t va = 0;
	CUresult res;
	int slot = alloc_slot_new();

	if (slot < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = &G.alloc[slot];
	q.dev = (uint32_t)dev_phys(ord);
	q.size = size;
	res = alloc_open(slot, &q, q.dev, size, 2ul << 20, size, &r, &va);
	if (res)
		return res;
	a->kind = FK_A_LINEAR;
	a->ord = ord;
	a->size = size;
	a->dflags = FKW_AF_LINEAR;
	a->ctx = NULL; /* pool memory outlives contexts */
	a->handle_refs = 1;
	ctx_note_use(ord);
	*slotp = slot;
	*vap = va;
	return CUDA_SUCCESS;
}

/* Gives cached blocks back until the pool holds at most keep bytes.  G.lock held. */
static void pool_trim(int pi, uint64_t keep)
{
	struct fk_pool *p = &pools[pi];

	for (int i = 0; i < FK_MAX_PBLK && p->reserved > keep; i++) {
		struct fk_pblk *b = &blks[i];

		if (b->used && b->cached && b->pool == pi) {
			p->reserved -= b->size;
			blk_release(b);
		}
	}
}

static int props_ok(const CUmemPoolProps *pp)
{
	if (pp->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || pp->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    pp->win32SecurityAttributes)
		return 0;
	for (size_t i = 0; i < sizeof(pp->reserved); i++)
		if (pp->reserved[i])
			return 0;
	return 1;
}

static CUresult pool_create(CUmemoryPool *out, const CUmemPoolProps *pp)
{
	int i;

	if (!out || !pp || !props_ok(pp))
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(pp->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	if (pp->handleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return pp->handleTypes & CU_MEM_HANDLE_TYPE_FABRIC ? CUDA_ERROR_NOT_SUPPORTED
								   : CUDA_ERROR_INVALID_VALUE;
	LOCK();
	i = pool_new();
	if (i >= 0) {
		pools[i].ord = pp->location.id;
		pools[i].props = *pp;
		*out = (CUmemoryPool)&pools[i];
	}
	UNLOCK();
	return i < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
	FK_CALL("cuMemPoolCreate", pool_create(pool, poolProps));
}

/* The default pool of ordinal ord, made on first use.  G.lock held. */
static int default_pool(int ord)
{
	if (def_pool[ord] < 0) {
		int i = pool_new();

		if (i < 0)
			return -1;
		pools[i].ord = ord;
		pools[i].is_default = 1;
		pools[i].props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		pools[i].props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		pools[i].props.location.id = ord;
		def_pool[ord] = i;
	}
	return def_pool[ord];
}

static int current_pool(int ord)
{
	return cur_pool[ord] >= 0 ? cur_pool[ord] : default_pool(ord);
}

static CUresult pool_destroy(CUmemoryPool h)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;
	int pi;

	LOCK();
	p = pool_get(h);
	if (!p || p->is_default) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	pi = (int)(p - pools);
	pool_trim(pi, 0);
	for (int d = 0; d < FKW_MAX_DEV; d++)
		if (cur_pool[d] == pi)
			cur_pool[d] = -1;
	/* Live blocks keep it (as the real driver: released when they are freed). */
	p->destroyed = 1;
	pool_put(pi);
	r = chan_sync();
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
	FK_CALL("cuMemPoolDestroy", pool_destroy(pool));
}

static CUresult get_default(CUmemoryPool *out, CUdevice dev, int current)
{
	int i;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	i = current ? current_pool(dev) : default_pool(dev);
	if (i >= 0)
		*out = (CUmemoryPool)&pools[i];
	UNLOCK();
	return i < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	FK_CALL("cuDeviceGetDefaultMemPool", get_default(pool_out, dev, 0));
}

FK_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	FK_CALL("cuDeviceGetMemPool", get_default(pool, dev, 1));
}

static CUresult set_current(CUdevice dev, CUmemoryPool h)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	p = pool_get(h);
	/* Imported pools cannot hand out memory; a pool serves its own device. */
	if (!p || p->imported || p->ord != dev)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		cur_pool[dev] = (int)(p - pools);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	FK_CALL("cuDeviceSetMemPool", set_current(dev, pool));
}

static CUresult pool_set_attr(CUmemoryPool h, CUmemPool_attribute attr, void *value)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	p = pool_get(h);
	if (!p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		p->threshold = *(cuuint64_t *)value;
		pool_trim((int)(p - pools), p->threshold > p->in_use ? p->threshold : p->in_use);
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		/* Only a reset to 0 (to the current value) is allowed. */
		if (*(cuuint64_t *)value)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
			p->reserved_high = p->reserved;
		else
			p->used_high = p->in_use;
		break;
	default: /* the *_CURRENT values are read-only */
		r = CUDA_ERROR_INVALID_VALUE;
		break;
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	FK_CALL("cuMemPoolSetAttribute", pool_set_attr(pool, attr, value));
}

static CUresult pool_get_attr(CUmemoryPool h, CUmemPool_attribute attr, void *value)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	p = pool_get(h);
	if (!p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		*(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		*(cuuint64_t *)value = p->threshold;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*(cuuint64_t *)value = p->reserved;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		*(cuuint64_t *)value = p->reserved_high;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*(cuuint64_t *)value = p->in_use;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*(cuuint64_t *)value = p->used_high;
		break;
	default:
		r = CUDA_ERROR_INVALID_VALUE;
		break;
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	FK_CALL("cuMemPoolGetAttribute", pool_get_attr(pool, attr, value));
}

static CUresult pool_set_access(CUmemoryPool h, const CUmemAccessDesc *map, size_t count)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (!map && count)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return CUDA_ERROR_INVALID_VALUE;
		if (dev_check(map[i].location.id))
			return CUDA_ERROR_INVALID_DEVICE;
		if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	}
	LOCK();
	p = pool_get(h);
	if (!p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	for (size_t i = 0; i < count; i++) {
		uint32_t bit = 1u << map[i].location.id;

		if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			p->access |= bit;
		else
			p->access &= ~bit;
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
	FK_CALL("cuMemPoolSetAccess", pool_set_access(pool, map, count));
}

static CUresult pool_get_access(CUmemAccess_flags *flags, CUmemoryPool h, CUmemLocation *loc)
{
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;

	if (!flags || !loc || loc->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(loc->id))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	p = pool_get(h);
	if (!p)
		r = CUDA_ERROR_INVALID_VALUE;
	else if ((!p->imported && loc->id == p->ord) || (p->access >> loc->id & 1))
		*flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	else
		*flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location)
{
	FK_CALL("cuMemPoolGetAccess", pool_get_access(flags, memPool, location));
}

static CUresult pool_trim_to(CUmemoryPool h, size_t keep)
{
	struct fk_pool *p;

	LOCK();
	p = pool_get(h);
	if (p)
		pool_trim((int)(p - pools), keep > p->in_use ? keep : p->in_use);
	UNLOCK();
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	FK_CALL("cuMemPoolTrimTo", pool_trim_to(pool, minBytesToKeep));
}

/* --- allocation in stream order --------------------------------------------------------- */

/*
 * The fake runs every stream's work in order on one worker, so handing the
 * block out at once is a legal (stricter) schedule: work queued after the
 * allocation sees it.  A cached block of the same size is reused (same
 * address); otherwise a new one is made.  G.lock held.
 */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t bytesize, int pi)
{
	struct fk_pool *p = &pools[pi];
	size_t size = page_round(bytesize);
	struct fk_pblk *b = NULL;
	CUresult r;

	for (int i = 0; i < FK_MAX_PBLK; i++)
		if (blks[i].used && blks[i].cached && blks[i].pool == pi && blks[i].size == size) {
			b = &blks[i];
			break;
		}
	if (b) {
		b->cached = 0;
	} else {
		if (p->props.maxSize && p->reserved + size > p->props.maxSize)
			return CUDA_ERROR_OUT_OF_MEMORY;
		b = blk_new();
		if (!b)
			return CUDA_ERROR_OUT_OF_MEMORY;
		r = blk_create(p->ord, size, &b->slot, &b->va);
		if (r) {
			b->used = 0;
			return r;
		}
		b->pool = pi;
		b->size = size;
		p->reserved += size;
	}
	p->in_use += size;
	p->nlive++;
	if (p->reserved > p->reserved_high)
		p->reserved_high = p->reserved;
	if (p->in_use > p->used_high)
		p->used_high = p->in_use;
	*dptr = b->va;
	return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool h, CUstream hs, int from_pool)
{
	struct fk_stream *s;
	struct fk_ctx *c = NULL;
	struct fk_pool *p;
	CUresult r;
	int pi;

	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	r = stream_resolve(hs, &s);
	if (r)
		goto out;
	c = s ? s->ctx : ctx_current();
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
		goto out;
	}
	if (from_pool) {
		p = pool_get(h);
		/* Imported pools cannot hand out memory (cuda.h). */
		if (!p || p->imported) {
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		pi = (int)(p - pools);
	} else {
		pi = current_pool(c->ord);
		if (pi < 0) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
	}
	r = pool_alloc(dptr, bytesize, pi);
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	FK_CALL("cuMemAllocAsync", alloc_async(dptr, bytesize, NULL, hStream, 0));
}

FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	FK_CALL("cuMemAllocFromPoolAsync", alloc_async(dptr, bytesize, pool, hStream, 1));
}

/*
 * The block goes back once the work queued before the free has run: the
 * fake waits for its queue (a stricter schedule), then caches the block or,
 * above the release threshold, gives it back (the real driver does that at
 * the next synchronization).
 */
static CUresult free_async(CUdeviceptr dptr, CUstream hs)
{
	struct fk_stream *s;
	struct fk_pblk *b;
	struct fk_pool *p;
	CUresult r;
	int pi;

	LOCK();
	r = stream_resolve(hs, &s);
	UNLOCK();
	if (r)
		return r;
	stream_sync_all();
	LOCK();
	b = blk_at(dptr);
	if (!b) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	pi = b->pool;
	p = &pools[pi];
	p->nlive--;
	if (b->imported) {
		blk_release(b);
	} else {
		p->in_use -= b->size;
		b->cached = 1;
		pool_trim(pi, p->destroyed ? 0 : (p->threshold > p->in_use ? p->threshold : p->in_use));
	}
	pool_put(pi);
	r = chan_sync();
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	FK_CALL("cuMemFreeAsync", free_async(dptr, hStream));
}

/* Per-thread-default-stream forms (not modelled: the same as the legacy stream). */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

FK_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	FK_CALL("cuMemAllocAsync", alloc_async(dptr, bytesize, NULL, hStream, 0));
}

FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						     CUstream hStream)
{
	FK_CALL("cuMemAllocFromPoolAsync", alloc_async(dptr, bytesize, pool, hStream, 1));
}

FK_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	FK_CALL("cuMemFreeAsync", free_async(dptr, hStream));
}

/* --- sharing ---------------------------------------------------------------------------- */

static CUresult pool_export(void *handle_out, CUmemoryPool h, CUmemAllocationHandleType type, unsigned long long flags)
{
	struct pool_fd_rec rec = {.magic = POOL_FD_MAGIC};
	struct fk_pool *p;
	CUresult r = CUDA_SUCCESS;
	int fd = -1;

	if (!handle_out || flags)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	p = pool_get(h);
	if (!p || p->imported || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
	    !(p->props.handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	while (!p->token)
		if (getentropy(&p->token, sizeof(p->token)) < 0) {
			r = CUDA_ERROR_OPERATING_SYSTEM;
			goto out;
		}
	rec.pid = G.pid;
	rec.token = p->token;
	rec.phys = (uint32_t)dev_phys(p->ord);
	rec.handle_types = p->props.handleTypes;
	fd = memfd_create("fakecuda-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || pwrite(fd, &rec, sizeof(rec), 0) != (ssize_t)sizeof(rec) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	/* The application's FD does not close on exec, as the real driver's. */
	fcntl(fd, F_SETFD, 0);
	p->exported = 1;
	r = chan_sync();
	if (r)
		goto out;
	*(int *)handle_out = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
							 CUmemAllocationHandleType handleType, unsigned long long flags)
{
	FK_CALL("cuMemPoolExportToShareableHandle", pool_export(handle_out, pool, handleType, flags));
}

static CUresult pool_import(CUmemoryPool *out, void *handle, CUmemAllocationHandleType type, unsigned long long flags)
{
	struct pool_fd_rec rec;
	CUresult r = CUDA_SUCCESS;
	int fd = (int)(intptr_t)handle, ord, i;

	if (!out || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	if (pread(fd, &rec, sizeof(rec), 0) != (ssize_t)sizeof(rec) || rec.magic != POOL_FD_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	ord = dev_ord_of_phys((int)rec.phys);
	if (ord < 0)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	i = pool_new();
	if (i < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	pools[i].ord = ord;
	pools[i].imported = 1;
	pools[i].token = rec.token;
	pools[i].src_pid = rec.pid;
	pools[i].props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pools[i].props.handleTypes = (CUmemAllocationHandleType)rec.handle_types;
	pools[i].props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pools[i].props.location.id = ord;
	r = chan_sync();
	if (r) {
		memset(&pools[i], 0, sizeof(pools[i]));
		goto out;
	}
	*out = (CUmemoryPool)&pools[i];
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
							   CUmemAllocationHandleType handleType,
							   unsigned long long flags)
{
	FK_CALL("cuMemPoolImportFromShareableHandle", pool_import(pool_out, handle, handleType, flags));
}

static CUresult ptr_export(CUmemPoolPtrExportData *out, CUdeviceptr ptr)
{
	struct pool_ptr_rec rec = {.magic = POOL_PTR_MAGIC};
	struct fk_pblk *b;
	struct fk_alloc *a;
	CUresult res;

	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	b = blk_at(ptr);
	/* Measured: INVALID_VALUE until the pool itself was exported. */
	if (!b || b->imported || !pools[b->pool].exported) {
		res = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	a = &G.alloc[b->slot];
	res = ipc_token_get(a, &rec.ipc_token);
	if (res)
		goto out;
	rec.pid = G.pid;
	rec.pool_token = pools[b->pool].token;
	rec.id = a->devd_id;
	rec.size = a->size;
	rec.phys = (uint32_t)dev_phys(a->ord);
	memset(out, 0, sizeof(*out));
	memcpy(out->reserved, &rec, sizeof(rec));
out:
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
	FK_CALL("cuMemPoolExportPointer", ptr_export(shareData_out, ptr));
}

static CUresult ptr_import(CUdeviceptr *out, CUmemoryPool h, CUmemPoolPtrExportData *data)
{
	struct pool_ptr_rec rec;
	struct fk_pblk *b;
	struct fk_alloc *a;
	struct fk_pool *p;
	CUresult res;
	uint64_t va = 0;
	int slot;

	if (!out || !data)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&rec, data->reserved, sizeof(rec));
	LOCK();
	p = pool_get(h);
	if (!p || !p->imported || rec.magic != POOL_PTR_MAGIC || rec.pool_token != p->token) {
		res = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	b = blk_new();
	slot = b ? alloc_slot_new() : -1;
	if (slot < 0) {
		if (b)
			b->used = 0;
		res = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	res = ipc_attach(rec.id, rec.ipc_token, slot, &va);
	if (res) {
		b->used = 0;
		goto out;
	}
	a = &G.alloc[slot];
	b->pool = (int)(p - pools);
	b->imported = 1;
	b->va = va;
	b->size = a->size;
	b->slot = slot;
	p->nlive++;
	*out = va;
out:
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
					       CUmemPoolPtrExportData *shareData)
{
	FK_CALL("cuMemPoolImportPointer", ptr_import(ptr_out, pool, shareData));
}
