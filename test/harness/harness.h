/*
 * harness.h - the one harness of the Check test suites that run programs on
 * the fake CUDA driver: the fake driver's own tests (test/fakecuda/tests),
 * the interposer's (test/interposer, which adds its control-socket helpers
 * in test/interposer/harness.h) and the carrier's against the fake
 * (test/carrier/test_fake.c).  It gives a private fakecuda-devd per test
 * case (own socket, own device configuration), CUresult assertions, a
 * context, VMM allocations mapped read-write, patterns in host and device
 * memory, child processes forked before the test's own cuInit with a socket
 * to the parent, descriptor passing, and accounting of descriptors, device
 * memory and resident memory that waits, bounded, for asynchronous releases
 * to settle.  Built with the workload library (test/workloads/wl.c), whose
 * descriptor passing it uses.  Test code, single-threaded unless a test
 * says otherwise: no locks.
 */
#ifndef CUIP_TEST_HARNESS_H
#define CUIP_TEST_HARNESS_H

#include <check.h>
#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "waitchild.h"

#define MiB (1ul << 20)

/* CUDA 13.1 device-explicit binds: not in the 13.0 cuda.h, so declared here as an application would. */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);

const char *h_name(CUresult r);

#define CK(x)                                                                                \
	do {                                                                                 \
		CUresult r_ = (x);                                                           \
		ck_assert_msg(r_ == CUDA_SUCCESS, "%s -> %s (%d)", #x, h_name(r_), (int)r_); \
	} while (0)
#define CK_ERR(x, want)                                                                             \
	do {                                                                                        \
		CUresult r_ = (x);                                                                  \
		ck_assert_msg(r_ == (want), "%s -> %s, expected %s", #x, h_name(r_), h_name(want)); \
	} while (0)

/* Run the suites (a NULL-terminated list) in one runner: 0 if every test passed, else 1. */
int h_run(Suite *first, ...);

/* Monotonic milliseconds. */
int64_t h_now_ms(void);

/* ---- the fake device service -------------------------------------------- */

/* Starts a private devd with extra environment ("K=V K=V", may be NULL); sets FAKECUDA_SOCKET. */
void h_devd_start(const char *env);
void h_devd_stop(void);
/* Unchecked fixtures for the common configurations. */
void h_devd1(void);
void h_devd2(void);
/* devd's pid (from SOCKET.pid), -1 if none. */
pid_t h_devd_pid(void);
/* Bytes allocated in devd's arena of device 0 (its memfd, through /proc/DEVD/fd). */
long long h_arena_bytes(void);

/* ---- the driver ---------------------------------------------------------- */

/* cuInit, device ord, its primary context made current (returned). */
CUcontext h_init(int ord);
/* The minimum granularity of POSIX-capable memory on device 0. */
size_t h_gran(void);
CUmemAllocationProp h_prop(int ord, unsigned types);
/* A VMM allocation of size on dev (POSIX-exportable or handle type 0). */
CUmemGenericAllocationHandle h_vmm_create(size_t size, int dev, int posix);
/* h mapped read-write for dev at a fresh reservation. */
CUdeviceptr h_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev);
/* Create (POSIX) on the device of h_init, map read-write; returns the VA. */
CUdeviceptr h_create_map(size_t size, CUmemGenericAllocationHandle *h);
void h_unmap_release(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
int h_export(CUmemGenericAllocationHandle h);
/* A kernel of the fake's module (any image loads). */
CUfunction h_kernel(const char *name);
size_t h_free_mem(void);

/* ---- patterns ------------------------------------------------------------ */

/* n words derived from seed in host memory, and their check (1: intact). */
void h_pattern(uint32_t *p, size_t n, uint32_t seed);
int h_pattern_ok(const uint32_t *p, size_t n, uint32_t seed);
/* The same pattern written to, and checked in, size bytes of device memory. */
void h_fill(CUdeviceptr va, size_t size, uint32_t seed);
bool h_check(CUdeviceptr va, size_t size, uint32_t seed);

/* ---- processes and descriptors ------------------------------------------- */

/* Fork a child that runs fn(arg, sock) before any CUDA use and exits with its
 * return value; returns the pid, *sock is the parent's end (close-on-exec). */
pid_t h_fork(int (*fn)(void *arg, int sock), void *arg, int *sock);
/* The child's exit status (128 + signal if killed), -1 if it is no child;
 * a child still running after H_WAIT_MS is killed: WAITCHILD_TIMEOUT. */
#define H_WAIT_MS 60000
int h_wait(pid_t pid);
/* Send len bytes with descriptor fd (none if fd < 0): 0 or -1. */
int h_send_fd(int sock, int fd, const void *buf, size_t len);
/* Receive len bytes: the descriptor that came with them, -1 if none, -2 if the bytes did not come. */
int h_recv_fd(int sock, void *buf, size_t len);
int h_send(int sock, const void *buf, size_t len);
int h_recv(int sock, void *buf, size_t len);

/* ---- accounting ---------------------------------------------------------- */

int h_is_root(void);
/* Is this an ASan build (the runtime is loaded)? */
bool h_asan(void);
/* Descriptors of this process. */
int h_nfds(void);
/* Descriptors of pid whose link contains `like` (all if NULL); with bytes,
 * the allocated size of the (last) matching file. -1: no such process.
 * pid 0: this process. */
int h_fds_like(pid_t pid, const char *like, long long *bytes);
int h_count_fds(pid_t pid);
long h_rss_kb(void);
/*
 * Settled readings, for releases other threads or processes make
 * asynchronously (the interposer's threads closing their ends, devd freeing
 * memory of another process): read until the value is want, polled every
 * 10 ms for at most ms milliseconds, and return the last reading.
 */
long h_settles(long (*read)(void), long want, int ms);
/* h_nfds() once it is want (2 s at most). */
int h_nfds_settled(int want);
/* Free device memory once it equals want (5 s at most). */
size_t h_free_mem_settles(size_t want);

#endif
