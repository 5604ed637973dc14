/*
 * prefetch.h - the carrier files read into the page cache while criu
 * restores the processes, so that LOAD finds them there.
 *
 * Measured on the H200 (test/gpu/RESULTS.md): from a cold page cache, criu
 * spends about 2.5 s restoring a PyTorch process's memory, libraries and
 * native CUDA state before the plugin's RESUME_DEVICES_LATE hook runs LOAD,
 * and the disk is idle for the carriers meanwhile. A prefetcher started at
 * the restore's init reads them ahead, in the order LOAD needs them (every
 * file's start first, round-robin), up to a byte budget so that images
 * larger than free memory are not read twice. It reads into a buffer it
 * throws away, CUIP_PREFETCH_READERS reads at a time: the bytes land in the
 * page cache, and LOAD still reads and checks every chunk.
 *
 * The prefetcher is a process of its own (forked twice, criu's SIGCHLD
 * blocked, like the guardian), not a thread: criu forks the restored tree
 * after init, and a thread inside criu could hold a lock a child needs.
 * Owns nothing after start: the process ends by itself when the budget or
 * the files are read, or after CUIP_PREFETCH_MAX_S.
 */
#ifndef CUIP_PLUGIN_PREFETCH_H
#define CUIP_PLUGIN_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#define CUIP_PREFETCH_CHUNK   (32u << 20) /* bytes of a file per turn */
#define CUIP_PREFETCH_READERS 4		  /* reads in flight */
#define CUIP_PREFETCH_MAX_S   600
#define CUIP_PREFETCH_COMM    "cuip-prefetch"

struct cuip_prefetch_file {
	char name[64];
	uint64_t size;
};

struct cuip_prefetch {
	struct cuip_prefetch_file *f;
	size_t n;
	uint64_t bytes; /* the files' sizes together */
};

/* The carrier files of the image directory (every stripe), sorted by name.
 * 0, or a negative errno with `err` set. */
int cuip_prefetch_list(int dirfd, struct cuip_prefetch *p, char *err, size_t errlen);
void cuip_prefetch_free(struct cuip_prefetch *p);

/* The budget for `bytes` of carriers: `mb` MiB when set (mb >= 0), else
 * (mb < 0, "auto") half of the memory the kernel reports available. */
uint64_t cuip_prefetch_budget(long long mb);

/* Read `chunk` bytes of every file in turn, offset by offset, until `budget`
 * bytes were read or the files end; synchronous (CUIP_PREFETCH_READERS
 * threads, joined). Returns the bytes it set out to read. */
uint64_t cuip_prefetch_run(int dirfd, const struct cuip_prefetch *p, uint64_t budget, uint32_t chunk);

/* cuip_prefetch_run in a process of its own; returns its pid, or a negative
 * errno with `err` set. */
int cuip_prefetch_start(int dirfd, const struct cuip_prefetch *p, uint64_t budget, char *err, size_t errlen);

#endif
