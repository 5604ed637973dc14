/*
 * conn.c - control request/response and goodbye; see conn.h.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "arena.h"
#include "conn.h"

const char *cuip_request_name(int c)
{
	switch (c) {
	case CUIP__REQUEST__BODY_HANDSHAKE:
		return "HANDSHAKE";
	case CUIP__REQUEST__BODY_INSPECT:
		return "INSPECT";
	case CUIP__REQUEST__BODY_QUIESCE:
		return "QUIESCE";
	case CUIP__REQUEST__BODY_PREPARE_MULTICAST:
		return "PREPARE_MULTICAST";
	case CUIP__REQUEST__BODY_SAVE:
		return "SAVE";
	case CUIP__REQUEST__BODY_PREPARE_UNICAST:
		return "PREPARE_UNICAST";
	case CUIP__REQUEST__BODY_LOAD:
		return "LOAD";
	case CUIP__REQUEST__BODY_REBUILD:
		return "REBUILD";
	case CUIP__REQUEST__BODY_VERIFY:
		return "VERIFY";
	case CUIP__REQUEST__BODY_RESUME:
		return "RESUME";
	case CUIP__REQUEST__BODY_FETCH_MANY:
		return "FETCH_MANY";
	case CUIP__REQUEST__BODY_BYE:
		return "BYE";
	}
	return "?";
}

static void set_rcvtimeo(int sock, unsigned ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

/*
 * Responses are decoded into an arena (arena.h): an INSPECT answer holds
 * tens of thousands of records, and protobuf-c's default allocator makes a
 * malloc (and later a free) per record, field array and byte string. The
 * arena of a response is found again through a short list of live responses
 * (a few per participant; phases decode on several threads, hence the lock).
 */
struct live {
	struct live *next;
	const Cuip__Response *resp;
	struct cuip_arena mem;
};

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct live *live;

static void *arena_alloc(void *data, size_t n)
{
	return cuip_arena_alloc(&((struct live *)data)->mem, n);
}

static void arena_free(void *data, void *p)
{
	(void)data;
	(void)p; /* everything goes with the arena */
}

static void arena_destroy(struct live *a)
{
	cuip_arena_clear(&a->mem);
	free(a);
}

void cuip_response_free(Cuip__Response *resp)
{
	struct live **pp, *a = NULL;

	if (!resp)
		return;
	pthread_mutex_lock(&live_lock);
	for (pp = &live; *pp; pp = &(*pp)->next) {
		if ((*pp)->resp == resp) {
			a = *pp;
			*pp = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&live_lock);
	if (a)
		arena_destroy(a);
	else
		protobuf_c_message_free_unpacked(&resp->base, NULL);
}

int cuip_call(int sock, const Cuip__Request *req, int fd_out, unsigned timeout_ms, Cuip__Response **resp, char *err,
	      size_t errlen)
{
	return cuip_callv(sock, req, &fd_out, fd_out >= 0, timeout_ms, resp, err, errlen);
}

int cuip_callv(int sock, const Cuip__Request *req, const int *fds_out, size_t nfds, unsigned timeout_ms,
	       Cuip__Response **resp, char *err, size_t errlen)
{
	struct live *a = calloc(1, sizeof(*a));
	ProtobufCAllocator alloc = {.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
	ProtobufCMessage *m = NULL;
	char why[256] = "";
	int ret, fd_in = -1;

	*resp = NULL;
	if (!a) {
		snprintf(err, errlen, "%s: out of memory", cuip_request_name(req->body_case));
		return -ENOMEM;
	}
	set_rcvtimeo(sock, timeout_ms);
	ret = cuip_msg_sendv(sock, CUIP_KIND_REQUEST, &req->base, fds_out, nfds);
	if (ret) {
		free(a);
		snprintf(err, errlen, "sending %s: %s", cuip_request_name(req->body_case), strerror(-ret));
		return ret;
	}
	ret = cuip_msg_recv(sock, CUIP_KIND_RESPONSE, &cuip__response__descriptor, &alloc, &m, &fd_in, why,
			    sizeof(why));
	if (fd_in >= 0)
		close(fd_in); /* no response carries a descriptor to the plugin */
	if (ret)
		arena_destroy(a);
	else {
		a->resp = (Cuip__Response *)m;
		pthread_mutex_lock(&live_lock);
		a->next = live;
		live = a;
		pthread_mutex_unlock(&live_lock);
	}
	if (ret) {
		if (ret == -EAGAIN || ret == -EWOULDBLOCK)
			snprintf(err, errlen, "no reply to %s within %u ms", cuip_request_name(req->body_case),
				 timeout_ms);
		else
			snprintf(err, errlen, "%s: %s", cuip_request_name(req->body_case), why);
		return ret == -EAGAIN ? -ETIMEDOUT : ret;
	}
	*resp = (Cuip__Response *)m;
	if ((*resp)->status) {
		ret = (*resp)->status < 0 ? (*resp)->status : -EPROTO;
		snprintf(err, errlen, "%s refused: %s", cuip_request_name(req->body_case),
			 (*resp)->error ? (*resp)->error : strerror(-ret));
		cuip_response_free(*resp);
		*resp = NULL;
		return ret;
	}
	return 0;
}

int cuip_bye(int sock, unsigned timeout_ms)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = NULL;
	char err[256];
	int ret;

	if (sock < 0)
		return 0;
	req.body_case = CUIP__REQUEST__BODY_BYE;
	req.bye = 1;
	ret = cuip_call(sock, &req, -1, timeout_ms, &resp, err, sizeof(err));
	cuip_response_free(resp);
	if (!ret) {
		/* The server closes after its reply; wait for that EOF so the
		 * connection is gone on both ends before CRIU looks at fds. */
		struct pollfd pfd = {.fd = sock, .events = POLLIN};
		char c;

		shutdown(sock, SHUT_WR);
		for (;;) {
			int n = poll(&pfd, 1, timeout_ms ? (int)timeout_ms : -1);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				ret = -ETIMEDOUT;
				break;
			}
			ssize_t r = recv(sock, &c, 1, MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				break;
		}
	}
	close(sock);
	return ret;
}
