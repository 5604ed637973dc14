/*
 * Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle)
 * for cuMemAlloc memory.  The 64-byte handle names the devd allocation, its
 * creator's pid and a random token devd checks, and the allocation's offset
 * in it (small ones share a chunk, mem.c).  Opening maps the same physical
 * memory at a new VA and answers the allocation at its offset; opening the
 * same handle again returns the same VA with a reference count.  The devd
 * token plumbing (ipc_token_get, ipc_attach) also serves the pointer export
 * and import of shared memory pools (mempools.c).  Tables under G.lock.
 */
#include <string.h>
#include <unistd.h>

#include "fake.h"

#define IPC_MAGIC 0x50494b46u /* "FKIP" */

struct ipc_handle {
	uint32_t magic;
	int32_t pid;
	uint64_t id;
	uint64_t token;
	uint64_t size;
	uint32_t phys;
	uint64_t off; /* of the allocation in the devd allocation */
};

_Static_assert(sizeof(struct ipc_handle) <= CU_IPC_HANDLE_SIZE, "IPC handle too large");

CUresult ipc_token_get(struct fk_alloc *a, uint64_t *token)
{
	struct fkw_req q = {.op = FKW_IPC_GET, .id = a->devd_id};
	struct fkw_resp r;
	CUresult res = conn_rpc(&q, &r, NULL, 0);

	if (!res) {
		a->dflags |= FKW_AF_IPC;
		*token = r.token;
	}
	return res;
}

CUresult ipc_attach(uint64_t id, uint64_t token, int slot, uint64_t *va)
{
	struct fkw_req q = {.op = FKW_IPC_OPEN, .id = id, .token = token};
	struct fk_alloc *a = &G.alloc[slot];
	struct fkw_resp r;
	CUresult res = alloc_open(slot, &q, ~0u, 0, 2ul << 20, 0, &r, va);

	if (res)
		return res;
	a->kind = FK_A_IPC;
	a->size = r.size;
	a->ord = dev_ord_of_phys((int)r.dev);
	a->ipc_open_refs = 1;
	return CUDA_SUCCESS;
}

static CUresult ipc_get(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	struct ipc_handle ih = {.magic = IPC_MAGIC};
	struct fk_map *m;
	struct fk_alloc *a;
	CUresult res;

	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	m = map_find(dptr);
	if (!m || m->is_mc || m->va != dptr || G.alloc[m->slot].kind != FK_A_LINEAR) {
		UNLOCK();
		return CUDA_ERROR_INVALID_VALUE;
	}
	a = &G.alloc[m->slot];
	res = ipc_token_get(a, &ih.token);
	if (!res) {
		ih.pid = G.pid;
		ih.id = a->devd_id;
		ih.size = a->size;
		ih.phys = (uint32_t)dev_phys(a->ord);
		ih.off = m->off;
		memset(handle, 0, sizeof(*handle));
		memcpy(handle->reserved, &ih, sizeof(ih));
	}
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	FK_CALL("cuIpcGetMemHandle", ipc_get(pHandle, dptr));
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	struct ipc_handle ih;
	struct fk_alloc *a;
	struct fk_ctx *c;
	CUresult res = ctx_require(&c);
	uint64_t va = 0;
	int slot, i;

	if (res)
		return res;
	memcpy(&ih, handle.reserved, sizeof(ih));
	if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || ih.magic != IPC_MAGIC ||
	    ih.off >= ih.size)
		return CUDA_ERROR_INVALID_VALUE;
	if (ih.pid == G.pid)
		return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver: no IPC within one process */
	LOCK();
	for (i = 0; i < FK_MAX_ALLOC; i++) {
		a = &G.alloc[i];
		if (a->used && a->kind == FK_A_IPC && a->devd_id == ih.id && a->ipc_open_refs > 0) {
			for (int j = 0; j < FK_MAX_MAP; j++)
				if (G.map[j].used && !G.map[j].is_mc && G.map[j].slot == i)
					*pdptr = G.map[j].va + ih.off;
			a->ipc_open_refs++;
			UNLOCK();
			return CUDA_SUCCESS;
		}
	}
	slot = alloc_slot_new();
	if (slot < 0) {
		res = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	a = &G.alloc[slot];
	res = ipc_attach(ih.id, ih.token, slot, &va);
	if (res)
		goto out;
	a->ctx = c;
	*pdptr = va + ih.off;
out:
	UNLOCK();
	return res;
}

FK_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	FK_CALL("cuIpcOpenMemHandle", ipc_open(pdptr, handle, Flags));
}

FK_API CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	FK_CALL("cuIpcOpenMemHandle", ipc_open(pdptr, handle, Flags));
}

static CUresult ipc_close(CUdeviceptr dptr)
{
	struct fk_map *m;
	struct fk_alloc *a;
	CUresult r = CUDA_SUCCESS;

	stream_sync_all();
	LOCK();
	m = map_find(dptr);
	if (!m || m->is_mc || G.alloc[m->slot].kind != FK_A_IPC) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	a = &G.alloc[m->slot];
	if (--a->ipc_open_refs == 0) {
		va_release(m->va, m->size);
		map_del(m);
		a->map_refs--;
		alloc_slot_put(m->slot);
	}
out:
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	FK_CALL("cuIpcCloseMemHandle", ipc_close(dptr));
}
