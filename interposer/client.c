/*
 * client.c - talking to a process's control socket: used by importers to
 * fetch export FDs from creators, by the CLI (inspect) and by tests. Plain
 * functions over wire.c, no state. Every request on a connection follows a
 * HANDSHAKE; a FETCH_MANY is answered with one status per item and the FDs
 * of the good ones (a single fetch is a batch of one).
 */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"
#include "wire.h"

uint64_t cuip_client_identity;
int32_t cuip_client_pid;
uint64_t cuip_client_pid_ns, cuip_client_start;

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

int cuip_client_call(int sock, const Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out, char *err,
		     size_t errlen)
{
	int ret;

	*resp = NULL;
	ret = cuip_msg_send(sock, CUIP_KIND_REQUEST, &req->base, fd_in);
	if (ret) {
		snprintf(err, errlen, "sending the request: %s", strerror(-ret));
		return ret;
	}
	return cuip_msg_recv(sock, CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL, (ProtobufCMessage **)resp,
			     fd_out, err, errlen);
}

int cuip_client_handshake(int sock, const char *client, Cuip__ProcessId *self_out, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Handshake hs = CUIP__HANDSHAKE__INIT;
	Cuip__Response *resp;
	int ret;

	hs.protocol = CUIP_FORMAT_VERSION;
	hs.client = (char *)client;
	req.body_case = CUIP__REQUEST__BODY_HANDSHAKE;
	req.handshake = &hs;
	ret = cuip_client_call(sock, &req, -1, &resp, NULL, err, errlen);
	if (ret)
		return ret;
	if (resp->status || resp->body_case != CUIP__RESPONSE__BODY_HANDSHAKE) {
		ret = resp->status ? resp->status : -EPROTO;
		snprintf(err, errlen, "handshake refused: %s", resp->error ? resp->error : strerror(-ret));
	} else if (self_out) {
		self_out->id = resp->handshake->self->id;
		self_out->pid = resp->handshake->self->pid;
	}
	cuip__response__free_unpacked(resp, NULL);
	return ret;
}

const char *cuip_fetch_refusal(int err)
{
	return err == -ENOENT	? "not exported here (released, or never created by this process)"
	       : err == -EACCES ? "token does not match"
				: strerror(-err);
}

int cuip_fetch_open(const char *path, uint64_t creator, char *err, size_t errlen)
{
	Cuip__ProcessId peer = CUIP__PROCESS_ID__INIT;
	struct timeval tv = {.tv_sec = 30};
	int s, ret;

	s = cuip_client_connect(path);
	if (s < 0) {
		snprintf(err, errlen, "cannot connect to the creator's socket %s: %s", path, strerror(-s));
		return s;
	}
	/* A stopped creator must not hang the importer forever. */
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	ret = cuip_client_handshake(s, "peer", &peer, err, errlen);
	if (!ret && peer.id != creator) {
		snprintf(err, errlen, "socket %s belongs to process %016llx (pid %d), not the creator %016llx", path,
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
		snprintf(err, errlen, "creator refused: allocation %016llx:%llu: %s", (unsigned long long)creator,
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
		snprintf(err, errlen, "a batched fetch takes 1 to %d allocations, not %zu", CUIP_MSG_MAX_FDS, n);
		return -EINVAL;
	}
	fv = calloc(n, sizeof(*fv));
	fp = calloc(n, sizeof(*fp));
	ids = calloc(n, sizeof(*ids));
	if (!fv || !fp || !ids) {
		snprintf(err, errlen, "out of memory");
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
		snprintf(err, errlen, "sending the request: %s", strerror(-ret));
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
		snprintf(err, errlen, "creator refused: %s", resp->error ? resp->error : strerror(-ret));
		goto out;
	}
	if (resp->body_case != CUIP__RESPONSE__BODY_FETCH_MANY || resp->fetch_many->n_status != n) {
		ret = -EPROTO;
		snprintf(err, errlen, "creator answered %zu statuses for %zu allocations",
			 resp->body_case == CUIP__RESPONSE__BODY_FETCH_MANY ? resp->fetch_many->n_status : 0, n);
		goto out;
	}
	for (i = 0; i < n; i++)
		used += resp->fetch_many->status[i] == 0;
	if (used != nfds) {
		ret = -EPROTO;
		snprintf(err, errlen, "creator answered %zu good statuses with %zu descriptors", used, nfds);
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
