/*
 * xcache.c - the export cache and the peer FD service.
 *
 * A creator exports each shared allocation to a POSIX FD once and keeps the
 * FD here; tickets name the allocation and carry its token, and importers
 * fetch a dup of the cached FD from the creator's control thread. That
 * thread must never wait for the application: it takes only xc_lock (held
 * for table lookups, never across a driver call or a socket operation) and
 * never calls the driver.
 *
 * Entry life: EXPORTING (one thread calls the driver; concurrent first
 * exports wait on xc_cv and then share the result) -> READY -> dropped when
 * the allocation dies or is detached; a drop waits until no serve is still
 * using the FD (`serving`), then closes it.
 *
 * Each entry also records who fetched it (importers.c): the control thread
 * adds the peer of every successful fetch; INSPECT forgets the importers
 * that are gone and reports the rest with the allocation, so that the
 * plugin refuses a dump while a process outside the tree still uses it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuip.h"
#include "driver.h"
#include "importers.h"
#include "runtime.h"
#include "xcache.h"

enum xc_state { XC_EXPORTING, XC_READY, XC_DROPPING };

struct xc_entry {
	uint64_t serial;
	enum xc_state state;
	int fd;
	unsigned serving;
	bool cloexec; /* as the driver handed it out: tickets mirror it */
	uint8_t token[16];
	struct cuip_importers imp; /* who fetched it */
	struct xc_entry *next;
};

#define XC_BUCKETS 1024
static struct xc_entry *xc_tab[XC_BUCKETS];
static pthread_mutex_t xc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t xc_cv = PTHREAD_COND_INITIALIZER;
static atomic_ullong served;

static struct xc_entry **xc_slot(uint64_t serial)
{
	struct xc_entry **pp = &xc_tab[(serial * 0x9e3779b97f4a7c15ull) >> 54];

	while (*pp && (*pp)->serial != serial)
		pp = &(*pp)->next;
	return pp;
}

int cuip_xc_export(uint64_t serial, CUmemGenericAllocationHandle drv, const uint8_t token[16], CUresult *cr)
{
	struct xc_entry *e, **pp;
	int fd = -1;
	CUresult r;

	pthread_mutex_lock(&xc_lock);
	for (;;) {
		e = *xc_slot(serial);
		if (!e)
			break;
		if (e->state == XC_READY) {
			pthread_mutex_unlock(&xc_lock);
			*cr = CUDA_SUCCESS;
			return 0;
		}
		pthread_cond_wait(&xc_cv, &xc_lock); /* exporting or being dropped */
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		pthread_mutex_unlock(&xc_lock);
		*cr = CUDA_ERROR_OUT_OF_MEMORY;
		return -ENOMEM;
	}
	e->serial = serial;
	e->state = XC_EXPORTING;
	e->fd = -1;
	memcpy(e->token, token, 16);
	*xc_slot(serial) = e;
	pthread_mutex_unlock(&xc_lock);

	r = real.cuMemExportToShareableHandle(&fd, drv, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);

	pthread_mutex_lock(&xc_lock);
	if (r == CUDA_SUCCESS) {
		/* Our copy never leaks into an exec'd program. */
		int fl = fcntl(fd, F_GETFD);
		e->cloexec = fl >= 0 && (fl & FD_CLOEXEC);
		if (fl >= 0)
			fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
		e->fd = fd;
		e->state = XC_READY;
	} else {
		pp = xc_slot(serial);
		*pp = e->next;
		free(e);
	}
	pthread_cond_broadcast(&xc_cv);
	pthread_mutex_unlock(&xc_lock);
	*cr = r;
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

void cuip_xc_drop(uint64_t serial)
{
	struct xc_entry *e, **pp;

	pthread_mutex_lock(&xc_lock);
	for (;;) {
		e = *xc_slot(serial);
		if (!e || e->state == XC_READY)
			break;
		pthread_cond_wait(&xc_cv, &xc_lock); /* let a first export finish */
	}
	if (!e) {
		pthread_mutex_unlock(&xc_lock);
		return;
	}
	e->state = XC_DROPPING;
	while (e->serving)
		pthread_cond_wait(&xc_cv, &xc_lock);
	pp = xc_slot(serial);
	*pp = e->next;
	pthread_cond_broadcast(&xc_cv);
	pthread_mutex_unlock(&xc_lock);
	close(e->fd);
	cuip_importers_free(&e->imp);
	free(e);
}

int cuip_xc_dup(uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, const struct cuip_importer *by,
		int *rec)
{
	struct xc_entry *e;
	bool warn = false;
	int fd, ret;

	*rec = 0;
	if (creator != self.id)
		return -ENOENT;
	pthread_mutex_lock(&xc_lock);
	e = *xc_slot(serial);
	if (!e || e->state != XC_READY) {
		pthread_mutex_unlock(&xc_lock);
		return -ENOENT;
	}
	if (toklen != 16 || memcmp(e->token, token, 16)) {
		pthread_mutex_unlock(&xc_lock);
		return -EACCES;
	}
	e->serving++;
	pthread_mutex_unlock(&xc_lock);

	fd = fcntl(e->fd, F_DUPFD_CLOEXEC, 0);
	ret = fd < 0 ? -errno : fd;

	pthread_mutex_lock(&xc_lock);
	/* /proc is read here (a reused pid, a full set), never the driver */
	if (fd >= 0 && by) {
		*rec = cuip_importers_add(&e->imp, by, cuip_importer_alive);
		warn = *rec < 0 && e->imp.dropped == 1;
	}
	if (--e->serving == 0 && e->state == XC_DROPPING)
		pthread_cond_broadcast(&xc_cv);
	pthread_mutex_unlock(&xc_lock);
	if (warn)
		pr_err("allocation %016llx:%llu: more than %d processes imported it (or out of memory); the others "
		       "are not recorded, so a checkpoint of this process will be refused",
		       (unsigned long long)creator, (unsigned long long)serial, CUIP_IMPORTERS_MAX);
	return ret;
}

void cuip_xc_unrecord(uint64_t serial, const struct cuip_importer *by, int rec)
{
	struct xc_entry *e;

	if (!rec || !by)
		return;
	pthread_mutex_lock(&xc_lock);
	e = *xc_slot(serial); /* a dropped entry took its importers with it */
	if (e)
		cuip_importers_undo(&e->imp, by, rec);
	pthread_mutex_unlock(&xc_lock);
}

void cuip_xc_served(void)
{
	atomic_fetch_add(&served, 1);
}

uint64_t cuip_xc_served_count(void)
{
	return atomic_load(&served);
}

bool cuip_xc_has(uint64_t serial)
{
	bool has;

	pthread_mutex_lock(&xc_lock);
	has = *xc_slot(serial) != NULL;
	pthread_mutex_unlock(&xc_lock);
	return has;
}

int cuip_xc_fd_cloexec(uint64_t serial)
{
	struct xc_entry *e;
	int ret = -1;

	pthread_mutex_lock(&xc_lock);
	e = *xc_slot(serial);
	if (e && e->state == XC_READY)
		ret = e->cloexec;
	pthread_mutex_unlock(&xc_lock);
	return ret;
}

static void fork_child(void)
{
	for (int i = 0; i < XC_BUCKETS; i++) {
		struct xc_entry *e = xc_tab[i], *n;
		for (; e; e = n) {
			n = e->next;
			if (e->fd >= 0)
				close(e->fd);
			cuip_importers_free(&e->imp);
			free(e);
		}
		xc_tab[i] = NULL;
	}
	atomic_store(&served, 0);
	pthread_mutex_init(&xc_lock, NULL);
	pthread_cond_init(&xc_cv, NULL);
}
CUIP_FORK_HOOK(xcache, NULL, NULL, fork_child);

/*
 * Liveness of the importers, asked once per process per prune (thousands of
 * allocations share a handful of importers). xc_lock held.
 */
#define MEMO_MAX 256
static struct {
	pid_t pid;
	uint64_t start;
	int alive;
} memo[MEMO_MAX];
static unsigned nmemo;

static int alive_memo(const struct cuip_importer *p)
{
	int a;

	for (unsigned i = 0; i < nmemo; i++)
		if (memo[i].pid == p->pid && memo[i].start == p->start)
			return memo[i].alive;
	a = cuip_importer_alive(p);
	if (nmemo < MEMO_MAX)
		memo[nmemo++] = (__typeof__(memo[0])){.pid = p->pid, .start = p->start, .alive = a};
	return a;
}

void cuip_xc_prune_importers(void)
{
	if (!cuip_proc_is_ours())
		return; /* /proc names other processes: the plugin tells */
	pthread_mutex_lock(&xc_lock);
	nmemo = 0;
	for (int i = 0; i < XC_BUCKETS; i++)
		for (struct xc_entry *e = xc_tab[i]; e; e = e->next)
			if (e->imp.n)
				cuip_importers_prune(&e->imp, alive_memo);
	pthread_mutex_unlock(&xc_lock);
}

unsigned cuip_xc_importers(uint64_t serial, struct cuip_importer *out, unsigned max, unsigned *dropped)
{
	struct xc_entry *e;
	unsigned n = 0;

	*dropped = 0;
	pthread_mutex_lock(&xc_lock);
	e = *xc_slot(serial);
	if (e) {
		for (; n < e->imp.n && n < max; n++)
			out[n] = e->imp.e[n];
		*dropped = e->imp.dropped + (e->imp.n - n);
	}
	pthread_mutex_unlock(&xc_lock);
	return n;
}
