/*
 * carrier.c - host carriers: stream shared allocations between device
 * memory and a CRIU image file through bounded pinned staging. Contract in
 * carrier.h; called by the interposer's SAVE and LOAD operations.
 *
 * A transfer cuts the items into slices of at most one staging buffer:
 * whole chunks of one large item, or a run of consecutive small items of
 * one file and one context whose file ranges are contiguous (the first may
 * be the tail of a large item). A run costs one device copy per item but a
 * single stream wait and a single pwrite()/pread(), so thousands of small
 * allocations do not each pay a synchronization round trip and a system
 * call. The file layout and each item's chunk CRCs are the same whichever
 * way the items were cut. Each I/O thread owns two staging buffers
 * ("slots"), each with its own stream per context, and claims slices in
 * file order from one cursor per file, taking the files in turn (buffered
 * writes to one file serialize in the kernel; to several files they run in
 * parallel):
 *
 *   save: copy slice k+1 device->host on slot B (one async copy per item,
 *         into the item's place in the buffer) while slot A's slice k is
 *         checksummed and pwrite()n at its file offset, then swap.
 *   load: pread() slice k into a slot whose previous host->device copies
 *         have finished, check every item's chunk CRCs, start one copy per
 *         item; alternate slots.
 *
 * Within a slice, CRC and file I/O alternate in blocks of CRC_BLOCK bytes
 * (a chunk's CRC continues across them), so each byte is still in the
 * core's cache when it is touched the second time. Each I/O thread pins
 * its own two buffers when it starts (in parallel with the others, which
 * already move bytes) and unpins them when its last pass ends.
 *
 * A save owns each regular file from its first item on: it makes those
 * bytes zero (punched out of an old file, never a truncation to size 0:
 * see cut_from), writes no piece of a 64 KiB unit (aligned in the file)
 * that is all zero, then sets the file's size to its end. Those bytes read back as
 * zeros and whole units hold no disk block, so memory a framework reserved
 * but never wrote costs neither the write nor the restore's read. The CRCs
 * still cover every byte.
 *
 * Striping (carrier_save_striped/_load_striped) sits on top: a pure split
 * (carrier_stripe_split) cuts each item into extents of whole chunks and
 * gives each to the least-filled file; the extents are items of their own
 * for the pipeline above, with crc pointing into their item's array and
 * name_offset keeping chunk numbers in messages those of the allocation.
 * Staging is sized to need: at most the bytes carried (or two chunks).
 *
 * An error names the item and its bytes where one item is to blame (an
 * async copy refused, a bad CRC, the file ending inside it), and the run's
 * first and last items where one wait or one write covers them all.
 *
 * The calling thread is thread 0 and also runs the progress callback. All of
 * a transfer's state lives in one mmap'd block (struct xfer); its mutex
 * guards the cursors, the first error, the byte count and the pinned-byte
 * count. Slots and the per-thread timings belong to one thread and need no
 * lock.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "carrier.h"
#include "chunkscan.h"
#include "deadline.h"
#include "devscan.h"
#include "errfmt.h"
#include "sha256.h"
#include "threads.h"
#include "wire.h"
#include "zchunk.h"

#define MIB  (1024ull * 1024)
#define PAGE 4096ull
/* 224 MiB of staging keeps a process within 256 MiB of extra resident
 * memory during a transfer: measured on the fake driver (private-bench),
 * staging plus 1.3 MiB for threads, index and the driver's bookkeeping
 * (docs/benchmarks.md). A carrier smaller than this pins its own size. */
#define DEFAULT_STAGING (224 * MIB)
#define DEFAULT_CHUNK	(1u << 20) /* as the plugin's CUINTERPOSE_TEST_CHUNK_SIZE */
/* Measured on an H200 host (docs/benchmarks.md): buffered writes to one
 * file serialize on its inode lock, so save peaks at two threads per file
 * (one writes while the other copies and checksums); reads scale with
 * threads up to about 12. */
#define DEFAULT_SAVE_THREADS 2 /* per file */
#define DEFAULT_LOAD_THREADS 12
#define DEFAULT_MAX_THREADS  16
#define MAX_THREADS	     64
#define SLOTS_PER_THREAD     2
#define THREAD_STACK	     (1u << 20)
/* Buffer size that runs of small items ask for (bigger items get what they
 * need): one stream wait and one pwrite()/pread() then serve 64 items of
 * 4 KiB. Measured on the fake driver with 1,250 and 20,000 items of 4 KiB
 * (carrier-bench -i 4K): 256 KiB-1 MiB runs cost 2.5-4 us per item, runs
 * as big as all the bytes 4-6 us (fresh staging to fault in, no overlap
 * of copies with file I/O), one item per slice 6-7.5 us. */
#define RUN_BYTES (256u << 10)
/* Bytes checksummed and then written (save), or read and then checksummed
 * (load), at a time within a slice: small enough to stay in a core's L2
 * between the two, so each byte crosses the memory bus once on the CPU
 * side; big enough that the extra system calls cost little. */
#define CRC_BLOCK (512u << 10)
/* Zero runs of a saved carrier are left as holes in units of this many
 * bytes, aligned in the file (a multiple of any file system's block). */
#define HOLE_UNIT (64u << 10)
/* The largest staging buffer a slot gets (a chunk bigger than this still
 * gets its size). Small buffers keep a save's bytes in the host's
 * last-level cache from the device copy to the CRC and the write: the
 * copy's writes land in the cache (Intel DDIO) as long as what all threads
 * have in flight fits there, so each byte crosses the memory bus once on
 * the host instead of three times. Measured on the H200 host (Xeon, 300 MiB
 * L3; docs/benchmarks.md, staging-sweep.sh), striped over 16 files at 16
 * threads: 8 MiB buffers save at 0.83 of the best plain parallel write
 * (summed CRC time 1.81 s for 8 GiB), 4 MiB at 0.80 (1.64 s), 2 MiB at
 * 1.03 (0.69 s); loads 0.83, 1.00 and 0.94. */
#define BUF_MAX (2u << 20)
#define ERRMSG	512

enum pass { PASS_SAVE, PASS_VERIFY, PASS_LOAD };

/*
 * What one staging buffer carries at a time: either whole chunks of one
 * item (a large item takes several slices), or a run of consecutive items
 * of one file and one context whose file ranges are contiguous, the first
 * possibly the tail of a large item and the others whole. A run moves with
 * one device copy per item but one stream wait and one pwrite()/pread(),
 * which is what makes thousands of small items cheap. Items of other files
 * and empty items between `item` and `last` are not part of it.
 */
struct slice {
	size_t item;   /* first item */
	size_t last;   /* last item with bytes in the slice (== item: one item) */
	size_t nitems; /* items with bytes in it */
	uint64_t off;  /* from the first item's start (a multiple of its chunk size) */
	uint64_t len;  /* bytes in all, laid out in the buffer as in the file */
	uint64_t foff; /* file offset of its first byte */
};

/* One staging buffer, its streams (one per context) and its slice. */
struct slot {
	void *buf;
	CUstream *streams; /* [xfer->nctx] */
	struct slice s;
	bool busy; /* load: a host->device copy from buf may be in flight */
	bool own;  /* buf is our mapping, registered (else the driver's cuMemHostAlloc) */
};

struct worker {
	struct xfer *x;
	unsigned idx;
	struct slot *slot[SLOTS_PER_THREAD];
	CUcontext cur; /* context current on this thread */
	bool has_cur;
	pthread_t tid;
	void *stack; /* mmap'd with a guard page; NULL for thread 0 */
	bool started;
	double copy_s, io_s, crc_s, pin_s, hash_s, zip_s;
	uint64_t holes;		      /* save: zero bytes left as holes */
	uint64_t inherited;	      /* save: bytes of chunks the parent has, not written */
	uint64_t zip_raw, zip_stored; /* chunks stored compressed: raw and frame bytes */
	uint64_t zero;		      /* save on the host: bytes of chunks found all zero */
	/* Compressed chunks (x->zws_len > 0): the thread's codec workspace,
	 * mapped when it starts, unmapped in teardown(): a frame buffer
	 * (zbuf, x->zbuf_len bytes) and a zstd context in the rest. */
	void *zws;
	void *zctx;
	uint8_t *zbuf;
};

struct xfer {
	const struct carrier_ops *ops;
	const struct carrier_config *cfg;
	enum pass pass;
	const int *fds; /* [nfds]; items[i].file indexes it */
	size_t nfds;
	struct carrier_item *items; /* const for load: never written there */
	size_t n;
	uint64_t total;

	CUcontext *ctxs; /* distinct contexts of the items */
	size_t nctx;
	uint32_t *item_ctx; /* index into ctxs per item */

	uint64_t buf_bytes;
	unsigned nthreads, nslots;
	struct slot *slots;
	struct worker *workers;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* under lock */
	size_t *cur_item; /* [nfds]: per-file cursors */
	uint64_t *cur_off;
	size_t next_file; /* round robin over files in claim() */
	uint64_t done;
	unsigned running; /* threads other than the caller still working */
	int rc;		  /* first error */
	char msg[ERRMSG];
	double copy_s, io_s, crc_s, pin_s, hash_s, zip_s; /* summed after the threads are joined */
	uint64_t holes, inherited, zip_raw, zip_stored;	  /* summed after the threads are joined */
	uint64_t zero_host;				  /* summed after the threads are joined */
	/* Chunks decided before the pipeline (set before the threads start):
	 * save, the device scan's zero and unchanged chunks; load, the zero
	 * chunks a memset set. skips: the slices leave them out; skipped:
	 * their bytes, counted as done by every pass. */
	bool devscanned, skips;
	uint64_t skipped;
	struct devscan_report scan;
	uint64_t zero_set; /* load: bytes set by memset */
	/* Compressed chunks: each thread's codec workspace (0: none, no chunk
	 * is compressed), its frame buffer's share; save compresses. */
	size_t zws_len, zbuf_len;
	bool zsave;
	/* save: each file's carrier ends at fend; sparse once it was cut at
	 * its first item's offset (a regular file), so a zero run need not be
	 * written (set before the threads start). */
	uint64_t fend[CARRIER_FILES_MAX];
	bool sparse[CARRIER_FILES_MAX];

	/* progress, touched by thread 0 only */
	uint64_t p_base, p_grand, p_next;
	uint64_t pinned; /* staging bytes allocated, under lock */
	size_t map_len;	 /* this block */
};

/* ---- small helpers ---------------------------------------------------- */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *cu_name(const struct carrier_ops *ops, CUresult rc)
{
	const char *s = NULL;

	if (ops->get_error_name && ops->get_error_name(rc, &s) == CUDA_SUCCESS && s)
		return s;
	return "CUDA error";
}

static const char *item_name(const struct carrier_item *it, size_t i, char *buf, size_t len)
{
	if (it->name)
		return it->name;
	snprintf(buf, len, "item %zu", i);
	return buf;
}

/* The file of index f for messages: its name, or "file f". */
static const char *cfg_file_name(const struct carrier_config *c, size_t f, char *buf, size_t len)
{
	if (c->file_names && f < c->n_file_names && c->file_names[f])
		return c->file_names[f];
	snprintf(buf, len, "file %zu", f);
	return buf;
}

#define file_name(x, f, buf, len) cfg_file_name((x)->cfg, f, buf, len)

/* Record the transfer's first error; later ones are consequences. */
static void fail(struct xfer *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void fail(struct xfer *x, int rc, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&x->lock);
	if (!x->rc) {
		x->rc = rc;
		va_start(ap, fmt);
		vsnprintf(x->msg, sizeof(x->msg), fmt, ap);
		va_end(ap);
	}
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

static const char *pass_name(enum pass p)
{
	return p == PASS_SAVE ? "save" : p == PASS_VERIFY ? "verify" : "load";
}

/* Whether chunk k of item it was decided before the pipeline (skipped by it). */
static bool skipped(const struct xfer *x, const struct carrier_item *it, uint64_t k)
{
	return x->skips && ((it->zero && it->zero[k]) || (x->pass == PASS_SAVE && it->inherited && it->inherited[k]));
}

static bool any_skipped(const struct xfer *x, const struct carrier_item *it)
{
	for (uint64_t k = 0; x->skips && k < it->ncrc; k++)
		if (skipped(x, it, k))
			return true;
	return false;
}

/* Bytes of item it per slice: whole chunks, at most one buffer. */
static uint64_t slice_max(const struct xfer *x, const struct carrier_item *it)
{
	uint64_t s = x->buf_bytes / it->chunk_size * it->chunk_size;

	/* buf_bytes >= min(chunk, size) by construction (plan()). */
	return s ? s : x->buf_bytes;
}

/*
 * The slice that starts at byte `off` of item i: as many whole chunks of it
 * as one buffer holds, and when that reaches the item's end, the whole items
 * of its file after it for as long as they are contiguous in the file, in
 * the same context, and fit in the buffer.
 */
static void cut(const struct xfer *x, size_t i, uint64_t off, struct slice *s)
{
	const struct carrier_item *it = &x->items[i];
	uint64_t m = slice_max(x, it), left = it->size - off, next = it->offset + it->size;

	assert(off < it->size && off % it->chunk_size == 0);
	s->item = s->last = i;
	s->nitems = 1;
	s->off = off;
	s->foff = it->offset + off;
	s->len = left < m ? left : m;
	/* A decided chunk ends the slice (next_slice starts past it). */
	for (uint64_t o = it->chunk_size; x->skips && o < s->len; o += it->chunk_size)
		if (skipped(x, it, (off + o) / it->chunk_size)) {
			s->len = o;
			break;
		}
	if (s->len < left)
		return;
	for (size_t j = i + 1; j < x->n; j++) {
		const struct carrier_item *jt = &x->items[j];

		if (jt->file != it->file || !jt->size)
			continue;
		if (jt->offset != next || x->item_ctx[j] != x->item_ctx[i] || jt->size > x->buf_bytes - s->len ||
		    any_skipped(x, jt))
			break;
		s->len += jt->size;
		next += jt->size;
		s->last = j;
		s->nitems++;
	}
}

/* Next slice of file f from the cursor (*ci, *co), advancing it; false when
 * the file is done. */
static bool next_slice(const struct xfer *x, size_t f, size_t *ci, uint64_t *co, struct slice *s)
{
	while (*ci < x->n) {
		const struct carrier_item *it = &x->items[*ci];

		while (*co < it->size && skipped(x, it, *co / it->chunk_size))
			*co += it->chunk_size;
		if (it->file != f || *co >= it->size) {
			(*ci)++;
			*co = 0;
			continue;
		}
		cut(x, *ci, *co, s);
		if (s->last == *ci && *co + s->len < it->size) {
			*co += s->len;
		} else {
			*ci = s->last + 1;
			*co = 0;
		}
		return true;
	}
	return false;
}

static uint64_t count_slices(const struct xfer *x)
{
	struct slice s;
	uint64_t k = 0;

	for (size_t f = 0; f < x->nfds; f++) {
		size_t ci = 0;
		uint64_t co = 0;

		while (next_slice(x, f, &ci, &co, &s))
			k++;
	}
	return k;
}

/* Item i's part of slice s: bytes [*off, *off + *len) of the item, at *boff
 * in the buffer. False when i is not in the slice (another file, empty). */
static bool piece(const struct xfer *x, const struct slice *s, size_t i, uint64_t *off, uint64_t *len, uint64_t *boff)
{
	const struct carrier_item *it = &x->items[i];

	if (i != s->item && (it->file != x->items[s->item].file || !it->size))
		return false;
	*off = i == s->item ? s->off : 0;
	*len = s->nitems == 1 ? s->len : it->size - *off;
	*boff = it->offset + *off - s->foff;
	assert(*boff + *len <= s->len);
	return true;
}

/* The slice's items for a message: "alloc 3", or "alloc 3 through alloc 9
 * (7 items)". */
static const char *slice_name(const struct xfer *x, const struct slice *s, char *buf, size_t len)
{
	char a[32], b[32];

	if (s->nitems == 1)
		return item_name(&x->items[s->item], s->item, buf, len);
	snprintf(buf, len, "%s through %s (%zu items)", item_name(&x->items[s->item], s->item, a, sizeof(a)),
		 item_name(&x->items[s->last], s->last, b, sizeof(b)), s->nitems);
	return buf;
}

/* Next slice of file f in file order; false when the file is done. Under lock. */
static bool claim_file(struct xfer *x, size_t f, struct slice *s)
{
	return next_slice(x, f, &x->cur_item[f], &x->cur_off[f], s);
}

/* Take the next slice, files in turn; false when none is left or on error. */
static bool claim(struct xfer *x, struct slice *s)
{
	bool got = false;

	pthread_mutex_lock(&x->lock);
	for (size_t k = 0; !x->rc && !got && k < x->nfds; k++) {
		size_t f = (x->next_file + k) % x->nfds;

		got = claim_file(x, f, s);
		if (got)
			x->next_file = f + 1;
	}
	pthread_mutex_unlock(&x->lock);
	return got;
}

static void account(struct xfer *x, uint64_t bytes)
{
	struct cuip_save_progress *pg = x->pass == PASS_SAVE ? x->cfg->progress_page : NULL;

	pthread_mutex_lock(&x->lock);
	x->done += bytes;
	if (pg) {
		cuip_progress_store(&pg->copied, x->done);
		cuip_progress_store(&pg->done, x->skipped + x->done);
	}
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

static int use_ctx(struct worker *w, size_t item)
{
	struct xfer *x = w->x;
	CUcontext c = x->ctxs[x->item_ctx[item]];
	CUresult rc;

	if (w->has_cur && w->cur == c)
		return 0;
	rc = x->ops->ctx_set_current(c);
	if (rc != CUDA_SUCCESS) {
		char nb[32];
		fail(x, -EIO, "carrier %s: %s: cuCtxSetCurrent failed: %s (%d)", pass_name(x->pass),
		     item_name(&x->items[item], item, nb, sizeof(nb)), cu_name(x->ops, rc), rc);
		return -1;
	}
	w->cur = c;
	w->has_cur = true;
	return 0;
}

static CUstream slot_stream(const struct xfer *x, const struct slot *sl)
{
	return sl->streams[x->item_ctx[sl->s.item]];
}

/* Wait for the slot's device copy; on failure record it. */
static int slot_wait(struct worker *w, struct slot *sl)
{
	struct xfer *x = w->x;
	double t = now();
	CUresult rc = x->ops->stream_synchronize(slot_stream(x, sl));

	w->copy_s += now() - t;
	if (rc != CUDA_SUCCESS && sl->s.nitems == 1) {
		char nb[32];
		const struct carrier_item *it = &x->items[sl->s.item];
		fail(x, -EIO, "carrier %s: %s: device copy of bytes %" PRIu64 "-%" PRIu64 " failed: %s (%d)",
		     pass_name(x->pass), item_name(it, sl->s.item, nb, sizeof(nb)), sl->s.off,
		     sl->s.off + sl->s.len - 1, cu_name(x->ops, rc), rc);
		return -1;
	}
	if (rc != CUDA_SUCCESS) {
		/* One wait covers the run's copies: any of them may have failed. */
		char nb[160];
		fail(x, -EIO,
		     "carrier %s: %s: device copies of the run (file offsets %" PRIu64 "-%" PRIu64
		     ", one stream wait) failed: %s (%d)",
		     pass_name(x->pass), slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.foff, sl->s.foff + sl->s.len - 1,
		     cu_name(x->ops, rc), rc);
		return -1;
	}
	return 0;
}

/* Progress callback, thread 0 only, no lock held while it runs. */
static void report(struct xfer *x, bool final)
{
	const struct carrier_config *c = x->cfg;
	uint64_t done;

	if (!c->progress || !c->progress_every)
		return;
	pthread_mutex_lock(&x->lock);
	done = x->p_base + x->skipped + x->done;
	pthread_mutex_unlock(&x->lock);
	if (done < x->p_next && !final)
		return;
	c->progress(c->progress_arg, done, x->p_grand);
	x->p_next = done - done % c->progress_every + c->progress_every;
}

static void slice_done(struct worker *w)
{
	if (w->idx == 0)
		report(w->x, false);
}

/* ---- save --------------------------------------------------------------- */

/* One copy per item of the slot's slice, all on one stream: device->host
 * for save, host->device for load. A failed copy names its item and bytes. */
static int issue(struct worker *w, struct slot *sl, bool to_host)
{
	struct xfer *x = w->x;
	CUstream st = slot_stream(x, sl);
	uint64_t off, len, boff;
	CUresult rc;

	if (use_ctx(w, sl->s.item))
		return -1;
	for (size_t i = sl->s.item; i <= sl->s.last; i++) {
		const struct carrier_item *it = &x->items[i];
		uint8_t *host;

		if (!piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		host = (uint8_t *)sl->buf + boff;
		rc = to_host ? x->ops->memcpy_dtoh_async(host, it->va + off, len, st)
			     : x->ops->memcpy_htod_async(it->va + off, host, len, st);
		if (rc != CUDA_SUCCESS) {
			char nb[32];
			fail(x, -EIO, "carrier %s: %s: %s of bytes %" PRIu64 "-%" PRIu64 " %s %#llx failed: %s (%d)",
			     to_host ? "save" : "load", item_name(it, i, nb, sizeof(nb)),
			     to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", off, off + len - 1,
			     to_host ? "at" : "to", (unsigned long long)(it->va + off), cu_name(x->ops, rc), rc);
			return -1;
		}
	}
	return 0;
}

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
	t = now();
	z = cuip_zchunk_compress(w->zctx, w->x->cfg->compress_level, w->zbuf, w->x->zbuf_len, p, l);
	w->zip_s += now() - t;
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

	if (slot_wait(w, sl))
		return -1;
	for (size_t i = sl->s.item; !rc && i <= sl->s.last; i++) {
		struct carrier_item *it = &x->items[i];
		const uint8_t *p;

		if (!piece(x, &sl->s, i, &off, &len, &boff))
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

				t = now();
				c = cuip_crc32c(c, p + o + b, m);
				crc_s += now() - t;
				if (sha) {
					t = now();
					cuip_sha256_update(&h, p + o + b, m);
					hash_s += now() - t;
				}
				if (hold || (end - written < CRC_BLOCK && end < sl->s.len))
					continue;
				t = now();
				rc = write_run(fd, x->sparse[file], buf + written, end - written, sl->s.foff + written,
					       &w->holes);
				io_s += now() - t;
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

				t = now();
				cuip_chunkscan_host(p + o, l, it->dhash_key, r);
				hash_s += now() - t;
				carrier_dhash_put(it->dhash + k * CARRIER_DHASH_LEN, r);
			}
			if (rc || !hold)
				continue;
			/* Held: what precedes the chunk goes out, then the chunk
			 * unless the parent has it, compressed where that pays. */
			if (!(it->zero && it->zero[k]) && same_as_parent(it, k)) {
				t = now();
				if (boff + o > written)
					rc = write_run(fd, x->sparse[file], buf + written, boff + o - written,
						       sl->s.foff + written, &w->holes);
				it->inherited[k] = 1;
				w->inherited += l;
			} else if (zip && (z = zip_chunk(w, it, k, p + o, l))) {
				t = now();
				if (boff + o > written)
					rc = write_run(fd, x->sparse[file], buf + written, boff + o - written,
						       sl->s.foff + written, &w->holes);
				if (!rc)
					rc = pwrite_all(fd, w->zbuf, z, sl->s.foff + boff + o);
			} else {
				t = now();
				rc = write_run(fd, x->sparse[file], buf + written, boff + o + l - written,
					       sl->s.foff + written, &w->holes);
			}
			io_s += now() - t;
			written = boff + o + l;
		}
	}
	/* A run of small items may end in bytes nobody held back. */
	if (!rc && written < sl->s.len) {
		t = now();
		rc = write_run(fd, x->sparse[file], buf + written, sl->s.len - written, sl->s.foff + written,
			       &w->holes);
		io_s += now() - t;
		written = sl->s.len;
	}
	assert(rc || written == sl->s.len); /* pieces tile the slice */
	w->crc_s += crc_s;
	w->io_s += io_s;
	w->hash_s += hash_s;
	if (rc) {
		char nb[160], fb[32];
		fail(x, rc, "carrier save: %s: writing %" PRIu64 " bytes at file offset %" PRIu64 " of %s failed: %s",
		     slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.len, sl->s.foff,
		     file_name(x, x->items[sl->s.item].file, fb, sizeof(fb)), strerror(-rc));
		return -1;
	}
	account(x, sl->s.len);
	return 0;
}

static void save_worker(struct worker *w)
{
	struct xfer *x = w->x;
	struct slot *a = w->slot[0], *b = w->slot[1];
	bool have_a = claim(x, &a->s) && !issue(w, a, true);

	while (have_a) {
		struct slot *t;
		bool have_b = claim(x, &b->s) && !issue(w, b, true);

		if (save_finish(w, a))
			return;
		slice_done(w);
		t = a;
		a = b;
		b = t;
		have_a = have_b;
	}
}

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

		if (!piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		fo = sl->s.foff + boff;
		if (at >= fo + len)
			continue;
		fail(x, -ENODATA,
		     "carrier %s: %s: %s ends at offset %" PRIu64 ", %" PRIu64 " bytes short of the %" PRIu64
		     " bytes at %" PRIu64 " (chunk %" PRIu64 "; truncated carrier image)",
		     pass_name(x->pass), item_name(it, i, nb, sizeof(nb)), file_name(x, it->file, fb, sizeof(fb)), at,
		     fo + len - at, len, fo, (it->name_offset + off + (at > fo ? at - fo : 0)) / it->chunk_size);
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

	fail(x, -EBADMSG,
	     "carrier %s: %s: chunk %" PRIu64 " (bytes %" PRIu64 "-%" PRIu64 ", file offset %" PRIu64
	     ") of %s has crc32c %#010x, the index says %#010x (corrupt carrier image)",
	     pass_name(x->pass), item_name(it, i, nb, sizeof(nb)), (base + off + o) / it->chunk_size, base + off + o,
	     base + off + o + l - 1, foff + o, file_name(x, it->file, fb, sizeof(fb)), c, it->crc[k]);
}

/* Chunk k of item i, stored compressed in z bytes, does not come out as
 * its l bytes (ret -EBADMSG), or its stored length cannot be (-EINVAL). */
static void bad_frame(struct xfer *x, size_t i, uint64_t off, uint64_t o, uint64_t l, uint64_t k, uint32_t z, int ret)
{
	const struct carrier_item *it = &x->items[i];
	char nb[32], fb[32];

	fail(x, -EBADMSG,
	     "carrier %s: %s: chunk %" PRIu64 " (file offset %" PRIu64 " of %s) %s %" PRIu32 " bytes for its %" PRIu64
	     " (%s)",
	     pass_name(x->pass), item_name(it, i, nb, sizeof(nb)), (it->name_offset + off + o) / it->chunk_size,
	     it->offset + off + o, file_name(x, it->file, fb, sizeof(fb)),
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
	t = now();
	rc = cuip_pread_all(w->x->fds[it->file], w->zbuf, z, foff, got);
	*io_s += now() - t;
	if (rc)
		return rc;
	t = now();
	rc = cuip_zchunk_decompress(w->zctx, p, l, w->zbuf, z);
	w->zip_s += now() - t;
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

		if (!piece(x, &sl->s, i, &off, &len, &boff))
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
				t = now();
				c = cuip_crc32c(0, p + o, l);
				crc_s += now() - t;
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
					t = now();
					rc = cuip_pread_all(fd, buf + have, to - have, sl->s.foff + have, &got);
					io_s += now() - t;
					if (rc)
						break;
					have = to;
				}
				t = now();
				c = cuip_crc32c(c, p + o + b, m);
				crc_s += now() - t;
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
		fail(x, -EIO, "carrier %s: %s: reading %" PRIu64 " bytes at file offset %" PRIu64 " of %s failed: %s",
		     pass_name(x->pass), slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.len, sl->s.foff,
		     file_name(x, x->items[sl->s.item].file, fb, sizeof(fb)), strerror(-rc));
	}
	return rc ? -1 : 0;
}

static int load_issue(struct worker *w, struct slot *sl)
{
	if (issue(w, sl, false))
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
	if (slot_wait(w, sl))
		return -1;
	account(w->x, sl->s.len);
	return 0;
}

static void load_worker(struct worker *w)
{
	struct xfer *x = w->x;
	struct slice s;
	unsigned k = 0;

	while (claim(x, &s)) {
		struct slot *sl = w->slot[k++ % SLOTS_PER_THREAD];

		if (load_retire(w, sl))
			return;
		sl->s = s;
		if (load_read(w, sl))
			return;
		if (x->pass == PASS_VERIFY)
			account(x, s.len);
		else if (load_issue(w, sl))
			return;
		slice_done(w);
	}
	for (unsigned i = 0; i < SLOTS_PER_THREAD; i++)
		if (load_retire(w, w->slot[i]))
			return;
}

/* ---- threads ---------------------------------------------------------------- */

/* One pinned staging buffer: our own pages, each written once (the page
 * faults run in parallel over the threads) and registered portable; where
 * the driver has no registration or refuses it, the driver's own pinned
 * allocation. *own says which (staging_put). */
static CUresult staging_get(const struct carrier_ops *ops, uint64_t bytes, void **p, bool *own)
{
	*own = false;
	if (ops->mem_host_register && ops->mem_host_unregister) {
		void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (m != MAP_FAILED) {
			memset(m, 0, bytes);
			if (ops->mem_host_register(m, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
				*p = m;
				*own = true;
				return CUDA_SUCCESS;
			}
			munmap(m, bytes);
		}
	}
	if (ops->mem_host_alloc)
		return ops->mem_host_alloc(p, bytes, CU_MEMHOSTALLOC_PORTABLE);
	return ops->mem_alloc_host(p, bytes);
}

static void staging_put(const struct carrier_ops *ops, struct slot *sl, uint64_t bytes)
{
	if (sl->own) {
		ops->mem_host_unregister(sl->buf);
		munmap(sl->buf, bytes);
	} else {
		ops->mem_free_host(sl->buf);
	}
	sl->buf = NULL;
	sl->own = false;
}

/* Pin the thread's own staging buffers (those not pinned by an earlier
 * pass), with context 0 current: portable pinning makes them usable from
 * every context. Each thread pins its own, so pinning runs in parallel and
 * a thread starts moving bytes as soon as its buffers are there rather
 * than after all of them. */
static int pin_slots(struct worker *w)
{
	struct xfer *x = w->x;
	const struct carrier_ops *ops = x->ops;
	double t = now();
	CUresult rc;

	if (!x->total)
		return 0; /* nothing to carry: no staging */
	for (unsigned s = 0; s < SLOTS_PER_THREAD; s++) {
		struct slot *sl = w->slot[s];
		void *p = NULL;

		if (sl->buf)
			continue;
		if (!w->has_cur || w->cur != x->ctxs[0]) {
			rc = ops->ctx_set_current(x->ctxs[0]);
			if (rc != CUDA_SUCCESS) {
				fail(x, -EIO, "carrier %s: cuCtxSetCurrent(%p) failed: %s (%d)", pass_name(x->pass),
				     (void *)x->ctxs[0], cu_name(ops, rc), rc);
				return -1;
			}
			w->cur = x->ctxs[0];
			w->has_cur = true;
		}
		rc = staging_get(ops, x->buf_bytes, &p, &sl->own);
		if (rc != CUDA_SUCCESS) {
			fail(x, -ENOMEM, "carrier %s: cannot pin %u x %" PRIu64 " bytes of staging: %s (%d)",
			     pass_name(x->pass), x->nslots, x->buf_bytes, cu_name(ops, rc), rc);
			return -1;
		}
		sl->buf = p;
		pthread_mutex_lock(&x->lock);
		x->pinned += x->buf_bytes;
		pthread_mutex_unlock(&x->lock);
	}
	w->pin_s += now() - t;
	return 0;
}

/* After the last pass: wait for whatever the thread's streams still carry
 * and unpin its buffers, in parallel with the other threads (teardown()
 * frees what is left on the calling thread). */
static void release_slots(struct worker *w)
{
	struct xfer *x = w->x;
	const struct carrier_ops *ops = x->ops;

	for (unsigned s = 0; s < SLOTS_PER_THREAD; s++) {
		struct slot *sl = w->slot[s];

		if (!sl->buf)
			continue;
		for (size_t c = 0; c < x->nctx; c++) {
			if (!sl->streams[c])
				continue;
			if ((!w->has_cur || w->cur != x->ctxs[c]) && ops->ctx_set_current(x->ctxs[c]) != CUDA_SUCCESS)
				return; /* teardown() tries again */
			w->cur = x->ctxs[c];
			w->has_cur = true;
			ops->stream_synchronize(sl->streams[c]);
		}
		staging_put(ops, sl, x->buf_bytes);
	}
}

/* The thread's codec workspace, where chunks are (or may be) stored
 * compressed: mapped, not allocated (LOAD runs with the application's
 * threads frozen). Kept across passes; teardown() unmaps it. */
static int zip_workspace(struct worker *w)
{
	struct xfer *x = w->x;
	uint8_t *p;

	if (!x->zws_len || w->zws)
		return 0;
	p = mmap(NULL, x->zws_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		fail(x, -ENOMEM, "carrier %s: cannot map %zu bytes for compressed chunks: %s", pass_name(x->pass),
		     x->zws_len, strerror(errno));
		return -1;
	}
	w->zws = p;
	w->zbuf = p;
	w->zctx = x->zsave ? cuip_zchunk_cctx(p + x->zbuf_len, x->zws_len - x->zbuf_len)
			   : cuip_zchunk_dctx(p + x->zbuf_len, x->zws_len - x->zbuf_len);
	assert(w->zctx); /* sized for it by zip_plan() */
	return 0;
}

static void work(struct worker *w)
{
	if (pin_slots(w) || zip_workspace(w))
		return;
	if (w->x->pass == PASS_SAVE)
		save_worker(w);
	else
		load_worker(w);
	if (w->x->pass != PASS_VERIFY)
		release_slots(w);
}

static void *thread_main(void *arg)
{
	struct worker *w = arg;
	struct xfer *x = w->x;

	work(w);
	pthread_mutex_lock(&x->lock);
	x->running--;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
	return NULL;
}

/* Stack with a guard page below it, so glibc's stack cache never grows. */
static int start_thread(struct worker *w)
{
	pthread_attr_t attr;
	int rc;

	w->has_cur = false; /* a new thread: no context current on it yet */
	w->stack =
		mmap(NULL, THREAD_STACK + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (w->stack == MAP_FAILED) {
		w->stack = NULL;
		return -errno;
	}
	mprotect(w->stack, PAGE, PROT_NONE);
	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, (uint8_t *)w->stack + PAGE, THREAD_STACK);
	/* Our threads take no asynchronous signals: the application's
	 * handlers never run on them and SIGXFSZ turns into EFBIG. */
	rc = cuip_thread_create(&w->tid, &attr, thread_main, w);
	pthread_attr_destroy(&attr);
	if (rc) {
		munmap(w->stack, THREAD_STACK + PAGE);
		w->stack = NULL;
		return -rc;
	}
	w->started = true;
	return 0;
}

/*
 * One pass over all items with every thread. Returns x->rc.
 */
static int run_pass(struct xfer *x, enum pass pass)
{
	struct worker *w0 = &x->workers[0];
	int rc;

	x->pass = pass;
	x->next_file = 0;
	for (size_t f = 0; f < x->nfds; f++) {
		x->cur_item[f] = 0;
		x->cur_off[f] = 0;
	}
	x->done = 0;
	for (unsigned i = 0; i < x->nslots; i++)
		x->slots[i].busy = false;

	for (unsigned i = 1; i < x->nthreads; i++) {
		pthread_mutex_lock(&x->lock);
		x->running++;
		pthread_mutex_unlock(&x->lock);
		rc = start_thread(&x->workers[i]);
		if (rc) {
			pthread_mutex_lock(&x->lock);
			x->running--;
			pthread_mutex_unlock(&x->lock);
			fail(x, rc, "carrier %s: cannot start I/O thread %u: %s", pass_name(pass), i, strerror(-rc));
			break;
		}
	}

	/* The caller is thread 0; it reports progress after each of its
	 * slices and while it waits for the others. */
	work(w0);
	pthread_mutex_lock(&x->lock);
	while (x->running) {
		struct timespec ts;

		if (x->cfg->progress && x->cfg->progress_every) {
			pthread_mutex_unlock(&x->lock);
			report(x, false);
			pthread_mutex_lock(&x->lock);
			if (!x->running)
				break;
		}
		cuip_deadline_ms(&ts, 100);
		pthread_cond_timedwait(&x->cond, &x->lock, &ts);
	}
	pthread_mutex_unlock(&x->lock);

	for (unsigned i = 1; i < x->nthreads; i++) {
		struct worker *w = &x->workers[i];

		if (!w->started)
			continue;
		pthread_join(w->tid, NULL);
		munmap(w->stack, THREAD_STACK + PAGE);
		w->stack = NULL;
		w->started = false;
	}
	for (unsigned i = 0; i < x->nthreads; i++) {
		struct worker *w = &x->workers[i];

		x->copy_s += w->copy_s;
		x->io_s += w->io_s;
		x->crc_s += w->crc_s;
		x->pin_s += w->pin_s;
		x->holes += w->holes;
		x->inherited += w->inherited;
		x->hash_s += w->hash_s;
		x->zip_s += w->zip_s;
		x->zip_raw += w->zip_raw;
		x->zip_stored += w->zip_stored;
		x->zero_host += w->zero;
		w->copy_s = w->io_s = w->crc_s = w->pin_s = 0;
		w->holes = w->inherited = w->zip_raw = w->zip_stored = w->zero = 0;
		w->hash_s = w->zip_s = 0;
	}
	if (!x->rc && x->done + x->skipped != x->total)
		fail(x, -EIO, "carrier %s: moved %" PRIu64 " bytes and decided %" PRIu64 " before, expected %" PRIu64,
		     pass_name(pass), x->done, x->skipped, x->total);
	return x->rc;
}

/* ---- setup and teardown -------------------------------------------------- */

/* Buffer size and thread count for these items within the staging bound. */
static void plan(struct xfer *x)
{
	const struct carrier_config *c = x->cfg;
	uint64_t need = 1, biggest = 0, share, want, buf, cap;
	unsigned threads = c->threads;
	uint64_t slices;

	if (!threads) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		threads = x->pass == PASS_SAVE ? DEFAULT_SAVE_THREADS * (unsigned)x->nfds : DEFAULT_LOAD_THREADS;
		if (threads > DEFAULT_MAX_THREADS)
			threads = DEFAULT_MAX_THREADS;
		if (cpus > 0 && threads > (unsigned)cpus)
			threads = cpus < DEFAULT_SAVE_THREADS ? DEFAULT_SAVE_THREADS : (unsigned)cpus;
	}
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;

	for (size_t i = 0; i < x->n; i++) {
		const struct carrier_item *it = &x->items[i];
		uint64_t m = it->size < it->chunk_size ? it->size : it->chunk_size;

		if (m > need)
			need = m;
		if (it->size > biggest)
			biggest = it->size;
	}
	need = (need + PAGE - 1) / PAGE * PAGE;
	biggest = (biggest + PAGE - 1) / PAGE * PAGE;
	/* Fewer threads when the staging bound cannot give each of them two
	 * buffers holding a whole chunk. */
	while (threads > 1 && c->staging_bytes / (SLOTS_PER_THREAD * threads) < need)
		threads--;
	want = c->staging_bytes / (SLOTS_PER_THREAD * threads) / PAGE * PAGE;
	if (want > BUF_MAX)
		want = BUF_MAX;
	/* What the largest item needs, or room for a run of small items, an
	 * even share of all the bytes per slot up to RUN_BYTES (so that every
	 * slot has work), whichever is more; large items get what they got
	 * before runs existed. */
	share = (x->total - x->skipped + SLOTS_PER_THREAD * threads - 1) / (SLOTS_PER_THREAD * threads);
	share = share < RUN_BYTES ? (share + PAGE - 1) / PAGE * PAGE : RUN_BYTES;
	buf = biggest > share ? biggest : share;
	if (buf > want)
		buf = want;
	if (buf < need)
		buf = need; /* a chunk must fit: may exceed a tiny staging bound */
	/* Slices of a large item are whole chunks: what a buffer holds beyond
	 * them would be pinned for nothing (512 KiB of a 2 MiB buffer with
	 * 768 KiB chunks). */
	if (buf > need && biggest > buf)
		buf -= buf % need;
	/* Staging sized to need: never more pinned than the bytes carried
	 * (in pages), or than two buffers of one chunk where that is more.
	 * Smaller buffers first (down to a chunk), then fewer threads. */
	cap = (x->total - x->skipped + PAGE - 1) / PAGE * PAGE;
	if (cap < SLOTS_PER_THREAD * need)
		cap = SLOTS_PER_THREAD * need;
	if ((uint64_t)SLOTS_PER_THREAD * threads * buf > cap) {
		uint64_t b = cap / (SLOTS_PER_THREAD * threads) / PAGE * PAGE;

		buf = b > need ? b : need;
	}
	while (threads > 1 && (uint64_t)SLOTS_PER_THREAD * threads * buf > cap)
		threads--;
	x->buf_bytes = buf;
	slices = count_slices(x);
	/* No thread without at least one slice to work on. */
	if (slices < threads)
		threads = slices ? (unsigned)slices : 1;
	x->nthreads = threads;
	x->nslots = threads * SLOTS_PER_THREAD;
}

static int find_ctx(const struct xfer *x, CUcontext c)
{
	for (size_t i = 0; i < x->nctx; i++)
		if (x->ctxs[i] == c)
			return (int)i;
	return -1;
}

/* Items without a context use `cur`, the caller's current one. */
static struct xfer *xfer_new(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds,
			     size_t nfds, struct carrier_item *items, size_t n, CUcontext cur)
{
	size_t len = sizeof(struct xfer);
	size_t o_ctxs, o_ictx, o_slots, o_workers, o_streams, o_curi, o_curo;
	struct xfer *x;
	uint8_t *base;

	/* Upper bounds: contexts <= n, slots <= MAX_THREADS * 2. */
#define ALIGN8(v) (((v) + 7) & ~(size_t)7)
	o_ctxs = len = ALIGN8(len);
	len += n * sizeof(CUcontext);
	o_ictx = len = ALIGN8(len);
	len += n * sizeof(uint32_t);
	o_slots = len = ALIGN8(len);
	len += MAX_THREADS * SLOTS_PER_THREAD * sizeof(struct slot);
	o_workers = len = ALIGN8(len);
	len += MAX_THREADS * sizeof(struct worker);
	o_curi = len = ALIGN8(len);
	len += nfds * sizeof(size_t);
	o_curo = len = ALIGN8(len);
	len += nfds * sizeof(uint64_t);
	o_streams = len = ALIGN8(len);
	len += MAX_THREADS * SLOTS_PER_THREAD * (n ? n : 1) * sizeof(CUstream);
#undef ALIGN8
	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return NULL;
	x = (struct xfer *)base;
	x->map_len = len;
	x->ops = ops;
	x->cfg = cfg;
	x->fds = fds;
	x->nfds = nfds;
	x->cur_item = (size_t *)(base + o_curi);
	x->cur_off = (uint64_t *)(base + o_curo);
	x->items = items;
	x->n = n;
	x->ctxs = (CUcontext *)(base + o_ctxs);
	x->item_ctx = (uint32_t *)(base + o_ictx);
	x->slots = (struct slot *)(base + o_slots);
	x->workers = (struct worker *)(base + o_workers);
	pthread_mutex_init(&x->lock, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadline.h's clock */
		pthread_cond_init(&x->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	for (size_t i = 0; i < n; i++) {
		CUcontext c = items[i].ctx ? items[i].ctx : cur;
		int k = find_ctx(x, c);

		if (!c && !x->rc) {
			char nb[32];
			fail(x, -EINVAL, "carrier: %s has no context and none is current",
			     item_name(&items[i], i, nb, sizeof(nb)));
		}
		if (k < 0) {
			k = (int)x->nctx;
			x->ctxs[x->nctx++] = c;
		}
		x->item_ctx[i] = (uint32_t)k;
		x->total += items[i].size;
	}
	for (unsigned i = 0; i < MAX_THREADS * SLOTS_PER_THREAD; i++)
		x->slots[i].streams = (CUstream *)(base + o_streams) + (size_t)i * (x->nctx ? x->nctx : 1);
	return x;
}

/* Compressed chunks: each thread's workspace, sized for the largest chunk
 * that is (save: may be) stored compressed; none where no chunk is. */
static void zip_plan(struct xfer *x, bool load)
{
	uint64_t chunk = 0;

	x->zsave = !load && x->cfg->compress;
	for (size_t i = 0; i < x->n; i++) {
		const struct carrier_item *it = &x->items[i];
		bool any = false;

		for (uint64_t k = 0; it->stored && !any && k < it->ncrc; k++)
			any = load ? it->stored[k] != 0 : x->zsave;
		if (any && it->chunk_size > chunk)
			chunk = it->chunk_size;
	}
	if (!chunk)
		return;
	x->zbuf_len = ((load ? chunk : cuip_zchunk_bound(chunk)) + 7) & ~(size_t)7;
	x->zws_len =
		x->zbuf_len + (load ? cuip_zchunk_dctx_size() : cuip_zchunk_cctx_size(x->cfg->compress_level, chunk));
}

/* Free every staging buffer and stream (after their copies finished), and
 * the codec workspaces. */
static void teardown(struct xfer *x)
{
	const struct carrier_ops *ops = x->ops;

	for (unsigned i = 0; i < x->nthreads; i++) {
		struct worker *w = &x->workers[i];

		if (w->zws)
			munmap(w->zws, x->zws_len);
		w->zws = w->zctx = w->zbuf = NULL;
	}
	for (unsigned i = 0; i < x->nslots; i++) {
		struct slot *sl = &x->slots[i];

		for (size_t c = 0; c < x->nctx; c++) {
			if (!sl->streams[c])
				continue;
			ops->ctx_set_current(x->ctxs[c]);
			if (sl->buf) /* copies from it may be in flight; release_slots() waited for the rest */
				ops->stream_synchronize(sl->streams[c]);
			ops->stream_destroy(sl->streams[c]);
			sl->streams[c] = NULL;
		}
		if (sl->buf)
			staging_put(ops, sl, x->buf_bytes);
	}
}

/* Create the streams, on the calling thread. */
static int setup(struct xfer *x)
{
	const struct carrier_ops *ops = x->ops;
	CUresult rc;

	if (!x->total)
		return 0;
	for (size_t c = 0; c < x->nctx; c++) {
		rc = ops->ctx_set_current(x->ctxs[c]);
		if (rc != CUDA_SUCCESS) {
			fail(x, -EIO, "carrier %s: cuCtxSetCurrent(%p) failed: %s (%d)", pass_name(x->pass),
			     (void *)x->ctxs[c], cu_name(ops, rc), rc);
			return x->rc;
		}
		for (unsigned i = 0; i < x->nslots; i++) {
			rc = ops->stream_create(&x->slots[i].streams[c], CU_STREAM_NON_BLOCKING);
			if (rc != CUDA_SUCCESS) {
				x->slots[i].streams[c] = NULL;
				fail(x, -EIO, "carrier %s: cuStreamCreate failed: %s (%d)", pass_name(x->pass),
				     cu_name(ops, rc), rc);
				return x->rc;
			}
		}
	}
	/* Context 0 stays current for thread 0; the I/O threads pin their
	 * own staging (pin_slots()). */
	rc = ops->ctx_set_current(x->ctxs[0]);
	if (rc != CUDA_SUCCESS) {
		fail(x, -EIO, "carrier %s: cuCtxSetCurrent failed: %s (%d)", pass_name(x->pass), cu_name(ops, rc), rc);
		return x->rc;
	}
	return 0;
}

static void fill_stats(const struct xfer *x, struct carrier_stats *st, double t0, double setup_s)
{
	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	st->bytes = x->done;
	st->total = x->total;
	st->seconds = now() - t0;
	st->setup_seconds = setup_s;
	st->buffers = x->nslots;
	st->buffer_bytes = x->buf_bytes;
	st->staging_bytes = x->pinned;
	st->threads = x->nthreads;
	st->copy_wait_seconds = x->copy_s;
	st->io_seconds = x->io_s;
	st->crc_seconds = x->crc_s;
	st->pin_seconds = x->pin_s;
	st->hole_bytes = x->holes + x->scan.zero; /* zero chunks the device found: never written */
	st->inherited_bytes = x->inherited + x->scan.inherited;
	st->scan_device = x->devscanned;
	st->scanned_bytes = x->scan.scanned;
	st->scan_seconds = x->scan.seconds;
	st->copied_bytes = x->pass == PASS_LOAD ? 0 : x->done;
	st->zero_bytes = x->pass == PASS_LOAD ? x->zero_set : x->scan.zero + x->zero_host;
	st->hash_seconds = x->hash_s;
	st->zip_bytes = x->zip_raw;
	st->zip_stored = x->zip_stored;
	st->zip_seconds = x->zip_s;
}

static bool ops_ok(const struct carrier_ops *o)
{
	return o && o->ctx_get_current && o->ctx_set_current && (o->mem_host_alloc || o->mem_alloc_host) &&
	       o->mem_free_host && o->stream_create && o->stream_destroy && o->stream_synchronize &&
	       o->memcpy_dtoh_async && o->memcpy_htod_async;
}

/* Checks shared by save and load; chunk sizes are already resolved. */
static int check_items(const char *what, const struct carrier_item *items, size_t n, bool load, char *err,
		       size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t k = carrier_nchunks(it->size, it->chunk_size);
		char nb[32];
		const char *nm = item_name(it, i, nb, sizeof(nb));

		if (!it->chunk_size || it->chunk_size > CARRIER_CHUNK_MAX) {
			errfmt(err, errlen, "carrier %s: %s: chunk size %u out of range (1..%u)", what, nm,
			       it->chunk_size, CARRIER_CHUNK_MAX);
			return -EINVAL;
		}
		if (it->size && !it->va) {
			errfmt(err, errlen, "carrier %s: %s: %" PRIu64 " bytes at device address 0", what, nm,
			       it->size);
			return -EINVAL;
		}
		if (it->size > UINT64_MAX - it->offset) {
			errfmt(err, errlen, "carrier %s: %s: offset %" PRIu64 " + size %" PRIu64 " overflows", what, nm,
			       it->offset, it->size);
			return -EINVAL;
		}
		if (k && !it->crc) {
			errfmt(err, errlen, "carrier %s: %s: no CRC array for %" PRIu64 " chunks", what, nm, k);
			return -EINVAL;
		}
		if (!load && it->parent_sha && (!it->sha || !it->inherited)) {
			errfmt(err, errlen, "carrier %s: %s: parent hashes without hash or inherited arrays", what, nm);
			return -EINVAL;
		}
		if (load ? it->ncrc != k : it->ncrc < k) {
			errfmt(err, errlen,
			       "carrier %s: %s: %" PRIu64 " bytes in chunks of %u need %" PRIu64
			       " CRCs, the %s has %zu (size mismatch)",
			       what, nm, it->size, it->chunk_size, k, load ? "index" : "array", it->ncrc);
			return -EINVAL;
		}
	}
	return 0;
}

static int check_fd(const char *what, int fd, bool load, char *err, size_t errlen)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0) {
		errfmt(err, errlen, "carrier %s: bad file descriptor %d: %s", what, fd, strerror(errno));
		return -EBADF;
	}
	if (load && (fl & O_ACCMODE) == O_WRONLY) {
		errfmt(err, errlen, "carrier %s: file descriptor %d is not open for reading", what, fd);
		return -EBADF;
	}
	if (!load && (fl & O_ACCMODE) == O_RDONLY) {
		errfmt(err, errlen, "carrier %s: file descriptor %d is not open for writing", what, fd);
		return -EBADF;
	}
	if (!load && (fl & O_APPEND)) {
		errfmt(err, errlen, "carrier %s: file descriptor %d is O_APPEND; carriers are written at offsets", what,
		       fd);
		return -EINVAL;
	}
	return 0;
}

/* Arguments common to both directions; resolves cfg (NULL: environment). */
static int check_args(const char *what, const struct carrier_ops *ops, const struct carrier_config **cfg,
		      struct carrier_config *envcfg, const int *fds, size_t nfds, const struct carrier_item *items,
		      size_t n, bool load, char *err, size_t errlen)
{
	int rc;

	if (!ops_ok(ops) || (n && !items) || !fds || !nfds || nfds > CARRIER_FILES_MAX) {
		errfmt(err, errlen, "carrier %s: incomplete driver entry points, no items or %zu files (1..%u)", what,
		       nfds, CARRIER_FILES_MAX);
		return -EINVAL;
	}
	if (!*cfg) {
		rc = carrier_config_init(envcfg, err, errlen);
		if (rc)
			return rc;
		*cfg = envcfg;
	}
	for (size_t f = 0; f < nfds; f++) {
		rc = check_fd(what, fds[f], load, err, errlen);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < n; i++) {
		if (items[i].file >= nfds) {
			char nb[32];
			errfmt(err, errlen, "carrier %s: %s: file %u, but only %zu files", what,
			       item_name(&items[i], i, nb, sizeof(nb)), items[i].file, nfds);
			return -EINVAL;
		}
	}
	return 0;
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
static void save_begin(struct xfer *x)
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
static int save_end(struct xfer *x)
{
	for (size_t f = 0; f < x->nfds; f++) {
		struct stat sb;

		if (!x->sparse[f] || (!fstat(x->fds[f], &sb) && (uint64_t)sb.st_size == x->fend[f]))
			continue;
		if (ftruncate(x->fds[f], (off_t)x->fend[f])) {
			int e = errno;
			char fb[32];

			fail(x, -e, "carrier save: cannot size %s to %" PRIu64 " bytes: %s",
			     file_name(x, f, fb, sizeof(fb)), x->fend[f], strerror(e));
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
static void save_scan(struct xfer *x, char *why, size_t whylen)
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
		fail(x, -ENOMEM, "carrier save: out of memory for the device scan");
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
		fail(x, rc, "carrier save: %s", msg);
		return;
	}
	x->devscanned = true;
	x->skips = true;
	x->skipped = x->scan.zero + x->scan.inherited;
}

/*
 * Load: the chunks the index records as zero, where the driver can set
 * them, are left out of the slices (and of a verify pass). Each must
 * carry the CRC of zeros: an index that marks a chunk zero whose CRC says
 * otherwise is corrupt, and is refused before the device is touched.
 */
static void load_plan_zero(struct xfer *x)
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
				fail(x, -EBADMSG,
				     "carrier load: %s: chunk %" PRIu64 " is recorded as all zero but its CRC32C is "
				     "%08x, not that of zeros (%08x): corrupt carrier index",
				     item_name(it, i, nb, sizeof(nb)), (it->name_offset / it->chunk_size) + k,
				     it->crc[k], carrier_zero_crc(l));
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
static int load_zero(struct xfer *x)
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
					fail(x, -EIO,
					     "carrier load: %s: cuMemsetD8Async of the zero chunks %" PRIu64 "-%" PRIu64
					     " failed: %s (%d)",
					     item_name(it, i, nb, sizeof(nb)), (it->name_offset / it->chunk_size) + k,
					     (it->name_offset / it->chunk_size) + e - 1, cu_name(ops, rc), rc);
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
		fail(x, -EIO, "carrier load: setting the zero chunks on the device failed: %s (%d)", cu_name(ops, rc),
		     rc);
	return x->rc;
}

/* Shared driver of both directions once arguments are checked. */
static int transfer(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		    struct carrier_item *items, size_t n, bool load, struct carrier_stats *st, char *err, size_t errlen)
{
	char scan_why[sizeof(st->scan_fallback)] = "";
	double t0 = now(), setup_s;
	CUcontext saved = NULL;
	bool have_saved;
	struct xfer *x;
	int rc;

	have_saved = ops->ctx_get_current(&saved) == CUDA_SUCCESS;
	x = xfer_new(ops, cfg, fds, nfds, items, n, saved);
	if (!x) {
		errfmt(err, errlen, "carrier %s: cannot map transfer state: %s", load ? "load" : "save",
		       strerror(errno));
		if (st)
			memset(st, 0, sizeof(*st));
		return -ENOMEM;
	}
	x->pass = load ? PASS_LOAD : PASS_SAVE;
	x->p_grand = x->total * (load && cfg->verify_first ? 2 : 1);
	/* The plugin reads the page from here on: the scan counts too. */
	if (!load && cfg->progress_page)
		cuip_progress_store(&cfg->progress_page->magic, CUIP_PROGRESS_MAGIC);
	if (load)
		load_plan_zero(x);
	else
		save_scan(x, scan_why, sizeof(scan_why));
	plan(x);
	zip_plan(x, load);
	for (unsigned i = 0; i < x->nthreads; i++) {
		struct worker *w = &x->workers[i];

		w->x = x;
		w->idx = i;
		for (unsigned s = 0; s < SLOTS_PER_THREAD; s++)
			w->slot[s] = &x->slots[i * SLOTS_PER_THREAD + s];
	}
	rc = x->rc; /* from xfer_new (an item without a context), the scan or the zero chunks' index */
	if (!rc)
		rc = setup(x);
	if (!rc && load)
		rc = load_zero(x);
	setup_s = now() - t0;
	if (!rc && x->nctx) {
		x->workers[0].cur = x->ctxs[0];
		x->workers[0].has_cur = true;
	}
	x->p_next = cfg->progress_every;
	if (!rc && load && cfg->verify_first)
		rc = run_pass(x, PASS_VERIFY);
	x->p_base = x->p_grand - x->total;
	if (!rc && !load)
		save_begin(x);
	if (!rc)
		rc = run_pass(x, load ? PASS_LOAD : PASS_SAVE);
	if (!rc && !load)
		rc = save_end(x);
	if (!rc)
		report(x, true);
	teardown(x);
	if (have_saved)
		ops->ctx_set_current(saved);
	if (rc)
		errfmt(err, errlen, "%s", x->msg);
	fill_stats(x, st, t0, setup_s);
	if (st)
		snprintf(st->scan_fallback, sizeof(st->scan_fallback), "%s", scan_why);
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
	munmap(x, x->map_len);
	return rc;
}

/* ---- public API --------------------------------------------------------- */

int carrier_save_files(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		       uint64_t offset, struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
		       size_t errlen)
{
	struct carrier_config envcfg;
	uint64_t off[CARRIER_FILES_MAX];
	int rc;

	if (stats)
		memset(stats, 0, sizeof(*stats));
	rc = check_args("save", ops, &cfg, &envcfg, fds, nfds, items, n, false, err, errlen);
	if (rc)
		return rc;
	for (size_t f = 0; f < nfds; f++)
		off[f] = offset;
	for (size_t i = 0; i < n; i++) {
		uint64_t *o = &off[items[i].file];

		if (!items[i].chunk_size)
			items[i].chunk_size = cfg->chunk_size;
		if (items[i].size > UINT64_MAX - *o) {
			errfmt(err, errlen, "carrier save: file offsets overflow at item %zu", i);
			return -EINVAL;
		}
		items[i].offset = *o;
		*o += items[i].size;
	}
	rc = check_items("save", items, n, false, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		items[i].ncrc = carrier_nchunks(items[i].size, items[i].chunk_size);
	return transfer(ops, cfg, fds, nfds, items, n, false, stats, err, errlen);
}

int carrier_save(const struct carrier_ops *ops, const struct carrier_config *cfg, int fd, uint64_t offset,
		 struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err, size_t errlen)
{
	return carrier_save_files(ops, cfg, &fd, 1, offset, items, n, stats, err, errlen);
}

int carrier_load_files(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		       const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
		       size_t errlen)
{
	struct carrier_config envcfg;
	int rc;

	if (stats)
		memset(stats, 0, sizeof(*stats));
	rc = check_args("load", ops, &cfg, &envcfg, fds, nfds, items, n, true, err, errlen);
	if (!rc)
		rc = check_items("load", items, n, true, err, errlen);
	if (rc)
		return rc;
	/* A truncated regular file is refused before the device is touched. */
	for (size_t i = 0; i < n; i++) {
		uint64_t end = items[i].offset + items[i].size;
		struct stat sb;
		char nb[32], fb[32];

		if (!items[i].size || fstat(fds[items[i].file], &sb) || !S_ISREG(sb.st_mode))
			continue;
		if (end > (uint64_t)sb.st_size) {
			uint64_t have = (uint64_t)sb.st_size > items[i].offset ? sb.st_size - items[i].offset : 0;

			errfmt(err, errlen,
			       "carrier load: %s: needs file bytes %" PRIu64 "-%" PRIu64 ", the file has %" PRIu64
			       " (%s; chunk %" PRIu64 " is missing: truncated carrier image)",
			       item_name(&items[i], i, nb, sizeof(nb)), items[i].offset, end - 1, (uint64_t)sb.st_size,
			       cfg_file_name(cfg, items[i].file, fb, sizeof(fb)),
			       (items[i].name_offset + have) / items[i].chunk_size);
			return -ENODATA;
		}
	}
	/* Items are only read on this path (the cast lets both share xfer). */
	return transfer(ops, cfg, fds, nfds, (struct carrier_item *)items, n, true, stats, err, errlen);
}

int carrier_load(const struct carrier_ops *ops, const struct carrier_config *cfg, int fd,
		 const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err, size_t errlen)
{
	return carrier_load_files(ops, cfg, &fd, 1, items, n, stats, err, errlen);
}

/* ---- striping ----------------------------------------------------------- */

uint64_t carrier_stripe_unit(uint64_t total, size_t nfiles, uint32_t chunk_size)
{
	uint64_t c = chunk_size ? chunk_size : DEFAULT_CHUNK, u;

	if (nfiles < 1)
		nfiles = 1;
	/* Four extents per file balance the files within a quarter of a
	 * share; bigger extents only make the index shorter. */
	u = total / nfiles / 4;
	if (u > CARRIER_STRIPE_MAX)
		u = CARRIER_STRIPE_MAX;
	u = (u + c - 1) / c * c;
	return u ? u : c;
}

/* Extent size for item it: unit in whole chunks of it. */
static uint64_t item_unit(const struct carrier_item *it, uint64_t unit)
{
	return (unit + it->chunk_size - 1) / it->chunk_size * it->chunk_size;
}

size_t carrier_stripe_count(const struct carrier_item *items, size_t n, uint64_t unit)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t u = items[i].chunk_size && unit ? item_unit(&items[i], unit) : 0;

		k += !u || items[i].size <= u ? 1 : (size_t)((items[i].size + u - 1) / u);
	}
	return k;
}

int carrier_stripe_split(const struct carrier_item *items, size_t n, size_t nfiles, uint64_t unit,
			 struct carrier_item *out, size_t nout, size_t *parent)
{
	uint64_t load[CARRIER_FILES_MAX] = {0};
	size_t j = 0;

	if (!nfiles || nfiles > CARRIER_FILES_MAX || !unit || nout < carrier_stripe_count(items, n, unit))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t u, off = 0;

		if (!it->chunk_size || (it->crc && it->ncrc < carrier_nchunks(it->size, it->chunk_size)))
			return -EINVAL;
		u = item_unit(it, unit);
		do {
			struct carrier_item *e = &out[j];
			uint64_t len = it->size - off < u ? it->size - off : u;
			size_t f = 0;

			for (size_t k = 1; k < nfiles; k++)
				if (load[k] < load[f])
					f = k;
			load[f] += len;
			*e = (struct carrier_item){.va = it->va + off,
						   .size = len,
						   .ctx = it->ctx,
						   .name = it->name,
						   .chunk_size = it->chunk_size,
						   .file = (unsigned)f,
						   .crc = it->crc ? it->crc + off / it->chunk_size : NULL,
						   .ncrc = carrier_nchunks(len, it->chunk_size),
						   .name_offset = it->name_offset + off};
			if (it->sha)
				e->sha = it->sha + off / it->chunk_size * CARRIER_HASH_LEN;
			if (it->inherited)
				e->inherited = it->inherited + off / it->chunk_size;
			if (it->stored)
				e->stored = it->stored + off / it->chunk_size;
			if (it->zero)
				e->zero = it->zero + off / it->chunk_size;
			if (it->dhash)
				e->dhash = it->dhash + off / it->chunk_size * CARRIER_DHASH_LEN;
			e->dhash_key[0] = it->dhash_key[0];
			e->dhash_key[1] = it->dhash_key[1];
			if ((it->parent_sha || it->parent_dhash) && off / it->chunk_size < it->n_parent_sha) {
				if (it->parent_sha)
					e->parent_sha = it->parent_sha + off / it->chunk_size * CARRIER_HASH_LEN;
				if (it->parent_dhash)
					e->parent_dhash = it->parent_dhash + off / it->chunk_size * CARRIER_DHASH_LEN;
				if (it->parent_crc)
					e->parent_crc = it->parent_crc + off / it->chunk_size;
				e->n_parent_sha = it->n_parent_sha - off / it->chunk_size;
			}
			if (parent)
				parent[j] = i;
			j++;
			off += len;
		} while (off < it->size);
	}
	assert(j == carrier_stripe_count(items, n, unit));
	return 0;
}

void carrier_items_free_extents(struct carrier_item *items, size_t n)
{
	for (size_t i = 0; items && i < n; i++) {
		free(items[i].ext);
		items[i].ext = NULL;
		items[i].next = 0;
	}
}

/* The extents' item arrays live in one mapping: a load runs while the
 * application's threads are frozen, maybe inside malloc. */
static void *map_array(size_t count, size_t size, size_t *len)
{
	void *p;

	*len = (count ? count : 1) * size;
	p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

int carrier_save_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 uint64_t offset, struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen)
{
	struct carrier_config envcfg;
	struct carrier_item *sub;
	size_t *parent, nsub, len_sub, len_par;
	uint64_t total = 0, unit;
	uint32_t chunk = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		items[i].ext = NULL;
		items[i].next = 0;
	}
	if (nfds <= 1 || !items)
		return carrier_save_files(ops, cfg, fds, nfds, offset, items, n, stats, err, errlen);
	if (stats)
		memset(stats, 0, sizeof(*stats));
	for (size_t i = 0; i < n; i++)
		items[i].file = 0;
	rc = check_args("save", ops, &cfg, &envcfg, fds, nfds, items, n, false, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!items[i].chunk_size)
			items[i].chunk_size = cfg->chunk_size;
		if (items[i].chunk_size > chunk)
			chunk = items[i].chunk_size;
		total += items[i].size;
	}
	rc = check_items("save", items, n, false, err, errlen);
	if (rc)
		return rc;
	unit = carrier_stripe_unit(total, nfds, chunk);
	nsub = carrier_stripe_count(items, n, unit);
	sub = map_array(nsub, sizeof(*sub), &len_sub);
	parent = map_array(nsub, sizeof(*parent), &len_par);
	if (!sub || !parent) {
		errfmt(err, errlen, "carrier save: cannot map %zu extents: %s", nsub, strerror(errno));
		rc = -ENOMEM;
		goto out;
	}
	rc = carrier_stripe_split(items, n, nfds, unit, sub, nsub, parent);
	assert(!rc); /* arguments checked above */
	rc = carrier_save_files(ops, cfg, fds, nfds, offset, sub, nsub, stats, err, errlen);
	if (rc)
		goto out;
	for (size_t j = 0; j < nsub; j++) {
		struct carrier_item *it = &items[parent[j]];

		if (!it->ext) {
			size_t k = carrier_stripe_count(it, 1, unit);

			it->ext = calloc(k, sizeof(*it->ext));
			if (!it->ext) {
				errfmt(err, errlen, "carrier save: out of memory for the extents of %zu items", n);
				rc = -ENOMEM;
				goto out;
			}
			it->offset = sub[j].offset;
			it->file = sub[j].file;
			it->ncrc = carrier_nchunks(it->size, it->chunk_size);
		}
		it->ext[it->next++] =
			(struct carrier_extent){.file = sub[j].file, .offset = sub[j].offset, .size = sub[j].size};
	}
out:
	if (sub)
		munmap(sub, len_sub);
	if (parent)
		munmap(parent, len_par);
	return rc;
}

int carrier_load_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen)
{
	struct carrier_item *sub;
	size_t nsub = 0, len_sub, j = 0;
	bool striped = false;
	int rc;

	if (stats)
		memset(stats, 0, sizeof(*stats));
	for (size_t i = 0; i < n && items; i++) {
		nsub += items[i].ext ? items[i].next : 1;
		striped = striped || items[i].ext;
	}
	if (!striped)
		return carrier_load_files(ops, cfg, fds, nfds, items, n, stats, err, errlen);
	sub = map_array(nsub, sizeof(*sub), &len_sub);
	if (!sub) {
		errfmt(err, errlen, "carrier load: cannot map %zu extents: %s", nsub, strerror(errno));
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t off = 0;
		char nb[32];

		if (!it->ext) {
			sub[j++] = *it;
			continue;
		}
		for (size_t k = 0; k < it->next; k++) {
			const struct carrier_extent *e = &it->ext[k];
			const char *why = NULL;

			if (!it->chunk_size)
				why = "has no chunk size";
			else if (e->file >= nfds)
				why = "names a file beyond the carrier files";
			else if (e->size > it->size - off || (!e->size && it->size))
				why = "runs past the item's size";
			else if (k + 1 < it->next && e->size % it->chunk_size)
				why = "splits a chunk";
			else if (it->crc && it->ncrc < carrier_nchunks(off + e->size, it->chunk_size))
				why = "has no checksums";
			if (why) {
				errfmt(err, errlen,
				       "carrier load: %s: extent %zu (file %u, %" PRIu64 " bytes at offset %" PRIu64
				       ") %s (corrupt carrier index)",
				       item_name(it, i, nb, sizeof(nb)), k, e->file, e->size, e->offset, why);
				rc = -EINVAL;
				goto out;
			}
			sub[j] = (struct carrier_item){.va = it->va + off,
						       .size = e->size,
						       .ctx = it->ctx,
						       .name = it->name,
						       .chunk_size = it->chunk_size,
						       .offset = e->offset,
						       .file = e->file,
						       .crc = it->crc ? it->crc + off / it->chunk_size : NULL,
						       .ncrc = carrier_nchunks(e->size, it->chunk_size),
						       .name_offset = it->name_offset + off,
						       .stored = it->stored ? it->stored + off / it->chunk_size : NULL,
						       .zero = it->zero ? it->zero + off / it->chunk_size : NULL};
			j++;
			off += e->size;
		}
		if (off != it->size) {
			errfmt(err, errlen,
			       "carrier load: %s: its %zu extents hold %" PRIu64 " bytes, the item %" PRIu64
			       " (corrupt carrier index)",
			       item_name(it, i, nb, sizeof(nb)), it->next, off, it->size);
			rc = -EINVAL;
			goto out;
		}
	}
	assert(j == nsub);
	rc = carrier_load_files(ops, cfg, fds, nfds, sub, nsub, stats, err, errlen);
out:
	munmap(sub, len_sub);
	return rc;
}

/* ---- the index's form of the extents -------------------------------------- */

int carrier_extents_to_entry(const struct carrier_item *it, Cuip__CarrierEntry *e, void *(*zalloc)(size_t))
{
	if (!it->ext)
		return 0;
	e->extents = zalloc(sizeof(*e->extents) * it->next);
	if (!e->extents)
		return -ENOMEM;
	for (size_t k = 0; k < it->next; k++) {
		Cuip__CarrierExtent *x = zalloc(sizeof(*x));

		if (!x)
			return -ENOMEM;
		cuip__carrier_extent__init(x);
		x->file = it->ext[k].file;
		x->offset = it->ext[k].offset;
		x->size = it->ext[k].size;
		e->extents[e->n_extents++] = x;
	}
	return 0;
}

int carrier_extents_from_entry(struct carrier_item *it, const Cuip__CarrierEntry *e)
{
	it->ext = NULL;
	it->next = 0;
	if (!e->n_extents)
		return 0;
	it->ext = calloc(e->n_extents, sizeof(*it->ext));
	if (!it->ext)
		return -ENOMEM;
	for (size_t k = 0; k < e->n_extents; k++)
		it->ext[k] = (struct carrier_extent){
			.file = e->extents[k]->file, .offset = e->extents[k]->offset, .size = e->extents[k]->size};
	it->next = e->n_extents;
	return 0;
}

/* ---- configuration ------------------------------------------------------ */

static int env_num(const char *name, uint64_t lo, uint64_t hi, uint64_t *out, char *err, size_t errlen)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return 0;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi || *s == '-') {
		errfmt(err, errlen, "%s=%s: expected a whole number from %" PRIu64 " to %" PRIu64, name, s, lo, hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int carrier_config_init(struct carrier_config *cfg, char *err, size_t errlen)
{
	uint64_t staging = DEFAULT_STAGING / MIB, chunk = DEFAULT_CHUNK / MIB, threads = 0;
	const char *v;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	cfg->staging_bytes = DEFAULT_STAGING;
	cfg->chunk_size = DEFAULT_CHUNK;
	cfg->threads = 0;
	rc = env_num("CUINTERPOSE_STAGING_MB", 1, 1 << 20, &staging, err, errlen);
	if (!rc)
		rc = env_num("CUINTERPOSE_TEST_CHUNK_MB", 1, CARRIER_CHUNK_MAX / MIB, &chunk, err, errlen);
	if (!rc)
		rc = env_num("CUINTERPOSE_TEST_CARRIER_THREADS", 0, MAX_THREADS, &threads, err, errlen);
	if (rc)
		return rc;
	v = getenv("CUINTERPOSE_TEST_LOAD_VERIFY");
	if (v && *v && strcmp(v, "first") && strcmp(v, "chunk")) {
		errfmt(err, errlen, "CUINTERPOSE_TEST_LOAD_VERIFY=%s: expected \"first\" or \"chunk\"", v);
		return -EINVAL;
	}
	cfg->staging_bytes = staging * MIB;
	cfg->chunk_size = (uint32_t)(chunk * MIB);
	cfg->threads = (unsigned)threads;
	cfg->verify_first = v && !strcmp(v, "first");
	v = getenv("CUINTERPOSE_CARRIER_HASH");
	if (v && *v && strcmp(v, "device") && strcmp(v, "sha256") && strcmp(v, "off")) {
		errfmt(err, errlen, "CUINTERPOSE_CARRIER_HASH=%s: expected \"device\", \"sha256\" or \"off\"", v);
		return -EINVAL;
	}
	cfg->hash = !v || !*v || strcmp(v, "off");
	cfg->device_scan = !v || !*v || !strcmp(v, "device");
	v = getenv("CUINTERPOSE_CARRIER_COMPRESS");
	if (cuip_zchunk_parse(v, &cfg->compress_level, &cfg->compress)) {
		errfmt(err, errlen,
		       "CUINTERPOSE_CARRIER_COMPRESS=%s: expected \"off\", \"zstd\" or \"zstd:LEVEL\" (%d..%d)", v,
		       CUIP_ZCHUNK_LEVEL_MIN, CUIP_ZCHUNK_LEVEL_MAX);
		return -EINVAL;
	}
	return 0;
}

int carrier_ops_resolve(struct carrier_ops *ops, void *(*lookup)(void *arg, const char *name), void *arg, char *err,
			size_t errlen)
{
	static const struct {
		const char *name;
		size_t off;
		bool optional;
	} syms[] = {
#define SYM(field, name, opt) {name, offsetof(struct carrier_ops, field), opt}
		SYM(ctx_get_current, "cuCtxGetCurrent", false),
		SYM(ctx_set_current, "cuCtxSetCurrent", false),
		SYM(mem_host_alloc, "cuMemHostAlloc", true),
		SYM(mem_alloc_host, "cuMemAllocHost_v2", false),
		SYM(mem_free_host, "cuMemFreeHost", false),
		SYM(stream_create, "cuStreamCreate", false),
		SYM(stream_destroy, "cuStreamDestroy_v2", false),
		SYM(stream_synchronize, "cuStreamSynchronize", false),
		SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2", false),
		SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2", false),
		SYM(get_error_name, "cuGetErrorName", true),
		SYM(mem_host_register, "cuMemHostRegister_v2", true),
		SYM(mem_host_unregister, "cuMemHostUnregister", true),
		SYM(module_load_data, "cuModuleLoadData", true),
		SYM(module_unload, "cuModuleUnload", true),
		SYM(module_get_function, "cuModuleGetFunction", true),
		SYM(launch_kernel, "cuLaunchKernel", true),
		SYM(mem_alloc, "cuMemAlloc_v2", true),
		SYM(mem_free, "cuMemFree_v2", true),
		SYM(memset_d8_async, "cuMemsetD8Async", true),
#undef SYM
	};

	memset(ops, 0, sizeof(*ops));
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *p = lookup(arg, syms[i].name);

		if (!p && !syms[i].optional) {
			errfmt(err, errlen, "carrier: driver lacks %s", syms[i].name);
			return -ENOENT;
		}
		memcpy((uint8_t *)ops + syms[i].off, &p, sizeof(p));
	}
	return 0;
}
