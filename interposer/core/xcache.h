/*
 * xcache.h - the export cache and the peer FD service (xcache.c): one real
 * export per shared allocation this process created, served to importers
 * by the control thread. Own lock xc_lock; never calls the driver under it.
 */
#ifndef CUIP_XCACHE_H
#define CUIP_XCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

/* Ensure one real export of (creator, serial) exists: 0 or CUresult via *cr. */
int cuip_xc_export(uint64_t serial, CUmemGenericAllocationHandle drv, const uint8_t token[16], CUresult *cr);
/* Drop the entry, waiting for in-flight serves; closes the real FD. */
void cuip_xc_drop(uint64_t serial);
/* Serve a dup of the cached export; returns an FD or a negative errno. A
 * successful serve records `by` (when not NULL) among the entry's importers
 * before it returns (so an INSPECT after the reply always sees it); *rec
 * gets what that did (cuip_importers_add's result; 0: nothing new). */
struct cuip_importer;
int cuip_xc_dup(uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, const struct cuip_importer *by,
		int *rec);
/* The FD of a serve never reached `by` (its reply was not sent): take back
 * what the serve recorded (rec from cuip_xc_dup). Only the control thread
 * serves, so no other serve to the same peer can have relied on it. */
void cuip_xc_unrecord(uint64_t serial, const struct cuip_importer *by, int rec);
/* Forget the importers that are gone (INSPECT, before the copies). */
void cuip_xc_prune_importers(void);
/* Copy up to max importers of serial's export; *dropped: those not copied
 * or never recorded. Returns the count (0 when nothing is exported). */
unsigned cuip_xc_importers(uint64_t serial, struct cuip_importer *out, unsigned max, unsigned *dropped);
void cuip_xc_served(void);
uint64_t cuip_xc_served_count(void);
bool cuip_xc_has(uint64_t serial);
int cuip_xc_fd_cloexec(uint64_t serial); /* the cached FD's FD_CLOEXEC, or -1 */

#endif /* CUIP_XCACHE_H */
