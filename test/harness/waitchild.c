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

int waitchild(pid_t pid, unsigned ms)
{
	struct timespec nap = {0, 10 * 1000 * 1000};
	int st;

	for (unsigned waited = 0;; waited += 10) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return status_of(st);
		if (w < 0 && errno != EINTR)
			return -1;
		if (waited >= ms)
			break;
		nanosleep(&nap, NULL);
	}
	fprintf(stderr, "waitchild: pid %d still running after %u ms: killed\n", (int)pid, ms);
	kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WAITCHILD_TIMEOUT;
}
