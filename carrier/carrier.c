/*
 * carrier.c - host carriers: stream shared allocations between device
 * memory and a CRIU image file through bounded pinned staging. Contract in
 * carrier.h; called by the interposer's SAVE and LOAD operations through
 * stripe.c's carrier_save_striped/_load_striped, and by the tests.
 *
 * This file holds the public save and load: their argument checks (shared
 * with stripe.c) and the order of a transfer's steps. The steps are the
 * engine's (pipeline.c: plan, threads, slices, staging, progress) and each
 * side's own (save.c: the device scan's decisions, checksums, holes,
 * compression; load.c: zero chunks, reads, CRC checks, frames); config.c
 * reads the environment and resolves the driver table. What they share:
 * xfer.h. Calls go one way: this file calls the others, save.c and load.c
 * call the engine, and the engine calls a pass's worker only through the
 * pointer it is handed.
 *
 * An error names the item and its bytes where one item is to blame (an
 * async copy refused, a bad CRC, the file ending inside it), and the run's
 * first and last items where one wait or one write covers them all.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "carrier.h"
#include "errfmt.h"
#include "xfer.h"

static bool ops_ok(const struct carrier_ops *o)
{
	return o && o->ctx_get_current && o->ctx_set_current && (o->mem_host_alloc || o->mem_alloc_host) &&
	       o->mem_free_host && o->stream_create && o->stream_destroy && o->stream_synchronize &&
	       o->memcpy_dtoh_async && o->memcpy_htod_async;
}

/* Checks shared by save and load; chunk sizes are already resolved. */
int carrier_check_items(const char *what, const struct carrier_item *items, size_t n, bool load, char *err,
			size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t k = carrier_nchunks(it->size, it->chunk_size);
		char nb[32];
		const char *nm = carrier_item_name(it, i, nb, sizeof(nb));

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
int carrier_check_args(const char *what, const struct carrier_ops *ops, const struct carrier_config **cfg,
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
			       carrier_item_name(&items[i], i, nb, sizeof(nb)), items[i].file, nfds);
			return -EINVAL;
		}
	}
	return 0;
}

/* Shared driver of both directions once arguments are checked. */
static int transfer(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
		    struct carrier_item *items, size_t n, bool load, struct carrier_stats *st, char *err, size_t errlen)
{
	char scan_why[sizeof(st->scan_fallback)] = "";
	double t0 = xfer_now(), setup_s;
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
		xfer_load_plan_zero(x);
	else
		xfer_save_scan(x, scan_why, sizeof(scan_why));
	xfer_plan(x);
	xfer_zip_plan(x, load);
	xfer_wire(x);
	rc = x->rc; /* from xfer_new (an item without a context), the scan or the zero chunks' index */
	if (!rc)
		rc = xfer_setup(x);
	if (!rc && load)
		rc = xfer_load_zero(x);
	setup_s = xfer_now() - t0;
	if (!rc && x->nctx) {
		x->workers[0].cur = x->ctxs[0];
		x->workers[0].has_cur = true;
	}
	x->p_next = cfg->progress_every;
	if (!rc && load && cfg->verify_first)
		rc = xfer_run_pass(x, PASS_VERIFY, xfer_load_worker);
	x->p_base = x->p_grand - x->total;
	if (!rc && !load)
		xfer_save_begin(x);
	if (!rc)
		rc = xfer_run_pass(x, load ? PASS_LOAD : PASS_SAVE, load ? xfer_load_worker : xfer_save_worker);
	if (!rc && !load)
		rc = xfer_save_end(x);
	if (!rc)
		xfer_report(x, true);
	xfer_teardown(x);
	if (have_saved)
		ops->ctx_set_current(saved);
	if (rc)
		errfmt(err, errlen, "%s", x->msg);
	xfer_fill_stats(x, st, t0, setup_s);
	if (st)
		snprintf(st->scan_fallback, sizeof(st->scan_fallback), "%s", scan_why);
	xfer_free(x);
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
	rc = carrier_check_args("save", ops, &cfg, &envcfg, fds, nfds, items, n, false, err, errlen);
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
	rc = carrier_check_items("save", items, n, false, err, errlen);
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
	rc = carrier_check_args("load", ops, &cfg, &envcfg, fds, nfds, items, n, true, err, errlen);
	if (!rc)
		rc = carrier_check_items("load", items, n, true, err, errlen);
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
			       carrier_item_name(&items[i], i, nb, sizeof(nb)), items[i].offset, end - 1,
			       (uint64_t)sb.st_size, carrier_cfg_file_name(cfg, items[i].file, fb, sizeof(fb)),
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
