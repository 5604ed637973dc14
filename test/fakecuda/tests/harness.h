/*
 * Shared helpers for the fake driver's tests: a private fakecuda-devd per
 * test case (own socket, own device configuration), child processes that
 * start before the test's own cuInit, descriptor passing, and CUresult
 * assertions.  Single-threaded test code: no locks.
 */
#ifndef FAKECUDA_TEST_HARNESS_H
#define FAKECUDA_TEST_HARNESS_H

#include <check.h>
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MiB (1ul << 20)

/* CUDA 13.1 device-explicit binds: not in the 13.0 cuda.h, so declared here as an application would. */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);

const char *fkt_name(CUresult r);

/* Monotonic milliseconds. */
int64_t fkt_now_ms(void);
/* A pattern of n words derived from seed, and its check (1: intact). */
void fkt_fill(uint32_t *p, size_t n, uint32_t seed);
int fkt_check(const uint32_t *p, size_t n, uint32_t seed);

#define CK(x)                                                                    \
	do {                                                                     \
		CUresult r_ = (x);                                               \
		ck_assert_msg(r_ == CUDA_SUCCESS, "%s -> %s", #x, fkt_name(r_)); \
	} while (0)
#define CK_ERR(x, want)                                                                                 \
	do {                                                                                            \
		CUresult r_ = (x);                                                                      \
		ck_assert_msg(r_ == (want), "%s -> %s, expected %s", #x, fkt_name(r_), fkt_name(want)); \
	} while (0)

/* Starts a private devd with extra environment ("K=V K=V", may be NULL); sets FAKECUDA_SOCKET. */
void fkt_devd_start(const char *env);
void fkt_devd_stop(void);
/* Unchecked fixtures for the common configurations. */
void fkt_devd1(void);
void fkt_devd2(void);

/* cuInit + primary context of device dev made current. */
CUcontext fkt_init_ctx(int dev);
/* A VMM allocation of size on dev mapped read-write for dev at a fresh reservation. */
CUdeviceptr fkt_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev);
CUmemGenericAllocationHandle fkt_vmm_create(size_t size, int dev, int posix);
CUfunction fkt_kernel(const char *name);

/* Child processes: fork before the parent's cuInit.  fn's return value is the exit status. */
pid_t fkt_spawn(int (*fn)(int sock, void *arg), void *arg, int *sock);
int fkt_wait(pid_t pid);

int fkt_send_fd(int sock, int fd, const void *buf, size_t len);
int fkt_recv_fd(int sock, int *fd, void *buf, size_t len);
int fkt_send(int sock, const void *buf, size_t len);
int fkt_recv(int sock, void *buf, size_t len);

int fkt_is_root(void);
size_t fkt_free_mem(void);
/* Free memory once it equals want (polled up to 5 s), else its last value.  For
 * releases by other processes or export closes, which devd is not ordered with. */
size_t fkt_free_mem_settles(size_t want);
/* Entries of /proc/PID/fd, and devd's pid (from SOCKET.pid). */
int fkt_count_fds(pid_t pid);
/* Descriptors of pid whose link contains `like` (all if NULL); with bytes,
 * the allocated size of the (last) matching file. -1: no such process. */
int fkt_fds_like(pid_t pid, const char *like, long long *bytes);
pid_t fkt_devd_pid(void);
/* Bytes allocated in devd's arena of device 0 (its memfd, through /proc/DEVD/fd). */
long long fkt_arena_bytes(void);

#endif
