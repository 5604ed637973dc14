/*
 * qtable.c - the logical-handle table: logical handle -> record and driver
 * handle, read without any lock by tracked queries
 * (cuMemGetAllocationPropertiesFromHandle in vmm.c, cuip_qt_drv), so that a
 * query costs the driver call plus a few loads and shares no written cache
 * line with other threads.
 *
 * Callers: record.c, which keeps the records and assigns the handles,
 * vmm.c (the query, through cuip_qt_drv: inline in qtable.h, which holds
 * the table's layout for it), and gate.c (cuip_gate_open republishes). Locking:
 * writers (every function but the readers in qtable.h: cuip_qt_find,
 * cuip_qt_drv, cuip_qt_props) hold cuip_state_lock; readers
 * hold nothing and are inside the API gate.
 *
 * A direct-mapped table: the live handle h sits in slot h & mask. vmm.c
 * skips counter values whose slot is taken (cuip_qt_taken), so live handles
 * never collide, and a table twice as large keeps them apart too (h & mask'
 * differs where h & mask did). cuip_qt_reserve keeps the capacity at least
 * twice the number of records, and a record has at most one logical
 * handle, so assigning never fails and seldom skips.
 *
 * Writers: insert stores a, then drv (release), then key (release);
 * removal stores key = 0 (release) in every table of the chain; a later
 * insert into that slot stores drv (release) before its key. Reader: key
 * (acquire) == h, drv (acquire), key again == h. If the drv it read was
 * stored for a later handle, that store came after the key was cleared and
 * the acquire makes the clear visible: the second key read sees 0 or the
 * later handle (logical values are not reused until the 48-bit counter
 * wraps), never h, and the reader refuses. So a released handle is refused
 * once its release returned, and a reader reads only the slot's two
 * atomics, never the record (which a concurrent release frees).
 *
 * Growing publishes a new table (release) that holds the live entries; the
 * old one stays on the `older` chain, never freed while the process runs
 * (a lock-free reader may still hold it; their sizes halve, so the chain
 * takes less than the current table). Removal clears a key in every table,
 * so an old table holds no released handle; a reader that misses in a
 * table it loaded before a growth retries in the current one.
 *
 * Driver handles change only while the gate is closed (PREPARE, LOAD,
 * REBUILD in vmm.c, carry.c and multicast.c set a->drv directly): cuip_gate_open
 * calls cuip_qt_republish, which copies a->drv into the current table's
 * slots (through the address insert was given, so this table needs nothing
 * of the record's layout) before any application thread can read them.
 */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuip.h"
#include "driver.h"
#include "qtable.h"

#define LTAB_MIN 4096
_Static_assert(sizeof(CUmemAllocationProp) % 8 == 0 && _Alignof(CUmemAllocationProp) <= 8,
	       "CUmemAllocationProp is copied as 64-bit words");
/* The current table (qtable.h), in a cache line of its own: every query
 * loads it, only a growth writes it. */
struct cuip_qt_cur cuip_qt_cur;

static struct cuip_qt_tab *ltab_now(void)
{
	return atomic_load_explicit(&cuip_qt_cur.p, memory_order_acquire);
}

/* A table twice as large (at least LTAB_MIN) holding the live entries. */
static int ltab_grow(void)
{
	struct cuip_qt_tab *t = ltab_now(), *n;
	uint64_t size = t ? 2 * (t->mask + 1) : LTAB_MIN;

	n = calloc(1, sizeof(*n) + size * sizeof(n->s[0]));
	if (!n)
		return -ENOMEM;
	n->mask = size - 1;
	n->older = t;
	for (uint64_t i = 0; t && i <= t->mask; i++) {
		uint64_t k = atomic_load_explicit(&t->s[i].key, memory_order_relaxed);
		struct cuip_qt_slot *d = &n->s[k & n->mask];

		if (!k)
			continue;
		assert(!atomic_load_explicit(&d->key, memory_order_relaxed));
		d->a = t->s[i].a;
		d->src = t->s[i].src;
		atomic_store_explicit(&d->drv, atomic_load_explicit(&t->s[i].drv, memory_order_relaxed),
				      memory_order_relaxed);
		for (size_t w = 0; w < CUIP_QT_PROPW; w++)
			atomic_store_explicit(&d->prop[w], atomic_load_explicit(&t->s[i].prop[w], memory_order_relaxed),
					      memory_order_relaxed);
		atomic_store_explicit(&d->key, k, memory_order_relaxed);
	}
	atomic_store_explicit(&cuip_qt_cur.p, n, memory_order_release); /* the entries before the pointer */
	return 0;
}

int cuip_qt_reserve(size_t nrecords)
{
	struct cuip_qt_tab *t = ltab_now();

	if (!t || 2 * nrecords > t->mask + 1)
		return ltab_grow();
	return 0;
}

bool cuip_qt_taken(uint64_t h)
{
	struct cuip_qt_tab *t = ltab_now();

	return t && atomic_load_explicit(&t->s[h & t->mask].key, memory_order_relaxed);
}

/* Store drv and the driver's properties for it into s (release: before
 * the caller publishes the key). */
static void slot_fill(struct cuip_qt_slot *s, uint64_t drv)
{
	CUmemAllocationProp p;
	uint64_t w[CUIP_QT_PROPW] = {0};

	if (drv && real.cuMemGetAllocationPropertiesFromHandle &&
	    real.cuMemGetAllocationPropertiesFromHandle(&p, drv) == CUDA_SUCCESS && p.type)
		memcpy(w, &p, sizeof(p));
	for (size_t i = 0; i < CUIP_QT_PROPW; i++)
		atomic_store_explicit(&s->prop[i], w[i], memory_order_release);
	atomic_store_explicit(&s->drv, drv, memory_order_release);
}

void cuip_qt_insert(uint64_t h, struct cuip_alloc *a, const CUmemGenericAllocationHandle *drv)
{
	struct cuip_qt_tab *t = ltab_now();
	struct cuip_qt_slot *s;

	assert(t && h && !cuip_qt_taken(h)); /* cuip_qt_reserve made room */
	s = &t->s[h & t->mask];
	s->a = a;
	s->src = drv;
	slot_fill(s, *drv);
	atomic_store_explicit(&s->key, h, memory_order_release);
}

void cuip_qt_remove(uint64_t h)
{
	for (struct cuip_qt_tab *t = ltab_now(); t; t = t->older) {
		struct cuip_qt_slot *s = &t->s[h & t->mask];

		if (atomic_load_explicit(&s->key, memory_order_relaxed) == h)
			atomic_store_explicit(&s->key, 0, memory_order_release);
	}
}

struct cuip_alloc *cuip_qt_record(uint64_t h)
{
	struct cuip_qt_tab *t = ltab_now();
	struct cuip_qt_slot *s;

	if (!t || !h)
		return NULL;
	s = &t->s[h & t->mask];
	if (atomic_load_explicit(&s->key, memory_order_relaxed) != h)
		return NULL;
	assert(s->a);
	return s->a;
}

/* The current table only: the gate was closed and drained, so no reader
 * still holds an older one, and every reader from now on loads the current
 * table first. */
void cuip_qt_republish(void)
{
	struct cuip_qt_tab *t = ltab_now();

	for (uint64_t i = 0; t && i <= t->mask; i++)
		if (atomic_load_explicit(&t->s[i].key, memory_order_relaxed))
			slot_fill(&t->s[i], *t->s[i].src);
}

void cuip_qt_reset(void)
{
	for (struct cuip_qt_tab *t = ltab_now(), *o; t; t = o) {
		o = t->older;
		free(t);
	}
	atomic_store(&cuip_qt_cur.p, NULL);
}
