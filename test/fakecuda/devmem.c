/*
 * Device virtual memory of this process: PROT_NONE reservations (G.resv),
 * the mapping table that resolves device VAs (G.map), the physical allocation
 * slots with their bytes in the arena mappings (G.alloc) and multicast slots (G.mc).
 * All device reads and writes (memcpy, memset, kernels) go through
 * devmem_read/devmem_write here.  Everything runs under G.lock.
 *
 * Device VAs are anonymous PROT_NONE reservations: a host dereference faults
 * as it would on a GPU address, and CRIU keeps the reservations across dump
 * and restore.  The bytes live in devd's device arenas (one memfd per device,
 * an allocation is an offset range of it), each mapped once, MAP_SHARED, at a
 * hidden place of the address space (arena.c); a write through a multicast
 * mapping is applied to every bound member's bytes (bindings come from devd).
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake.h"

#define CHUNK (64u << 10)

uint64_t va_reserve(size_t size, size_t align, uint64_t hint)
{
	const int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	unsigned char *p;
	uintptr_t a;
	size_t total;

	if (align < (size_t)sysconf(_SC_PAGESIZE))
		align = (size_t)sysconf(_SC_PAGESIZE);
	if (hint && hint % align == 0) {
		p = mmap((void *)hint, size, PROT_NONE, fl | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && (uint64_t)(uintptr_t)p == hint)
			return hint;
		if (p != MAP_FAILED)
			munmap(p, size);
	}
	total = size + align;
	p = mmap(NULL, total, PROT_NONE, fl, -1, 0);
	if (p == MAP_FAILED)
		return 0;
	a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	if ((uintptr_t)p + total > a + size)
		munmap((void *)(a + size), (uintptr_t)p + total - (a + size));
	return (uint64_t)a;
}

void va_release(uint64_t va, size_t size)
{
	munmap((void *)(uintptr_t)va, size);
}

int map_lower(uint64_t va)
{
	int lo = 0, hi = G.nmap;

	while (lo < hi) {
		int mid = (lo + hi) / 2;
		const struct fk_map *m = &G.map[G.map_by_va[mid]];

		if (m->va + m->size <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct fk_map *map_find(uint64_t va)
{
	int i = map_lower(va);
	struct fk_map *m = i < G.nmap ? &G.map[G.map_by_va[i]] : NULL;

	return m && va >= m->va ? m : NULL;
}

void map_del(struct fk_map *m)
{
	int i = map_lower(m->va);

	m->used = 0;
	if (i < G.nmap && &G.map[G.map_by_va[i]] == m) {
		memmove(&G.map_by_va[i], &G.map_by_va[i + 1], sizeof(int) * (size_t)(G.nmap - i - 1));
		G.nmap--;
	}
}

int map_add(uint64_t va, size_t size, int is_mc, int slot, size_t off, uint32_t access)
{
	/* The free slot nearest the end of the index is as good as any. */
	for (int k = 0; k < FK_MAX_MAP; k++) {
		int i = (G.nmap + k) % FK_MAX_MAP;
		struct fk_map *m = &G.map[i];

		if (!m->used) {
			int at = map_lower(va);

			memmove(&G.map_by_va[at + 1], &G.map_by_va[at], sizeof(int) * (size_t)(G.nmap - at));
			G.map_by_va[at] = i;
			G.nmap++;
			m->used = 1;
			m->va = va;
			m->size = size;
			m->is_mc = is_mc;
			m->slot = slot;
			m->off = off;
			m->access = access;
			if (is_mc)
				G.mc[slot].map_refs++;
			else
				G.alloc[slot].map_refs++;
			return i;
		}
	}
	return -1;
}

int devmem_is_device(uint64_t va)
{
	if (map_find(va))
		return 1;
	for (int i = 0; i < atomic_load(&G.resv.n); i++) {
		const struct fk_resv *v = FK_AT(&G.resv, struct fk_resv, i);

		if (v->used && va >= v->va && va - v->va < v->size)
			return 1;
	}
	return 0;
}

int alloc_slot_new(void)
{
	for (int k = 0; k < FK_MAX_ALLOC; k++) {
		int i = (G.alloc_hint + k) % FK_MAX_ALLOC;
		struct fk_alloc *a = &G.alloc[i];

		if (!a->used) {
			G.alloc_hint = (i + 1) % FK_MAX_ALLOC;
			uint32_t gen = a->gen + 1;

			memset(a, 0, sizeof(*a));
			a->gen = gen & 0xffffff;
			a->used = 1;
			return i;
		}
	}
	return -1;
}

CUresult alloc_open(int slot, const struct fkw_req *q, uint32_t dev, uint64_t size, uint64_t align, uint64_t map_size,
		    struct fkw_resp *r, uint64_t *va)
{
	struct fk_alloc *a = &G.alloc[slot];
	CUresult res = conn_rpc(q, r, NULL, 0);

	*va = 0;
	if (res) {
		a->used = 0;
		return res;
	}
	if (!size) /* what devd answered (an IPC open) */
		size = r->size;
	a->devd_id = r->id;
	a->aoff = r->off;
	a->win = arena_at(dev == ~0u ? r->dev : dev, r->off, size);
	if (a->win && align)
		*va = va_reserve(size, align, 0);
	if (!a->win || (align && (!*va || map_add(*va, map_size ? map_size : size, 0, slot, 0, ~0u) < 0))) {
		if (*va)
			va_release(*va, size);
		*va = 0;
		a->win = NULL;
		conn_drop(FKW_KIND_ALLOC, r->id);
		a->used = 0;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

void alloc_slot_put(int slot)
{
	struct fk_alloc *a = &G.alloc[slot];

	if (!a->used || a->handle_refs > 0 || a->map_refs > 0 || a->ipc_open_refs > 0)
		return;
	conn_drop(FKW_KIND_ALLOC, a->devd_id);
	a->used = 0;
	a->win = NULL;
}

static void mc_unmap_bindings(struct fk_mc *m)
{
	m->nb = 0; /* the members' bytes stay in the arena mapping */
}

void mc_slot_put(int slot)
{
	struct fk_mc *m = &G.mc[slot];

	if (!m->used || m->handle_refs > 0 || m->map_refs > 0)
		return;
	mc_unmap_bindings(m);
	conn_drop(FKW_KIND_MC, m->devd_id);
	m->used = 0;
}

/* Brings the cached bindings of a multicast object up to date with devd. */
CUresult mc_refresh(struct fk_mc *m)
{
	struct fkw_req q = {.op = FKW_MC_BINDINGS};
	struct fkw_resp r;
	CUresult res;

	q.id = m->devd_id;
	q.gen = m->bgen;
	res = conn_rpc(&q, &r, NULL, 0);
	if (res)
		return res;
	if (r.gen == m->bgen)
		return CUDA_SUCCESS;
	mc_unmap_bindings(m);
	for (uint32_t i = 0; i < r.n; i++) {
		struct fk_mcb *b = &m->b[m->nb];

		b->phys = (int)r.u.b[i].dev;
		b->mcoff = r.u.b[i].mcoff;
		b->memoff = r.u.b[i].memoff;
		b->size = r.u.b[i].size;
		b->alloc_size = r.u.b[i].alloc_size;
		b->win = arena_at(r.u.b[i].adev, r.u.b[i].aoff, b->alloc_size);
		if (b->win)
			m->nb++;
	}
	m->bgen = r.gen;
	return CUDA_SUCCESS;
}

static int map_accessible(const struct fk_map *m, int ord)
{
	return ord < 0 ? m->access != 0 : (m->access >> ord) & 1;
}

/*
 * Multicast: a write reaches every bound member.  A read returns, byte by
 * byte, the first binding (in devd's order) that covers it, zeros where none
 * does: bindings of one device may tile the range in slices (bind by address
 * after an unbind), so the read walks the list backwards and lets earlier
 * bindings overwrite later ones, instead of stopping at the first overlap.
 */
static CUresult mc_rw(struct fk_mc *m, size_t off, void *buf, size_t n, int write)
{
	CUresult res = mc_refresh(m);

	if (res)
		return res;
	if (!write)
		memset(buf, 0, n);
	for (int k = 0; k < m->nb; k++) {
		struct fk_mcb *b = &m->b[write ? k : m->nb - 1 - k];
		size_t lo = off > b->mcoff ? off : b->mcoff;
		size_t hi = off + n < b->mcoff + b->size ? off + n : b->mcoff + b->size;

		if (lo >= hi)
			continue;
		if (write)
			memcpy(b->win + b->memoff + (lo - b->mcoff), (unsigned char *)buf + (lo - off), hi - lo);
		else
			memcpy((unsigned char *)buf + (lo - off), b->win + b->memoff + (lo - b->mcoff), hi - lo);
	}
	return CUDA_SUCCESS;
}

static CUresult devmem_rw(uint64_t va, void *buf, size_t n, int ord, int write)
{
	unsigned char *h = buf;

	while (n > 0) {
		struct fk_map *m = map_find(va);
		size_t chunk, off;
		CUresult res;

		if (!m)
			return CUDA_ERROR_INVALID_VALUE;
		if (!map_accessible(m, ord))
			return CUDA_ERROR_ILLEGAL_ADDRESS;
		chunk = m->va + m->size - va;
		if (chunk > n)
			chunk = n;
		off = m->off + (va - m->va);
		if (m->is_mc) {
			res = mc_rw(&G.mc[m->slot], off, h, chunk, write);
			if (res)
				return res;
		} else {
			struct fk_alloc *a = &G.alloc[m->slot];

			if (!a->win)
				return CUDA_ERROR_ILLEGAL_ADDRESS;
			if (write)
				memcpy(a->win + off, h, chunk);
			else
				memcpy(h, a->win + off, chunk);
		}
		va += chunk;
		h += chunk;
		n -= chunk;
	}
	return CUDA_SUCCESS;
}

CUresult devmem_read(void *dst, uint64_t va, size_t n, int ord)
{
	return devmem_rw(va, dst, n, ord, 0);
}

CUresult devmem_write(uint64_t va, const void *src, size_t n, int ord)
{
	return devmem_rw(va, (void *)src, n, ord, 1);
}

CUresult devmem_fill(uint64_t va, const void *pattern, size_t psize, size_t count, int ord)
{
	unsigned char buf[CHUNK];
	size_t per = CHUNK / psize, i;

	for (i = 0; i < per; i++)
		memcpy(buf + i * psize, pattern, psize);
	while (count > 0) {
		size_t k = count < per ? count : per;
		CUresult r = devmem_write(va, buf, k * psize, ord);

		if (r)
			return r;
		va += k * psize;
		count -= k;
	}
	return CUDA_SUCCESS;
}

CUresult devmem_copy(uint64_t dst, uint64_t src, size_t n, int ord)
{
	unsigned char buf[CHUNK];

	while (n > 0) {
		size_t k = n < CHUNK ? n : CHUNK;
		CUresult r = devmem_read(buf, src, k, ord);

		if (!r)
			r = devmem_write(dst, buf, k, ord);
		if (r)
			return r;
		src += k;
		dst += k;
		n -= k;
	}
	return CUDA_SUCCESS;
}

CUresult devmem_view(uint64_t va, size_t n, int ord, const unsigned char **p, int *fd, uint64_t *foff)
{
	struct fk_map *m = map_find(va);
	const struct fk_alloc *a;

	*p = NULL;
	*fd = -1;
	*foff = 0;
	if (!m)
		return CUDA_ERROR_INVALID_VALUE;
	if (!map_accessible(m, ord))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	if (m->is_mc || n > m->va + m->size - va)
		return CUDA_SUCCESS; /* read it with devmem_read */
	a = &G.alloc[m->slot];
	if (!a->win)
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	*p = a->win + m->off + (va - m->va);
	for (int i = 0; i < FKW_MAX_DEV; i++) {
		const struct fk_arena *ar = &G.arena[i];

		if (ar->base && ar->fd >= 0 && *p >= ar->base && *p + n <= ar->base + ar->mapped) {
			*fd = ar->fd;
			*foff = (uint64_t)(*p - ar->base);
			break;
		}
	}
	return CUDA_SUCCESS;
}
