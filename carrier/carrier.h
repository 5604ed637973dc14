/*
 * carrier.h - host carriers: the bytes of shared device allocations,
 * streamed between device memory and a CRIU image file.
 *
 * The creating process of a shared allocation saves its bytes itself (SAVE
 * from the plugin) and loads them back after restore (LOAD). The plugin
 * opens the carrier file in CRIU's image directory and passes its FD; this
 * module moves the bytes through a bounded set of pinned staging buffers:
 * device copies on per-buffer streams overlap file I/O, several threads
 * issue pwrite()/pread() at computed offsets, and each chunk of chunk_size
 * bytes gets a CRC32C computed on the staging buffer. Extra host memory is
 * bounded by the staging size (default 224 MiB, less for a smaller carrier:
 * its own size or two chunks) whatever the carrier size.
 * The file holds each chunk's raw bytes at its place, or (compression on,
 * where it pays) one zstd frame at the start of the place and a hole after
 * it; the caller records each item's offset, size, chunk_size, CRCs (of the
 * raw bytes) and stored lengths as a Cuip__CarrierEntry in the topology
 * image.
 *
 * Load verifies every chunk before it is copied to the device: a corrupt
 * chunk is never written to device memory (with verify_first, nothing is
 * written unless the whole carrier verifies). Truncated files, bad CRCs,
 * index/size mismatches, device-copy and write failures (ENOSPC, EFBIG) are
 * refused with a message naming the item, chunk and cause.
 *
 * The module never links libcuda: the caller passes the real driver's entry
 * points in struct carrier_ops. Staging memory is pinned by the driver at
 * the start of each call and freed before it returns, streams are destroyed
 * and threads joined, so nothing of a transfer outlives the call (and no
 * staging ends up in CRIU's image). No global state, no locks shared with
 * anything else: concurrent calls are independent.
 *
 * Load runs during restore while the application's threads are frozen and
 * may hold allocator locks: the transfer's bookkeeping and thread stacks are
 * mmap'd, the hot path never calls malloc. (glibc still allocates each new
 * thread's TLS vector with malloc inside pthread_create; threads = 1 runs
 * the whole transfer on the calling thread without creating any.)
 */
#ifndef CUIP_CARRIER_H
#define CUIP_CARRIER_H

#include <stddef.h>
#include <stdint.h>

#include "carrier_types.h"

/*
 * Fill ops by name through `lookup` (e.g. dlsym on the real libcuda handle).
 * Returns 0, or -ENOENT naming the first missing required symbol in err.
 */
int carrier_ops_resolve(struct carrier_ops *ops, void *(*lookup)(void *arg, const char *name), void *arg, char *err,
			size_t errlen);

/*
 * Defaults, then the CUINTERPOSE_* environment variables (struct
 * carrier_config, carrier_types.h). Returns 0,
 * or -EINVAL naming the variable in err (the defaults stay in place).
 */
int carrier_config_init(struct carrier_config *cfg, char *err, size_t errlen);

/*
 * cfg NULL means carrier_config_init() (environment). The caller's current
 * context is current again when these return.
 *
 * Save items[0..n) to fd (opened for writing, not O_APPEND, seekable),
 * back to back from `offset`: fills each item's offset, chunk_size, crc and
 * ncrc. The carrier owns a regular file from its first item on: the file is
 * cut there first, every aligned 64 KiB that is all zero is left as a hole
 * (it reads back as zeros and holds no disk block; stats->hole_bytes) and
 * the file ends where its last item does. Device memory is only read. Returns 0, or a negative errno with the
 * reason in err: -EINVAL (arguments), -ENOMEM (staging could not be pinned),
 * -EIO (a device copy failed), or the write's errno (-ENOSPC, -EFBIG, ...).
 * The file may hold a partial carrier after a failure.
 */
int carrier_save(const struct carrier_ops *ops, const struct carrier_config *cfg, int fd, uint64_t offset,
		 struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err, size_t errlen);

/*
 * Load items[0..n) from fd (opened for reading, seekable) at their offsets,
 * checking every chunk's CRC before copying it to the device. Returns 0, or
 * a negative errno with the reason in err: -EINVAL (arguments, index does
 * not match the sizes), -ENODATA (file truncated), -EBADMSG (CRC mismatch:
 * names item, chunk, expected and actual), -ENOMEM, -EIO (device copy or
 * read failure). A chunk that fails its check is never copied to the device;
 * earlier chunks may have been unless cfg->verify_first.
 */
int carrier_load(const struct carrier_ops *ops, const struct carrier_config *cfg, int fd,
		 const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err, size_t errlen);

/*
 * The same over several files: item i goes to fds[items[i].file]; on save
 * each file's items are laid back to back from `offset`. Threads take the
 * files in turn. Buffered writes to one file serialize on its inode lock
 * (one writer's speed, ~3-4 GB/s on the H200 host), writes to different
 * files run in parallel (~32 GB/s with 16 files there): a caller that
 * splits large allocations into several items over several files saves
 * that much faster. 1 <= nfds <= CARRIER_FILES_MAX.
 */
int carrier_save_files(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		       uint64_t offset, struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
		       size_t errlen);
int carrier_load_files(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		       const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
		       size_t errlen);

/*
 * Striping: one process's carrier over several files, so that buffered
 * writes are not serialized on one inode (one file ~3 GB/s, 16 files
 * ~32 GB/s on the H200 host; docs/benchmarks.md).
 *
 * carrier_stripe_unit() is the extent size for `total` bytes over nfiles:
 * a quarter of each file's share, at least one chunk and at most
 * CARRIER_STRIPE_MAX, in whole chunks. carrier_stripe_count() and
 * carrier_stripe_split() cut items into extents of at most `unit` bytes
 * (rounded up to each item's chunk size) and give each extent to the file
 * holding the fewest bytes so far (ties: the lowest index), so the files
 * end within one unit of each other. Extent j is a carrier_item of its own:
 * va, size, crc and ncrc narrowed to its chunks (crc points into the
 * item's array), ctx, name and chunk_size copied, name_offset its byte
 * offset in the item, file assigned, offset 0; parent[j] is its item.
 * Pure functions: no I/O, no allocation. split returns 0, or -EINVAL when
 * nfiles is 0 or above CARRIER_FILES_MAX, unit is 0, an item has no chunk
 * size, or (save) an item's crc array is shorter than its chunks.
 */
#define CARRIER_STRIPE_MAX (64ull << 20)
uint64_t carrier_stripe_unit(uint64_t total, size_t nfiles, uint32_t chunk_size);
size_t carrier_stripe_count(const struct carrier_item *items, size_t n, uint64_t unit);
int carrier_stripe_split(const struct carrier_item *items, size_t n, size_t nfiles, uint64_t unit,
			 struct carrier_item *out, size_t nout, size_t *parent);

/*
 * Save items striped over fds[0..nfds): with one fd exactly carrier_save()
 * (no extents: the layout of a one-file carrier); with several, each item
 * gets ext/next (its extents; offset and file name the first) and its crc
 * filled for all its chunks. Free the extents with
 * carrier_items_free_extents() whatever the result.
 */
int carrier_save_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 uint64_t offset, struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen);

/*
 * Load items whose ext/next say where their bytes are (items without
 * extents: `size` bytes at `offset` of fds[file]). Extents that do not add
 * up to the item's size, split a chunk, or name a file beyond nfds are
 * refused (-EINVAL) before the device is touched; otherwise as
 * carrier_load_files().
 */
int carrier_load_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen);

void carrier_items_free_extents(struct carrier_item *items, size_t n);

/*
 * Have the driver compile the chunk scan for the current context's device
 * ahead of a save: load its module and unload it at once. The driver's JIT
 * (0.34 s on the H200 the first time a machine loads it) keeps what it
 * compiled in its compute cache, so that the save's own load, inside the
 * job's pause, finds it there (1 ms). Nothing outlives the call. Returns 0
 * with *secs the load's wall time; -ENOTSUP when the driver lacks the entry
 * points; -EIO when the load failed (err says why); or
 * carrier_scan_warm_wanted's -ECANCELED, having loaded nothing.
 */
int carrier_scan_warm(const struct carrier_ops *ops, const struct carrier_config *cfg, double *secs, char *err,
		      size_t errlen);
/* Whether compiling ahead can help: 0, or -ECANCELED with err saying why
 * not (cfg->device_scan off: no save loads the scan; CUDA_CACHE_DISABLE=1:
 * the driver would not keep the compile). Touches no driver. */
int carrier_scan_warm_wanted(const struct carrier_config *cfg, char *err, size_t errlen);

/*
 * The index's form of an item's extents (Cuip__CarrierEntry.extents): to
 * the entry of a SAVE reply (allocated with zalloc; nothing when the item
 * has none), and from a LOAD's entry into it->ext (malloc'd; free with
 * carrier_items_free_extents). 0 or -ENOMEM.
 */
int carrier_extents_to_entry(const struct carrier_item *it, Cuip__CarrierEntry *e, void *(*zalloc)(size_t));
int carrier_extents_from_entry(struct carrier_item *it, const Cuip__CarrierEntry *e);

#endif /* CUIP_CARRIER_H */
