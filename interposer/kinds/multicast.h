/*
 * multicast.h - multicast objects (multicast.c): the record extension of a
 * multicast handle (devices, bindings), its entry points and its
 * checkpoint slice (inspect, prepare, rebuild, verify). cuip_state_lock
 * (record.c) protects all of it.
 */
#ifndef CUIP_MULTICAST_H
#define CUIP_MULTICAST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "wire.h"

struct cuip_alloc;

struct cuip_mc_dev {
	int ordinal;
	uint8_t uuid[16];
	bool has_uuid;
};

struct cuip_mc_bind {
	int dev;
	uint64_t mc_offset, size, member_offset, member_va, flags;
	struct cuip_alloc *member; /* holds one mc_binds reference */
	bool by_addr;
	unsigned abi; /* 1, or 2 for the device-explicit _v2 forms */
	bool unbound; /* unbound by a PREPARE that kept the object's handle */
};

struct cuip_mc {
	uint32_t num_devices;
	uint64_t requested, effective; /* effective: the extent the driver accepted */
	uint64_t handle_types, flags;
	struct cuip_mc_dev *devs;
	size_t ndevs, capdevs;
	struct cuip_mc_bind *binds;
	size_t nbinds, capbinds;
	bool detached; /* torn down by PREPARE_MULTICAST, not yet rebuilt */
	bool kept;     /* ... with its handle (and devices) kept: a PREPARE that
			* could neither finish nor set it back; REBUILD binds
			* what was unbound and maps the VAs again */
};

/* Fill a McProps (arena or caller memory) from a multicast record. */
void cuip_mc_props(const struct cuip_alloc *a, Cuip__McProps *p);
struct cuip_mc *cuip_mc_from_props(const Cuip__McProps *p);
void cuip_mc_note_extent(struct cuip_alloc *a, uint64_t end);
/* Its checkpoint slice (inspect, prepare, rebuild, verify) is registered
 * with CUIP_SLICE (slice.h), not called by name. */

#endif /* CUIP_MULTICAST_H */
