/*
 * threads.h - starting a helper thread that takes no asynchronous signal
 * (threads.c): the interposer's threads run inside a job, the plugin's and
 * the image verifier's inside criu, and neither's signal handlers are
 * theirs to run. Used by interposer/core/thread.c, carrier/,
 * protocol/images.c and the plugin's coordinator and sock_diag threads. No
 * state.
 */
#ifndef CUIP_THREADS_H
#define CUIP_THREADS_H

#include <pthread.h>

/*
 * pthread_create, the new thread starting with every signal blocked but
 * the faults it may raise itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL), so
 * that those still reach the process's handler or end it. The caller's
 * mask is as before on return. 0 or pthread_create's error number.
 */
int cuip_thread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

#endif /* CUIP_THREADS_H */
