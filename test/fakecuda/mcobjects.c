/*
 * Multicast objects: create, add devices, bind memory (by handle or address,
 * plus the CUDA 13.1 device-explicit _v2 forms), unbind, granularity.  The
 * object itself (devices, bindings, effective size) lives in devd; this
 * process keeps a slot per handle in G.mc (G.lock).  Writes through a
 * multicast mapping are fanned out to every binding in devmem.c.
 *
 * Binds wait, as real drivers do, until every device of the team has been
 * added (by any process): they poll devd holding no lock while they sleep.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake.h"

int mc_slot_new(void)
{
	for (int i = 0; i < FK_MAX_MC; i++) {
		struct fk_mc *m = &G.mc[i];

		if (!m->used) {
			uint32_t gen = m->gen + 1;

			memset(m, 0, sizeof(*m));
			m->gen = gen & 0xffffff;
			m->used = 1;
			return i;
		}
	}
	return -1;
}

static CUresult mc_create(CUmemGenericAllocationHandle *h, const CUmulticastObjectProp *prop)
{
	struct fkw_req q = {.op = FKW_MC_CREATE};
	struct fkw_resp r;
	struct fk_mc *m;
	CUresult res;
	int slot;

	if (!h || !prop || prop->numDevices == 0 || prop->size == 0 || prop->flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->handleTypes & CU_MEM_HANDLE_TYPE_FABRIC && !fk_fabric())
		return CUDA_ERROR_NOT_SUPPORTED; /* no IMEX/fabric unless FAKECUDA_FABRIC */
	if (prop->handleTypes &
	    ~(unsigned long long)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (getenv("FAKECUDA_NO_MULTICAST") && strcmp(getenv("FAKECUDA_NO_MULTICAST"), "0"))
		return CUDA_ERROR_NOT_SUPPORTED;
	LOCK();
	slot = mc_slot_new();
	if (slot < 0) {
		UNLOCK();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	m = &G.mc[slot];
	q.n = prop->numDevices;
	q.size = prop->size;
	q.flags = (uint32_t)prop->handleTypes;
	res = conn_rpc(&q, &r, NULL, 0);
	if (res) {
		m->used = 0;
		UNLOCK();
		return res;
	}
	m->devd_id = r.id;
	m->size = r.size;
	m->size_eff = r.size2;
	m->ndev = prop->numDevices;
	m->handle_refs = 1;
	*h = fk_handle(FK_HTAG_MC, slot, m->gen);
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
	FK_CALL("cuMulticastCreate", mc_create(mcHandle, prop));
}

static CUresult mc_add(CUmemGenericAllocationHandle h, CUdevice dev)
{
	struct fkw_req q = {.op = FKW_MC_ADD};
	struct fkw_resp r;
	CUresult res;
	int slot;

	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	LOCK();
	slot = handle_mc_slot(h);
	if (slot < 0) {
		UNLOCK();
		return CUDA_ERROR_INVALID_VALUE;
	}
	q.id = G.mc[slot].devd_id;
	q.dev = (uint32_t)dev_phys(dev);
	res = conn_rpc(&q, &r, NULL, 0);
	if (!res)
		ctx_note_use(dev);
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
	FK_CALL("cuMulticastAddDevice", mc_add(mcHandle, dev));
}

/*
 * Binds memory to the multicast object for device dev (-1: the memory's own
 * device).  Memory is named by handle (memh) or by address (memptr).
 */
static CUresult mc_bind(CUmemGenericAllocationHandle mch, int dev, size_t mcoff, CUmemGenericAllocationHandle memh,
			CUdeviceptr memptr, size_t memoff, size_t size, unsigned long long flags)
{
	struct timespec nap = {0, 1000000};

	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev >= 0 && dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	for (;;) {
		struct fkw_req q = {.op = FKW_MC_BIND};
		struct fkw_resp r;
		CUresult res;
		int ms, as;

		LOCK();
		ms = handle_mc_slot(mch);
		if (memptr) {
			struct fk_map *m = map_find(memptr);

			as = m && !m->is_mc && G.alloc[m->slot].kind == FK_A_VMM ? m->slot : -1;
			if (as >= 0) {
				if (memptr + size > m->va + m->size) {
					UNLOCK();
					return CUDA_ERROR_INVALID_VALUE;
				}
				memoff = m->off + (memptr - m->va);
			}
		} else {
			as = handle_alloc_slot(memh);
		}
		if (ms < 0 || as < 0) {
			UNLOCK();
			return CUDA_ERROR_INVALID_VALUE;
		}
		q.id = G.mc[ms].devd_id;
		q.id2 = G.alloc[as].devd_id;
		q.dev = (uint32_t)dev_phys(dev >= 0 ? dev : G.alloc[as].ord);
		q.off = mcoff;
		q.off2 = memoff;
		q.size = size;
		res = conn_rpc(&q, &r, NULL, 0);
		UNLOCK();
		if (res != CUDA_ERROR_NOT_READY)
			return res;
		nanosleep(&nap, NULL); /* not every device added yet: wait for the rest of the team */
	}
}

FK_API CUresult CUDAAPI cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
					   CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
					   unsigned long long flags)
{
	FK_CALL("cuMulticastBindMem", mc_bind(mcHandle, -1, mcOffset, memHandle, 0, memOffset, size, flags));
}

FK_API CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					      CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
					      unsigned long long flags)
{
	FK_CALL("cuMulticastBindMem", mc_bind(mcHandle, dev, mcOffset, memHandle, 0, memOffset, size, flags));
}

FK_API CUresult CUDAAPI cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
					    size_t size, unsigned long long flags)
{
	FK_CALL("cuMulticastBindAddr", mc_bind(mcHandle, -1, mcOffset, 0, memptr, 0, size, flags));
}

FK_API CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					       CUdeviceptr memptr, size_t size, unsigned long long flags)
{
	FK_CALL("cuMulticastBindAddr", mc_bind(mcHandle, dev, mcOffset, 0, memptr, 0, size, flags));
}

static CUresult mc_unbind(CUmemGenericAllocationHandle h, CUdevice dev, size_t mcoff, size_t size)
{
	struct fkw_req q = {.op = FKW_MC_UNBIND};
	struct fkw_resp r;
	CUresult res;
	int slot;

	if (dev_check(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	stream_sync_all();
	LOCK();
	slot = handle_mc_slot(h);
	if (slot < 0) {
		UNLOCK();
		return CUDA_ERROR_INVALID_VALUE;
	}
	q.id = G.mc[slot].devd_id;
	q.dev = (uint32_t)dev_phys(dev);
	q.off = mcoff;
	q.size = size;
	res = conn_rpc(&q, &r, NULL, 0);
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					  size_t size)
{
	FK_CALL("cuMulticastUnbind", mc_unbind(mcHandle, dev, mcOffset, size));
}

static CUresult mc_granularity(size_t *g, const CUmulticastObjectProp *prop, CUmulticastGranularity_flags option)
{
	if (!g || !prop || prop->numDevices == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (option == CU_MULTICAST_GRANULARITY_MINIMUM)
		*g = G.dev.mc_gran;
	else if (option == CU_MULTICAST_GRANULARITY_RECOMMENDED)
		*g = G.dev.mc_rec_gran;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
						  CUmulticastGranularity_flags option)
{
	FK_CALL("cuMulticastGetGranularity", mc_granularity(granularity, prop, option));
}
