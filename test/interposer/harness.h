/*
 * harness.h - helpers for the interposer tests. Each test binary runs with
 * libcuinterpose.so preloaded on the fake driver (run-test.sh); Check forks
 * every test, so each test is a fresh process whose first cuInit starts a
 * fresh interposer. Helpers reach the real driver behind the interposer
 * (libc's own dlsym), inspect this or another process over its control
 * socket, and count descriptors and memory.
 */
#ifndef CUIP_TEST_HARNESS_H
#define CUIP_TEST_HARNESS_H

#include <check.h>
#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client.h" /* images/client.c, linked into the tests */
#include "wire.h"

#define MiB	  (1ul << 20)
#define TAG_SHIFT 48
#define TAG	  0xC1D0ull

CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);

#define CK(x)                                                               \
	do {                                                                \
		CUresult r_ = (x);                                          \
		ck_assert_msg(r_ == CUDA_SUCCESS, "%s -> %d", #x, (int)r_); \
	} while (0)
#define CK_ERR(x, want)                                                                         \
	do {                                                                                    \
		CUresult r_ = (x);                                                              \
		ck_assert_msg(r_ == (want), "%s -> %d, expected %d", #x, (int)r_, (int)(want)); \
	} while (0)

/* cuInit, device `ord`, its primary context current. */
void h_init(int ord);
size_t h_gran(void);
CUmemAllocationProp h_prop(int ord, unsigned types);
/* Create (POSIX), reserve, map, set RW for device 0; returns the VA. */
CUdeviceptr h_create_map(size_t size, CUmemGenericAllocationHandle *h);
void h_unmap_release(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);
void h_fill(CUdeviceptr va, size_t size, uint32_t seed);
bool h_check(CUdeviceptr va, size_t size, uint32_t seed);
int h_export(CUmemGenericAllocationHandle h);

/* The real driver behind the interposer, by symbol name. */
void *h_real(const char *name);
/* Is p one of libcuinterpose's functions? */
bool h_ours(void *p);
void *h_ours_sym(const char *name);

/* Descriptor and memory accounting. */
int h_nfds(void);
/* h_nfds() once the interposer threads closed their ends (waits up to 2 s for `want`). */
int h_nfds_settled(int want);
long h_rss_kb(void);

/* Control socket of pid (this process if 0), from CUINTERPOSE_SOCKET_DIR. */
int h_sock_path(pid_t pid, char *buf, size_t len);
int h_connect(pid_t pid);
/* INSPECT pid; free with h_state_free. */
Cuip__ProcessState *h_state(pid_t pid);
void h_state_free(Cuip__ProcessState *st);
int h_request(int sock, Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out);

/* Descriptor passing between test processes. */
int h_send_fd(int sock, int fd, const void *buf, size_t len);
int h_recv_fd(int sock, void *buf, size_t len);

/* Fork a child that runs fn(arg, sock) before any CUDA use and exits with its
 * return value; returns the pid, *sock is the parent's end. */
pid_t h_fork(int (*fn)(void *arg, int sock), void *arg, int *sock);
int h_wait(pid_t pid);

/* Run `test` in the current test only if the condition for ASan allows. */
bool h_asan(void);

#endif
