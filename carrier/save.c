/*
 * save.c - the carrier's save side: a worker's loop over its slots
 * (device->host copies, then each chunk's CRC, hash and compression, and
 * the pwrite()), the device scan's use before the pipeline, and the
 * files' cut and final size around it. Called by carrier.c's transfer()
 * and its threads (xfer.h declares what they call).
 *
 * A save owns each regular file from its first item on: it makes those
 * bytes zero (punched out of an old file, never a truncation to size 0:
 * see cut_from), writes no piece of a 64 KiB unit (aligned in the file)
 * that is all zero, then sets the file's size to its end. Those bytes read back as
 * zeros and whole units hold no disk block, so memory a framework reserved
 * but never wrote costs neither the write nor the restore's read. The CRCs
 * still cover every byte.
 *
 * A worker's slots, timings and codec workspace are its own and need no
 * lock; what the threads share in struct xfer (the first error, the byte
 * count, the cursors) goes through xfer_fail(), xfer_account() and
 * xfer_claim(), which take its mutex. The scan, xfer_save_begin() and
 * xfer_save_end() run on the calling thread while no other thread runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "carrier_types.h"
#include "chunkscan.h"
#include "devscan.h"
#include "sha256.h"
#include "wire.h"
#include "xfer.h"
#include "zchunk.h"

/* ---- save --------------------------------------------------------------- */

static int pwrite_all(int fd, const uint8_t *p, uint64_t len, uint64_t off)
{
	while (len) {
		ssize_t r = pwrite(fd, p, len, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EIO;
		p += r;
		off += r;
		len -= r;
	}
	return 0;
}

/* Whether p[0..n) is all zero: stops at the first other byte, so data
 * costs a word or two; a zero run is read once, from the cache. */
static bool all_zero(const uint8_t *p, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v;

		memcpy(&v, p + i, 8); /* a unit need not be aligned in memory */
		if (v)
			return false;
	}
	for (; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/*
 * Write p[0..len) at file offset off. In a sparse file each piece of a
 * HOLE_UNIT (aligned in the file) that is all zero is skipped: the file was
 * cut at its first item and each byte is written once, so what is skipped
 * reads back as zeros, and a whole unit skipped holds no block (a piece
 * may share its blocks with the rest of its unit, written by another
 * slice). *holes counts the bytes skipped.
 */
static int write_run(int fd, bool sparse, const uint8_t *p, uint64_t len, uint64_t off, uint64_t *holes)
{
	uint64_t start = 0;

	if (!sparse)
		return pwrite_all(fd, p, len, off);
	for (uint64_t o = 0; o < len;) {
		uint64_t u = HOLE_UNIT - (off + o) % HOLE_UNIT, m = len - o < u ? len - o : u;
		int rc;

		if (all_zero(p + o, m)) {
			rc = o > start ? pwrite_all(fd, p + start, o - start, off + start) : 0;
			if (rc)
				return rc;
			*holes += m;
			start = o + m;
		}
		o += m;
	}
	return len > start ? pwrite_all(fd, p + start, len - start, off + start) : 0;
}

/* Whether chunk k of item it equals its parent's (both hashes known). */
static bool same_as_parent(const struct carrier_item *it, uint64_t k)
{
	return it->parent_sha && k < it->n_parent_sha &&
	       !memcmp(it->sha + k * CARRIER_HASH_LEN, it->parent_sha + k * CARRIER_HASH_LEN, CARRIER_HASH_LEN);
}

/* Chunk k (l bytes at p) of item it, stored compressed where that is
 * worth it: the frame's length in w->zbuf, or 0 (store it raw). Zero
 * chunks stay raw: they are holes already. */
static size_t zip_chunk(struct worker *w, struct carrier_item *it, uint64_t k, const uint8_t *p, uint64_t l)
{
	double t;
	size_t z;

	if (all_zero(p, l))
		return 0;
	t = xfer_now();
	z = cuip_zchunk_compress(w->zctx, w->x->cfg->compress_level, w->zbuf, w->x->zbuf_len, p, l);
	w->zip_s += xfer_now() - t;
	if (z) {
		it->stored[k] = (uint32_t)z;
		w->zip_raw += l;
		w->zip_stored += z;
	}
	return z;
}

/* The slot's copies are done: checksum each item's chunks and write the
 * slice out, CRC_BLOCK bytes at a time right after they were checksummed,
 * so that the write reads them from the cache rather than DRAM a second
 * time. The CRC of a chunk continues across blocks (same values). An item
 * with hashes gets each chunk's SHA-256 in the same pass; one with a parent
 * writes a chunk only once its hash is known, and not at all when it
 * equals the parent's (inherited: the file keeps a hole there). With
 * compression a chunk of at least HOLE_UNIT bytes is also held: once
 * checksummed (still in the cache) it is compressed, and its frame written
 * at the start of its place when that is worth it (the rest a hole). */
static int save_finish(struct worker *w, struct slot *sl)
{
	struct xfer *x = w->x;
	const uint8_t *buf = sl->buf;
	unsigned file = x->items[sl->s.item].file;
	int fd = x->fds[file];
	uint64_t off, len, boff, written = 0;
	double crc_s = 0, io_s = 0, hash_s = 0, t;
	int rc = 0;

	if (xfer_slot_wait(w, sl))
		return -1;
	for (size_t i = sl->s.item; !rc && i <= sl->s.last; i++) {
		struct carrier_item *it = &x->items[i];
		const uint8_t *p;

		if (!xfer_piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		p = buf + boff;
		for (uint64_t o = 0, k = off / it->chunk_size; !rc && o < len; o += it->chunk_size, k++) {
			uint64_t l = len - o < it->chunk_size ? len - o : it->chunk_size;
			bool zip = x->zsave && it->stored && x->sparse[file] && l >= HOLE_UNIT;
			/* write once the chunk is judged (the device scan judged it already) */
			bool hold = ((it->parent_sha && !x->devscanned) || zip) && x->sparse[file];
			bool sha = it->sha && !x->devscanned;
			struct cuip_sha256 h;
			uint32_t c = 0;
			size_t z;

			if (sha)
				cuip_sha256_init(&h);
			for (uint64_t b = 0; !rc && b < l; b += CRC_BLOCK) {
				uint64_t m = l - b < CRC_BLOCK ? l - b : CRC_BLOCK, end = boff + o + b + m;

				t = xfer_now();
				c = cuip_crc32c(c, p + o + b, m);
				crc_s += xfer_now() - t;
				if (sha) {
					t = xfer_now();
					cuip_sha256_update(&h, p + o + b, m);
					hash_s += xfer_now() - t;
				}
				if (hold || (end - written < CRC_BLOCK && end < sl->s.len))
					continue;
				t = xfer_now();
				rc = write_run(fd, x->sparse[file], buf + written, end - written, sl->s.foff + written,
					       &w->holes);
				io_s += xfer_now() - t;
				written = end;
			}
			it->crc[k] = c;
			if (sha)
				cuip_sha256_final(&h, it->sha + k * CARRIER_HASH_LEN);
			/* Judged on the host: a zero chunk is recorded as such (a
			 * load sets it with a memset), never as inherited. */
			if (it->zero && !x->devscanned && all_zero(p + o, l)) {
				it->zero[k] = 1;
				w->zero += l;
			}
			/* A live save: the hashes of the bytes written, not of
			 * those the scan saw (the job may have written since). */
			if (x->devscanned && x->cfg->live && it->dhash) {
				uint64_t r[3];

				t = xfer_now();
				cuip_chunkscan_host(p + o, l, it->dhash_key, r);
				hash_s += xfer_now() - t;
				carrier_dhash_put(it->dhash + k * CARRIER_DHASH_LEN, r);
			}
			if (rc || !hold)
				continue;
			/* Held: what precedes the chunk goes out, then the chunk
			 * unless the parent has it, compressed where that pays. */
			if (!(it->zero && it->zero[k]) && same_as_parent(it, k)) {
				t = xfer_now();
				if (boff + o > written)
					rc = write_run(fd, x->sparse[file], buf + written, boff + o - written,
						       sl->s.foff + written, &w->holes);
				it->inherited[k] = 1;
				w->inherited += l;
			} else if (zip && (z = zip_chunk(w, it, k, p + o, l))) {
				t = xfer_now();
				if (boff + o > written)
					rc = write_run(fd, x->sparse[file], buf + written, boff + o - written,
						       sl->s.foff + written, &w->holes);
				if (!rc)
					rc = pwrite_all(fd, w->zbuf, z, sl->s.foff + boff + o);
			} else {
				t = xfer_now();
				rc = write_run(fd, x->sparse[file], buf + written, boff + o + l - written,
					       sl->s.foff + written, &w->holes);
			}
			io_s += xfer_now() - t;
			written = boff + o + l;
		}
	}
	/* A run of small items may end in bytes nobody held back. */
	if (!rc && written < sl->s.len) {
		t = xfer_now();
		rc = write_run(fd, x->sparse[file], buf + written, sl->s.len - written, sl->s.foff + written,
			       &w->holes);
		io_s += xfer_now() - t;
		written = sl->s.len;
	}
	assert(rc || written == sl->s.len); /* pieces tile the slice */
	w->crc_s += crc_s;
	w->io_s += io_s;
	w->hash_s += hash_s;
	if (rc) {
		char nb[160], fb[32];
		xfer_fail(x, rc,
			  "carrier save: %s: writing %" PRIu64 " bytes at file offset %" PRIu64 " of %s failed: %s",
			  xfer_slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.len, sl->s.foff,
			  xfer_file_name(x, x->items[sl->s.item].file, fb, sizeof(fb)), strerror(-rc));
		return -1;
	}
	xfer_account(x, sl->s.len);
	return 0;
}

void xfer_save_worker(struct worker *w)
{
	struct xfer *x = w->x;
	struct slot *a = w->slot[0], *b = w->slot[1];
	bool have_a = xfer_claim(x, &a->s) && !xfer_issue(w, a, true);

	while (have_a) {
		struct slot *t;
		bool have_b = xfer_claim(x, &b->s) && !xfer_issue(w, b, true);

		if (save_finish(w, a))
			return;
		xfer_slice_done(w);
		t = a;
		a = b;
		b = t;
		have_a = have_b;
	}
}

/*
 * Make f's bytes from `start` on read as zeros: nothing to do in a file
 * that ends there (a new one), else punch them out, keeping the size so
 * that the file is never truncated to nothing. Measured on the H200 host
 * (ext4; docs/driver-facts.md, "Containers and tools on Debian 12"): a file ext4 has seen truncated to size 0
 * is flushed when it is closed (its auto_da_alloc), and a 9.5 GB SAVE
 * took 4.1 s instead of 0.25 s, the close queueing every page for the
 * disk. ftruncate only where punching is not supported. 0 or -1.
 */
static int cut_from(int fd, uint64_t start, uint64_t size)
{
	if (size <= start)
		return 0;
	if (!fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)start, (off_t)(size - start)))
		return 0;
	return ftruncate(fd, (off_t)start);
}

/*
 * Save: cut each file at its first item's offset, so that the zero runs
 * save_finish() skips read back as zeros whatever the file held before
 * (a file that cannot be cut, not a regular one, is written in full).
 */
void xfer_save_begin(struct xfer *x)
{
	uint64_t start[CARRIER_FILES_MAX];

	for (size_t f = 0; f < x->nfds; f++)
		start[f] = UINT64_MAX;
	for (size_t i = 0; i < x->n; i++) {
		const struct carrier_item *it = &x->items[i];

		if (it->offset < start[it->file])
			start[it->file] = it->offset;
		if (it->offset + it->size > x->fend[it->file])
			x->fend[it->file] = it->offset + it->size;
	}
	for (size_t f = 0; f < x->nfds; f++) {
		struct stat sb;

		x->sparse[f] = start[f] != UINT64_MAX && !fstat(x->fds[f], &sb) && S_ISREG(sb.st_mode) &&
			       !cut_from(x->fds[f], start[f], (uint64_t)sb.st_size);
	}
}

/* Save: a sparse file whose carrier ends in a hole is extended to its end;
 * one that held more before (punched, its size kept) is cut at its end. */
int xfer_save_end(struct xfer *x)
{
	for (size_t f = 0; f < x->nfds; f++) {
		struct stat sb;

		if (!x->sparse[f] || (!fstat(x->fds[f], &sb) && (uint64_t)sb.st_size == x->fend[f]))
			continue;
		if (ftruncate(x->fds[f], (off_t)x->fend[f])) {
			int e = errno;
			char fb[32];

			xfer_fail(x, -e, "carrier save: cannot size %s to %" PRIu64 " bytes: %s",
				  xfer_file_name(x, f, fb, sizeof(fb)), x->fend[f], strerror(e));
			return -e;
		}
	}
	return 0;
}

/* ---- decided before the pipeline ------------------------------------------ */

/* The device scan's progress: to the plugin's page and the caller's callback. */
static void scan_progress(void *arg, uint64_t scanned, uint64_t decided)
{
	struct xfer *x = arg;
	struct cuip_save_progress *pg = x->cfg->progress_page;

	if (pg) {
		cuip_progress_store(&pg->scanned, scanned);
		cuip_progress_store(&pg->done, decided);
	}
	if (x->cfg->progress && x->cfg->progress_every)
		x->cfg->progress(x->cfg->progress_arg, decided, x->p_grand);
}

/*
 * Save: where every item asks for it (zero and dhash arrays) and the
 * configuration allows it, the device scan decides the zero and unchanged
 * chunks, which the slices then leave out. A device that cannot scan
 * leaves the save to the host (scan_fallback says why); one that fails
 * while scanning fails the save.
 */
void xfer_save_scan(struct xfer *x, char *why, size_t whylen)
{
	CUcontext *ctxs;
	bool asked = x->cfg->device_scan && x->n;
	char msg[ERRMSG];
	int rc;

	for (size_t i = 0; asked && i < x->n; i++)
		asked = !x->items[i].size || (x->items[i].zero && x->items[i].dhash);
	if (!asked || x->rc)
		return;
	ctxs = malloc(sizeof(*ctxs) * x->n);
	if (!ctxs) {
		xfer_fail(x, -ENOMEM, "carrier save: out of memory for the device scan");
		return;
	}
	for (size_t i = 0; i < x->n; i++)
		ctxs[i] = x->ctxs[x->item_ctx[i]];
	rc = carrier_devscan(x->ops, x->items, x->n, ctxs, scan_progress, x, &x->scan, msg, sizeof(msg));
	free(ctxs);
	if (rc == -ENOTSUP) {
		size_t l = strnlen(msg, whylen - 1);

		memcpy(why, msg, l); /* cut to fit: a reason, not an error */
		why[l] = '\0';
		return;
	}
	if (rc) {
		xfer_fail(x, rc, "carrier save: %s", msg);
		return;
	}
	x->devscanned = true;
	x->skips = true;
	x->skipped = x->scan.zero + x->scan.inherited;
}
