/*
 * cuip.h - the base header of libcuinterpose.so, the LD_PRELOAD half of
 * cuinterpose: what every module needs and nothing that names a module
 * above the base. The CUDA declarations cuda.h lacks, the export and
 * no-sanitize markers, and the log (log.h). The API gate is gate.h's.
 *
 * The modules, by folder (interposer/README.md; test/unit/layering.sh,
 * run by `make check`, fails on any call or include cycle between them, on
 * an arrow to a folder above, and on one between kinds/ and checkpoint/,
 * and prints the exact floors); each has its own header and names its
 * lock in its opening comment:
 *
 *   core/       log.c (log.h), driver.c (the real driver entry points),
 *               gate.c (the API gate and the lifecycle phase, gate.h),
 *               launch.c (launches through the gate), reply.c (the op
 *               thread's reply arena), runtime.c (identity, devices, start,
 *               fork hooks), thread.c (named threads, deadlines, the
 *               worker), qtable.c (logical handles), record.c (records,
 *               mappings, access, cuip_state_lock, kind extensions, the
 *               detach primitive), ticket.c, xcache.c (the export cache),
 *               ctx.c (contexts and their stacks); slice.h
 *   kinds/      vmm.c (unicast VMM), ipc.c (cuMemAlloc, cuIpc*), peer.c,
 *               multicast.c, pool.c: each its part of a record and its
 *               checkpoint slice
 *   checkpoint/ ops.c (the phase machine over the slices), inspect.c (the
 *               ProcessState), carry.c (the carried bytes, through
 *               carrier/), drain.c, release.c (what QUIESCE runs)
 *   entry/      control.c (control socket), lifecycle.c (starts control,
 *               stops it at exit), resolve.c (every resolution path to the
 *               wrappers)
 *   from protocol/: client.c, importers.c, wire.c; from carrier/: stripe.c,
 *   config.c
 *
 * Locks, outermost first: cuip_state_lock (record.c), xc_lock (xcache.c),
 * the gate's lock (gate.c). The control thread takes only xc_lock, never
 * cuip_state_lock, and never calls the driver.
 */
#ifndef CUIP_INTERNAL_H
#define CUIP_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <cuda.h>

#include "log.h"
#include "wire.h"

/* cuda.h maps cuGetProcAddress to _v2; the 4-argument ELF symbol is ours too. */
#undef cuGetProcAddress

#define CUIP_API __attribute__((visibility("default")))
/* Code that sanitizer runtimes reach before they are initialized (their
 * interceptors resolve libc through our dlsym) must not be instrumented. */
#define CUIP_NOSAN __attribute__((no_sanitize_address, no_sanitize("undefined")))

/* CUDA 13.1 device-explicit multicast binds; the 13.0 cuda.h lacks them. */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);
/* The pre-12.0 four-argument form, still exported by the driver. */
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
/* cuda.h maps cuIpcOpenMemHandle to _v2; the old ELF symbol is ours too. */
#undef cuIpcOpenMemHandle
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult CUDAAPI cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					  CUdriverProcAddressQueryResult *symbolStatus);

/* Per-thread-default-stream pool entry points (cuda.h declares them only in that mode). */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* The context-creation forms cuda.h no longer declares by these names. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
				CUdevice dev);

#endif /* CUIP_INTERNAL_H */
