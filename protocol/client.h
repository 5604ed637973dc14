/*
 * client.h - the one client of a process's control socket (client.c),
 * over wire.c: the plugin's coordinator, importers fetching export FDs
 * from creators (the interposer), the CLI's inspect and check, and tests.
 * Every request on a connection follows a HANDSHAKE. Functions return 0
 * or a negative errno (the FETCHes: an FD) and name the failure in `err`.
 * A socket is used by one thread at a time; the only shared state is the
 * list of arena-decoded responses (its own mutex) and the importer's
 * announced identity below (written once at start-up and at fork).
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

/* A connected socket or a negative errno. */
int cuip_client_connect(const char *path);
/* Bound every send and receive on sock to ms (0: no limit). */
void cuip_client_timeout(int sock, unsigned ms);

/* Name of a request body, for messages ("INSPECT"). */
const char *cuip_request_name(int body_case);

/*
 * The raw exchange: send req (with fd_send, or -1), receive the response
 * and the descriptor it carries (*fd_recv, or closed when fd_recv is NULL).
 * A refusal is a response too: its status is the caller's to read. Free
 * *resp with cuip__response__free_unpacked.
 */
int cuip_client_call(int sock, const Cuip__Request *req, int fd_send, Cuip__Response **resp, int *fd_recv, char *err,
		     size_t errlen);

/*
 * A checked request: the reply within timeout_ms (0: no limit; -ETIMEDOUT
 * and "no reply to REQ within N ms" otherwise); a refusal comes back as its
 * negative status with "REQ refused: why" in err and no response. The
 * response is decoded into an arena (an INSPECT answer holds tens of
 * thousands of records): free it with cuip_client_free. No reply to these
 * carries a descriptor; one that does is closed.
 */
int cuip_client_request(int sock, const Cuip__Request *req, int fd_send, unsigned timeout_ms, Cuip__Response **resp,
			char *err, size_t errlen);
/* The same with nfds descriptors (SAVE and LOAD: the carrier files). */
int cuip_client_requestv(int sock, const Cuip__Request *req, const int *fds, size_t nfds, unsigned timeout_ms,
			 Cuip__Response **resp, char *err, size_t errlen);
void cuip_client_free(Cuip__Response *resp);

/* Who answered a HANDSHAKE. */
struct cuip_peer {
	uint64_t id; /* interposer identity */
	int32_t pid; /* the pid it sees for itself */
	int phase;   /* Cuip__Phase */
};

/* HANDSHAKE as `client` ("plugin", "peer", "cli"); peer may be NULL. */
int cuip_client_handshake(int sock, const char *client, unsigned timeout_ms, struct cuip_peer *peer, char *err,
			  size_t errlen);

/* BYE, its reply, then wait (up to timeout_ms, 0: no limit) until the
 * server closes, so that no connection outlives the conversation (CRIU
 * dumps descriptors next); the socket is closed in every case. */
int cuip_client_bye(int sock, unsigned timeout_ms);

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

#endif /* CUIP_CLIENT_H */
