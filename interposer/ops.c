/*
 * ops.c - plugin operations, run one at a time by the "cuip-op" thread: the
 * phase machine. It checks each request against the phase and runs the
 * resources' checkpoint slices (slice.h: unicast in vmm.c, multicast.c,
 * pool.c) for INSPECT, PREPARE_*, REBUILD stages and VERIFY, naming no
 * resource module; QUIESCE, the carrier's SAVE and LOAD of the carried
 * bytes and RESUME are its own. Called by control.c (the op thread).
 *
 * Lifecycle: ACTIVE -QUIESCE-> QUIESCED -PREPARE_UNICAST-> PREPARED
 * -LOAD/REBUILD-> RESTORING -RESUME-> ACTIVE. A failed step replies a
 * negative errno naming the allocation and leaves the gate closed, so the
 * plugin can roll back (LOAD + REBUILD + RESUME on the running job) or kill
 * a half-restored tree; RESUME refuses while shared memory is detached. A
 * topology that comes back different (VERIFY) makes the process FAILED.
 *
 * The op thread holds cuip_state_lock for each operation: application
 * threads cannot want it meanwhile (they wait at the closed gate), and the
 * control thread never takes it. QUIESCE drops it while it closes the
 * gate: a call in flight may need it to leave (an import takes it after
 * its FETCH), and waiting for that call with the lock held would stall
 * both until the timeout. The op thread runs the driver in each
 * device's primary context, retained for the operation and released after;
 * application threads' current contexts are theirs and untouched.
 * Replies come from the reply arena (reply.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "carrier.h"
#include "cuip.h"
#include "drain.h"
#include "driver.h"
#include "inspect.h"
#include "ipc.h"
#include "ops.h"
#include "pool.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"
#include "digest.h"

#define ID_FMT	    "%016llx:%llu"
#define ID(a)	    (unsigned long long)(a)->creator, (unsigned long long)(a)->serial
#define MAX_DEVICES 64

static Cuip__Response *reply(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static Cuip__Response *reply(int status, const char *fmt, ...)
{
	Cuip__Response *r = cuip_zalloc(sizeof(*r));
	char buf[512];
	va_list ap;

	if (!r)
		return NULL;
	cuip__response__init(r);
	r->status = status;
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		r->error = cuip_strdup(buf);
		if (status)
			pr_err("%s", buf);
	}
	return r;
}

static const char *phase_name(Cuip__Phase p)
{
	static const char *const n[] = {"?", "ACTIVE", "QUIESCED", "PREPARED", "RESTORING", "FAILED"};
	return (unsigned)p < 6 ? n[p] : "?";
}

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

/*
 * LOAD runs during restore while the application's threads are frozen
 * (carrier.h), the driver's internal threads included: only the op thread
 * and the carrier's own I/O threads run, so a copy must complete on the
 * thread that issues it. Synchronous host-to-device copies do (the stream
 * argument is unused; the carrier's streams stay empty, so its
 * synchronizations return at once).
 */
static CUresult htod_on_this_thread(CUdeviceptr dst, const void *src, size_t n, CUstream s)
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

/* ---- QUIESCE --------------------------------------------------------------- */

static Cuip__Response *op_quiesce(const Cuip__Quiesce *q)
{
	Cuip__Phase ph = cuip_phase();
	unsigned elapsed;
	struct timespec t0;
	char msg[640];
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ph == CUIP__PHASE__PHASE_QUIESCED)
		return reply(0, NULL);
	if (ph != CUIP__PHASE__PHASE_ACTIVE)
		return reply(-EBUSY, "pid %d: QUIESCE in phase %s", self.pid, phase_name(ph));
	cuip_state_drop(); /* see the top of this file */
	ret = cuip_gate_close(q->timeout_ms);
	cuip_state_take();
	if (ret == -ETIMEDOUT)
		return reply(ret, "pid %d: CUDA calls still in flight after %u ms; gate reopened", self.pid,
			     q->timeout_ms);
	if (ret)
		return reply(ret, "pid %d: cannot close the API gate: %s; gate reopened", self.pid, strerror(-ret));
	/* A pool shared after the preflight's INSPECT: refused before anything changes. */
	if (cuip_pool_refusal(msg, sizeof(msg))) {
		cuip_gate_open();
		return reply(-EPERM, "%s; gate reopened", msg);
	}
	/* Everything queued on the devices completes before anything is torn
	 * down, within what is left of the timeout (drain.c): work that cannot
	 * drain (a kernel waiting for a gated peer) reopens the gate. */
	elapsed = cuip_ms_since(&t0);
	ret = cuip_drain(q->timeout_ms > elapsed ? q->timeout_ms - elapsed : 1, msg, sizeof(msg));
	if (ret) {
		cuip_gate_open();
		return reply(ret, "pid %d: %s; gate reopened", self.pid, msg);
	}
	cuip_set_phase(CUIP__PHASE__PHASE_QUIESCED);
	return reply(0, NULL);
}

/* ---- SAVE ------------------------------------------------------------------ */

static Cuip__Response *op_save(const Cuip__Save *s, const int *fds, size_t nfds)
{
	struct carrier_item *items = NULL;
	struct tmpmap *maps = NULL;
	struct cuip_alloc **as = NULL;
	uint64_t *aoff = NULL;
	struct carrier_ops ops;
	struct carrier_config cfg;
	struct carrier_stats stats;
	Cuip__SaveReply *sr;
	Cuip__Response *resp = NULL;
	char err[512] = "", name[96];
	size_t n = s->n_allocs, ni = 0;
	uint64_t total = 0;
	int ret;

	if (cuip_phase() != CUIP__PHASE__PHASE_QUIESCED)
		return reply(-EBUSY, "pid %d: SAVE in phase %s (QUIESCE first)", self.pid, phase_name(cuip_phase()));
	if (!nfds || (nfds > 1 && s->n_files != nfds))
		return reply(-EBADF, "pid %d: SAVE came with %zu carrier files for %zu names", self.pid, nfds,
			     s->n_files);
	if (s->chunk_size == 0 || s->chunk_size > CARRIER_CHUNK_MAX)
		return reply(-EINVAL, "pid %d: SAVE chunk size %u is out of range", self.pid, s->chunk_size);
	ret = carrier_setup(&ops, &cfg, err, sizeof(err));
	if (ret)
		return reply(ret, "pid %d: carrier: %s", self.pid, err);
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
	if (!items || !maps || !as || !aoff) {
		resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
		goto out;
	}
	ni = 0;
	for (size_t i = 0; i < n; i++) {
		const Cuip__AllocId *id = s->allocs[i];
		struct cuip_alloc *a = id ? cuip_alloc_by_id(id->creator, id->serial) : NULL;
		size_t np;
		CUcontext ctx;
		CUresult r;
		int ord;

		if (!a || a->creator != self.id || !cuip_carried(a) || !a->drv) {
			resp = reply(-ENOENT,
				     "pid %d: allocation " ID_FMT " is not a live carried allocation created here",
				     self.pid, id ? (unsigned long long)id->creator : 0ull,
				     id ? (unsigned long long)id->serial : 0ull);
			goto out;
		}
		ord = a->prop.location.id;
		r = use_device(ord, &ctx);
		if (r == CUDA_SUCCESS)
			r = tmp_map(a, ord, &maps[i]);
		if (r != CUDA_SUCCESS) {
			resp = reply(-EIO, "pid %d: allocation " ID_FMT ": cannot map it for saving: %s", self.pid,
				     ID(a), cuip_cuerr(r));
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
			if (!it->crc || !it->name) {
				resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
				goto out;
			}
			total += it->size;
		}
	}
	/* Every carried allocation created here must be in the request:
	 * PREPARE_UNICAST releases them all (load_ix marks the requested
	 * ones meanwhile; LOAD resets it before use). */
	for (size_t i = 0; i < ni; i++)
		as[i]->load_ix = -3;
	for (struct cuip_alloc *a = vmm.head; a && !resp; a = a->next)
		if (a->creator == self.id && cuip_carried(a) && a->drv && a->load_ix != -3)
			resp = reply(-ESTALE,
				     "pid %d: allocation " ID_FMT
				     " is carried but not in the SAVE request (made after INSPECT); nothing saved",
				     self.pid, ID(a));
	for (size_t i = 0; i < ni; i++)
		as[i]->load_ix = -1;
	if (resp)
		goto out;
	cfg.file_names = (const char *const *)s->files;
	cfg.n_file_names = s->n_files;
	ret = carrier_save_striped(&ops, &cfg, fds, nfds, s->offset, items, ni, &stats, err, sizeof(err));
	if (ret) {
		resp = reply(ret, "pid %d: saving device memory: %s", self.pid, err);
		goto out;
	}
	resp = reply(0, NULL);
	sr = cuip_zalloc(sizeof(*sr));
	if (!resp || !sr)
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
		if (carrier_extents_to_entry(&items[i], e, cuip_zalloc))
			goto nomem;
		if (as[i]->slab) {
			e->has_alloc_offset = 1;
			e->alloc_offset = aoff[i];
		}
		sr->entries[sr->n_entries++] = e;
	}
	sr->bytes = total;
	resp->body_case = CUIP__RESPONSE__BODY_SAVE;
	resp->save = sr;
	pr_info("saved %zu allocations (%zu carrier entries), %llu bytes, %.3f s", n, ni, (unsigned long long)total,
		stats.seconds);
	goto out;
nomem:
	resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
out:
	for (size_t i = 0; maps && i < n; i++)
		tmp_unmap(&maps[i]);
	release_devices();
	carrier_items_free_extents(items, ni);
	free(items);
	free(maps);
	free(as);
	free(aoff);
	return resp;
}

/* ---- PREPARE_* (one per slice) ----------------------------------------------- */

static Cuip__Response *op_prepare(const struct cuip_slice *s)
{
	Cuip__Phase ph = cuip_phase();
	char why[512] = "";
	int ret;

	if (s->prepared_phase && ph == s->prepared_phase)
		return reply(0, NULL);
	if (ph != CUIP__PHASE__PHASE_QUIESCED)
		return reply(-EBUSY, "pid %d: %s in phase %s", self.pid, s->prepare_name, phase_name(ph));
	ret = s->prepare(why, sizeof(why));
	if (ret)
		return reply(ret, "pid %d: %s", self.pid, why);
	if (s->prepared_phase)
		cuip_set_phase(s->prepared_phase);
	return reply(0, NULL);
}

/* ---- carried unicast memory ------------------------------------------------- */

static bool is_shared(const struct cuip_alloc *a)
{
	return a->owner == CUIP__OWNER__OWNER_SHARED;
}

/* Detached by PREPARE_UNICAST, refilled by LOAD and REBUILD: the unicast
 * memory the carrier moves (shared, and private unless left to native). */
static bool unicast_carried(const struct cuip_alloc *a)
{
	return cuip_carried(a);
}

/* ---- LOAD ------------------------------------------------------------------ */

/*
 * Before anything is recreated: a slab comes in one entry per live piece,
 * each naming the piece's offset and size, none twice, none missing. Leaves
 * load_ix -1 everywhere (LOAD sets it to the entry whose temporary mapping
 * holds the recreated slab; the others load into that mapping).
 */
static Cuip__Response *load_check_pieces(const Cuip__Load *l)
{
	Cuip__Response *resp = NULL;

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
		if (!pc || pc->size != e->size || pc->loaded)
			return reply(
				-EINVAL,
				"pid %d: allocation " ID_FMT ": carrier entry %zu (%llu bytes at offset %#llx) is %s",
				self.pid, ID(a), i, (unsigned long long)e->size, (unsigned long long)e->alloc_offset,
				pc && pc->loaded ? "a second entry for one piece" : "no live piece of the slab");
		pc->loaded = true;
		a->load_ix = -2; /* has entries */
	}
	for (struct cuip_alloc *a = vmm.head; a && !resp; a = a->next) {
		for (size_t k = 0; a->load_ix == -2 && k < a->npieces && !resp; k++)
			if (!a->pieces[k].loaded)
				resp = reply(-ENODATA,
					     "pid %d: allocation " ID_FMT
					     ": the piece at offset %#llx has no carrier entry",
					     self.pid, ID(a), (unsigned long long)a->pieces[k].off);
		a->load_ix = -1;
	}
	return resp;
}

static Cuip__Response *op_load(const Cuip__Load *l, const int *fds, size_t nfds)
{
	struct carrier_item *items = NULL;
	struct tmpmap *maps = NULL;
	struct carrier_ops ops;
	struct carrier_config cfg;
	struct carrier_stats stats;
	uint8_t old_uuid[MAX_DEVICES][16];
	bool has_uuid[MAX_DEVICES] = {false};
	Cuip__Response *resp = NULL;
	char err[512] = "", name[96];
	size_t n = l->n_entries;
	uint64_t total = 0;
	int ret;

	if (!nfds)
		return reply(-EBADF, "pid %d: LOAD came without a carrier file", self.pid);
	if (cuip_phase() == CUIP__PHASE__PHASE_ACTIVE || cuip_phase() == CUIP__PHASE__PHASE_QUIESCED)
		return reply(-EBUSY, "pid %d: LOAD in phase %s (shared memory is attached)", self.pid,
			     phase_name(cuip_phase()));
	ret = carrier_setup(&ops, &cfg, err, sizeof(err));
	if (ret)
		return reply(ret, "pid %d: carrier: %s", self.pid, err);
	ops.memcpy_htod_async = htod_on_this_thread;
	/* Devices by UUID: remember the old ordinals' UUIDs, then look again. */
	for (int i = 0; i < self.ndev; i++) {
		if (self.dev[i].ordinal >= 0 && self.dev[i].ordinal < MAX_DEVICES) {
			memcpy(old_uuid[self.dev[i].ordinal], self.dev[i].uuid, 16);
			has_uuid[self.dev[i].ordinal] = true;
		}
	}
	cuip_devices_rescan();
	cuip_set_phase(CUIP__PHASE__PHASE_RESTORING);
	items = calloc(n ? n : 1, sizeof(*items));
	maps = calloc(n ? n : 1, sizeof(*maps));
	if (!items || !maps) {
		resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
		goto out;
	}
	resp = load_check_pieces(l);
	if (resp)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const Cuip__CarrierEntry *e = l->entries[i];
		struct cuip_alloc *a = e->alloc ? cuip_alloc_by_id(e->alloc->creator, e->alloc->serial) : NULL;
		struct cuip_piece *pc = NULL;
		CUmemAllocationProp prop;
		CUcontext ctx;
		CUresult r;
		int old, ord;

		if (!a || a->creator != self.id || !unicast_carried(a)) {
			resp = reply(-ENOENT,
				     "pid %d: carrier entry %zu names allocation " ID_FMT
				     ", which this process did not create as carried memory",
				     self.pid, i, e->alloc ? (unsigned long long)e->alloc->creator : 0ull,
				     e->alloc ? (unsigned long long)e->alloc->serial : 0ull);
			goto out;
		}
		if (a->slab) {
			pc = cuip_piece_at(a, e->alloc_offset, true); /* checked above */
		} else if (e->size != a->size || e->has_alloc_offset) {
			resp = reply(-EINVAL,
				     "pid %d: allocation " ID_FMT ": carrier holds %llu bytes, the allocation %llu",
				     self.pid, ID(a), (unsigned long long)e->size, (unsigned long long)a->size);
			goto out;
		}
		if (a->load_ix >= 0) { /* a further piece of a slab loaded here */
			items[i] = items[a->load_ix];
			items[i].va = maps[a->load_ix].va + pc->off;
			goto item;
		}
		if (a->drv) {
			resp = reply(-EBUSY,
				     "pid %d: allocation " ID_FMT " is attached; LOAD only refills detached ones",
				     self.pid, ID(a));
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
			resp = reply(-ENOMEM,
				     "pid %d: allocation " ID_FMT ": recreating %llu bytes on device %d failed: %s",
				     self.pid, ID(a), (unsigned long long)a->size, ord, cuip_cuerr(r));
			goto out;
		}
		a->prop.location.id = prop.location.id;
		r = tmp_map(a, ord, &maps[i]);
		if (r != CUDA_SUCCESS) {
			resp = reply(-EIO, "pid %d: allocation " ID_FMT ": cannot map it for loading: %s", self.pid,
				     ID(a), cuip_cuerr(r));
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
		if (carrier_extents_from_entry(&items[i], e)) {
			resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
			goto out;
		}
		total += e->size;
	}
	cfg.file_names = (const char *const *)l->files;
	cfg.n_file_names = l->n_files;
	ret = carrier_load_striped(&ops, &cfg, fds, nfds, items, n, &stats, err, sizeof(err));
	if (ret) {
		resp = reply(ret, "pid %d: loading device memory: %s", self.pid, err);
		goto out;
	}
	resp = reply(0, NULL);
	if (!resp)
		goto out;
	resp->load = cuip_zalloc(sizeof(*resp->load));
	if (!resp->load) {
		resp = reply(-ENOMEM, "pid %d: out of memory", self.pid);
		goto out;
	}
	cuip__load_reply__init(resp->load);
	resp->load->bytes = total;
	resp->body_case = CUIP__RESPONSE__BODY_LOAD;
	pr_info("loaded %zu carrier entries, %llu bytes, %.3f s", n, (unsigned long long)total, stats.seconds);
out:
	for (size_t i = 0; maps && i < n; i++)
		tmp_unmap(&maps[i]);
	release_devices();
	carrier_items_free_extents(items, n);
	free(items);
	free(maps);
	return resp;
}

/* ---- REBUILD --------------------------------------------------------------- */

/* A REBUILD or VERIFY that names another process (the coordinator talking
 * to the wrong socket) is refused before it touches anything. */
static bool not_us(const Cuip__ProcessId *id)
{
	return id && id->id != self.id;
}

static Cuip__Response *wrong_process(const char *op, const Cuip__ProcessId *id)
{
	return reply(-ESRCH, "pid %d: %s names process %016llx, this is %016llx", self.pid, op,
		     (unsigned long long)id->id, (unsigned long long)self.id);
}

/* Detached by a PREPARE while still QUIESCED: a REBUILD is a rollback. */
static bool any_detached(void)
{
	cuip_for_each_slice(s)
	{
		if (s->detached && s->detached())
			return true;
	}
	return false;
}

static Cuip__Response *op_rebuild(const Cuip__Rebuild *rb)
{
	Cuip__Phase ph = cuip_phase();
	char why[512] = "";
	int ret;

	if (not_us(rb->self))
		return wrong_process("REBUILD", rb->self);
	/* QUIESCED with multicast detached: a rollback after PREPARE_MULTICAST. */
	if (ph == CUIP__PHASE__PHASE_ACTIVE || (ph == CUIP__PHASE__PHASE_QUIESCED && !any_detached()))
		return reply(-EBUSY, "pid %d: REBUILD in phase %s (shared memory is attached)", self.pid,
			     phase_name(ph));
	cuip_set_phase(CUIP__PHASE__PHASE_RESTORING);
	cuip_for_each_slice(s)
	{
		if (!s->runs_stage || !s->runs_stage(rb->stage))
			continue;
		ret = s->rebuild(rb, why, sizeof(why));
		return ret ? reply(ret, "pid %d: %s", self.pid, why) : reply(0, NULL);
	}
	return reply(-EINVAL, "pid %d: unknown rebuild stage %d", self.pid, (int)rb->stage);
}

/* ---- VERIFY ---------------------------------------------------------------- */

static bool same_access(Cuip__Access **x, size_t nx, Cuip__Access **y, size_t ny)
{
	if (nx != ny)
		return false;
	qsort(x, nx, sizeof(*x), cuip_cmp_access_by_location);
	qsort(y, ny, sizeof(*y), cuip_cmp_access_by_location);
	for (size_t i = 0; i < nx; i++)
		if (x[i]->va != y[i]->va || x[i]->size != y[i]->size || x[i]->location_type != y[i]->location_type ||
		    x[i]->location_id != y[i]->location_id || x[i]->flags != y[i]->flags)
			return false;
	return true;
}

static bool same_pieces(const Cuip__Allocation *x, const Cuip__Allocation *y)
{
	if (x->slab != y->slab || x->n_pieces != y->n_pieces)
		return false;
	for (size_t i = 0; i < x->n_pieces; i++) /* both in offset order (inspect.c) */
		if (x->pieces[i]->offset != y->pieces[i]->offset || x->pieces[i]->size != y->pieces[i]->size ||
		    x->pieces[i]->opens != y->pieces[i]->opens)
			return false;
	return true;
}

/* What VERIFY checks before comparing records: nothing may still be
 * detached, and the counts must match. NULL or the failure reply. */
static Cuip__Response *verify_attached(const Cuip__ProcessState *now, size_t nalloc, size_t nmap)
{
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		if ((is_shared(a) || unicast_carried(a)) && !a->drv) {
			cuip_fail("allocation " ID_FMT " is still detached after the rebuild", ID(a));
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	for (size_t i = 0; i < vmm.nmaps; i++) {
		if (vmm.maps[i]->detached) {
			cuip_fail("allocation " ID_FMT " is still detached after the rebuild", ID(vmm.maps[i]->a));
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	if (now->n_allocations != nalloc || now->n_mappings != nmap) {
		cuip_fail("%zu allocations and %zu mappings, the checkpoint had %zu and %zu", now->n_allocations,
			  now->n_mappings, nalloc, nmap);
		return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
	}
	return NULL;
}

/* VERIFY by digest (digest.h): the same checks as the record-by-record
 * comparison, 8 bytes on the wire instead of the whole state. A differing
 * digest does not fail the process: the coordinator follows up with the
 * whole state, whose comparison says what differs (and fails it). */
static Cuip__Response *verify_digest(const Cuip__Verify *v)
{
	Cuip__ProcessState *now;
	Cuip__Response *err;
	uint64_t d;

	if (!v->has_digest || !v->has_allocations || !v->has_mappings)
		return reply(-EINVAL, "pid %d: VERIFY without an expected state or a digest with its counts", self.pid);
	if (not_us(v->self))
		return wrong_process("VERIFY", v->self);
	now = cuip_state_build();
	if (!now)
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	err = verify_attached(now, v->allocations, v->mappings);
	if (err)
		return err;
	if (!cuip_state_digest(now, &d))
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	if (d != v->digest)
		return reply(-EBADE, "pid %d: the restored records' digest %016llx is not the checkpoint's %016llx",
			     self.pid, (unsigned long long)d, (unsigned long long)v->digest);
	pr_info("verified %zu allocations and %zu mappings (digest %016llx)", now->n_allocations, now->n_mappings,
		(unsigned long long)d);
	return reply(0, NULL);
}

static Cuip__Response *op_verify(Cuip__Verify *v)
{
	Cuip__ProcessState *exp = v->expected, *now;
	Cuip__Response *err;
	size_t shared = 0;

	if (!exp)
		return verify_digest(v);
	if (not_us(exp->self))
		return wrong_process("VERIFY", exp->self);
	now = cuip_state_build();
	if (!now)
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	err = verify_attached(now, exp->n_allocations, exp->n_mappings);
	if (err)
		return err;
	/* Matched by sorting both sides (identity, address): linear after the
	 * sort, where a search per record was quadratic in the record count. */
	qsort(now->allocations, now->n_allocations, sizeof(*now->allocations), cuip_cmp_alloc_by_id);
	qsort(exp->allocations, exp->n_allocations, sizeof(*exp->allocations), cuip_cmp_alloc_by_id);
	qsort(now->mappings, now->n_mappings, sizeof(*now->mappings), cuip_cmp_mapping_by_va);
	qsort(exp->mappings, exp->n_mappings, sizeof(*exp->mappings), cuip_cmp_mapping_by_va);
	for (size_t i = 0; i < exp->n_allocations; i++) {
		const Cuip__Allocation *e = exp->allocations[i];
		const Cuip__Allocation *f = now->allocations[i];

		if (!e->id || !f->id || f->id->creator != e->id->creator || f->id->serial != e->id->serial)
			f = NULL;
		if (!f || f->owner != e->owner || f->origin != e->origin || !f->props != !e->props ||
		    (f->props && f->props->size != e->props->size) || !same_pieces(f, e)) {
			cuip_fail("allocation " ID_FMT " %s after the rebuild", ID(e->id),
				  f ? "differs from the checkpoint" : "is missing");
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
		shared += e->owner == CUIP__OWNER__OWNER_SHARED;
	}
	for (size_t i = 0; i < exp->n_mappings; i++) {
		Cuip__Mapping *e = exp->mappings[i], *f = now->mappings[i];

		if (f->va != e->va)
			f = NULL;
		if (!f || f->size != e->size || f->offset != e->offset || f->alloc->creator != e->alloc->creator ||
		    f->alloc->serial != e->alloc->serial ||
		    !same_access(f->access, f->n_access, e->access, e->n_access)) {
			cuip_fail("mapping at %#llx of allocation " ID_FMT " %s after the rebuild",
				  (unsigned long long)e->va, ID(e->alloc),
				  f ? "differs from the checkpoint" : "is missing");
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	cuip_for_each_slice(s)
	{
		char why[512] = "";
		if (s->verify && s->verify(exp, why, sizeof(why))) {
			cuip_fail("%s", why);
			return reply(-EIO, "pid %d: %s", self.pid, why);
		}
	}
	pr_info("verified %zu allocations (%zu shared) and %zu mappings", exp->n_allocations, shared, exp->n_mappings);
	return reply(0, NULL);
}

/* ---- RESUME ---------------------------------------------------------------- */

static Cuip__Response *op_resume(void)
{
	Cuip__Phase ph = cuip_phase();

	if (ph == CUIP__PHASE__PHASE_ACTIVE)
		return reply(0, NULL);
	if (ph == CUIP__PHASE__PHASE_FAILED)
		return reply(-EIO, "pid %d: FAILED (%s); the gate stays closed", self.pid, cuip_failure());
	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		if ((is_shared(a) || unicast_carried(a)) && !a->drv)
			return reply(-EBUSY, "pid %d: allocation " ID_FMT " is detached; LOAD and REBUILD first",
				     self.pid, ID(a));
	for (size_t i = 0; i < vmm.nmaps; i++)
		if (vmm.maps[i]->detached)
			return reply(-EBUSY, "pid %d: mapping %#llx is detached; REBUILD first", self.pid,
				     (unsigned long long)vmm.maps[i]->va);
	cuip_set_phase(CUIP__PHASE__PHASE_ACTIVE);
	cuip_gate_open();
	return reply(0, NULL);
}

/* ---- INSPECT and dispatch ------------------------------------------------- */

static Cuip__Response *op_inspect(void)
{
	Cuip__Response *r = reply(0, NULL);

	if (!r)
		return NULL;
	r->state = cuip_state_build();
	if (!r->state)
		return reply(-ENOMEM, "out of memory building the state");
	r->body_case = CUIP__RESPONSE__BODY_STATE;
	return r;
}

Cuip__Response *cuip_op_run(const Cuip__Request *req, const int *fds, size_t nfds)
{
	Cuip__Response *r;

	if (cuip_driver_init())
		return reply(-ENOENT, "no CUDA driver");
	cuip_state_take();
	switch (req->body_case) {
	case CUIP__REQUEST__BODY_INSPECT:
		r = op_inspect();
		break;
	case CUIP__REQUEST__BODY_QUIESCE:
		r = op_quiesce(req->quiesce);
		break;
	case CUIP__REQUEST__BODY_SAVE:
		r = op_save(req->save, fds, nfds);
		break;
	case CUIP__REQUEST__BODY_LOAD:
		r = op_load(req->load, fds, nfds);
		break;
	case CUIP__REQUEST__BODY_REBUILD:
		r = op_rebuild(req->rebuild);
		break;
	case CUIP__REQUEST__BODY_VERIFY:
		r = op_verify(req->verify);
		break;
	case CUIP__REQUEST__BODY_RESUME:
		r = op_resume();
		break;
	default: {
		const struct cuip_slice *prep = NULL;

		cuip_for_each_slice(s)
		{
			if (s->prepare && s->prepare_request == req->body_case)
				prep = s;
		}
		r = prep ? op_prepare(prep)
			 : reply(-ENOSYS, "request %d is not implemented by this interposer", (int)req->body_case);
		break;
	}
	}
	cuip_state_drop();
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	return r;
}

void cuip_response_free(Cuip__Response *r)
{
	(void)r;
	cuip_arena_release();
}
