/*
 * devscan.h - the device scan of a save (internal to the carrier library).
 *
 * Before a save copies anything to the host, the chunk-scan kernel
 * (chunkscan.h) runs where the bytes live and returns, per chunk, two
 * 61-bit polynomial hashes and whether any byte is nonzero. A chunk that
 * is all zero, or whose hashes equal its parent checkpoint's, is decided
 * there: it is never copied to the host nor written, and its CRC is that
 * of zeros or the parent's. Only the other chunks go through the pipeline.
 * At load, chunks recorded as zero are set by a device memset.
 *
 * Called by save.c's xfer_save_scan(), from carrier.c's transfer(), on the
 * calling thread before the I/O threads start; touches only the items it is
 * given and its own module, stream and result buffer, all released before
 * it returns.
 */
#ifndef CUIP_DEVSCAN_H
#define CUIP_DEVSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "carrier_types.h"

/* Bytes one batch of launches covers before the scan waits for it,
 * reports progress and decides its chunks: small enough that a slow
 * device (the fake driver scans at host speed) still reports every
 * fraction of a second, large enough that launches and waits cost little
 * on a GPU (about 1,600 batches for 100 GiB, each one wait of some 20 us). */
#define DEVSCAN_BATCH (64ull << 20)

struct devscan_report {
	uint64_t scanned;   /* bytes the kernel read on the device */
	uint64_t zero;	    /* of them, in chunks found all zero */
	uint64_t inherited; /* of them, in chunks equal to the parent's */
	double seconds;	    /* wall time, module load to the last decision */
};

/* Called after each batch with the bytes scanned and decided so far. */
typedef void (*devscan_progress_fn)(void *arg, uint64_t scanned, uint64_t decided);

/*
 * Scan items[0..n) (ctxs[i]: the context item i's va belongs to). Every
 * item needs zero (ncrc bytes, zeroed), dhash (ncrc x CARRIER_DHASH_LEN)
 * and its dhash_key; an item with parent_dhash also needs parent_crc and
 * inherited. Fills dhash for every chunk, and for each chunk decided on
 * the device its zero or inherited byte and its crc. Returns 0; -ENOTSUP
 * when the device cannot run the kernel here (no entry point, module or
 * function, no room for the results; err says which), with no item
 * changed, so that the caller saves on the host instead; or -EIO when the
 * device failed once the scan ran (the save fails).
 */
int carrier_devscan(const struct carrier_ops *ops, struct carrier_item *items, size_t n, const CUcontext *ctxs,
		    devscan_progress_fn progress, void *arg, struct devscan_report *rep, char *err, size_t errlen);

/* CRC32C of len zero bytes (the CRC a zero chunk carries). */
uint32_t carrier_zero_crc(uint64_t len);

#endif /* CUIP_DEVSCAN_H */
