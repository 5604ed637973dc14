/*
 * nvml.c - NVML's list of compute processes (nvml.h). The library is
 * opened with dlopen and closed after each question: the plugin must load
 * in criu on machines without it (and with the fake driver, which has none).
 */
#include "nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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

int cuip_nvml_has_context(pid_t pid, char *err, size_t errlen)
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
