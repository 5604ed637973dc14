/*
 * xfer.h - the carrier's internal header: a transfer's state (struct xfer,
 * its staging slots, I/O threads and slices), the limits and defaults the
 * pipeline is sized by, and the helpers the carrier's own files share.
 * Included by the .c files of carrier/ only: not installed and not part of
 * the contract (that is carrier.h).
 *
 * The files: carrier.c holds the public save and load and orders a
 * transfer's steps; pipeline.c plans a transfer, cuts and claims slices,
 * runs the threads and the staging; save.c is the save side (checksums,
 * sparse writes, compression, the device scan's use), load.c the load
 * side (reads, CRC checks, frames, zero chunks); stripe.c stripes over
 * several files and keeps the extents in the index; config.c reads the
 * environment and resolves the driver table. Calls go down that list's
 * first three: the engine reaches a pass's worker only through the
 * pointer xfer_run_pass() is handed.
 *
 * All of a transfer's state lives in one mmap'd block (struct xfer); its
 * mutex guards the cursors, the first error, the byte count and the
 * pinned-byte count. Slots and the per-thread timings belong to one
 * thread and need no lock. The calling thread is thread 0 and also runs
 * the progress callback.
 */
#ifndef CUIP_CARRIER_XFER_H
#define CUIP_CARRIER_XFER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "carrier_types.h"
#include "devscan.h"

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
	void (*worker)(struct worker *w); /* the pass's, for each thread (xfer_run_pass()) */
	const int *fds;			  /* [nfds]; items[i].file indexes it */
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

/* ---- pipeline.c: the engine and the helpers the passes share ------------ */

struct xfer *xfer_new(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		      struct carrier_item *items, size_t n, CUcontext cur);
void xfer_plan(struct xfer *x);
void xfer_zip_plan(struct xfer *x, bool load);
void xfer_wire(struct xfer *x);
int xfer_setup(struct xfer *x);
/* One pass over all items with every thread, each running worker on the
 * slices it claims. Returns x->rc. */
int xfer_run_pass(struct xfer *x, enum pass pass, void (*worker)(struct worker *w));
void xfer_report(struct xfer *x, bool final);
void xfer_teardown(struct xfer *x);
void xfer_fill_stats(const struct xfer *x, struct carrier_stats *st, double t0, double setup_s);
void xfer_free(struct xfer *x);

double xfer_now(void);
const char *xfer_cu_name(const struct carrier_ops *ops, CUresult rc);
const char *carrier_item_name(const struct carrier_item *it, size_t i, char *buf, size_t len);
const char *carrier_cfg_file_name(const struct carrier_config *c, size_t f, char *buf, size_t len);
/* The file of index f of transfer x for messages: its name, or "file f". */
#define xfer_file_name(x, f, buf, len) carrier_cfg_file_name((x)->cfg, f, buf, len)
/* Record the transfer's first error; later ones are consequences. */
void xfer_fail(struct xfer *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *xfer_pass_name(enum pass p);
bool xfer_skipped(const struct xfer *x, const struct carrier_item *it, uint64_t k);
bool xfer_piece(const struct xfer *x, const struct slice *s, size_t i, uint64_t *off, uint64_t *len, uint64_t *boff);
const char *xfer_slice_name(const struct xfer *x, const struct slice *s, char *buf, size_t len);
bool xfer_claim(struct xfer *x, struct slice *s);
void xfer_account(struct xfer *x, uint64_t bytes);
int xfer_slot_wait(struct worker *w, struct slot *sl);
void xfer_slice_done(struct worker *w);
int xfer_issue(struct worker *w, struct slot *sl, bool to_host);
/* ---- carrier.c ---------------------------------------------------------- */

/* Argument checks of the public save and load, shared with striping. */
int carrier_check_items(const char *what, const struct carrier_item *items, size_t n, bool load, char *err,
			size_t errlen);
int carrier_check_args(const char *what, const struct carrier_ops *ops, const struct carrier_config **cfg,
		       struct carrier_config *envcfg, const int *fds, size_t nfds, const struct carrier_item *items,
		       size_t n, bool load, char *err, size_t errlen);

/* ---- save.c ------------------------------------------------------------- */

void xfer_save_worker(struct worker *w);
void xfer_save_begin(struct xfer *x);
int xfer_save_end(struct xfer *x);
void xfer_save_scan(struct xfer *x, char *why, size_t whylen);

/* ---- load.c ------------------------------------------------------------- */

void xfer_load_worker(struct worker *w);
void xfer_load_plan_zero(struct xfer *x);
int xfer_load_zero(struct xfer *x);

#endif
