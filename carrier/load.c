/*
 * load.c - the carrier's load side and its verify pass: a worker's loop
 * over its slots (pread() a slice into a slot whose previous host->device
 * copies have finished, check every item's chunk CRCs, expand compressed
 * frames, start one copy per item), the messages that name a short read,
 * a bad chunk or a bad frame, and the zero chunks the index records,
 * which are set by memset on the device instead of read. Called by
 * carrier.c's transfer() and its threads (xfer.h declares what they
 * call).
 *
 * A worker's slots, timings and codec workspace are its own and need no
 * lock; what the threads share in struct xfer (the first error, the byte
 * count, the cursors) goes through xfer_fail(), xfer_account() and
 * xfer_claim(), which take its mutex. The zero chunks are planned and set
 * on the calling thread before the threads start.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "carrier_types.h"
#include "devscan.h"
#include "wire.h"
#include "xfer.h"
#include "zchunk.h"

/* ---- load and verify ------------------------------------------------------ */

/* A short read of the slot's slice ended at file offset `at`: name the
 * item whose bytes are missing. */
static void short_read(struct xfer *x, const struct slot *sl, uint64_t at)
{
	uint64_t off, len, boff;
	char nb[32], fb[32];

	for (size_t i = sl->s.item; i <= sl->s.last; i++) {
		const struct carrier_item *it = &x->items[i];
		uint64_t fo;

		if (!xfer_piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		fo = sl->s.foff + boff;
		if (at >= fo + len)
			continue;
		xfer_fail(x, -ENODATA,
			  "carrier %s: %s: %s ends at offset %" PRIu64 ", %" PRIu64 " bytes short of the %" PRIu64
			  " bytes at %" PRIu64 " (chunk %" PRIu64 "; truncated carrier image)",
			  xfer_pass_name(x->pass), carrier_item_name(it, i, nb, sizeof(nb)),
			  xfer_file_name(x, it->file, fb, sizeof(fb)), at, fo + len - at, len, fo,
			  (it->name_offset + off + (at > fo ? at - fo : 0)) / it->chunk_size);
		return;
	}
	assert(!"short read beyond the slice");
}

/* Chunk k of item i (bytes [o, o + l) of its piece at byte off of the item)
 * has crc32c c where the index says otherwise: record it. */
static void bad_chunk(struct xfer *x, size_t i, uint64_t off, uint64_t o, uint64_t l, uint32_t c, uint64_t k)
{
	const struct carrier_item *it = &x->items[i];
	uint64_t foff = it->offset + off, base = it->name_offset;
	char nb[32], fb[32];

	xfer_fail(x, -EBADMSG,
		  "carrier %s: %s: chunk %" PRIu64 " (bytes %" PRIu64 "-%" PRIu64 ", file offset %" PRIu64
		  ") of %s has crc32c %#010x, the index says %#010x (corrupt carrier image)",
		  xfer_pass_name(x->pass), carrier_item_name(it, i, nb, sizeof(nb)), (base + off + o) / it->chunk_size,
		  base + off + o, base + off + o + l - 1, foff + o, xfer_file_name(x, it->file, fb, sizeof(fb)), c,
		  it->crc[k]);
}

/* Chunk k of item i, stored compressed in z bytes, does not come out as
 * its l bytes (ret -EBADMSG), or its stored length cannot be (-EINVAL). */
static void bad_frame(struct xfer *x, size_t i, uint64_t off, uint64_t o, uint64_t l, uint64_t k, uint32_t z, int ret)
{
	const struct carrier_item *it = &x->items[i];
	char nb[32], fb[32];

	xfer_fail(x, -EBADMSG,
		  "carrier %s: %s: chunk %" PRIu64 " (file offset %" PRIu64 " of %s) %s %" PRIu32
		  " bytes for its %" PRIu64 " (%s)",
		  xfer_pass_name(x->pass), carrier_item_name(it, i, nb, sizeof(nb)),
		  (it->name_offset + off + o) / it->chunk_size, it->offset + off + o,
		  xfer_file_name(x, it->file, fb, sizeof(fb)),
		  ret == -EINVAL ? "is stored compressed in" : "does not decompress from its", z, l,
		  ret == -EINVAL ? "corrupt carrier index" : "corrupt carrier image");
}

/* Read chunk k of item i (bytes [o, o + l) of its piece at byte off of the
 * item, at p), stored compressed in z bytes at file offset foff: the
 * frame into the thread's buffer, decompressed into place. 0, -ENODATA
 * (*got bytes were there), a read's -errno, or -EBADMSG (failed here). */
static int load_frame(struct worker *w, size_t i, uint64_t off, uint64_t o, uint64_t l, uint64_t k, uint8_t *p,
		      uint64_t foff, uint64_t *got, double *io_s)
{
	const struct carrier_item *it = &w->x->items[i];
	uint32_t z = it->stored[k];
	double t;
	int rc;

	if (!cuip_zchunk_stored_ok(z, l)) {
		bad_frame(w->x, i, off, o, l, k, z, -EINVAL);
		return -EBADMSG;
	}
	t = xfer_now();
	rc = cuip_pread_all(w->x->fds[it->file], w->zbuf, z, foff, got);
	*io_s += xfer_now() - t;
	if (rc)
		return rc;
	t = xfer_now();
	rc = cuip_zchunk_decompress(w->zctx, p, l, w->zbuf, z);
	w->zip_s += xfer_now() - t;
	if (rc) {
		bad_frame(w->x, i, off, o, l, k, z, rc);
		return -EBADMSG;
	}
	/* Counted once per restore: after a verify-first pass, LOAD reads
	 * them again (its decompression time is summed over both). */
	if (w->x->pass != PASS_VERIFY) {
		w->zip_raw += l;
		w->zip_stored += z;
	}
	return 0;
}

/* Read the slot's slice and check every item's chunks, CRC_BLOCK bytes at
 * a time right after they were read (still in the cache); a chunk is
 * judged once all of it is read. A compressed chunk is read and
 * decompressed whole, then checked. Nothing touches the device. */
static int load_read(struct worker *w, struct slot *sl)
{
	struct xfer *x = w->x;
	uint8_t *buf = sl->buf;
	int fd = x->fds[x->items[sl->s.item].file];
	uint64_t got = 0, off, len, boff, have = 0;
	double crc_s = 0, io_s = 0, t;
	bool reported = false; /* a bad chunk, already failed with its own message */
	int rc = 0;

	for (size_t i = sl->s.item; !rc && i <= sl->s.last; i++) {
		const struct carrier_item *it = &x->items[i];
		const uint8_t *p;

		if (!xfer_piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		p = buf + boff;
		for (uint64_t o = 0, k = off / it->chunk_size; !rc && o < len; o += it->chunk_size, k++) {
			uint64_t l = len - o < it->chunk_size ? len - o : it->chunk_size;
			uint32_t c = 0;

			if (it->stored && it->stored[k]) {
				have = boff + o; /* a short read ends at have + got */
				rc = load_frame(w, i, off, o, l, k, buf + boff + o, sl->s.foff + boff + o, &got, &io_s);
				if (rc == -EBADMSG)
					reported = true;
				if (rc)
					break;
				have = boff + o + l;
				t = xfer_now();
				c = cuip_crc32c(0, p + o, l);
				crc_s += xfer_now() - t;
			}
			for (uint64_t b = 0; !rc && b < l && !(it->stored && it->stored[k]); b += CRC_BLOCK) {
				uint64_t m = l - b < CRC_BLOCK ? l - b : CRC_BLOCK, end = boff + o + b + m;

				if (end > have) {
					/* Read ahead a block: one pread() serves a
					 * run of small items; never into a chunk
					 * that may be stored compressed. */
					uint64_t to = have + CRC_BLOCK > end ? have + CRC_BLOCK : end;

					if (to > sl->s.len)
						to = sl->s.len;
					if (it->stored && to > boff + o + l)
						to = boff + o + l;
					t = xfer_now();
					rc = cuip_pread_all(fd, buf + have, to - have, sl->s.foff + have, &got);
					io_s += xfer_now() - t;
					if (rc)
						break;
					have = to;
				}
				t = xfer_now();
				c = cuip_crc32c(c, p + o + b, m);
				crc_s += xfer_now() - t;
			}
			if (!rc && c != it->crc[k]) {
				bad_chunk(x, i, off, o, l, c, k);
				reported = true;
				rc = -EBADMSG;
			}
		}
	}
	w->crc_s += crc_s;
	w->io_s += io_s;
	if (rc == -ENODATA) {
		short_read(x, sl, sl->s.foff + have + got);
		return -1;
	}
	if (rc && !reported) {
		char nb[160], fb[32];
		xfer_fail(x, -EIO,
			  "carrier %s: %s: reading %" PRIu64 " bytes at file offset %" PRIu64 " of %s failed: %s",
			  xfer_pass_name(x->pass), xfer_slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.len, sl->s.foff,
			  xfer_file_name(x, x->items[sl->s.item].file, fb, sizeof(fb)), strerror(-rc));
	}
	return rc ? -1 : 0;
}

static int load_issue(struct worker *w, struct slot *sl)
{
	if (xfer_issue(w, sl, false))
		return -1;
	sl->busy = true;
	return 0;
}

/* A slot's previous host->device copy must finish before buf is reused. */
static int load_retire(struct worker *w, struct slot *sl)
{
	if (!sl->busy)
		return 0;
	sl->busy = false;
	if (xfer_slot_wait(w, sl))
		return -1;
	xfer_account(w->x, sl->s.len);
	return 0;
}

void xfer_load_worker(struct worker *w)
{
	struct xfer *x = w->x;
	struct slice s;
	unsigned k = 0;

	while (xfer_claim(x, &s)) {
		struct slot *sl = w->slot[k++ % SLOTS_PER_THREAD];

		if (load_retire(w, sl))
			return;
		sl->s = s;
		if (load_read(w, sl))
			return;
		if (x->pass == PASS_VERIFY)
			xfer_account(x, s.len);
		else if (load_issue(w, sl))
			return;
		xfer_slice_done(w);
	}
	for (unsigned i = 0; i < SLOTS_PER_THREAD; i++)
		if (load_retire(w, w->slot[i]))
			return;
}

/*
 * Load: the chunks the index records as zero, where the driver can set
 * them, are left out of the slices (and of a verify pass). Each must
 * carry the CRC of zeros: an index that marks a chunk zero whose CRC says
 * otherwise is corrupt, and is refused before the device is touched.
 */
void xfer_load_plan_zero(struct xfer *x)
{
	uint64_t bytes = 0;

	for (size_t i = 0; i < x->n && !x->rc; i++) {
		const struct carrier_item *it = &x->items[i];

		for (uint64_t k = 0; it->zero && k < it->ncrc; k++) {
			uint64_t l = it->size - k * it->chunk_size < it->chunk_size ? it->size - k * it->chunk_size
										    : it->chunk_size;
			char nb[32];

			if (!it->zero[k])
				continue;
			if (it->crc[k] != carrier_zero_crc(l)) {
				xfer_fail(x, -EBADMSG,
					  "carrier load: %s: chunk %" PRIu64
					  " is recorded as all zero but its CRC32C is "
					  "%08x, not that of zeros (%08x): corrupt carrier index",
					  carrier_item_name(it, i, nb, sizeof(nb)),
					  (it->name_offset / it->chunk_size) + k, it->crc[k], carrier_zero_crc(l));
				return;
			}
			bytes += l;
		}
	}
	if (!bytes || !x->ops->memset_d8_async)
		return;
	x->skips = true;
	x->skipped = bytes;
}

/* Load: set the zero chunks on the device (after setup(): one memset per
 * run of them, on the first slot's stream of the item's context, then one
 * wait per context). */
int xfer_load_zero(struct xfer *x)
{
	const struct carrier_ops *ops = x->ops;
	CUresult rc = CUDA_SUCCESS;
	char nb[32];

	if (!x->skips)
		return 0;
	for (size_t i = 0; i < x->n && rc == CUDA_SUCCESS; i++) {
		const struct carrier_item *it = &x->items[i];
		CUstream st = x->slots[0].streams[x->item_ctx[i]];

		if (!it->zero)
			continue;
		rc = ops->ctx_set_current(x->ctxs[x->item_ctx[i]]);
		for (uint64_t k = 0; rc == CUDA_SUCCESS && k < it->ncrc;) {
			uint64_t e = k;

			if (!it->zero[k]) {
				k++;
				continue;
			}
			while (e < it->ncrc && it->zero[e])
				e++;
			{
				uint64_t off = k * it->chunk_size, end = e * it->chunk_size;

				if (end > it->size)
					end = it->size;
				rc = ops->memset_d8_async(it->va + off, 0, end - off, st);
				if (rc != CUDA_SUCCESS) {
					xfer_fail(x, -EIO,
						  "carrier load: %s: cuMemsetD8Async of the zero chunks %" PRIu64
						  "-%" PRIu64 " failed: %s (%d)",
						  carrier_item_name(it, i, nb, sizeof(nb)),
						  (it->name_offset / it->chunk_size) + k,
						  (it->name_offset / it->chunk_size) + e - 1, xfer_cu_name(ops, rc),
						  rc);
					return x->rc;
				}
				x->zero_set += end - off;
			}
			k = e;
		}
	}
	for (size_t c = 0; c < x->nctx && rc == CUDA_SUCCESS; c++) {
		rc = ops->ctx_set_current(x->ctxs[c]);
		if (rc == CUDA_SUCCESS)
			rc = ops->stream_synchronize(x->slots[0].streams[c]);
	}
	if (rc == CUDA_SUCCESS)
		rc = ops->ctx_set_current(x->ctxs[0]);
	if (rc != CUDA_SUCCESS)
		xfer_fail(x, -EIO, "carrier load: setting the zero chunks on the device failed: %s (%d)",
			  xfer_cu_name(ops, rc), rc);
	return x->rc;
}
