/*
 * cuip.h - the base header of libcuinterpose.so, the LD_PRELOAD half of
 * cuinterpose: what every module needs and nothing that names a module
 * above the base. The CUDA declarations cuda.h lacks, the export and
 * no-sanitize markers, the log (log.h) and the API gate (gate.c).
 *
 * The modules, by folder (interposer/README.md; test/unit/layering.sh,
 * run by `make check`, fails on any call or include cycle between them, on
 * an arrow to a folder above, and on one between kinds/ and checkpoint/,
 * and prints the exact floors); each has its own header and names its
 * lock in its opening comment:
 *
 *   core/       log.c (log.h), driver.c (the real driver entry points),
 *               gate.c (the API gate and the lifecycle phase, here),
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
 *   from protocol/: client.c, importers.c, wire.c; from carrier/: carrier.c
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

/* ---- the API gate and the lifecycle phase (gate.c) ------------------------ */

/* Enter a gated (tracked or launch-class) call; CUDA_SUCCESS or NOT_READY.
 * The open-gate path is inline in every wrapper (no call, no PLT): the
 * calling thread's slot in initial-exec TLS and one read-mostly cache line
 * of flags; everything else (first call of a thread, closed gate, fence
 * mode, wake-ups) is gate.c's slow path. The protocol is gate.c's. */
struct cuip_gate_slot {
	atomic_long depth; /* written by its thread only */
	struct cuip_gate_slot *prev, *next;
	bool registered;
};
struct cuip_gate_flags {
	atomic_int open;	/* 0 while a checkpoint holds the gate closed */
	bool fence;		/* no membarrier: entering threads fence (set once) */
} __attribute__((aligned(64))); /* a line of its own: no false sharing */
extern __thread struct cuip_gate_slot cuip_gate_me __attribute__((tls_model("initial-exec")));
extern struct cuip_gate_flags cuip_gate_flags; /* alone in its cache line */
CUresult cuip_gate_enter_slow(void);
void cuip_gate_exit_slow(void);

static inline bool cuip_gate_open_after_store(void)
{
	if (__builtin_expect(cuip_gate_flags.fence, 0))
		atomic_thread_fence(memory_order_seq_cst);
	else
		atomic_signal_fence(memory_order_seq_cst); /* the compiler keeps the order */
	return atomic_load_explicit(&cuip_gate_flags.open, memory_order_relaxed);
}

static inline CUresult cuip_gate_enter(void)
{
	struct cuip_gate_slot *s = &cuip_gate_me;

	if (__builtin_expect(s->registered, 1)) {
		long v = atomic_load_explicit(&s->depth, memory_order_relaxed);

		/* relaxed: the order comes from the closer's barrier (gate.c) */
		atomic_store_explicit(&s->depth, v + 1, memory_order_relaxed);
		if (__builtin_expect(cuip_gate_open_after_store(), 1)) {
			atomic_thread_fence(memory_order_acquire); /* pairs with cuip_gate_open */
			return CUDA_SUCCESS;
		}
		atomic_store_explicit(&s->depth, v, memory_order_release);
	}
	return cuip_gate_enter_slow(); /* registers, or waits for the gate */
}

static inline void cuip_gate_exit(void)
{
	struct cuip_gate_slot *s = &cuip_gate_me;

	/* release: the call's work happens before a closer reading 0 */
	atomic_store_explicit(&s->depth, atomic_load_explicit(&s->depth, memory_order_relaxed) - 1,
			      memory_order_release);
	if (__builtin_expect(!cuip_gate_open_after_store(), 0))
		cuip_gate_exit_slow(); /* wake the closer */
}
/* Close the gate and wait up to timeout_ms for in-flight calls: 0, or
 * -ETIMEDOUT or -EIO (membarrier failed) with the gate reopened. */
int cuip_gate_close(unsigned timeout_ms);
void cuip_gate_open(void);
void cuip_gate_prepare(void); /* process start: the slow one-time set-up */
Cuip__Phase cuip_phase(void);
void cuip_set_phase(Cuip__Phase p);
void cuip_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cuip_failure(void);
uint64_t cuip_gate_waits(void);
void cuip_gate_reset(void); /* fork child */

#endif /* CUIP_INTERNAL_H */
