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
#define CUIP_QT_PROPW (sizeof(CUmemAllocationProp) / 8)
struct cuip_qt_slot {
	_Atomic uint64_t key; /* the logical handle; 0: free */
	_Atomic uint64_t drv; /* its record's driver handle */
	/* The driver's own answer to cuMemGetAllocationPropertiesFromHandle
	 * for drv, asked when drv was stored (an allocation's properties never
	 * change); its type (the first word's low half) is 0 when the driver
	 * refused or was not asked: the query then asks the driver. */
	_Atomic uint64_t prop[CUIP_QT_PROPW];
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

/* Without the lock, inside the gate: the slot whose key was h when read
 * (acquire), looking again in the current table when it grew meanwhile (the
 * handle may be only in the new one); NULL when h names nothing. A reader
 * takes what it needs from the slot and then reads the key again: another
 * value there means h was released meanwhile. The protocol is qtable.c's. */
static inline struct cuip_qt_slot *cuip_qt_find(uint64_t h)
{
	struct cuip_qt_tab *t = atomic_load_explicit(&cuip_qt_cur.p, memory_order_acquire), *t2;

	while (t && h) {
		struct cuip_qt_slot *s = &t->s[h & t->mask];

		if (atomic_load_explicit(&s->key, memory_order_acquire) == h)
			return s;
		t2 = atomic_load_explicit(&cuip_qt_cur.p, memory_order_acquire);
		if (t2 == t)
			return NULL;
		t = t2;
	}
	return NULL;
}

/* Without the lock, inside the gate: the driver handle of live handle h,
 * 0 when h names nothing (released, never assigned). */
static inline uint64_t cuip_qt_drv(uint64_t h)
{
	struct cuip_qt_slot *s = cuip_qt_find(h);
	uint64_t d;

	if (!s)
		return 0;
	d = atomic_load_explicit(&s->drv, memory_order_acquire);
	return atomic_load_explicit(&s->key, memory_order_relaxed) == h ? d : 0;
}

/* Without the lock, inside the gate, for prop != NULL: 1 with the
 * driver's recorded answer copied to *prop; 0 with *drv set when there is
 * none (ask the driver); -1 when h names nothing. The same protocol as
 * cuip_qt_drv, over the property words as well. */
static inline int cuip_qt_props(uint64_t h, CUmemAllocationProp *prop, uint64_t *drv)
{
	struct cuip_qt_slot *s = cuip_qt_find(h);
	uint64_t w[CUIP_QT_PROPW], d;

	if (!s)
		return -1;
	d = atomic_load_explicit(&s->drv, memory_order_acquire);
	for (size_t i = 0; i < CUIP_QT_PROPW; i++)
		w[i] = atomic_load_explicit(&s->prop[i], memory_order_acquire);
	if (atomic_load_explicit(&s->key, memory_order_relaxed) != h || !d)
		return -1;
	if (!(uint32_t)w[0]) {
		*drv = d;
		return 0;
	}
	__builtin_memcpy(prop, w, sizeof(*prop));
	return 1;
}

/* Copy every live record's driver handle into the table (they change only
 * while the gate is closed: LOAD, REBUILD), and ask the driver for its
 * properties again. Lock held, gate closed. */
void cuip_qt_republish(void);
/* Fork child: forget everything (one thread, no reader). */
void cuip_qt_reset(void);

#endif
