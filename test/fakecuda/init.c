/*
 * Process-wide state of the fake driver and the entry protocol every API call
 * follows (fk_enter/fk_leave: initialized? -> API gate -> fault injection).
 * Owns G (see fake.h for what protects each table), cuInit, cuDriverGetVersion
 * and fork handling.  cuInit itself serializes on G.lock.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

/* Zero initialised, so in .bss (an initialiser would put its 13 MB of tables
 * in the library's data); the rest is set before any call can come. */
struct fk_global G;

__attribute__((constructor)) static void global_init(void)
{
	pthread_mutex_init(&G.lock, NULL);
	pthread_mutex_init(&G.conn_lock, NULL);
	G.conn = -1;
	for (int i = 0; i < FKW_MAX_DEV; i++)
		G.arena[i].fd = -1;
	G.resv = FK_TABLE_INIT(struct fk_resv, FK_CAP_RESV);
	G.ctx = FK_TABLE_INIT(struct fk_ctx, FK_CAP_CTX);
	G.strm = FK_TABLE_INIT(struct fk_stream, FK_CAP_STRM);
	G.evt = FK_TABLE_INIT(struct fk_event, FK_CAP_EVT);
}

static int forked_child; /* a fork of an initialized process: CUDA is unusable, as on a real driver */

int64_t fk_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

CUresult fk_enter(const char *api)
{
	CUresult r;

	if (!atomic_load(&G.initialized) || forked_child)
		return CUDA_ERROR_NOT_INITIALIZED;
	gate_enter();
	r = faults_check(api);
	if (r != CUDA_SUCCESS) {
		gate_leave();
		return r;
	}
	return CUDA_SUCCESS;
}

CUresult fk_enter_any(const char *api, int *entered)
{
	*entered = 0;
	if (forked_child)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (atomic_load(&G.initialized)) {
		CUresult r = fk_enter(api);

		*entered = r == CUDA_SUCCESS;
		return r;
	}
	faults_init();
	return faults_check(api);
}

void fk_leave(void)
{
	gate_leave();
}

static void atfork_prepare(void)
{
	conn_fork_prepare();
}

static void atfork_parent(void)
{
	conn_fork_parent();
}

static void atfork_child(void)
{
	if (!atomic_load(&G.initialized)) {
		conn_fork_child();
		return;
	}
	forked_child = 1;
	/* The child must not keep the parent's device connection alive or
	 * answer for its mailbox (the prepare handler already sent the queue,
	 * with its copies of export FDs). */
	conn_fork_child();
	conn_close_all();
	devnode_forget(); /* inherited, kept: as on NVIDIA's driver */
	rt_after_fork_child();
}

/*
 * A running devd keeps the machine it started with: a process whose
 * environment asks for another one (FAKECUDA_DEVICES=2 against a devd of 1)
 * is refused, naming both, rather than run on the wrong machine.  Only cuInit
 * checks: a process restored onto another machine reconnects, on purpose.
 */
static CUresult config_check(int fd)
{
	char want[96], running[256];

	if (!fkw_config_mismatch(&G.dev.cfg, want, sizeof(want)))
		return CUDA_SUCCESS;
	fkw_config_str(&G.dev.cfg, running, sizeof(running));
	fprintf(stderr,
		"fakecuda: pid %d: cuInit refused: the fake device service at %s runs %s, this process asks %s "
		"(stop it with fakecuda-run --stop, or use another FAKECUDA_SOCKET)\n",
		(int)getpid(), G.sockpath, running, want);
	close(fd);
	arena_drop(G.arena, FKW_MAX_DEV);
	return CUDA_ERROR_SYSTEM_NOT_READY;
}

/*
 * FAKECUDA_INIT_HOLD=PATH (tests): the first cuInit of the process creates
 * PATH.held and waits until PATH exists, so a test can hold a process inside
 * cuInit (a slow driver start) and release it at a moment it chose.
 */
static void init_hold(void)
{
	static int done;
	const char *p = getenv("FAKECUDA_INIT_HOLD");
	char held[4096];
	struct timespec ts = {0, 1000000};
	int fd;

	if (done || !p || !*p)
		return;
	done = 1;
	snprintf(held, sizeof(held), "%s.held", p);
	fd = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0)
		close(fd);
	while (access(p, F_OK))
		nanosleep(&ts, NULL);
}

FK_API CUresult CUDAAPI cuInit(unsigned int flags)
{
	static int atfork_done;
	CUresult r;
	int fd;

	faults_init();
	if (forked_child)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = faults_check("cuInit");
	if (r != CUDA_SUCCESS)
		return r;
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	init_hold();
	LOCK();
	if (atomic_load(&G.initialized)) {
		UNLOCK();
		return CUDA_SUCCESS;
	}
	G.pid = getpid();
	fkw_socket_path(G.sockpath, sizeof(G.sockpath));
	arena_setup();
	conn_setup();
	r = conn_open(&fd, &G.dev, G.arena);
	if (r != CUDA_SUCCESS) {
		UNLOCK();
		return r;
	}
	r = config_check(fd);
	if (r != CUDA_SUCCESS) {
		UNLOCK();
		return r;
	}
	G.conn = fd;
	devnode_open();
	for (int i = 0; i < FKW_MAX_DEV; i++) {
		G.dev.ord2phys[i] = i;
		G.prim[i].ctx = -1;
	}
	stream_init();
	if (rt_start() < 0) {
		devnode_close();
		conn_close_all();
		UNLOCK();
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	if (!atfork_done) {
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
		atfork_done = 1;
	}
	{
		const char *v = getenv("FAKECUDA_CKPT_US_PER_MB");

		fk_ckpt_us_per_mb = v && *v ? (unsigned)strtoul(v, NULL, 10) : 0;
		v = getenv("FAKECUDA_CKPT_LOG");
		fk_ckpt_log[0] = 0;
		if (v && strlen(v) < sizeof(fk_ckpt_log))
			strcpy(fk_ckpt_log, v);
		v = getenv("FAKECUDA_COPY_LOG");
		fk_copy_log[0] = 0;
		if (v && strlen(v) < sizeof(fk_copy_log))
			strcpy(fk_copy_log, v);
		v = getenv("FAKECUDA_COPY_US_PER_MB");
		fk_copy_us_per_mb = v && *v ? (unsigned)strtoul(v, NULL, 10) : 0;
		fk_granularity();
	}
	atomic_store(&G.initialized, 1);
	UNLOCK();
	return CUDA_SUCCESS;
}

unsigned fk_ckpt_us_per_mb;
char fk_ckpt_log[256];
unsigned fk_copy_us_per_mb;
char fk_copy_log[256];

size_t fk_granularity(void)
{
	static size_t g;

	if (!g) {
		const char *v = getenv("FAKECUDA_VMM_GRANULARITY_KB");
		size_t kb = v && *v ? strtoul(v, NULL, 10) : 2048;

		/* a power of two, at least a page */
		g = kb >= 4 && !(kb & (kb - 1)) ? kb << 10 : FKW_GRANULARITY;
	}
	return g;
}

FK_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	const char *v = getenv("FAKECUDA_DRIVER_VERSION");

	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = v && *v ? atoi(v) : 13000;
	return CUDA_SUCCESS;
}
