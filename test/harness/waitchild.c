/*
 * waitchild.c - a bounded wait for a test's child; see waitchild.h.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "waitchild.h"

static int status_of(int st)
{
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Milliseconds on CLOCK_MONOTONIC: a nap cut short by a signal does not
 * cut the bound. */
static unsigned long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (unsigned long long)t.tv_sec * 1000 + (unsigned long long)t.tv_nsec / 1000000;
}

int waitchild(pid_t pid, unsigned ms)
{
	struct timespec nap = {0, 10 * 1000 * 1000};
	unsigned long long end = now_ms() + ms;
	int st;

	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return status_of(st);
		if (w < 0 && errno != EINTR)
			return -1;
		if (now_ms() >= end)
			break;
		nanosleep(&nap, NULL);
	}
	fprintf(stderr, "waitchild: pid %d still running after %u ms: killed\n", (int)pid, ms);
	kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WAITCHILD_TIMEOUT;
}
