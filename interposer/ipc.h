/*
 * ipc.h - cuMemAlloc as POSIX-capable VMM, slabs of small requests, cuIpc*
 * emulated (ipc.c). cuip_state_lock protects the slabs and their pieces.
 */
#ifndef CUIP_IPC_H
#define CUIP_IPC_H

#include <stdbool.h>
#include <stdint.h>

struct cuip_alloc;

/* Slab pieces (lock held): the piece of a that holds byte offset off
 * (exact: starts there), or NULL. */
struct cuip_piece *cuip_piece_at(const struct cuip_alloc *a, uint64_t off, bool exact);

#endif /* CUIP_IPC_H */
