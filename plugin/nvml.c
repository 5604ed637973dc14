/*
 * nvml.c - NVML's list of compute processes (nvml.h). The library is
 * opened with dlopen and closed after each question: the plugin must load
 * in criu on machines without it (and with the fake driver, which has none).
 */
#include "nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long the child that asks NVML may take. */
#define NVML_WAIT_MS 10000

/* NVML's ABI, as nvml.h of driver 450 and later declares it. */
typedef void *nvml_dev;
struct nvml_proc {
	unsigned int pid;
	unsigned long long used;
	unsigned int gpu_instance, compute_instance;
};
#define NVML_SUCCESS		     0
#define NVML_ERROR_INSUFFICIENT_SIZE 7

struct nvml {
	void *h;
	int (*init)(void);
	int (*shutdown)(void);
	int (*count)(unsigned int *);
	int (*handle)(unsigned int, nvml_dev *);
	int (*procs)(nvml_dev, unsigned int *, struct nvml_proc *);
};

static int load(struct nvml *n, char *err, size_t errlen)
{
	n->h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!n->h)
		return -ENOENT;
	*(void **)&n->init = dlsym(n->h, "nvmlInit_v2");
	*(void **)&n->shutdown = dlsym(n->h, "nvmlShutdown");
	*(void **)&n->count = dlsym(n->h, "nvmlDeviceGetCount_v2");
	*(void **)&n->handle = dlsym(n->h, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&n->procs = dlsym(n->h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!n->init || !n->shutdown || !n->count || !n->handle || !n->procs) {
		snprintf(err, errlen, "libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v3 (driver < 510)");
		dlclose(n->h);
		return -ENOSYS;
	}
	if (n->init() != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlInit_v2 failed");
		dlclose(n->h);
		return -EIO;
	}
	return 0;
}

/* Is pid among the compute processes of device d? 1, 0, or -errno. */
static int on_device(struct nvml *n, nvml_dev d, pid_t pid, char *err, size_t errlen)
{
	struct nvml_proc *v = NULL;
	unsigned int k = 0;
	int r, found = 0;

	for (int tries = 0; tries < 4; tries++) {
		r = n->procs(d, &k, v);
		if (r == NVML_SUCCESS)
			break;
		if (r != NVML_ERROR_INSUFFICIENT_SIZE) {
			snprintf(err, errlen, "nvmlDeviceGetComputeRunningProcesses_v3: NVML error %d", r);
			free(v);
			return -EIO;
		}
		k += 8; /* processes may start between the calls */
		free(v);
		v = calloc(k, sizeof(*v));
		if (!v)
			return -ENOMEM;
	}
	if (r != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlDeviceGetComputeRunningProcesses_v3: the list kept growing");
		free(v);
		return -EAGAIN;
	}
	for (unsigned int i = 0; i < k && v; i++)
		found |= v[i].pid == (unsigned int)pid;
	free(v);
	return found;
}

/* The question itself, in the process that asks. */
static int ask(pid_t pid, char *err, size_t errlen)
{
	struct nvml n;
	unsigned int count = 0;
	int ret = load(&n, err, errlen);

	if (ret)
		return ret;
	if (n.count(&count) != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlDeviceGetCount_v2 failed");
		ret = -EIO;
	}
	for (unsigned int i = 0; !ret && i < count; i++) {
		nvml_dev d;

		if (n.handle(i, &d) != NVML_SUCCESS) {
			snprintf(err, errlen, "nvmlDeviceGetHandleByIndex_v2(%u) failed", i);
			ret = -EIO;
			break;
		}
		ret = on_device(&n, d, pid, err, errlen);
		if (ret)
			break;
	}
	n.shutdown();
	dlclose(n.h);
	return ret;
}

/*
 * The question runs in a child of criu: nvmlInit starts threads that
 * outlive nvmlShutdown and dlclose, and a criu with a second thread can no
 * longer setns() into a container's mount namespace (measured on the H200:
 * "2 threads in criu after PAUSE_DEVICES" in a training job whose worker
 * processes NVML was asked about). SIGCHLD stays blocked meanwhile, as for
 * the native agent: criu's handlers would call our child an error.
 */
int cuip_nvml_has_context(pid_t pid, char *err, size_t errlen)
{
	struct {
		int ret;
		char err[256];
	} a = {.ret = -EIO};
	struct pollfd pf;
	sigset_t s, old;
	int fd[2], st, ret;
	pid_t c, parent;

	if (pipe2(fd, O_CLOEXEC)) {
		ret = -errno;
		snprintf(err, errlen, "cannot ask NVML: pipe: %s", strerror(errno));
		return ret;
	}
	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	sigprocmask(SIG_BLOCK, &s, &old);
	parent = getpid();
	c = fork();
	if (c == 0) {
		/* It does not outlive criu (killed by the guardian, say). */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
			_exit(1);
		close(fd[0]);
		a.ret = ask(pid, a.err, sizeof(a.err));
		_exit(write(fd[1], &a, sizeof(a)) == (ssize_t)sizeof(a) ? 0 : 1);
	}
	close(fd[1]);
	if (c < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot ask NVML: fork: %s", strerror(errno));
		goto out;
	}
	pf = (struct pollfd){.fd = fd[0], .events = POLLIN};
	while ((ret = poll(&pf, 1, NVML_WAIT_MS)) < 0 && errno == EINTR)
		;
	if (ret == 1 && read(fd[0], &a, sizeof(a)) == (ssize_t)sizeof(a)) {
		ret = a.ret;
		a.err[sizeof(a.err) - 1] = 0;
		if (ret && ret != -ENOENT)
			snprintf(err, errlen, "%s", a.err);
	} else if (ret == 1) {
		ret = -EIO; /* no answer, the pipe closed: the child ended inside NVML */
		snprintf(err, errlen, "the process asking NVML ended without an answer");
	} else {
		ret = -ETIMEDOUT;
		snprintf(err, errlen, "NVML did not answer within %d ms", NVML_WAIT_MS);
	}
	kill(c, SIGKILL);
	/* Reaped with a bound: a child stuck in the driver (D state) is left
	 * to init rather than hold criu. */
	for (int i = 0; i < 200 && waitpid(c, &st, WNOHANG) == 0; i++)
		usleep(10000);
out:
	close(fd[0]);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}
