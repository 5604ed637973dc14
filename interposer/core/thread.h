/*
 * thread.h - the interposer's own threads (thread.c): starting one named
 * and with every asynchronous signal blocked, deadlines on the clock its condition
 * variables wait on, and the worker that runs work on a thread of its own
 * for a caller that waits with a deadline. Base layer: calls nothing of the
 * interposer; each worker's lock protects it.
 */
#ifndef CUIP_THREAD_H
#define CUIP_THREAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* Start a detached thread named `name` with every asynchronous signal blocked (the
 * application's handlers never run on our threads) and a stack of `stack`
 * bytes (0: 256 KiB); 0 or a negative errno. */
int cuip_thread_start(void *(*fn)(void *), void *arg, const char *name, size_t stack);
#include "deadline.h" /* cuip_deadline_ms: the clock the worker's cv waits on */

/*
 * A worker: work done on a thread of its own so that its caller can wait
 * for it with a deadline (QUIESCE's drain, the job's release hooks). One
 * thread at a time (`name`, started on demand with cuip_thread_start) runs
 * rounds of work(), without the worker's lock, until none is asked for,
 * then ends. A caller asks for a round and waits at most its timeout; past
 * it the round finishes on its own. mu protects the rest; cv is on
 * CLOCK_MONOTONIC. Define one with CUIP_WORKER_INIT; a fork child resets
 * it with cuip_worker_fork_child (its thread is the parent's).
 * CUIP_WORKER_INIT_KEPT: the thread, once started, waits for the next
 * round instead of ending: one thread for the process's life, so the same
 * stack and malloc arena every time, where a thread started anew could
 * need new ones while another worker's thread is still ending.
 */
struct cuip_worker {
	const char *name;
	int (*work)(char *msg, size_t len); /* one round: 0 or a negative errno with msg */
	size_t stack;			    /* its thread's stack, 0: cuip_thread_start's default */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool cv_ready, running;
	bool kept; /* CUIP_WORKER_INIT_KEPT */
	unsigned long requested, served;
	int result;
	char msg[256];
};
#define CUIP_WORKER_INIT(thread_name, fn, stack_bytes)                                                 \
	{                                                                                              \
		.name = thread_name, .work = fn, .stack = stack_bytes, .mu = PTHREAD_MUTEX_INITIALIZER \
	}
#define CUIP_WORKER_INIT_KEPT(thread_name, fn, stack_bytes)                                                          \
	{                                                                                                            \
		.name = thread_name, .work = fn, .stack = stack_bytes, .mu = PTHREAD_MUTEX_INITIALIZER, .kept = true \
	}
/* Ask for a round (after the one running, if any) and wait at most
 * timeout_ms: the round's result and its msg, -ETIMEDOUT (msg empty: the
 * caller says what was late), or the thread's start error. */
int cuip_worker_run(struct cuip_worker *w, unsigned timeout_ms, char *msg, size_t len);
/* Whether a round is still running (one a caller stopped waiting for). */
bool cuip_worker_busy(struct cuip_worker *w);
void cuip_worker_fork_child(struct cuip_worker *w);

#endif /* CUIP_THREAD_H */
