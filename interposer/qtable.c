/*
 * qtable.c - the logical-handle table: logical handle -> record and driver
 * handle, read without any lock by tracked queries
 * (cuMemGetAllocationPropertiesFromHandle in vmm.c, cuip_qt_drv), so that a
 * query costs the driver call plus a few loads and shares no written cache
 * line with other threads.
 *
 * Callers: record.c, which keeps the records and assigns the handles,
 * vmm.c (the query), and gate.c (cuip_gate_open republishes). Locking:
 * writers (every function but cuip_qt_drv) hold cuip_state_lock; readers
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
 * calls cuip_qt_republish, which copies a->drv into the slots (through the
 * address insert was given, so this table needs nothing of the record's
 * layout) before any application thread can read them.
 */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cuip.h"
#include "qtable.h"

struct lslot {
	_Atomic uint64_t key;			 /* the logical handle; 0: free */
	_Atomic uint64_t drv;			 /* its record's driver handle */
	struct cuip_alloc *a;			 /* its record (state lock) */
	const CUmemGenericAllocationHandle *src; /* where the record keeps drv (&a->drv): republish reads it */
};
struct ltab {
	uint64_t mask;
	struct ltab *older; /* superseded tables, see above */
	struct lslot s[];
};
#define LTAB_MIN 4096
static _Atomic(struct ltab *) ltab;

static struct ltab *ltab_now(void)
{
	return atomic_load_explicit(&ltab, memory_order_acquire);
}

/* A table twice as large (at least LTAB_MIN) holding the live entries. */
static int ltab_grow(void)
{
	struct ltab *t = ltab_now(), *n;
	uint64_t size = t ? 2 * (t->mask + 1) : LTAB_MIN;

	n = calloc(1, sizeof(*n) + size * sizeof(n->s[0]));
	if (!n)
		return -ENOMEM;
	n->mask = size - 1;
	n->older = t;
	for (uint64_t i = 0; t && i <= t->mask; i++) {
		uint64_t k = atomic_load_explicit(&t->s[i].key, memory_order_relaxed);
		struct lslot *d = &n->s[k & n->mask];

		if (!k)
			continue;
		assert(!atomic_load_explicit(&d->key, memory_order_relaxed));
		d->a = t->s[i].a;
		d->src = t->s[i].src;
		atomic_store_explicit(&d->drv, atomic_load_explicit(&t->s[i].drv, memory_order_relaxed),
				      memory_order_relaxed);
		atomic_store_explicit(&d->key, k, memory_order_relaxed);
	}
	atomic_store_explicit(&ltab, n, memory_order_release); /* the entries before the pointer */
	return 0;
}

int cuip_qt_reserve(size_t nrecords)
{
	struct ltab *t = ltab_now();

	if (!t || 2 * nrecords > t->mask + 1)
		return ltab_grow();
	return 0;
}

bool cuip_qt_taken(uint64_t h)
{
	struct ltab *t = ltab_now();

	return t && atomic_load_explicit(&t->s[h & t->mask].key, memory_order_relaxed);
}

void cuip_qt_insert(uint64_t h, struct cuip_alloc *a, const CUmemGenericAllocationHandle *drv)
{
	struct ltab *t = ltab_now();
	struct lslot *s;

	assert(t && h && !cuip_qt_taken(h)); /* cuip_qt_reserve made room */
	s = &t->s[h & t->mask];
	s->a = a;
	s->src = drv;
	atomic_store_explicit(&s->drv, *drv, memory_order_release);
	atomic_store_explicit(&s->key, h, memory_order_release);
}

void cuip_qt_remove(uint64_t h)
{
	for (struct ltab *t = ltab_now(); t; t = t->older) {
		struct lslot *s = &t->s[h & t->mask];

		if (atomic_load_explicit(&s->key, memory_order_relaxed) == h)
			atomic_store_explicit(&s->key, 0, memory_order_release);
	}
}

struct cuip_alloc *cuip_qt_record(uint64_t h)
{
	struct ltab *t = ltab_now();
	struct lslot *s;

	if (!t || !h)
		return NULL;
	s = &t->s[h & t->mask];
	if (atomic_load_explicit(&s->key, memory_order_relaxed) != h)
		return NULL;
	assert(s->a);
	return s->a;
}

uint64_t cuip_qt_drv(uint64_t h)
{
	struct ltab *t = ltab_now(), *t2;

	while (t && h) {
		struct lslot *s = &t->s[h & t->mask];

		if (atomic_load_explicit(&s->key, memory_order_acquire) == h) {
			uint64_t d = atomic_load_explicit(&s->drv, memory_order_acquire);

			return atomic_load_explicit(&s->key, memory_order_relaxed) == h ? d : 0;
		}
		t2 = ltab_now();
		if (t2 == t)
			return 0;
		t = t2; /* grown meanwhile: the handle may be only in the new one */
	}
	return 0;
}

void cuip_qt_republish(void)
{
	for (struct ltab *t = ltab_now(); t; t = t->older)
		for (uint64_t i = 0; i <= t->mask; i++)
			if (atomic_load_explicit(&t->s[i].key, memory_order_relaxed))
				atomic_store_explicit(&t->s[i].drv, *t->s[i].src, memory_order_release);
}

void cuip_qt_reset(void)
{
	for (struct ltab *t = ltab_now(), *o; t; t = o) {
		o = t->older;
		free(t);
	}
	atomic_store(&ltab, NULL);
}
