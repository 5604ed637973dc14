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

struct fk_global G = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.conn_lock = PTHREAD_MUTEX_INITIALIZER,
	.conn = -1,
	.arena = {[0 ... FKW_MAX_DEV - 1] = {.fd = -1}},
};

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
	rt_after_fork_child();
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
	G.conn = fd;
	for (int i = 0; i < FKW_MAX_DEV; i++) {
		G.dev.ord2phys[i] = i;
		G.prim[i].ctx = -1;
	}
	stream_init();
	if (rt_start() < 0) {
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
		v = getenv("FAKECUDA_COPY_US_PER_MB");
		fk_copy_us_per_mb = v && *v ? (unsigned)strtoul(v, NULL, 10) : 0;
		fk_granularity();
	}
	atomic_store(&G.initialized, 1);
	UNLOCK();
	return CUDA_SUCCESS;
}

unsigned fk_ckpt_us_per_mb;
unsigned fk_copy_us_per_mb;

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
