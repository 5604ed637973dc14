/*
 * drain.h - synchronizing every context on a helper thread (drain.c), so
 * that QUIESCE waits a bounded time for device work (a cuip_worker, whose
 * lock protects the helper's request and result).
 */
#ifndef CUIP_DRAIN_H
#define CUIP_DRAIN_H

#include <stddef.h>
#include <time.h>

/* Synchronize every context on a helper thread, waiting at most timeout_ms
 * (drain.c): 0, -ETIMEDOUT or -EIO, with msg saying why. */
int cuip_drain(unsigned timeout_ms, char *msg, size_t len);
unsigned cuip_ms_since(const struct timespec *t0);

#endif /* CUIP_DRAIN_H */
