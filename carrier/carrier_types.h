/*
 * carrier_types.h - the carrier's data: the driver table, the items a
 * transfer moves, its configuration and its statistics, and the small
 * helpers every side of the carrier shares (chunk counts, the device
 * scan's hash layout). The functions that take them are declared in
 * carrier.h, which includes this file; the carrier's own files that only
 * work on these (the engine, the save and load sides, the device scan)
 * include this one alone.
 */
#ifndef CUIP_CARRIER_TYPES_H
#define CUIP_CARRIER_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

#include "cuinterpose.pb-c.h"
#include "progress.h"
#include "wire.h"

/*
 * The real driver's entry points (exact symbol names in brackets; fill with
 * carrier_ops_resolve()). All are required except those marked optional.
 */
struct carrier_ops {
	CUresult (*ctx_get_current)(CUcontext *ctx);					 /* [cuCtxGetCurrent] */
	CUresult (*ctx_set_current)(CUcontext ctx);					 /* [cuCtxSetCurrent] */
	CUresult (*mem_host_alloc)(void **p, size_t bytes, unsigned flags);		 /* [cuMemHostAlloc] optional */
	CUresult (*mem_alloc_host)(void **p, size_t bytes);				 /* [cuMemAllocHost_v2] */
	CUresult (*mem_free_host)(void *p);						 /* [cuMemFreeHost] */
	CUresult (*stream_create)(CUstream *s, unsigned flags);				 /* [cuStreamCreate] */
	CUresult (*stream_destroy)(CUstream s);						 /* [cuStreamDestroy_v2] */
	CUresult (*stream_synchronize)(CUstream s);					 /* [cuStreamSynchronize] */
	CUresult (*memcpy_dtoh_async)(void *dst, CUdeviceptr src, size_t n, CUstream s); /* [cuMemcpyDtoHAsync_v2] */
	CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void *src, size_t n,
				      CUstream s);		    /* [cuMemcpyHtoDAsync_v2] */
	CUresult (*get_error_name)(CUresult rc, const char **name); /* [cuGetErrorName] optional */
	/* Both or neither: staging is the carrier's own pages, written once and
	 * registered, which threads do in parallel (cuMemHostAlloc serializes in
	 * NVIDIA's driver: 2.0-2.5 GB/s at 1..16 threads on the H200, where
	 * touch + register reached 9.5 GB/s at 16; test/gpu/pinrate.py). */
	CUresult (*mem_host_register)(void *p, size_t bytes, unsigned flags); /* [cuMemHostRegister_v2] optional */
	CUresult (*mem_host_unregister)(void *p);			      /* [cuMemHostUnregister] optional */
	/* The device scan (devscan.h) and zero chunks at load: all optional;
	 * without the first six a save decides on the host, without
	 * memset_d8_async a load reads zero chunks from the file's holes. */
	CUresult (*module_load_data)(CUmodule *m, const void *image);		      /* [cuModuleLoadData] */
	CUresult (*module_unload)(CUmodule m);					      /* [cuModuleUnload] */
	CUresult (*module_get_function)(CUfunction *f, CUmodule m, const char *name); /* [cuModuleGetFunction] */
	CUresult (*launch_kernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				  unsigned bz, unsigned shmem, CUstream s, void **params,
				  void **extra);					   /* [cuLaunchKernel] */
	CUresult (*mem_alloc)(CUdeviceptr *p, size_t bytes);				   /* [cuMemAlloc_v2] */
	CUresult (*mem_free)(CUdeviceptr p);						   /* [cuMemFree_v2] */
	CUresult (*memset_d8_async)(CUdeviceptr p, unsigned char v, size_t n, CUstream s); /* [cuMemsetD8Async] */
};

/* One piece of a striped item: `size` bytes at `offset` of file `file`. */
struct carrier_extent {
	uint32_t file;
	uint64_t offset;
	uint64_t size;
};

/* One allocation's bytes. */
struct carrier_item {
	CUdeviceptr va;	     /* device address, mapped read/write for ctx's device */
	uint64_t size;	     /* bytes carried (0 is allowed: no chunks) */
	CUcontext ctx;	     /* context the copies run in (the device holding va); NULL: the
				caller's current context */
	const char *name;    /* identity for messages ("alloc 1234:7"); NULL: "item N" */
	uint32_t chunk_size; /* bytes per CRC. save: 0 = config default, set to the value used;
				load: from the entry (required) */
	uint64_t offset;     /* byte offset in the file. save: set (each file's items back to back
				from the `offset` argument); load: from the entry */
	unsigned file;	     /* index into the fds of carrier_save_files()/_load_files(); 0 with
				carrier_save()/carrier_load() */
	uint32_t *crc;	     /* CRC32C of each chunk, the last may be short. save: caller's array of
				ncrc >= carrier_nchunks() entries, filled; load: expected values */
	size_t ncrc;	     /* entries in crc. save: capacity, set to the count used; load: must
				equal carrier_nchunks(size, chunk_size) */
	/* Striped (carrier_save_striped/_load_striped only): the item's bytes
	 * in order over the files, each extent whole chunks but the last.
	 * save: set (malloc'd, free with carrier_items_free_extents) when
	 * there are several files; load: from the entry, NULL = all at
	 * `offset` of `file`. */
	struct carrier_extent *ext;
	size_t next;
	/* Messages: byte offset of this item inside the object `name` names
	 * (a stripe of an allocation); chunk numbers count from there. */
	uint64_t name_offset;
	/* Save only, all optional. sha: caller's array of ncrc x
	 * CARRIER_HASH_LEN bytes, filled with each chunk's SHA-256 (NULL: not
	 * hashed). parent_sha: the parent checkpoint's hashes of the same
	 * chunks (n_parent_sha of them; needs sha and inherited): a chunk
	 * whose hash equals its parent's is not written, and its byte in
	 * inherited is set to 1 (caller's zeroed array of ncrc bytes: bytes,
	 * not bits, so that threads saving neighbouring chunks never share
	 * one). */
	uint8_t *sha;
	const uint8_t *parent_sha;
	size_t n_parent_sha;
	uint8_t *inherited;
	/* Compressed chunks (zchunk.h), one entry per chunk (ncrc of them).
	 * save: caller's zeroed array, where cfg->compress is on, filled with
	 * the bytes each chunk was stored in (0: raw); NULL: all raw. load:
	 * from the entry, NULL = all raw; a stored length must be below its
	 * chunk's (else -EBADMSG). */
	uint32_t *stored;
	/* Device scan (save; devscan.h), all optional. zero: caller's zeroed
	 * array of ncrc bytes, set to 1 for each chunk that is all zero
	 * (found on the device, or on the host when the device cannot scan:
	 * such a chunk is never written); at load, from the entry, the chunks
	 * a device memset sets (NULL: none). dhash: caller's array of ncrc x
	 * CARRIER_DHASH_LEN bytes, each chunk's two hashes under dhash_key,
	 * filled when the device scanned (stats->scan_device). parent_dhash
	 * and parent_crc: the parent checkpoint's hashes (same keys) and
	 * CRCs of the same chunks (n_parent_sha of them; needs dhash and
	 * inherited): a chunk whose hashes equal its parent's is decided on
	 * the device, never copied, and takes the parent's CRC. */
	uint8_t *zero;
	uint8_t *dhash;
	uint64_t dhash_key[2];
	const uint8_t *parent_dhash;
	const uint32_t *parent_crc;
};

#define CARRIER_HASH_LEN  32 /* SHA-256 */
#define CARRIER_DHASH_LEN 16 /* the device scan's two hashes, little-endian */

/* A chunk's two device hashes (or a hash key pair) to and from their
 * little-endian form in an entry. */
static inline void carrier_dhash_put(uint8_t *p, const uint64_t v[2])
{
	for (int i = 0; i < 16; i++)
		p[i] = (uint8_t)(v[i / 8] >> (8 * (i % 8)));
}

static inline void carrier_dhash_get(const uint8_t *p, uint64_t v[2])
{
	v[0] = v[1] = 0;
	for (int i = 15; i >= 0; i--)
		v[i / 8] = v[i / 8] << 8 | p[i];
}

/* Chunks (CRC values) for `size` bytes: ceil(size / chunk_size). */
static inline uint64_t carrier_nchunks(uint64_t size, uint32_t chunk_size)
{
	return chunk_size ? (size + chunk_size - 1) / chunk_size : 0;
}

/* Largest chunk accepted (a chunk must fit in one staging buffer). */
#define CARRIER_CHUNK_MAX (256u << 20)
/* Most files one transfer spreads over (wire.h). */
#define CARRIER_FILES_MAX CUIP_CARRIER_FILES_MAX

struct carrier_config {
	uint64_t staging_bytes; /* most pinned staging per call, all buffers [CUINTERPOSE_STAGING_MB, 224] */
	uint32_t chunk_size;	/* default bytes per CRC for save [CUINTERPOSE_TEST_CHUNK_MB, 1] */
	unsigned threads;	/* I/O threads incl. the caller, 1..64; 0: 2 per file for save (buffered
				   writes to one file serialize in the kernel), 12 for load, at most 16
				   and the online CPUs [CUINTERPOSE_TEST_CARRIER_THREADS, 0] */
	int verify_first;	/* load: read and check the whole carrier before copying anything to
				   the device (reads twice) [CUINTERPOSE_TEST_LOAD_VERIFY=first, off] */
	int hash;		/* save: the caller hashes each chunk (carrier_item.dhash on the
				   device, else .sha on the host), which makes the checkpoint a
				   parent for incremental ones [CUINTERPOSE_CARRIER_HASH=
				   device|sha256|off, device] */
	int compress;		/* save: store each chunk of an item with a `stored` array as a zstd
				   frame where that saves space (zchunk.h), at compress_level
				   [CUINTERPOSE_CARRIER_COMPRESS=off|zstd|zstd:LEVEL, off] */
	int compress_level;
	/* Progress, called on the calling thread with no lock held, at most
	 * once per progress_every bytes and once at the end (0: never). With
	 * verify_first the total counts both passes. */
	uint64_t progress_every;
	void (*progress)(void *arg, uint64_t done, uint64_t total);
	void *progress_arg;
	/* save: the page where the process publishes its progress for the
	 * plugin (protocol/progress.h); NULL: none. */
	struct cuip_save_progress *progress_page;
	/* save: decide zero and unchanged chunks on the device where it can
	 * run the chunk scan (devscan.h): CUINTERPOSE_CARRIER_HASH=device (the
	 * default); sha256 and off copy and judge every byte on the host. */
	int device_scan;
	/* save: the job runs on while its bytes are saved (a live pre-copy):
	 * a chunk can change between the device scan and its copy, so each
	 * copied chunk's hashes are computed again on the host from the bytes
	 * written (chunkscan.h's host version): the entry's hashes are always
	 * those of the bytes the file holds, which a child compares with. */
	int live;
	/* Optional names of the files, indexed like the fds, for messages
	 * (NULL: "file N"). */
	const char *const *file_names;
	size_t n_file_names;
};

/* What a transfer did; all fields set on success and on failure. */
struct carrier_stats {
	uint64_t bytes;		/* bytes through the device and the file (per pass) */
	uint64_t total;		/* bytes asked for (sum of item sizes) */
	double seconds;		/* wall time of the call, setup and teardown included */
	double setup_seconds;	/* before the I/O threads start: creating streams */
	uint64_t staging_bytes; /* pinned staging allocated (buffers x buffer_bytes) */
	uint64_t buffer_bytes;
	unsigned buffers;
	unsigned threads;
	double copy_wait_seconds; /* summed over threads: waiting for device copies */
	double io_seconds;	  /* summed over threads: in pwrite/pread */
	double crc_seconds;	  /* summed over threads: computing CRC32C */
	double pin_seconds;	  /* summed over threads: pinning their own staging, overlapped with
				     the other threads' transfers */
	uint64_t hole_bytes;	  /* save: zero runs left as holes in the files (not written) */
	uint64_t inherited_bytes; /* save: chunks equal to the parent's, not written */
	double hash_seconds;	  /* save: summed over threads: computing SHA-256 */
	uint64_t zip_bytes;	  /* chunks stored compressed: their raw bytes (save: written so;
				     load: read so) */
	uint64_t zip_stored;	  /* ... and their frames' bytes */
	double zip_seconds;	  /* summed over threads: compressing (save), decompressing (load) */
	/* save: the device scan, when it ran (scan_device): bytes it read on
	 * the device and its wall time; bytes copied to the host (all the
	 * bytes on a host save); bytes of chunks found all zero. load: zero
	 * chunks set by a device memset. */
	bool scan_device;
	uint64_t scanned_bytes;
	double scan_seconds;
	uint64_t copied_bytes;
	uint64_t zero_bytes;
	/* save: why the device did not scan, when a scan was asked for ("" otherwise) */
	char scan_fallback[160];
};

#endif /* CUIP_CARRIER_TYPES_H */
