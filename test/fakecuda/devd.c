/*
 * fakecuda-devd: the fake device service.  It owns all device memory (one
 * memfd per physical allocation) and the authoritative device state: capacity
 * per device, allocations and their references, export sockets, legacy IPC
 * tokens, multicast objects with their devices and bindings.
 *
 * Every process that calls cuInit holds one connection (its /dev/nvidia*
 * equivalent).  References are counted per holder: a connection reference
 * (handle or mapping in a process, possibly several), an export socket, a
 * multicast binding.  Physical memory goes away with the last one; a closed
 * connection drops everything it held, like a process exit on a real driver.
 *
 * Single-threaded epoll loop, so no locks.  Started by fakecuda-run (or tests)
 * with --daemon; a flock on SOCKET.lock makes concurrent starts safe.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

#define LOG_PREFIX "fakecuda-devd: "

enum ev_type { EV_LISTEN, EV_CONN, EV_EXPORT };

struct ev {
	enum ev_type type;
};

struct alloc {
	struct alloc *next;
	uint64_t id;
	int dev;
	uint64_t size;
	int memfd;
	int refs;
	uint32_t flags;
	uint64_t ipc_token;
	pid_t creator_pid;
};

struct binding {
	struct binding *next;
	int dev;
	uint64_t mcoff, memoff, size;
	struct alloc *a;
};

struct mcobj {
	struct mcobj *next;
	uint64_t id;
	int ndev;
	uint64_t size, size_eff;
	uint32_t devmask;
	int nadded;
	int refs;
	uint32_t flags;
	uint64_t gen;
	struct binding *b;
};

struct export
{
	struct ev ev;
	struct export *next;
	int fd;
	ino_t peer_ino;
	int kind;
	uint64_t id;
};

struct ref {
	struct ref *next;
	int kind;
	uint64_t id;
};

/* Hash tables: jobs hold tens of thousands of allocations (issue 11), so
 * every lookup by id, by export inode or by reference is a bucket walk. */
#define NBUCKET	 (1u << 16)
#define NREFBUCK 1024u
static unsigned bucket(uint64_t v, unsigned n)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return (unsigned)(v & (n - 1));
}

struct conn {
	struct ev ev;
	struct conn *next;
	int fd;
	pid_t pid;
	struct ref *refs[NREFBUCK]; /* by (kind, id) */
};

static struct {
	int ndev;
	uint64_t capacity;
	uint64_t used[FKW_MAX_DEV];
	struct fkw_dev_info info[FKW_MAX_DEV];
	uint64_t mc_gran, mc_rec_gran, mc_round;
	struct alloc *allocs[NBUCKET]; /* by id */
	struct mcobj *mcs;
	struct export *exports[NBUCKET]; /* by peer_ino */
	struct conn *conns;
	uint64_t next_id;
	int epfd;
	int stop;
	int verbose;
} D = {.next_id = 1};

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	va_list ap;

	if (!D.verbose)
		return;
	va_start(ap, fmt);
	fputs(LOG_PREFIX, stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : def;
}

static void setup_devices(void)
{
	uint64_t seed = env_u64("FAKECUDA_UUID_SEED", 0);
	int i;

	D.ndev = (int)env_u64("FAKECUDA_DEVICES", 1);
	if (D.ndev < 1)
		D.ndev = 1;
	if (D.ndev > FKW_MAX_DEV)
		D.ndev = FKW_MAX_DEV;
	D.capacity = env_u64("FAKECUDA_MEM_MB", 4096) << 20;
	D.mc_gran = env_u64("FAKECUDA_MC_GRANULARITY_MB", 2) << 20;
	D.mc_rec_gran = env_u64("FAKECUDA_MC_REC_GRANULARITY_MB", D.mc_gran >> 20) << 20;
	D.mc_round = env_u64("FAKECUDA_MC_ROUND_MB", 0) << 20;
	for (i = 0; i < D.ndev; i++) {
		uint64_t s = seed * 1000003u + (uint64_t)i + 0x46414b45ull;
		uint64_t a = splitmix(&s), b = splitmix(&s);

		memcpy(D.info[i].uuid, &a, 8);
		memcpy(D.info[i].uuid + 8, &b, 8);
		D.info[i].uuid[6] = (D.info[i].uuid[6] & 0x0f) | 0x40;
		snprintf(D.info[i].name, sizeof(D.info[i].name), "Fake H200");
		D.info[i].total = D.capacity;
	}
}

static struct alloc *find_alloc(uint64_t id)
{
	struct alloc *a;

	for (a = D.allocs[bucket(id, NBUCKET)]; a; a = a->next)
		if (a->id == id)
			return a;
	return NULL;
}

static struct mcobj *find_mc(uint64_t id)
{
	struct mcobj *m;

	for (m = D.mcs; m; m = m->next)
		if (m->id == id)
			return m;
	return NULL;
}

static void alloc_unref(struct alloc *a)
{
	struct alloc **pp;

	if (--a->refs > 0)
		return;
	for (pp = &D.allocs[bucket(a->id, NBUCKET)]; *pp != a; pp = &(*pp)->next)
		;
	*pp = a->next;
	D.used[a->dev] -= a->size;
	close(a->memfd);
	logf_("freed allocation %llu (%llu bytes on device %d)\n", (unsigned long long)a->id,
	      (unsigned long long)a->size, a->dev);
	free(a);
}

static void mc_unref(struct mcobj *m)
{
	struct mcobj **pp;

	if (--m->refs > 0)
		return;
	for (pp = &D.mcs; *pp != m; pp = &(*pp)->next)
		;
	*pp = m->next;
	while (m->b) {
		struct binding *b = m->b;

		m->b = b->next;
		alloc_unref(b->a);
		free(b);
	}
	logf_("freed multicast object %llu\n", (unsigned long long)m->id);
	free(m);
}

static int obj_ref(int kind, uint64_t id)
{
	if (kind == FKW_KIND_ALLOC) {
		struct alloc *a = find_alloc(id);

		if (!a)
			return -1;
		a->refs++;
		return 0;
	}
	if (kind == FKW_KIND_MC) {
		struct mcobj *m = find_mc(id);

		if (!m)
			return -1;
		m->refs++;
		return 0;
	}
	return -1;
}

static void obj_unref(int kind, uint64_t id)
{
	if (kind == FKW_KIND_ALLOC) {
		struct alloc *a = find_alloc(id);

		if (a)
			alloc_unref(a);
	} else if (kind == FKW_KIND_MC) {
		struct mcobj *m = find_mc(id);

		if (m)
			mc_unref(m);
	}
}

/* The connection takes one reference on an object it was just handed. */
static int conn_ref(struct conn *c, int kind, uint64_t id)
{
	struct ref *r = calloc(1, sizeof(*r));

	if (!r || obj_ref(kind, id)) {
		free(r);
		return -1;
	}
	r->kind = kind;
	r->id = id;
	r->next = c->refs[bucket((uint64_t)kind << 56 ^ id, NREFBUCK)];
	c->refs[bucket((uint64_t)kind << 56 ^ id, NREFBUCK)] = r;
	return 0;
}

static int conn_unref(struct conn *c, int kind, uint64_t id)
{
	struct ref **pp;

	for (pp = &c->refs[bucket((uint64_t)kind << 56 ^ id, NREFBUCK)]; *pp; pp = &(*pp)->next) {
		struct ref *r = *pp;

		if (r->kind == kind && r->id == id) {
			*pp = r->next;
			free(r);
			obj_unref(kind, id);
			return 0;
		}
	}
	return -1;
}

static int conn_holds(struct conn *c, int kind, uint64_t id)
{
	struct ref *r;

	for (r = c->refs[bucket((uint64_t)kind << 56 ^ id, NREFBUCK)]; r; r = r->next)
		if (r->kind == kind && r->id == id)
			return 1;
	return 0;
}

static void conn_close(struct conn *c)
{
	struct conn **pp;

	for (pp = &D.conns; *pp != c; pp = &(*pp)->next)
		;
	*pp = c->next;
	epoll_ctl(D.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	for (unsigned b = 0; b < NREFBUCK; b++) {
		while (c->refs[b]) {
			struct ref *r = c->refs[b];

			c->refs[b] = r->next;
			obj_unref(r->kind, r->id);
			free(r);
		}
	}
	logf_("pid %d disconnected\n", (int)c->pid);
	free(c);
}

static void export_close(struct export *e)
{
	struct export **pp;

	for (pp = &D.exports[bucket(e->peer_ino, NBUCKET)]; *pp != e; pp = &(*pp)->next)
		;
	*pp = e->next;
	epoll_ctl(D.epfd, EPOLL_CTL_DEL, e->fd, NULL);
	close(e->fd);
	obj_unref(e->kind, e->id);
	free(e);
}

static int do_alloc(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, int *fds)
{
	struct alloc *a;
	char name[64];

	if (q->dev >= (uint32_t)D.ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (q->size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (q->size > D.capacity - D.used[q->dev])
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = calloc(1, sizeof(*a));
	if (!a)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->id = D.next_id++;
	snprintf(name, sizeof(name), "fakecuda-dev%u-alloc%llu", q->dev, (unsigned long long)a->id);
	a->memfd = memfd_create(name, MFD_CLOEXEC);
	if (a->memfd < 0 || ftruncate(a->memfd, (off_t)q->size) < 0) {
		if (a->memfd >= 0)
			close(a->memfd);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->dev = (int)q->dev;
	a->size = q->size;
	a->flags = q->flags;
	a->creator_pid = c->pid;
	a->next = D.allocs[bucket(a->id, NBUCKET)];
	D.allocs[bucket(a->id, NBUCKET)] = a;
	D.used[a->dev] += a->size;
	if (conn_ref(c, FKW_KIND_ALLOC, a->id)) {
		a->refs = 1;
		alloc_unref(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r->id = a->id;
	fds[r->nfds++] = a->memfd;
	return CUDA_SUCCESS;
}

static int do_export(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, int *fds, int *closefd)
{
	struct epoll_event ee = {.events = EPOLLIN | EPOLLRDHUP};
	struct export *e;
	struct stat st;
	int sv[2];

	if (!conn_holds(c, (int)q->kind, q->id))
		return CUDA_ERROR_INVALID_HANDLE;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e = calloc(1, sizeof(*e));
	if (!e || fstat(sv[1], &st) < 0) {
		free(e);
		close(sv[0]);
		close(sv[1]);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->ev.type = EV_EXPORT;
	e->fd = sv[0];
	e->peer_ino = st.st_ino;
	e->kind = (int)q->kind;
	e->id = q->id;
	obj_ref(e->kind, e->id);
	ee.data.ptr = e;
	epoll_ctl(D.epfd, EPOLL_CTL_ADD, e->fd, &ee);
	e->next = D.exports[bucket(e->peer_ino, NBUCKET)];
	D.exports[bucket(e->peer_ino, NBUCKET)] = e;
	fds[r->nfds++] = sv[1];
	*closefd = sv[1]; /* only the application's copies keep the export alive */
	return CUDA_SUCCESS;
}

static int do_import(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, int *fds, int infd)
{
	struct export *e;
	struct stat st;

	if (infd < 0 || fstat(infd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return CUDA_ERROR_INVALID_VALUE;
	for (e = D.exports[bucket(st.st_ino, NBUCKET)]; e; e = e->next)
		if (e->peer_ino == st.st_ino)
			break;
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	if (conn_ref(c, e->kind, e->id))
		return CUDA_ERROR_INVALID_VALUE;
	r->kind = (uint32_t)e->kind;
	r->id = e->id;
	if (e->kind == FKW_KIND_ALLOC) {
		struct alloc *a = find_alloc(e->id);

		r->size = a->size;
		r->dev = (uint32_t)a->dev;
		r->flags = a->flags;
		r->pid = a->creator_pid;
		fds[r->nfds++] = a->memfd;
	} else {
		struct mcobj *m = find_mc(e->id);

		r->size = m->size;
		r->size2 = m->size_eff;
		r->n = (uint32_t)m->ndev;
		r->flags = m->flags;
	}
	return CUDA_SUCCESS;
}

static int do_ipc_get(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct alloc *a = find_alloc(q->id);

	if (!a || !conn_holds(c, FKW_KIND_ALLOC, q->id))
		return CUDA_ERROR_INVALID_VALUE;
	if (!a->ipc_token) {
		while (!a->ipc_token)
			if (getrandom(&a->ipc_token, sizeof(a->ipc_token), 0) != sizeof(a->ipc_token))
				a->ipc_token = (uint64_t)time(NULL) ^ a->id;
		a->flags |= FKW_AF_IPC;
	}
	r->token = a->ipc_token;
	r->pid = a->creator_pid;
	return CUDA_SUCCESS;
}

static int do_ipc_open(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, int *fds)
{
	struct alloc *a = find_alloc(q->id);

	if (!a || !a->ipc_token || a->ipc_token != q->token)
		return CUDA_ERROR_INVALID_VALUE;
	if (conn_ref(c, FKW_KIND_ALLOC, a->id))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r->id = a->id;
	r->size = a->size;
	r->dev = (uint32_t)a->dev;
	r->pid = a->creator_pid;
	fds[r->nfds++] = a->memfd;
	return CUDA_SUCCESS;
}

static int do_mc_create(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct mcobj *m;
	uint64_t round;

	if (q->n == 0 || q->n > (uint32_t)D.ndev || q->size == 0 || q->size % D.mc_gran)
		return CUDA_ERROR_INVALID_VALUE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	round = D.mc_round ? D.mc_round : D.mc_gran;
	m->id = D.next_id++;
	m->ndev = (int)q->n;
	m->size = q->size;
	m->size_eff = (q->size + round - 1) / round * round;
	m->flags = q->flags;
	m->gen = 1;
	m->next = D.mcs;
	D.mcs = m;
	if (conn_ref(c, FKW_KIND_MC, m->id)) {
		m->refs = 1;
		mc_unref(m);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r->id = m->id;
	r->size = m->size;
	r->size2 = m->size_eff;
	return CUDA_SUCCESS;
}

static int do_mc_add(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct mcobj *m = find_mc(q->id);

	if (!m || !conn_holds(c, FKW_KIND_MC, q->id))
		return CUDA_ERROR_INVALID_HANDLE;
	if (q->dev >= (uint32_t)D.ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (m->devmask & (1u << q->dev) || m->nadded >= m->ndev)
		return CUDA_ERROR_INVALID_VALUE;
	m->devmask |= 1u << q->dev;
	m->nadded++;
	m->gen++;
	return CUDA_SUCCESS;
}

static int do_mc_bind(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct mcobj *m = find_mc(q->id);
	struct alloc *a = find_alloc(q->id2);
	struct binding *b;

	if (!m || !conn_holds(c, FKW_KIND_MC, q->id) || !a || !conn_holds(c, FKW_KIND_ALLOC, q->id2))
		return CUDA_ERROR_INVALID_HANDLE;
	if (q->dev >= (uint32_t)D.ndev || !(m->devmask & (1u << q->dev)))
		return CUDA_ERROR_INVALID_DEVICE;
	if (m->nadded < m->ndev)
		return CUDA_ERROR_NOT_READY; /* the caller waits and retries */
	if (q->size == 0 || q->size % D.mc_gran || q->off % D.mc_gran || q->off2 % FKW_GRANULARITY ||
	    q->off + q->size > m->size_eff || q->off2 + q->size > a->size)
		return CUDA_ERROR_INVALID_VALUE;
	for (b = m->b; b; b = b->next)
		if (b->dev == (int)q->dev && q->off < b->mcoff + b->size && b->mcoff < q->off + q->size)
			return CUDA_ERROR_INVALID_VALUE;
	b = calloc(1, sizeof(*b));
	if (!b)
		return CUDA_ERROR_OUT_OF_MEMORY;
	b->dev = (int)q->dev;
	b->mcoff = q->off;
	b->memoff = q->off2;
	b->size = q->size;
	b->a = a;
	a->refs++;
	b->next = m->b;
	m->b = b;
	m->gen++;
	return CUDA_SUCCESS;
}

static int do_mc_unbind(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct mcobj *m = find_mc(q->id);
	struct binding **pp;

	if (!m || !conn_holds(c, FKW_KIND_MC, q->id))
		return CUDA_ERROR_INVALID_HANDLE;
	for (pp = &m->b; *pp; pp = &(*pp)->next) {
		struct binding *b = *pp;

		if (b->dev == (int)q->dev && b->mcoff == q->off && b->size == q->size) {
			*pp = b->next;
			alloc_unref(b->a);
			free(b);
			m->gen++;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}

static int do_mc_bindings(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, int *fds)
{
	struct mcobj *m = find_mc(q->id);
	struct binding *b;

	if (!m || !conn_holds(c, FKW_KIND_MC, q->id))
		return CUDA_ERROR_INVALID_HANDLE;
	r->gen = m->gen;
	r->n2 = (uint32_t)m->nadded;
	r->flags = m->devmask;
	if (q->gen == m->gen)
		return CUDA_SUCCESS;
	for (b = m->b; b && r->n < FKW_MAX_BIND; b = b->next) {
		struct fkw_binding *w = &r->u.b[r->n++];

		w->dev = (uint32_t)b->dev;
		w->mcoff = b->mcoff;
		w->memoff = b->memoff;
		w->size = b->size;
		w->alloc_size = b->a->size;
		fds[r->nfds++] = b->a->memfd;
	}
	return CUDA_SUCCESS;
}

static void handle_request(struct conn *c)
{
	struct fkw_req q;
	struct fkw_resp r;
	int fds[FKW_MAX_FDS];
	int infd = -1, closefd = -1, nin = 0, res;

	if (fkw_recv(c->fd, &q, sizeof(q), &infd, 1, &nin) < 0) {
		conn_close(c);
		return;
	}
	if (nin == 0)
		infd = -1;
	memset(&r, 0, sizeof(r));
	switch (q.op) {
	case FKW_HELLO:
		c->pid = q.pid;
		r.n = (uint32_t)D.ndev;
		r.mc_gran = D.mc_gran;
		r.mc_rec_gran = D.mc_rec_gran;
		r.gen = FKW_VERSION;
		memcpy(r.u.devs, D.info, sizeof(D.info));
		res = q.n == FKW_VERSION ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		logf_("pid %d connected\n", (int)c->pid);
		break;
	case FKW_MEMINFO:
		if (q.dev >= (uint32_t)D.ndev) {
			res = CUDA_ERROR_INVALID_DEVICE;
			break;
		}
		r.size = D.capacity - D.used[q.dev];
		r.size2 = D.capacity;
		res = CUDA_SUCCESS;
		break;
	case FKW_ALLOC:
		res = do_alloc(c, &q, &r, fds);
		break;
	case FKW_DROP:
		res = conn_unref(c, (int)q.kind, q.id) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
		break;
	case FKW_EXPORT:
		res = do_export(c, &q, &r, fds, &closefd);
		break;
	case FKW_IMPORT:
		res = do_import(c, &q, &r, fds, infd);
		break;
	case FKW_IPC_GET:
		res = do_ipc_get(c, &q, &r);
		break;
	case FKW_IPC_OPEN:
		res = do_ipc_open(c, &q, &r, fds);
		break;
	case FKW_MC_CREATE:
		res = do_mc_create(c, &q, &r);
		break;
	case FKW_MC_ADD:
		res = do_mc_add(c, &q, &r);
		break;
	case FKW_MC_STATUS: {
		struct mcobj *m = find_mc(q.id);

		res = m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
		if (m) {
			r.n = (uint32_t)m->nadded;
			r.n2 = (uint32_t)m->ndev;
		}
		break;
	}
	case FKW_MC_BIND:
		res = do_mc_bind(c, &q, &r);
		break;
	case FKW_MC_UNBIND:
		res = do_mc_unbind(c, &q, &r);
		break;
	case FKW_MC_BINDINGS:
		res = do_mc_bindings(c, &q, &r, fds);
		break;
	case FKW_STATS: {
		struct alloc *a;
		struct mcobj *m;
		struct export *e;

		for (unsigned b = 0; b < NBUCKET; b++) {
			for (a = D.allocs[b]; a; a = a->next)
				r.n++;
			for (e = D.exports[b]; e; e = e->next)
				r.size++;
		}
		for (m = D.mcs; m; m = m->next)
			r.n2++;
		if (q.dev < (uint32_t)D.ndev)
			r.size2 = D.used[q.dev];
		res = CUDA_SUCCESS;
		break;
	}
	case FKW_SHUTDOWN:
		D.stop = 1;
		res = CUDA_SUCCESS;
		break;
	default:
		res = CUDA_ERROR_NOT_SUPPORTED;
		break;
	}
	if (infd >= 0)
		close(infd);
	r.result = res;
	if (res != CUDA_SUCCESS)
		r.nfds = 0;
	if (fkw_send(c->fd, &r, sizeof(r), fds, (int)r.nfds) < 0) {
		if (closefd >= 0)
			close(closefd);
		conn_close(c);
		return;
	}
	if (closefd >= 0)
		close(closefd);
}

static void accept_conn(int lfd)
{
	struct epoll_event ee = {.events = EPOLLIN | EPOLLRDHUP};
	struct conn *c;
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->ev.type = EV_CONN;
	c->fd = fd;
	c->next = D.conns;
	D.conns = c;
	ee.data.ptr = c;
	epoll_ctl(D.epfd, EPOLL_CTL_ADD, fd, &ee);
}

static int write_pidfile(const char *path)
{
	char buf[32];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int n;

	if (fd < 0)
		return -1;
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (write(fd, buf, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	return close(fd);
}

static void usage(void)
{
	fprintf(stderr, "usage: fakecuda-devd [--socket PATH] [--daemon] [--verbose]\n"
			"  device configuration from FAKECUDA_DEVICES, FAKECUDA_MEM_MB, FAKECUDA_UUID_SEED,\n"
			"  FAKECUDA_MC_GRANULARITY_MB, FAKECUDA_MC_REC_GRANULARITY_MB, FAKECUDA_MC_ROUND_MB\n");
}

static void on_term(int sig)
{
	D.stop = 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
					     {"daemon", no_argument, NULL, 'd'},
					     {"verbose", no_argument, NULL, 'v'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[sizeof(sa.sun_path)], lockpath[sizeof(path) + 8], pidpath[sizeof(path) + 8];
	struct epoll_event ee = {.events = EPOLLIN};
	struct sigaction sact = {.sa_handler = on_term};
	struct ev listen_ev = {.type = EV_LISTEN};
	int daemonize = 0, lockfd, lfd, o, pipefd[2] = {-1, -1};
	struct rlimit rl;

	/* One memfd per allocation and a socket per export: as many as the
	 * hard limit allows (a real GPU holds far more allocations than 1024). */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	char *slash;

	fkw_socket_path(path, sizeof(path));
	while ((o = getopt_long(argc, argv, "s:dvh", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			snprintf(path, sizeof(path), "%s", optarg);
			break;
		case 'd':
			daemonize = 1;
			break;
		case 'v':
			D.verbose = 1;
			break;
		default:
			usage();
			return o == 'h' ? 0 : 2;
		}
	}
	if (getenv("FAKECUDA_DEVD_VERBOSE"))
		D.verbose = 1;
	setup_devices();
	snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
	snprintf(pidpath, sizeof(pidpath), "%s.pid", path);
	slash = strrchr(path, '/');
	if (slash && slash != path) {
		*slash = 0;
		mkdir(path, 0755);
		*slash = '/';
	}
	lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lockfd < 0) {
		fprintf(stderr, LOG_PREFIX "cannot open %s: %s\n", lockpath, strerror(errno));
		return 1;
	}
	if (flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		/* Another devd owns this socket: wait until it answers, then we are done. */
		int i;

		for (i = 0; i < 500; i++) {
			int fd = fkw_connect(path);

			if (fd >= 0) {
				close(fd);
				return 0;
			}
			usleep(10000);
		}
		fprintf(stderr, LOG_PREFIX "%s is locked but nobody answers on %s\n", lockpath, path);
		return 1;
	}
	unlink(path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 128) < 0) {
		fprintf(stderr, LOG_PREFIX "cannot listen on %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (daemonize) {
		pid_t pid;
		char c;

		if (pipe2(pipefd, O_CLOEXEC) < 0)
			return 1;
		pid = fork();
		if (pid < 0)
			return 1;
		if (pid > 0) {
			/* The socket is listening already; wait until the daemon is set up. */
			close(pipefd[1]);
			return read(pipefd[0], &c, 1) == 1 ? 0 : 1;
		}
		close(pipefd[0]);
		setsid();
		if (chdir("/") < 0)
			return 1;
		o = open("/dev/null", O_RDWR);
		if (o >= 0) {
			dup2(o, 0);
			dup2(o, 1);
			if (!D.verbose)
				dup2(o, 2);
			if (o > 2)
				close(o);
		}
	}
	write_pidfile(pidpath);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	sigaction(SIGTERM, &sact, NULL);
	sigaction(SIGINT, &sact, NULL);
	D.epfd = epoll_create1(EPOLL_CLOEXEC);
	ee.data.ptr = &listen_ev;
	epoll_ctl(D.epfd, EPOLL_CTL_ADD, lfd, &ee);
	if (pipefd[1] >= 0) {
		if (write(pipefd[1], "y", 1) != 1)
			return 1;
		close(pipefd[1]);
	}
	logf_("serving %d device(s) of %llu MiB on %s\n", D.ndev, (unsigned long long)(D.capacity >> 20), path);
	while (!D.stop) {
		struct epoll_event evs[64];
		int i, n = epoll_wait(D.epfd, evs, 64, -1);

		for (i = 0; i < n && !D.stop; i++) {
			struct ev *e = evs[i].data.ptr;

			if (e->type == EV_LISTEN) {
				accept_conn(lfd);
			} else if (e->type == EV_CONN) {
				struct conn *c = (struct conn *)e;

				if (evs[i].events & EPOLLIN)
					handle_request(c);
				else
					conn_close(c);
				/* handle_request may have freed c: never touch it again here */
			} else {
				/* Any event on an export socket means its last application copy is gone. */
				char buf[16];
				struct export *x = (struct export *)e;

				if (read(x->fd, buf, sizeof(buf)) <= 0)
					export_close(x);
			}
		}
	}
	unlink(path);
	unlink(pidpath);
	return 0;
}
