/*
 * fakecuda-devd: the fake device service.  It owns all device memory and the
 * authoritative device state: capacity per device, allocations and their
 * references, export sockets, legacy IPC tokens, multicast objects with their
 * devices and bindings.
 *
 * Device memory is one sparse memfd per device, the arena.  An allocation is
 * an offset range handed out by a bump pointer (offsets are never reused, so
 * a stale mapping can never see another allocation's bytes); freeing punches
 * the range out (the pages really return).  Each connection receives the
 * arena descriptors once, at HELLO.  So devd holds O(devices + connections +
 * live exports) descriptors, whatever the number of allocations.
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

#include "devdwire.h"

#define LOG_PREFIX "fakecuda-devd: "

enum ev_type { EV_LISTEN, EV_CONN, EV_EXPORT };

struct ev {
	enum ev_type type;
};

/*
 * Records come one malloc each, or many in one block (the allocations of an
 * FKW_ALLOC_BATCH and their connection references: a native restore creates
 * thousands at once).  A block is freed with its last live record; blk is
 * NULL for a record of its own.
 */
struct blk {
	size_t live;
};

static void *blk_new(size_t n, size_t recsz, struct blk **out)
{
	size_t hdr = (sizeof(struct blk) + 15) / 16 * 16;
	struct blk *b = calloc(1, hdr + n * recsz);

	if (!b)
		return NULL;
	b->live = n;
	*out = b;
	return (char *)b + hdr;
}

static void rec_free(void *rec, struct blk *b)
{
	if (!b)
		free(rec);
	else if (--b->live == 0)
		free(b);
}

struct alloc {
	struct alloc *next;
	struct blk *blk;
	uint64_t id;
	int dev;
	uint64_t size;
	uint64_t off; /* in D.arena[dev] */
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

/* devd's end of an export socketpair: its EOF is the last application copy closing. */
struct export
{
	struct ev ev;
	int fd;
	int kind;
	uint64_t id;
};

struct ref {
	struct ref *next;
	struct blk *blk;
	int kind;
	uint64_t id;
};

/* Hash tables: jobs hold tens of thousands of allocations (issue 11), so
 * every lookup by id or by reference is a bucket walk.  Both kinds double
 * (x4) when they hold more than two records per bucket, so walks stay short
 * however many a job holds; a failed resize keeps the old table (slower, as
 * correct). */
#define NBUCKET0  (1u << 16)
#define NREFBUCK0 256u
static unsigned bucket(uint64_t v, unsigned n)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return (unsigned)(v & (n - 1));
}

/*
 * The library sends one-way messages in batches (many records on one
 * sendmsg, the descriptors of their EXPORT/IMPORT_REF records on its first
 * byte), so devd reads a connection through a buffer, many records per
 * recvmsg, and keeps the descriptors that arrived in a FIFO from which those
 * records take theirs in order.
 */
#define IN_CAP	(64u << 10)
#define FDQ_CAP 1024u

struct conn {
	struct ev ev;
	struct conn *next;
	int fd;
	pid_t pid;
	struct ref **refs; /* by (kind, id): nrefbuck buckets */
	unsigned nrefbuck;
	size_t nrefs;
	size_t in_off, in_len; /* unread bytes: in[in_off, in_len) */
	unsigned fdq_head, fdq_n;
	int fdq[FDQ_CAP];
	int broken; /* a descriptor was lost: the FIFO no longer matches the records */
	unsigned char in[IN_CAP];
};

/* A freed arena range waiting to be punched out. */
struct range {
	uint64_t off, len;
	int dev;
};

static struct {
	struct fkw_config cfg; /* as read at start; handed over at HELLO */
	int ndev;
	uint64_t capacity;
	uint64_t used[FKW_MAX_DEV];
	struct fkw_dev_info info[FKW_MAX_DEV];
	uint64_t mc_gran, mc_rec_gran, mc_round;
	int arena[FKW_MAX_DEV];		  /* one sparse memfd per device */
	uint64_t arena_len[FKW_MAX_DEV];  /* its size (grown with ftruncate) */
	uint64_t arena_next[FKW_MAX_DEV]; /* bump pointer: offsets are never reused */
	uint64_t page;
	struct alloc **allocs; /* by id: nbucket buckets */
	unsigned nbucket;
	uint64_t nallocs;
	struct range *punch; /* freed arena ranges not yet punched out (punch_flush) */
	size_t npunch, punch_cap;
	struct mcobj *mcs;
	uint64_t nexports; /* live exports (each held by its socket's epoll entry) */
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

/* Arenas grow in steps of this much (sparse: only written pages cost memory). */
#define ARENA_STEP (1ull << 34)

static int setup_arenas(void)
{
	D.page = (uint64_t)sysconf(_SC_PAGESIZE);
	for (int i = 0; i < D.ndev; i++) {
		char name[32];

		snprintf(name, sizeof(name), "fakecuda-dev%d", i);
		D.arena[i] = memfd_create(name, MFD_CLOEXEC);
		if (D.arena[i] < 0) {
			fprintf(stderr, LOG_PREFIX "cannot create the arena of device %d: %s\n", i, strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* A fresh range of size bytes in dev's arena (page aligned), or -1. */
static int64_t arena_take(int dev, uint64_t size)
{
	uint64_t off = D.arena_next[dev];
	uint64_t end = off + (size + D.page - 1) / D.page * D.page;

	if (end > D.arena_len[dev]) {
		uint64_t len = (end + ARENA_STEP - 1) / ARENA_STEP * ARENA_STEP;

		if (ftruncate(D.arena[dev], (off_t)len) < 0) {
			logf_("cannot grow the arena of device %d to %llu bytes: %s\n", dev, (unsigned long long)len,
			      strerror(errno));
			return -1;
		}
		D.arena_len[dev] = len;
	}
	D.arena_next[dev] = end;
	return (int64_t)off;
}

static void arena_punch(int dev, uint64_t off, uint64_t size)
{
	if (fallocate(D.arena[dev], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)size) < 0)
		logf_("cannot free %llu bytes at %llu of device %d: %s\n", (unsigned long long)size,
		      (unsigned long long)off, dev, strerror(errno));
}

/*
 * Freed ranges are punched out in bulk.  A closing connection (an exit, a
 * native checkpoint) frees thousands of allocations at once, mostly adjacent
 * in the arena (the bump pointer hands a batch out in order), and every
 * fallocate walks each process's mapping of the arena (unmap_mapping_range)
 * besides freeing the pages.  So a free only queues its range; punch_flush
 * sorts the queue, merges adjacent ranges and punches each merged range once.
 * It runs before any response is sent (a process that asks after its
 * release finds the pages gone) and at the end of every epoll wakeup.
 */
static void arena_free(int dev, uint64_t off, uint64_t size)
{
	uint64_t len = (size + D.page - 1) / D.page * D.page; /* what arena_take handed out */

	if (D.npunch == D.punch_cap) {
		size_t cap = D.punch_cap ? D.punch_cap * 2 : 1024;
		struct range *q = realloc(D.punch, cap * sizeof(*q));

		if (!q) {
			arena_punch(dev, off, len);
			return;
		}
		D.punch = q;
		D.punch_cap = cap;
	}
	D.punch[D.npunch++] = (struct range){.off = off, .len = len, .dev = dev};
}

static int range_cmp(const void *pa, const void *pb)
{
	const struct range *a = pa, *b = pb;

	if (a->dev != b->dev)
		return a->dev < b->dev ? -1 : 1;
	return a->off < b->off ? -1 : a->off > b->off;
}

static void punch_flush(void)
{
	size_t i, n = D.npunch;

	if (n == 0)
		return;
	qsort(D.punch, n, sizeof(*D.punch), range_cmp);
	for (i = 0; i < n;) {
		struct range m = D.punch[i];

		for (i++; i < n && D.punch[i].dev == m.dev && D.punch[i].off <= m.off + m.len; i++)
			if (D.punch[i].off + D.punch[i].len > m.off + m.len)
				m.len = D.punch[i].off + D.punch[i].len - m.off;
		arena_punch(m.dev, m.off, m.len);
	}
	D.npunch = 0;
	if (D.punch_cap > 65536) { /* a huge close is over: give the queue back */
		free(D.punch);
		D.punch = NULL;
		D.punch_cap = 0;
	}
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void setup_devices(void)
{
	uint64_t seed;
	int i;

	fkw_config_from_env(&D.cfg);
	seed = D.cfg.uuid_seed;
	D.ndev = (int)D.cfg.devices;
	D.capacity = D.cfg.mem_mb << 20;
	D.mc_gran = D.cfg.mc_gran_mb << 20;
	D.mc_rec_gran = D.cfg.mc_rec_gran_mb << 20;
	D.mc_round = D.cfg.mc_round_mb << 20;
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

static void allocs_index(struct alloc *a)
{
	unsigned b = bucket(a->id, D.nbucket);

	a->next = D.allocs[b];
	D.allocs[b] = a;
	D.nallocs++;
	if (D.nallocs > 2ull * D.nbucket) {
		unsigned nb = D.nbucket * 4;
		struct alloc **t = calloc(nb, sizeof(*t));

		if (!t)
			return;
		for (unsigned i = 0; i < D.nbucket; i++)
			while (D.allocs[i]) {
				struct alloc *x = D.allocs[i];

				D.allocs[i] = x->next;
				x->next = t[bucket(x->id, nb)];
				t[bucket(x->id, nb)] = x;
			}
		free(D.allocs);
		D.allocs = t;
		D.nbucket = nb;
	}
}

static struct alloc *find_alloc(uint64_t id)
{
	struct alloc *a;

	for (a = D.allocs[bucket(id, D.nbucket)]; a; a = a->next)
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
	for (pp = &D.allocs[bucket(a->id, D.nbucket)]; *pp != a; pp = &(*pp)->next)
		;
	*pp = a->next;
	D.used[a->dev] -= a->size;
	D.nallocs--;
	arena_free(a->dev, a->off, a->size);
	logf_("freed allocation %llu (%llu bytes on device %d)\n", (unsigned long long)a->id,
	      (unsigned long long)a->size, a->dev);
	rec_free(a, a->blk);
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

static unsigned ref_bucket(const struct conn *c, int kind, uint64_t id)
{
	return bucket((uint64_t)kind << 56 ^ id, c->nrefbuck);
}

static void refs_grow(struct conn *c)
{
	unsigned nb = c->nrefbuck * 4;
	struct ref **t = calloc(nb, sizeof(*t));

	if (!t)
		return;
	for (unsigned i = 0; i < c->nrefbuck; i++)
		while (c->refs[i]) {
			struct ref *x = c->refs[i];
			unsigned b = bucket((uint64_t)x->kind << 56 ^ x->id, nb);

			c->refs[i] = x->next;
			x->next = t[b];
			t[b] = x;
		}
	free(c->refs);
	c->refs = t;
	c->nrefbuck = nb;
}

/*
 * The connection takes one reference on an object it was just handed, in r
 * (a record of a block, see struct blk) or in a record of its own (r NULL).
 */
static int conn_ref_in(struct conn *c, int kind, uint64_t id, struct ref *r)
{
	unsigned b;

	if (!r && !(r = calloc(1, sizeof(*r))))
		return -1;
	if (obj_ref(kind, id)) {
		rec_free(r, r->blk);
		return -1;
	}
	r->kind = kind;
	r->id = id;
	b = ref_bucket(c, kind, id);
	r->next = c->refs[b];
	c->refs[b] = r;
	if (++c->nrefs > 2ull * c->nrefbuck)
		refs_grow(c);
	return 0;
}

static int conn_ref(struct conn *c, int kind, uint64_t id)
{
	return conn_ref_in(c, kind, id, NULL);
}

static int conn_unref(struct conn *c, int kind, uint64_t id)
{
	struct ref **pp;

	for (pp = &c->refs[ref_bucket(c, kind, id)]; *pp; pp = &(*pp)->next) {
		struct ref *r = *pp;

		if (r->kind == kind && r->id == id) {
			*pp = r->next;
			c->nrefs--;
			rec_free(r, r->blk);
			obj_unref(kind, id);
			return 0;
		}
	}
	return -1;
}

static int conn_holds(struct conn *c, int kind, uint64_t id)
{
	struct ref *r;

	for (r = c->refs[ref_bucket(c, kind, id)]; r; r = r->next)
		if (r->kind == kind && r->id == id)
			return 1;
	return 0;
}

/*
 * Reads what the socket has (waiting for something if block) into c->in,
 * descriptors into the FIFO.  >0 bytes read, 0 EOF, -1 nothing now or error
 * (errno).
 */
static ssize_t conn_fill(struct conn *c, int block)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FKW_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	struct cmsghdr *cm;
	ssize_t n;

	if (c->in_off > 0) {
		memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
		c->in_len -= c->in_off;
		c->in_off = 0;
	}
	iov.iov_base = c->in + c->in_len;
	iov.iov_len = IN_CAP - c->in_len;
	do {
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (int k = 0; k < cnt; k++) {
			int v;

			memcpy(&v, CMSG_DATA(cm) + sizeof(int) * (size_t)k, sizeof(v));
			if (c->fdq_n < FDQ_CAP) {
				c->fdq[(c->fdq_head + c->fdq_n) % FDQ_CAP] = v;
				c->fdq_n++;
			} else {
				close(v);
				c->broken = 1;
			}
		}
	}
	c->broken |= (mh.msg_flags & MSG_CTRUNC) != 0;
	c->in_len += (size_t)n;
	if (c->broken) {
		/* Descriptors pair with records in order: after a lost one,
		 * every later EXPORT/IMPORT_REF would take the wrong one. */
		logf_("pid %d: a descriptor was lost (truncated or too many in flight): dropping the connection\n",
		      (int)c->pid);
		errno = EPROTO;
		return -1;
	}
	return n;
}

/* Exactly len bytes of c's stream (from the buffer, then waiting for the rest). */
static int conn_read(struct conn *c, void *buf, size_t len)
{
	unsigned char *p = buf;

	while (len > 0) {
		size_t k = c->in_len - c->in_off;

		if (k == 0) {
			if (c->broken || conn_fill(c, 1) <= 0)
				return -1;
			continue;
		}
		if (k > len)
			k = len;
		memcpy(p, c->in + c->in_off, k);
		c->in_off += k;
		p += k;
		len -= k;
	}
	return 0;
}

/* The next descriptor that came with c's messages, or -1. */
static int conn_pop_fd(struct conn *c)
{
	int fd;

	if (c->fdq_n == 0)
		return -1;
	fd = c->fdq[c->fdq_head];
	c->fdq_head = (c->fdq_head + 1) % FDQ_CAP;
	c->fdq_n--;
	return fd;
}

static void conn_close(struct conn *c)
{
	struct conn **pp;

	for (pp = &D.conns; *pp != c; pp = &(*pp)->next)
		;
	*pp = c->next;
	epoll_ctl(D.epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	while (c->fdq_n > 0)
		close(conn_pop_fd(c));
	for (unsigned b = 0; b < c->nrefbuck; b++) {
		while (c->refs[b]) {
			struct ref *r = c->refs[b];

			c->refs[b] = r->next;
			obj_unref(r->kind, r->id);
			rec_free(r, r->blk);
		}
	}
	logf_("pid %d disconnected\n", (int)c->pid);
	free(c->refs);
	free(c);
}

static void export_close(struct export *e)
{
	D.nexports--;
	epoll_ctl(D.epfd, EPOLL_CTL_DEL, e->fd, NULL);
	close(e->fd);
	obj_unref(e->kind, e->id);
	free(e);
}

/*
 * A new allocation with one reference held by c, or a CUresult.  Its record
 * and c's reference record are a and r when the caller has them (records of
 * a block, zeroed), else allocated here.
 */
static int alloc_new(struct conn *c, uint32_t dev, uint64_t size, uint32_t flags, struct alloc *a, struct ref *r,
		     struct alloc **out)
{
	int64_t off = -1;
	int res = CUDA_ERROR_OUT_OF_MEMORY;

	if (dev >= (uint32_t)D.ndev)
		res = CUDA_ERROR_INVALID_DEVICE;
	else if (size == 0)
		res = CUDA_ERROR_INVALID_VALUE;
	else if (size <= D.capacity - D.used[dev] && (a || (a = calloc(1, sizeof(*a)))) &&
		 (off = arena_take((int)dev, size)) >= 0)
		res = CUDA_SUCCESS;
	if (res != CUDA_SUCCESS) {
		if (a)
			rec_free(a, a->blk);
		if (r)
			rec_free(r, r->blk);
		return res;
	}
	a->id = D.next_id++;
	a->off = (uint64_t)off;
	a->dev = (int)dev;
	a->size = size;
	a->flags = flags;
	a->creator_pid = c->pid;
	allocs_index(a);
	D.used[a->dev] += a->size;
	if (conn_ref_in(c, FKW_KIND_ALLOC, a->id, r)) {
		a->refs = 1;
		alloc_unref(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = a;
	return CUDA_SUCCESS;
}

static int do_alloc(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
{
	struct alloc *a;
	int res = alloc_new(c, q->dev, q->size, q->flags, NULL, NULL, &a);

	if (res == CUDA_SUCCESS) {
		r->id = a->id;
		r->off = a->off;
	}
	return res;
}

/*
 * Native restore re-creates all of a process's allocations at once: one
 * round trip however many there are, their records and c's references in two
 * blocks (struct blk).  All or nothing: a failure takes back what this
 * request created.  The entries follow the request on the stream.
 */
static int do_alloc_batch(struct conn *c, const struct fkw_req *q, struct fkw_resp *r, struct fkw_alloc_ret **out)
{
	struct fkw_alloc_ent *ent = NULL;
	struct fkw_alloc_ret *ret = NULL;
	struct alloc *arec = NULL;
	struct ref *rrec = NULL;
	struct blk *ablk = NULL, *rblk = NULL;
	uint32_t i;
	int res = CUDA_SUCCESS;

	if (q->n > FKW_MAX_BATCH)
		return -1; /* cannot resynchronize with the stream */
	if (q->n) {
		ent = malloc(sizeof(*ent) * q->n);
		ret = malloc(sizeof(*ret) * q->n);
		if (!ent || !ret || conn_read(c, ent, sizeof(*ent) * q->n) < 0) {
			free(ent);
			free(ret);
			return -1;
		}
		arec = blk_new(q->n, sizeof(*arec), &ablk);
		rrec = blk_new(q->n, sizeof(*rrec), &rblk);
		if (!arec || !rrec) {
			/* no blocks: records of their own, as for single requests */
			free(ablk);
			free(rblk);
			arec = NULL;
			rrec = NULL;
		}
		for (i = 0; arec && i < q->n; i++) {
			arec[i].blk = ablk;
			rrec[i].blk = rblk;
		}
	}
	for (i = 0; i < q->n && res == CUDA_SUCCESS; i++) {
		struct alloc *a;

		res = alloc_new(c, ent[i].dev, ent[i].size, ent[i].flags, arec ? &arec[i] : NULL,
				rrec ? &rrec[i] : NULL, &a);
		if (res == CUDA_SUCCESS) {
			ret[i].id = a->id;
			ret[i].off = a->off;
		}
	}
	if (res != CUDA_SUCCESS) {
		/* Records i..n-1 were never used: drop them from the blocks' counts
		 * (entry i-1, the failed one, alloc_new released itself). */
		for (uint32_t k = i; arec && k < q->n; k++) {
			rec_free(&arec[k], ablk);
			rec_free(&rrec[k], rblk);
		}
		while (--i > 0)
			conn_unref(c, FKW_KIND_ALLOC, ret[i - 1].id);
		free(ret);
		ret = NULL;
	}
	free(ent);
	r->n = res == CUDA_SUCCESS ? q->n : 0;
	*out = ret;
	return res;
}

/*
 * One-way: the process made the socketpair, wrote the export record into
 * this end and handed the other to the application.  devd keeps this end,
 * takes the export reference and watches for the EOF of the last
 * application copy.  The process validated the handle; c holds its
 * reference still, because its release is queued behind this message.
 */
static void do_export(struct conn *c, const struct fkw_req *q, int infd)
{
	struct epoll_event ee = {.events = EPOLLIN | EPOLLRDHUP};
	struct export *e;

	if (infd < 0 || !conn_holds(c, (int)q->kind, q->id) || !(e = calloc(1, sizeof(*e)))) {
		logf_("pid %d: export of %llu refused\n", (int)c->pid, (unsigned long long)q->id);
		if (infd >= 0)
			close(infd);
		return;
	}
	e->ev.type = EV_EXPORT;
	e->fd = infd;
	e->kind = (int)q->kind;
	e->id = q->id;
	obj_ref(e->kind, e->id);
	ee.data.ptr = e;
	epoll_ctl(D.epfd, EPOLL_CTL_ADD, e->fd, &ee);
	D.nexports++;
}

/*
 * One-way: an importer made its handle from the export record and now takes
 * its connection reference, by id.  This message may be processed before the
 * exporter's FKW_EXPORT (they come on different connections), and that is
 * still safe: the object is alive here because either devd already holds the
 * export reference, or it has not yet processed the exporter's EXPORT, and
 * then not its later DROP either (one connection's messages are processed in
 * order, its hangup last), so the exporter's own reference is still held.
 * The export cannot have reached EOF meanwhile: the importer's copy of the
 * application's end that came with this message was open all along (while
 * the record waited in the importer's queue, its own dup of it; in flight it
 * counts as open; see conn.c), and is closed only now, after the reference
 * is taken.
 */
static void do_import_ref(struct conn *c, const struct fkw_req *q, int infd)
{
	if (infd < 0 || conn_ref(c, (int)q->kind, q->id))
		logf_("pid %d: import of %llu names no live object\n", (int)c->pid, (unsigned long long)q->id);
	if (infd >= 0)
		close(infd);
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

static int do_ipc_open(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
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
	r->off = a->off;
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

static int do_mc_bindings(struct conn *c, const struct fkw_req *q, struct fkw_resp *r)
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
		w->adev = (uint32_t)b->a->dev;
		w->aoff = b->a->off;
	}
	return CUDA_SUCCESS;
}

/* Handles one message of c.  Returns -1 when c was closed (and freed). */
static int handle_request(struct conn *c)
{
	struct fkw_req q;
	struct fkw_resp r;
	struct fkw_alloc_ret *ret = NULL;
	int fds[FKW_MAX_DEV];
	int res;

	if (conn_read(c, &q, sizeof(q)) < 0) {
		conn_close(c);
		return -1;
	}
	switch (q.op) { /* one-way messages: no response */
	case FKW_DROP:
		if (conn_unref(c, (int)q.kind, q.id))
			logf_("pid %d: release of %llu it does not hold\n", (int)c->pid, (unsigned long long)q.id);
		return 0;
	case FKW_EXPORT:
		do_export(c, &q, conn_pop_fd(c));
		return 0;
	case FKW_IMPORT_REF:
		do_import_ref(c, &q, conn_pop_fd(c));
		return 0;
	}
	memset(&r, 0, sizeof(r));
	switch (q.op) {
	case FKW_HELLO:
		c->pid = q.pid;
		r.n = (uint32_t)D.ndev;
		r.mc_gran = D.mc_gran;
		r.mc_rec_gran = D.mc_rec_gran;
		r.gen = FKW_VERSION;
		memcpy(r.u.devs, D.info, sizeof(D.info));
		r.u.cfg = D.cfg;
		res = q.n == FKW_VERSION ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		for (int i = 0; i < D.ndev; i++)
			fds[r.nfds++] = D.arena[i];
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
		res = do_alloc(c, &q, &r);
		break;
	case FKW_ALLOC_BATCH:
		res = do_alloc_batch(c, &q, &r, &ret);
		if (res < 0) {
			conn_close(c);
			return -1;
		}
		break;
	case FKW_IPC_GET:
		res = do_ipc_get(c, &q, &r);
		break;
	case FKW_IPC_OPEN:
		res = do_ipc_open(c, &q, &r);
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
		res = do_mc_bindings(c, &q, &r);
		break;
	case FKW_STATS: {
		struct mcobj *m;

		r.n = (uint32_t)D.nallocs;
		for (m = D.mcs; m; m = m->next)
			r.n2++;
		r.size = D.nexports;
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
	r.result = res;
	if (res != CUDA_SUCCESS)
		r.nfds = 0;
	punch_flush(); /* what this connection freed is gone before it hears back */
	if (fkw_send(c->fd, &r, fkw_resp_len(q.op), fds, (int)r.nfds) < 0 ||
	    (ret && fkw_send(c->fd, ret, sizeof(*ret) * r.n, NULL, 0) < 0)) {
		free(ret);
		conn_close(c);
		return -1;
	}
	free(ret);
	return 0;
}

/*
 * Everything c has sent, then (at EOF) its hangup: one-way messages sent
 * just before a process exits are never lost, since the EOF comes after them
 * on the stream.  A bounded number of reads per wakeup keeps other
 * connections served; what is already in the buffer is always handled (epoll
 * would not report it again).
 */
static void serve_conn(struct conn *c)
{
	for (int reads = 0;;) {
		if (c->in_len - c->in_off < sizeof(struct fkw_req)) {
			ssize_t n;

			if (reads++ >= 64 && c->in_len == c->in_off)
				return; /* level-triggered: epoll reports the rest */
			n = conn_fill(c, 0);
			if (c->broken) {
				conn_close(c);
				return;
			}
			if (n == 0 && c->in_len == c->in_off) {
				conn_close(c);
				return;
			}
			if (n < 0 && c->in_len == c->in_off) {
				if (errno != EAGAIN && errno != EWOULDBLOCK)
					conn_close(c);
				return;
			}
			/* a partial record waits (blocking) for its rest in conn_read */
		}
		if (handle_request(c) < 0)
			return;
	}
}

static void accept_conn(int lfd)
{
	struct epoll_event ee = {.events = EPOLLIN | EPOLLRDHUP};
	struct conn *c;
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	c = calloc(1, sizeof(*c));
	if (c) {
		c->nrefbuck = NREFBUCK0;
		c->refs = calloc(c->nrefbuck, sizeof(*c->refs));
	}
	if (!c || !c->refs) {
		free(c);
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

	/* A socket per connection and per live export: as many as the hard
	 * limit allows (allocations cost no descriptor). */
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
	D.nbucket = NBUCKET0;
	D.allocs = calloc(D.nbucket, sizeof(*D.allocs));
	if (!D.allocs || setup_arenas() < 0)
		return 1;
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
		/* Many ready events per wakeup: a job closing thousands of export
		 * FDs (or exiting) makes as many hangups. */
		struct epoll_event evs[512];
		int i, n = epoll_wait(D.epfd, evs, 512, -1);

		for (i = 0; i < n && !D.stop; i++) {
			struct ev *e = evs[i].data.ptr;

			if (e->type == EV_LISTEN) {
				accept_conn(lfd);
			} else if (e->type == EV_CONN) {
				struct conn *c = (struct conn *)e;

				/* on a hangup too: the queued messages come first, then the EOF */
				serve_conn(c);
				/* serve_conn may have freed c: never touch it again here */
			} else {
				/* The last application copy of an export is gone: a
				 * hangup says so without a read; anything else is data
				 * written into the application's end (read and dropped)
				 * or the EOF. */
				char buf[16];
				struct export *x = (struct export *)e;

				if ((evs[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) ||
				    read(x->fd, buf, sizeof(buf)) <= 0)
					export_close(x);
			}
		}
		punch_flush();
	}
	unlink(path);
	unlink(pidpath);
	return 0;
}
