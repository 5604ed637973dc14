/*
 * alloc.c - the meaning of Allocation records; see alloc.h. Stateless.
 */
#include <stdlib.h>

#include "alloc.h"
#include "digest.h"

uint64_t cuip_alloc_size(const Cuip__Allocation *a)
{
	if (a->kind == CUIP__ALLOC_KIND__KIND_MULTICAST) {
		if (!a->mc)
			return 0;
		return a->mc->has_effective_size && a->mc->effective_size ? a->mc->effective_size
									  : a->mc->requested_size;
	}
	return a->props ? a->props->size : 0;
}

int cuip_alloc_carried_by(const Cuip__Allocation *a, uint64_t self)
{
	/* The interposer says which (carried: shared, or private unless
	 * CUINTERPOSE_PRIVATE=native); records without the field: shared ones. */
	int carried = a->has_carried ? a->carried : a->owner == CUIP__OWNER__OWNER_SHARED;

	return a->kind == CUIP__ALLOC_KIND__KIND_UNICAST && carried && a->owner != CUIP__OWNER__OWNER_UNSUPPORTED &&
	       a->id && a->id->creator == self &&
	       (a->origin == CUIP__ORIGIN__ORIGIN_VMM_CREATE || a->origin == CUIP__ORIGIN__ORIGIN_MALLOC);
}

uint64_t cuip_alloc_carried_bytes(const Cuip__Allocation *a)
{
	uint64_t n = 0;

	if (!a->slab)
		return cuip_alloc_size(a);
	for (size_t i = 0; i < a->n_pieces; i++)
		n += a->pieces[i]->size;
	return n;
}

size_t cuip_alloc_carrier_entries(const Cuip__Allocation *a)
{
	return a->slab ? a->n_pieces : 1;
}

int cuip_carrier_entry_fits(const Cuip__Allocation *a, const Cuip__CarrierEntry *e)
{
	if (!a->slab)
		return !e->has_alloc_offset && e->size == cuip_alloc_size(a);
	for (size_t i = 0; e->has_alloc_offset && i < a->n_pieces; i++)
		if (a->pieces[i]->offset == e->alloc_offset)
			return a->pieces[i]->size == e->size;
	return 0;
}

void cuip_sort_allocs(Cuip__ProcessState *st)
{
	if (st->n_allocations) /* a process with only pools has none, and NULL */
		qsort(st->allocations, st->n_allocations, sizeof(*st->allocations), cuip_cmp_alloc_by_id);
}

/*
 * Allocations by identity in O(log n): a job holds thousands per process and
 * every import and mapping looks one up. Needs cuip_sort_allocs first.
 */
const Cuip__Allocation *cuip_find_alloc(const Cuip__ProcessState *st, const Cuip__AllocId *id)
{
	size_t lo = 0, hi = st->n_allocations;

	if (!id)
		return NULL;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = cuip_alloc_id_cmp(st->allocations[mid]->id, id);

		if (!c)
			return st->allocations[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}
