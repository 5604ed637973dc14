/*
 * driver.h - the real CUDA driver (driver.c): the one table of every driver
 * entry point the interposer calls, resolved once from libcuda.so.1, and
 * the real dlsym. Base layer: driver.c calls only the log. The table is
 * written once under pthread_once and read-only afterwards; no lock. A
 * NULL member: this driver does not export that entry point.
 */
#ifndef CUIP_DRIVER_H
#define CUIP_DRIVER_H

#include "cuip.h"
#include "launchlist.h"

/* Every driver entry point the interposer itself calls. */
#define CUIP_REAL_FUNCS(X)                        \
	X(cuInit)                                 \
	X(cuDriverGetVersion)                     \
	X(cuDeviceGet)                            \
	X(cuDeviceGetCount)                       \
	X(cuDeviceGetUuid_v2)                     \
	X(cuDeviceGetName)                        \
	X(cuDevicePrimaryCtxRetain)               \
	X(cuDevicePrimaryCtxRelease_v2)           \
	X(cuDevicePrimaryCtxGetState)             \
	X(cuCtxGetCurrent)                        \
	X(cuCtxSetCurrent)                        \
	X(cuCtxSynchronize)                       \
	X(cuCtxGetLimit)                          \
	X(cuCtxSetLimit)                          \
	X(cuMemGetInfo_v2)                        \
	X(cuMemCreate)                            \
	X(cuMemRelease)                           \
	X(cuMemRetainAllocationHandle)            \
	X(cuMemMap)                               \
	X(cuMemUnmap)                             \
	X(cuMemSetAccess)                         \
	X(cuMemExportToShareableHandle)           \
	X(cuMemImportFromShareableHandle)         \
	X(cuMemGetAllocationPropertiesFromHandle) \
	X(cuMemAddressReserve)                    \
	X(cuMemAddressFree)                       \
	X(cuMemcpyDtoH_v2)                        \
	X(cuMemcpyHtoD_v2)                        \
	X(cuMemcpyDtoHAsync_v2)                   \
	X(cuMemcpyHtoDAsync_v2)                   \
	X(cuMemHostAlloc)                         \
	X(cuMemFreeHost)                          \
	X(cuStreamCreate)                         \
	X(cuStreamDestroy_v2)                     \
	X(cuStreamSynchronize)                    \
	X(cuGetErrorString)                       \
	X(cuMulticastCreate)                      \
	X(cuMulticastAddDevice)                   \
	X(cuMulticastUnbind)                      \
	X(cuMulticastBindMem)                     \
	X(cuMulticastBindAddr)                    \
	X(cuMulticastBindMem_v2)                  \
	X(cuMulticastBindAddr_v2)                 \
	X(cuGetProcAddress)                       \
	X(cuGetProcAddress_v2)                    \
	X(cuCtxCreate_v2)                         \
	X(cuCtxCreate_v3)                         \
	X(cuCtxCreate_v4)                         \
	X(cuCtxDestroy_v2)                        \
	X(cuCtxGetDevice)                         \
	X(cuCtxPushCurrent_v2)                    \
	X(cuCtxPopCurrent_v2)                     \
	X(cuCtxEnablePeerAccess)                  \
	X(cuCtxDisablePeerAccess)                 \
	X(cuMemAlloc_v2)                          \
	X(cuMemFree_v2)                           \
	X(cuMemGetAddressRange_v2)                \
	X(cuMemGetAllocationGranularity)          \
	X(cuIpcGetMemHandle)                      \
	X(cuMemPoolCreate)                        \
	X(cuMemPoolDestroy)                       \
	X(cuMemPoolExportToShareableHandle)       \
	X(cuMemPoolImportFromShareableHandle)     \
	X(cuMemPoolExportPointer)                 \
	X(cuMemPoolImportPointer)                 \
	X(cuDeviceSetMemPool)                     \
	X(cuMemAllocAsync)                        \
	X(cuMemAllocAsync_ptsz)                   \
	X(cuMemAllocFromPoolAsync)                \
	X(cuMemAllocFromPoolAsync_ptsz)           \
	X(cuMemFreeAsync)                         \
	X(cuMemFreeAsync_ptsz)                    \
	X(cuMemPoolGetAttribute)                  \
	X(cuMemPoolTrimTo)                        \
	X(cuDeviceGetDefaultMemPool)              \
	X(cuDeviceGetMemPool)

struct cuip_real {
#define X(name) __typeof__(&name) name;
	CUIP_REAL_FUNCS(X)
#undef X
	void *cuGetProcAddress_v2_ptsz; /* not always exported */
	struct {			/* the launch-class entry points (launch.c) */
#define L(name, base, ver, ptds, params, args) CUresult(CUDAAPI *name) params;
		CUIP_LAUNCH_LIST(L)
#undef L
	} launch;
};

extern struct cuip_real real;
/* Resolve the real driver once; 0 or -ENOENT (no libcuda.so.1). Inline:
 * once loaded, one load of a read-mostly flag (acquire: the table was
 * written before it), no pthread_once call into libc per wrapper. */
extern _Atomic int cuip_driver_loaded;
int cuip_driver_load(void);
static inline int cuip_driver_init(void)
{
	if (__builtin_expect(atomic_load_explicit(&cuip_driver_loaded, memory_order_acquire), 1))
		return 0;
	return cuip_driver_load();
}
CUIP_NOSAN void *cuip_real_dlsym(void *handle, const char *name);
void *cuip_driver_handle(void);
const char *cuip_cuerr(CUresult r);

#endif /* CUIP_DRIVER_H */
