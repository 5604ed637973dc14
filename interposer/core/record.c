/*
 * record.c - the one owner of allocation records and of cuip_state_lock:
 * records (by identity and by logical handle), mappings (sorted by
 * address) and their access, the constructor and the destructor of a
 * record, and the fork reset of all of it.
 *
 * A record lives while the application holds a logical handle, a tracked
 * mapping names it or a multicast binding holds it (cuip_alloc_dead); its
 * destructor (cuip_alloc_destroy, after unlocking) drops its cached export,
 * releases its one driver handle and lets its kind's extension
 * (CUIP_RECORD_EXT: multicast.c, ipc.c) free what it added.
 *
 * Callers: the resource modules (vmm.c, ipc.c, peer.c, multicast.c), the
 * checkpoint slices (inspect.c, carry.c, ops.c). Locking: cuip_state_lock
 * protects everything here; every function but the destructor runs with it
 * held. Application threads take it only inside the gate. Logical handles
 * live in qtable.c, which tracked queries read without the lock.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "qtable.h"
#include "record.h"
#include "runtime.h"
#include "xcache.h"

pthread_mutex_t cuip_state_lock = PTHREAD_MUTEX_INITIALIZER;
__thread bool cuip_state_held;
struct cuip_vmm vmm;

#define NBUCKET 65536 /* tens of thousands of records in large jobs: short chains */
static struct cuip_alloc *by_id[NBUCKET];

static unsigned hash64(uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return (unsigned)(v & (NBUCKET - 1));
}

/* ---- kind extensions ------------------------------------------------------ */

extern const struct cuip_record_ext __start_cuip_record_exts[] __attribute__((weak, visibility("hidden")));
extern const struct cuip_record_ext __stop_cuip_record_exts[] __attribute__((weak, visibility("hidden")));

/* The extension that owns a's kind-specific part, or NULL (plain unicast). */
static const struct cuip_record_ext *record_ext(const struct cuip_alloc *a)
{
	for (const struct cuip_record_ext *x = __start_cuip_record_exts; x < __stop_cuip_record_exts; x++)
		if (x->owns(a))
			return x;
	return NULL;
}

static void record_ext_died(struct cuip_alloc *a)
{
	const struct cuip_record_ext *x = record_ext(a);

	if (x && x->died)
		x->died(a);
}

bool cuip_alloc_props(const struct cuip_alloc *a, Cuip__AllocKind *kind, Cuip__McProps *mc)
{
	const struct cuip_record_ext *x = record_ext(a);

	cuip_state_assert_held();
	*kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	return x && x->props && x->props(a, kind, mc);
}

int cuip_alloc_inspect(const struct cuip_alloc *a, Cuip__Allocation *m)
{
	const struct cuip_record_ext *x = record_ext(a);

	cuip_state_assert_held();
	return x && x->inspect ? x->inspect(a, m) : 0;
}

bool cuip_alloc_split(const struct cuip_alloc *a, size_t *n)
{
	const struct cuip_record_ext *x = record_ext(a);

	cuip_state_assert_held();
	*n = 1;
	return x && x->parts && x->parts(a, n);
}

void cuip_alloc_part(const struct cuip_alloc *a, size_t k, uint64_t *off, uint64_t *size)
{
	const struct cuip_record_ext *x = record_ext(a);

	cuip_state_assert_held();
	assert(x && x->part);
	x->part(a, k, off, size);
}

long cuip_alloc_part_at(const struct cuip_alloc *a, uint64_t off)
{
	const struct cuip_record_ext *x = record_ext(a);

	cuip_state_assert_held();
	return x && x->part_at ? x->part_at(a, off) : -1;
}

/* ---- records ------------------------------------------------------------- */

struct cuip_alloc *cuip_alloc_by_id(uint64_t creator, uint64_t serial)
{
	cuip_state_assert_held();
	for (struct cuip_alloc *a = by_id[hash64(creator ^ serial)]; a; a = a->id_next)
		if (a->creator == creator && a->serial == serial)
			return a;
	return NULL;
}

struct cuip_alloc *cuip_by_logical(uint64_t h)
{
	return cuip_is_logical(h) ? cuip_qt_record(h) : NULL;
}

struct cuip_alloc *cuip_alloc_new(uint64_t creator, uint64_t serial)
{
	struct cuip_alloc *a;
	unsigned b;

	cuip_state_assert_held();
	if (cuip_qt_reserve(vmm.nallocs + 1)) /* a logical handle never fails */
		return NULL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	if (!creator) { /* created here */
		creator = self.id;
		serial = ++vmm.next_serial;
		a->creator_pid = self.pid;
		memcpy(a->creator_sock, self.sock, sizeof(a->creator_sock));
	}
	b = hash64(creator ^ serial);
	a->creator = creator;
	a->serial = serial;
	a->id_next = by_id[b];
	by_id[b] = a;
	a->prev = vmm.tail;
	if (vmm.tail)
		vmm.tail->next = a;
	else
		vmm.head = a;
	vmm.tail = a;
	vmm.nallocs++;
	return a;
}

void cuip_logical_assign(struct cuip_alloc *a)
{
	const uint64_t mask = (1ull << CUIP_HTAG_SHIFT) - 1;
	uint64_t h;

	cuip_state_assert_held();
	if (a->logical)
		return;
	do /* skips values whose slot is taken, live ones after a wrap too */
		h = (CUIP_HTAG << CUIP_HTAG_SHIFT) | (++vmm.next_logical & mask);
	while (cuip_qt_taken(h) || !(h & mask));
	cuip_qt_insert(h, a, &a->drv);
	a->logical = h;
}

void cuip_logical_drop(struct cuip_alloc *a)
{
	cuip_state_assert_held();
	if (!a->logical)
		return;
	cuip_qt_remove(a->logical);
	a->logical = 0;
}

/* Unlink a record from every table; the caller frees it after unlocking. */
void cuip_alloc_unlink(struct cuip_alloc *a)
{
	struct cuip_alloc **pp;

	cuip_state_assert_held();
	cuip_logical_drop(a);
	for (pp = &by_id[hash64(a->creator ^ a->serial)]; *pp; pp = &(*pp)->id_next) {
		if (*pp == a) {
			*pp = a->id_next;
			break;
		}
	}
	if (a->prev)
		a->prev->next = a->next;
	else
		vmm.head = a->next;
	if (a->next)
		a->next->prev = a->prev;
	else
		vmm.tail = a->prev;
	vmm.nallocs--;
	if (a->owner == CUIP__OWNER__OWNER_UNSUPPORTED)
		vmm.unsupported--;
}

bool cuip_carried(const struct cuip_alloc *a)
{
	cuip_state_assert_held();
	if (a->mc)
		return false;
	if (a->owner == CUIP__OWNER__OWNER_SHARED)
		return true;
	return a->owner == CUIP__OWNER__OWNER_NATIVE && !cuip_private_native && a->creator == self.id &&
	       (a->origin == CUIP__ORIGIN__ORIGIN_VMM_CREATE || a->origin == CUIP__ORIGIN__ORIGIN_MALLOC);
}

bool cuip_alloc_dead(const struct cuip_alloc *a)
{
	cuip_state_assert_held();
	return a->app_handles == 0 && a->nmaps == 0 && a->mc_binds == 0;
}

/* After unlocking: release what a dead record held. */
void cuip_alloc_destroy(struct cuip_alloc *a)
{
	if (a->creator == self.id && a->has_token)
		cuip_xc_drop(a->serial);
	if (a->drv) {
		CUresult r = real.cuMemRelease(a->drv);
		if (r != CUDA_SUCCESS)
			pr_err("releasing the driver handle of allocation %016llx:%llu: %s",
			       (unsigned long long)a->creator, (unsigned long long)a->serial, cuip_cuerr(r));
	}
	record_ext_died(a);
	free(a);
}

/* ---- mappings ------------------------------------------------------------ */

/* First mapping whose end is above va. */
size_t cuip_map_lower(uint64_t va)
{
	size_t lo = 0, hi = vmm.nmaps;

	cuip_state_assert_held();
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		struct cuip_mapping *m = vmm.maps[mid];
		if (m->va + m->size <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct cuip_mapping *cuip_mapping_at(uint64_t va)
{
	size_t i = cuip_map_lower(va);

	if (i < vmm.nmaps && vmm.maps[i]->va <= va)
		return vmm.maps[i];
	return NULL;
}

bool cuip_map_overlaps(uint64_t va, uint64_t size)
{
	size_t i = cuip_map_lower(va);

	return i < vmm.nmaps && vmm.maps[i]->va < va + size;
}

int cuip_map_insert(struct cuip_mapping *m)
{
	size_t i;

	cuip_state_assert_held();
	if (vmm.nmaps == vmm.capmaps) {
		size_t cap = vmm.capmaps ? vmm.capmaps * 2 : 64;
		struct cuip_mapping **n = realloc(vmm.maps, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		vmm.maps = n;
		vmm.capmaps = cap;
	}
	i = cuip_map_lower(m->va);
	memmove(&vmm.maps[i + 1], &vmm.maps[i], (vmm.nmaps - i) * sizeof(*vmm.maps));
	vmm.maps[i] = m;
	vmm.nmaps++;
	return 0;
}

void cuip_map_remove_at(size_t i)
{
	cuip_state_assert_held();
	memmove(&vmm.maps[i], &vmm.maps[i + 1], (vmm.nmaps - i - 1) * sizeof(*vmm.maps));
	vmm.nmaps--;
}

void cuip_map_free(struct cuip_mapping *m)
{
	if (m) {
		free(m->acc);
		free(m);
	}
}

static int loc_cmp(const CUmemLocation *a, const CUmemLocation *b)
{
	if (a->type != b->type)
		return a->type < b->type ? -1 : 1;
	if (a->id != b->id)
		return a->id < b->id ? -1 : 1;
	return 0;
}

static int acc_cmp(const void *x, const void *y)
{
	const struct cuip_access *a = x, *b = y;
	int c = loc_cmp(&a->loc, &b->loc);

	if (c)
		return c;
	return a->va < b->va ? -1 : a->va > b->va;
}

static int acc_push(struct cuip_access **v, size_t *n, size_t *cap, const struct cuip_access *e)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 4;
		struct cuip_access *p = realloc(*v, c * sizeof(*p));
		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[(*n)++] = *e;
	return 0;
}

/*
 * Record that [va, va+size) of m now has `flags` for `loc`: intervals of the
 * same location are cut around the range, the new one is added (PROT_NONE
 * is the absence of an interval), and neighbours with equal flags merge.
 */
int cuip_access_set(struct cuip_mapping *m, uint64_t va, uint64_t size, const CUmemLocation *loc, unsigned flags)
{
	struct cuip_access *nv = NULL, e;
	size_t nn = 0, nc = 0, out = 0;
	uint64_t end = va + size;

	cuip_state_assert_held();
	for (size_t i = 0; i < m->nacc; i++) {
		struct cuip_access *o = &m->acc[i];
		uint64_t oend = o->va + o->size;
		if (loc_cmp(&o->loc, loc) || oend <= va || o->va >= end) {
			if (acc_push(&nv, &nn, &nc, o))
				goto nomem;
			continue;
		}
		if (o->va < va) {
			e = *o;
			e.size = va - o->va;
			if (acc_push(&nv, &nn, &nc, &e))
				goto nomem;
		}
		if (oend > end) {
			e = *o;
			e.va = end;
			e.size = oend - end;
			if (acc_push(&nv, &nn, &nc, &e))
				goto nomem;
		}
	}
	if (flags) {
		e = (struct cuip_access){.va = va, .size = size, .loc = *loc, .flags = flags};
		if (acc_push(&nv, &nn, &nc, &e))
			goto nomem;
	}
	if (nn)
		qsort(nv, nn, sizeof(*nv), acc_cmp);
	for (size_t i = 0; i < nn; i++) {
		if (out && !loc_cmp(&nv[out - 1].loc, &nv[i].loc) && nv[out - 1].flags == nv[i].flags &&
		    nv[out - 1].va + nv[out - 1].size == nv[i].va) {
			nv[out - 1].size += nv[i].size;
			continue;
		}
		nv[out++] = nv[i];
	}
	free(m->acc);
	m->acc = nv;
	m->nacc = out;
	m->capacc = nc;
	return 0;
nomem:
	free(nv);
	return -ENOMEM;
}

/* to's access becomes a copy of m's (to any other mapping struct, to stage
 * changes with cuip_access_set before the driver makes them). */
int cuip_access_copy(struct cuip_mapping *to, const struct cuip_mapping *m)
{
	struct cuip_access *v = malloc((m->nacc ? m->nacc : 1) * sizeof(*v));

	cuip_state_assert_held();
	if (!v)
		return -ENOMEM;
	if (m->nacc)
		memcpy(v, m->acc, m->nacc * sizeof(*v));
	to->acc = v;
	to->nacc = to->capacc = m->nacc;
	return 0;
}

/* m takes the staged access; staged gets m's old one, for the caller to free. */
void cuip_access_swap(struct cuip_mapping *m, struct cuip_mapping *staged)
{
	struct cuip_access *acc = m->acc;
	size_t nacc = m->nacc, capacc = m->capacc;

	cuip_state_assert_held();
	m->acc = staged->acc;
	m->nacc = staged->nacc;
	m->capacc = staged->capacc;
	staged->acc = acc;
	staged->nacc = nacc;
	staged->capacc = capacc;
}

/* A new mapping covering [lo, hi) of m, with m's access clipped to it. */
struct cuip_mapping *cuip_map_part(const struct cuip_mapping *m, uint64_t lo, uint64_t hi)
{
	struct cuip_mapping *p = calloc(1, sizeof(*p));

	cuip_state_assert_held();
	if (!p)
		return NULL;
	p->va = lo;
	p->size = hi - lo;
	p->offset = m->offset + (lo - m->va);
	p->a = m->a;
	p->map_flags = m->map_flags;
	for (size_t i = 0; i < m->nacc; i++) {
		struct cuip_access e = m->acc[i];
		uint64_t s = e.va > lo ? e.va : lo, t = e.va + e.size < hi ? e.va + e.size : hi;
		if (s >= t)
			continue;
		e.va = s;
		e.size = t - s;
		if (acc_push(&p->acc, &p->nacc, &p->capacc, &e)) {
			cuip_map_free(p);
			return NULL;
		}
	}
	return p;
}

/* ---- rebuild ------------------------------------------------------------- */

/* Where a REBUILD reaches a's creator: the socket the coordinator names for
 * it (a path usable from here), else the one its ticket recorded. */
const char *cuip_creator_socket(const Cuip__Rebuild *rb, const struct cuip_alloc *a)
{
	cuip_state_assert_held();
	for (size_t i = 0; i < rb->n_peers; i++)
		if (rb->peers[i]->proc && rb->peers[i]->proc->id == a->creator && rb->peers[i]->socket)
			return rb->peers[i]->socket;
	return a->creator_sock[0] ? a->creator_sock : NULL;
}

/* ---- records that die through a member's last reference ------------------ */

bool cuip_alloc_unbound(struct cuip_alloc *a)
{
	cuip_state_assert_held();
	assert(a->mc_binds > 0);
	a->mc_binds--;
	return cuip_alloc_unlink_if_dead(a);
}

bool cuip_alloc_unlink_if_dead(struct cuip_alloc *a)
{
	cuip_state_assert_held();
	if (!cuip_alloc_dead(a))
		return false;
	cuip_alloc_unlink(a);
	return true;
}

struct cuip_mapping *cuip_map_take(uint64_t va)
{
	size_t i = cuip_map_lower(va);
	struct cuip_mapping *m;

	cuip_state_assert_held();
	if (i >= vmm.nmaps || vmm.maps[i]->va != va)
		return NULL;
	m = vmm.maps[i];
	cuip_map_remove_at(i);
	m->a->nmaps--;
	return m;
}

/* ---- fork ---------------------------------------------------------------- */

static void fork_prepare(void)
{
	cuip_state_take();
}

static void fork_parent(void)
{
	cuip_state_drop();
}

/* The child forgets every record (the driver state is not its own). */
static void fork_child(void)
{
	struct cuip_alloc *a = vmm.head, *n;

	cuip_state_drop();
	for (size_t i = 0; i < vmm.nmaps; i++)
		cuip_map_free(vmm.maps[i]);
	free(vmm.maps);
	for (; a; a = n) {
		const struct cuip_record_ext *x = record_ext(a);

		n = a->next;
		if (x && x->forget)
			x->forget(a);
		free(a);
	}
	memset(by_id, 0, sizeof(by_id));
	cuip_qt_reset();
	memset(&vmm, 0, sizeof(vmm));
	pthread_mutex_init(&cuip_state_lock, NULL);
}
CUIP_FORK_HOOK(record, fork_prepare, fork_parent, fork_child);

/* ---- detach and attach ------------------------------------------------------- */

int cuip_maps_attach(cuip_want_fn want, const void *arg, const char *what, char *err, size_t errlen)
{
	cuip_state_assert_held();
	for (size_t i = 0; i < vmm.nmaps; i++) {
		struct cuip_mapping *m = vmm.maps[i];
		struct cuip_alloc *a = m->a;
		CUresult r;

		if (!m->detached || !want(a, arg))
			continue;
		r = real.cuMemMap(m->va, m->size, m->offset, a->drv, m->map_flags);
		if (r != CUDA_SUCCESS) {
			snprintf(err, errlen, "%s " ID_FMT ": mapping at the original address %#llx failed: %s", what,
				 ID(a), (unsigned long long)m->va, cuip_cuerr(r));
			return -EIO;
		}
		for (size_t k = 0; k < m->nacc; k++) {
			CUmemAccessDesc d = {m->acc[k].loc, (CUmemAccess_flags)m->acc[k].flags};

			r = real.cuMemSetAccess(m->acc[k].va, m->acc[k].size, &d, 1);
			if (r != CUDA_SUCCESS) {
				/* Unmapped again: still detached, a later attach
				 * maps it and sets all of its access. */
				real.cuMemUnmap(m->va, m->size);
				snprintf(err, errlen, "%s " ID_FMT ": access of %#llx for location %d: %s", what, ID(a),
					 (unsigned long long)m->acc[k].va, m->acc[k].loc.id, cuip_cuerr(r));
				return -EIO;
			}
		}
		m->detached = false;
	}
	return 0;
}

int cuip_maps_detach(cuip_want_fn want, const void *arg, const char *what, char *err, size_t errlen)
{
	cuip_state_assert_held();
	for (size_t i = 0; i < vmm.nmaps; i++) {
		struct cuip_mapping *m = vmm.maps[i];
		char why[256];
		CUresult r;
		int undo;

		if (m->detached || !want(m->a, arg))
			continue;
		r = real.cuMemUnmap(m->va, m->size);
		if (r == CUDA_SUCCESS) {
			m->detached = true;
			continue;
		}
		undo = cuip_maps_attach(want, arg, what, why, sizeof(why));
		snprintf(err, errlen, "%s " ID_FMT ": unmapping %#llx failed: %s%s%s", what, ID(m->a),
			 (unsigned long long)m->va, cuip_cuerr(r),
			 undo ? "; mapping the others back failed too: " : "; the others were mapped back",
			 undo ? why : "");
		return undo ? -ENOTRECOVERABLE : -EIO;
	}
	return 0;
}
