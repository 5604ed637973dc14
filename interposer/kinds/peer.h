/*
 * peer.h - peer access mirrored into VMM access (peer.c), called by ipc.c
 * for each new legacy mapping. cuip_state_lock protects the peer matrix.
 */
#ifndef CUIP_PEER_H
#define CUIP_PEER_H

struct cuip_mapping;

/* Grant m the access that enabled peer access implies (caller holds cuip_state_lock). */
void cuip_peer_grant(struct cuip_mapping *m);

#endif /* CUIP_PEER_H */
