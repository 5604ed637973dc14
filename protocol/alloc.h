/*
 * alloc.h - what an Allocation record of a process state means (alloc.c):
 * the bytes behind it, whether and how its creator's carrier saves it, and
 * finding one by identity. Pure functions over decoded states, used by the
 * image reader (images.c), the plugin's preflight and coordinator, and the
 * CLI. Stateless, no locks.
 */
#ifndef CUIP_ALLOC_H
#define CUIP_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "cuinterpose.pb-c.h"

/* Bytes backing an allocation (unicast props size, multicast effective or
 * requested size); 0 when unknown. */
uint64_t cuip_alloc_size(const Cuip__Allocation *a);

/* A carried unicast allocation this process created (shared, or private
 * unless CUINTERPOSE_PRIVATE=native): the carrier image holds its bytes. */
int cuip_alloc_carried_by(const Cuip__Allocation *a, uint64_t self);
/* What the carrier moves for a carried allocation: the whole of it, or one
 * entry per live piece of a slab (freed pieces are not saved). */
uint64_t cuip_alloc_carried_bytes(const Cuip__Allocation *a);
size_t cuip_alloc_carrier_entries(const Cuip__Allocation *a);
/* 1 when e is an entry a's carrier writes (whole, or one live piece). */
int cuip_carrier_entry_fits(const Cuip__Allocation *a, const Cuip__CarrierEntry *e);
/* Sort a state's allocations by identity (their order means nothing), then
 * find one by identity in O(log n); NULL when absent. */
void cuip_sort_allocs(Cuip__ProcessState *st);
const Cuip__Allocation *cuip_find_alloc(const Cuip__ProcessState *st, const Cuip__AllocId *id);

#endif /* CUIP_ALLOC_H */
