/*
 * drain.c - waiting for device work with a deadline (QUIESCE).
 *
 * cuCtxSynchronize has no timeout: a kernel that waits for a peer process
 * (a collective whose other rank is held at its own closed gate) never
 * completes, and an op thread stuck in it could neither answer the plugin
 * nor reopen the gate. So the synchronization runs on a helper thread
 * (`cuip-drain`, every signal blocked) and QUIESCE waits for it with a
 * deadline; on timeout QUIESCE reopens the gate and reports, and the helper
 * finishes on its own once the work completes.
 *
 * One helper at a time: a QUIESCE that finds the previous helper still
 * running (its QUIESCE timed out) asks it for one more round instead of
 * starting another. drain_mu protects requested/served/running/result.
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

static pthread_mutex_t drain_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t drain_cv; /* CLOCK_MONOTONIC */
static pthread_once_t drain_once = PTHREAD_ONCE_INIT;
static unsigned long requested, served;
static bool running;
static int result;
static char result_msg[256];

static void drain_cv_init(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&drain_cv, &a);
	pthread_condattr_destroy(&a);
}

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

static void *drain_main(void *arg)
{
	char msg[sizeof(result_msg)];

	(void)arg;
	pthread_mutex_lock(&drain_mu);
	while (served < requested) {
		unsigned long round = requested;
		int r;

		pthread_mutex_unlock(&drain_mu);
		msg[0] = 0;
		r = sync_all(msg, sizeof(msg));
		pthread_mutex_lock(&drain_mu);
		served = round;
		result = r;
		memcpy(result_msg, msg, sizeof(msg));
		pthread_cond_broadcast(&drain_cv);
	}
	running = false;
	pthread_cond_broadcast(&drain_cv);
	pthread_mutex_unlock(&drain_mu);
	return NULL;
}

int cuip_drain(unsigned timeout_ms, char *msg, size_t len)
{
	struct timespec dl;
	unsigned long want;
	int ret = 0;

	pthread_once(&drain_once, drain_cv_init);
	cuip_deadline_ms(&dl, timeout_ms);
	pthread_mutex_lock(&drain_mu);
	want = ++requested;
	if (!running) {
		ret = cuip_thread_start(drain_main, NULL, "cuip-drain");
		if (ret) {
			served = want;
			pthread_mutex_unlock(&drain_mu);
			snprintf(msg, len, "cannot start the drain thread: %s", strerror(-ret));
			return ret;
		}
		running = true;
	}
	while (served < want) {
		if (pthread_cond_timedwait(&drain_cv, &drain_mu, &dl) == ETIMEDOUT && served < want) {
			ret = -ETIMEDOUT;
			snprintf(msg, len, "device work still running after %u ms", timeout_ms);
			break;
		}
	}
	if (!ret && result) {
		ret = result;
		snprintf(msg, len, "%s", result_msg);
	}
	pthread_mutex_unlock(&drain_mu);
	return ret;
}

static void fork_child(void)
{
	/* A forked child has no drain thread. */
	requested = served = 0;
	running = false;
	result = 0;
	pthread_mutex_init(&drain_mu, NULL);
}
CUIP_FORK_HOOK(drain, NULL, NULL, fork_child);

unsigned cuip_ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (unsigned)((now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000);
}
