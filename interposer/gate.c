/*
 * gate.c - the API gate and the lifecycle phase.
 *
 * Every tracked and launch-class wrapper brackets its driver call with
 * cuip_gate_enter()/cuip_gate_exit(). Open gate: one atomic increment, one
 * load, one decrement. A checkpoint closes the gate, waits until no call is
 * in flight, and from then on no application thread is inside the driver
 * through us nor inside the interposer's state lock; new calls wait here
 * until the gate reopens (after a complete restore or a rollback), or fail
 * with CUDA_ERROR_NOT_READY once the process is FAILED.
 *
 * Dekker-style: the closer stores `open = 0` then reads `inflight`; an
 * entering thread increments `inflight` then reads `open`. Both sequentially
 * consistent, so at least one of them sees the other. gate_mu/gate_cv only
 * serve the slow paths.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuip.h"

static atomic_int gate_is_open = 1;
static atomic_long inflight;
static atomic_int phase = CUIP__PHASE__PHASE_ACTIVE;
static atomic_ullong waits;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv; /* CLOCK_MONOTONIC, see gate_cv_init */
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static char failure[512];

static void gate_cv_init(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&gate_cv, &a);
	pthread_condattr_destroy(&a);
}

static void wake_all(void)
{
	pthread_once(&cv_once, gate_cv_init);
	pthread_mutex_lock(&gate_mu);
	pthread_cond_broadcast(&gate_cv);
	pthread_mutex_unlock(&gate_mu);
}

CUresult cuip_gate_enter(void)
{
	for (;;) {
		atomic_fetch_add(&inflight, 1);
		if (atomic_load(&gate_is_open))
			return CUDA_SUCCESS;
		if (atomic_fetch_sub(&inflight, 1) == 1)
			wake_all(); /* the closer may be waiting for zero */
		atomic_fetch_add(&waits, 1);
		pthread_once(&cv_once, gate_cv_init);
		pthread_mutex_lock(&gate_mu);
		while (!atomic_load(&gate_is_open) && atomic_load(&phase) != CUIP__PHASE__PHASE_FAILED)
			pthread_cond_wait(&gate_cv, &gate_mu);
		pthread_mutex_unlock(&gate_mu);
		if (atomic_load(&phase) == CUIP__PHASE__PHASE_FAILED)
			return CUDA_ERROR_NOT_READY;
	}
}

void cuip_gate_exit(void)
{
	if (atomic_fetch_sub(&inflight, 1) == 1 && !atomic_load(&gate_is_open))
		wake_all();
}

int cuip_gate_close(unsigned timeout_ms)
{
	struct timespec dl;
	int ret = 0;

	pthread_once(&cv_once, gate_cv_init);
	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	atomic_store(&gate_is_open, 0);
	pthread_mutex_lock(&gate_mu);
	while (atomic_load(&inflight) > 0) {
		if (pthread_cond_timedwait(&gate_cv, &gate_mu, &dl) == ETIMEDOUT && atomic_load(&inflight) > 0) {
			ret = -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&gate_mu);
	if (ret)
		cuip_gate_open();
	return ret;
}

void cuip_gate_open(void)
{
	atomic_store(&gate_is_open, 1);
	wake_all();
}

Cuip__Phase cuip_phase(void)
{
	return (Cuip__Phase)atomic_load(&phase);
}

void cuip_set_phase(Cuip__Phase p)
{
	atomic_store(&phase, (int)p);
	if (p == CUIP__PHASE__PHASE_FAILED)
		wake_all();
}

void cuip_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
	pr_err("process failed: %s", failure);
	cuip_set_phase(CUIP__PHASE__PHASE_FAILED);
}

const char *cuip_failure(void)
{
	return failure[0] ? failure : NULL;
}

uint64_t cuip_gate_waits(void)
{
	return atomic_load(&waits);
}

void cuip_gate_reset(void)
{
	/* A forked child has only the forking thread: nothing is in flight. */
	atomic_store(&inflight, 0);
	atomic_store(&gate_is_open, 1);
	atomic_store(&phase, CUIP__PHASE__PHASE_ACTIVE);
	atomic_store(&waits, 0);
	failure[0] = 0;
	pthread_mutex_init(&gate_mu, NULL);
}
