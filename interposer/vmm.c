/*
 * vmm.c - tracked unicast VMM allocations: records, logical handles,
 * mappings and access, and the VMM entry points that create, name, map and
 * share them.
 *
 * Ownership (FEATURES.md): handle type 0 stays native and untracked (the
 * application gets the driver's handle); a POSIX-capable allocation is
 * tracked from creation, private (OWNER_NATIVE) until its first export or
 * import, then shared for life; FABRIC or mixed handle types are tracked
 * as unsupported, with the reason. Private tracked ones are carried like
 * shared ones unless CUINTERPOSE_PRIVATE=native (cuip_carried). Tracked allocations are named by logical
 * handles (CUIP_HTAG in the top 16 bits); each record holds exactly one
 * driver handle per process, which retain and import alias. A record lives
 * while the application holds a logical handle or a tracked mapping names
 * it; its driver handle is released when it dies.
 *
 * Locking: cuip_state_lock protects everything here. It is held across
 * short driver calls that change what it protects (map, unmap, set access)
 * so that the records always equal the driver's state, never across exports,
 * imports or peer traffic. Application threads only take it inside the gate.
 * Logical handles live in qtable.c, which tracked queries read without it.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuip.h"
#include "qtable.h"

pthread_mutex_t cuip_state_lock = PTHREAD_MUTEX_INITIALIZER;
struct cuip_vmm vmm;

#define NBUCKET 65536 /* tens of thousands of records in large jobs: short chains */
static struct cuip_alloc *by_id[NBUCKET];

/* Live raw (non-ticket) imports: the driver handles the application holds. */
struct raw_import {
	CUmemGenericAllocationHandle h;
	struct raw_import *next;
};
static struct raw_import *raw_tab[256];

static unsigned hash64(uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return (unsigned)(v & (NBUCKET - 1));
}

#define lock()	 pthread_mutex_lock(&cuip_state_lock)
#define unlock() pthread_mutex_unlock(&cuip_state_lock)

/* ---- records ------------------------------------------------------------- */

struct cuip_alloc *cuip_alloc_by_id(uint64_t creator, uint64_t serial)
{
	for (struct cuip_alloc *a = by_id[hash64(creator ^ serial)]; a; a = a->id_next)
		if (a->creator == creator && a->serial == serial)
			return a;
	return NULL;
}

static struct cuip_alloc *by_logical(uint64_t h)
{
	return cuip_is_logical(h) ? cuip_qt_record(h) : NULL;
}

static struct cuip_alloc *alloc_new(uint64_t creator, uint64_t serial)
{
	struct cuip_alloc *a;
	unsigned b = hash64(creator ^ serial);

	if (cuip_qt_reserve(vmm.nallocs + 1)) /* a logical handle never fails */
		return NULL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->creator = creator;
	a->serial = serial;
	a->id_next = by_id[b];
	by_id[b] = a;
	a->prev = vmm.tail;
	if (vmm.tail)
		vmm.tail->next = a;
	else
		vmm.head = a;
	vmm.tail = a;
	vmm.nallocs++;
	return a;
}

void cuip_logical_assign(struct cuip_alloc *a)
{
	const uint64_t mask = (1ull << CUIP_HTAG_SHIFT) - 1;
	uint64_t h;

	if (a->logical)
		return;
	do /* skips values whose slot is taken, live ones after a wrap too */
		h = (CUIP_HTAG << CUIP_HTAG_SHIFT) | (++vmm.next_logical & mask);
	while (cuip_qt_taken(h) || !(h & mask));
	cuip_qt_insert(h, a, a->drv);
	a->logical = h;
}

static void logical_drop(struct cuip_alloc *a)
{
	if (!a->logical)
		return;
	cuip_qt_remove(a->logical);
	a->logical = 0;
}

/* Unlink a record from every table; the caller frees it after unlocking. */
static void alloc_unlink(struct cuip_alloc *a)
{
	struct cuip_alloc **pp;

	logical_drop(a);
	for (pp = &by_id[hash64(a->creator ^ a->serial)]; *pp; pp = &(*pp)->id_next) {
		if (*pp == a) {
			*pp = a->id_next;
			break;
		}
	}
	if (a->prev)
		a->prev->next = a->next;
	else
		vmm.head = a->next;
	if (a->next)
		a->next->prev = a->prev;
	else
		vmm.tail = a->prev;
	vmm.nallocs--;
	if (a->owner == CUIP__OWNER__OWNER_UNSUPPORTED)
		vmm.unsupported--;
}

bool cuip_carried(const struct cuip_alloc *a)
{
	if (a->mc)
		return false;
	if (a->owner == CUIP__OWNER__OWNER_SHARED)
		return true;
	return a->owner == CUIP__OWNER__OWNER_NATIVE && !cuip_private_native && a->creator == self.id &&
	       (a->origin == CUIP__ORIGIN__ORIGIN_VMM_CREATE || a->origin == CUIP__ORIGIN__ORIGIN_MALLOC);
}

static bool alloc_dead(const struct cuip_alloc *a)
{
	return a->app_handles == 0 && a->nmaps == 0 && a->mc_binds == 0;
}

/* After unlocking: release what a dead record held. */
static void alloc_destroy(struct cuip_alloc *a)
{
	if (a->creator == self.id && a->has_token)
		cuip_xc_drop(a->serial);
	if (a->drv) {
		CUresult r = real.cuMemRelease(a->drv);
		if (r != CUDA_SUCCESS)
			pr_err("releasing the driver handle of allocation %016llx:%llu: %s",
			       (unsigned long long)a->creator, (unsigned long long)a->serial, cuip_cuerr(r));
	}
	if (a->mc)
		cuip_mc_forget(a);
	free(a->pieces);
	free(a);
}

/* ---- mappings ------------------------------------------------------------ */

/* First mapping whose end is above va. */
static size_t map_lower(uint64_t va)
{
	size_t lo = 0, hi = vmm.nmaps;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		struct cuip_mapping *m = vmm.maps[mid];
		if (m->va + m->size <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct cuip_mapping *cuip_mapping_at(uint64_t va)
{
	size_t i = map_lower(va);

	if (i < vmm.nmaps && vmm.maps[i]->va <= va)
		return vmm.maps[i];
	return NULL;
}

static bool map_overlaps(uint64_t va, uint64_t size)
{
	size_t i = map_lower(va);

	return i < vmm.nmaps && vmm.maps[i]->va < va + size;
}

int cuip_map_insert(struct cuip_mapping *m)
{
	size_t i;

	if (vmm.nmaps == vmm.capmaps) {
		size_t cap = vmm.capmaps ? vmm.capmaps * 2 : 64;
		struct cuip_mapping **n = realloc(vmm.maps, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		vmm.maps = n;
		vmm.capmaps = cap;
	}
	i = map_lower(m->va);
	memmove(&vmm.maps[i + 1], &vmm.maps[i], (vmm.nmaps - i) * sizeof(*vmm.maps));
	vmm.maps[i] = m;
	vmm.nmaps++;
	return 0;
}

static void map_remove_at(size_t i)
{
	memmove(&vmm.maps[i], &vmm.maps[i + 1], (vmm.nmaps - i - 1) * sizeof(*vmm.maps));
	vmm.nmaps--;
}

static void map_free(struct cuip_mapping *m)
{
	if (m) {
		free(m->acc);
		free(m);
	}
}

static int loc_cmp(const CUmemLocation *a, const CUmemLocation *b)
{
	if (a->type != b->type)
		return a->type < b->type ? -1 : 1;
	if (a->id != b->id)
		return a->id < b->id ? -1 : 1;
	return 0;
}

static int acc_cmp(const void *x, const void *y)
{
	const struct cuip_access *a = x, *b = y;
	int c = loc_cmp(&a->loc, &b->loc);

	if (c)
		return c;
	return a->va < b->va ? -1 : a->va > b->va;
}

static int acc_push(struct cuip_access **v, size_t *n, size_t *cap, const struct cuip_access *e)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 4;
		struct cuip_access *p = realloc(*v, c * sizeof(*p));
		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[(*n)++] = *e;
	return 0;
}

/*
 * Record that [va, va+size) of m now has `flags` for `loc`: intervals of the
 * same location are cut around the range, the new one is added (PROT_NONE
 * is the absence of an interval), and neighbours with equal flags merge.
 */
int cuip_access_set(struct cuip_mapping *m, uint64_t va, uint64_t size, const CUmemLocation *loc, unsigned flags)
{
	struct cuip_access *nv = NULL, e;
	size_t nn = 0, nc = 0, out = 0;
	uint64_t end = va + size;

	for (size_t i = 0; i < m->nacc; i++) {
		struct cuip_access *o = &m->acc[i];
		uint64_t oend = o->va + o->size;
		if (loc_cmp(&o->loc, loc) || oend <= va || o->va >= end) {
			if (acc_push(&nv, &nn, &nc, o))
				goto nomem;
			continue;
		}
		if (o->va < va) {
			e = *o;
			e.size = va - o->va;
			if (acc_push(&nv, &nn, &nc, &e))
				goto nomem;
		}
		if (oend > end) {
			e = *o;
			e.va = end;
			e.size = oend - end;
			if (acc_push(&nv, &nn, &nc, &e))
				goto nomem;
		}
	}
	if (flags) {
		e = (struct cuip_access){.va = va, .size = size, .loc = *loc, .flags = flags};
		if (acc_push(&nv, &nn, &nc, &e))
			goto nomem;
	}
	if (nn)
		qsort(nv, nn, sizeof(*nv), acc_cmp);
	for (size_t i = 0; i < nn; i++) {
		if (out && !loc_cmp(&nv[out - 1].loc, &nv[i].loc) && nv[out - 1].flags == nv[i].flags &&
		    nv[out - 1].va + nv[out - 1].size == nv[i].va) {
			nv[out - 1].size += nv[i].size;
			continue;
		}
		nv[out++] = nv[i];
	}
	free(m->acc);
	m->acc = nv;
	m->nacc = out;
	m->capacc = nc;
	return 0;
nomem:
	free(nv);
	return -ENOMEM;
}

/* A new mapping covering [lo, hi) of m, with m's access clipped to it. */
static struct cuip_mapping *map_part(const struct cuip_mapping *m, uint64_t lo, uint64_t hi)
{
	struct cuip_mapping *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->va = lo;
	p->size = hi - lo;
	p->offset = m->offset + (lo - m->va);
	p->a = m->a;
	p->map_flags = m->map_flags;
	for (size_t i = 0; i < m->nacc; i++) {
		struct cuip_access e = m->acc[i];
		uint64_t s = e.va > lo ? e.va : lo, t = e.va + e.size < hi ? e.va + e.size : hi;
		if (s >= t)
			continue;
		e.va = s;
		e.size = t - s;
		if (acc_push(&p->acc, &p->nacc, &p->capacc, &e)) {
			map_free(p);
			return NULL;
		}
	}
	return p;
}

/* ---- raw imports --------------------------------------------------------- */

static void raw_add(CUmemGenericAllocationHandle h)
{
	struct raw_import *r = malloc(sizeof(*r));

	if (!r)
		return;
	r->h = h;
	r->next = raw_tab[h & 255];
	raw_tab[h & 255] = r;
	vmm.raw_imports++;
}

static void raw_forget(CUmemGenericAllocationHandle h)
{
	for (struct raw_import **pp = &raw_tab[h & 255]; *pp; pp = &(*pp)->next) {
		if ((*pp)->h == h) {
			struct raw_import *r = *pp;
			*pp = r->next;
			free(r);
			vmm.raw_imports--;
			return;
		}
	}
}

/* ---- helpers for the wrappers -------------------------------------------- */

static CUresult enter(void *fn)
{
	if (cuip_driver_init() || !fn)
		return CUDA_ERROR_NOT_FOUND;
	return cuip_gate_enter();
}

/* A raw handle from the driver that falls in our tag space cannot be told
 * apart from a logical one: refuse it rather than confuse the two. */
static CUresult refuse_collision(CUmemGenericAllocationHandle h)
{
	pr_err("driver handle %#llx collides with cuinterpose's logical handle space; refusing it",
	       (unsigned long long)h);
	real.cuMemRelease(h);
	return CUDA_ERROR_UNKNOWN;
}

static const char *unsupported_reason(unsigned types)
{
	if (types & CU_MEM_HANDLE_TYPE_FABRIC)
		return types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
			       ? "handle types POSIX_FILE_DESCRIPTOR|FABRIC: fabric handles cannot be carried"
			       : "handle type FABRIC: fabric handles cannot be carried";
	return "handle types other than POSIX_FILE_DESCRIPTOR cannot be carried";
}

/* ---- entry points ------------------------------------------------------- */

CUIP_API CUresult CUDAAPI cuInit(unsigned int flags)
{
	CUresult r;
	bool first;

	if (cuip_driver_init() || !real.cuInit)
		return CUDA_ERROR_NO_DEVICE;
	first = cuip_start_begin(); /* may wait for a checkpoint in progress */
	r = real.cuInit(flags);
	if (first)
		cuip_start_end(r == CUDA_SUCCESS);
	return r;
}

CUIP_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				      const CUmemAllocationProp *prop, unsigned long long flags)
{
	CUmemGenericAllocationHandle h;
	struct cuip_alloc *a;
	unsigned types;
	CUresult r = enter(real.cuMemCreate);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemCreate(handle, size, prop, flags);
	if (r != CUDA_SUCCESS)
		goto out;
	h = *handle;
	if (cuip_is_logical(h)) {
		r = refuse_collision(h);
		goto out;
	}
	types = prop->requestedHandleTypes;
	if (types == CU_MEM_HANDLE_TYPE_NONE)
		goto out; /* private: native checkpoint owns it, untouched */
	cuip_start();
	lock();
	a = alloc_new(self.id, ++vmm.next_serial);
	if (!a) {
		unlock();
		real.cuMemRelease(h);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	a->prop = *prop;
	a->prop.win32HandleMetaData = NULL;
	a->size = size;
	a->drv = h;
	a->origin = CUIP__ORIGIN__ORIGIN_VMM_CREATE;
	if (types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		a->owner = CUIP__OWNER__OWNER_NATIVE;
	} else {
		a->owner = CUIP__OWNER__OWNER_UNSUPPORTED;
		a->unsupported = unsupported_reason(types);
		vmm.unsupported++;
	}
	memcpy(a->creator_sock, self.sock, sizeof(a->creator_sock));
	a->creator_pid = self.pid;
	a->app_handles = 1;
	cuip_logical_assign(a);
	*handle = a->logical;
	unlock();
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct cuip_alloc *a;
	bool dead = false;
	CUresult r = enter(real.cuMemRelease);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(handle)) {
		r = real.cuMemRelease(handle);
		if (r == CUDA_SUCCESS) {
			lock();
			raw_forget(handle);
			unlock();
		}
		goto out;
	}
	lock();
	a = by_logical(handle);
	if (!a) {
		unlock();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (--a->app_handles == 0)
		logical_drop(a);
	if (alloc_dead(a)) {
		alloc_unlink(a);
		dead = true;
	}
	unlock();
	if (dead)
		alloc_destroy(a);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct cuip_mapping *m;
	CUresult r = enter(real.cuMemRetainAllocationHandle);

	if (r != CUDA_SUCCESS)
		return r;
	lock();
	m = cuip_mapping_at((uint64_t)(uintptr_t)addr);
	if (m) {
		if (!handle) {
			r = CUDA_ERROR_INVALID_VALUE;
		} else {
			cuip_logical_assign(m->a);
			m->a->app_handles++;
			*handle = m->a->logical;
		}
		unlock();
		goto out;
	}
	unlock();
	r = real.cuMemRetainAllocationHandle(handle, addr);
	if (r == CUDA_SUCCESS && cuip_is_logical(*handle))
		r = refuse_collision(*handle);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
								 CUmemGenericAllocationHandle handle)
{
	CUmemGenericAllocationHandle drv;
	CUresult r = enter(real.cuMemGetAllocationPropertiesFromHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(handle)) {
		r = real.cuMemGetAllocationPropertiesFromHandle(prop, handle);
		goto out;
	}
	/* No lock (qtable.c). A release racing this query may release the
	 * driver handle while the driver reads it, as with two application
	 * threads on the plain driver. */
	drv = cuip_qt_drv(handle);
	r = drv ? real.cuMemGetAllocationPropertiesFromHandle(prop, drv) : CUDA_ERROR_INVALID_VALUE;
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
				   unsigned long long flags)
{
	struct cuip_mapping *m;
	struct cuip_alloc *a;
	CUresult r = enter(real.cuMemMap);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(handle)) {
		r = real.cuMemMap(ptr, size, offset, handle, flags);
		goto out;
	}
	lock();
	a = by_logical(handle);
	if (!a || !size || map_overlaps(ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto unlock;
	}
	r = real.cuMemMap(ptr, size, offset, a->drv, flags);
	if (r != CUDA_SUCCESS)
		goto unlock;
	m = calloc(1, sizeof(*m));
	if (m) {
		m->va = ptr;
		m->size = size;
		m->offset = offset;
		m->a = a;
		m->map_flags = flags;
	}
	if (!m || cuip_map_insert(m)) {
		free(m);
		real.cuMemUnmap(ptr, size);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unlock;
	}
	a->nmaps++;
	if (a->mc)
		cuip_mc_note_extent(a, offset + size);
unlock:
	unlock();
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct cuip_alloc *dead[16];
	size_t ndead = 0, i;
	uint64_t lo = ptr, hi = ptr + size;
	CUresult r = enter(real.cuMemUnmap);

	if (r != CUDA_SUCCESS)
		return r;
again:
	lock();
	if (ndead == 0) {
		r = real.cuMemUnmap(ptr, size);
		if (r != CUDA_SUCCESS) {
			unlock();
			goto out;
		}
	}
	ndead = 0;
	i = map_lower(lo);
	while (i < vmm.nmaps && vmm.maps[i]->va < hi) {
		struct cuip_mapping *m = vmm.maps[i], *left = NULL, *right = NULL;
		struct cuip_alloc *a = m->a;
		if (m->va < lo)
			left = map_part(m, m->va, lo);
		if (m->va + m->size > hi)
			right = map_part(m, hi, m->va + m->size);
		map_remove_at(i);
		a->nmaps--;
		if (left && !cuip_map_insert(left)) {
			a->nmaps++;
			i++;
		} else {
			map_free(left);
		}
		if (right && !cuip_map_insert(right)) {
			a->nmaps++;
			i++;
		} else {
			map_free(right);
		}
		map_free(m);
		if (alloc_dead(a)) {
			alloc_unlink(a);
			dead[ndead++] = a;
			if (ndead == sizeof(dead) / sizeof(dead[0]))
				break;
		}
	}
	unlock();
	for (size_t k = 0; k < ndead; k++)
		alloc_destroy(dead[k]);
	if (ndead == sizeof(dead) / sizeof(dead[0]))
		goto again; /* more records died than fit: drain the rest */
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	uint64_t lo = ptr, hi = ptr + size;
	CUresult r = enter(real.cuMemSetAccess);

	if (r != CUDA_SUCCESS)
		return r;
	lock();
	r = real.cuMemSetAccess(ptr, size, desc, count);
	if (r == CUDA_SUCCESS) {
		for (size_t i = map_lower(lo); i < vmm.nmaps && vmm.maps[i]->va < hi; i++) {
			struct cuip_mapping *m = vmm.maps[i];
			uint64_t s = m->va > lo ? m->va : lo;
			uint64_t t = m->va + m->size < hi ? m->va + m->size : hi;
			for (size_t d = 0; d < count; d++)
				if (cuip_access_set(m, s, t - s, &desc[d].location, desc[d].flags))
					pr_err("out of memory recording access of mapping %#llx",
					       (unsigned long long)m->va);
		}
	}
	unlock();
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						       CUmemAllocationHandleType handleType, unsigned long long flags)
{
	struct cuip_alloc *a, snap;
	bool creator;
	int fd;
	CUresult r = enter(real.cuMemExportToShareableHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(handle)) {
		r = real.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
		goto out;
	}
	lock();
	a = by_logical(handle);
	if (!a || !shareableHandle) {
		unlock();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || a->owner == CUIP__OWNER__OWNER_UNSUPPORTED) {
		/* Not something we carry: the driver's own export, under the
		 * lock so the record cannot die meanwhile. */
		r = real.cuMemExportToShareableHandle(shareableHandle, a->drv, handleType, flags);
		unlock();
		goto out;
	}
	if (!(a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		unlock();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (!a->has_token) {
		cuip_random(a->token, sizeof(a->token));
		a->has_token = true;
	}
	snap = *a;
	creator = a->creator == self.id;
	unlock();

	if (creator && cuip_xc_export(snap.serial, snap.drv, snap.token, &r))
		goto out;
	fd = cuip_ticket_mint(&snap, creator ? cuip_xc_fd_cloexec(snap.serial) == 1 : false);
	if (fd < 0) {
		pr_err("cannot mint a ticket for allocation %016llx:%llu: %s", (unsigned long long)snap.creator,
		       (unsigned long long)snap.serial, strerror(-fd));
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	lock();
	a = cuip_alloc_by_id(snap.creator, snap.serial);
	if (!a) {
		/* Released by another thread meanwhile. */
		unlock();
		close(fd);
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (a->owner == CUIP__OWNER__OWNER_NATIVE)
		a->owner = CUIP__OWNER__OWNER_SHARED;
	a->minted++;
	unlock();
	*(int *)shareableHandle = fd;
out:
	cuip_gate_exit();
	return r;
}

/* Alias an existing record for an import; caller holds the lock. */
static void import_alias(struct cuip_alloc *a, CUmemGenericAllocationHandle *handle)
{
	cuip_logical_assign(a);
	a->app_handles++;
	if (a->owner == CUIP__OWNER__OWNER_NATIVE)
		a->owner = CUIP__OWNER__OWNER_SHARED;
	*handle = a->logical;
}

static CUresult import_ticket(CUmemGenericAllocationHandle *handle, const Cuip__Ticket *t)
{
	uint64_t creator = t->creator->id, serial = t->alloc->serial;
	CUmemGenericAllocationHandle h;
	struct cuip_alloc *a;
	char err[256] = "";
	CUresult r;
	int fd;

	lock();
	a = cuip_alloc_by_id(creator, serial);
	if (a && a->drv) {
		import_alias(a, handle);
		unlock();
		return CUDA_SUCCESS;
	}
	unlock();
	if (creator == self.id) {
		pr_err("ticket names allocation %016llx:%llu of this process, which was released",
		       (unsigned long long)creator, (unsigned long long)serial);
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (!t->creator_socket) {
		pr_err("ticket for allocation %016llx:%llu names no creator socket", (unsigned long long)creator,
		       (unsigned long long)serial);
		return CUDA_ERROR_INVALID_VALUE;
	}
	fd = cuip_fetch(t->creator_socket, creator, serial, t->token.data, t->token.len, err, sizeof(err));
	if (fd < 0) {
		pr_err("import of allocation %016llx:%llu from pid %d: %s", (unsigned long long)creator,
		       (unsigned long long)serial, t->creator->pid, err);
		return fd == -EMFILE || fd == -ENFILE ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_INVALID_VALUE;
	}
	r = real.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	if (r != CUDA_SUCCESS)
		return r;
	if (cuip_is_logical(h))
		return refuse_collision(h);
	lock();
	a = cuip_alloc_by_id(creator, serial);
	if (a && a->drv) {
		/* Another thread imported it meanwhile: one driver handle per process. */
		import_alias(a, handle);
		unlock();
		real.cuMemRelease(h);
		return CUDA_SUCCESS;
	}
	if (!a)
		a = alloc_new(creator, serial);
	if (!a) {
		unlock();
		real.cuMemRelease(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->drv = h;
	a->origin = CUIP__ORIGIN__ORIGIN_VMM_IMPORT;
	a->owner = CUIP__OWNER__OWNER_SHARED;
	if (t->kind == CUIP__ALLOC_KIND__KIND_MULTICAST) {
		a->origin = CUIP__ORIGIN__ORIGIN_MC_IMPORT;
		a->mc = cuip_mc_from_props(t->mc);
		a->prop.requestedHandleTypes = (CUmemAllocationHandleType)t->mc->handle_types;
		a->size = t->mc->requested_size;
	} else if (real.cuMemGetAllocationPropertiesFromHandle(&a->prop, h) != CUDA_SUCCESS && t->props) {
		a->prop.type = t->props->type;
		a->prop.requestedHandleTypes = t->props->handle_types;
		a->prop.location.type = t->props->location_type;
		a->prop.location.id = t->props->location_id;
	}
	a->prop.win32HandleMetaData = NULL;
	if (!a->mc)
		a->size = t->props ? t->props->size : 0;
	memcpy(a->token, t->token.data, sizeof(a->token));
	a->has_token = true;
	a->creator_pid = t->creator->pid;
	snprintf(a->creator_sock, sizeof(a->creator_sock), "%s", t->creator_socket);
	import_alias(a, handle);
	unlock();
	return CUDA_SUCCESS;
}

CUIP_API CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
							 CUmemAllocationHandleType shHandleType)
{
	CUmemGenericAllocationHandle h;
	Cuip__Ticket *t = NULL;
	int ret;
	CUresult r = enter(real.cuMemImportFromShareableHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		ret = cuip_ticket_read((int)(uintptr_t)osHandle, &t);
		if (ret < 0) {
			pr_err("import refused: descriptor %d is a malformed cuinterpose ticket",
			       (int)(uintptr_t)osHandle);
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		if (ret > 0) {
			cuip_start();
			r = handle ? import_ticket(handle, t) : CUDA_ERROR_INVALID_VALUE;
			cuip__ticket__free_unpacked(t, NULL);
			goto out;
		}
	}
	r = real.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
	if (r != CUDA_SUCCESS)
		goto out;
	h = *handle;
	if (cuip_is_logical(h)) {
		r = refuse_collision(h);
		goto out;
	}
	/* Raw import: passed through, but counted until released (preflight
	 * refuses a checkpoint while one is live). */
	lock();
	raw_add(h);
	unlock();
out:
	cuip_gate_exit();
	return r;
}

/* ---- for multicast.c ------------------------------------------------------ */

struct cuip_alloc *cuip_alloc_new(uint64_t creator, uint64_t serial)
{
	return alloc_new(creator, serial);
}

struct cuip_alloc *cuip_by_logical(uint64_t h)
{
	return by_logical(h);
}

bool cuip_alloc_unbound(struct cuip_alloc *a)
{
	assert(a->mc_binds > 0);
	a->mc_binds--;
	if (!alloc_dead(a))
		return false;
	alloc_unlink(a);
	return true;
}

void cuip_alloc_destroy(struct cuip_alloc *a)
{
	alloc_destroy(a);
}

/* ---- fork ---------------------------------------------------------------- */

void cuip_vmm_reset(void)
{
	struct cuip_alloc *a = vmm.head, *n;

	for (size_t i = 0; i < vmm.nmaps; i++)
		map_free(vmm.maps[i]);
	free(vmm.maps);
	for (; a; a = n) {
		n = a->next;
		cuip_mc_free(a->mc);
		free(a->pieces);
		free(a);
	}
	for (int i = 0; i < 256; i++) {
		struct raw_import *r = raw_tab[i], *rn;
		for (; r; r = rn) {
			rn = r->next;
			free(r);
		}
		raw_tab[i] = NULL;
	}
	memset(by_id, 0, sizeof(by_id));
	cuip_qt_reset();
	memset(&vmm, 0, sizeof(vmm));
	pthread_mutex_init(&cuip_state_lock, NULL);
}

/* ---- for ipc.c ----------------------------------------------------------- */

struct cuip_alloc *cuip_alloc_create(uint64_t creator, uint64_t serial)
{
	return alloc_new(creator, serial);
}

struct cuip_mapping *cuip_map_take(uint64_t va)
{
	size_t i = map_lower(va);
	struct cuip_mapping *m;

	if (i >= vmm.nmaps || vmm.maps[i]->va != va)
		return NULL;
	m = vmm.maps[i];
	map_remove_at(i);
	m->a->nmaps--;
	return m;
}

void cuip_map_free(struct cuip_mapping *m)
{
	map_free(m);
}

bool cuip_alloc_unlink_if_dead(struct cuip_alloc *a)
{
	if (!alloc_dead(a))
		return false;
	alloc_unlink(a);
	return true;
}

void cuip_alloc_release(struct cuip_alloc *a)
{
	alloc_destroy(a);
}
