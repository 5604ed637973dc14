/*
 * devscan.c - the device scan of a save: which chunks are all zero or the
 * parent's, decided where the bytes live (contract in devscan.h).
 *
 * Per context: the chunk-scan module is loaded from the PTX built into
 * this library (the driver compiles it for the device), a result buffer
 * of DEVSCAN_MAX_CHUNKS x 3 words is allocated on the device, and the
 * items are scanned in batches of DEVSCAN_BATCH bytes: one launch per
 * item (one block per chunk) on a stream of our own, then one copy of the
 * batch's results to the host and one wait. Only those 24 bytes per chunk
 * cross to the host. The results are checked before they are trusted: a
 * hash is below 2^61 - 1, the nonzero flag 0 or 1, and a zero chunk
 * hashes to (0, 0); anything else fails the save (a broken kernel or
 * device must not let a chunk go unsaved).
 *
 * Called on the carrier's calling thread; no state outlives the call.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "carrier.h"
#include "chunkscan.h"
#include "devscan.h"
#include "errfmt.h"
#include "wire.h"

/* Chunks one batch decides at most (its results: 1.5 MiB on each side). */
#define DEVSCAN_MAX_CHUNKS 65536u

static double mono(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *cu_err(const struct carrier_ops *ops, CUresult rc)
{
	const char *s = NULL;

	if (ops->get_error_name && ops->get_error_name(rc, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA error";
}

uint32_t carrier_zero_crc(uint64_t len)
{
	static const uint8_t zeros[64 << 10];
	static __thread uint64_t last_len = UINT64_MAX;
	static __thread uint32_t last_crc;
	uint32_t c = 0;

	if (len == last_len)
		return last_crc;
	for (uint64_t o = 0; o < len; o += sizeof(zeros))
		c = cuip_crc32c(c, zeros, len - o < sizeof(zeros) ? len - o : sizeof(zeros));
	last_len = len;
	last_crc = c;
	return c;
}

/* One context's scan: module, function, stream and result buffers. */
struct scan {
	const struct carrier_ops *ops;
	CUmodule mod;
	CUfunction fn;
	CUstream st;
	CUdeviceptr dout;
	uint64_t *hout;
	char *err;
	size_t errlen;
};

/* A chunk of the current batch: which item and chunk its results are. */
struct slotref {
	size_t item;
	uint64_t chunk;
};

static void scan_end(struct scan *s)
{
	const struct carrier_ops *o = s->ops;

	if (s->st) {
		o->stream_synchronize(s->st);
		o->stream_destroy(s->st);
	}
	if (s->dout)
		o->mem_free(s->dout);
	if (s->mod)
		o->module_unload(s->mod);
	s->st = NULL;
	s->dout = 0;
	s->mod = NULL;
}

/* Module, function, stream and result buffer in the current context;
 * -ENOTSUP with the reason when the device cannot take them. */
static int scan_begin(struct scan *s)
{
	const struct carrier_ops *o = s->ops;
	CUresult rc;
	const char *what;

	rc = o->module_load_data(&s->mod, cuip_chunkscan_ptx);
	if (rc != CUDA_SUCCESS) {
		s->mod = NULL;
		what = "cuModuleLoadData of the chunk-scan PTX";
	} else if ((rc = o->module_get_function(&s->fn, s->mod, CUIP_CHUNKSCAN_KERNEL)) != CUDA_SUCCESS) {
		what = "cuModuleGetFunction(" CUIP_CHUNKSCAN_KERNEL ")";
	} else if ((rc = o->stream_create(&s->st, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
		s->st = NULL;
		what = "cuStreamCreate";
	} else if ((rc = o->mem_alloc(&s->dout, (size_t)DEVSCAN_MAX_CHUNKS * 3 * sizeof(uint64_t))) != CUDA_SUCCESS) {
		s->dout = 0;
		what = "cuMemAlloc of the scan's results";
	}
	if (rc != CUDA_SUCCESS) {
		errfmt(s->err, s->errlen, "%s failed: %s (%d)", what, cu_err(o, rc), rc);
		scan_end(s);
		return -ENOTSUP;
	}
	return 0;
}

int carrier_scan_warm_wanted(const struct carrier_config *cfg, char *err, size_t errlen)
{
	const char *off = getenv("CUDA_CACHE_DISABLE");

	if (!cfg->device_scan) {
		errfmt(err, errlen, "the device scan is off (CUINTERPOSE_CARRIER_HASH)");
		return -ECANCELED;
	}
	if (off && !strcmp(off, "1")) {
		errfmt(err, errlen, "CUDA_CACHE_DISABLE=1: the driver would not keep the compiled scan");
		return -ECANCELED;
	}
	return 0;
}

int carrier_scan_warm(const struct carrier_ops *ops, const struct carrier_config *cfg, double *secs, char *err,
		      size_t errlen)
{
	CUmodule mod = NULL;
	double t0 = mono();
	CUresult rc;
	int ret;

	*secs = 0;
	ret = carrier_scan_warm_wanted(cfg, err, errlen);
	if (ret)
		return ret;
	if (!ops->module_load_data || !ops->module_unload) {
		errfmt(err, errlen, "the driver lacks cuModuleLoadData or cuModuleUnload");
		return -ENOTSUP;
	}
	rc = ops->module_load_data(&mod, cuip_chunkscan_ptx);
	*secs = mono() - t0;
	if (rc != CUDA_SUCCESS) {
		errfmt(err, errlen, "cuModuleLoadData of the chunk-scan PTX failed: %s (%d)", cu_err(ops, rc), rc);
		return -EIO;
	}
	ops->module_unload(mod);
	return 0;
}

/* Launch the kernel over chunks [k0, k0 + nk) of item it, its results at
 * slot `at` of the device buffer. */
static CUresult launch(struct scan *s, const struct carrier_item *it, uint64_t k0, uint64_t nk, uint32_t at)
{
	uint64_t off = k0 * it->chunk_size;
	CUdeviceptr base = it->va + off, out = s->dout + (CUdeviceptr)at * 3 * sizeof(uint64_t);
	unsigned long long size = it->size - off < nk * it->chunk_size ? it->size - off : nk * it->chunk_size;
	unsigned int chunk = it->chunk_size;
	unsigned long long k_0 = it->dhash_key[0], k_1 = it->dhash_key[1];
	void *args[] = {&base, &size, &chunk, &k_0, &k_1, &out};

	return s->ops->launch_kernel(s->fn, (unsigned)nk, 1, 1, CUIP_CHUNKSCAN_THREADS, 1, 1, 0, s->st, args, NULL);
}

/* Decide one chunk from its results r[0..3): 0, or -EIO on an impossible
 * result (named in err). */
static int decide(struct scan *s, struct carrier_item *it, size_t i, uint64_t k, const uint64_t *r,
		  struct devscan_report *rep)
{
	uint64_t len = it->size - k * it->chunk_size < it->chunk_size ? it->size - k * it->chunk_size : it->chunk_size;
	uint8_t *h = it->dhash + k * CARRIER_DHASH_LEN;

	if (r[0] >= CUIP_P61 || r[1] >= CUIP_P61 || r[2] > 1 || (!r[2] && (r[0] || r[1]))) {
		errfmt(s->err, s->errlen,
		       "device scan of %s chunk %" PRIu64 " returned an impossible result (%#" PRIx64 ", %#" PRIx64
		       ", nonzero %" PRIu64 "): the device or the scan kernel is broken",
		       it->name ? it->name : "an item", (it->name_offset / it->chunk_size) + k, r[0], r[1], r[2]);
		(void)i;
		return -EIO;
	}
	carrier_dhash_put(h, r);
	rep->scanned += len;
	if (!r[2]) {
		it->zero[k] = 1;
		it->crc[k] = carrier_zero_crc(len);
		rep->zero += len;
	} else if (it->parent_dhash && k < it->n_parent_sha &&
		   !memcmp(h, it->parent_dhash + k * CARRIER_DHASH_LEN, CARRIER_DHASH_LEN)) {
		it->inherited[k] = 1;
		it->crc[k] = it->parent_crc[k];
		rep->inherited += len;
	}
	return 0;
}

/* Scan every item of context c (items whose ctxs[i] == c). */
static int scan_ctx(struct scan *s, struct carrier_item *items, size_t n, const CUcontext *ctxs, CUcontext c,
		    struct slotref *refs, devscan_progress_fn progress, void *arg, struct devscan_report *rep)
{
	const struct carrier_ops *o = s->ops;
	size_t i = 0;
	uint64_t k = 0;
	CUresult rc;

	for (;;) {
		uint32_t nref = 0;
		uint64_t bytes = 0;

		/* One batch: whole chunks of consecutive items of this context. */
		while (i < n && nref < DEVSCAN_MAX_CHUNKS) {
			struct carrier_item *it = &items[i];
			uint64_t nk = 0, ncrc = carrier_nchunks(it->size, it->chunk_size);

			if (ctxs[i] != c || k >= ncrc) {
				i++;
				k = 0;
				continue;
			}
			while (k + nk < ncrc && nref + nk < DEVSCAN_MAX_CHUNKS && (bytes < DEVSCAN_BATCH || !nref)) {
				uint64_t kk = k + nk;

				bytes += it->size - kk * it->chunk_size < it->chunk_size
						 ? it->size - kk * it->chunk_size
						 : it->chunk_size;
				refs[nref + nk] = (struct slotref){i, kk};
				nk++;
			}
			if (!nk)
				break;
			rc = launch(s, it, k, nk, nref);
			if (rc != CUDA_SUCCESS) {
				errfmt(s->err, s->errlen,
				       "launching the chunk scan over %s chunks %" PRIu64 "-%" PRIu64
				       " failed: %s (%d)",
				       it->name ? it->name : "an item", k, k + nk - 1, cu_err(o, rc), rc);
				/* Nothing was decided from a failed launch: the host can still save. */
				return rep->scanned || nref ? -EIO : -ENOTSUP;
			}
			nref += (uint32_t)nk;
			k += nk;
			if (bytes >= DEVSCAN_BATCH)
				break;
		}
		if (!nref)
			return 0;
		rc = o->memcpy_dtoh_async(s->hout, s->dout, (size_t)nref * 3 * sizeof(uint64_t), s->st);
		if (rc == CUDA_SUCCESS)
			rc = o->stream_synchronize(s->st);
		if (rc != CUDA_SUCCESS) {
			errfmt(s->err, s->errlen, "the chunk scan of %s failed on the device: %s (%d)",
			       items[refs[0].item].name ? items[refs[0].item].name : "an item", cu_err(o, rc), rc);
			return -EIO;
		}
		for (uint32_t r = 0; r < nref; r++) {
			int ret = decide(s, &items[refs[r].item], refs[r].item, refs[r].chunk, s->hout + 3 * r, rep);

			if (ret)
				return ret;
		}
		if (progress)
			progress(arg, rep->scanned, rep->zero + rep->inherited);
	}
}

int carrier_devscan(const struct carrier_ops *ops, struct carrier_item *items, size_t n, const CUcontext *ctxs,
		    devscan_progress_fn progress, void *arg, struct devscan_report *rep, char *err, size_t errlen)
{
	struct scan s = {.ops = ops, .err = err, .errlen = errlen};
	struct slotref *refs = NULL;
	CUcontext saved = NULL;
	bool have_saved;
	double t0 = mono();
	int ret = 0;

	memset(rep, 0, sizeof(*rep));
	if (!ops->module_load_data || !ops->module_unload || !ops->module_get_function || !ops->launch_kernel ||
	    !ops->mem_alloc || !ops->mem_free) {
		errfmt(err, errlen, "the driver lacks an entry point the chunk scan needs");
		return -ENOTSUP;
	}
	for (size_t i = 0; i < n; i++)
		if (items[i].size && (!items[i].zero || !items[i].dhash ||
				      (items[i].parent_dhash && (!items[i].parent_crc || !items[i].inherited)))) {
			errfmt(err, errlen, "item %zu has no room for the scan's results", i);
			return -EINVAL;
		}
	refs = malloc(sizeof(*refs) * DEVSCAN_MAX_CHUNKS);
	s.hout = malloc(sizeof(uint64_t) * 3 * DEVSCAN_MAX_CHUNKS);
	if (!refs || !s.hout) {
		free(refs);
		free(s.hout);
		errfmt(err, errlen, "out of memory for the scan's results");
		return -ENOMEM;
	}
	have_saved = ops->ctx_get_current(&saved) == CUDA_SUCCESS;
	for (size_t i = 0; i < n && !ret; i++) {
		CUcontext c = ctxs[i];
		bool seen = false;
		CUresult rc;

		for (size_t j = 0; j < i && !seen; j++)
			seen = ctxs[j] == c;
		if (seen || !items[i].size)
			continue;
		rc = ops->ctx_set_current(c);
		if (rc != CUDA_SUCCESS) {
			errfmt(err, errlen, "cuCtxSetCurrent for the chunk scan failed: %s (%d)", cu_err(ops, rc), rc);
			ret = rep->scanned ? -EIO : -ENOTSUP;
			break;
		}
		ret = scan_begin(&s);
		if (ret == -ENOTSUP && rep->scanned)
			ret = -EIO; /* a second device that cannot: the first's results are kept, but fail */
		if (!ret) {
			ret = scan_ctx(&s, items, n, ctxs, c, refs, progress, arg, rep);
			scan_end(&s);
		}
	}
	if (have_saved)
		ops->ctx_set_current(saved);
	/* -ENOTSUP promises that no item changed. */
	if (ret == -ENOTSUP && (rep->scanned || rep->zero || rep->inherited))
		ret = -EIO;
	free(refs);
	free(s.hout);
	rep->seconds = mono() - t0;
	return ret;
}
