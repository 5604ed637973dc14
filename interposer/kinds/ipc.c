/*
 * ipc.c - legacy device memory: cuMemAlloc converted to POSIX-capable VMM,
 * and cuIpc* emulated over the project's identities, tokens and peer FD
 * service, so that an IPC importer can be checkpointed on any driver (a
 * natively checkpointed IPC importer cannot be restored: docs/driver-facts.md,
 * 'Native checkpoint of sharing processes').
 *
 * cuMemAlloc_v2 of at least one granule creates a granularity-rounded
 * POSIX-capable allocation on the current context's device, reserves a VA
 * range of that size, maps it and gives the device read-write access; the
 * application sees the VA. The record (ORIGIN_MALLOC) stays OWNER_NATIVE
 * (native checkpoint saves it) until cuIpcGetMemHandle shares it; then it is
 * SHARED for life and the creator carries its bytes.
 *
 * Smaller requests cost what they cost natively: the driver packs them into
 * 2 MiB chunks, 512 bytes apart (docs/driver-facts.md, 'Small allocations'),
 * so here they are pieces of a
 * slab, one granule-sized allocation made and mapped as above (a->ipc->slab),
 * placed first-fit at PIECE_ALIGN. The slab is one record and one mapping;
 * its pieces (struct cuip_piece) are the live cuMemAlloc results. A freed
 * piece can be reused at once; the slab whose last piece is freed is
 * unmapped and released. cuMemGetAddressRange_v2 reports the requested size
 * and, for a piece, the piece's own base. cuIpcGetMemHandle of a piece shares
 * its slab (the whole slab becomes SHARED; the carrier saves its live pieces
 * only, one entry each, so freed pieces are never saved); the handle names
 * the piece's offset and size, and an importer maps the whole slab once and
 * gets the piece at its offset, at the same address after a restore since
 * the slab's mapping is rebuilt there.
 *
 * A CUipcMemHandle minted here is 64 bytes (struct ipc_handle): a magic that
 * tells our handles from the driver's, the creator's identity, pid and the
 * allocation's serial, sizes and the authorization token. cuIpcOpenMemHandle
 * fetches a real FD from the creator's control socket (the Fetch request of
 * the peer FD service), imports it, maps it at a VA of its own and gives the
 * current device access (ORIGIN_IPC_OPEN, SHARED). Opening the same handle
 * again returns the same VA and counts; the last cuIpcCloseMemHandle unmaps
 * and releases. A handle without our magic (made by the driver for a process
 * not running under cuinterpose) is refused with CUDA_ERROR_NOT_SUPPORTED and
 * a log line: its memory could not be checkpointed. A handle with our magic
 * but a bad version or sizes gets CUDA_ERROR_INVALID_VALUE.
 *
 * Callers: the application, through every resolution path (resolve.c).
 * Locking: ipc_mu serializes IPC opens and closes in this process (so two
 * threads opening one handle map it once); it is taken before
 * cuip_state_lock, only by application threads inside the gate. Records and
 * mappings are record.c's, under cuip_state_lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "peer.h"
#include "pool.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "xcache.h"

#define IPC_MAGIC   0x50495543u /* "CUIP" */
#define IPC_VERSION 1
#define IPC_F_PIECE 1u /* a piece of a slab, at `offset` */

/* Small cuMemAlloc results are this far apart at least, as the driver's are
 * (it guarantees 256 bytes; 512 on every GPU since Kepler). */
#define PIECE_ALIGN 512u
#define NO_FIT	    UINT64_MAX

struct ipc_handle {
	uint32_t magic;
	uint16_t version;
	uint16_t flags; /* 0 or IPC_F_PIECE */
	int32_t creator_pid;
	uint32_t offset; /* IPC_F_PIECE: the piece's offset in the slab, else 0 */
	uint64_t creator;
	uint64_t serial;
	uint64_t size;	    /* backing bytes (granularity-rounded) */
	uint64_t requested; /* what cuMemAlloc was asked for */
	uint8_t token[16];
};

_Static_assert(sizeof(struct ipc_handle) == CU_IPC_HANDLE_SIZE, "IPC handle layout");

static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;

/* A piece of a slab: [off, off+size) of the allocation. The creator's
 * pieces are its live cuMemAlloc results; an importer's are the pieces it
 * IPC-opened, with their open counts. Sorted by off, disjoint. */
struct cuip_piece {
	uint64_t off, size; /* size: what cuMemAlloc was asked for */
	uint32_t opens;	    /* importer: opens not yet closed */
};

/* This kind's part of a record (record.h's a->ipc; cuip_state_lock): a
 * slab's pieces, and what this process opened with cuIpcOpenMemHandle. */
struct cuip_ipc {
	bool slab; /* small cuMemAlloc requests share it as pieces */
	struct cuip_piece *pieces;
	size_t npieces, cappieces;
	uint64_t slab_va;			  /* creator: where its one mapping is */
	uint64_t slab_used;			  /* creator: bytes its pieces take, PIECE_ALIGN-rounded */
	struct cuip_alloc *slab_prev, *slab_next; /* creator's slabs (`slabs`) */
	uint64_t va;				  /* IPC-opened here: the mapping's address ... */
	uint32_t opens;				  /* ... and how many opens it has not closed */
};

static struct cuip_alloc *slabs; /* this process's slabs, newest first (cuip_state_lock) */

/* a's part of this kind, made on first use; NULL when out of memory. */
static struct cuip_ipc *ipc_make(struct cuip_alloc *a)
{
	if (!a->ipc)
		a->ipc = calloc(1, sizeof(*a->ipc));
	return a->ipc;
}

static bool is_slab(const struct cuip_alloc *a)
{
	return a->ipc && a->ipc->slab;
}

static uint32_t ipc_opens(const struct cuip_alloc *a)
{
	return a->ipc ? a->ipc->opens : 0;
}
static CUresult enter(void *fnp)
{
	if (cuip_driver_init())
		return CUDA_ERROR_NOT_FOUND;
	if (!*(void **)fnp || !real.cuCtxGetDevice || !real.cuMemGetAllocationGranularity)
		return CUDA_ERROR_NOT_FOUND;
	return cuip_gate_enter();
}

/* Reserve, map and open [va, va+size) of h for device dev (no lock needed:
 * nothing is recorded yet). */
static CUresult map_new(CUmemGenericAllocationHandle h, size_t size, CUdevice dev, CUdeviceptr *va)
{
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUresult r;

	*va = 0;
	r = real.cuMemAddressReserve(va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMemMap(*va, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto free_va;
	r = real.cuMemSetAccess(*va, size, &d, 1);
	if (r != CUDA_SUCCESS)
		goto unmap;
	return CUDA_SUCCESS;
unmap:
	real.cuMemUnmap(*va, size);
free_va:
	real.cuMemAddressFree(*va, size);
	*va = 0;
	return r;
}

static void map_gone(CUdeviceptr va, size_t size)
{
	CUresult r = real.cuMemUnmap(va, size);

	if (r == CUDA_SUCCESS)
		r = real.cuMemAddressFree(va, size);
	if (r != CUDA_SUCCESS)
		pr_err("unmapping legacy memory at %#llx: %s", (unsigned long long)va, cuip_cuerr(r));
}

/* Record the mapping of a made by map_new (lock held); 0 or -ENOMEM. */
static int map_record(struct cuip_alloc *a, CUdeviceptr va, CUdevice dev)
{
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
	struct cuip_mapping *m = calloc(1, sizeof(*m));

	cuip_state_assert_held();
	if (!m)
		return -ENOMEM;
	m->va = va;
	m->size = a->size;
	m->a = a;
	m->legacy = true;
	if (cuip_access_set(m, va, a->size, &loc, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) || cuip_map_insert(m)) {
		cuip_map_free(m);
		return -ENOMEM;
	}
	a->nmaps++;
	cuip_peer_grant(m);
	return 0;
}

/* The legacy mapping that holds va, or NULL (lock held). */
static struct cuip_mapping *legacy_in(CUdeviceptr va)
{
	struct cuip_mapping *m = cuip_mapping_at(va);

	cuip_state_assert_held();
	return m && m->legacy ? m : NULL;
}

/* ---- slab pieces (lock held) ------------------------------------------- */

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Index of the first piece starting at or after off. */
static size_t piece_lower(const struct cuip_alloc *a, uint64_t off)
{
	size_t lo = 0, hi = a->ipc->npieces;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (a->ipc->pieces[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The piece of a that holds byte offset off (exact: starts there), or NULL. */
static struct cuip_piece *piece_at(const struct cuip_alloc *a, uint64_t off, bool exact)
{
	size_t i = piece_lower(a, off);

	cuip_state_assert_held();
	if (i < a->ipc->npieces && a->ipc->pieces[i].off == off)
		return &a->ipc->pieces[i];
	if (exact)
		return NULL;
	/* The creator's pieces are disjoint: only the one before can hold off.
	 * An importer's may overlap (a piece freed and reallocated by the
	 * creator while still open here): look further back. */
	while (i-- > 0) {
		struct cuip_piece *p = &a->ipc->pieces[i];
		if (off < p->off + p->size)
			return p;
		if (a->origin != CUIP__ORIGIN__ORIGIN_IPC_OPEN)
			break;
	}
	return NULL;
}

/* A new piece [off, off+size) in order; NULL when out of memory. */
static struct cuip_piece *piece_insert(struct cuip_alloc *a, uint64_t off, uint64_t size)
{
	size_t i = piece_lower(a, off);

	if (a->ipc->npieces == a->ipc->cappieces) {
		size_t cap = a->ipc->cappieces ? a->ipc->cappieces * 2 : 8;
		struct cuip_piece *n = realloc(a->ipc->pieces, cap * sizeof(*n));
		if (!n)
			return NULL;
		a->ipc->pieces = n;
		a->ipc->cappieces = cap;
	}
	memmove(&a->ipc->pieces[i + 1], &a->ipc->pieces[i], (a->ipc->npieces - i) * sizeof(*a->ipc->pieces));
	a->ipc->pieces[i] = (struct cuip_piece){.off = off, .size = size};
	a->ipc->npieces++;
	return &a->ipc->pieces[i];
}

static void piece_remove(struct cuip_alloc *a, struct cuip_piece *p)
{
	size_t i = (size_t)(p - a->ipc->pieces);

	memmove(&a->ipc->pieces[i], &a->ipc->pieces[i + 1], (a->ipc->npieces - i - 1) * sizeof(*a->ipc->pieces));
	a->ipc->npieces--;
}

/* First offset where size bytes fit in slab a at PIECE_ALIGN, or NO_FIT. */
static uint64_t slab_fit(const struct cuip_alloc *a, uint64_t size)
{
	uint64_t end = 0, at;

	for (size_t i = 0; i < a->ipc->npieces; i++) {
		at = align_up(end, PIECE_ALIGN);
		if (at + size <= a->ipc->pieces[i].off)
			return at;
		end = a->ipc->pieces[i].off + a->ipc->pieces[i].size;
	}
	at = align_up(end, PIECE_ALIGN);
	return at + size <= a->size ? at : NO_FIT;
}

static bool ipc_owns(const struct cuip_alloc *a)
{
	return a->ipc != NULL;
}

static void ipc_free(struct cuip_alloc *a)
{
	free(a->ipc->pieces);
	free(a->ipc);
	a->ipc = NULL;
}
/* INSPECT: the opens not closed, and a slab's pieces. */
static int ipc_inspect(const struct cuip_alloc *a, Cuip__Allocation *m)
{
	const struct cuip_ipc *x = a->ipc;

	if (x->opens) {
		m->has_ipc_opens = 1;
		m->ipc_opens = x->opens;
	}
	if (!x->slab)
		return 0;
	m->has_slab = 1;
	m->slab = 1;
	m->pieces = cuip_zalloc(sizeof(*m->pieces) * (x->npieces ? x->npieces : 1));
	if (!m->pieces)
		return -ENOMEM;
	for (size_t i = 0; i < x->npieces; i++) {
		Cuip__Piece *p = cuip_zalloc(sizeof(*p));

		if (!p)
			return -ENOMEM;
		cuip__piece__init(p);
		p->offset = x->pieces[i].off;
		p->size = x->pieces[i].size;
		if (x->pieces[i].opens) {
			p->has_opens = 1;
			p->opens = x->pieces[i].opens;
		}
		m->pieces[m->n_pieces++] = p;
	}
	return 0;
}

/* The carrier saves a slab's live pieces, one entry each (freed ones never). */
static bool slab_parts(const struct cuip_alloc *a, size_t *n)
{
	if (!a->ipc->slab)
		return false;
	*n = a->ipc->npieces;
	return true;
}

static void slab_part(const struct cuip_alloc *a, size_t k, uint64_t *off, uint64_t *size)
{
	assert(k < a->ipc->npieces);
	*off = a->ipc->pieces[k].off;
	*size = a->ipc->pieces[k].size;
}

static long slab_part_at(const struct cuip_alloc *a, uint64_t off)
{
	const struct cuip_piece *p = a->ipc->slab ? piece_at(a, off, true) : NULL;

	return p ? (long)(p - a->ipc->pieces) : -1;
}
CUIP_RECORD_EXT(ipc, .owns = ipc_owns, .died = ipc_free, .forget = ipc_free, .inspect = ipc_inspect,
		.parts = slab_parts, .part = slab_part, .part_at = slab_part_at);

/* A fork child: its records went with the record owner's reset. */
static void ipc_fork_child(void)
{
	slabs = NULL;
}
CUIP_FORK_HOOK(ipc, NULL, NULL, ipc_fork_child);

static void slab_link(struct cuip_alloc *a)
{
	a->ipc->slab_prev = NULL;
	a->ipc->slab_next = slabs;
	if (slabs)
		slabs->ipc->slab_prev = a;
	slabs = a;
}

static void slab_unlink(struct cuip_alloc *a)
{
	if (a->ipc->slab_prev)
		a->ipc->slab_prev->ipc->slab_next = a->ipc->slab_next;
	else if (slabs == a)
		slabs = a->ipc->slab_next;
	if (a->ipc->slab_next)
		a->ipc->slab_next->ipc->slab_prev = a->ipc->slab_prev;
	a->ipc->slab_prev = a->ipc->slab_next = NULL;
}

/* Fill a new record of this process's legacy memory. */
static void malloc_record(struct cuip_alloc *a, const CUmemAllocationProp *prop, size_t size,
			  CUmemGenericAllocationHandle h)
{
	a->prop = *prop;
	a->size = size;
	a->drv = h;
	a->origin = CUIP__ORIGIN__ORIGIN_MALLOC;
	a->owner = CUIP__OWNER__OWNER_NATIVE;
}

/*
 * A small request: a piece of a slab of this device with room (newest
 * first), else of a new slab of one granule g. CUDA_ERROR_NOT_SUPPORTED
 * from cuMemCreate goes back to the caller (native fallback).
 */
static CUresult slab_alloc(CUdeviceptr *dptr, size_t bytesize, CUdevice dev, const CUmemAllocationProp *prop, size_t g)
{
	CUmemGenericAllocationHandle h;
	struct cuip_alloc *a;
	uint64_t off = NO_FIT;
	CUdeviceptr va;
	CUresult r;

	cuip_state_take();
	for (a = slabs; a; a = a->ipc->slab_next) {
		/* A slab without that much room in all is skipped unsearched:
		 * full slabs cost nothing however many there are. */
		if (a->prop.location.id != dev || !a->drv || a->size - a->ipc->slab_used < bytesize)
			continue;
		off = slab_fit(a, bytesize);
		if (off != NO_FIT)
			break;
	}
	if (a) {
		if (!piece_insert(a, off, bytesize)) {
			cuip_state_drop();
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		a->ipc->slab_used += align_up(bytesize, PIECE_ALIGN);
		*dptr = a->ipc->slab_va + off;
		cuip_state_drop();
		pr_debug("cuMemAlloc(%zu): piece at %#llx of slab " ID_FMT, bytesize, (unsigned long long)*dptr,
			 (unsigned long long)a->creator, (unsigned long long)a->serial);
		return CUDA_SUCCESS;
	}
	cuip_state_drop();
	r = real.cuMemCreate(&h, g, prop, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = map_new(h, g, dev, &va);
	if (r != CUDA_SUCCESS)
		goto release;
	cuip_state_take();
	a = cuip_alloc_new(0, 0);
	if (!a) {
		cuip_state_drop();
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	malloc_record(a, prop, g, h);
	if (ipc_make(a)) {
		a->ipc->slab = true;
		a->ipc->slab_va = va;
		a->ipc->slab_used = align_up(bytesize, PIECE_ALIGN);
	}
	if (!a->ipc || !piece_insert(a, 0, bytesize) || map_record(a, va, dev)) {
		cuip_alloc_unlink_if_dead(a);
		cuip_state_drop();
		a->drv = 0; /* released below */
		cuip_alloc_destroy(a);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	slab_link(a);
	cuip_state_drop();
	*dptr = va;
	pr_debug("cuMemAlloc(%zu): piece at %#llx of new slab " ID_FMT " (%zu bytes)", bytesize, (unsigned long long)va,
		 (unsigned long long)a->creator, (unsigned long long)a->serial, g);
	return CUDA_SUCCESS;
unmap:
	map_gone(va, g);
release:
	real.cuMemRelease(h);
	return r;
}

/* ---- cuMemAlloc, cuMemFree, cuMemGetAddressRange ------------------------ */

CUIP_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUmemAllocationProp prop = {0};
	CUmemGenericAllocationHandle h;
	struct cuip_alloc *a;
	CUdeviceptr va;
	CUdevice dev;
	size_t g = 0, size;
	CUresult r = enter(&real.cuMemAlloc_v2);

	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || !bytesize) {
		r = real.cuMemAlloc_v2(dptr, bytesize); /* the driver's own answer */
		goto out;
	}
	r = real.cuCtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		goto out;
	cuip_start();
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	r = real.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || !g)
		goto native;
	if (bytesize < g) {
		r = slab_alloc(dptr, bytesize, dev, &prop, g);
		if (r == CUDA_ERROR_NOT_SUPPORTED)
			goto native;
		goto out;
	}
	size = (bytesize + g - 1) / g * g;
	r = real.cuMemCreate(&h, size, &prop, 0);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		goto native;
	if (r != CUDA_SUCCESS)
		goto out;
	r = map_new(h, size, dev, &va);
	if (r != CUDA_SUCCESS)
		goto release;
	cuip_state_take();
	a = cuip_alloc_new(0, 0);
	if (!a) {
		cuip_state_drop();
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	malloc_record(a, &prop, size, h);
	a->requested = bytesize;
	if (map_record(a, va, dev)) {
		cuip_alloc_unlink_if_dead(a);
		cuip_state_drop();
		a->drv = 0; /* released below */
		cuip_alloc_destroy(a);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	cuip_state_drop();
	*dptr = va;
	pr_debug("cuMemAlloc(%zu): allocation " ID_FMT " at %#llx (%zu bytes backing)", bytesize,
		 (unsigned long long)self.id, (unsigned long long)a->serial, (unsigned long long)va, size);
	goto out;
unmap:
	map_gone(va, size);
release:
	real.cuMemRelease(h);
	goto out;
native:
	/* No POSIX-capable VMM here: the driver's own allocation, which
	 * cannot be IPC-shared through cuinterpose. */
	pr_info("cuMemAlloc(%zu) on device %d: no POSIX-capable VMM, native allocation", bytesize, (int)dev);
	r = real.cuMemAlloc_v2(dptr, bytesize);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	struct cuip_piece *p;
	struct cuip_alloc *a;
	bool dead;
	CUresult r = enter(&real.cuMemFree_v2);

	if (r != CUDA_SUCCESS)
		return r;
	cuip_state_take();
	m = legacy_in(dptr);
	if (!m || m->a->origin != CUIP__ORIGIN__ORIGIN_MALLOC || m->a->creator != self.id) {
		cuip_state_drop();
		r = real.cuMemFree_v2(dptr);
		if (r == CUDA_SUCCESS)
			cuip_pool_freed(dptr); /* pool memory may be freed with cuMemFree */
		goto out;
	}
	cuip_state_drop();
	/* cuMemFree synchronizes (a freed piece is reused at once, an
	 * unmap under running work would fault). */
	real.cuCtxSynchronize();
	cuip_state_take();
	m = legacy_in(dptr);
	p = m && is_slab(m->a) ? piece_at(m->a, dptr - m->va, true) : NULL;
	if (!m || m->a->origin != CUIP__ORIGIN__ORIGIN_MALLOC || m->a->creator != self.id ||
	    (is_slab(m->a) ? !p : m->va != dptr)) {
		/* Not an allocation's base, or freed by another thread meanwhile. */
		cuip_state_drop();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	a = m->a;
	if (is_slab(a)) {
		a->ipc->slab_used -= align_up(p->size, PIECE_ALIGN);
		piece_remove(a, p);
		if (a->ipc->npieces) {
			cuip_state_drop();
			goto out;
		}
		slab_unlink(a); /* empty: released */
		pr_debug("cuMemFree: slab " ID_FMT " is empty, released", (unsigned long long)a->creator,
			 (unsigned long long)a->serial);
	}
	cuip_map_take(m->va);
	map_gone(m->va, m->size);
	cuip_map_free(m);
	dead = cuip_alloc_unlink_if_dead(a);
	cuip_state_drop();
	if (dead)
		cuip_alloc_destroy(a);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	CUresult r = enter(&real.cuMemGetAddressRange_v2);

	if (r != CUDA_SUCCESS)
		return r;
	cuip_state_take();
	m = legacy_in(dptr);
	if (m && is_slab(m->a)) {
		const struct cuip_piece *p = piece_at(m->a, dptr - m->va, false);

		if (!p)
			r = CUDA_ERROR_NOT_FOUND; /* as the driver, between allocations */
		if (p && pbase)
			*pbase = m->va + p->off;
		if (p && psize)
			*psize = p->size;
		cuip_state_drop();
		goto out;
	}
	if (m) {
		if (pbase)
			*pbase = m->va;
		if (psize)
			*psize = m->a->requested;
		cuip_state_drop();
		goto out;
	}
	cuip_state_drop();
	r = real.cuMemGetAddressRange_v2(pbase, psize, dptr);
out:
	cuip_gate_exit();
	return r;
}

/* ---- cuIpc* --------------------------------------------------------------- */

CUIP_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct ipc_handle ih = {.magic = IPC_MAGIC, .version = IPC_VERSION};
	struct cuip_mapping *m;
	struct cuip_alloc *a, snap;
	uint64_t off = 0, req;
	bool slab;
	CUresult r = enter(&real.cuIpcGetMemHandle);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pHandle) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	cuip_state_take();
	m = legacy_in(dptr);
	if (m && m->a->origin == CUIP__ORIGIN__ORIGIN_MALLOC && m->a->creator == self.id) {
		const struct cuip_piece *p = is_slab(m->a) ? piece_at(m->a, dptr - m->va, true) : NULL;

		if (is_slab(m->a) ? !p : m->va != dptr) {
			cuip_state_drop();
			r = CUDA_ERROR_INVALID_VALUE; /* not an allocation's base */
			goto out;
		}
		off = p ? p->off : 0;
		req = p ? p->size : m->a->requested;
	} else {
		bool opened = m != NULL;
		cuip_state_drop();
		if (opened) {
			r = CUDA_ERROR_INVALID_VALUE; /* IPC-opened memory is not re-exported */
			goto out;
		}
		/* Not converted (or not an allocation): the driver's answer. */
		r = real.cuIpcGetMemHandle(pHandle, dptr);
		if (r == CUDA_SUCCESS)
			pr_err("native IPC handle for %#llx (memory not allocated through cuinterpose): "
			       "cuinterpose importers refuse it",
			       (unsigned long long)dptr);
		goto out;
	}
	a = m->a;
	if (!a->has_token) {
		cuip_random(a->token, sizeof(a->token));
		a->has_token = true;
	}
	snap = *a;
	slab = is_slab(a);
	cuip_state_drop();
	if (cuip_xc_export(snap.serial, snap.drv, snap.token, &r))
		goto out;
	cuip_state_take();
	a = cuip_alloc_by_id(snap.creator, snap.serial);
	if (!a) {
		cuip_state_drop();
		r = CUDA_ERROR_INVALID_VALUE; /* freed by another thread meanwhile */
		goto out;
	}
	if (a->owner == CUIP__OWNER__OWNER_NATIVE)
		a->owner = CUIP__OWNER__OWNER_SHARED;
	cuip_state_drop();
	ih.creator_pid = snap.creator_pid;
	ih.creator = snap.creator;
	ih.serial = snap.serial;
	ih.size = snap.size;
	ih.requested = req;
	ih.offset = (uint32_t)off;
	ih.flags = slab ? IPC_F_PIECE : 0;
	memcpy(ih.token, snap.token, sizeof(ih.token));
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy(pHandle->reserved, &ih, sizeof(ih));
out:
	cuip_gate_exit();
	return r;
}

/* The creator's control socket: same directory as ours, named by pid and identity. */
static void creator_socket(const struct ipc_handle *ih, char *buf, size_t len)
{
	const char *slash = strrchr(self.sock, '/');
	int dirlen = slash ? (int)(slash - self.sock) : 0;

	snprintf(buf, len, "%.*s/%d-%016llx.sock", dirlen, self.sock, ih->creator_pid, (unsigned long long)ih->creator);
}

/* Count one more open of the handle's piece in a (lock held): NULL when out
 * of memory. */
static struct cuip_piece *piece_open(struct cuip_alloc *a, const struct ipc_handle *ih)
{
	struct cuip_piece *p = piece_at(a, ih->offset, true);

	cuip_state_assert_held();
	if (!p)
		p = piece_insert(a, ih->offset, ih->requested);
	if (p) {
		p->size = ih->requested; /* the creator may have reused the offset */
		p->opens++;
	}
	return p;
}

/* Open (creator, serial) for the first time here: fetch, import, map. */
static CUresult ipc_open_first(const struct ipc_handle *ih, CUdevice dev, CUdeviceptr *pdptr)
{
	struct cuip_piece *pc;
	CUmemGenericAllocationHandle h = 0;
	struct cuip_alloc *a;
	char sock[108], err[256] = "";
	bool fresh = false;
	CUdeviceptr va;
	CUresult r;
	int fd;

	cuip_state_take();
	a = cuip_alloc_by_id(ih->creator, ih->serial);
	if (a && a->drv)
		h = a->drv; /* imported through a ticket too: one driver handle per process */
	cuip_state_drop();
	if (!h) {
		creator_socket(ih, sock, sizeof(sock));
		fd = cuip_fetch(sock, ih->creator, ih->serial, ih->token, sizeof(ih->token), err, sizeof(err));
		if (fd < 0) {
			pr_err("cuIpcOpenMemHandle of allocation " ID_FMT " from pid %d: %s",
			       (unsigned long long)ih->creator, (unsigned long long)ih->serial, ih->creator_pid, err);
			return fd == -EMFILE || fd == -ENFILE ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_ERROR_INVALID_VALUE;
		}
		r = real.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(fd);
		if (r != CUDA_SUCCESS)
			return r;
		fresh = true;
	}
	r = map_new(h, ih->size, dev, &va);
	if (r != CUDA_SUCCESS)
		goto release;
	cuip_state_take();
	a = cuip_alloc_by_id(ih->creator, ih->serial);
	if (!a) {
		a = cuip_alloc_new(ih->creator, ih->serial);
		if (!a) {
			cuip_state_drop();
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto unmap;
		}
		a->drv = h;
		a->origin = CUIP__ORIGIN__ORIGIN_IPC_OPEN;
		if (real.cuMemGetAllocationPropertiesFromHandle(&a->prop, h) != CUDA_SUCCESS) {
			a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
			a->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
			a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			a->prop.location.id = dev;
		}
		a->prop.win32HandleMetaData = NULL;
		a->size = ih->size;
		memcpy(a->token, ih->token, sizeof(a->token));
		a->has_token = true;
		a->creator_pid = ih->creator_pid;
		creator_socket(ih, a->creator_sock, sizeof(a->creator_sock));
	}
	a->owner = CUIP__OWNER__OWNER_SHARED;
	if (ipc_make(a)) {
		a->ipc->slab = ih->flags & IPC_F_PIECE;
		a->requested = a->ipc->slab ? 0 : ih->requested;
	}
	pc = a->ipc && a->ipc->slab ? piece_open(a, ih) : NULL;
	if (!a->ipc || (a->ipc->slab && !pc) || map_record(a, va, dev)) {
		bool dead;

		/* The open did not happen: a record that lives on (imported
		 * through a ticket too) keeps no count of it. */
		if (pc && --pc->opens == 0)
			piece_remove(a, pc);
		dead = cuip_alloc_unlink_if_dead(a);
		cuip_state_drop();
		if (dead) {
			a->drv = 0; /* released below */
			cuip_alloc_destroy(a);
		}
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto unmap;
	}
	a->ipc->va = va;
	a->ipc->opens = 1;
	cuip_state_drop();
	*pdptr = va + ih->offset;
	return CUDA_SUCCESS;
unmap:
	map_gone(va, ih->size);
release:
	if (fresh)
		real.cuMemRelease(h);
	return r;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	struct ipc_handle ih;
	struct cuip_alloc *a;
	CUdevice dev;
	CUresult r;

	(void)flags; /* lazy peer enablement: access comes from the peer mirror */
	if (!pdptr)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&ih, handle.reserved, sizeof(ih));
	if (ih.magic != IPC_MAGIC) {
		pr_err("cuIpcOpenMemHandle: refusing a native IPC handle (not made by cuinterpose; run the "
		       "exporting process under cuinterpose too): its memory could not be checkpointed");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (ih.version != IPC_VERSION || !ih.size || ih.requested > ih.size || (ih.flags & ~IPC_F_PIECE) ||
	    (ih.flags & IPC_F_PIECE ? !ih.requested || ih.offset > ih.size - ih.requested : ih.offset != 0)) {
		pr_err("cuIpcOpenMemHandle: malformed cuinterpose IPC handle (version %u, flags %#x, size %llu, "
		       "piece of %llu bytes at offset %u)",
		       ih.version, ih.flags, (unsigned long long)ih.size, (unsigned long long)ih.requested, ih.offset);
		return CUDA_ERROR_INVALID_VALUE;
	}
	r = real.cuCtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	cuip_start();
	if (ih.creator == self.id)
		return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: no IPC open in the exporting process */
	pthread_mutex_lock(&ipc_mu);
	cuip_state_take();
	a = cuip_alloc_by_id(ih.creator, ih.serial);
	if (a && ipc_opens(a)) {
		r = CUDA_SUCCESS;
		if (a->ipc->slab != !!(ih.flags & IPC_F_PIECE))
			r = CUDA_ERROR_INVALID_VALUE; /* a piece of a whole allocation, or the reverse */
		else if (a->ipc->slab && !piece_open(a, &ih))
			r = CUDA_ERROR_OUT_OF_MEMORY;
		if (r == CUDA_SUCCESS) {
			a->ipc->opens++;
			*pdptr = a->ipc->va + ih.offset;
		}
		cuip_state_drop();
		pthread_mutex_unlock(&ipc_mu);
		return r;
	}
	cuip_state_drop();
	r = ipc_open_first(&ih, dev, pdptr);
	pthread_mutex_unlock(&ipc_mu);
	return r;
}

CUIP_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	CUresult r = enter(&real.cuCtxGetDevice);

	if (r != CUDA_SUCCESS)
		return r;
	r = ipc_open(pdptr, handle, Flags);
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUIP_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct cuip_mapping *m;
	struct cuip_alloc *a;
	bool dead = false;
	CUresult r = enter(&real.cuCtxGetDevice);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&ipc_mu);
	cuip_state_take();
	m = legacy_in(dptr);
	if (!m || !ipc_opens(m->a) || m->a->ipc->va != m->va) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto unlock;
	}
	a = m->a;
	if (a->ipc->slab) {
		struct cuip_piece *p = piece_at(a, dptr - m->va, true);

		if (!p || !p->opens) {
			r = CUDA_ERROR_INVALID_VALUE; /* not what an open returned */
			goto unlock;
		}
		if (--p->opens == 0)
			piece_remove(a, p);
	} else if (m->va != dptr) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto unlock;
	}
	if (--a->ipc->opens)
		goto unlock;
	cuip_state_drop();
	real.cuCtxSynchronize(); /* as the driver: work using it completes first */
	cuip_state_take();
	cuip_map_take(m->va);
	map_gone(m->va, m->size);
	cuip_map_free(m);
	a->ipc->va = 0;
	dead = cuip_alloc_unlink_if_dead(a);
unlock:
	cuip_state_drop();
	pthread_mutex_unlock(&ipc_mu);
	if (dead)
		cuip_alloc_destroy(a);
	cuip_gate_exit();
	return r;
}
