/*
 * qtable.h - the logical-handle table (qtable.c): logical handle -> record
 * and driver handle, read without any lock by tracked queries.
 *
 * Callers: record.c (records, logical handles), vmm.c (the query), gate.c
 * (cuip_gate_open republishes). Writers hold cuip_state_lock; cuip_qt_drv
 * takes no lock and is called inside the API gate.
 */
#ifndef CUIP_QTABLE_H
#define CUIP_QTABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

struct cuip_alloc;

/* Room for nrecords live handles (at half load): 0 or -ENOMEM. Lock held. */
int cuip_qt_reserve(size_t nrecords);
/* Whether h's slot holds a live handle (h itself or one it collides with):
 * a new handle must not be such a value. Lock held. */
bool cuip_qt_taken(uint64_t h);
/* Enter live handle h (not taken) for record a, whose driver handle is *drv
 * (&a->drv: republish reads it there again). Lock held. */
void cuip_qt_insert(uint64_t h, struct cuip_alloc *a, const CUmemGenericAllocationHandle *drv);
/* h names nothing any more, in every reader from the return on. Lock held. */
void cuip_qt_remove(uint64_t h);
/* The record of live handle h, or NULL. Lock held. */
struct cuip_alloc *cuip_qt_record(uint64_t h);
struct cuip_qt_slot {
	_Atomic uint64_t key;			 /* the logical handle; 0: free */
	_Atomic uint64_t drv;			 /* its record's driver handle */
	struct cuip_alloc *a;			 /* its record (state lock) */
	const CUmemGenericAllocationHandle *src; /* where the record keeps drv (&a->drv): republish reads it */
};
struct cuip_qt_tab {
	uint64_t mask;
	struct cuip_qt_tab *older; /* superseded tables (qtable.c) */
	struct cuip_qt_slot s[];
};
struct cuip_qt_cur {
	_Atomic(struct cuip_qt_tab *) p;
} __attribute__((aligned(64))); /* a line of its own */
extern struct cuip_qt_cur cuip_qt_cur;

/* Without the lock, inside the gate: the driver handle of live handle h,
 * 0 when h names nothing (released, never assigned). Inline in the query
 * wrapper; the protocol is qtable.c's (key, drv, key again). */
static inline uint64_t cuip_qt_drv(uint64_t h)
{
	struct cuip_qt_tab *t = atomic_load_explicit(&cuip_qt_cur.p, memory_order_acquire), *t2;

	while (t && h) {
		struct cuip_qt_slot *s = &t->s[h & t->mask];

		if (atomic_load_explicit(&s->key, memory_order_acquire) == h) {
			uint64_t d = atomic_load_explicit(&s->drv, memory_order_acquire);

			return atomic_load_explicit(&s->key, memory_order_relaxed) == h ? d : 0;
		}
		t2 = atomic_load_explicit(&cuip_qt_cur.p, memory_order_acquire);
		if (t2 == t)
			return 0;
		t = t2; /* grown meanwhile: the handle may be only in the new one */
	}
	return 0;
}
/* Copy every live record's driver handle into the table (they change only
 * while the gate is closed: LOAD, REBUILD). Lock held, gate closed. */
void cuip_qt_republish(void);
/* Fork child: forget everything (one thread, no reader). */
void cuip_qt_reset(void);

#endif
