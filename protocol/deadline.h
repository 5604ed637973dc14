/*
 * deadline.h - points in time on CLOCK_MONOTONIC, the clock every
 * condition variable of cuinterpose waits on (each is made with
 * pthread_condattr_setclock(CLOCK_MONOTONIC), so that a step of the wall
 * clock never stretches or cuts a wait). Shared by the interposer, the
 * carrier and the plugin. Header only, no state.
 */
#ifndef CUIP_DEADLINE_H
#define CUIP_DEADLINE_H

#include <stdbool.h>
#include <time.h>

/* *dl = now + ms. */
static inline void cuip_deadline_ms(struct timespec *dl, unsigned ms)
{
	clock_gettime(CLOCK_MONOTONIC, dl);
	dl->tv_sec += ms / 1000;
	dl->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (dl->tv_nsec >= 1000000000L) {
		dl->tv_sec++;
		dl->tv_nsec -= 1000000000L;
	}
}

/* Whether *dl has come. */
static inline bool cuip_deadline_passed(const struct timespec *dl)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > dl->tv_sec || (now.tv_sec == dl->tv_sec && now.tv_nsec >= dl->tv_nsec);
}

#endif /* CUIP_DEADLINE_H */
