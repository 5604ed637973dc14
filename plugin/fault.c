/*
 * fault.c - CUINTERPOSE_TEST_FAULT; see fault.h. Owns the armed fault (static,
 * criu's main thread only; the coordinator's phase threads never call in).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "fault.h"
#include "guardian.h"
#include "criulog.h"

static struct {
	char action[16];
	char point[64];
	bool armed;
} F;

int cuip_fault_load(char *err, size_t errlen)
{
	const char *v = getenv("CUINTERPOSE_TEST_FAULT");
	const char *at;

	memset(&F, 0, sizeof(F));
	if (!v || !*v)
		return 0;
	at = strchr(v, '@');
	if (!at || at == v || !at[1] || (size_t)(at - v) >= sizeof(F.action) || strlen(at + 1) >= sizeof(F.point)) {
		snprintf(err, errlen, "CUINTERPOSE_TEST_FAULT=%s: expected ACTION@POINT", v);
		return -EINVAL;
	}
	memcpy(F.action, v, (size_t)(at - v));
	snprintf(F.point, sizeof(F.point), "%s", at + 1);
	if (strcmp(F.action, "kill") && strcmp(F.action, "stop") && strcmp(F.action, "kill-agent") &&
	    strcmp(F.action, "kill-guardian")) {
		snprintf(err, errlen,
			 "CUINTERPOSE_TEST_FAULT=%s: action '%s' is not kill, stop, kill-agent or kill-guardian", v,
			 F.action);
		return -EINVAL;
	}
	F.armed = true;
	return 0;
}

/* SIGKILL pid and wait until it has exited (never reaped here: the agent
 * is criu's child and agent.c reaps it), so the next step meets it dead. */
static void kill_and_wait(pid_t pid)
{
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	struct pollfd pf = {.fd = pfd, .events = POLLIN};

	kill(pid, SIGKILL);
	if (pfd < 0)
		return;
	if (poll(&pf, 1, 10000) != 1)
		pr_err("fault injection: pid %d did not exit within 10 s of SIGKILL", (int)pid);
	close(pfd);
}

void cuip_fault(const char *point)
{
	pid_t pid;

	if (!F.armed || strcmp(F.point, point))
		return;
	F.armed = false;
	pr_warn("fault injection (CUINTERPOSE_TEST_FAULT): %s at %s", F.action, point);
	if (!strcmp(F.action, "kill")) {
		kill(getpid(), SIGKILL);
	} else if (!strcmp(F.action, "stop")) {
		raise(SIGSTOP);
	} else {
		pid = !strcmp(F.action, "kill-agent") ? cuip_agent_pid() : cuip_guardian_pid();
		if (pid > 0)
			kill_and_wait(pid);
	}
}

void cuip_fault_memdump(int dirfd)
{
	char path[64], buf[4096] __attribute__((aligned(8)));
	pid_t criu = getpid(), w;
	int in, ready[2];

	if (!F.armed || strcmp(F.point, "memdump") || pipe(ready))
		return;
	F.armed = false;
	w = fork();
	if (w < 0) {
		pr_err("fault injection: cannot fork the memdump watcher: %s", strerror(errno));
		close(ready[0]);
		close(ready[1]);
		return;
	}
	if (w == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(ready[0]);
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)criu, dirfd);
		in = inotify_init1(IN_CLOEXEC);
		if (in < 0 || inotify_add_watch(in, path, IN_CREATE | IN_MOVED_TO) < 0)
			_exit(1);
		(void)!write(ready[1], "r", 1);
		close(ready[1]);
		for (;;) {
			ssize_t n = read(in, buf, sizeof(buf));

			if (n <= 0)
				_exit(1);
			for (char *p = buf; p < buf + n;) {
				struct inotify_event *ev = (struct inotify_event *)p;

				if (ev->len && !strncmp(ev->name, "pages-", 6)) {
					kill(criu, SIGKILL);
					_exit(0);
				}
				p += sizeof(*ev) + ev->len;
			}
		}
	}
	close(ready[1]);
	if (read(ready[0], buf, 1) != 1)
		pr_err("fault injection: the memdump watcher did not start");
	else
		pr_warn("fault injection (CUINTERPOSE_TEST_FAULT): kill at memdump armed (watcher pid %d)", (int)w);
	close(ready[0]);
}
