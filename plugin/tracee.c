/*
 * tracee.c - ptrace resume/stop of single threads; see tracee.h. Stateless.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include "criulog.h"
#include "proc.h"
#include "tracee.h"

#ifndef PTRACE_GETSIGMASK
#define PTRACE_GETSIGMASK 0x420a
#define PTRACE_SETSIGMASK 0x420b
#endif
#ifndef PTRACE_O_SUSPEND_SECCOMP
#define PTRACE_O_SUSPEND_SECCOMP (1 << 21)
#endif
#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif

int cuip_tracee_resume(struct cuip_tracee *t)
{
	uint64_t block = ~0ull & ~(1ull << (SIGTRAP - 1));

	t->resumed = false;
	if (cuip_proc_tracer(t->pid, t->tid) != getpid())
		return 0; /* not frozen by criu: it runs anyway */
	if (ptrace(PTRACE_GETSIGMASK, t->tid, sizeof(t->saved_mask), &t->saved_mask)) {
		pr_perror("cannot read the signal mask of thread %d of pid %d", t->tid, t->pid);
		return -errno;
	}
	if (ptrace(PTRACE_SETSIGMASK, t->tid, sizeof(block), &block)) {
		pr_perror("cannot block signals of thread %d of pid %d", t->tid, t->pid);
		return -errno;
	}
	/* Clear PTRACE_O_SUSPEND_SECCOMP etc. while it runs. */
	if (ptrace(PTRACE_SETOPTIONS, t->tid, NULL, 0)) {
		pr_perror("cannot clear ptrace options of thread %d of pid %d", t->tid, t->pid);
		goto restore_mask;
	}
	if (ptrace(PTRACE_CONT, t->tid, NULL, 0)) {
		pr_perror("cannot resume thread %d of pid %d", t->tid, t->pid);
		goto restore_mask;
	}
	t->resumed = true;
	return 0;
restore_mask:
	ptrace(PTRACE_SETSIGMASK, t->tid, sizeof(t->saved_mask), &t->saved_mask);
	return -errno ? -errno : -EIO;
}

int cuip_tracee_stop(struct cuip_tracee *t)
{
	int status, ret = 0;

	if (!t->resumed)
		return 0;
	if (ptrace(PTRACE_INTERRUPT, t->tid, NULL, 0)) {
		pr_perror("cannot interrupt thread %d of pid %d again; the process may be in a strange state", t->tid,
			  t->pid);
		return -errno;
	}
	for (;;) {
		pid_t w = waitpid(t->tid, &status, __WALL);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			pr_perror("waiting for thread %d of pid %d to stop", t->tid, t->pid);
			return -errno;
		}
		if (WIFEXITED(status) || WIFSIGNALED(status)) {
			pr_err("thread %d of pid %d died while it was resumed", t->tid, t->pid);
			t->resumed = false;
			return -ESRCH;
		}
		if (!WIFSTOPPED(status))
			continue;
		if ((status >> 16) == PTRACE_EVENT_STOP)
			break;
		/* A signal-delivery stop (only SIGTRAP can get through the mask):
		 * hand it back and keep waiting for the interrupt stop. */
		pr_debug("thread %d of pid %d stopped with signal %d before the interrupt", t->tid, t->pid,
			 WSTOPSIG(status));
		if (ptrace(PTRACE_CONT, t->tid, NULL, (void *)(long)WSTOPSIG(status)))
			return -errno;
	}
	t->resumed = false;
	if (ptrace(PTRACE_SETOPTIONS, t->tid, NULL, PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD)) {
		pr_perror("cannot restore ptrace options of thread %d of pid %d", t->tid, t->pid);
		ret = -errno;
	}
	if (ptrace(PTRACE_SETSIGMASK, t->tid, sizeof(t->saved_mask), &t->saved_mask)) {
		pr_perror("cannot restore the signal mask of thread %d of pid %d", t->tid, t->pid);
		ret = -errno;
	}
	return ret;
}
