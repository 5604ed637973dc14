/*
 * record.h - allocation records, mappings, access and logical handles
 * (record.c), the one owner of cuip_state_lock. Every function here runs
 * with cuip_state_lock held (each asserts it), except cuip_alloc_destroy
 * (after unlocking), cuip_map_free (of a mapping no table holds) and
 * cuip_by_logical (the lock-free handle table).
 */
#ifndef CUIP_RECORD_H
#define CUIP_RECORD_H

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "wire.h"

/* Logical handles: top 16 bits are this tag; the fake and real drivers
 * never use them (real handles are user-space pointers or small values). */
#define CUIP_HTAG	   0xC1D0ull
#define CUIP_HTAG_SHIFT	   48
#define cuip_is_logical(h) (((uint64_t)(h) >> CUIP_HTAG_SHIFT) == CUIP_HTAG)

struct cuip_access {
	uint64_t va, size;
	CUmemLocation loc;
	unsigned flags;
};

struct cuip_alloc;
struct cuip_mc;	 /* multicast.c's part of a record */
struct cuip_ipc; /* ipc.c's part of a record */

struct cuip_mapping {
	uint64_t va, size, offset;
	struct cuip_alloc *a;
	unsigned long long map_flags;
	bool detached;		 /* unmapped by PREPARE_UNICAST, VA kept for the rebuild */
	bool legacy;		 /* made by cuMemAlloc/cuIpcOpenMemHandle (ipc.c): the VA reservation is ours */
	struct cuip_access *acc; /* sorted by (location, va), non-overlapping, coalesced */
	size_t nacc, capacc;
};

/* How messages name a record: "creator:serial" (allocations, multicast
 * objects: anything with those two fields). */
#define ID_FMT "%016llx:%llu"
#define ID(a)  (unsigned long long)(a)->creator, (unsigned long long)(a)->serial

struct cuip_alloc {
	uint64_t creator, serial;
	int creator_pid;
	Cuip__Owner owner;
	Cuip__Origin origin;
	CUmemAllocationProp prop;
	uint64_t size;
	CUmemGenericAllocationHandle drv; /* 0 while detached (PREPARED) */
	uint64_t logical;		  /* 0 once the application released it */
	uint32_t app_handles;
	uint32_t nmaps;
	uint32_t minted; /* tickets minted by this process */
	bool has_token;
	uint8_t token[16];
	char creator_sock[108];
	const char *unsupported; /* OWNER_UNSUPPORTED: why */
	uint64_t requested;	 /* ORIGIN_MALLOC/IPC_OPEN: the size the application asked for */
	/* The kinds' own parts (CUIP_RECORD_EXT below), defined, made and
	 * freed by the module of that kind; NULL: the record is not of it. */
	struct cuip_mc *mc;   /* multicast object (multicast.c); NULL: unicast */
	struct cuip_ipc *ipc; /* slab, IPC opens (ipc.c) */
	uint32_t mc_binds;    /* live multicast bindings of this member */
	struct cuip_alloc *id_next;
	struct cuip_alloc *prev, *next; /* all records, creation order */
};

/*
 * The state lock: take and drop it with cuip_state_take()/cuip_state_drop()
 * (never the mutex directly), so that cuip_state_assert_held() can check,
 * where a function relies on its caller holding it, that this thread does.
 */
extern pthread_mutex_t cuip_state_lock;
extern __thread bool cuip_state_held;

static inline void cuip_state_take(void)
{
	pthread_mutex_lock(&cuip_state_lock);
	cuip_state_held = true;
}

static inline void cuip_state_drop(void)
{
	assert(cuip_state_held);
	cuip_state_held = false;
	pthread_mutex_unlock(&cuip_state_lock);
}

#define cuip_state_assert_held() assert(cuip_state_held)

struct cuip_vmm {
	struct cuip_alloc *head, *tail;
	size_t nallocs;
	struct cuip_mapping **maps; /* sorted by va */
	size_t nmaps, capmaps;
	uint64_t next_serial;
	uint64_t next_logical;
	uint32_t unsupported; /* records of OWNER_UNSUPPORTED */
};
extern struct cuip_vmm vmm;

/*
 * What a kind adds to a record of its own (its part: a->mc, a->ipc), so
 * that the layers above ask the record and name no kind. owns(a) tells its
 * records apart; died(a) frees its part when the record dies (after the
 * driver handle was released, without cuip_state_lock); forget(a) frees
 * its data in a fork child. The rest, where the kind has something to say
 * (lock held): props fills the schema's AllocKind and, for a kind with
 * properties of its own (multicast), those; inspect adds the kind's fields
 * to INSPECT's record (reply arena; 0 or -ENOMEM); parts/part/part_at: the
 * carrier saves a record the kind splits (a slab: its live pieces) as one
 * entry per part, each with its offset. Registered statically (a linker
 * section), like the runtime's hooks; a record no kind owns is plain
 * unicast memory.
 */
struct cuip_record_ext {
	bool (*owns)(const struct cuip_alloc *a);
	void (*died)(struct cuip_alloc *a);
	void (*forget)(struct cuip_alloc *a);
	bool (*props)(const struct cuip_alloc *a, Cuip__AllocKind *kind, Cuip__McProps *mc);
	int (*inspect)(const struct cuip_alloc *a, Cuip__Allocation *m);
	bool (*parts)(const struct cuip_alloc *a, size_t *n);
	void (*part)(const struct cuip_alloc *a, size_t k, uint64_t *off, uint64_t *size);
	long (*part_at)(const struct cuip_alloc *a, uint64_t off);
};
#define CUIP_RECORD_EXT(name, ...)                                 \
	static const struct cuip_record_ext cuip_record_ext_##name \
		__attribute__((used, section("cuip_record_exts"), aligned(sizeof(void *)))) = {__VA_ARGS__}

/* ---- what a record's kind says (lock held) ---- */

/* The schema's kind of a (KIND_UNICAST unless its kind says otherwise);
 * true when the kind filled *mc with properties of its own. */
bool cuip_alloc_props(const struct cuip_alloc *a, Cuip__AllocKind *kind, Cuip__McProps *mc);
/* INSPECT: the kind's own fields of a's record m (reply arena): 0 or -ENOMEM. */
int cuip_alloc_inspect(const struct cuip_alloc *a, Cuip__Allocation *m);
/* Whether the carrier saves a in parts, *n of them (each an entry with its
 * offset, in offset order); false: a is one entry, whole, with no offset. */
bool cuip_alloc_split(const struct cuip_alloc *a, size_t *n);
/* Part k of a split record: its offset and size. */
void cuip_alloc_part(const struct cuip_alloc *a, size_t k, uint64_t *off, uint64_t *size);
/* The part of split record a that starts at off: its index, or -1. */
long cuip_alloc_part_at(const struct cuip_alloc *a, uint64_t off);

/* ---- records ---- */

/* The constructor: a new record of (creator, serial), linked everywhere. A
 * creator of 0 is this process: the record gets the next serial, this
 * process's pid and control socket. */
struct cuip_alloc *cuip_alloc_new(uint64_t creator, uint64_t serial);
/* The destructor, after unlocking: drop the cached export, release the
 * driver handle, let the kind's extension free its part, free it. */
void cuip_alloc_destroy(struct cuip_alloc *a);
struct cuip_alloc *cuip_alloc_by_id(uint64_t creator, uint64_t serial);
struct cuip_alloc *cuip_by_logical(uint64_t h);
void cuip_logical_assign(struct cuip_alloc *a);
void cuip_logical_drop(struct cuip_alloc *a);
/* Nothing names it any more: no logical handle, mapping or binding. */
bool cuip_alloc_dead(const struct cuip_alloc *a);
/* Take a out of every table (destroy it after unlocking). */
void cuip_alloc_unlink(struct cuip_alloc *a);
/* Unlink a when it is dead: true then (destroy it after unlocking). */
bool cuip_alloc_unlink_if_dead(struct cuip_alloc *a);
/* Drop one multicast member reference; true when the record died and was
 * unlinked (destroy it after unlocking). */
bool cuip_alloc_unbound(struct cuip_alloc *a);
/* Unicast memory whose bytes the carrier saves and reloads, detached from
 * PREPARE_UNICAST to REBUILD: shared allocations (created or imported
 * here), and the private ones this process created unless
 * CUINTERPOSE_PRIVATE=native (then native checkpoint keeps them). */
bool cuip_carried(const struct cuip_alloc *a);
/* REBUILD: the socket of a's creator (the coordinator's, else the ticket's), or NULL. */
const char *cuip_creator_socket(const Cuip__Rebuild *rb, const struct cuip_alloc *a);

/* ---- mappings ---- */

/* Selects records for cuip_maps_detach/attach (arg: the caller's). */
typedef bool (*cuip_want_fn)(const struct cuip_alloc *a, const void *arg);

/*
 * The one detach step of a PREPARE, for every kind: unmap the attached
 * mappings of the records want() selects (the VA reservations stay the
 * application's) and mark them detached. One failure policy: when an
 * unmap fails, every detached mapping want() selects is mapped back with
 * its access, so the process is as it was: -EIO, err naming the failure
 * and "the others were mapped back". Only when that fails too are some
 * left detached: -ENOTRECOVERABLE (the caller leaves the process for a
 * REBUILD). `what` names the records in messages ("allocation").
 */
int cuip_maps_detach(cuip_want_fn want, const void *arg, const char *what, char *err, size_t errlen);
/* Map the detached mappings of the records want() selects back at their
 * original addresses, with their access (REBUILD, and the detach's undo):
 * 0 or -EIO with err filled. */
int cuip_maps_attach(cuip_want_fn want, const void *arg, const char *what, char *err, size_t errlen);

struct cuip_mapping *cuip_mapping_at(uint64_t va);
/* Index of the first mapping whose end is above va. */
size_t cuip_map_lower(uint64_t va);
bool cuip_map_overlaps(uint64_t va, uint64_t size);
int cuip_map_insert(struct cuip_mapping *m);
void cuip_map_remove_at(size_t i);
/* Take the mapping at va out of the table (nmaps of its record drops). */
struct cuip_mapping *cuip_map_take(uint64_t va);
void cuip_map_free(struct cuip_mapping *m);
/* A new mapping covering [lo, hi) of m, with m's access clipped to it. */
struct cuip_mapping *cuip_map_part(const struct cuip_mapping *m, uint64_t lo, uint64_t hi);
int cuip_access_set(struct cuip_mapping *m, uint64_t va, uint64_t size, const CUmemLocation *loc, unsigned flags);
/* Staging (cuMemSetAccess): a copy of m's access to change with
 * cuip_access_set, then swapped in once the driver agreed. */
int cuip_access_copy(struct cuip_mapping *to, const struct cuip_mapping *m);
void cuip_access_swap(struct cuip_mapping *m, struct cuip_mapping *staged);

#endif /* CUIP_RECORD_H */
