/*
 * resolve.c - every way an application can reach a driver entry point leads
 * to our wrapper when we replace it: direct ELF symbols (we are preloaded),
 * dlsym on any handle (libcuda, libcudart, RTLD_DEFAULT/NEXT), the driver's
 * cuGetProcAddress family and the runtime's cudaGetDriverEntryPoint family.
 *
 * Rule for the lookup APIs: forward the call unchanged; only when it
 * succeeded with a non-NULL pointer, replace that pointer by our wrapper of
 * the same ABI variant. The variant is identified by the address the driver
 * returned (so a version-selected _v2 or _ptsz is matched exactly); only an
 * address we do not know falls back to a by-name, by-version rule among
 * variants the driver actually exports. A failed lookup stays a failure and
 * its outputs are untouched.
 *
 * The table is immutable after driver init (pthread_once); no lock.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "cuip.h"
#include "driver.h"
#include "launchlist.h"
#include "resolve.h"

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
				CUdevice dev);

struct entry {
	const char *name; /* ELF symbol */
	const char *base; /* name as passed to cuGetProcAddress */
	int minver;	  /* first CUDA version that selects this variant */
	bool ptds;	  /* per-thread default stream variant */
	void *ours;
	void *real; /* filled from libcuda at init */
};

#define E(sym, b, ver, p)                           \
	{                                           \
#sym, b, ver, p, (void *)&sym, NULL \
	}
#define L(name, base, ver, ptds, params, args) E(name, base, ver, ptds),

static struct entry table[] = {
	E(cuInit, "cuInit", 2000, false),
	E(cuMemCreate, "cuMemCreate", 10020, false),
	E(cuMemRelease, "cuMemRelease", 10020, false),
	E(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, false),
	E(cuMemMap, "cuMemMap", 10020, false),
	E(cuMemUnmap, "cuMemUnmap", 10020, false),
	E(cuMemSetAccess, "cuMemSetAccess", 10020, false),
	E(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, false),
	E(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, false),
	E(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", 10020, false),
	E(cuMulticastCreate, "cuMulticastCreate", 12010, false),
	E(cuMulticastAddDevice, "cuMulticastAddDevice", 12010, false),
	E(cuMulticastUnbind, "cuMulticastUnbind", 12010, false),
	E(cuMulticastBindMem, "cuMulticastBindMem", 12010, false),
	E(cuMulticastBindMem_v2, "cuMulticastBindMem", 13010, false),
	E(cuMulticastBindAddr, "cuMulticastBindAddr", 12010, false),
	E(cuMulticastBindAddr_v2, "cuMulticastBindAddr", 13010, false),
	E(cuCtxCreate_v2, "cuCtxCreate", 3020, false),
	E(cuCtxCreate_v3, "cuCtxCreate", 11040, false),
	E(cuCtxCreate_v4, "cuCtxCreate", 12050, false),
	E(cuCtxDestroy_v2, "cuCtxDestroy", 4000, false),
	E(cuMemAlloc_v2, "cuMemAlloc", 3020, false),
	E(cuMemFree_v2, "cuMemFree", 3020, false),
	E(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 3020, false),
	E(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, false),
	E(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, false),
	E(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, false),
	E(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, false),
	E(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, false),
	E(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess", 4000, false),
	E(cuMemPoolCreate, "cuMemPoolCreate", 11020, false),
	E(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, false),
	E(cuMemPoolExportToShareableHandle, "cuMemPoolExportToShareableHandle", 11020, false),
	E(cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle", 11020, false),
	E(cuMemPoolExportPointer, "cuMemPoolExportPointer", 11020, false),
	E(cuMemPoolImportPointer, "cuMemPoolImportPointer", 11020, false),
	E(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, false),
	E(cuMemAllocAsync, "cuMemAllocAsync", 11020, false),
	E(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true),
	E(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false),
	E(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true),
	E(cuMemFreeAsync, "cuMemFreeAsync", 11020, false),
	E(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true),
	E(cuGetProcAddress, "cuGetProcAddress", 11030, false),
	E(cuGetProcAddress_v2, "cuGetProcAddress", 12000, false),
	E(cuGetProcAddress_v2_ptsz, "cuGetProcAddress", 12000, true),
	CUIP_LAUNCH_LIST(L)};
#undef L
#define NTABLE (sizeof(table) / sizeof(table[0]))

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

CUIP_NOSAN static struct entry *by_name(const char *name)
{
	for (size_t i = 0; i < NTABLE; i++)
		if (!strcmp(table[i].name, name))
			return &table[i];
	return NULL;
}

static void table_init(void)
{
	void *h;

	if (cuip_driver_init())
		return;
	h = cuip_driver_handle();
	for (size_t i = 0; i < NTABLE; i++)
		table[i].real = cuip_real_dlsym(h, table[i].name);
	/* cuGetProcAddress_v2_ptsz is an inline in cuda.h that drivers need
	 * not export; we emulate it over _v2, so it exists whenever _v2 does.
	 * (_v2 comes first in the table, so address matching is unaffected.) */
	struct entry *e = by_name("cuGetProcAddress_v2_ptsz");
	if (!e->real)
		e->real = (void *)real.cuGetProcAddress_v2;
}

static bool is_ours(void *p)
{
	for (size_t i = 0; i < NTABLE; i++)
		if (table[i].ours == p)
			return true;
	return false;
}

void cuip_substitute(const char *symbol, int version, cuuint64_t flags, void **pfn)
{
	struct entry *best = NULL;
	bool want_ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	pthread_once(&table_once, table_init);
	if (!pfn || !*pfn || !symbol)
		return;
	for (size_t i = 0; i < NTABLE; i++) {
		if (table[i].real && table[i].real == *pfn) {
			*pfn = table[i].ours;
			return;
		}
	}
	if (is_ours(*pfn))
		return;
	/* An address we do not know (an internal entry of the driver): pick
	 * by version among the variants the driver exports. */
	for (size_t i = 0; i < NTABLE; i++) {
		struct entry *e = &table[i];
		if (!e->real || strcmp(e->base, symbol) || e->minver > version)
			continue;
		if (!best || e->minver > best->minver || (e->minver == best->minver && e->ptds == want_ptds))
			best = e;
	}
	if (best) {
		pr_debug("%s (version %d): driver returned an unknown address, using our %s", symbol, version,
			 best->name);
		*pfn = best->ours;
	}
}

/* ---- the driver's lookup functions -------------------------------------- */

CUIP_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	CUresult r;

	if (cuip_driver_init() || !real.cuGetProcAddress)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS)
		cuip_substitute(symbol, cudaVersion, flags, pfn);
	return r;
}

CUIP_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					      CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult r;

	if (cuip_driver_init() || !real.cuGetProcAddress_v2)
		return CUDA_ERROR_NOT_FOUND;
	r = real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS)
		cuip_substitute(symbol, cudaVersion, flags, pfn);
	return r;
}

CUIP_API CUresult CUDAAPI cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
						   CUdriverProcAddressQueryResult *symbolStatus)
{
	const cuuint64_t mask = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	CUresult r;

	if (cuip_driver_init())
		return CUDA_ERROR_NOT_FOUND;
	if (real.cuGetProcAddress_v2_ptsz) {
		r = ((__typeof__(&cuGetProcAddress_v2))real.cuGetProcAddress_v2_ptsz)(symbol, pfn, cudaVersion, flags,
										      symbolStatus);
	} else {
		/* cuda.h's inline form: per-thread default stream unless asked otherwise. */
		if (!real.cuGetProcAddress_v2)
			return CUDA_ERROR_NOT_FOUND;
		if (!(flags & mask))
			flags |= CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
		r = real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
	}
	if (r == CUDA_SUCCESS)
		cuip_substitute(symbol, cudaVersion,
				flags | (flags & mask ? 0 : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), pfn);
	return r;
}

/* ---- the runtime's lookup functions (libcudart, found at run time) ------ */

enum { RT_EP, RT_EP_PTSZ, RT_EPV, RT_EPV_PTSZ, RT_N };
static const char *const rt_names[RT_N] = {"cudaGetDriverEntryPoint", "cudaGetDriverEntryPoint_ptsz",
					   "cudaGetDriverEntryPointByVersion", "cudaGetDriverEntryPointByVersion_ptsz"};
static _Atomic(void *) rt_real[RT_N];

typedef int (*rt_ep_fn)(const char *, void **, unsigned long long, int *);
typedef int (*rt_epv_fn)(const char *, void **, unsigned int, unsigned long long, int *);

CUIP_API int cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags, int *driverStatus);
CUIP_API int cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
					  int *driverStatus);
CUIP_API int cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
					      unsigned long long flags, int *driverStatus);
CUIP_API int cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion,
						   unsigned long long flags, int *driverStatus);

static void *const rt_ours[RT_N] = {(void *)&cudaGetDriverEntryPoint, (void *)&cudaGetDriverEntryPoint_ptsz,
				    (void *)&cudaGetDriverEntryPointByVersion,
				    (void *)&cudaGetDriverEntryPointByVersion_ptsz};

#define CUDART_ERROR_NOT_SUPPORTED 801

static void *rt_get(int i)
{
	void *p = atomic_load(&rt_real[i]);

	if (!p) {
		p = cuip_real_dlsym(RTLD_NEXT, rt_names[i]);
		if (p && p != rt_ours[i])
			atomic_store(&rt_real[i], p);
		else
			p = NULL;
	}
	return p;
}

static int driver_version(void)
{
	int v = 0;

	if (cuip_driver_init() || !real.cuDriverGetVersion || real.cuDriverGetVersion(&v) != CUDA_SUCCESS)
		return INT_MAX;
	return v;
}

static int rt_ep(int i, const char *symbol, void **funcPtr, unsigned long long flags, int *driverStatus)
{
	rt_ep_fn f = (rt_ep_fn)rt_get(i);
	int r;

	if (!f)
		return CUDART_ERROR_NOT_SUPPORTED;
	r = f(symbol, funcPtr, flags, driverStatus);
	if (r == 0)
		cuip_substitute(symbol, driver_version(),
				flags | (i == RT_EP_PTSZ ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0), funcPtr);
	return r;
}

static int rt_epv(int i, const char *symbol, void **funcPtr, unsigned int ver, unsigned long long flags,
		  int *driverStatus)
{
	rt_epv_fn f = (rt_epv_fn)rt_get(i);
	int r;

	if (!f)
		return CUDART_ERROR_NOT_SUPPORTED;
	r = f(symbol, funcPtr, ver, flags, driverStatus);
	if (r == 0)
		cuip_substitute(symbol, (int)ver,
				flags | (i == RT_EPV_PTSZ ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0),
				funcPtr);
	return r;
}

CUIP_API int cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags, int *driverStatus)
{
	return rt_ep(RT_EP, symbol, funcPtr, flags, driverStatus);
}

CUIP_API int cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
					  int *driverStatus)
{
	return rt_ep(RT_EP_PTSZ, symbol, funcPtr, flags, driverStatus);
}

CUIP_API int cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
					      unsigned long long flags, int *driverStatus)
{
	return rt_epv(RT_EPV, symbol, funcPtr, cudaVersion, flags, driverStatus);
}

CUIP_API int cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion,
						   unsigned long long flags, int *driverStatus)
{
	return rt_epv(RT_EPV_PTSZ, symbol, funcPtr, cudaVersion, flags, driverStatus);
}

/* ---- dlsym --------------------------------------------------------------- */

CUIP_API CUIP_NOSAN void *dlsym(void *handle, const char *name)
{
	void *p = cuip_real_dlsym(handle, name);

	if (!p || name[0] != 'c' || name[1] != 'u')
		return p;
	if (!strncmp(name, "cudaGetDriverEntryPoint", 23)) {
		for (int i = 0; i < RT_N; i++) {
			if (strcmp(name, rt_names[i]))
				continue;
			if (p != rt_ours[i]) {
				void *expect = NULL;
				atomic_compare_exchange_strong(&rt_real[i], &expect, p);
				p = rt_ours[i];
			}
		}
		return p;
	}
	struct entry *e = by_name(name);
	if (!e)
		return p;
	pthread_once(&table_once, table_init);
	if (!e->real)
		return NULL; /* the driver lacks it: so do we */
	if (p == e->real)
		p = e->ours;
	return p;
}
