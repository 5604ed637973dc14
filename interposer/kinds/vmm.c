/*
 * vmm.c - unicast VMM memory: the entry points (cuInit, and the calls that
 * create, name, map, share and release tracked allocations, cuMemCreate ...
 * cuMemImportFromShareableHandle, plus the count of raw imports) and its
 * checkpoint slice (PREPARE_UNICAST, REBUILD stages CREATORS and
 * IMPORTERS), as multicast.c has both for multicast objects. The records
 * they keep are record.c's; the carrier's SAVE and LOAD of the bytes are
 * carry.c's.
 *
 * Ownership (docs/architecture.md, "Which memory goes which way"): handle
 * type 0 stays native and untracked (the application gets the driver's
 * handle); a POSIX-capable allocation is
 * tracked from creation, private (OWNER_NATIVE) until its first export or
 * import, then shared for life; FABRIC or mixed handle types are tracked
 * as unsupported, with the reason. Private tracked ones are carried like
 * shared ones unless CUINTERPOSE_PRIVATE=native (cuip_carried). Tracked
 * allocations are named by logical handles (CUIP_HTAG in the top 16 bits);
 * each record holds exactly one driver handle per process, which retain and
 * import alias. A record lives while the application holds a logical handle
 * or a tracked mapping names it; its driver handle is released when it dies.
 *
 * Callers: the application, through every resolution path (resolve.c); the
 * op thread runs the slice (ops.c). Locking: cuip_state_lock (record.c)
 * protects the records and the raw imports. It is held across short driver
 * calls that change what it protects (map, unmap, set access) so that the
 * records always equal the driver's state, never across exports, imports
 * or peer traffic. Application threads only take it inside the gate; the op
 * thread holds it for a whole operation.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "gate.h"
#include "multicast.h"
#include "qtable.h"
#include "record.h"
#include "runtime.h"
#include "slice.h"
#include "ticket.h"
#include "xcache.h"
#include "client.h"

#define lock()	 cuip_state_take()
#define unlock() cuip_state_drop()

/* Live raw (non-ticket) imports: the driver handles the application holds. */
struct raw_import {
	CUmemGenericAllocationHandle h;
	struct raw_import *next;
};
static struct raw_import *raw_tab[256];
static uint32_t raw_imports; /* live raw (non-ticket) imports, in raw_tab */

/* ---- raw imports --------------------------------------------------------- */

/* Count h in r, a node the import took before it called the driver (so
 * that counting cannot fail once the driver has imported). */
static void raw_add(struct raw_import *r, CUmemGenericAllocationHandle h)
{
	r->h = h;
	r->next = raw_tab[h & 255];
	raw_tab[h & 255] = r;
	raw_imports++;
}

static void raw_forget(CUmemGenericAllocationHandle h)
{
	for (struct raw_import **pp = &raw_tab[h & 255]; *pp; pp = &(*pp)->next) {
		if ((*pp)->h == h) {
			struct raw_import *r = *pp;
			*pp = r->next;
			free(r);
			raw_imports--;
			return;
		}
	}
}

/* ---- helpers for the wrappers -------------------------------------------- */

static inline __attribute__((always_inline)) CUresult enter(void *fn)
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

	if (cuip_settings_refused())
		return CUDA_ERROR_INVALID_VALUE; /* the variable and its range are on stderr */
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
	a = cuip_alloc_new(0, 0);
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
	a = cuip_by_logical(handle);
	if (!a) {
		unlock();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (--a->app_handles == 0)
		cuip_logical_drop(a);
	if (cuip_alloc_dead(a)) {
		cuip_alloc_unlink(a);
		dead = true;
	}
	unlock();
	if (dead)
		cuip_alloc_destroy(a);
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
	uint64_t drv = 0;
	int k;
	CUresult r = enter(real.cuMemGetAllocationPropertiesFromHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(handle)) {
		r = real.cuMemGetAllocationPropertiesFromHandle(prop, handle);
		goto out;
	}
	/* No lock (qtable.c): the driver's own answer recorded with the
	 * driver handle, or the driver asked (prop NULL: its error; no answer
	 * recorded). A release racing this query may release the driver handle
	 * while the driver reads it, as with two application threads on the
	 * plain driver. */
	if (prop && (k = cuip_qt_props(handle, prop, &drv)) != 0) {
		r = k > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (!prop)
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
	a = cuip_by_logical(handle);
	if (!a || !size || cuip_map_overlaps(ptr, size)) {
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
	i = cuip_map_lower(lo);
	while (i < vmm.nmaps && vmm.maps[i]->va < hi) {
		struct cuip_mapping *m = vmm.maps[i], *left = NULL, *right = NULL;
		struct cuip_alloc *a = m->a;
		if (m->va < lo)
			left = cuip_map_part(m, m->va, lo);
		if (m->va + m->size > hi)
			right = cuip_map_part(m, hi, m->va + m->size);
		cuip_map_remove_at(i);
		a->nmaps--;
		if (left && !cuip_map_insert(left)) {
			a->nmaps++;
			i++;
		} else {
			cuip_map_free(left);
		}
		if (right && !cuip_map_insert(right)) {
			a->nmaps++;
			i++;
		} else {
			cuip_map_free(right);
		}
		cuip_map_free(m);
		if (cuip_alloc_dead(a)) {
			cuip_alloc_unlink(a);
			dead[ndead++] = a;
			if (ndead == sizeof(dead) / sizeof(dead[0]))
				break;
		}
	}
	unlock();
	for (size_t k = 0; k < ndead; k++)
		cuip_alloc_destroy(dead[k]);
	if (ndead == sizeof(dead) / sizeof(dead[0]))
		goto again; /* more records died than fit: drain the rest */
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	uint64_t lo = ptr, hi = ptr + size;
	struct cuip_mapping *staged = NULL;
	size_t first, n = 0;
	CUresult r = enter(real.cuMemSetAccess);

	if (r != CUDA_SUCCESS)
		return r;
	lock();
	/* The mappings' new access is built before the driver is asked:
	 * running out of memory then changes neither, and what the driver
	 * grants is always recorded (a rebuild sets what is recorded). */
	first = cuip_map_lower(lo);
	while (first + n < vmm.nmaps && vmm.maps[first + n]->va < hi)
		n++;
	if (n && !(staged = calloc(n, sizeof(*staged)))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unlock;
	}
	for (size_t i = 0; i < n; i++) {
		struct cuip_mapping *m = vmm.maps[first + i];
		uint64_t s = m->va > lo ? m->va : lo;
		uint64_t t = m->va + m->size < hi ? m->va + m->size : hi;

		if (cuip_access_copy(&staged[i], m)) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto drop;
		}
		for (size_t d = 0; d < count; d++) {
			if (cuip_access_set(&staged[i], s, t - s, &desc[d].location, desc[d].flags)) {
				r = CUDA_ERROR_OUT_OF_MEMORY;
				goto drop;
			}
		}
	}
	r = real.cuMemSetAccess(ptr, size, desc, count);
	if (r == CUDA_SUCCESS)
		for (size_t i = 0; i < n; i++)
			cuip_access_swap(vmm.maps[first + i], &staged[i]);
drop:
	for (size_t i = 0; i < n; i++)
		free(staged[i].acc);
	free(staged);
unlock:
	unlock();
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						       CUmemAllocationHandleType handleType, unsigned long long flags)
{
	struct cuip_alloc *a, snap;
	Cuip__McProps mc = CUIP__MC_PROPS__INIT;
	Cuip__AllocKind kind;
	bool has_mc;
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
	a = cuip_by_logical(handle);
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
	has_mc = cuip_alloc_props(a, &kind, &mc);
	creator = a->creator == self.id;
	unlock();

	if (creator && cuip_xc_export(snap.serial, snap.drv, snap.token, &r))
		goto out;
	fd = cuip_ticket_mint(&snap, kind, has_mc ? &mc : NULL, creator ? cuip_xc_fd_cloexec(snap.serial) == 1 : false);
	if (fd < 0) {
		pr_err("cannot mint a ticket for allocation %016llx:%llu: %s", (unsigned long long)snap.creator,
		       (unsigned long long)snap.serial, strerror(-fd));
		r = fd == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
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
	cuip_state_assert_held();
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
		if (fd == -ENOMEM)
			return CUDA_ERROR_OUT_OF_MEMORY;
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
		a = cuip_alloc_new(creator, serial);
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
	struct raw_import *node;
	Cuip__Ticket *t = NULL;
	int ret;
	CUresult r = enter(real.cuMemImportFromShareableHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		ret = cuip_ticket_read((int)(uintptr_t)osHandle, &t);
		if (ret == -ENOMEM) { /* the ticket is fine: this process ran out */
			pr_err("import of descriptor %d refused: out of memory reading its ticket",
			       (int)(uintptr_t)osHandle);
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
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
	/* Raw import: passed through, but counted until released (preflight
	 * refuses a checkpoint while one is live). The count's node is taken
	 * first: an import that could not be counted would let a dump through
	 * with memory it cannot carry, so out of memory refuses the import
	 * before the driver makes it (nothing to undo). */
	node = malloc(sizeof(*node));
	if (!node) {
		pr_err("import of a raw (non-ticket) handle refused: out of memory counting it");
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	r = real.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
	if (r != CUDA_SUCCESS) {
		free(node);
		goto out;
	}
	h = *handle;
	if (cuip_is_logical(h)) {
		free(node);
		r = refuse_collision(h);
		goto out;
	}
	lock();
	raw_add(node, h);
	unlock();
out:
	cuip_gate_exit();
	return r;
}

/* ---- the unicast checkpoint slice (op thread, cuip_state_lock held) ------- */

static bool is_shared(const struct cuip_alloc *a)
{
	return a->owner == CUIP__OWNER__OWNER_SHARED;
}

/* PREPARE_UNICAST: detach the carried memory (cuip_carried). */
static bool carried(const struct cuip_alloc *a, const void *arg)
{
	(void)arg;
	return cuip_carried(a);
}

static int uc_prepare(char *err, size_t errlen)
{
	int ret;

	cuip_state_assert_held();
	/* Mappings first (nothing released yet: a failure there leaves the
	 * process QUIESCED with everything attached, and a rollback only has
	 * to reopen the gate), then cached exports, then the driver handles. */
	ret = cuip_maps_detach(carried, NULL, "allocation", err, errlen);
	if (ret == -ENOTRECOVERABLE)
		cuip_set_phase(CUIP__PHASE__PHASE_PREPARED); /* partly detached: REBUILD */
	if (ret)
		return -EIO;
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		CUresult r;
		if (!cuip_carried(a) || !a->drv)
			continue;
		if (a->creator == self.id)
			cuip_xc_drop(a->serial);
		r = real.cuMemRelease(a->drv);
		if (r != CUDA_SUCCESS) {
			cuip_set_phase(CUIP__PHASE__PHASE_PREPARED); /* partly released: REBUILD */
			snprintf(err, errlen, "allocation " ID_FMT ": releasing the driver handle failed: %s", ID(a),
				 cuip_cuerr(r));
			return -EIO;
		}
		a->drv = 0;
	}
	return 0;
}

static bool created_here(const struct cuip_alloc *a, const void *arg)
{
	(void)arg;
	return cuip_carried(a) && a->creator == self.id;
}

static bool imported_here(const struct cuip_alloc *a, const void *arg)
{
	(void)arg;
	return is_shared(a) && a->creator != self.id && !a->mc;
}

/* STAGE_CREATORS: what LOAD recreated here is mapped back and published. */
static int rebuild_creators(char *err, size_t errlen)
{
	int ret;

	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		if (created_here(a, NULL) && !a->drv) {
			snprintf(err, errlen, "allocation " ID_FMT " was not loaded (no carrier entry)", ID(a));
			return -ENODATA;
		}
	ret = cuip_maps_attach(created_here, NULL, "allocation", err, errlen);
	if (ret)
		return ret;
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		CUresult r;

		if (!created_here(a, NULL))
			continue;
		/* Publish before importers ask: same identity, same token. */
		if (a->has_token && cuip_xc_export(a->serial, a->drv, a->token, &r)) {
			snprintf(err, errlen, "allocation " ID_FMT ": export failed: %s", ID(a), cuip_cuerr(r));
			return -EIO;
		}
	}
	return 0;
}

static int by_creator(const void *x, const void *y)
{
	const struct cuip_alloc *a = *(struct cuip_alloc *const *)x, *b = *(struct cuip_alloc *const *)y;

	if (a->creator != b->creator)
		return a->creator < b->creator ? -1 : 1;
	return a->serial < b->serial ? -1 : a->serial > b->serial;
}

/* Import one batch of one creator's allocations (fetched FDs in it[]):
 * every FD is closed whatever happens. 0 or the first error, err filled. */
static int import_batch(struct cuip_alloc **v, struct cuip_fetch_item *it, size_t n, char *err, size_t errlen)
{
	int ret = 0;

	for (size_t i = 0; i < n; i++) {
		struct cuip_alloc *a = v[i];
		CUresult r;

		if (ret) {
			if (it[i].fd >= 0)
				close(it[i].fd);
			continue;
		}
		if (it[i].fd < 0) {
			ret = it[i].fd;
			snprintf(err, errlen, "allocation " ID_FMT " from pid %d: creator refused: %s", ID(a),
				 a->creator_pid, cuip_fetch_refusal(it[i].fd));
			continue;
		}
		r = real.cuMemImportFromShareableHandle(&a->drv, (void *)(uintptr_t)it[i].fd,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(it[i].fd);
		if (r != CUDA_SUCCESS) {
			a->drv = 0;
			ret = -EIO;
			snprintf(err, errlen, "allocation " ID_FMT ": import failed: %s", ID(a), cuip_cuerr(r));
		}
	}
	return ret;
}

/*
 * Importers: per creator, one connection and one FETCH_MANY per
 * CUIP_MSG_MAX_FDS allocations (thousands of imports cost tens of round
 * trips, not thousands), then the driver imports, then one remap pass.
 */
/* Ask creator of v[k..j) (one creator) for the next batch, from v[k]. */
static int fetch_send(int s, struct cuip_alloc **v, size_t k, size_t j, struct cuip_fetch_item *it, char *why,
		      size_t whylen)
{
	size_t m = j - k < CUIP_MSG_MAX_FDS ? j - k : CUIP_MSG_MAX_FDS;

	for (size_t x = 0; x < m; x++)
		it[x] = (struct cuip_fetch_item){.serial = v[k + x]->serial,
						 .token = v[k + x]->token,
						 .toklen = sizeof(v[k + x]->token),
						 .fd = -1};
	return cuip_fetch_many_send(s, v[k]->creator, it, m, why, whylen);
}

/* STAGE_IMPORTERS: fetch every shared allocation from its creator again. */
static int rebuild_importers(const Cuip__Rebuild *rb, char *err, size_t errlen)
{
	static struct cuip_fetch_item it[2][CUIP_MSG_MAX_FDS]; /* op thread only */
	struct cuip_alloc **v;
	size_t n = 0, i, j, k, failed;
	unsigned b;
	int ret, bad = 0;

	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		n += imported_here(a, NULL) && !a->drv;
	v = calloc(n ? n : 1, sizeof(*v));
	if (!v) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	n = 0;
	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		if (imported_here(a, NULL) && !a->drv)
			v[n++] = a;
	qsort(v, n, sizeof(*v), by_creator);
	for (i = 0; i < n && !bad; i = j) {
		const struct cuip_alloc *a = v[i];
		const char *sock = cuip_creator_socket(rb, a);
		char why[384] = "";
		int s;

		for (j = i; j < n && v[j]->creator == a->creator; j++)
			;
		if (!sock) {
			snprintf(err, errlen, "allocation " ID_FMT ": no socket for its creator (pid %d)", ID(a),
				 a->creator_pid);
			bad = -ESRCH;
			break;
		}
		s = cuip_fetch_open(sock, a->creator, why, sizeof(why));
		if (s < 0) {
			snprintf(err, errlen, "allocation " ID_FMT " from pid %d: %s", ID(a), a->creator_pid, why);
			bad = s;
			break;
		}
		/* Batch b+1 is asked for before batch b is imported: the creator
		 * dups and sends while this process imports. */
		failed = i;
		ret = fetch_send(s, v, i, j, it[0], why, sizeof(why));
		for (k = i, b = 0; k < j && !bad && !ret; k += CUIP_MSG_MAX_FDS, b ^= 1) {
			size_t m = j - k < CUIP_MSG_MAX_FDS ? j - k : CUIP_MSG_MAX_FDS;

			failed = k;
			ret = cuip_fetch_many_recv(s, it[b], m, why, sizeof(why));
			if (!ret && k + m < j && (ret = fetch_send(s, v, k + m, j, it[b ^ 1], why, sizeof(why))))
				failed = k + m;
			if (ret)
				for (size_t x = 0; x < m; x++) /* received but not to be imported */
					if (it[b][x].fd >= 0)
						close(it[b][x].fd);
			if (!ret)
				bad = import_batch(v + k, it[b], m, err, errlen);
		}
		if (ret && !bad) {
			snprintf(err, errlen, "allocation " ID_FMT " from pid %d: %s", ID(v[failed]), a->creator_pid,
				 why);
			bad = ret;
		}
		close(s); /* a reply still in flight goes, with its descriptors */
	}
	free(v);
	return bad ? bad : cuip_maps_attach(imported_here, NULL, "allocation", err, errlen);
}

static bool uc_runs_stage(Cuip__Stage stage)
{
	return stage == CUIP__STAGE__STAGE_CREATORS || stage == CUIP__STAGE__STAGE_IMPORTERS;
}

static int uc_rebuild(const Cuip__Rebuild *rb, char *err, size_t errlen)
{
	cuip_state_assert_held();
	return rb->stage == CUIP__STAGE__STAGE_CREATORS ? rebuild_creators(err, errlen)
							: rebuild_importers(rb, err, errlen);
}

/* INSPECT: the counters of what is not carried. */
static int uc_inspect(Cuip__ProcessState *st)
{
	st->counters->has_raw_imports = 1;
	st->counters->raw_imports = raw_imports;
	st->counters->has_unsupported = 1;
	st->counters->unsupported = vmm.unsupported;
	return 0;
}

/* SAVE and LOAD of the carried bytes are carry.c's own slice. */
CUIP_SLICE(unicast, .name = "unicast", .inspect = uc_inspect, .prepare_request = CUIP__REQUEST__BODY_PREPARE_UNICAST,
	   .prepared_phase = CUIP__PHASE__PHASE_PREPARED, .prepare = uc_prepare, .runs_stage = uc_runs_stage,
	   .rebuild = uc_rebuild);

/* ---- fork ---------------------------------------------------------------- */

/* The child holds none of the parent's raw imports. */
static void fork_child(void)
{
	for (int i = 0; i < 256; i++) {
		struct raw_import *r = raw_tab[i], *rn;
		for (; r; r = rn) {
			rn = r->next;
			free(r);
		}
		raw_tab[i] = NULL;
	}
	raw_imports = 0;
}
CUIP_FORK_HOOK(vmm, NULL, NULL, fork_child);
