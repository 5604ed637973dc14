/*
 * cuGetProcAddress / cuGetProcAddress_v2: the fake's own entry points by base
 * name and CUDA version, as the real driver resolves them (the highest ABI
 * version not newer than the requested cudaVersion).  Per-thread-default-
 * stream variants are not modelled: CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * returns the same (legacy-stream) entry point.  Constant table, no lock;
 * works before cuInit, as on the real driver.
 */
#include <string.h>

#include "fake.h"

struct entry {
	const char *name;
	int version;
	void *fn;
};

#define E(n, v, f)                \
	{                         \
		n, v, (void *)(f) \
	}

static const struct entry table[] = {
	E("cuInit", 2000, cuInit),
	E("cuDriverGetVersion", 2020, cuDriverGetVersion),
	E("cuGetErrorName", 6000, cuGetErrorName),
	E("cuGetErrorString", 6000, cuGetErrorString),
	E("cuGetProcAddress", 11030, cuGetProcAddress_v1),
	E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
	E("cuDeviceGet", 2000, cuDeviceGet),
	E("cuDeviceGetCount", 2000, cuDeviceGetCount),
	E("cuDeviceGetName", 2000, cuDeviceGetName),
	E("cuDeviceGetUuid", 9020, cuDeviceGetUuid_v1),
	E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
	E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	E("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease_v1),
	E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	E("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset_v1),
	E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
	E("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags_v1),
	E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
	E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
	E("cuCtxCreate", 3020, cuCtxCreate_v2),
	E("cuCtxCreate", 11040, cuCtxCreate_v3),
	E("cuCtxCreate", 12050, cuCtxCreate_v4),
	E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	E("cuCtxGetDevice", 2000, cuCtxGetDevice),
	E("cuCtxSynchronize", 2000, cuCtxSynchronize),
	E("cuCtxGetLimit", 3010, cuCtxGetLimit),
	E("cuCtxSetLimit", 3010, cuCtxSetLimit),
	E("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
	E("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
	E("cuStreamCreate", 2000, cuStreamCreate),
	E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
	E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	E("cuStreamSynchronize", 2000, cuStreamSynchronize),
	E("cuStreamQuery", 2000, cuStreamQuery),
	E("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
	E("cuEventCreate", 2000, cuEventCreate),
	E("cuEventRecord", 2000, cuEventRecord),
	E("cuEventSynchronize", 2000, cuEventSynchronize),
	E("cuEventQuery", 2000, cuEventQuery),
	E("cuEventDestroy", 4000, cuEventDestroy_v2),
	E("cuEventElapsedTime", 2000, cuEventElapsedTime_v1),
	E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
	E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	E("cuMemAlloc", 3020, cuMemAlloc_v2),
	E("cuMemFree", 3020, cuMemFree_v2),
	E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
	E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
	E("cuMemFreeHost", 2000, cuMemFreeHost),
	E("cuMemHostAlloc", 2020, cuMemHostAlloc),
	E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
	E("cuMemHostUnregister", 4000, cuMemHostUnregister),
	E("cuMemcpy", 4000, cuMemcpy),
	E("cuMemcpyAsync", 4000, cuMemcpyAsync),
	E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
	E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
	E("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
	E("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
	E("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
	E("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2),
	E("cuMemcpyPeer", 4000, cuMemcpyPeer),
	E("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
	E("cuMemsetD8", 3020, cuMemsetD8_v2),
	E("cuMemsetD16", 3020, cuMemsetD16_v2),
	E("cuMemsetD32", 3020, cuMemsetD32_v2),
	E("cuMemsetD8Async", 3020, cuMemsetD8Async),
	E("cuMemsetD16Async", 3020, cuMemsetD16Async),
	E("cuMemsetD32Async", 3020, cuMemsetD32Async),
	E("cuMemCreate", 10020, cuMemCreate),
	E("cuMemRelease", 10020, cuMemRelease),
	E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
	E("cuMemAddressReserve", 10020, cuMemAddressReserve),
	E("cuMemAddressFree", 10020, cuMemAddressFree),
	E("cuMemMap", 10020, cuMemMap),
	E("cuMemUnmap", 10020, cuMemUnmap),
	E("cuMemSetAccess", 10020, cuMemSetAccess),
	E("cuMemGetAccess", 10020, cuMemGetAccess),
	E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	E("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
	E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
	E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
	E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
	E("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle_v1),
	E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
	E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
	E("cuMulticastCreate", 12010, cuMulticastCreate),
	E("cuMulticastAddDevice", 12010, cuMulticastAddDevice),
	E("cuMulticastBindMem", 12010, cuMulticastBindMem),
	E("cuMulticastBindMem", 13010, cuMulticastBindMem_v2),
	E("cuMulticastBindAddr", 12010, cuMulticastBindAddr),
	E("cuMulticastBindAddr", 13010, cuMulticastBindAddr_v2),
	E("cuMulticastUnbind", 12010, cuMulticastUnbind),
	E("cuMulticastGetGranularity", 12010, cuMulticastGetGranularity),
	E("cuMemPoolCreate", 11020, cuMemPoolCreate),
	E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
	E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
	E("cuMemPoolSetAccess", 11020, cuMemPoolSetAccess),
	E("cuMemPoolGetAccess", 11020, cuMemPoolGetAccess),
	E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
	E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
	E("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
	E("cuMemAllocAsync", 11020, cuMemAllocAsync),
	E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
	E("cuMemFreeAsync", 11020, cuMemFreeAsync),
	E("cuMemPoolExportToShareableHandle", 11020, cuMemPoolExportToShareableHandle),
	E("cuMemPoolImportFromShareableHandle", 11020, cuMemPoolImportFromShareableHandle),
	E("cuMemPoolExportPointer", 11020, cuMemPoolExportPointer),
	E("cuMemPoolImportPointer", 11020, cuMemPoolImportPointer),
	E("cuModuleLoad", 2000, cuModuleLoad),
	E("cuModuleLoadData", 2000, cuModuleLoadData),
	E("cuModuleUnload", 2000, cuModuleUnload),
	E("cuModuleGetFunction", 2000, cuModuleGetFunction),
	E("cuLaunchKernel", 4000, cuLaunchKernel),
	E("cuCheckpointProcessGetRestoreThreadId", 12080, cuCheckpointProcessGetRestoreThreadId),
	E("cuCheckpointProcessGetState", 12080, cuCheckpointProcessGetState),
	E("cuCheckpointProcessLock", 12080, cuCheckpointProcessLock),
	E("cuCheckpointProcessCheckpoint", 12080, cuCheckpointProcessCheckpoint),
	E("cuCheckpointProcessRestore", 12080, cuCheckpointProcessRestore),
	E("cuCheckpointProcessUnlock", 12080, cuCheckpointProcessUnlock),
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct entry *best = NULL;
	int named = 0;
	CUresult r;

	faults_init();
	r = faults_check("cuGetProcAddress");
	if (r)
		return r;
	if (!symbol || !pfn || (flags & ~(cuuint64_t)3))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		if (strcmp(table[i].name, symbol))
			continue;
		named = 1;
		if (table[i].version <= version && (!best || table[i].version > best->version))
			best = &table[i];
	}
	*pfn = best ? best->fn : NULL;
	if (status)
		*status = best	  ? CU_GET_PROC_ADDRESS_SUCCESS
			  : named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				  : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FK_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					    CUdriverProcAddressQueryResult *symbolStatus)
{
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FK_API CUresult CUDAAPI cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	return lookup(symbol, pfn, cudaVersion, flags, NULL);
}
