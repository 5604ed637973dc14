/*
 * ticket.h - ticket memfds (ticket.c): mint a sealed memfd naming an
 * allocation by identity, recognise one. No state, no lock.
 */
#ifndef CUIP_TICKET_H
#define CUIP_TICKET_H

#include <stdbool.h>
#include "wire.h"

struct cuip_alloc;

/* Mint a sealed ticket memfd for a (a snapshot: no lock needed) of the
 * schema's kind `kind`, with mc: the kind's own properties (multicast;
 * NULL: the allocation's); returns the FD or a negative errno. */
int cuip_ticket_mint(const struct cuip_alloc *a, Cuip__AllocKind kind, const Cuip__McProps *mc, bool cloexec);
/* 1: fd is a ticket (*out filled, free with cuip__ticket__free_unpacked);
 * 0: not a ticket; -ENOMEM: out of memory decoding it (the ticket may be
 * fine); another negative errno: looks like ours but is malformed. */
int cuip_ticket_read(int fd, Cuip__Ticket **out);

#endif /* CUIP_TICKET_H */
