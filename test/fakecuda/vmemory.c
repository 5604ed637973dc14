/*
 * The virtual memory management API: physical handles (cuMemCreate,
 * cuMemRelease, cuMemRetainAllocationHandle), address reservations, mappings
 * and access, granularity and properties, and POSIX-FD export/import of both
 * allocations and multicast objects.  Tables under G.lock.
 *
 * An export is one end of a socketpair whose other end devd keeps: it cannot
 * be dumped by CRIU (its peer is outside the tree), and while any copy of it
 * is open the physical allocation stays alive (devd sees the last close as
 * EOF), as with a real driver's export FD.  Neither export nor import waits
 * for devd: the exporter makes the socketpair and writes the description of
 * the object (struct fkw_export_rec) into devd's end, so that it waits at the
 * application's end, then hands devd its end (one-way FKW_EXPORT); an
 * importer peeks at the record, makes its handle, and sends devd a one-way
 * FKW_IMPORT_REF with the FD attached (devd.c says why that is safe).  The
 * EXPORT is sent at once; the IMPORT_REF is queued with a copy of the FD and
 * sent in a batch (conn.c says why both are safe).  Both are issued under
 * G.lock, so a later release of the same process goes behind them.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fake.h"

int handle_alloc_slot(CUmemGenericAllocationHandle h)
{
	int slot = (int)(h & 0xffff);
	struct fk_alloc *a;

	if (h >> 40 != FK_HTAG_ALLOC || slot >= FK_MAX_ALLOC)
		return -1;
	a = &G.alloc[slot];
	if (!a->used || a->kind != FK_A_VMM || a->handle_refs <= 0 || a->gen != ((h >> 16) & 0xffffff))
		return -1;
	return slot;
}

int handle_mc_slot(CUmemGenericAllocationHandle h)
{
	int slot = (int)(h & 0xffff);
	struct fk_mc *m;

	if (h >> 40 != FK_HTAG_MC || slot >= FK_MAX_MC)
		return -1;
	m = &G.mc[slot];
	if (!m->used || m->handle_refs <= 0 || m->gen != ((h >> 16) & 0xffffff))
		return -1;
	return slot;
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
	if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (dev_check(prop->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC && !fk_fabric())
		return CUDA_ERROR_NOT_SUPPORTED; /* no IMEX/fabric unless FAKECUDA_FABRIC */
	if (prop->requestedHandleTypes &
	    ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

static CUresult mem_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			   unsigned long long flags)
{
	struct fkw_req q = {.op = FKW_ALLOC};
	struct fkw_resp r;
	struct fk_alloc *a;
	uint64_t va; /* none: the application maps VMM memory */
	CUresult res;
	int slot;

	if (!handle || flags)
		return CUDA_ERROR_INVALID_VALUE;
	res = check_prop(prop);
	if (res)
		return res;
	if (size == 0 || size % fk_granularity())
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	slot = alloc_slot_new();
	if (slot < 0) {
		UNLOCK();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a = &G.alloc[slot];
	q.dev = (uint32_t)dev_phys(prop->location.id);
	q.size = size;
	q.flags = prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ? FKW_AF_POSIX : 0;
	if (prop->allocFlags.gpuDirectRDMACapable)
		q.flags |= FKW_AF_GPUDIRECT;
	res = alloc_open(slot, &q, q.dev, size, 0, 0, &r, &va);
	if (res) {
		UNLOCK();
		return res;
	}
	a->kind = FK_A_VMM;
	a->ord = prop->location.id;
	a->size = size;
	a->dflags = q.flags;
	a->prop = *prop;
	a->handle_refs = 1;
	ctx_note_use(a->ord);
	*handle = fk_handle(FK_HTAG_ALLOC, slot, a->gen);
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
				    unsigned long long flags)
{
	FK_CALL("cuMemCreate", mem_create(handle, size, prop, flags));
}

static CUresult mem_release(CUmemGenericAllocationHandle h)
{
	CUresult r = CUDA_SUCCESS;
	int slot;

	LOCK();
	if ((slot = handle_alloc_slot(h)) >= 0) {
		G.alloc[slot].handle_refs--;
		alloc_slot_put(slot);
	} else if ((slot = handle_mc_slot(h)) >= 0) {
		G.mc[slot].handle_refs--;
		mc_slot_put(slot);
	} else {
		r = CUDA_ERROR_INVALID_VALUE;
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	FK_CALL("cuMemRelease", mem_release(handle));
}

static CUresult retain_handle(CUmemGenericAllocationHandle *h, void *addr)
{
	struct fk_map *m;
	CUresult r = CUDA_SUCCESS;

	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	m = map_find((uintptr_t)addr);
	if (!m || (!m->is_mc && G.alloc[m->slot].kind != FK_A_VMM)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (m->is_mc) {
		G.mc[m->slot].handle_refs++;
		*h = fk_handle(FK_HTAG_MC, m->slot, G.mc[m->slot].gen);
	} else {
		G.alloc[m->slot].handle_refs++;
		*h = fk_handle(FK_HTAG_ALLOC, m->slot, G.alloc[m->slot].gen);
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	FK_CALL("cuMemRetainAllocationHandle", retain_handle(handle, addr));
}

static CUresult addr_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	struct fk_resv *v;
	uint64_t va;
	int i;

	if (!ptr || size == 0 || size % fk_granularity() || flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment == 0)
		alignment = fk_granularity();
	if (alignment & (alignment - 1) || alignment % fk_granularity())
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	i = table_new(&G.resv);
	va = i >= 0 ? va_reserve(size, alignment, addr) : 0;
	if (va) {
		v = FK_AT(&G.resv, struct fk_resv, i);
		v->used = 1;
		v->va = va;
		v->size = size;
		v->vmm = 1;
		*ptr = va;
		r = CUDA_SUCCESS;
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
					    unsigned long long flags)
{
	FK_CALL("cuMemAddressReserve", addr_reserve(ptr, size, alignment, addr, flags));
}

static CUresult addr_free(CUdeviceptr ptr, size_t size)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	LOCK();
	for (int i = 0; i < atomic_load(&G.resv.n); i++) {
		struct fk_resv *v = FK_AT(&G.resv, struct fk_resv, i);

		if (!v->used || !v->vmm || v->va != ptr || v->size != size)
			continue;
		if (map_lower(ptr) < G.nmap && G.map[G.map_by_va[map_lower(ptr)]].va < ptr + size)
			goto out; /* still mapped */
		va_release(v->va, v->size);
		v->used = 0;
		r = CUDA_SUCCESS;
		break;
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	FK_CALL("cuMemAddressFree", addr_free(ptr, size));
}

static struct fk_resv *resv_of(uint64_t va, size_t size)
{
	for (int i = 0; i < atomic_load(&G.resv.n); i++) {
		struct fk_resv *v = FK_AT(&G.resv, struct fk_resv, i);

		if (v->used && v->vmm && va >= v->va && va + size <= v->va + v->size)
			return v;
	}
	return NULL;
}

static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
			unsigned long long flags)
{
	CUresult r = CUDA_SUCCESS;
	int slot, is_mc = 0;
	size_t limit;

	if (flags || size == 0 || size % fk_granularity() || ptr % fk_granularity() || offset % fk_granularity())
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	slot = handle_alloc_slot(h);
	if (slot < 0) {
		slot = handle_mc_slot(h);
		is_mc = 1;
	}
	if (slot < 0) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	limit = is_mc ? G.mc[slot].size_eff : G.alloc[slot].size;
	if (offset + size > limit || !resv_of(ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (map_lower(ptr) < G.nmap && G.map[G.map_by_va[map_lower(ptr)]].va < ptr + size) {
		r = CUDA_ERROR_INVALID_VALUE; /* overlaps a mapping */
		goto out;
	}
	if (map_add(ptr, size, is_mc, slot, offset, 0) < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY;
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
				 unsigned long long flags)
{
	FK_CALL("cuMemMap", mem_map(ptr, size, offset, handle, flags));
}

/* The mappings in [ptr, ptr+size) exactly tile it.  G.lock held. */
static int range_tiled(uint64_t ptr, size_t size)
{
	uint64_t va = ptr;

	while (va < ptr + size) {
		struct fk_map *m = map_find(va);

		if (!m || m->va != va || m->va + m->size > ptr + size)
			return 0;
		va += m->size;
	}
	return size > 0;
}

static CUresult mem_unmap(CUdeviceptr ptr, size_t size)
{
	CUresult r = CUDA_SUCCESS;

	stream_sync_all();
	LOCK();
	if (!resv_of(ptr, size) || !range_tiled(ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	while (map_lower(ptr) < G.nmap && G.map[G.map_by_va[map_lower(ptr)]].va < ptr + size) {
		struct fk_map *m = &G.map[G.map_by_va[map_lower(ptr)]];

		map_del(m);
		if (m->is_mc) {
			G.mc[m->slot].map_refs--;
			mc_slot_put(m->slot);
		} else {
			G.alloc[m->slot].map_refs--;
			alloc_slot_put(m->slot);
		}
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	FK_CALL("cuMemUnmap", mem_unmap(ptr, size));
}

static CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	CUresult r = CUDA_SUCCESS;
	size_t i;

	if (!desc || count == 0 || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return CUDA_ERROR_INVALID_VALUE;
		if (dev_check(desc[i].location.id))
			return CUDA_ERROR_INVALID_DEVICE;
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	}
	LOCK();
	if (!range_tiled(ptr, size)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	for (int j = map_lower(ptr); j < G.nmap && G.map[G.map_by_va[j]].va < ptr + size; j++) {
		struct fk_map *m = &G.map[G.map_by_va[j]];

		for (i = 0; i < count; i++) {
			uint32_t bit = 1u << desc[i].location.id;

			if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
				m->access &= ~bit;
			else
				m->access |= bit;
			ctx_note_use(desc[i].location.id);
		}
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	FK_CALL("cuMemSetAccess", set_access(ptr, size, desc, count));
}

static CUresult get_access(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	struct fk_map *m;
	CUresult r = CUDA_SUCCESS;

	if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev_check(location->id))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	m = map_find(ptr);
	if (!m)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		*flags = (m->access >> location->id) & 1 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
							 : CU_MEM_ACCESS_FLAGS_PROT_NONE;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	FK_CALL("cuMemGetAccess", get_access(flags, location, ptr));
}

static CUresult granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)
{
	CUresult r;

	if (!g || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	r = check_prop(prop);
	if (r)
		return r;
	*g = fk_granularity();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity_, const CUmemAllocationProp *prop,
						      CUmemAllocationGranularity_flags option)
{
	FK_CALL("cuMemGetAllocationGranularity", granularity(granularity_, prop, option));
}

static CUresult props_from_handle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
	CUresult r = CUDA_SUCCESS;
	int slot;

	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	slot = handle_alloc_slot(h);
	if (slot < 0)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		*prop = G.alloc[slot].prop;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							       CUmemGenericAllocationHandle handle)
{
	FK_CALL("cuMemGetAllocationPropertiesFromHandle", props_from_handle(prop, handle));
}

/* The record an export FD carries (see the top of this file).  G.lock held. */
static void export_rec(struct fkw_export_rec *rec, int kind, int slot)
{
	memset(rec, 0, sizeof(*rec));
	rec->magic = FKW_EXPORT_MAGIC;
	rec->version = FKW_VERSION;
	rec->kind = (uint32_t)kind;
	rec->pid = G.pid;
	if (kind == FKW_KIND_ALLOC) {
		struct fk_alloc *a = &G.alloc[slot];

		rec->id = a->devd_id;
		rec->dev = (uint32_t)dev_phys(a->ord);
		rec->off = a->aoff;
		rec->size = a->size;
		rec->flags = a->dflags;
	} else {
		struct fk_mc *m = &G.mc[slot];

		rec->id = m->devd_id;
		rec->size = m->size;
		rec->size2 = m->size_eff;
		rec->ndev = m->ndev;
	}
}

static CUresult export_handle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
			      unsigned long long flags)
{
	struct fkw_req q = {.op = FKW_EXPORT};
	struct fkw_export_rec rec;
	CUresult res = CUDA_SUCCESS;
	int slot, sv[2];

	if (!out || flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (type == CU_MEM_HANDLE_TYPE_FABRIC)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	if ((slot = handle_alloc_slot(h)) >= 0) {
		if (!(G.alloc[slot].dflags & FKW_AF_POSIX)) {
			UNLOCK();
			return CUDA_ERROR_INVALID_VALUE;
		}
		q.kind = FKW_KIND_ALLOC;
	} else if ((slot = handle_mc_slot(h)) >= 0) {
		q.kind = FKW_KIND_MC;
	} else {
		UNLOCK();
		return CUDA_ERROR_INVALID_VALUE;
	}
	export_rec(&rec, (int)q.kind, slot);
	q.id = rec.id;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		UNLOCK();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	/* sv[0] goes to devd; what it carries waits, unread, at sv[1]. */
	if (write(sv[0], &rec, sizeof(rec)) != (ssize_t)sizeof(rec))
		res = CUDA_ERROR_OUT_OF_MEMORY;
	else
		res = conn_send(&q, sv[0]);
	UNLOCK();
	close(sv[0]); /* devd's copy is in flight or kept: only the application's keep it alive */
	if (res) {
		close(sv[1]);
		return res;
	}
	*(int *)out = sv[1];
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						     CUmemAllocationHandleType handleType, unsigned long long flags)
{
	FK_CALL("cuMemExportToShareableHandle", export_handle(shareableHandle, handle, handleType, flags));
}

/* The record of an export FD, or -1 for anything else (not a socket, short, foreign). */
static int import_rec(int fd, struct fkw_export_rec *rec)
{
	ssize_t n;

	do
		n = recv(fd, rec, sizeof(*rec), MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(*rec) || rec->magic != FKW_EXPORT_MAGIC || rec->version != FKW_VERSION)
		return -1;
	if (rec->kind == FKW_KIND_ALLOC)
		return rec->dev < FKW_MAX_DEV && dev_ord_of_phys((int)rec->dev) >= 0 && rec->size ? 0 : -1;
	return rec->kind == FKW_KIND_MC ? 0 : -1;
}

static CUresult import_handle(CUmemGenericAllocationHandle *h, void *osHandle, CUmemAllocationHandleType type)
{
	struct fkw_req q = {.op = FKW_IMPORT_REF};
	struct fkw_export_rec rec;
	int fd = (int)(intptr_t)osHandle, slot;
	CUresult res = CUDA_SUCCESS;

	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	if (type == CU_MEM_HANDLE_TYPE_FABRIC)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 || fcntl(fd, F_GETFD) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (import_rec(fd, &rec) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	q.kind = rec.kind;
	q.id = rec.id;
	LOCK();
	if (rec.kind == FKW_KIND_MC) {
		struct fk_mc *m;

		slot = mc_slot_new();
		if (slot < 0) {
			res = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		m = &G.mc[slot];
		res = conn_queue(&q, fd);
		if (res) {
			m->used = 0;
			goto out;
		}
		m->devd_id = rec.id;
		m->size = rec.size;
		m->size_eff = rec.size2;
		m->ndev = rec.ndev;
		m->imported = 1;
		m->handle_refs = 1;
		*h = fk_handle(FK_HTAG_MC, slot, m->gen);
	} else {
		struct fk_alloc *a;

		slot = alloc_slot_new();
		if (slot < 0) {
			res = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		a = &G.alloc[slot];
		a->win = arena_at(rec.dev, rec.off, rec.size);
		if (!a->win) {
			a->used = 0;
			res = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		res = conn_queue(&q, fd);
		if (res) {
			a->win = NULL;
			a->used = 0;
			goto out;
		}
		a->devd_id = rec.id;
		a->aoff = rec.off;
		a->kind = FK_A_VMM;
		a->imported = 1;
		a->size = rec.size;
		a->dflags = rec.flags;
		a->ord = dev_ord_of_phys((int)rec.dev);
		a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		a->prop.location.id = a->ord;
		a->prop.requestedHandleTypes = rec.flags & FKW_AF_POSIX ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
		a->handle_refs = 1;
		*h = fk_handle(FK_HTAG_ALLOC, slot, a->gen);
	}
out:
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						       CUmemAllocationHandleType shHandleType)
{
	FK_CALL("cuMemImportFromShareableHandle", import_handle(handle, osHandle, shHandleType));
}
