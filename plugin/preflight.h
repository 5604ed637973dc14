/*
 * preflight.h - the rules a checkpoint must pass before anything changes.
 *
 * Pure functions over the participants' inspected states (no I/O), so they
 * are unit-tested directly. The first violation is returned with a message
 * naming the process, the resource and what to do; every violation is also
 * logged.
 */
#ifndef CUIP_PLUGIN_PREFLIGHT_H
#define CUIP_PLUGIN_PREFLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

struct cuip_pf_proc {
	pid_t pid; /* for messages */
	const Cuip__ProcessState *st;
	bool quiesced; /* st was taken after this checkpoint's QUIESCE: phase QUIESCED expected */
};

/* Names a process identity that is not a participant (e.g. the pid of a
 * sharing peer outside the tree); returns 0 when unknown. */
typedef pid_t (*cuip_pf_resolve_fn)(uint64_t id, void *arg);

int cuip_preflight(const struct cuip_pf_proc *p, size_t n, cuip_pf_resolve_fn resolve, void *arg, char *err,
		   size_t errlen);

/*
 * Importers a creator recorded (Allocation.importers, interposer/
 * importers.h): every live one must be a participant, or the dump would
 * tear down memory it still uses. where() places one in our pid namespace:
 * its pid here when it is alive, 0 when it is gone, -1 when that cannot be
 * told. A participant's identity or pid passes; so does a gone importer.
 */
typedef pid_t (*cuip_pf_importer_fn)(const struct cuip_pf_proc *creator, const Cuip__Importer *im, void *arg);
int cuip_preflight_importers(const struct cuip_pf_proc *p, size_t n, cuip_pf_importer_fn where, void *arg, char *err,
			     size_t errlen);

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

#endif /* CUIP_PLUGIN_PREFLIGHT_H */
