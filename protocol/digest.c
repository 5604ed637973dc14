/*
 * digest.c - see digest.h.
 */
#include <stdlib.h>
#include <string.h>

#include "digest.h"

/* One 64-bit word into the running hash: xor, multiply, fold (a strong
 * enough mix for a consistency check between two trusted parties). */
static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 31;
	h *= 0x94d049bb133111ebull;
	return h ^ (h >> 29);
}

int cuip_alloc_id_cmp(const Cuip__AllocId *a, const Cuip__AllocId *b)
{
	if (!a || !b)
		return !a - !b;
	if (a->creator != b->creator)
		return a->creator < b->creator ? -1 : 1;
	return a->serial < b->serial ? -1 : a->serial > b->serial;
}

int cuip_cmp_alloc_by_id(const void *x, const void *y)
{
	return cuip_alloc_id_cmp((*(Cuip__Allocation *const *)x)->id, (*(Cuip__Allocation *const *)y)->id);
}

int cuip_cmp_mapping_by_va(const void *x, const void *y)
{
	const Cuip__Mapping *a = *(Cuip__Mapping *const *)x, *b = *(Cuip__Mapping *const *)y;

	return a->va < b->va ? -1 : a->va > b->va;
}

int cuip_cmp_access_by_location(const void *x, const void *y)
{
	const Cuip__Access *a = *(Cuip__Access *const *)x, *b = *(Cuip__Access *const *)y;

	if (a->location_type != b->location_type)
		return a->location_type < b->location_type ? -1 : 1;
	if (a->location_id != b->location_id)
		return a->location_id < b->location_id ? -1 : 1;
	return a->va < b->va ? -1 : a->va > b->va;
}

/* A sorted copy of a pointer array (the state is not reordered). */
static void *sorted(void *const *v, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
	void **c = malloc((n ? n : 1) * size);

	if (c && n) { /* v is NULL when n is 0 (protobuf-c's empty repeated field) */
		memcpy(c, v, n * size);
		qsort(c, n, size, cmp);
	}
	return c;
}

bool cuip_state_digest(const Cuip__ProcessState *st, uint64_t *out)
{
	Cuip__Allocation **al =
		sorted((void *const *)st->allocations, st->n_allocations, sizeof(*al), cuip_cmp_alloc_by_id);
	Cuip__Mapping **mp = sorted((void *const *)st->mappings, st->n_mappings, sizeof(*mp), cuip_cmp_mapping_by_va);
	Cuip__Access *acc[64];
	uint64_t h = mix(0, 0x43555650u); /* "CUIP" */
	bool ok = al && mp;

	h = mix(h, st->n_allocations);
	h = mix(h, st->n_mappings);
	for (size_t i = 0; ok && i < st->n_allocations; i++) {
		const Cuip__Allocation *a = al[i];

		h = mix(h, a->id ? a->id->creator : 0);
		h = mix(h, a->id ? a->id->serial : 0);
		h = mix(h, (uint64_t)a->owner << 32 | (uint32_t)a->origin);
		h = mix(h, a->props ? a->props->size + 1 : 0);
		h = mix(h, a->n_pieces);
		for (size_t k = 0; k < a->n_pieces; k++) {
			h = mix(h, a->pieces[k]->offset);
			h = mix(h, a->pieces[k]->size);
			h = mix(h, a->pieces[k]->opens);
		}
	}
	for (size_t i = 0; ok && i < st->n_mappings; i++) {
		const Cuip__Mapping *m = mp[i];
		Cuip__Access **ac = m->access;

		h = mix(h, m->va);
		h = mix(h, m->size);
		h = mix(h, m->offset);
		h = mix(h, m->alloc ? m->alloc->creator : 0);
		h = mix(h, m->alloc ? m->alloc->serial : 0);
		h = mix(h, m->n_access);
		if (m->n_access > 1) {
			ac = m->n_access <= 64 ? acc : malloc(m->n_access * sizeof(*ac));
			if (!ac) {
				ok = false;
				break;
			}
			memcpy(ac, m->access, m->n_access * sizeof(*ac));
			qsort(ac, m->n_access, sizeof(*ac), cuip_cmp_access_by_location);
		}
		for (size_t k = 0; k < m->n_access; k++) {
			h = mix(h, ac[k]->va);
			h = mix(h, ac[k]->size);
			h = mix(h, (uint64_t)ac[k]->location_type << 32 | (uint32_t)ac[k]->location_id);
			h = mix(h, ac[k]->flags);
		}
		if (ac != m->access && ac != acc)
			free(ac);
	}
	free(al);
	free(mp);
	*out = h;
	return ok;
}
