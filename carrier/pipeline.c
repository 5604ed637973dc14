/*
 * pipeline.c - the carrier's transfer engine, for both directions: it
 * plans a transfer (buffer size and thread count within the staging
 * bound), cuts the items into slices and hands them out, runs the I/O
 * threads with their pinned staging slots and streams, and reports
 * progress. What a thread does with a slice is the pass's own (save.c,
 * load.c): the pass hands its worker to xfer_run_pass(), so the engine
 * calls no code of the files that use it. carrier.c drives a transfer
 * through it; the shared state and helpers are declared in xfer.h.
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
 * The calling thread is thread 0 and also runs the progress callback. All of
 * a transfer's state lives in one mmap'd block (struct xfer); its mutex
 * guards the cursors, the first error, the byte count and the pinned-byte
 * count. Slots and the per-thread timings belong to one thread and need no
 * lock.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "carrier_types.h"
#include "deadline.h"
#include "threads.h"
#include "xfer.h"
#include "zchunk.h"

/* ---- small helpers ---------------------------------------------------- */

double xfer_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

const char *xfer_cu_name(const struct carrier_ops *ops, CUresult rc)
{
	const char *s = NULL;

	if (ops->get_error_name && ops->get_error_name(rc, &s) == CUDA_SUCCESS && s)
		return s;
	return "CUDA error";
}

const char *carrier_item_name(const struct carrier_item *it, size_t i, char *buf, size_t len)
{
	if (it->name)
		return it->name;
	snprintf(buf, len, "item %zu", i);
	return buf;
}

/* The file of index f for messages: its name, or "file f". */
const char *carrier_cfg_file_name(const struct carrier_config *c, size_t f, char *buf, size_t len)
{
	if (c->file_names && f < c->n_file_names && c->file_names[f])
		return c->file_names[f];
	snprintf(buf, len, "file %zu", f);
	return buf;
}

/* Record the transfer's first error; later ones are consequences. */
void xfer_fail(struct xfer *x, int rc, const char *fmt, ...)
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

const char *xfer_pass_name(enum pass p)
{
	return p == PASS_SAVE ? "save" : p == PASS_VERIFY ? "verify" : "load";
}

/* Whether chunk k of item it was decided before the pipeline (skipped by it). */
bool xfer_skipped(const struct xfer *x, const struct carrier_item *it, uint64_t k)
{
	return x->skips && ((it->zero && it->zero[k]) || (x->pass == PASS_SAVE && it->inherited && it->inherited[k]));
}

static bool any_skipped(const struct xfer *x, const struct carrier_item *it)
{
	for (uint64_t k = 0; x->skips && k < it->ncrc; k++)
		if (xfer_skipped(x, it, k))
			return true;
	return false;
}

/* Bytes of item it per slice: whole chunks, at most one buffer. */
static uint64_t slice_max(const struct xfer *x, const struct carrier_item *it)
{
	uint64_t s = x->buf_bytes / it->chunk_size * it->chunk_size;

	/* buf_bytes >= min(chunk, size) by construction (xfer_plan()). */
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
		if (xfer_skipped(x, it, (off + o) / it->chunk_size)) {
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

		while (*co < it->size && xfer_skipped(x, it, *co / it->chunk_size))
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
bool xfer_piece(const struct xfer *x, const struct slice *s, size_t i, uint64_t *off, uint64_t *len, uint64_t *boff)
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
const char *xfer_slice_name(const struct xfer *x, const struct slice *s, char *buf, size_t len)
{
	char a[32], b[32];

	if (s->nitems == 1)
		return carrier_item_name(&x->items[s->item], s->item, buf, len);
	snprintf(buf, len, "%s through %s (%zu items)", carrier_item_name(&x->items[s->item], s->item, a, sizeof(a)),
		 carrier_item_name(&x->items[s->last], s->last, b, sizeof(b)), s->nitems);
	return buf;
}

/* Next slice of file f in file order; false when the file is done. Under lock. */
static bool claim_file(struct xfer *x, size_t f, struct slice *s)
{
	return next_slice(x, f, &x->cur_item[f], &x->cur_off[f], s);
}

/* Take the next slice, files in turn; false when none is left or on error. */
bool xfer_claim(struct xfer *x, struct slice *s)
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

void xfer_account(struct xfer *x, uint64_t bytes)
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
		xfer_fail(x, -EIO, "carrier %s: %s: cuCtxSetCurrent failed: %s (%d)", xfer_pass_name(x->pass),
			  carrier_item_name(&x->items[item], item, nb, sizeof(nb)), xfer_cu_name(x->ops, rc), rc);
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
int xfer_slot_wait(struct worker *w, struct slot *sl)
{
	struct xfer *x = w->x;
	double t = xfer_now();
	CUresult rc = x->ops->stream_synchronize(slot_stream(x, sl));

	w->copy_s += xfer_now() - t;
	if (rc != CUDA_SUCCESS && sl->s.nitems == 1) {
		char nb[32];
		const struct carrier_item *it = &x->items[sl->s.item];
		xfer_fail(x, -EIO, "carrier %s: %s: device copy of bytes %" PRIu64 "-%" PRIu64 " failed: %s (%d)",
			  xfer_pass_name(x->pass), carrier_item_name(it, sl->s.item, nb, sizeof(nb)), sl->s.off,
			  sl->s.off + sl->s.len - 1, xfer_cu_name(x->ops, rc), rc);
		return -1;
	}
	if (rc != CUDA_SUCCESS) {
		/* One wait covers the run's copies: any of them may have failed. */
		char nb[160];
		xfer_fail(x, -EIO,
			  "carrier %s: %s: device copies of the run (file offsets %" PRIu64 "-%" PRIu64
			  ", one stream wait) failed: %s (%d)",
			  xfer_pass_name(x->pass), xfer_slice_name(x, &sl->s, nb, sizeof(nb)), sl->s.foff,
			  sl->s.foff + sl->s.len - 1, xfer_cu_name(x->ops, rc), rc);
		return -1;
	}
	return 0;
}

/* Progress callback, thread 0 only, no lock held while it runs. */
void xfer_report(struct xfer *x, bool final)
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

void xfer_slice_done(struct worker *w)
{
	if (w->idx == 0)
		xfer_report(w->x, false);
}

/* One copy per item of the slot's slice, all on one stream: device->host
 * for save, host->device for load. A failed copy names its item and bytes. */
int xfer_issue(struct worker *w, struct slot *sl, bool to_host)
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

		if (!xfer_piece(x, &sl->s, i, &off, &len, &boff))
			continue;
		host = (uint8_t *)sl->buf + boff;
		rc = to_host ? x->ops->memcpy_dtoh_async(host, it->va + off, len, st)
			     : x->ops->memcpy_htod_async(it->va + off, host, len, st);
		if (rc != CUDA_SUCCESS) {
			char nb[32];
			xfer_fail(x, -EIO,
				  "carrier %s: %s: %s of bytes %" PRIu64 "-%" PRIu64 " %s %#llx failed: %s (%d)",
				  to_host ? "save" : "load", carrier_item_name(it, i, nb, sizeof(nb)),
				  to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", off, off + len - 1,
				  to_host ? "at" : "to", (unsigned long long)(it->va + off), xfer_cu_name(x->ops, rc),
				  rc);
			return -1;
		}
	}
	return 0;
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
	double t = xfer_now();
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
				xfer_fail(x, -EIO, "carrier %s: cuCtxSetCurrent(%p) failed: %s (%d)",
					  xfer_pass_name(x->pass), (void *)x->ctxs[0], xfer_cu_name(ops, rc), rc);
				return -1;
			}
			w->cur = x->ctxs[0];
			w->has_cur = true;
		}
		rc = staging_get(ops, x->buf_bytes, &p, &sl->own);
		if (rc != CUDA_SUCCESS) {
			xfer_fail(x, -ENOMEM, "carrier %s: cannot pin %u x %" PRIu64 " bytes of staging: %s (%d)",
				  xfer_pass_name(x->pass), x->nslots, x->buf_bytes, xfer_cu_name(ops, rc), rc);
			return -1;
		}
		sl->buf = p;
		pthread_mutex_lock(&x->lock);
		x->pinned += x->buf_bytes;
		pthread_mutex_unlock(&x->lock);
	}
	w->pin_s += xfer_now() - t;
	return 0;
}

/* After the last pass: wait for whatever the thread's streams still carry
 * and unpin its buffers, in parallel with the other threads (xfer_teardown()
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
				return; /* xfer_teardown() tries again */
			w->cur = x->ctxs[c];
			w->has_cur = true;
			ops->stream_synchronize(sl->streams[c]);
		}
		staging_put(ops, sl, x->buf_bytes);
	}
}

/* The thread's codec workspace, where chunks are (or may be) stored
 * compressed: mapped, not allocated (LOAD runs with the application's
 * threads frozen). Kept across passes; xfer_teardown() unmaps it. */
static int zip_workspace(struct worker *w)
{
	struct xfer *x = w->x;
	uint8_t *p;

	if (!x->zws_len || w->zws)
		return 0;
	p = mmap(NULL, x->zws_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		xfer_fail(x, -ENOMEM, "carrier %s: cannot map %zu bytes for compressed chunks: %s",
			  xfer_pass_name(x->pass), x->zws_len, strerror(errno));
		return -1;
	}
	w->zws = p;
	w->zbuf = p;
	w->zctx = x->zsave ? cuip_zchunk_cctx(p + x->zbuf_len, x->zws_len - x->zbuf_len)
			   : cuip_zchunk_dctx(p + x->zbuf_len, x->zws_len - x->zbuf_len);
	assert(w->zctx); /* sized for it by xfer_zip_plan() */
	return 0;
}

static void work(struct worker *w)
{
	if (pin_slots(w) || zip_workspace(w))
		return;
	w->x->worker(w);
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
int xfer_run_pass(struct xfer *x, enum pass pass, void (*worker)(struct worker *w))
{
	struct worker *w0 = &x->workers[0];
	int rc;

	x->pass = pass;
	x->worker = worker;
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
			xfer_fail(x, rc, "carrier %s: cannot start I/O thread %u: %s", xfer_pass_name(pass), i,
				  strerror(-rc));
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
			xfer_report(x, false);
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
		xfer_fail(x, -EIO,
			  "carrier %s: moved %" PRIu64 " bytes and decided %" PRIu64 " before, expected %" PRIu64,
			  xfer_pass_name(pass), x->done, x->skipped, x->total);
	return x->rc;
}

/* ---- setup and teardown -------------------------------------------------- */

/* Buffer size and thread count for these items within the staging bound. */
void xfer_plan(struct xfer *x)
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
struct xfer *xfer_new(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		      struct carrier_item *items, size_t n, CUcontext cur)
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
			xfer_fail(x, -EINVAL, "carrier: %s has no context and none is current",
				  carrier_item_name(&items[i], i, nb, sizeof(nb)));
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
void xfer_zip_plan(struct xfer *x, bool load)
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

/* Each thread's worker: its index and its two slots (after xfer_plan()). */
void xfer_wire(struct xfer *x)
{
	for (unsigned i = 0; i < x->nthreads; i++) {
		struct worker *w = &x->workers[i];

		w->x = x;
		w->idx = i;
		for (unsigned s = 0; s < SLOTS_PER_THREAD; s++)
			w->slot[s] = &x->slots[i * SLOTS_PER_THREAD + s];
	}
}

/* Unmap the transfer's block (after xfer_teardown()). */
void xfer_free(struct xfer *x)
{
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
	munmap(x, x->map_len);
}

/* Free every staging buffer and stream (after their copies finished), and
 * the codec workspaces. */
void xfer_teardown(struct xfer *x)
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
int xfer_setup(struct xfer *x)
{
	const struct carrier_ops *ops = x->ops;
	CUresult rc;

	if (!x->total)
		return 0;
	for (size_t c = 0; c < x->nctx; c++) {
		rc = ops->ctx_set_current(x->ctxs[c]);
		if (rc != CUDA_SUCCESS) {
			xfer_fail(x, -EIO, "carrier %s: cuCtxSetCurrent(%p) failed: %s (%d)", xfer_pass_name(x->pass),
				  (void *)x->ctxs[c], xfer_cu_name(ops, rc), rc);
			return x->rc;
		}
		for (unsigned i = 0; i < x->nslots; i++) {
			rc = ops->stream_create(&x->slots[i].streams[c], CU_STREAM_NON_BLOCKING);
			if (rc != CUDA_SUCCESS) {
				x->slots[i].streams[c] = NULL;
				xfer_fail(x, -EIO, "carrier %s: cuStreamCreate failed: %s (%d)",
					  xfer_pass_name(x->pass), xfer_cu_name(ops, rc), rc);
				return x->rc;
			}
		}
	}
	/* Context 0 stays current for thread 0; the I/O threads pin their
	 * own staging (pin_slots()). */
	rc = ops->ctx_set_current(x->ctxs[0]);
	if (rc != CUDA_SUCCESS) {
		xfer_fail(x, -EIO, "carrier %s: cuCtxSetCurrent failed: %s (%d)", xfer_pass_name(x->pass),
			  xfer_cu_name(ops, rc), rc);
		return x->rc;
	}
	return 0;
}

void xfer_fill_stats(const struct xfer *x, struct carrier_stats *st, double t0, double setup_s)
{
	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	st->bytes = x->done;
	st->total = x->total;
	st->seconds = xfer_now() - t0;
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
