/*
 * prefetch.c - a restore's carriers read ahead; see prefetch.h. The list of
 * files is made in criu (before the clone), the reading in the reader.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criulog.h"
#include "fault.h"
#include "images.h"
#include "prefetch.h"
#include "proc.h"
#include "wire.h"

/* What one mincore() and one read cover. */
#define BLOCK (8ull << 20)
/* Threads of the reader: each keeps one read in the disk's queue. */
#define READERS 4
/* The most carrier files read ahead. */
#define MAX_FILES 1024
/* How long a reader SIGKILLed may take to exit (it may be inside a read
 * the disk must finish first), and how long it waits for criu's go. */
#define REAP_WAIT_MS 10000
/* ioprio_set(2): IOPRIO_WHO_PROCESS; class BE (2) at level 7 */
#define IOPRIO_WHO_PROCESS 1
#define IOPRIO_BE_LOWEST   ((2 << 13) | 7)

/* Written by the reader, read by criu once the reader is gone or stopped. */
struct counters {
	uint64_t bytes;	   /* data bytes looked at, cached or not */
	uint64_t uncached; /* of them, asked to be read (not in the page cache) */
	uint32_t files;	   /* files begun */
	uint32_t errors;   /* files the reader could not look at */
	double seconds;	   /* from the clone to the last request */
	pid_t pid;	   /* the reader, set by the process that forks it */
	int go;		   /* set by criu once it holds the reader's pidfd */
	int done;
};

static struct {
	pid_t pid; /* the reader; 0: none */
	int pidfd; /* the reader's: it is not criu's child */
	struct counters *c;
	uint64_t want; /* bytes on disk of the files given to it, at most the budget */
	double t0;
} P = {.pidfd = -1};

/* ---- the reader (child side) ------------------------------------------- */

/* Bytes of [off, off + len) of fd that are not in the page cache (all of
 * them when that cannot be told). */
static uint64_t not_cached(int fd, uint64_t off, uint64_t len)
{
	unsigned char vec[BLOCK / 4096 + 1];
	long page = sysconf(_SC_PAGESIZE);
	uint64_t pages = (len + page - 1) / page, n = 0;
	void *m;

	if (pages > sizeof(vec))
		return len;
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
	if (m == MAP_FAILED)
		return len;
	if (mincore(m, len, vec)) {
		munmap(m, len);
		return len;
	}
	munmap(m, len);
	for (uint64_t i = 0; i < pages; i++)
		if (!(vec[i] & 1))
			n += (uint64_t)page;
	return n > len ? len : n;
}

/* Read [off, off + len) of fd into buf (and so into the page cache). */
static void read_block(int fd, uint8_t *buf, uint64_t off, uint64_t len)
{
	while (len) {
		ssize_t r = pread(fd, buf, len, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
}

/* The reader's cursor over the files' data, block by block, in order. */
static struct {
	pthread_mutex_t mu;
	const int *fds;
	unsigned n, i; /* files, the current one */
	bool opened;   /* size of file i known */
	off_t size;    /* of file i */
	off_t off;     /* next byte to hand out */
	off_t end;     /* of the data range off is in (off == end: find the next) */
	uint64_t budget;
	int criu_fd;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool gone(int criu_fd);

/* The next block to read, or false when none is left (all handed out, the
 * budget spent, or criu gone). Counts files and bytes handed out. */
static bool next_block(struct counters *c, int *fd, uint64_t *off, uint64_t *len)
{
	off_t page = (off_t)sysconf(_SC_PAGESIZE);
	bool got = false;

	pthread_mutex_lock(&R.mu);
	while (!got && R.i < R.n && c->bytes < R.budget && !gone(R.criu_fd)) {
		int f = R.fds[R.i];
		off_t data;
		struct stat st;

		if (!R.opened) {
			R.opened = true;
			c->files++;
			R.off = R.end = 0;
			if (fstat(f, &st)) {
				c->errors++;
				st.st_size = 0; /* nothing of it is read */
			}
			R.size = st.st_size;
		}
		if (R.off < R.end) {
			*fd = f;
			*off = (uint64_t)R.off;
			*len = (uint64_t)(R.end - R.off);
			if (*len > BLOCK)
				*len = BLOCK;
			if (*len > R.budget - c->bytes)
				*len = R.budget - c->bytes;
			R.off += (off_t)*len;
			c->bytes += *len;
			got = true;
			continue;
		}
		data = R.off < R.size ? lseek(f, R.off, SEEK_DATA) : -1;
		if (data < 0 && R.off < R.size && errno != ENXIO)
			data = R.off; /* no SEEK_DATA here: all of it is data */
		if (data < 0) {	      /* only a hole is left: the next file */
			R.i++;
			R.opened = false;
			continue;
		}
		R.end = lseek(f, data, SEEK_HOLE);
		if (R.end < 0 || R.end > R.size)
			R.end = R.size;
		R.off = data - data % page;
	}
	pthread_mutex_unlock(&R.mu);
	return got;
}

/* One of the reader's threads: blocks not in the page cache are read into
 * its own buffer (and so into the page cache). */
static void *read_blocks(void *arg)
{
	struct counters *c = arg;
	uint8_t *buf = mmap(NULL, BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t off, len, u;
	int fd;

	if (buf == MAP_FAILED)
		return NULL;
	while (next_block(c, &fd, &off, &len)) {
		u = not_cached(fd, off, len);
		if (u)
			read_block(fd, buf, off, len);
		__atomic_add_fetch(&c->uncached, u, __ATOMIC_RELAXED);
	}
	munmap(buf, BLOCK);
	return NULL;
}

/* Whether criu has ended (the reader outlives it otherwise). */
static bool gone(int criu_fd)
{
	struct pollfd pf = {.fd = criu_fd, .events = POLLIN};

	return criu_fd < 0 || poll(&pf, 1, 0) != 0;
}

static void reader(pid_t criu, const int *fds, unsigned n, uint64_t budget)
{
	struct counters *c = P.c;
	int criu_fd = (int)syscall(SYS_pidfd_open, criu, 0);
	struct timespec ms = {0, 1000000};
	pthread_t t[READERS];
	unsigned k;
	int *keep;

	prctl(PR_SET_NAME, "cuip-prefetch");
	/* Until criu holds our pidfd (our pid cannot be reused before), and
	 * at most REAP_WAIT_MS. */
	for (int i = 0; !__atomic_load_n(&c->go, __ATOMIC_ACQUIRE); i++)
		if (i > REAP_WAIT_MS || gone(criu_fd) || nanosleep(&ms, NULL) < 0)
			_exit(1);
	cuip_fault("prefetch"); /* logs: before criu's log is closed */
	keep = calloc(n + 1, sizeof(*keep));
	if (!keep)
		_exit(1);
	memcpy(keep, fds, n * sizeof(*keep));
	keep[n] = criu_fd;
	cuip_proc_close_inherited(keep, n + 1);
	free(keep);
	/* The lowest priority of the best-effort class, where the I/O
	 * scheduler honours it: criu's reads go first. */
	syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_BE_LOWEST);
	R.fds = fds;
	R.n = n;
	R.budget = budget;
	R.criu_fd = criu_fd;
	for (k = 0; k < READERS - 1 && !pthread_create(&t[k], NULL, read_blocks, c); k++)
		;
	read_blocks(c);
	while (k--)
		pthread_join(t[k], NULL);
	c->seconds = cuip_now() - P.t0;
	__atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
	_exit(0);
}

/*
 * Start the reader as criu's grandchild: criu's restore waits for any of
 * its children (compel's wait4(-1, __WALL) for the restored tasks) and
 * calls one it did not expect an error, so the reader must not be one. The
 * process in between (a clone without an exit signal, which criu's SIGCHLD
 * handler never hears of) forks the reader and exits at once, and criu
 * reaps it here. The reader then belongs to init (or the nearest
 * subreaper), which reaps it when it ends; criu holds its pidfd to stop it.
 * Returns the reader's pid, or -errno.
 */
static pid_t spawn(const int *fds, unsigned n, uint64_t budget)
{
	pid_t criu = getpid(), mid, r;
	int st;

	mid = (pid_t)syscall(SYS_clone, 0UL, 0UL, 0UL, 0UL, 0UL);
	if (mid < 0)
		return -errno;
	if (mid == 0) {
		r = fork(); /* glibc's: the reader starts threads */
		if (r == 0)
			reader(criu, fds, n, budget);
		P.c->pid = r > 0 ? r : -errno;
		_exit(0);
	}
	if (waitpid(mid, &st, __WCLONE) != mid)
		return -errno;
	return P.c->pid;
}

/* ---- the list (criu side) ---------------------------------------------- */

struct list {
	int fds[MAX_FILES];
	unsigned n;
	uint64_t bytes; /* on disk */
	unsigned skipped;
};

/* Add `name` (relative to dirfd, or absolute) unless it is there already
 * (the same inode) or the budget is spent. */
static void add(struct list *l, int dirfd, const char *name, uint64_t budget)
{
	struct stat st, o;
	int fd;

	if (l->n == MAX_FILES || l->bytes >= budget) {
		l->skipped++;
		return;
	}
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		pr_debug("prefetch: cannot open %s: %s (its reader opens it itself)", name, strerror(errno));
		return;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return;
	}
	for (unsigned i = 0; i < l->n; i++)
		if (!fstat(l->fds[i], &o) && o.st_dev == st.st_dev && o.st_ino == st.st_ino) {
			close(fd);
			return;
		}
	l->fds[l->n++] = fd;
	l->bytes += (uint64_t)st.st_blocks * 512;
}

/* Every carrier file the participants' LOAD will open (coord.c step_load:
 * the topology's stripes, or its one file), chains flattened. */
static void add_carriers(struct list *l, int dirfd, const struct cuip_ckpt *ck, uint64_t budget)
{
	for (size_t i = 0; ck && i < ck->n; i++) {
		const Cuip__Topology *t = ck->topo[i];

		if (t->n_carrier_files)
			for (size_t f = 0; f < t->n_carrier_files; f++)
				add(l, dirfd, t->carrier_files[f], budget);
		for (size_t k = 0; k < t->n_carriers; k++) {
			const Cuip__CarrierEntry *e = t->carriers[k];

			if (e->file && *e->file)
				add(l, dirfd, e->file, budget);
		}
	}
}

/* Half of MemAvailable, in bytes (0 when it cannot be read). */
static uint64_t half_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[128];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024 / 2;
}

static void close_list(struct list *l)
{
	for (unsigned i = 0; i < l->n; i++)
		close(l->fds[i]);
}

void cuip_prefetch_start(int dirfd, const struct cuip_ckpt *ck, int64_t budget_mb)
{
	uint64_t budget = budget_mb < 0 ? half_available() : (uint64_t)budget_mb << 20;
	struct list *l;
	pid_t r;

	cuip_prefetch_stop("a new restore");
	if (!budget) {
		pr_info("prefetch: off (%s)",
			budget_mb < 0 ? "no MemAvailable in /proc/meminfo" : "CUINTERPOSE_PREFETCH_MB unset or 0");
		return;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		pr_warn("prefetch: out of memory for the file list: nothing read ahead");
		return;
	}
	add_carriers(l, dirfd, ck, budget);
	if (!l->n) {
		pr_info("prefetch: no image to read ahead");
		free(l);
		return;
	}
	P.c = mmap(NULL, sizeof(*P.c), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (P.c == MAP_FAILED) {
		pr_warn("prefetch: cannot map its counters: %s; nothing read ahead", strerror(errno));
		P.c = NULL;
		close_list(l);
		free(l);
		return;
	}
	P.t0 = cuip_now();
	r = spawn(l->fds, l->n, budget);
	P.pidfd = r > 0 ? (int)syscall(SYS_pidfd_open, r, 0) : -1;
	if (P.pidfd < 0) {
		pr_warn("prefetch: cannot start the reader: %s; nothing read ahead", strerror(r > 0 ? errno : (int)-r));
		if (r > 0)
			kill(r, SIGKILL); /* it waits for go: still alive, not reused */
		munmap(P.c, sizeof(*P.c));
		P.c = NULL;
	} else {
		__atomic_store_n(&P.c->go, 1, __ATOMIC_RELEASE);
		P.pid = r;
		P.want = l->bytes < budget ? l->bytes : budget;
		pr_info("prefetch: reader %d reads ahead %u files, %" PRIu64 " bytes on disk (budget %" PRIu64
			" MiB%s)",
			(int)P.pid, l->n, P.want, budget >> 20,
			l->skipped ? ", files beyond it left to their readers" : "");
	}
	close_list(l);
	free(l);
}

/* Whether the reader has exited, waiting at most timeout_ms for it (its
 * pidfd turns readable). */
static bool ended(int timeout_ms)
{
	struct pollfd pf = {.fd = P.pidfd, .events = POLLIN};

	return poll(&pf, 1, timeout_ms) == 1;
}

void cuip_prefetch_stop(const char *when)
{
	struct counters c;
	bool stopped = false;

	if (!P.pid)
		return;
	/* Still running (not done, not ended on its own): stop it. */
	if (!__atomic_load_n(&P.c->done, __ATOMIC_ACQUIRE) && !ended(0)) {
		syscall(SYS_pidfd_send_signal, P.pidfd, SIGKILL, NULL, 0);
		stopped = true;
	}
	if (!ended(REAP_WAIT_MS))
		pr_warn("prefetch: reader %d did not exit within %d ms at %s", (int)P.pid, REAP_WAIT_MS, when);
	c = *P.c;
	if (c.done)
		pr_info("prefetch: read ahead %" PRIu64 " bytes of %u files in %.3f s, %" PRIu64
			" of them not cached when it came to them%s",
			c.bytes, c.files, c.seconds, c.uncached,
			c.errors ? " (some files could not be looked at)" : "");
	else if (stopped)
		pr_info("prefetch: reader %d still reading at %s after %" PRIu64 " of %" PRIu64
			" bytes (%.3f s): stopped",
			(int)P.pid, when, c.bytes, P.want, cuip_now() - P.t0);
	else
		pr_warn("prefetch: reader %d ended before it was done, after %" PRIu64 " of %" PRIu64
			" bytes; criu and LOAD read the rest themselves",
			(int)P.pid, c.bytes, P.want);
	close(P.pidfd);
	munmap(P.c, sizeof(*P.c));
	P.pid = 0;
	P.pidfd = -1;
	P.c = NULL;
}
