/*
 * thread.c - the interposer's own threads (thread.h).
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "thread.h"
#include "threads.h"

struct thread_start {
	void *(*fn)(void *);
	void *arg;
	sem_t named; /* posted once the creator named the thread */
};

/* The thread runs only once named: named "before anyone can look" (the
 * plugin finds our threads by name), and never after it ended (the name
 * would go to whichever thread took its descriptor). */
static void *thread_main(void *p)
{
	struct thread_start *st = p;
	void *(*fn)(void *) = st->fn;
	void *arg = st->arg;

	while (sem_wait(&st->named) && errno == EINTR)
		;
	sem_destroy(&st->named);
	free(st);
	return fn(arg);
}

int cuip_thread_start(void *(*fn)(void *), void *arg, const char *name, size_t stack)
{
	struct thread_start *st = malloc(sizeof(*st));
	pthread_attr_t at;
	pthread_t t;
	int ret;

	if (!st)
		return -ENOMEM;
	st->fn = fn;
	st->arg = arg;
	sem_init(&st->named, 0, 0);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, stack ? stack : 256 << 10);
	ret = cuip_thread_create(&t, &at, thread_main, st);
	pthread_attr_destroy(&at);
	if (ret) {
		sem_destroy(&st->named);
		free(st);
		return -ret;
	}
	pthread_setname_np(t, name);
	sem_post(&st->named); /* st is the thread's from here on */
	return 0;
}

static void *worker_main(void *arg)
{
	struct cuip_worker *w = arg;
	char msg[sizeof(w->msg)];

	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (w->served < w->requested) {
			unsigned long round = w->requested;
			int r;

			pthread_mutex_unlock(&w->mu);
			msg[0] = 0;
			r = w->work(msg, sizeof(msg));
			pthread_mutex_lock(&w->mu);
			w->served = round;
			w->result = r;
			memcpy(w->msg, msg, sizeof(msg));
			pthread_cond_broadcast(&w->cv);
		}
		if (!w->kept)
			break;
		pthread_cond_wait(&w->cv, &w->mu); /* the next request broadcasts */
	}
	w->running = false;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int cuip_worker_run(struct cuip_worker *w, unsigned timeout_ms, char *msg, size_t len)
{
	struct timespec dl;
	unsigned long want;
	int ret = 0;

	cuip_deadline_ms(&dl, timeout_ms);
	msg[0] = 0;
	pthread_mutex_lock(&w->mu);
	if (!w->cv_ready) {
		pthread_condattr_t a;

		pthread_condattr_init(&a);
		pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
		pthread_cond_init(&w->cv, &a);
		pthread_condattr_destroy(&a);
		w->cv_ready = true;
	}
	want = ++w->requested;
	if (w->running) {
		pthread_cond_broadcast(&w->cv); /* a kept thread waits for it */
	} else {
		ret = cuip_thread_start(worker_main, w, w->name, w->stack);
		if (ret) {
			w->served = want;
			pthread_mutex_unlock(&w->mu);
			snprintf(msg, len, "cannot start the %s thread: %s", w->name, strerror(-ret));
			return ret;
		}
		w->running = true;
	}
	while (w->served < want)
		if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT && w->served < want) {
			ret = -ETIMEDOUT;
			break;
		}
	if (!ret && w->result) {
		ret = w->result;
		snprintf(msg, len, "%s", w->msg);
	}
	pthread_mutex_unlock(&w->mu);
	return ret;
}

bool cuip_worker_busy(struct cuip_worker *w)
{
	bool busy;

	pthread_mutex_lock(&w->mu);
	busy = w->served < w->requested;
	pthread_mutex_unlock(&w->mu);
	return busy;
}

void cuip_worker_fork_child(struct cuip_worker *w)
{
	w->requested = w->served = 0;
	w->running = w->cv_ready = false;
	w->result = 0;
	pthread_mutex_init(&w->mu, NULL);
}
