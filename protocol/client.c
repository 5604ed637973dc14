/*
 * client.c - the one client of the control protocol; see client.h.
 *
 * One exchange (exchange()) under everything: the raw call, the checked
 * request (timeout, refusal turned into an error), the handshake, the
 * goodbye and the batched FETCH. A FETCH_MANY is answered with one status
 * per item and the FDs of the good ones (a single fetch is a batch of one).
 *
 * Checked responses are decoded into an arena (arena.h): an INSPECT answer
 * holds tens of thousands of records, and protobuf-c's default allocator
 * makes a malloc (and later a free) per record, field array and byte
 * string. The arena of a response is found again through a short list of
 * live responses (a few per participant; the plugin's phases decode on
 * several threads), guarded by live_lock. The handshake and the FETCHes,
 * the interposer's only uses, decode with the default allocator and never
 * touch that list.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "arena.h"
#include "client.h"
#include "errfmt.h"
#include "gphase.h"
#include "wire.h"

uint64_t cuip_client_identity;
int32_t cuip_client_pid;
uint64_t cuip_client_pid_ns, cuip_client_start;

const char *cuip_request_name(int c)
{
	enum cuip_gphase ph = cuip_gphase_of_request(c);

	if (ph != CUIP_GPHASE_NONE)
		return cuip_gphase_name(ph);
	switch (c) {
	case CUIP__REQUEST__BODY_FETCH_MANY:
		return "FETCH_MANY";
	case CUIP__REQUEST__BODY_BYE:
		return "BYE";
	}
	return "?";
}

int cuip_client_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int s, ret;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		close(s);
		return ret;
	}
	return s;
}

static void set_timeo(int sock, int opt, unsigned ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	setsockopt(sock, SOL_SOCKET, opt, &tv, sizeof(tv));
}

void cuip_client_timeout(int sock, unsigned ms)
{
	set_timeo(sock, SO_RCVTIMEO, ms);
	set_timeo(sock, SO_SNDTIMEO, ms);
}

/* Send req, receive the response decoded with alloc (NULL: protobuf-c's
 * default); *resp is NULL on failure. */
static int exchange(int sock, const Cuip__Request *req, const int *fds, size_t nfds, ProtobufCAllocator *alloc,
		    Cuip__Response **resp, int *fd_recv, char *err, size_t errlen)
{
	const char *name = cuip_request_name(req->body_case);
	ProtobufCMessage *m = NULL;
	char why[256] = "";
	int ret;

	*resp = NULL;
	if (fd_recv)
		*fd_recv = -1;
	ret = cuip_msg_sendv(sock, CUIP_KIND_REQUEST, &req->base, fds, nfds);
	if (ret) {
		errfmt(err, errlen, "sending %s: %s", name, strerror(-ret));
		return ret;
	}
	ret = cuip_msg_recv(sock, CUIP_KIND_RESPONSE, &cuip__response__descriptor, alloc, &m, fd_recv, why,
			    sizeof(why));
	if (ret) {
		errfmt(err, errlen, "%s: %s", name, why);
		return ret;
	}
	*resp = (Cuip__Response *)m;
	return 0;
}

int cuip_client_call(int sock, const Cuip__Request *req, int fd_send, Cuip__Response **resp, int *fd_recv, char *err,
		     size_t errlen)
{
	return exchange(sock, req, &fd_send, fd_send >= 0, NULL, resp, fd_recv, err, errlen);
}

/* The exchange within timeout_ms, a refusal turned into its status (the
 * response, if any, is still the caller's to free). */
static int checked(int sock, const Cuip__Request *req, const int *fds, size_t nfds, unsigned timeout_ms,
		   ProtobufCAllocator *alloc, Cuip__Response **resp, char *err, size_t errlen)
{
	const char *name = cuip_request_name(req->body_case);
	int ret;

	set_timeo(sock, SO_RCVTIMEO, timeout_ms);
	ret = exchange(sock, req, fds, nfds, alloc, resp, NULL, err, errlen);
	if (ret == -EAGAIN || ret == -EWOULDBLOCK) {
		errfmt(err, errlen, "no reply to %s within %u ms", name, timeout_ms);
		return -ETIMEDOUT;
	}
	if (!ret && (*resp)->status) {
		ret = (*resp)->status < 0 ? (*resp)->status : -EPROTO;
		errfmt(err, errlen, "%s refused: %s", name, (*resp)->error ? (*resp)->error : strerror(-ret));
	}
	return ret;
}

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

void cuip_client_free(Cuip__Response *resp)
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

int cuip_client_request(int sock, const Cuip__Request *req, int fd_send, unsigned timeout_ms, Cuip__Response **resp,
			char *err, size_t errlen)
{
	return cuip_client_requestv(sock, req, &fd_send, fd_send >= 0, timeout_ms, resp, err, errlen);
}

int cuip_client_requestv(int sock, const Cuip__Request *req, const int *fds, size_t nfds, unsigned timeout_ms,
			 Cuip__Response **resp, char *err, size_t errlen)
{
	struct live *a = calloc(1, sizeof(*a));
	ProtobufCAllocator alloc = {.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
	int ret;

	*resp = NULL;
	if (!a) {
		errfmt(err, errlen, "%s: out of memory", cuip_request_name(req->body_case));
		return -ENOMEM;
	}
	ret = checked(sock, req, fds, nfds, timeout_ms, &alloc, resp, err, errlen);
	if (ret) {
		*resp = NULL; /* a refusal lives in the arena too */
		arena_destroy(a);
		return ret;
	}
	a->resp = *resp;
	pthread_mutex_lock(&live_lock);
	a->next = live;
	live = a;
	pthread_mutex_unlock(&live_lock);
	return 0;
}

int cuip_client_handshake(int sock, const char *client, unsigned timeout_ms, struct cuip_peer *peer, char *err,
			  size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Handshake hs = CUIP__HANDSHAKE__INIT;
	Cuip__Response *resp = NULL;
	int ret;

	hs.protocol = CUIP_FORMAT_VERSION;
	hs.client = (char *)client;
	req.body_case = CUIP__REQUEST__BODY_HANDSHAKE;
	req.handshake = &hs;
	ret = checked(sock, &req, NULL, 0, timeout_ms, NULL, &resp, err, errlen);
	if (!ret && (resp->body_case != CUIP__RESPONSE__BODY_HANDSHAKE || !resp->handshake->self)) {
		errfmt(err, errlen, "HANDSHAKE reply carries no identity");
		ret = -EPROTO;
	}
	if (!ret && peer) {
		peer->id = resp->handshake->self->id;
		peer->pid = resp->handshake->self->pid;
		peer->phase = resp->handshake->phase;
	}
	if (resp)
		cuip__response__free_unpacked(resp, NULL);
	return ret;
}

int cuip_client_bye(int sock, unsigned timeout_ms)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = NULL;
	char err[256];
	int ret;

	if (sock < 0)
		return 0;
	req.body_case = CUIP__REQUEST__BODY_BYE;
	req.bye = 1;
	ret = checked(sock, &req, NULL, 0, timeout_ms, NULL, &resp, err, sizeof(err));
	if (resp)
		cuip__response__free_unpacked(resp, NULL);
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

const char *cuip_fetch_refusal(int err)
{
	return err == -ENOENT	? "not exported here (released, or never created by this process)"
	       : err == -EACCES ? "token does not match"
				: strerror(-err);
}

#define FETCH_TIMEOUT_MS 30000

int cuip_fetch_open(const char *path, uint64_t creator, char *err, size_t errlen)
{
	struct cuip_peer peer = {0};
	int s, ret;

	s = cuip_client_connect(path);
	if (s < 0) {
		errfmt(err, errlen, "cannot connect to the creator's socket %s: %s", path, strerror(-s));
		return s;
	}
	/* A stopped creator must not hang the importer forever. */
	cuip_client_timeout(s, FETCH_TIMEOUT_MS);
	ret = cuip_client_handshake(s, "peer", FETCH_TIMEOUT_MS, &peer, err, errlen);
	if (!ret && peer.id != creator) {
		errfmt(err, errlen, "socket %s belongs to process %016llx (pid %d), not the creator %016llx", path,
		       (unsigned long long)peer.id, peer.pid, (unsigned long long)creator);
		ret = -ESRCH;
	}
	if (ret) {
		close(s);
		return ret;
	}
	return s;
}

int cuip_fetch(const char *path, uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, char *err,
	       size_t errlen)
{
	int s = cuip_fetch_open(path, creator, err, errlen), fd;

	if (s < 0)
		return s;
	fd = cuip_fetch_on(s, creator, serial, token, toklen, err, errlen);
	close(s);
	return fd;
}

int cuip_fetch_on(int s, uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, char *err,
		  size_t errlen)
{
	struct cuip_fetch_item it = {.serial = serial, .token = token, .toklen = toklen, .fd = -1};
	int ret = cuip_fetch_many_on(s, creator, &it, 1, err, errlen);

	if (ret)
		return ret;
	if (it.fd < 0)
		errfmt(err, errlen, "creator refused: allocation %016llx:%llu: %s", (unsigned long long)creator,
		       (unsigned long long)serial, cuip_fetch_refusal(it.fd));
	return it.fd;
}

int cuip_fetch_many_send(int s, uint64_t creator, const struct cuip_fetch_item *items, size_t n, char *err,
			 size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__FetchMany fm = CUIP__FETCH_MANY__INIT;
	Cuip__Fetch *fv = NULL, **fp = NULL;
	Cuip__AllocId *ids = NULL;
	size_t i;
	int ret;

	if (n == 0 || n > CUIP_MSG_MAX_FDS) {
		errfmt(err, errlen, "a batched fetch takes 1 to %d allocations, not %zu", CUIP_MSG_MAX_FDS, n);
		return -EINVAL;
	}
	fv = calloc(n, sizeof(*fv));
	fp = calloc(n, sizeof(*fp));
	ids = calloc(n, sizeof(*ids));
	if (!fv || !fp || !ids) {
		errfmt(err, errlen, "out of memory");
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		cuip__alloc_id__init(&ids[i]);
		ids[i].creator = creator;
		ids[i].serial = items[i].serial;
		cuip__fetch__init(&fv[i]);
		fv[i].alloc = &ids[i];
		fv[i].token.data = (uint8_t *)items[i].token;
		fv[i].token.len = items[i].toklen;
		fp[i] = &fv[i];
	}
	fm.n_items = n;
	fm.items = fp;
	if (cuip_client_identity) {
		fm.has_importer = 1;
		fm.importer = cuip_client_identity;
	}
	if (cuip_client_pid) {
		fm.has_importer_pid = fm.has_importer_pid_ns = fm.has_importer_start_time = 1;
		fm.importer_pid = cuip_client_pid;
		fm.importer_pid_ns = cuip_client_pid_ns;
		fm.importer_start_time = cuip_client_start;
	}
	req.body_case = CUIP__REQUEST__BODY_FETCH_MANY;
	req.fetch_many = &fm;
	ret = cuip_msg_send(s, CUIP_KIND_REQUEST, &req.base, -1);
	if (ret)
		errfmt(err, errlen, "sending the request: %s", strerror(-ret));
out:
	free(fv);
	free(fp);
	free(ids);
	return ret;
}

int cuip_fetch_many_recv(int s, struct cuip_fetch_item *items, size_t n, char *err, size_t errlen)
{
	Cuip__Response *resp = NULL;
	int fds[CUIP_MSG_MAX_FDS];
	size_t nfds = 0, used = 0, i;
	int ret;

	ret = cuip_msg_recvv(s, CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL, (ProtobufCMessage **)&resp, fds,
			     n, &nfds, err, errlen);
	if (ret)
		return ret;
	if (resp->status) {
		ret = resp->status;
		errfmt(err, errlen, "creator refused: %s", resp->error ? resp->error : strerror(-ret));
		goto out;
	}
	if (resp->body_case != CUIP__RESPONSE__BODY_FETCH_MANY || resp->fetch_many->n_status != n) {
		ret = -EPROTO;
		errfmt(err, errlen, "creator answered %zu statuses for %zu allocations",
		       resp->body_case == CUIP__RESPONSE__BODY_FETCH_MANY ? resp->fetch_many->n_status : 0, n);
		goto out;
	}
	for (i = 0; i < n; i++)
		used += resp->fetch_many->status[i] == 0;
	if (used != nfds) {
		ret = -EPROTO;
		errfmt(err, errlen, "creator answered %zu good statuses with %zu descriptors", used, nfds);
		goto out;
	}
	for (i = 0, used = 0; i < n; i++) {
		int st = resp->fetch_many->status[i];

		items[i].fd = st ? (st < 0 ? st : -EPROTO) : fds[used++];
	}
	nfds = 0;
out:
	while (nfds)
		close(fds[--nfds]);
	cuip__response__free_unpacked(resp, NULL);
	return ret;
}

int cuip_fetch_many_on(int s, uint64_t creator, struct cuip_fetch_item *items, size_t n, char *err, size_t errlen)
{
	int ret = cuip_fetch_many_send(s, creator, items, n, err, errlen);

	return ret ? ret : cuip_fetch_many_recv(s, items, n, err, errlen);
}
