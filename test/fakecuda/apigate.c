/*
 * The API gate: what cuCheckpointProcessLock closes.  Every API call enters it
 * (fk_enter) and leaves it; while it is closed, entering threads sleep.  Lock
 * waits for in-flight calls to leave and for queued device work to finish.
 *
 * Lock-free on purpose (atomics + futexes, no mutex): the restore thread opens
 * and closes it, and must never wait for a lock that a frozen application
 * thread could hold.  State: gate_closed, inflight (below).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

static atomic_int gate_closed;
static atomic_int inflight;

static void futex_wait_private(atomic_int *addr, int val)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_private(atomic_int *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void gate_enter(void)
{
	for (;;) {
		atomic_fetch_add(&inflight, 1);
		if (!atomic_load(&gate_closed))
			return;
		/* Closed: step back out so that the locker sees us gone, and sleep. */
		if (atomic_fetch_sub(&inflight, 1) == 1)
			futex_wake_private(&inflight);
		futex_wait_private(&gate_closed, 1);
	}
}

int gate_try_enter(void)
{
	atomic_fetch_add(&inflight, 1);
	if (!atomic_load(&gate_closed))
		return 1;
	if (atomic_fetch_sub(&inflight, 1) == 1)
		futex_wake_private(&inflight);
	return 0;
}

void gate_leave(void)
{
	if (atomic_fetch_sub(&inflight, 1) == 1 && atomic_load(&gate_closed))
		futex_wake_private(&inflight);
}

int gate_close(unsigned int timeout_ms)
{
	int64_t deadline = fk_now_ns() + (int64_t)timeout_ms * 1000000;

	atomic_store(&gate_closed, 1);
	for (;;) {
		struct timespec ts = {0, 500000};

		if (atomic_load(&inflight) == 0 && stream_idle())
			return 0;
		if (timeout_ms && fk_now_ns() >= deadline) {
			gate_open();
			return -ETIMEDOUT;
		}
		nanosleep(&ts, NULL);
	}
}

void gate_open(void)
{
	atomic_store(&gate_closed, 0);
	futex_wake_private(&gate_closed);
}
