/*
 * client.h - talking to a process's control socket (client.c): importers
 * fetching export FDs from creators, the CLI's inspect, and tests. Plain
 * functions over wire.c, no state; every request on a connection follows
 * a HANDSHAKE. Return 0 or a negative errno (the FETCHes: an FD).
 */
#ifndef CUIP_CLIENT_H
#define CUIP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "cuinterpose.pb-c.h"

/* The interposer identity a FETCH announces to the creator (set by the
 * interposer's start-up; 0 in the CLI and tests: not announced). */
extern uint64_t cuip_client_identity;
/* ... and the process as it sees itself (getpid, pid namespace inode, start
 * time), for a creator that cannot see its pid namespace. */
extern int32_t cuip_client_pid;
extern uint64_t cuip_client_pid_ns, cuip_client_start;

int cuip_client_connect(const char *path);
int cuip_client_call(int sock, const Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out, char *err,
		     size_t errlen);
int cuip_client_handshake(int sock, const char *client, Cuip__ProcessId *self_out, char *err, size_t errlen);
/* Fetch a fresh FD of (creator, serial) from the creator's socket. */
int cuip_fetch(const char *sock, uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, char *err,
	       size_t errlen);
/* The same over one kept connection (a rebuild fetches thousands): open
 * (connect + handshake, checks the creator) returns the socket, then any
 * number of FETCHes on it; close it when done. */
int cuip_fetch_open(const char *sock, uint64_t creator, char *err, size_t errlen);
int cuip_fetch_on(int s, uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, char *err,
		  size_t errlen);
/* Many FETCHes in one round trip (at most CUIP_MSG_MAX_FDS items): on 0 each
 * item's fd is a fresh FD or the creator's negative errno for that item; a
 * negative return is a failed exchange and leaves no FD open. */
struct cuip_fetch_item {
	uint64_t serial;
	const uint8_t *token;
	size_t toklen;
	int fd;
};
/* Why a creator refused a fetch (its negative errno), in words. */
const char *cuip_fetch_refusal(int err);
int cuip_fetch_many_on(int s, uint64_t creator, struct cuip_fetch_item *items, size_t n, char *err, size_t errlen);
/* The two halves, so that a caller can have the next batch in flight while
 * it imports this one; the reply to each send must be received in order. */
int cuip_fetch_many_send(int s, uint64_t creator, const struct cuip_fetch_item *items, size_t n, char *err,
			 size_t errlen);
int cuip_fetch_many_recv(int s, struct cuip_fetch_item *items, size_t n, char *err, size_t errlen);

#endif
