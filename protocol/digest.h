/*
 * digest.h - a 64-bit digest of what VERIFY compares in a process state.
 *
 * VERIFY checks, after a restore, that every allocation (identity, owner,
 * origin, size, slab pieces) and every mapping (address, size, offset, allocation, access
 * per location) the interposer now tracks is the one the checkpoint holds.
 * Shipping the whole expected state to each process for that costs an
 * encode and a decode of every record; both sides hashing the same fields
 * in the same canonical order (allocations by identity, mappings by
 * address, access entries by location and address) and comparing 8 bytes
 * costs neither. Records are hashed, not matched: a mismatch says only that
 * something differs, and the caller asks for the full comparison to learn
 * what. Multicast objects are not covered (their verification needs the
 * whole state).
 *
 * Reads the state, never changes it; allocates scratch arrays (returns
 * false on allocation failure).
 */
#ifndef CUIP_DIGEST_H
#define CUIP_DIGEST_H

#include <stdbool.h>
#include <stdint.h>

#include "cuinterpose.pb-c.h"

bool cuip_state_digest(const Cuip__ProcessState *st, uint64_t *out);

/* The canonical orders, as qsort comparators over arrays of pointers:
 * allocations by identity (creator, serial), mappings by address, access
 * entries by location (type, id) then address. VERIFY's record-by-record
 * comparison sorts with the same ones. */
int cuip_cmp_alloc_by_id(const void *x, const void *y);
/* The identity order itself (a missing identity sorts last). */
int cuip_alloc_id_cmp(const Cuip__AllocId *a, const Cuip__AllocId *b);
int cuip_cmp_mapping_by_va(const void *x, const void *y);
int cuip_cmp_access_by_location(const void *x, const void *y);

#endif
