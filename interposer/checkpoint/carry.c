/*
 * carry.c - the carried bytes of unicast memory: SAVE to and LOAD from the
 * striped carrier files (carrier/ moves them; this file names the
 * allocations and slab pieces, maps each one temporarily and builds the
 * carrier entries of the reply), and has the chunk scan compiled before
 * QUIESCE closes the gate. It registers a slice (slice.h) with save, load
 * and before_gate; ops.c checks the phase, runs it and builds the reply.
 * Unicast's other steps (PREPARE_UNICAST, REBUILD) are vmm.c's.
 *
 * Callers: the op thread (ops.c, through the slice), with cuip_state_lock
 * held for the whole of a SAVE or LOAD (the application's threads wait at
 * the closed gate); before_gate without it, the job running, its compile
 * on a worker of its own. The primary contexts in prim[] are the op
 * thread's alone (no lock): retained for one SAVE or LOAD and released at
 * its end; the worker retains its own; application threads' current
 * contexts are theirs and untouched.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "carrier.h"
#include "chunkscan.h"
#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "errfmt.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"
#include "thread.h"

#define MAX_DEVICES 64

/* ---- primary contexts of the op thread ----------------------------------- */

static CUcontext prim[MAX_DEVICES];

/* Make ordinal's primary context current on this thread (retained once per operation). */
static CUresult use_device(int ord, CUcontext *out)
{
	CUdevice dev;
	CUresult r;

	if (ord < 0 || ord >= MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!prim[ord]) {
		r = real.cuDeviceGet(&dev, ord);
		if (r == CUDA_SUCCESS)
			r = real.cuDevicePrimaryCtxRetain(&prim[ord], dev);
		if (r != CUDA_SUCCESS) {
			prim[ord] = NULL;
			return r;
		}
	}
	if (out)
		*out = prim[ord];
	return real.cuCtxSetCurrent(prim[ord]);
}

static void release_devices(void)
{
	real.cuCtxSetCurrent(NULL);
	for (int i = 0; i < MAX_DEVICES; i++) {
		if (prim[i]) {
			CUdevice dev;
			if (real.cuDeviceGet(&dev, i) == CUDA_SUCCESS)
				real.cuDevicePrimaryCtxRelease_v2(dev);
			prim[i] = NULL;
		}
	}
}

/* The ordinal that holds an allocation now: the recorded device's UUID
 * looked up in the current device list (a restore may remap GPUs), else
 * the recorded ordinal. */
static int device_of(const struct cuip_alloc *a, const uint8_t *old_uuid)
{
	int ord = old_uuid ? cuip_dev_by_uuid(old_uuid) : -1;

	return ord >= 0 ? ord : a->prop.location.id;
}

/* ---- temporary full mapping of an allocation ----------------------------- */

struct tmpmap {
	CUdeviceptr va;
	size_t size;
	bool mapped;
};

static CUresult tmp_map(struct cuip_alloc *a, int ord, struct tmpmap *t)
{
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, ord}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUresult r;

	t->size = a->size;
	t->mapped = false;
	r = real.cuMemAddressReserve(&t->va, t->size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemMap(t->va, t->size, 0, a->drv, 0);
	if (r == CUDA_SUCCESS) {
		t->mapped = true;
		r = real.cuMemSetAccess(t->va, t->size, &d, 1);
	}
	return r;
}

static void tmp_unmap(struct tmpmap *t)
{
	if (t->mapped)
		real.cuMemUnmap(t->va, t->size);
	if (t->va)
		real.cuMemAddressFree(t->va, t->size);
	t->va = 0;
	t->mapped = false;
}

/* ---- carriers ------------------------------------------------------------- */

static void *carrier_lookup(void *arg, const char *name)
{
	(void)arg;
	return cuip_real_dlsym(cuip_driver_handle(), name);
}

/* Load.sync_copies (criu's CUINTERPOSE_TEST_LOAD_COPIES=sync): each copy
 * completes before the call returns (the stream argument is unused; the
 * carrier's streams stay empty, so its waits return at once). For a driver
 * whose asynchronous copies would not complete while the restored process's
 * other threads are frozen. */
static CUresult htod_sync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	(void)s;
	return real.cuMemcpyHtoD_v2(dst, src, n);
}

static int carrier_setup(struct carrier_ops *ops, struct carrier_config *cfg, char *err, size_t errlen)
{
	int ret = carrier_ops_resolve(ops, carrier_lookup, NULL, err, errlen);

	if (!ret)
		ret = carrier_config_init(cfg, err, errlen);
	return ret;
}

/* The end of a SAVE or LOAD, failed or not: the temporary mappings undone,
 * the primary contexts released, the items freed. */
static void carry_end(struct tmpmap *maps, size_t nmaps, struct carrier_item *items, size_t nitems)
{
	for (size_t i = 0; maps && i < nmaps; i++)
		tmp_unmap(&maps[i]);
	release_devices();
	carrier_items_free_extents(items, nitems);
	free(items);
	free(maps);
}

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One info line per carrier pass (CUINTERPOSE_LOG=2): where its time went.
 * prep_s is what came before the carrier itself: mapping the allocations
 * (SAVE), or recreating and mapping them (LOAD). */
static void log_stats(const char *what, size_t n, const struct carrier_stats *st, double prep_s, bool sync)
{
	pr_info("%s %zu carrier entries, %llu bytes: %.3f s (%.0f MB/s) after %.3f s of mapping; %u threads, "
		"%u buffers of %llu KiB (%llu KiB pinned%s); summed over the threads: pin %.2f s, copy wait %.2f s, "
		"file I/O %.2f s, crc %.2f s, sha256 %.2f s, zstd %.2f s; %llu zero bytes left as holes, %llu bytes "
		"left to the parent checkpoint, %llu bytes of chunks stored compressed in %llu",
		what, n, (unsigned long long)st->bytes, st->seconds,
		st->seconds > 0 ? (double)st->bytes / st->seconds / 1e6 : 0.0, prep_s, st->threads, st->buffers,
		(unsigned long long)(st->buffer_bytes >> 10), (unsigned long long)(st->staging_bytes >> 10),
		sync ? ", synchronous copies" : "", st->pin_seconds, st->copy_wait_seconds, st->io_seconds,
		st->crc_seconds, st->hash_seconds, st->zip_seconds, (unsigned long long)st->hole_bytes,
		(unsigned long long)st->inherited_bytes, (unsigned long long)st->zip_bytes,
		(unsigned long long)st->zip_stored);
	if (st->scan_device)
		pr_info("%s: %llu bytes scanned on the device in %.3f s (%.1f GB/s), %llu copied to the host, %llu in "
			"zero chunks, %llu unchanged",
			what, (unsigned long long)st->scanned_bytes, st->scan_seconds,
			st->scan_seconds > 0 ? (double)st->scanned_bytes / st->scan_seconds / 1e9 : 0.0,
			(unsigned long long)st->copied_bytes, (unsigned long long)st->zero_bytes,
			(unsigned long long)st->inherited_bytes);
	else if (st->scan_fallback[0])
		pr_warn("%s on the host, every byte copied: the device cannot run the chunk scan (%s)", what,
			st->scan_fallback);
}

/* ---- before the gate: the chunk scan compiled ------------------------------ */

/*
 * QUIESCE's head start, the job still running and the state lock not held
 * (slice.h): the chunk scan compiled once for each device that holds
 * carried memory, so that the SAVE's load of it, inside the pause, finds
 * the driver's compute cache ready (carrier_scan_warm). The compile runs
 * on a worker of its own (thread.h), with its own retain of each device's
 * primary context, and QUIESCE waits for it at most its budget: a load
 * the driver holds up (behind the job's device work) must not keep the
 * gate from its own bounded wait, so a late compile goes on alone and the
 * gate closes. A failure costs only the head start: the SAVE loads the
 * module as it always does.
 *
 * warm_want: the devices of the round asked for; written by the op thread
 * only while no round runs (a QUIESCE that finds one still running asks
 * for none), read by the round.
 */
static bool warm_want[MAX_DEVICES];

static int warm_round(char *msg, size_t len)
{
	struct carrier_ops ops;
	struct carrier_config cfg;
	char why[256] = "";
	double secs;
	int ret;

	if ((ret = carrier_setup(&ops, &cfg, why, sizeof(why)))) {
		snprintf(msg, len, "carrier: %s", why);
		return ret;
	}
	for (int ord = 0; ord < MAX_DEVICES; ord++) {
		CUcontext c = NULL;
		CUdevice dev;
		CUresult r;

		if (!warm_want[ord])
			continue;
		r = real.cuDeviceGet(&dev, ord);
		if (r == CUDA_SUCCESS && (r = real.cuDevicePrimaryCtxRetain(&c, dev)) != CUDA_SUCCESS)
			c = NULL;
		if (r == CUDA_SUCCESS)
			r = real.cuCtxSetCurrent(c);
		if (r != CUDA_SUCCESS) {
			pr_warn("the chunk scan is not compiled before the pause on device %d: its context: %s", ord,
				cuip_cuerr(r));
		} else if (carrier_scan_warm(&ops, &cfg, &secs, why, sizeof(why))) {
			pr_warn("the chunk scan is not compiled before the pause on device %d: %s", ord, why);
		} else {
			pr_info("chunk scan compiled for device %d before the pause in %.3f s", ord, secs);
		}
		real.cuCtxSetCurrent(NULL);
		if (c)
			real.cuDevicePrimaryCtxRelease_v2(dev);
	}
	return 0;
}

/* Kept: the thread stays for the process's life (thread.h), so that every
 * checkpoint finds the job with the same threads, stacks and arenas after
 * the first. */
static struct cuip_worker warmer = CUIP_WORKER_INIT_KEPT("cuip-scanjit", warm_round, 0);

static void carry_before_gate(unsigned budget_ms)
{
	struct carrier_config cfg;
	char why[256] = "";
	bool any = false;
	int ret;

	if (!budget_ms)
		return;
	if (cuip_worker_busy(&warmer)) {
		pr_info("the chunk scan's compile asked for by an earlier QUIESCE is still running: not waiting for "
			"it");
		return;
	}
	if ((ret = carrier_config_init(&cfg, why, sizeof(why))) ||
	    (ret = carrier_scan_warm_wanted(&cfg, why, sizeof(why)))) {
		if (ret == -ECANCELED)
			pr_info("the chunk scan is not compiled before the pause: %s", why);
		else
			pr_warn("the chunk scan is not compiled before the pause: carrier: %s", why);
		return;
	}
	cuip_state_take();
	memset(warm_want, 0, sizeof(warm_want));
	for (const struct cuip_alloc *a = vmm.head; a; a = a->next)
		if (a->creator == self.id && cuip_carried(a) && a->drv && a->prop.location.id >= 0 &&
		    a->prop.location.id < MAX_DEVICES)
			any = warm_want[a->prop.location.id] = true;
	cuip_state_drop();
	if (!any)
		return;
	ret = cuip_worker_run(&warmer, budget_ms, why, sizeof(why));
	if (ret == -ETIMEDOUT)
		pr_warn("the chunk scan's compile took more than %u ms: the gate closes without it (it goes on alone; "
			"the SAVE compiles the scan if it must)",
			budget_ms);
	else if (ret)
		pr_warn("the chunk scan is not compiled before the pause: %s", why);
}

/* A forked child has no compile thread. */
static void warm_fork_child(void)
{
	cuip_worker_fork_child(&warmer);
}
CUIP_FORK_HOOK(scanjit, NULL, NULL, warm_fork_child);

/* ---- SAVE ------------------------------------------------------------------ */

/* Whether parent entry p holds device hashes (and their keys) for n chunks. */
static bool has_dhash(const Cuip__CarrierEntry *p, size_t n)
{
	return p->has_dhash && p->dhash.len == n * CARRIER_DHASH_LEN && p->has_dhash_key && p->dhash_key.len == 16;
}

/* The parent checkpoint's entry for the same bytes as item `it` (same
 * allocation, slab offset, size and chunk size, with hashes of either
 * kind and one CRC per chunk), or NULL: then every chunk is written. */
static const Cuip__CarrierEntry *parent_entry(const Cuip__Save *s, const struct cuip_alloc *a, uint64_t aoff,
					      const struct carrier_item *it)
{
	for (size_t i = 0; i < s->n_parents; i++) {
		const Cuip__CarrierEntry *p = s->parents[i];

		if (p->alloc && p->alloc->creator == a->creator && p->alloc->serial == a->serial &&
		    (p->has_alloc_offset ? p->alloc_offset : 0) == aoff && p->size == it->size &&
		    p->chunk_size == it->chunk_size && p->n_crc32c == it->ncrc &&
		    (p->sha256.len == it->ncrc * CARRIER_HASH_LEN || has_dhash(p, it->ncrc)))
			return p;
	}
	return NULL;
}

/* Two keys for the device hashes of a checkpoint without a parent:
 * uniform in [1, 2^61 - 2], from the kernel's random source (the
 * collision bound of chunkscan.h holds for keys the job cannot know). */
static int fresh_keys(uint64_t key[2])
{
	for (int i = 0; i < 2; i++) {
		uint64_t r;

		if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
			return -errno;
		key[i] = 1 + r % (CUIP_P61 - 2);
	}
	return 0;
}

/* A bitmap of the chunks whose byte in v[0..n) is set (arena memory), or
 * NULL when none is; *len its bytes. False: out of memory. */
static bool bitmap_of(const uint8_t *v, size_t n, uint8_t **out, size_t *len)
{
	bool any = false;

	*out = NULL;
	*len = 0;
	for (size_t k = 0; v && k < n && !any; k++)
		any = v[k] != 0;
	if (!any)
		return true;
	*out = cuip_zalloc((n + 7) / 8);
	if (!*out)
		return false;
	for (size_t k = 0; k < n; k++)
		if (v[k])
			(*out)[k / 8] |= (uint8_t)(1u << (k % 8));
	*len = (n + 7) / 8;
	return true;
}

/* The entry's hash, inherited, zero and stored fields from a saved item
 * (arena memory): the device hashes and their keys where the device
 * scanned, else the host's SHA-256; inherited and zero only when some
 * chunk is so, stored only when some chunk is compressed. False: out of
 * memory. */
static bool entry_hashes(Cuip__CarrierEntry *e, const struct carrier_item *it, bool device)
{
	for (size_t k = 0; it->stored && k < it->ncrc && !e->n_stored; k++)
		if (it->stored[k]) {
			e->stored = it->stored;
			e->n_stored = it->ncrc;
		}

	if (device && it->dhash) {
		uint8_t *key = cuip_zalloc(16);

		if (!key)
			return false;
		carrier_dhash_put(key, it->dhash_key);
		e->has_dhash = e->has_dhash_key = 1;
		e->dhash.data = it->dhash;
		e->dhash.len = it->ncrc * CARRIER_DHASH_LEN;
		e->dhash_key.data = key;
		e->dhash_key.len = 16;
	} else if (it->sha) {
		e->has_sha256 = 1;
		e->sha256.data = it->sha;
		e->sha256.len = it->ncrc * CARRIER_HASH_LEN;
	}
	if (!bitmap_of(it->inherited, it->ncrc, &e->inherited.data, &e->inherited.len) ||
	    !bitmap_of(it->zero, it->ncrc, &e->zero.data, &e->zero.len))
		return false;
	e->has_inherited = e->inherited.data != NULL;
	e->has_zero = e->zero.data != NULL;
	return true;
}

static int ptr_cmp(const void *x, const void *y)
{
	uintptr_t p = (uintptr_t) * (void *const *)x, q = (uintptr_t) * (void *const *)y;

	return (p > q) - (p < q);
}

/* Every carried allocation created here is among as[0..n) (a dump's
 * SAVE: PREPARE_UNICAST releases them all): 0, -ESTALE or -ENOMEM. */
static int all_requested(struct cuip_alloc *const *as, size_t n, char *err, size_t errlen)
{
	struct cuip_alloc **sorted = malloc(sizeof(*sorted) * (n ? n : 1));
	int ret = 0;

	if (!sorted) {
		errfmt(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(sorted, as, sizeof(*sorted) * n);
	qsort(sorted, n, sizeof(*sorted), ptr_cmp);
	for (struct cuip_alloc *a = vmm.head; a && !ret; a = a->next)
		if (a->creator == self.id && cuip_carried(a) && a->drv &&
		    !bsearch(&a, sorted, n, sizeof(*sorted), ptr_cmp)) {
			errfmt(err, errlen,
			       "allocation " ID_FMT
			       " is carried but not in the SAVE request (made after INSPECT); nothing saved",
			       ID(a));
			ret = -ESTALE;
		}
	free(sorted);
	return ret;
}

static int carry_save(const Cuip__Save *s, const int *fds, size_t nfds, Cuip__SaveReply **out, char *err, size_t errlen)
{
	struct carrier_item *items = NULL;
	struct tmpmap *maps = NULL;
	struct cuip_alloc **as = NULL;
	uint64_t *aoff = NULL;
	struct carrier_ops ops;
	struct carrier_config cfg;
	struct carrier_stats stats;
	struct cuip_save_progress *page = NULL;
	Cuip__SaveReply *sr;
	char why[512] = "", name[96];
	size_t n = s->n_allocs, ni = 0;
	uint64_t total = 0, key[2] = {0, 0};
	double t0, t1;
	int ret;

	cuip_state_assert_held();
	/* The progress page, when the plugin sent one, comes after the carriers. */
	if (s->progress_page && nfds) {
		void *m = mmap(NULL, CUIP_PROGRESS_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[--nfds], 0);

		if (m == MAP_FAILED) {
			errfmt(err, errlen, "SAVE's progress page cannot be mapped: %s", strerror(errno));
			return -EBADF;
		}
		page = m;
	}
	if (!nfds || (nfds > 1 && s->n_files != nfds)) {
		errfmt(err, errlen, "SAVE came with %zu carrier files for %zu names", nfds, s->n_files);
		ret = -EBADF;
		goto unmap;
	}
	if (s->chunk_size == 0 || s->chunk_size > CARRIER_CHUNK_MAX) {
		errfmt(err, errlen, "SAVE chunk size %u is out of range", s->chunk_size);
		ret = -EINVAL;
		goto unmap;
	}
	ret = carrier_setup(&ops, &cfg, why, sizeof(why));
	if (ret) {
		errfmt(err, errlen, "carrier: %s", why);
		goto unmap;
	}
	ret = fresh_keys(key);
	if (ret) {
		errfmt(err, errlen, "no random keys for the chunk hashes: %s", strerror(-ret));
		goto unmap;
	}
	cfg.progress_page = page;
	cfg.live = s->live;
	t0 = mono_s();
	/* One carrier item per allocation, or per live piece of a slab (freed
	 * pieces are not saved). */
	for (size_t i = 0; i < n; i++) {
		const Cuip__AllocId *id = s->allocs[i];
		struct cuip_alloc *a = id ? cuip_alloc_by_id(id->creator, id->serial) : NULL;
		size_t np;

		ni += a && cuip_alloc_split(a, &np) ? np : 1;
	}
	items = calloc(ni ? ni : 1, sizeof(*items));
	maps = calloc(n ? n : 1, sizeof(*maps));
	as = calloc(ni ? ni : 1, sizeof(*as));
	aoff = calloc(ni ? ni : 1, sizeof(*aoff));
	if (!items || !maps || !as || !aoff)
		goto nomem;
	ni = 0;
	for (size_t i = 0; i < n; i++) {
		const Cuip__AllocId *id = s->allocs[i];
		struct cuip_alloc *a = id ? cuip_alloc_by_id(id->creator, id->serial) : NULL;
		size_t np;
		bool split;
		CUcontext ctx;
		CUresult r;
		int ord;

		if (!a || a->creator != self.id || !cuip_carried(a) || !a->drv) {
			errfmt(err, errlen, "allocation " ID_FMT " is not a live carried allocation created here",
			       id ? (unsigned long long)id->creator : 0ull, id ? (unsigned long long)id->serial : 0ull);
			ret = -ENOENT;
			goto out;
		}
		ord = a->prop.location.id;
		r = use_device(ord, &ctx);
		if (r == CUDA_SUCCESS)
			r = tmp_map(a, ord, &maps[i]);
		if (r != CUDA_SUCCESS) {
			errfmt(err, errlen, "allocation " ID_FMT ": cannot map it for saving: %s", ID(a),
			       cuip_cuerr(r));
			ret = -EIO;
			goto out;
		}
		split = cuip_alloc_split(a, &np);
		for (size_t k = 0; k < np; k++, ni++) {
			struct carrier_item *it = &items[ni];
			uint64_t off = 0, size = a->size;

			if (split)
				cuip_alloc_part(a, k, &off, &size);
			as[ni] = a;
			aoff[ni] = off;
			it->va = maps[i].va + off;
			it->size = size;
			it->ctx = ctx;
			if (split)
				snprintf(name, sizeof(name), "allocation " ID_FMT " piece at %#llx", ID(a),
					 (unsigned long long)off);
			else
				snprintf(name, sizeof(name), "allocation " ID_FMT, ID(a));
			it->name = cuip_strdup(name);
			it->chunk_size = s->chunk_size;
			it->ncrc = carrier_nchunks(it->size, s->chunk_size);
			it->crc = cuip_zalloc(sizeof(uint32_t) * (it->ncrc ? it->ncrc : 1));
			it->zero = cuip_zalloc(it->ncrc ? it->ncrc : 1);
			if (!it->crc || !it->name || !it->zero)
				goto nomem;
			/* Hashes of both kinds are asked for: the carrier fills the
			 * device's where the device scans, else the host's. */
			if (cfg.hash || s->n_parents) {
				const Cuip__CarrierEntry *pe = parent_entry(s, a, off, it);

				it->sha = cuip_zalloc(CARRIER_HASH_LEN * (it->ncrc ? it->ncrc : 1));
				it->dhash = cuip_zalloc(CARRIER_DHASH_LEN * (it->ncrc ? it->ncrc : 1));
				if (!it->sha || !it->dhash)
					goto nomem;
				it->dhash_key[0] = key[0];
				it->dhash_key[1] = key[1];
				if (pe) {
					it->n_parent_sha = it->ncrc;
					it->inherited = cuip_zalloc(it->ncrc ? it->ncrc : 1);
					if (!it->inherited)
						goto nomem;
					if (pe->sha256.len == it->ncrc * CARRIER_HASH_LEN)
						it->parent_sha = pe->sha256.data;
					if (has_dhash(pe, it->ncrc)) {
						/* the parent's keys: the same function */
						carrier_dhash_get(pe->dhash_key.data, it->dhash_key);
						it->parent_dhash = pe->dhash.data;
						it->parent_crc = pe->crc32c;
					}
				}
			}
			if (cfg.compress) {
				it->stored = cuip_zalloc(sizeof(uint32_t) * (it->ncrc ? it->ncrc : 1));
				if (!it->stored)
					goto nomem;
			}
			total += it->size;
		}
	}
	/* A pre-copy takes what it lists: the job goes on, and its dump
	 * saves what exists then. */
	if (!s->live && (ret = all_requested(as, ni, err, errlen)))
		goto out;
	cfg.file_names = (const char *const *)s->files;
	cfg.n_file_names = s->n_files;
	t1 = mono_s();
	ret = carrier_save_striped(&ops, &cfg, fds, nfds, s->offset, items, ni, &stats, why, sizeof(why));
	if (ret) {
		errfmt(err, errlen, "saving device memory: %s", why);
		goto out;
	}
	log_stats(s->live ? "pre-copied (the job running)" : "saved", ni, &stats, t1 - t0, false);
	sr = cuip_zalloc(sizeof(*sr));
	if (!sr)
		goto nomem;
	cuip__save_reply__init(sr);
	sr->entries = cuip_zalloc(sizeof(*sr->entries) * (ni ? ni : 1));
	if (!sr->entries)
		goto nomem;
	for (size_t i = 0; i < ni; i++) {
		Cuip__CarrierEntry *e = cuip_zalloc(sizeof(*e));
		Cuip__AllocId *id = cuip_zalloc(sizeof(*id));
		if (!e || !id)
			goto nomem;
		cuip__carrier_entry__init(e);
		cuip__alloc_id__init(id);
		id->creator = as[i]->creator;
		id->serial = as[i]->serial;
		e->alloc = id;
		e->file = cuip_strdup(s->file);
		e->offset = items[i].offset;
		e->size = items[i].size;
		e->chunk_size = items[i].chunk_size;
		e->crc32c = items[i].crc;
		e->n_crc32c = items[i].ncrc;
		if (carrier_extents_to_entry(&items[i], e, cuip_zalloc) ||
		    !entry_hashes(e, &items[i], stats.scan_device))
			goto nomem;
		if (cuip_alloc_split(as[i], &(size_t){0})) {
			e->has_alloc_offset = 1;
			e->alloc_offset = aoff[i];
		}
		sr->entries[sr->n_entries++] = e;
	}
	sr->bytes = total;
	sr->has_inherited_bytes = 1;
	sr->inherited_bytes = stats.inherited_bytes;
	sr->has_scanned_bytes = sr->has_copied_bytes = sr->has_zero_bytes = 1;
	sr->scanned_bytes = stats.scanned_bytes;
	sr->copied_bytes = stats.copied_bytes;
	sr->zero_bytes = stats.zero_bytes;
	*out = sr;
	goto out;
nomem:
	errfmt(err, errlen, "out of memory");
	ret = -ENOMEM;
out:
	carry_end(maps, n, items, ni);
	free(as);
	free(aoff);
unmap:
	if (page)
		munmap(page, CUIP_PROGRESS_PAGE);
	return ret;
}

/* ---- LOAD ------------------------------------------------------------------ */

/* One carrier entry of a LOAD, by record and offset in it. */
struct load_key {
	const struct cuip_alloc *a;
	uint64_t off;
	size_t i;
};

static int key_cmp(const void *x, const void *y)
{
	const struct load_key *p = x, *q = y;

	if (p->a != q->a)
		return (uintptr_t)p->a < (uintptr_t)q->a ? -1 : 1;
	if (p->off != q->off)
		return p->off < q->off ? -1 : 1;
	return (p->i > q->i) - (p->i < q->i);
}

/* Keys k[0..n) of one record, sorted by offset: each part its entry, once. */
static int check_group(const struct load_key *k, size_t n, char *err, size_t errlen)
{
	const struct cuip_alloc *a = k[0].a;
	size_t np;
	bool split = cuip_alloc_split(a, &np);

	for (size_t g = 1; g < n; g++)
		if (k[g].off == k[g - 1].off) {
			if (split)
				errfmt(err, errlen, "allocation " ID_FMT ": carrier entry %zu (at offset %#llx) is %s",
				       ID(a), k[g].i, (unsigned long long)k[g].off, "a second entry for one piece");
			else
				errfmt(err, errlen, "allocation " ID_FMT ": carrier entry %zu is a second entry for it",
				       ID(a), k[g].i);
			return -EINVAL;
		}
	for (size_t p = 0; split && p < np; p++) {
		uint64_t off, size;

		cuip_alloc_part(a, p, &off, &size);
		if (p >= n || k[p].off != off) {
			errfmt(err, errlen, "allocation " ID_FMT ": the piece at offset %#llx has no carrier entry",
			       ID(a), (unsigned long long)off);
			return -ENODATA;
		}
	}
	return 0;
}

/*
 * Before anything is recreated: every entry's stored lengths (compressed
 * chunks) are absent or one per chunk; a record the carrier saves in parts
 * (a slab) comes in one entry per part, each naming the part's offset and
 * size, none twice, none missing; any other in one entry. first[i]: the
 * entry whose temporary mapping holds entry i's record (LOAD maps a record
 * at its first entry, and loads the further parts into that mapping).
 * Entries that name no record of this process are left to LOAD's checks.
 */
static int load_plan(const Cuip__Load *l, size_t *first, char *err, size_t errlen)
{
	struct load_key *k = malloc(sizeof(*k) * (l->n_entries ? l->n_entries : 1));
	size_t nk = 0;
	int ret = 0;

	if (!k) {
		errfmt(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < l->n_entries && !ret; i++) {
		const Cuip__CarrierEntry *e = l->entries[i];
		struct cuip_alloc *a = e->alloc ? cuip_alloc_by_id(e->alloc->creator, e->alloc->serial) : NULL;
		uint64_t off = 0, size = 0;
		size_t np;
		long p;

		first[i] = i;
		if (e->n_stored && e->n_stored != e->n_crc32c) {
			errfmt(err, errlen,
			       "carrier entry %zu has %zu stored lengths for %zu chunks (corrupt carrier index)", i,
			       e->n_stored, e->n_crc32c);
			ret = -EINVAL;
			break;
		}
		if (!a || a->creator != self.id)
			continue; /* LOAD's own checks */
		if (cuip_alloc_split(a, &np)) {
			p = e->has_alloc_offset ? cuip_alloc_part_at(a, e->alloc_offset) : -1;
			if (p >= 0)
				cuip_alloc_part(a, (size_t)p, &off, &size);
			if (p < 0 || size != e->size) {
				errfmt(err, errlen,
				       "allocation " ID_FMT ": carrier entry %zu (%llu bytes at offset %#llx) is %s",
				       ID(a), i, (unsigned long long)e->size, (unsigned long long)e->alloc_offset,
				       "no live piece of the slab");
				ret = -EINVAL;
			}
		}
		k[nk++] = (struct load_key){a, off, i};
	}
	if (!ret)
		qsort(k, nk, sizeof(*k), key_cmp);
	for (size_t g = 0, h; g < nk && !ret; g = h) {
		size_t lowest = k[g].i;

		for (h = g; h < nk && k[h].a == k[g].a; h++)
			lowest = k[h].i < lowest ? k[h].i : lowest;
		ret = check_group(&k[g], h - g, err, errlen);
		for (size_t x = g; x < h; x++)
			first[k[x].i] = lowest;
	}
	free(k);
	return ret;
}

static int carry_load(const Cuip__Load *l, const int *fds, size_t nfds, Cuip__LoadReply **out, char *err, size_t errlen)
{
	struct carrier_item *items = NULL;
	struct tmpmap *maps = NULL;
	size_t *first = NULL;
	uint8_t **zero = NULL; /* per entry: its zero chunks, one byte each */
	struct carrier_ops ops;
	struct carrier_config cfg;
	struct carrier_stats stats;
	uint8_t old_uuid[MAX_DEVICES][16];
	bool has_uuid[MAX_DEVICES] = {false};
	Cuip__LoadReply *lr;
	char why[512] = "", name[96];
	size_t n = l->n_entries;
	uint64_t total = 0;
	double t0, t1;
	int ret;

	cuip_state_assert_held();
	ret = carrier_setup(&ops, &cfg, why, sizeof(why));
	if (ret) {
		errfmt(err, errlen, "carrier: %s", why);
		return ret;
	}
	/*
	 * LOAD runs during restore with the application's threads frozen,
	 * the driver's internal ones included. The carrier's copies still
	 * complete: each I/O thread issues its own on its own non-blocking
	 * streams and waits for them itself (measured on the H200, driver 580:
	 * a PyTorch LLM job and the killed-criu restore pass). Synchronous
	 * copies (Load.sync_copies) all queue on the legacy default stream:
	 * one copy at a time, LOAD 21 GB/s instead of 41 (docs/benchmarks.md).
	 */
	if (l->sync_copies)
		ops.memcpy_htod_async = htod_sync;
	t0 = mono_s();
	/* Devices by UUID: remember the old ordinals' UUIDs, then look again. */
	for (int i = 0; i < self.ndev; i++) {
		if (self.dev[i].ordinal >= 0 && self.dev[i].ordinal < MAX_DEVICES) {
			memcpy(old_uuid[self.dev[i].ordinal], self.dev[i].uuid, 16);
			has_uuid[self.dev[i].ordinal] = true;
		}
	}
	cuip_devices_rescan();
	/* From here a failure leaves the process restoring (slice.h). */
	cuip_set_phase(CUIP__PHASE__PHASE_RESTORING);
	items = calloc(n ? n : 1, sizeof(*items));
	maps = calloc(n ? n : 1, sizeof(*maps));
	first = calloc(n ? n : 1, sizeof(*first));
	zero = calloc(n ? n : 1, sizeof(*zero));
	if (!items || !maps || !first || !zero)
		goto nomem;
	ret = load_plan(l, first, err, errlen);
	if (ret)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const Cuip__CarrierEntry *e = l->entries[i];
		struct cuip_alloc *a = e->alloc ? cuip_alloc_by_id(e->alloc->creator, e->alloc->serial) : NULL;
		uint64_t off = 0, size;
		bool split;
		CUmemAllocationProp prop;
		CUcontext ctx;
		CUresult r;
		int old, ord;

		if (!a || a->creator != self.id || !cuip_carried(a)) {
			errfmt(err, errlen,
			       "carrier entry %zu names allocation " ID_FMT
			       ", which this process did not create as carried memory",
			       i, e->alloc ? (unsigned long long)e->alloc->creator : 0ull,
			       e->alloc ? (unsigned long long)e->alloc->serial : 0ull);
			ret = -ENOENT;
			goto out;
		}
		split = cuip_alloc_split(a, &(size_t){0});
		if (split) {
			cuip_alloc_part(a, (size_t)cuip_alloc_part_at(a, e->alloc_offset), &off, &size); /* load_plan */
		} else if (e->size != a->size || e->has_alloc_offset) {
			errfmt(err, errlen, "allocation " ID_FMT ": carrier holds %llu bytes, the allocation %llu",
			       ID(a), (unsigned long long)e->size, (unsigned long long)a->size);
			ret = -EINVAL;
			goto out;
		}
		if (first[i] != i) { /* a further part of a record mapped at its first entry */
			items[i] = items[first[i]];
			items[i].va = maps[first[i]].va + off;
			goto item;
		}
		if (a->drv) {
			errfmt(err, errlen, "allocation " ID_FMT " is attached; LOAD only refills detached ones",
			       ID(a));
			ret = -EBUSY;
			goto out;
		}
		old = a->prop.location.id;
		ord = a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE
			      ? device_of(a, old >= 0 && old < MAX_DEVICES && has_uuid[old] ? old_uuid[old] : NULL)
			      : old;
		prop = a->prop;
		if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
			prop.location.id = ord;
		r = use_device(ord, &ctx);
		if (r == CUDA_SUCCESS)
			r = real.cuMemCreate(&a->drv, a->size, &prop, 0);
		if (r != CUDA_SUCCESS) {
			a->drv = 0;
			errfmt(err, errlen, "allocation " ID_FMT ": recreating %llu bytes on device %d failed: %s",
			       ID(a), (unsigned long long)a->size, ord, cuip_cuerr(r));
			ret = -ENOMEM;
			goto out;
		}
		a->prop.location.id = prop.location.id;
		r = tmp_map(a, ord, &maps[i]);
		if (r != CUDA_SUCCESS) {
			errfmt(err, errlen, "allocation " ID_FMT ": cannot map it for loading: %s", ID(a),
			       cuip_cuerr(r));
			ret = -EIO;
			goto out;
		}
		items[i].va = maps[i].va + off;
		items[i].ctx = ctx;
item:
		if (split)
			snprintf(name, sizeof(name), "allocation " ID_FMT " piece at %#llx", ID(a),
				 (unsigned long long)off);
		else
			snprintf(name, sizeof(name), "allocation " ID_FMT, ID(a));
		items[i].name = cuip_strdup(name);
		items[i].size = e->size;
		items[i].chunk_size = e->chunk_size;
		items[i].offset = e->offset;
		items[i].crc = e->crc32c;
		items[i].ncrc = e->n_crc32c;
		items[i].stored = e->n_stored ? e->stored : NULL;
		items[i].zero = NULL;
		if (e->has_zero) {
			if (e->zero.len != (e->n_crc32c + 7) / 8) {
				errfmt(err, errlen,
				       "allocation " ID_FMT
				       ": carrier entry %zu has %zu zero-chunk bitmap bytes for %zu "
				       "chunks (corrupt carrier index)",
				       ID(a), i, e->zero.len, e->n_crc32c);
				ret = -EINVAL;
				goto out;
			}
			zero[i] = calloc(e->n_crc32c ? e->n_crc32c : 1, 1);
			if (!zero[i])
				goto nomem;
			for (size_t k = 0; k < e->n_crc32c; k++)
				zero[i][k] = (e->zero.data[k / 8] >> (k % 8)) & 1;
			items[i].zero = zero[i];
		}
		if (carrier_extents_from_entry(&items[i], e))
			goto nomem;
		total += e->size;
	}
	cfg.file_names = (const char *const *)l->files;
	cfg.n_file_names = l->n_files;
	t1 = mono_s();
	ret = carrier_load_striped(&ops, &cfg, fds, nfds, items, n, &stats, why, sizeof(why));
	if (ret) {
		errfmt(err, errlen, "loading device memory: %s", why);
		goto out;
	}
	log_stats("loaded", n, &stats, t1 - t0, l->sync_copies);
	if (stats.zero_bytes)
		pr_info("loaded: %llu bytes of zero chunks set by a device memset, not read",
			(unsigned long long)stats.zero_bytes);
	lr = cuip_zalloc(sizeof(*lr));
	if (!lr)
		goto nomem;
	cuip__load_reply__init(lr);
	lr->bytes = total;
	*out = lr;
	goto out;
nomem:
	errfmt(err, errlen, "out of memory");
	ret = -ENOMEM;
out:
	carry_end(maps, n, items, n);
	for (size_t i = 0; zero && i < n; i++)
		free(zero[i]);
	free(zero);
	free(first);
	return ret;
}

CUIP_SLICE(carry, .name = "carried unicast memory", .before_gate = carry_before_gate, .save = carry_save,
	   .load = carry_load);
