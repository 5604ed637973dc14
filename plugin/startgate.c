/*
 * startgate.c - the plugin's half of the start gate; see startgate.h and
 * protocol/startmark.h for the protocol. State: the held descriptors
 * (`held`), touched only from criu's hook thread.
 */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "startmark.h"
#include "criulog.h"
#include "proc.h"
#include "startgate.h"

#define MAX_HELD 16

static struct {
	int fd;
	dev_t dev;
	ino_t ino;
} held[MAX_HELD];
static size_t n_held;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pause_ms(unsigned ms)
{
	struct timespec ts = {0, (long)ms * 1000000};

	nanosleep(&ts, NULL);
}

int cuip_startgate_hold(pid_t pid, unsigned timeout_ms, char *err, size_t errlen)
{
	char path[4096];
	struct stat st;
	double end = now_s() + timeout_ms / 1000.0;
	int fd = cuip_proc_open_interposer(pid, path, sizeof(path)), ret;

	if (fd < 0) {
		snprintf(err, errlen, "cannot open the interposer library mapped by pid %d: %s", pid, strerror(-fd));
		return fd;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		close(fd);
		snprintf(err, errlen, "cannot stat the interposer library of pid %d: %s", pid, strerror(-ret));
		return ret;
	}
	for (size_t i = 0; i < n_held; i++) {
		if (held[i].dev == st.st_dev && held[i].ino == st.st_ino) {
			close(fd);
			return 0;
		}
	}
	if (n_held == MAX_HELD) {
		close(fd);
		snprintf(err, errlen, "pid %d maps a %zuth different interposer library file; at most %d", pid,
			 n_held + 1, MAX_HELD);
		return -E2BIG;
	}
	/* A process holds it exclusively only while it marks STARTING. */
	while (flock(fd, LOCK_SH | LOCK_NB)) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			ret = -errno;
			close(fd);
			snprintf(err, errlen, "cannot lock the start gate %s of pid %d: %s", path, pid, strerror(-ret));
			return ret;
		}
		if (now_s() > end) {
			close(fd);
			snprintf(err, errlen,
				 "the start gate %s of pid %d stayed locked for %u ms (a process starting CUDA is "
				 "stopped?)",
				 path, pid, timeout_ms);
			return -ETIMEDOUT;
		}
		pause_ms(1);
	}
	held[n_held].fd = fd;
	held[n_held].dev = st.st_dev;
	held[n_held].ino = st.st_ino;
	n_held++;
	pr_debug("start gate %s held (pid %d's interposer): no process may begin CUDA until the tree is frozen", path,
		 pid);
	return 0;
}

int cuip_startgate_settle(pid_t pid, unsigned timeout_ms, int *sock_err, char *err, size_t errlen)
{
	double t0 = now_s(), end = t0 + timeout_ms / 1000.0;
	bool said = false;
	int s;

	for (;;) {
		s = cuip_proc_start_state(pid, sock_err);
		if (s < 0) {
			snprintf(err, errlen, "cannot read the start marker of pid %d: %s", pid, strerror(-s));
			return s;
		}
		if (s != CUIP_MARK_STARTING)
			break;
		if (!said) {
			char comm[32];

			cuip_proc_comm(pid, comm, sizeof(comm));
			pr_info("pid %d (%s) is starting CUDA: waiting for it to finish (it joins the checkpoint)", pid,
				comm);
			said = true;
		}
		if (now_s() > end) {
			snprintf(err, errlen,
				 "pid %d has been starting CUDA (inside its first cuInit) for %u ms without finishing; "
				 "raise CUINTERPOSE_START_WAIT_MS or checkpoint again later",
				 pid, timeout_ms);
			return -ETIMEDOUT;
		}
		pause_ms(2);
	}
	if (said)
		pr_info("pid %d finished starting CUDA (%s) after %.3f s", pid, cuip_proc_start_state_name(s),
			now_s() - t0);
	return s;
}

void cuip_startgate_release(void)
{
	if (n_held)
		pr_debug("start gate released (%zu library file%s)", n_held, n_held == 1 ? "" : "s");
	for (size_t i = 0; i < n_held; i++)
		close(held[i].fd);
	n_held = 0;
}

size_t cuip_startgate_held(void)
{
	return n_held;
}
