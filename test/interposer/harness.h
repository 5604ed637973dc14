/*
 * harness.h - the interposer tests' harness: the shared one
 * (test/harness/harness.h) and the interposer's own part (control.c). Each
 * test binary runs with libcuinterpose.so preloaded on the fake driver
 * (run-test.sh); Check forks every test, so each test is a fresh process
 * whose first cuInit starts a fresh interposer. control.c reaches the real
 * driver behind the interposer (libc's own dlsym) and inspects this or
 * another process over its control socket.
 */
#ifndef CUIP_TEST_INTERPOSER_HARNESS_H
#define CUIP_TEST_INTERPOSER_HARNESS_H

#include "../harness/harness.h"
#include "client.h" /* protocol/client.c, linked into the tests */
#include "wire.h"

#define TAG_SHIFT 48
#define TAG	  0xC1D0ull

/* The real driver behind the interposer, by symbol name. */
void *h_real(const char *name);
/* Is p one of libcuinterpose's functions? */
bool h_ours(void *p);
void *h_ours_sym(const char *name);

/* Control socket of pid (this process if 0), from CUINTERPOSE_SOCKET_DIR. */
int h_sock_path(pid_t pid, char *buf, size_t len);
int h_connect(pid_t pid);
/* INSPECT pid; free with h_state_free. */
Cuip__ProcessState *h_state(pid_t pid);
void h_state_free(Cuip__ProcessState *st);
int h_request(int sock, Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out);
/* One request on connection s (sent with fd unless -1): the response, status unchecked. */
Cuip__Response *h_call(int s, Cuip__Request *req, int fd);
/* The same, asserting status 0 (`what` names the request in the failure). */
void h_ok_call(int s, Cuip__Request *req, int fd, const char *what);
/* A request whose body is a flag (a protobuf bool), asserting status 0. */
void h_flag(int s, Cuip__Request__BodyCase bc, const char *what);
/* INSPECT on connection s, asserting status 0; free the response. */
Cuip__Response *h_inspect(int s);

#endif
