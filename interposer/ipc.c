/*
 * ipc.c - legacy device memory: cuMemAlloc converted to POSIX-capable VMM,
 * and cuIpc* emulated over the project's identities, tokens and peer FD
 * service, so that an IPC importer can be checkpointed on any driver (a
 * natively checkpointed IPC importer cannot be restored, FACTS.md).
 *
 * cuMemAlloc_v2 creates a granularity-rounded POSIX-capable allocation on
 * the current context's device, reserves a VA range of that size, maps it and
 * gives the device read-write access; the application sees the VA. The record
 * (ORIGIN_MALLOC) stays OWNER_NATIVE (native checkpoint saves it) until
 * cuIpcGetMemHandle shares it; then it is SHARED for life and the creator
 * carries its bytes. cuMemGetAddressRange_v2 reports the requested size.
 *
 * A CUipcMemHandle minted here is 64 bytes (struct ipc_handle): a magic that
 * tells our handles from the driver's, the creator's identity, pid and the
 * allocation's serial, sizes and the authorization token. cuIpcOpenMemHandle
 * fetches a real FD from the creator's control socket (the Fetch request of
 * the peer FD service), imports it, maps it at a VA of its own and gives the
 * current device access (ORIGIN_IPC_OPEN, SHARED). Opening the same handle
 * again returns the same VA and counts; the last cuIpcCloseMemHandle unmaps
 * and releases. A handle without our magic (made by the driver for a process
 * not running under cuinterpose) is refused with CUDA_ERROR_NOT_SUPPORTED and
 * a log line: its memory could not be checkpointed. A handle with our magic
 * but a bad version or sizes gets CUDA_ERROR_INVALID_VALUE.
 *
 * Callers: the application, through every resolution path (resolve.c).
 * Locking: ipc_mu serializes IPC opens and closes in this process (so two
 * threads opening one handle map it once); it is taken before
 * cuip_state_lock, only by application threads inside the gate. Records and
 * mappings are vmm.c's, under cuip_state_lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuip.h"

#define IPC_MAGIC   0x50495543u /* "CUIP" */
#define IPC_VERSION 1

struct ipc_handle {
	uint32_t magic;
	uint16_t version;
	uint16_t flags; /* 0 */
	int32_t creator_pid;
	uint32_t reserved; /* 0 */
	uint64_t creator;
	uint64_t serial;
	uint64_t size;	    /* backing bytes (granularity-rounded) */
	uint64_t requested; /* what cuMemAlloc was asked for */
	uint8_t token[16];
};

_Static_assert(sizeof(struct ipc_handle) == CU_IPC_HANDLE_SIZE, "IPC handle layout");

#define ID_FMT "%016llx:%llu"

static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ipc_once = PTHREAD_ONCE_INIT;
static struct {
	__typeof__(&cuMemAlloc_v2) alloc;
	__typeof__(&cuMemFree_v2) free;
	__typeof__(&cuMemGetAddressRange_v2) range;
	__typeof__(&cuIpcGetMemHandle) get;
	__typeof__(&cuCtxGetDevice) getdev;
	__typeof__(&cuMemGetAllocationGranularity) gran;
} rl;

static void ipc_init(void)
{
	void *h;

	if (cuip_driver_init())
		return;
	h = cuip_driver_handle();
	rl.alloc = (__typeof__(rl.alloc))cuip_real_dlsym(h, "cuMemAlloc_v2");
	rl.free = (__typeof__(rl.free))cuip_real_dlsym(h, "cuMemFree_v2");
	rl.range = (__typeof__(rl.range))cuip_real_dlsym(h, "cuMemGetAddressRange_v2");
	rl.get = (__typeof__(rl.get))cuip_real_dlsym(h, "cuIpcGetMemHandle");
	rl.getdev = (__typeof__(rl.getdev))cuip_real_dlsym(h, "cuCtxGetDevice");
	rl.gran = (__typeof__(rl.gran))cuip_real_dlsym(h, "cuMemGetAllocationGranularity");
}

static CUresult enter(void *fnp)
{
	if (cuip_driver_init())
		return CUDA_ERROR_NOT_FOUND;
	pthread_once(&ipc_once, ipc_init);
	if (!*(void **)fnp || !rl.getdev || !rl.gran)
		return CUDA_ERROR_NOT_FOUND;
	return cuip_gate_enter();
}

/* Reserve, map and open [va, va+size) of h for device dev (no lock needed:
 * nothing is recorded yet). */
static CUresult map_new(CUmemGenericAllocationHandle h, size_t size, CUdevice dev, CUdeviceptr *va)
{
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUresult r;

	*va = 0;
	r = real.cuMemAddressReserve(va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemMap(*va, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto free_va;
	r = real.cuMemSetAccess(*va, size, &d, 1);
	if (r != CUDA_SUCCESS)
		goto unmap;
	return CUDA_SUCCESS;
unmap:
	real.cuMemUnmap(*va, size);
free_va:
	real.cuMemAddressFree(*va, size);
	*va = 0;
	return r;
}

static void map_gone(CUdeviceptr va, size_t size)
{
	CUresult r = real.cuMemUnmap(va, size);

	if (r == CUDA_SUCCESS)
		r = real.cuMemAddressFree(va, size);
	if (r != CUDA_SUCCESS)
		pr_err("unmapping legacy memory at %#llx: %s", (unsigned long long)va, cuip_cuerr(r));
}

/* Record the mapping of a made by map_new (lock held); 0 or -ENOMEM. */
static int map_record(struct cuip_alloc *a, CUdeviceptr va, CUdevice dev)
{
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
	struct cuip_mapping *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	m->va = va;
	m->size = a->size;
	m->a = a;
	m->legacy = true;
	if (cuip_access_set(m, va, a->size, &loc, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) || cuip_map_insert(m)) {
		cuip_map_free(m);
		return -ENOMEM;
	}
	a->nmaps++;
	cuip_peer_grant(m);
	return 0;
}

/* The legacy mapping that starts at va, or NULL (lock held). */
static struct cuip_mapping *legacy_at(CUdeviceptr va)
{
	struct cuip_mapping *m = cuip_mapping_at(va);

	return m && m->legacy && m->va == va ? m : NULL;
}

/* ---- cuMemAlloc, cuMemFree, cuMemGetAddressRange ------------------------ */

CUIP_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUmemAllocationProp prop = {0};
	CUmemGenericAllocationHandle h;
	struct cuip_alloc *a;
	CUdeviceptr va;
	CUdevice dev;
	size_t g = 0, size;
	CUresult r = enter(&rl.alloc);

	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || !bytesize) {
		r = rl.alloc(dptr, bytesize); /* the driver's own answer */
		goto out;
	}
	r = rl.getdev(&dev);
	if (r != CUDA_SUCCESS)
		goto out;
	cuip_start();
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	r = rl.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || !g)
		goto native;
	size = (bytesize + g - 1) / g * g;
	r = real.cuMemCreate(&h, size, &prop, 0);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		goto native;
	if (r != CUDA_SUCCESS)
		goto out;
	r = map_new(h, size, dev, &va);
	if (r != CUDA_SUCCESS)
		goto release;
	pthread_mutex_lock(&cuip_state_lock);
	a = cuip_alloc_create(self.id, ++vmm.next_serial);
	if (!a) {
		pthread_mutex_unlock(&cuip_state_lock);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	a->prop = prop;
	a->size = size;
	a->requested = bytesize;
	a->drv = h;
	a->origin = CUIP__ORIGIN__ORIGIN_MALLOC;
	a->owner = CUIP__OWNER__OWNER_NATIVE;
	a->creator_pid = self.pid;
	memcpy(a->creator_sock, self.sock, sizeof(a->creator_sock));
	if (map_record(a, va, dev)) {
		cuip_alloc_unlink_if_dead(a);
		pthread_mutex_unlock(&cuip_state_lock);
		a->drv = 0;
		free(a);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	pthread_mutex_unlock(&cuip_state_lock);
	*dptr = va;
	pr_debug("cuMemAlloc(%zu): allocation " ID_FMT " at %#llx (%zu bytes backing)", bytesize,
		 (unsigned long long)self.id, (unsigned long long)a->serial, (unsigned long long)va, size);
	goto out;
unmap:
	map_gone(va, size);
release:
	real.cuMemRelease(h);
	goto out;
native:
	/* No POSIX-capable VMM here: the driver's own allocation, which
	 * cannot be IPC-shared through cuinterpose. */
	pr_info("cuMemAlloc(%zu) on device %d: no POSIX-capable VMM, native allocation", bytesize, (int)dev);
	r = rl.alloc(dptr, bytesize);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	struct cuip_alloc *a;
	bool dead;
	CUresult r = enter(&rl.free);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&cuip_state_lock);
	m = legacy_at(dptr);
	if (!m || m->a->origin != CUIP__ORIGIN__ORIGIN_MALLOC || m->a->creator != self.id) {
		pthread_mutex_unlock(&cuip_state_lock);
		r = rl.free(dptr);
		if (r == CUDA_SUCCESS)
			cuip_pool_freed(dptr); /* pool memory may be freed with cuMemFree */
		goto out;
	}
	pthread_mutex_unlock(&cuip_state_lock);
	/* cuMemFree synchronizes; an unmap under running work would not. */
	real.cuCtxSynchronize();
	pthread_mutex_lock(&cuip_state_lock);
	m = legacy_at(dptr);
	if (!m || m->a->origin != CUIP__ORIGIN__ORIGIN_MALLOC) {
		pthread_mutex_unlock(&cuip_state_lock); /* freed by another thread meanwhile */
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	a = m->a;
	cuip_map_take(dptr);
	map_gone(m->va, m->size);
	cuip_map_free(m);
	dead = cuip_alloc_unlink_if_dead(a);
	pthread_mutex_unlock(&cuip_state_lock);
	if (dead)
		cuip_alloc_release(a);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	CUresult r = enter(&rl.range);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&cuip_state_lock);
	m = cuip_mapping_at(dptr);
	if (m && m->legacy) {
		if (pbase)
			*pbase = m->va;
		if (psize)
			*psize = m->a->requested;
		pthread_mutex_unlock(&cuip_state_lock);
		goto out;
	}
	pthread_mutex_unlock(&cuip_state_lock);
	r = rl.range(pbase, psize, dptr);
out:
	cuip_gate_exit();
	return r;
}

/* ---- cuIpc* --------------------------------------------------------------- */

CUIP_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct ipc_handle ih = {.magic = IPC_MAGIC, .version = IPC_VERSION};
	struct cuip_mapping *m;
	struct cuip_alloc *a, snap;
	CUresult r = enter(&rl.get);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pHandle) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	pthread_mutex_lock(&cuip_state_lock);
	m = legacy_at(dptr);
	if (!m || m->a->origin != CUIP__ORIGIN__ORIGIN_MALLOC || m->a->creator != self.id) {
		bool opened = m != NULL;
		pthread_mutex_unlock(&cuip_state_lock);
		if (opened) {
			r = CUDA_ERROR_INVALID_VALUE; /* IPC-opened memory is not re-exported */
			goto out;
		}
		/* Not converted (or not an allocation): the driver's answer. */
		r = rl.get(pHandle, dptr);
		if (r == CUDA_SUCCESS)
			pr_err("native IPC handle for %#llx (memory not allocated through cuinterpose): "
			       "cuinterpose importers refuse it",
			       (unsigned long long)dptr);
		goto out;
	}
	a = m->a;
	if (!a->has_token) {
		cuip_random(a->token, sizeof(a->token));
		a->has_token = true;
	}
	snap = *a;
	pthread_mutex_unlock(&cuip_state_lock);
	if (cuip_xc_export(snap.serial, snap.drv, snap.token, &r))
		goto out;
	pthread_mutex_lock(&cuip_state_lock);
	a = cuip_alloc_by_id(snap.creator, snap.serial);
	if (!a) {
		pthread_mutex_unlock(&cuip_state_lock);
		r = CUDA_ERROR_INVALID_VALUE; /* freed by another thread meanwhile */
		goto out;
	}
	if (a->owner == CUIP__OWNER__OWNER_NATIVE)
		a->owner = CUIP__OWNER__OWNER_SHARED;
	pthread_mutex_unlock(&cuip_state_lock);
	ih.creator_pid = snap.creator_pid;
	ih.creator = snap.creator;
	ih.serial = snap.serial;
	ih.size = snap.size;
	ih.requested = snap.requested;
	memcpy(ih.token, snap.token, sizeof(ih.token));
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy(pHandle->reserved, &ih, sizeof(ih));
out:
	cuip_gate_exit();
	return r;
}

/* The creator's control socket: same directory as ours, named by pid and identity. */
static void creator_socket(const struct ipc_handle *ih, char *buf, size_t len)
{
	const char *slash = strrchr(self.sock, '/');
	int dirlen = slash ? (int)(slash - self.sock) : 0;

	snprintf(buf, len, "%.*s/%d-%016llx.sock", dirlen, self.sock, ih->creator_pid, (unsigned long long)ih->creator);
}

/* Open (creator, serial) for the first time here: fetch, import, map. */
static CUresult ipc_open_first(const struct ipc_handle *ih, CUdevice dev, CUdeviceptr *pdptr)
{
	CUmemGenericAllocationHandle h = 0;
	struct cuip_alloc *a;
	char sock[108], err[256] = "";
	bool fresh = false;
	CUdeviceptr va;
	CUresult r;
	int fd;

	pthread_mutex_lock(&cuip_state_lock);
	a = cuip_alloc_by_id(ih->creator, ih->serial);
	if (a && a->drv)
		h = a->drv; /* imported through a ticket too: one driver handle per process */
	pthread_mutex_unlock(&cuip_state_lock);
	if (!h) {
		creator_socket(ih, sock, sizeof(sock));
		fd = cuip_fetch(sock, ih->creator, ih->serial, ih->token, sizeof(ih->token), err, sizeof(err));
		if (fd < 0) {
			pr_err("cuIpcOpenMemHandle of allocation " ID_FMT " from pid %d: %s",
			       (unsigned long long)ih->creator, (unsigned long long)ih->serial, ih->creator_pid, err);
			return fd == -EMFILE || fd == -ENFILE ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_INVALID_VALUE;
		}
		r = real.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(fd);
		if (r != CUDA_SUCCESS)
			return r;
		fresh = true;
	}
	r = map_new(h, ih->size, dev, &va);
	if (r != CUDA_SUCCESS)
		goto release;
	pthread_mutex_lock(&cuip_state_lock);
	a = cuip_alloc_by_id(ih->creator, ih->serial);
	if (!a) {
		a = cuip_alloc_create(ih->creator, ih->serial);
		if (!a) {
			pthread_mutex_unlock(&cuip_state_lock);
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto unmap;
		}
		a->drv = h;
		a->origin = CUIP__ORIGIN__ORIGIN_IPC_OPEN;
		if (real.cuMemGetAllocationPropertiesFromHandle(&a->prop, h) != CUDA_SUCCESS) {
			a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
			a->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
			a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			a->prop.location.id = dev;
		}
		a->prop.win32HandleMetaData = NULL;
		a->size = ih->size;
		memcpy(a->token, ih->token, sizeof(a->token));
		a->has_token = true;
		a->creator_pid = ih->creator_pid;
		creator_socket(ih, a->creator_sock, sizeof(a->creator_sock));
	}
	a->owner = CUIP__OWNER__OWNER_SHARED;
	a->requested = ih->requested;
	if (map_record(a, va, dev)) {
		bool dead = cuip_alloc_unlink_if_dead(a);
		pthread_mutex_unlock(&cuip_state_lock);
		if (dead) {
			a->drv = 0; /* released below */
			free(a);
		}
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	a->ipc_va = va;
	a->ipc_opens = 1;
	pthread_mutex_unlock(&cuip_state_lock);
	*pdptr = va;
	return CUDA_SUCCESS;
unmap:
	map_gone(va, ih->size);
release:
	if (fresh)
		real.cuMemRelease(h);
	return r;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	struct ipc_handle ih;
	struct cuip_alloc *a;
	CUdevice dev;
	CUresult r;

	(void)flags; /* lazy peer enablement: access comes from the peer mirror */
	if (!pdptr)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&ih, handle.reserved, sizeof(ih));
	if (ih.magic != IPC_MAGIC) {
		pr_err("cuIpcOpenMemHandle: refusing a native IPC handle (not made by cuinterpose; run the "
		       "exporting process under cuinterpose too): its memory could not be checkpointed");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (ih.version != IPC_VERSION || !ih.size || ih.requested > ih.size || ih.flags || ih.reserved) {
		pr_err("cuIpcOpenMemHandle: malformed cuinterpose IPC handle (version %u, size %llu, requested %llu)",
		       ih.version, (unsigned long long)ih.size, (unsigned long long)ih.requested);
		return CUDA_ERROR_INVALID_VALUE;
	}
	r = rl.getdev(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	cuip_start();
	if (ih.creator == self.id)
		return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: no IPC open in the exporting process */
	pthread_mutex_lock(&ipc_mu);
	pthread_mutex_lock(&cuip_state_lock);
	a = cuip_alloc_by_id(ih.creator, ih.serial);
	if (a && a->ipc_opens) {
		a->ipc_opens++;
		*pdptr = a->ipc_va;
		pthread_mutex_unlock(&cuip_state_lock);
		pthread_mutex_unlock(&ipc_mu);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&cuip_state_lock);
	r = ipc_open_first(&ih, dev, pdptr);
	pthread_mutex_unlock(&ipc_mu);
	return r;
}

CUIP_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	CUresult r = enter(&rl.getdev);

	if (r != CUDA_SUCCESS)
		return r;
	r = ipc_open(pdptr, handle, Flags);
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUIP_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	struct cuip_alloc *a;
	bool dead = false;
	CUresult r = enter(&rl.getdev);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&ipc_mu);
	pthread_mutex_lock(&cuip_state_lock);
	m = legacy_at(dptr);
	if (!m || m->a->ipc_va != dptr || !m->a->ipc_opens) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto unlock;
	}
	a = m->a;
	if (--a->ipc_opens)
		goto unlock;
	pthread_mutex_unlock(&cuip_state_lock);
	real.cuCtxSynchronize(); /* as the driver: work using it completes first */
	pthread_mutex_lock(&cuip_state_lock);
	cuip_map_take(dptr);
	map_gone(m->va, m->size);
	cuip_map_free(m);
	a->ipc_va = 0;
	dead = cuip_alloc_unlink_if_dead(a);
unlock:
	pthread_mutex_unlock(&cuip_state_lock);
	pthread_mutex_unlock(&ipc_mu);
	if (dead)
		cuip_alloc_release(a);
	cuip_gate_exit();
	return r;
}
