/*
 * waitchild.h - waiting for a test's child with a bound (waitchild.c): a
 * child that hangs is killed and reported, never waited for forever. Used
 * by the harness's h_wait and by the tests that fork without the harness.
 * No state.
 */
#ifndef CUIP_TEST_WAITCHILD_H
#define CUIP_TEST_WAITCHILD_H

#include <sys/types.h>

/* What waitchild() returns for a child still running after the bound (it
 * was then killed with SIGKILL and reaped), as timeout(1) does. */
#define WAITCHILD_TIMEOUT 124

/*
 * Wait up to ms for child pid: its exit status, 128 + the signal that
 * killed it, WAITCHILD_TIMEOUT (and a line on stderr naming the pid and
 * the bound) when it had to be killed, or -1 when pid is not our child.
 */
int waitchild(pid_t pid, unsigned ms);

#endif /* CUIP_TEST_WAITCHILD_H */
