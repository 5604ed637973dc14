/*
 * conn.h - one request/response exchange with a participant's control
 * server, and the orderly goodbye (BYE, reply, wait for the server to
 * close) that guarantees no connection survives into CRIU's descriptor
 * dump. Stateless; a socket is used by one thread at a time.
 */
#ifndef CUIP_PLUGIN_CONN_H
#define CUIP_PLUGIN_CONN_H

#include <stddef.h>

#include "wire.h"

/*
 * Send `req` (with `fd_out` or -1) and receive the response within
 * timeout_ms (0 = no limit). A response with a negative status is returned
 * as that status with its error text in `err`; *resp is then freed. On
 * success the caller frees *resp with cuip_response_free.
 */
int cuip_call(int sock, const Cuip__Request *req, int fd_out, unsigned timeout_ms, Cuip__Response **resp, char *err,
	      size_t errlen);

/* The same with nfds descriptors (SAVE and LOAD: the carrier files). */
int cuip_callv(int sock, const Cuip__Request *req, const int *fds_out, size_t nfds, unsigned timeout_ms,
	       Cuip__Response **resp, char *err, size_t errlen);

void cuip_response_free(Cuip__Response *resp);

/* BYE, its reply, then wait (up to timeout_ms) until the server closes; the
 * socket is closed in every case. Returns 0 or a negative errno. */
int cuip_bye(int sock, unsigned timeout_ms);

/* Name of a request body, for log lines. */
const char *cuip_request_name(int body_case);

#endif /* CUIP_PLUGIN_CONN_H */
