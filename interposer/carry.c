/*
 * carry.c - the carried bytes of unicast memory: SAVE to and LOAD from the
 * striped carrier files (carrier.c moves them; this file names the
 * allocations and slab pieces, maps each one temporarily and builds the
 * carrier entries of the reply). It registers a slice (slice.h) with only
 * save and load; ops.c checks the phase, runs it and builds the reply.
 * Unicast's other steps (PREPARE_UNICAST, REBUILD) are vmm.c's.
 *
 * Callers: the op thread (ops.c, through the slice), with cuip_state_lock
 * held for the whole operation; the application's threads wait at the
 * closed gate. The primary contexts below are the op thread's alone (no
 * lock): retained for one SAVE or LOAD and released at its end;
 * application threads' current contexts are theirs and untouched.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "carrier.h"
#include "cuip.h"
#include "driver.h"
#include "errfmt.h"
#include "ipc.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"

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

/* Load.sync_copies (criu's CUINTERPOSE_LOAD_COPIES=sync): each copy
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
		"file I/O %.2f s, crc %.2f s, sha256 %.2f s; %llu zero bytes left as holes, %llu bytes left to the "
		"parent checkpoint",
		what, n, (unsigned long long)st->bytes, st->seconds,
		st->seconds > 0 ? (double)st->bytes / st->seconds / 1e6 : 0.0, prep_s, st->threads, st->buffers,
		(unsigned long long)(st->buffer_bytes >> 10), (unsigned long long)(st->staging_bytes >> 10),
		sync ? ", synchronous copies" : "", st->pin_seconds, st->copy_wait_seconds, st->io_seconds,
		st->crc_seconds, st->hash_seconds, (unsigned long long)st->hole_bytes,
		(unsigned long long)st->inherited_bytes);
}

/* ---- SAVE ------------------------------------------------------------------ */

/* The parent checkpoint's entry for the same bytes as item `it` (same
 * allocation, slab offset, size and chunk size, with hashes), or NULL:
 * then every chunk is written. */
static const Cuip__CarrierEntry *parent_entry(const Cuip__Save *s, const struct cuip_alloc *a, uint64_t aoff,
					      const struct carrier_item *it)
{
	for (size_t i = 0; i < s->n_parents; i++) {
		const Cuip__CarrierEntry *p = s->parents[i];

		if (p->alloc && p->alloc->creator == a->creator && p->alloc->serial == a->serial &&
		    (p->has_alloc_offset ? p->alloc_offset : 0) == aoff && p->size == it->size &&
		    p->chunk_size == it->chunk_size && p->sha256.len == it->ncrc * CARRIER_HASH_LEN)
			return p;
	}
	return NULL;
}

/* The entry's hash and inherited fields from a saved item (arena memory);
 * inherited only when some chunk is the parent's. False: out of memory. */
static bool entry_hashes(Cuip__CarrierEntry *e, const struct carrier_item *it)
{
	uint8_t *bits;
	bool any = false;

	if (it->sha) {
		e->has_sha256 = 1;
		e->sha256.data = it->sha;
		e->sha256.len = it->ncrc * CARRIER_HASH_LEN;
	}
	for (size_t k = 0; it->inherited && k < it->ncrc; k++)
		any |= it->inherited[k] != 0;
	if (!any)
		return true;
	bits = cuip_zalloc((it->ncrc + 7) / 8);
	if (!bits)
		return false;
	for (size_t k = 0; k < it->ncrc; k++)
		if (it->inherited[k])
			bits[k / 8] |= (uint8_t)(1u << (k % 8));
	e->has_inherited = 1;
	e->inherited.data = bits;
	e->inherited.len = (it->ncrc + 7) / 8;
	return true;
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
	Cuip__SaveReply *sr;
	char why[512] = "", name[96];
	size_t n = s->n_allocs, ni = 0;
	uint64_t total = 0;
	double t0, t1;
	int ret;

	cuip_state_assert_held();
	if (!nfds || (nfds > 1 && s->n_files != nfds)) {
		errfmt(err, errlen, "SAVE came with %zu carrier files for %zu names", nfds, s->n_files);
		return -EBADF;
	}
	if (s->chunk_size == 0 || s->chunk_size > CARRIER_CHUNK_MAX) {
		errfmt(err, errlen, "SAVE chunk size %u is out of range", s->chunk_size);
		return -EINVAL;
	}
	ret = carrier_setup(&ops, &cfg, why, sizeof(why));
	if (ret) {
		errfmt(err, errlen, "carrier: %s", why);
		return ret;
	}
	t0 = mono_s();
	/* One carrier item per allocation, or per live piece of a slab (freed
	 * pieces are not saved). */
	for (size_t i = 0; i < n; i++) {
		const Cuip__AllocId *id = s->allocs[i];
		struct cuip_alloc *a = id ? cuip_alloc_by_id(id->creator, id->serial) : NULL;
		ni += a && a->slab ? a->npieces : 1;
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
		np = a->slab ? a->npieces : 1;
		for (size_t k = 0; k < np; k++, ni++) {
			struct carrier_item *it = &items[ni];
			uint64_t off = a->slab ? a->pieces[k].off : 0;

			as[ni] = a;
			aoff[ni] = off;
			it->va = maps[i].va + off;
			it->size = a->slab ? a->pieces[k].size : a->size;
			it->ctx = ctx;
			if (a->slab)
				snprintf(name, sizeof(name), "allocation " ID_FMT " piece at %#llx", ID(a),
					 (unsigned long long)off);
			else
				snprintf(name, sizeof(name), "allocation " ID_FMT, ID(a));
			it->name = cuip_strdup(name);
			it->chunk_size = s->chunk_size;
			it->ncrc = carrier_nchunks(it->size, s->chunk_size);
			it->crc = cuip_zalloc(sizeof(uint32_t) * (it->ncrc ? it->ncrc : 1));
			if (!it->crc || !it->name)
				goto nomem;
			if (cfg.hash || s->n_parents) {
				const Cuip__CarrierEntry *pe = parent_entry(s, a, off, it);

				it->sha = cuip_zalloc(CARRIER_HASH_LEN * (it->ncrc ? it->ncrc : 1));
				if (!it->sha)
					goto nomem;
				if (pe) {
					it->parent_sha = pe->sha256.data;
					it->n_parent_sha = it->ncrc;
					it->inherited = cuip_zalloc(it->ncrc ? it->ncrc : 1);
					if (!it->inherited)
						goto nomem;
				}
			}
			total += it->size;
		}
	}
	/* Every carried allocation created here must be in the request:
	 * PREPARE_UNICAST releases them all (load_ix marks the requested
	 * ones meanwhile; LOAD resets it before use). A pre-copy takes what
	 * it lists: the job goes on, and its dump saves what exists then. */
	for (size_t i = 0; i < ni && !s->live; i++)
		as[i]->load_ix = -3;
	for (struct cuip_alloc *a = vmm.head; a && !ret && !s->live; a = a->next)
		if (a->creator == self.id && cuip_carried(a) && a->drv && a->load_ix != -3) {
			errfmt(err, errlen,
			       "allocation " ID_FMT
			       " is carried but not in the SAVE request (made after INSPECT); nothing saved",
			       ID(a));
			ret = -ESTALE;
		}
	for (size_t i = 0; i < ni && !s->live; i++)
		as[i]->load_ix = -1;
	if (ret)
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
		if (carrier_extents_to_entry(&items[i], e, cuip_zalloc) || !entry_hashes(e, &items[i]))
			goto nomem;
		if (as[i]->slab) {
			e->has_alloc_offset = 1;
			e->alloc_offset = aoff[i];
		}
		sr->entries[sr->n_entries++] = e;
	}
	sr->bytes = total;
	sr->has_inherited_bytes = 1;
	sr->inherited_bytes = stats.inherited_bytes;
	*out = sr;
	goto out;
nomem:
	errfmt(err, errlen, "out of memory");
	ret = -ENOMEM;
out:
	carry_end(maps, n, items, ni);
	free(as);
	free(aoff);
	return ret;
}

/* ---- LOAD ------------------------------------------------------------------ */

/*
 * Before anything is recreated: a slab comes in one entry per live piece,
 * each naming the piece's offset and size, none twice, none missing. Leaves
 * load_ix -1 everywhere (LOAD sets it to the entry whose temporary mapping
 * holds the recreated slab; the others load into that mapping).
 */
static int load_check_pieces(const Cuip__Load *l, char *err, size_t errlen)
{
	int ret = 0;

	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		a->load_ix = -1;
		for (size_t k = 0; k < a->npieces; k++)
			a->pieces[k].loaded = false;
	}
	for (size_t i = 0; i < l->n_entries; i++) {
		const Cuip__CarrierEntry *e = l->entries[i];
		struct cuip_alloc *a = e->alloc ? cuip_alloc_by_id(e->alloc->creator, e->alloc->serial) : NULL;
		struct cuip_piece *pc;

		if (!a || !a->slab || a->creator != self.id)
			continue; /* LOAD's own checks */
		pc = e->has_alloc_offset ? cuip_piece_at(a, e->alloc_offset, true) : NULL;
		if (!pc || pc->size != e->size || pc->loaded) {
			errfmt(err, errlen,
			       "allocation " ID_FMT ": carrier entry %zu (%llu bytes at offset %#llx) is %s", ID(a), i,
			       (unsigned long long)e->size, (unsigned long long)e->alloc_offset,
			       pc && pc->loaded ? "a second entry for one piece" : "no live piece of the slab");
			return -EINVAL;
		}
		pc->loaded = true;
		a->load_ix = -2; /* has entries */
	}
	for (struct cuip_alloc *a = vmm.head; a && !ret; a = a->next) {
		for (size_t k = 0; a->load_ix == -2 && k < a->npieces && !ret; k++)
			if (!a->pieces[k].loaded) {
				errfmt(err, errlen,
				       "allocation " ID_FMT ": the piece at offset %#llx has no carrier entry", ID(a),
				       (unsigned long long)a->pieces[k].off);
				ret = -ENODATA;
			}
		a->load_ix = -1;
	}
	return ret;
}

static int carry_load(const Cuip__Load *l, const int *fds, size_t nfds, Cuip__LoadReply **out, char *err, size_t errlen)
{
	struct carrier_item *items = NULL;
	struct tmpmap *maps = NULL;
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
	 * one copy at a time, LOAD 21 GB/s instead of 41 (test/gpu/RESULTS.md).
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
	if (!items || !maps)
		goto nomem;
	ret = load_check_pieces(l, err, errlen);
	if (ret)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const Cuip__CarrierEntry *e = l->entries[i];
		struct cuip_alloc *a = e->alloc ? cuip_alloc_by_id(e->alloc->creator, e->alloc->serial) : NULL;
		struct cuip_piece *pc = NULL;
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
		if (a->slab) {
			pc = cuip_piece_at(a, e->alloc_offset, true); /* checked above */
		} else if (e->size != a->size || e->has_alloc_offset) {
			errfmt(err, errlen, "allocation " ID_FMT ": carrier holds %llu bytes, the allocation %llu",
			       ID(a), (unsigned long long)e->size, (unsigned long long)a->size);
			ret = -EINVAL;
			goto out;
		}
		if (a->load_ix >= 0) { /* a further piece of a slab loaded here */
			items[i] = items[a->load_ix];
			items[i].va = maps[a->load_ix].va + pc->off;
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
		a->load_ix = (int32_t)i;
		items[i].va = maps[i].va + (pc ? pc->off : 0);
		items[i].ctx = ctx;
item:
		if (pc)
			snprintf(name, sizeof(name), "allocation " ID_FMT " piece at %#llx", ID(a),
				 (unsigned long long)pc->off);
		else
			snprintf(name, sizeof(name), "allocation " ID_FMT, ID(a));
		items[i].name = cuip_strdup(name);
		items[i].size = e->size;
		items[i].chunk_size = e->chunk_size;
		items[i].offset = e->offset;
		items[i].crc = e->crc32c;
		items[i].ncrc = e->n_crc32c;
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
	return ret;
}

CUIP_SLICE(carry, .name = "carried unicast memory", .save = carry_save, .load = carry_load);
