/*
 * fixtures.h - process states for the plugin's unit tests: a creator with
 * shared allocations and importers mapping them, built in memory with
 * protobuf-c structs (freed with fx_free).
 */
#ifndef CUIP_TEST_FIXTURES_H
#define CUIP_TEST_FIXTURES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

#define FX_MAX_ALLOCS 8

struct fx_proc {
	Cuip__ProcessState st;
	Cuip__ProcessId self;
	Cuip__Counters counters;
	Cuip__Allocation a[FX_MAX_ALLOCS];
	Cuip__AllocId aid[FX_MAX_ALLOCS];
	Cuip__AllocProps props[FX_MAX_ALLOCS];
	Cuip__Allocation *ap[FX_MAX_ALLOCS];
	Cuip__Mapping m[FX_MAX_ALLOCS];
	Cuip__AllocId mid[FX_MAX_ALLOCS];
	Cuip__Mapping *mp[FX_MAX_ALLOCS];
	Cuip__Importer imp[FX_MAX_ALLOCS][FX_MAX_ALLOCS];
	Cuip__Importer *impp[FX_MAX_ALLOCS][FX_MAX_ALLOCS];
};

void fx_init(struct fx_proc *p, uint64_t id, int pid);
/* Add an allocation created here (shared or native); returns its index. */
int fx_create(struct fx_proc *p, uint64_t serial, uint64_t size, int shared, uint64_t va);
/* Add an import of creator's allocation, mapped at va. */
int fx_import(struct fx_proc *p, uint64_t creator, uint64_t serial, uint64_t size, uint64_t va);

/* Record that process (id, pid, start) fetched allocation index i. */
void fx_importer(struct fx_proc *p, int i, uint64_t id, pid_t pid, uint64_t start);

#endif
