/*
 * drain.c - waiting for device work with a deadline (QUIESCE).
 *
 * cuCtxSynchronize has no timeout: a kernel that waits for a peer process
 * (a collective whose other rank is held at its own closed gate) never
 * completes, and an op thread stuck in it could neither answer the plugin
 * nor reopen the gate. So the synchronization runs on a helper thread
 * (`cuip-drain`, every asynchronous signal blocked) and QUIESCE waits for it with a
 * deadline; on timeout QUIESCE reopens the gate and reports, and the helper
 * finishes on its own once the work completes.
 *
 * One helper at a time (a cuip_worker, thread.h): a QUIESCE that finds the
 * previous helper still running (its QUIESCE timed out) asks it for one
 * more round instead of starting another.
 * The helper uses its own retained primary contexts, never the op thread's.
 * Application-created contexts are synchronized as listed when the round
 * starts (an application that destroys one while a timed-out round still
 * synchronizes it races the driver, as any two threads would).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctx.h"
#include "cuip.h"
#include "drain.h"
#include "driver.h"
#include "runtime.h"
#include "thread.h"

static CUresult sync_one(CUcontext c, void *arg)
{
	(void)c;
	(void)arg;
	return real.cuCtxSynchronize();
}

/* One round: every active primary context, then the application's own. */
static int sync_all(char *msg, size_t len)
{
	struct cuip_ctx_at at;
	CUresult r = cuip_each_context(sync_one, NULL, &at);

	if (r == CUDA_SUCCESS)
		return 0;
	if (at.ordinal >= 0)
		snprintf(msg, len, "synchronizing device %d failed: %s", at.ordinal, cuip_cuerr(r));
	else
		snprintf(msg, len, "synchronizing context %p failed: %s", (void *)at.ctx, cuip_cuerr(r));
	return -EIO;
}

static struct cuip_worker drainer = CUIP_WORKER_INIT("cuip-drain", sync_all, 0);

int cuip_drain(unsigned timeout_ms, char *msg, size_t len)
{
	int ret = cuip_worker_run(&drainer, timeout_ms, msg, len);

	if (ret == -ETIMEDOUT)
		snprintf(msg, len, "device work still running after %u ms", timeout_ms);
	return ret;
}

/* A forked child has no drain thread. */
static void fork_child(void)
{
	cuip_worker_fork_child(&drainer);
}
CUIP_FORK_HOOK(drain, NULL, NULL, fork_child);

unsigned cuip_ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (unsigned)((now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000);
}
