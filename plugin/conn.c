/*
 * conn.c - control request/response and goodbye; see conn.h.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

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
	case CUIP__REQUEST__BODY_FETCH:
		return "FETCH";
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

void cuip_response_free(Cuip__Response *resp)
{
	if (resp)
		protobuf_c_message_free_unpacked(&resp->base, NULL);
}

int cuip_call(int sock, const Cuip__Request *req, int fd_out, unsigned timeout_ms, Cuip__Response **resp, char *err,
	      size_t errlen)
{
	ProtobufCMessage *m = NULL;
	char why[256] = "";
	int ret, fd_in = -1;

	*resp = NULL;
	set_rcvtimeo(sock, timeout_ms);
	ret = cuip_msg_send(sock, CUIP_KIND_REQUEST, &req->base, fd_out);
	if (ret) {
		snprintf(err, errlen, "sending %s: %s", cuip_request_name(req->body_case), strerror(-ret));
		return ret;
	}
	ret = cuip_msg_recv(sock, CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL, &m, &fd_in, why, sizeof(why));
	if (fd_in >= 0)
		close(fd_in); /* no response carries a descriptor to the plugin */
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
