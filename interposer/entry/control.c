/*
 * control.c - the per-process control socket and its two threads.
 *
 * Socket: $CUINTERPOSE_SOCKET_DIR/<pid>-<identity as 16 hex>.sock (default
 * directory /run/cuinterpose, created mode 1777; if it is not writable,
 * /tmp/cuinterpose-<uid>, mode 0700). The socket file is 0600 and every
 * connection's peer must be root or our own uid (SO_PEERCRED).
 *
 * "cuip-ctl" accepts connections and reads requests. It answers HANDSHAKE,
 * FETCH_MANY (dups of cached exports, xcache.c, on one reply) and BYE
 * itself: none of them
 * takes the state lock or calls the driver, so an importer is served even
 * while the application or our own op thread is busy. Everything else goes
 * to "cuip-op", one request at a time per connection; that connection is
 * not read again until its answer is sent. During restore the plugin
 * resumes threads named "cuip-*" while the application's stay frozen: these
 * threads rely on no lock an application thread could hold at that point.
 *
 * A malformed message, a failed send or a request before HANDSHAKE closes
 * the connection; wire.c closes any FD that came with it. A request or a
 * reply that cannot be held for want of memory is answered with -ENOMEM
 * instead, and the connection stays. All FDs are close-on-exec.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "cuip.h"
#include "gate.h"
#include "importers.h"
#include "procstat.h"
#include "ops.h"
#include "runtime.h"
#include "thread.h"
#include "xcache.h"

#define MAX_CONNS  64
#define IO_TIMEOUT 10 /* seconds a peer may stall inside one message */

struct conn {
	int fd;
	bool busy; /* its request is with the op thread */
	bool hs;   /* handshake done */
	bool closing;
	bool ckpt; /* sent QUIESCE: it drives a checkpoint */
	bool bye;  /* closed by BYE */
	/* SO_PEERCRED at accept: fetches record it (importers.h) */
	struct cuip_importer peer;
};

struct op_item {
	int idx;
	int sock;
	int fds[CUIP_OP_MAX_FDS]; /* FDs that came with the request */
	size_t nfds;
	Cuip__Request *req;
	struct op_item *next;
};

static int lfd = -1, evfd = -1;
static struct conn conns[MAX_CONNS];
static int nconns;
static pthread_mutex_t op_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t op_cv = PTHREAD_COND_INITIALIZER;
static struct op_item *op_head, *op_tail;
static int done_idx[MAX_CONNS], ndone; /* answered, under op_mu */

/* ---- socket -------------------------------------------------------------- */

static bool dir_usable(const char *d)
{
	return access(d, W_OK | X_OK) == 0;
}

static int sock_dir(char *dir, size_t len)
{
	const char *env = getenv("CUINTERPOSE_SOCKET_DIR");
	const char *d = env && *env ? env : "/run/cuinterpose";
	struct stat st;

	if (strlen(d) >= len) {
		pr_err("socket directory %s is too long for a unix socket path", d);
		return -ENAMETOOLONG;
	}
	if (mkdir(d, 01777) == 0)
		chmod(d, 01777); /* mkdir honours the umask */
	if (dir_usable(d)) {
		snprintf(dir, len, "%s", d);
		return 0;
	}
	snprintf(dir, len, "/tmp/cuinterpose-%u", (unsigned)getuid());
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
		pr_err("%s is not a private directory of uid %u; not creating a control socket", dir,
		       (unsigned)getuid());
		return -EPERM;
	}
	return 0;
}

/* Nobody listens on path (a connect is refused). */
static bool sock_dead(int dfd, const char *name)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[128];
	int s, ret;

	if (snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dfd, name) >= (int)sizeof(sa.sun_path))
		return false;
	strcpy(sa.sun_path, path);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return false;
	ret = connect(s, (struct sockaddr *)&sa, sizeof(sa));
	ret = ret && errno == ECONNREFUSED;
	close(s);
	return ret;
}

/*
 * Remove sockets of processes that no longer exist (killed, or left with
 * _exit): best effort, only ours, only when the pid in the name is gone and
 * nobody listens (the pid may be another namespace's).
 */
static void sock_gc(const char *dir)
{
	struct dirent *de;
	DIR *d = opendir(dir);
	struct stat st;
	char hex[17];
	int pid, n;

	while (d && (de = readdir(d))) {
		n = 0;
		if (sscanf(de->d_name, "%d-%16[0-9a-f].sock%n", &pid, hex, &n) != 2 || de->d_name[n] || pid <= 0)
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH)
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode) &&
		    st.st_uid == geteuid() && sock_dead(dirfd(d), de->d_name))
			unlinkat(dirfd(d), de->d_name, 0);
	}
	if (d)
		closedir(d);
}

static int sock_open(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char dir[sizeof(sa.sun_path)];
	int s, ret;

	ret = sock_dir(dir, sizeof(dir));
	if (ret)
		return ret;
	sock_gc(dir);
	if (snprintf(self.sock, sizeof(self.sock), "%s/%d-%016llx.sock", dir, (int)self.pid,
		     (unsigned long long)self.id) >= (int)sizeof(sa.sun_path)) {
		pr_err("socket path under %s is too long", dir);
		self.sock[0] = 0;
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, self.sock);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	unlink(self.sock);
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || chmod(self.sock, 0600) || listen(s, MAX_CONNS)) {
		ret = -errno;
		pr_err("control socket %s: %s", self.sock, strerror(errno));
		unlink(self.sock);
		close(s);
		self.sock[0] = 0;
		return ret;
	}
	lfd = s;
	return 0;
}

/* ---- replies ------------------------------------------------------------- */

static int reply_status(int fd, int status, const char *msg)
{
	Cuip__Response r = CUIP__RESPONSE__INIT;

	r.status = status;
	r.error = (char *)msg;
	return cuip_msg_send(fd, CUIP_KIND_RESPONSE, &r.base, -1);
}

/* After a send that returned ret: where the reply could not be encoded
 * for want of memory (nothing was sent, wire.h), a bare -ENOMEM status in
 * its place, so that the peer gets an answer to every request and the
 * connection stays framed. */
static int or_enomem(int fd, int ret)
{
	return ret == -ENOMEM ? reply_status(fd, -ENOMEM, "out of memory encoding the reply") : ret;
}

static int send_response(int fd, const Cuip__Response *r)
{
	return or_enomem(fd, cuip_msg_send(fd, CUIP_KIND_RESPONSE, &r->base, -1));
}

static int do_handshake(struct conn *c, const Cuip__Handshake *hs)
{
	Cuip__Response r = CUIP__RESPONSE__INIT;
	Cuip__HandshakeReply h = CUIP__HANDSHAKE_REPLY__INIT;
	Cuip__ProcessId id = CUIP__PROCESS_ID__INIT;
	char msg[128];

	if (hs->protocol != CUIP_FORMAT_VERSION) {
		snprintf(msg, sizeof(msg), "protocol version %u, this interposer speaks version %u", hs->protocol,
			 CUIP_FORMAT_VERSION);
		reply_status(c->fd, -EPROTONOSUPPORT, msg);
		return -EPROTONOSUPPORT;
	}
	id.id = self.id;
	id.pid = self.pid;
	h.self = &id;
	h.phase = cuip_phase();
	/* The job's stderr is where its operator looks first. */
	if (hs->client && !strcmp(hs->client, "guardian") && h.phase != CUIP__PHASE__PHASE_ACTIVE)
		pr_err("pid %d: criu went away in the middle of a checkpoint (phase %s); its guardian is rolling this "
		       "process back",
		       (int)self.pid, cuip_phase_name(h.phase));
	h.version = (char *)CUIP_VERSION;
	r.body_case = CUIP__RESPONSE__BODY_HANDSHAKE;
	r.handshake = &h;
	c->hs = true;
	return send_response(c->fd, &r);
}

/* One status per item and the FDs of the good ones, in order; a bad item
 * costs only its own status. Each serve records the peer as an importer
 * before the reply goes (an INSPECT once the peer holds an FD must see
 * it); a reply that is not sent (the peer gone, out of memory encoding
 * it) takes those records back: the peer never got the memory, and a
 * stale record would refuse later dumps for an importer that is none. */
static int do_fetch_many(struct conn *c, const Cuip__FetchMany *fm)
{
	Cuip__Response r = CUIP__RESPONSE__INIT;
	Cuip__FetchManyReply fr = CUIP__FETCH_MANY_REPLY__INIT;
	int32_t status[CUIP_MSG_MAX_FDS];
	int fds[CUIP_MSG_MAX_FDS], rec[CUIP_MSG_MAX_FDS];
	size_t nfds = 0;
	int ret;

	if (fm->n_items == 0 || fm->n_items > CUIP_MSG_MAX_FDS) {
		char msg[96];

		snprintf(msg, sizeof(msg), "a batched fetch takes 1 to %d allocations, not %zu", CUIP_MSG_MAX_FDS,
			 fm->n_items);
		return reply_status(c->fd, -EINVAL, msg);
	}
	/* Who takes the memory: a checkpoint must know it (importers.h). */
	c->peer.id = fm->has_importer ? fm->importer : 0;
	if (!c->peer.pid && fm->has_importer_pid) {
		c->peer.self_pid = fm->importer_pid;
		c->peer.pid_ns = fm->importer_pid_ns;
		c->peer.self_start = fm->importer_start_time;
	}
	for (size_t i = 0; i < fm->n_items; i++) {
		const Cuip__Fetch *f = fm->items[i];
		int fd;

		rec[i] = 0;
		fd = f && f->alloc ? cuip_xc_dup(f->alloc->creator, f->alloc->serial, f->token.data, f->token.len,
						 c->peer.pid == self.pid ? NULL : &c->peer, &rec[i])
				   : -EINVAL;
		status[i] = fd < 0 ? fd : 0;
		if (fd >= 0)
			fds[nfds++] = fd;
	}
	fr.n_status = fm->n_items;
	fr.status = status;
	r.body_case = CUIP__RESPONSE__BODY_FETCH_MANY;
	r.fetch_many = &fr;
	ret = cuip_msg_sendv(c->fd, CUIP_KIND_RESPONSE, &r.base, fds, nfds);
	for (size_t i = 0; i < nfds; i++) {
		close(fds[i]);
		if (!ret)
			cuip_xc_served();
	}
	/* A partial send may have passed the FDs with a truncated reply: the
	 * client closes what came with a message it cannot read (wire.c). */
	for (size_t i = 0; ret && i < fm->n_items; i++)
		if (status[i] == 0)
			cuip_xc_unrecord(fm->items[i]->alloc->serial, &c->peer, rec[i]);
	return or_enomem(c->fd, ret);
}

/* Read and handle one request; false: close the connection. */
static bool serve_one(int idx)
{
	struct conn *c = &conns[idx];
	Cuip__Request *req = NULL;
	struct op_item *it;
	char err[256] = "";
	int fds[CUIP_OP_MAX_FDS], ret;
	size_t nfds = 0;

	ret = cuip_msg_recvv(c->fd, CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, (ProtobufCMessage **)&req, fds,
			     CUIP_OP_MAX_FDS, &nfds, err, sizeof(err));
	if (ret == -ENOMEM) { /* read past (wire.h): answered, still framed */
		char msg[320];

		snprintf(msg, sizeof(msg), "pid %d: %s", (int)self.pid, err);
		return reply_status(c->fd, -ENOMEM, msg) == 0;
	}
	if (ret) {
		if (ret != -ECONNRESET)
			pr_info("control connection closed: %s", err);
		return false;
	}
	if (!c->hs && req->body_case != CUIP__REQUEST__BODY_HANDSHAKE) {
		reply_status(c->fd, -EPROTO, "HANDSHAKE must come first");
		ret = -EPROTO;
		goto done;
	}
	switch (req->body_case) {
	case CUIP__REQUEST__BODY_HANDSHAKE:
		ret = do_handshake(c, req->handshake);
		break;
	case CUIP__REQUEST__BODY_FETCH_MANY:
		ret = do_fetch_many(c, req->fetch_many);
		break;
	case CUIP__REQUEST__BODY_BYE:
		or_enomem(c->fd, reply_status(c->fd, 0, NULL));
		c->bye = true;
		ret = -ECONNRESET;
		break;
	case CUIP__REQUEST__BODY__NOT_SET:
		reply_status(c->fd, -EPROTO, "empty request");
		ret = -EPROTO;
		break;
	case CUIP__REQUEST__BODY_QUIESCE:
		/* One checkpoint at a time: a QUIESCE while another open
		 * connection drives one (a second criu dump that passed its
		 * handshake before the first closed the gate) is refused, and
		 * the first is left alone. */
		for (int j = 0; j < nconns; j++) {
			char msg[160];

			if (j == idx || conns[j].fd < 0 || !conns[j].ckpt || conns[j].closing)
				continue;
			snprintf(
				msg, sizeof(msg),
				"pid %d: another checkpoint of this process is in progress (phase %s); QUIESCE refused",
				(int)self.pid, cuip_phase_name(cuip_phase()));
			ret = reply_status(c->fd, -EALREADY, msg);
			goto done;
		}
		/* fall through */
	default:
		it = calloc(1, sizeof(*it));
		if (!it) {
			ret = reply_status(c->fd, -ENOMEM, "out of memory");
			break;
		}
		it->idx = idx;
		it->sock = c->fd;
		memcpy(it->fds, fds, nfds * sizeof(*fds));
		it->nfds = nfds;
		it->req = req;
		c->busy = true;
		c->ckpt |= req->body_case == CUIP__REQUEST__BODY_QUIESCE;
		pthread_mutex_lock(&op_mu);
		if (op_tail)
			op_tail->next = it;
		else
			op_head = it;
		op_tail = it;
		pthread_cond_signal(&op_cv);
		pthread_mutex_unlock(&op_mu);
		return true;
	}
done:
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	protobuf_c_message_free_unpacked(&req->base, NULL);
	return ret == 0;
}

static bool peer_allowed(int fd, struct cuip_importer *peer)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		return false;
	/* pid as our pid namespace sees the peer (0: not visible); its start
	 * time now, while it is connected, tells a later reuse of the pid. */
	*peer = (struct cuip_importer){.pid = cr.pid, .uid = cr.uid};
	if (cr.pid > 0 && (!cuip_proc_is_ours() || cuip_proc_stat_start(cr.pid, &peer->start, NULL)))
		peer->start = 0;
	if (cr.uid == 0 || cr.uid == geteuid())
		return true;
	pr_err("refusing control connection from pid %d uid %u", (int)cr.pid, (unsigned)cr.uid);
	return false;
}

static void accept_one(void)
{
	struct timeval tv = {.tv_sec = IO_TIMEOUT};
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	struct cuip_importer peer;
	int i = 0;

	if (fd < 0)
		return;
	while (i < nconns && conns[i].fd >= 0)
		i++;
	if (!peer_allowed(fd, &peer) || i == MAX_CONNS) {
		close(fd);
		return;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	conns[i] = (struct conn){.fd = fd, .peer = peer};
	if (i == nconns)
		nconns++;
}

static void *ctl_main(void *arg)
{
	struct pollfd pfd[MAX_CONNS + 2];
	int map[MAX_CONNS + 2];

	(void)arg;
	pthread_setname_np(pthread_self(), "cuip-ctl");
	for (;;) {
		int n = 0;

		pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = evfd, .events = POLLIN};
		for (int i = 0; i < nconns; i++) {
			if (conns[i].busy || conns[i].fd < 0)
				continue;
			map[n] = i;
			pfd[n++] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
		}
		if (poll(pfd, (nfds_t)n, -1) < 0)
			continue;
		if (pfd[1].revents & POLLIN) {
			uint64_t v;
			(void)!read(evfd, &v, sizeof(v));
			pthread_mutex_lock(&op_mu);
			for (int k = 0; k < ndone; k++) {
				struct conn *c = &conns[done_idx[k]];
				c->busy = false;
			}
			ndone = 0;
			pthread_mutex_unlock(&op_mu);
		}
		for (int k = 2; k < n; k++)
			if (pfd[k].revents && conns[map[k]].fd >= 0 && !serve_one(map[k]))
				conns[map[k]].closing = true;
		/* Compact: indices of busy connections must not move. */
		for (int i = nconns - 1; i >= 0; i--) {
			if (!conns[i].closing)
				continue;
			if (conns[i].ckpt && !conns[i].bye && cuip_phase() != CUIP__PHASE__PHASE_ACTIVE)
				pr_err("pid %d: the checkpoint's control connection was lost in phase %s (criu killed "
				       "or "
				       "crashed?); the gate stays closed until criu's guardian rolls this process back",
				       (int)self.pid, cuip_phase_name(cuip_phase()));
			close(conns[i].fd);
			conns[i] = (struct conn){.fd = -1};
			if (i == nconns - 1)
				nconns--;
		}
		while (nconns > 0 && conns[nconns - 1].fd < 0)
			nconns--;
		if (pfd[0].revents & POLLIN)
			accept_one();
	}
	return NULL;
}

static void *op_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "cuip-op");
	for (;;) {
		struct op_item *it;
		Cuip__Response *resp;
		uint64_t one = 1;
		int sock;

		pthread_mutex_lock(&op_mu);
		while (!op_head)
			pthread_cond_wait(&op_cv, &op_mu);
		it = op_head;
		op_head = it->next;
		if (!op_head)
			op_tail = NULL;
		sock = it->sock;
		pthread_mutex_unlock(&op_mu);

		resp = cuip_op_run(it->req, it->fds, it->nfds);
		if (resp) {
			if (send_response(sock, resp))
				shutdown(sock, SHUT_RDWR); /* ctl sees EOF and closes it */
			cuip_response_free(resp);
		} else {
			reply_status(sock, -ENOMEM, "out of memory building the reply");
		}
		protobuf_c_message_free_unpacked(&it->req->base, NULL);

		pthread_mutex_lock(&op_mu);
		done_idx[ndone++] = it->idx;
		pthread_mutex_unlock(&op_mu);
		free(it);
		(void)!write(evfd, &one, sizeof(one));
	}
	return NULL;
}

int cuip_ctl_start(void)
{
	int ret = sock_open();

	if (ret)
		return ret;
	evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (evfd < 0) {
		ret = -errno;
		goto fail;
	}
	ret = cuip_thread_start(op_main, NULL, "cuip-op", 0);
	if (!ret)
		ret = cuip_thread_start(ctl_main, NULL, "cuip-ctl", 0);
	if (ret)
		goto fail; /* an op thread without a ctl thread just idles */
	return 0;
fail:
	pr_err("cannot start the control threads: %s", strerror(-ret));
	cuip_ctl_stop();
	return ret;
}

static void fork_child(void)
{
	/* Fork child: the threads did not survive; the sockets belong to the
	 * parent (close our copies, never unlink the parent's path). */
	if (lfd >= 0)
		close(lfd);
	if (evfd >= 0)
		close(evfd);
	for (int i = 0; i < nconns; i++)
		if (conns[i].fd >= 0)
			close(conns[i].fd);
	for (struct op_item *it = op_head, *n; it; it = n) {
		n = it->next;
		for (size_t i = 0; i < it->nfds; i++)
			close(it->fds[i]);
		protobuf_c_message_free_unpacked(&it->req->base, NULL);
		free(it);
	}
	op_head = op_tail = NULL;
	lfd = evfd = -1;
	nconns = ndone = 0;
	pthread_mutex_init(&op_mu, NULL);
	pthread_cond_init(&op_cv, NULL);
}
CUIP_FORK_HOOK(control, NULL, NULL, fork_child);

void cuip_ctl_stop(void)
{
	if (self.sock[0])
		unlink(self.sock);
}
