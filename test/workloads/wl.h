/*
 * wl.h - the library every test workload is built on (test/e2e/e2e_*.c,
 * test/gpu/gpu_job.c, test/workloads/vmm_share.c): ranks forked before any
 * CUDA call with a socket to rank 0, messages with a descriptor
 * (SCM_RIGHTS), the file command protocol of the end-to-end tests, readiness
 * and failure reports, patterns written to and checked against device
 * memory, checksums, and the driver calls every workload repeats (a primary
 * context, allocation properties, reserve-map-access).
 *
 * Written against cuda.h only, so a workload runs on NVIDIA's driver or the
 * fake one (test/gpu/build.sh builds it on the GPU machine). State: the
 * process's rank, directory and last failure (wl_why), one copy per process;
 * the workloads are single-threaded, no locks.
 *
 * The command protocol (test/e2e/lib.sh drives it): every rank writes
 * DIR/r<rank>.ready ("pid <pid> ..."), polls DIR/cmd ("<seq> <verb> [a] [b]")
 * and answers each new command in DIR/r<rank>.<seq>, "ok ..." or
 * "fail <why>"; a rank that cannot start writes DIR/r<rank>.failed.
 */
#ifndef CUIP_TEST_WL_H
#define CUIP_TEST_WL_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WL_MIB (1ull << 20)

extern const char *wl_dir; /* DIR of the command protocol */
extern int wl_rank;	   /* 0: the root that forked the others */
extern char wl_why[512];   /* the last failure, for the answer or the .failed file */

/* Record a failure in wl_why (an argument may be wl_why itself); returns -1. */
int wl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Record a failure, report it (wl_failed) and exit(1). */
void wl_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A failed driver call fails the function (wl_fail), naming call, error and rank. */
#define WL_CK(call)                                                                                         \
	do {                                                                                                \
		CUresult r_ = (call);                                                                       \
		if (r_ != CUDA_SUCCESS)                                                                     \
			return wl_fail("%s failed: %s (%d, rank %d)", #call, wl_err(r_), (int)r_, wl_rank); \
	} while (0)
/* The same where a failure ends the process (wl_die). */
#define WL_CK_DIE(call)                                                                                 \
	do {                                                                                            \
		CUresult r_ = (call);                                                                   \
		if (r_ != CUDA_SUCCESS)                                                                 \
			wl_die("%s:%d: %s -> %s (%d)", __FILE__, __LINE__, #call, wl_err(r_), (int)r_); \
	} while (0)
const char *wl_err(CUresult r);

/* ---- ranks and messages -------------------------------------------------- */

#define WL_PDEATHSIG 1u /* ranks > 0 die with rank 0 */
#define WL_CLOEXEC   2u /* the sockets are close-on-exec */
#define WL_SUBREAPER 4u /* rank 0 reaps what its ranks leave (PR_SET_CHILD_SUBREAPER) */

/*
 * Fork ranks 1..nprocs-1, each with a socket pair to rank 0, and return this
 * process's rank (also wl_rank), or -1 (wl_why) if a socket or fork failed.
 * Rank 0 gets peer[r] for rank r (and pids[r] when pids is not NULL); a rank
 * r > 0 gets peer[0] and holds no other rank's socket.
 */
int wl_fork_ranks(int nprocs, int *peer, pid_t *pids, unsigned flags);
/* Wait for every child (rank 0, before it leaves). */
void wl_reap(void);

/* Send len bytes and, when fd >= 0, the descriptor fd with them. */
int wl_send(int sock, const void *buf, size_t len, int fd);
/*
 * Receive exactly len bytes. With fd, *fd is the descriptor that came with
 * them (close-on-exec), -1 if none; without, any that came is closed.
 */
int wl_recv(int sock, void *buf, size_t len, int *fd);
/* wl_recv of a message that must carry a descriptor: returns it, or -1. */
int wl_recv_fd(int sock, void *buf, size_t len);

/* ---- the command protocol ------------------------------------------------ */

#define WL_EXIT 1 /* a command handler's answer to "exit": answer, then leave wl_serve */

/*
 * One command: verb and its two numbers (0 when absent). Returns 0 (the
 * answer is out, "ok" unless the handler wrote another), -1 (the answer is
 * "fail <wl_why>") or WL_EXIT.
 */
typedef int (*wl_cmd_fn)(const char *verb, unsigned a, unsigned b, char *out, size_t len);

/* Answer commands of DIR/cmd, polled every poll_ms, until one returns WL_EXIT. */
void wl_serve(wl_cmd_fn fn, unsigned poll_ms);
/* Write DIR/r<rank>.<seq> whole (aside, then renamed). */
void wl_answer(long seq, const char *text);
/* Write DIR/r<rank>.ready whole. */
int wl_ready(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Write wl_why to DIR/r<rank>.failed and stderr ("PROG rank R: why"); returns 1. */
int wl_failed(const char *prog);
extern const char *wl_prog; /* PROG of wl_die's report */

/* ---- patterns and checksums ---------------------------------------------- */

/* Byte off of a pattern, and word j of one (arg: the workload's key). */
typedef uint8_t (*wl_byte_fn)(uint64_t off, const void *arg);
typedef uint32_t (*wl_word_fn)(uint64_t j, const void *arg);

/* Write len bytes of the pattern at va (staged through host memory in pieces). */
int wl_fill_bytes(CUdeviceptr va, uint64_t len, wl_byte_fn fn, const void *arg);
int wl_fill_words(CUdeviceptr va, uint64_t nwords, wl_word_fn fn, const void *arg);
/*
 * Read them back and compare: -1 naming `what`, the address, the first
 * byte (word) that differs, its value and the expected one.
 */
int wl_check_bytes(CUdeviceptr va, uint64_t len, wl_byte_fn fn, const void *arg, const char *what);
int wl_check_words(CUdeviceptr va, uint64_t nwords, wl_word_fn fn, const void *arg, const char *what);
/*
 * The workloads' common byte pattern k: generation gen over [0, glen), 0
 * after. wl_put_pattern writes [va, va+len) all of generation gen and
 * synchronizes the context; wl_check_pattern compares.
 */
uint8_t wl_pattern(uint64_t off, unsigned k, unsigned gen);
int wl_put_pattern(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen);
int wl_check_pattern(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen, uint64_t glen, const char *what);
/* cuMemGetAddressRange of an address inside answers [base, base+size). */
int wl_check_range(CUdeviceptr base, size_t size, CUdeviceptr inner, const char *what);
/* FNV-1a over bytes, from h (start with WL_FNV_INIT). */
#define WL_FNV_INIT 2166136261u
uint32_t wl_fnv1a(uint32_t h, const void *buf, size_t len);
/* FNV-1a of the len bytes at va, read back from the device. */
int wl_device_sum(CUdeviceptr va, size_t len, uint32_t *sum);

/* ---- driver calls -------------------------------------------------------- */

/* cuInit, device ord, its primary context made current. */
int wl_context(int ord, CUdevice *dev, CUcontext *ctx);
/* Pinned device memory on device ord, exportable as `types`. */
CUmemAllocationProp wl_prop(int ord, CUmemAllocationHandleType types);
/* Reserve a fresh range, map h there, read-write for devices dev0..dev0+ndev-1. */
int wl_map(CUmemGenericAllocationHandle h, size_t size, int dev0, int ndev, CUdeviceptr *va);
/* Import a POSIX descriptor (the descriptor stays open). */
int wl_import(int fd, CUmemGenericAllocationHandle *h);
/* Export h as a POSIX descriptor. */
int wl_export(CUmemGenericAllocationHandle h, int *fd);

#endif
