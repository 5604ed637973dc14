/*
 * native.c - driver-API native checkpoint, in parallel; see native.h.
 *
 * State: the dlopen'ed library and its entry points, set once by
 * cuip_native_open (under a mutex) and read-only afterwards; the cuInit
 * fallback runs at most once (pthread_once).
 */
#include "config.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "native.h"

typedef CUresult (*fn_init)(unsigned int);
typedef CUresult (*fn_tid)(int, int *);
typedef CUresult (*fn_state)(int, CUprocessState *);
typedef CUresult (*fn_lock)(int, CUcheckpointLockArgs *);
typedef CUresult (*fn_ckpt)(int, CUcheckpointCheckpointArgs *);
typedef CUresult (*fn_rest)(int, CUcheckpointRestoreArgs *);
typedef CUresult (*fn_unlock)(int, CUcheckpointUnlockArgs *);
typedef CUresult (*fn_errname)(CUresult, const char **);

static struct {
	void *h;
	fn_init init;
	fn_tid tid;
	fn_state state;
	fn_lock lock;
	fn_ckpt ckpt;
	fn_rest rest;
	fn_unlock unlock;
	fn_errname errname;
} drv;

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result;

static void do_init(void)
{
	init_result = drv.init ? drv.init(0) : CUDA_ERROR_NOT_INITIALIZED;
	if (init_result != CUDA_SUCCESS)
		pr_warn("cuInit(0) in criu failed with %d", (int)init_result);
}

static const char *cuerr(CUresult r)
{
	const char *s = NULL;

	if (drv.errname && drv.errname(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "CUDA error";
}

int cuip_native_open(const char *lib, char *err, size_t errlen)
{
	int ret = 0;

	pthread_mutex_lock(&open_lock);
	if (drv.h)
		goto out;
	drv.h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!drv.h) {
		snprintf(err, errlen, "cannot load the CUDA driver %s in criu: %s", lib, dlerror());
		ret = -ENOENT;
		goto out;
	}
	drv.init = (fn_init)dlsym(drv.h, "cuInit");
	drv.tid = (fn_tid)dlsym(drv.h, "cuCheckpointProcessGetRestoreThreadId");
	drv.state = (fn_state)dlsym(drv.h, "cuCheckpointProcessGetState");
	drv.lock = (fn_lock)dlsym(drv.h, "cuCheckpointProcessLock");
	drv.ckpt = (fn_ckpt)dlsym(drv.h, "cuCheckpointProcessCheckpoint");
	drv.rest = (fn_rest)dlsym(drv.h, "cuCheckpointProcessRestore");
	drv.unlock = (fn_unlock)dlsym(drv.h, "cuCheckpointProcessUnlock");
	drv.errname = (fn_errname)dlsym(drv.h, "cuGetErrorName");
	if (!drv.tid || !drv.state || !drv.lock || !drv.ckpt || !drv.rest || !drv.unlock) {
		snprintf(err, errlen,
			 "the CUDA driver %s has no cuCheckpointProcess* API (driver r555 or newer is needed)", lib);
		dlclose(drv.h);
		memset(&drv, 0, sizeof(drv));
		ret = -ENOTSUP;
	}
out:
	pthread_mutex_unlock(&open_lock);
	return ret;
}

bool cuip_native_available(void)
{
	return drv.h != NULL;
}

/* Retry a driver call once after cuInit if the driver asks for it. */
#define DRV(call)                                          \
	({                                                 \
		CUresult __r = (call);                     \
		if (__r == CUDA_ERROR_NOT_INITIALIZED) {   \
			pthread_once(&init_once, do_init); \
			if (init_result == CUDA_SUCCESS)   \
				__r = (call);              \
		}                                          \
		__r;                                       \
	})

const char *cuip_native_state_name(int s)
{
	switch (s) {
	case CUIP_NATIVE_RUNNING:
		return "running";
	case CUIP_NATIVE_LOCKED:
		return "locked";
	case CUIP_NATIVE_CHECKPOINTED:
		return "checkpointed";
	case CUIP_NATIVE_FAILED:
		return "failed";
	}
	return "unknown";
}

int cuip_native_state(pid_t pid)
{
	CUprocessState s;
	CUresult r;

	if (!drv.h)
		return -ENOENT;
	r = DRV(drv.state(pid, &s));
	return r == CUDA_SUCCESS ? (int)s : -EIO;
}

int cuip_native_probe(pid_t pid, int *tid, int *state, char *err, size_t errlen)
{
	CUprocessState s;
	CUresult r;

	if (!drv.h)
		return -ENOENT;
	r = DRV(drv.tid(pid, tid));
	if (r != CUDA_SUCCESS)
		return -ENOENT; /* no CUDA in this process (or not yet) */
	r = DRV(drv.state(pid, &s));
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuCheckpointProcessGetState(%d) failed: %s (%d)", pid, cuerr(r), (int)r);
		return -EIO;
	}
	*state = (int)s;
	return 0;
}

enum op { OP_LOCK, OP_CHECKPOINT, OP_RESTORE, OP_UNLOCK };

struct native_job {
	struct cuip_native_proc *p;
	enum op op;
	unsigned timeout_ms;
	const struct cuip_gpu_pair *remap;
	unsigned n_remap;
	pthread_t th;
	bool run, started;
};

static const char *op_name(enum op op)
{
	static const char *n[] = {"cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
				  "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"};
	return n[op];
}

static void *native_main(void *a)
{
	struct native_job *j = a;
	struct cuip_native_proc *p = j->p;
	int want = CUIP_NATIVE_RUNNING, now;
	CUresult r = CUDA_SUCCESS;

	switch (j->op) {
	case OP_LOCK: {
		CUcheckpointLockArgs la;
		memset(&la, 0, sizeof(la));
		la.timeoutMs = j->timeout_ms;
		r = DRV(drv.lock(p->pid, &la));
		want = CUIP_NATIVE_LOCKED;
		if (r == CUDA_SUCCESS)
			p->locked = true;
		break;
	}
	case OP_CHECKPOINT: {
		CUcheckpointCheckpointArgs ca;
		memset(&ca, 0, sizeof(ca));
		r = DRV(drv.ckpt(p->pid, &ca));
		want = CUIP_NATIVE_CHECKPOINTED;
		if (r == CUDA_SUCCESS)
			p->checkpointed = true;
		break;
	}
	case OP_RESTORE: {
		CUcheckpointRestoreArgs ra;
		CUcheckpointGpuPair pairs[CUIP_MAX_REMAP];
		memset(&ra, 0, sizeof(ra));
		if (j->n_remap) {
			for (unsigned i = 0; i < j->n_remap; i++) {
				memcpy(pairs[i].oldUuid.bytes, j->remap[i].old_uuid, 16);
				memcpy(pairs[i].newUuid.bytes, j->remap[i].new_uuid, 16);
			}
			ra.gpuPairs = pairs;
			ra.gpuPairsCount = j->n_remap;
		}
		r = DRV(drv.rest(p->pid, &ra));
		want = CUIP_NATIVE_LOCKED;
		if (r == CUDA_SUCCESS)
			p->checkpointed = false;
		break;
	}
	case OP_UNLOCK: {
		CUcheckpointUnlockArgs ua;
		memset(&ua, 0, sizeof(ua));
		r = DRV(drv.unlock(p->pid, &ua));
		want = CUIP_NATIVE_RUNNING;
		if (r == CUDA_SUCCESS)
			p->locked = false;
		break;
	}
	}
	if (r != CUDA_SUCCESS) {
		snprintf(p->err, sizeof(p->err), "%s(pid %d) failed: %s (%d)", op_name(j->op), p->pid, cuerr(r),
			 (int)r);
		p->status = r == CUDA_ERROR_TIMEOUT ? -ETIMEDOUT : -EIO;
		return NULL;
	}
	now = cuip_native_state(p->pid);
	if (now != want) {
		snprintf(p->err, sizeof(p->err), "after %s pid %d is %s, expected %s", op_name(j->op), p->pid,
			 now < 0 ? "unreadable" : cuip_native_state_name(now), cuip_native_state_name(want));
		p->status = -EIO;
	}
	return NULL;
}

static int run_all(struct cuip_native_proc *v, size_t n, enum op op, unsigned timeout_ms,
		   const struct cuip_gpu_pair *remap, unsigned n_remap,
		   bool (*applies)(const struct cuip_native_proc *), char *err, size_t errlen)
{
	struct native_job jobs[n ? n : 1];
	size_t count = 0;
	double t0 = cuip_now();
	int ret = 0;

	for (size_t i = 0; i < n; i++) {
		jobs[i] = (struct native_job){
			.p = &v[i], .op = op, .timeout_ms = timeout_ms, .remap = remap, .n_remap = n_remap};
		v[i].status = 0;
		v[i].err[0] = 0;
		if (!applies(&v[i]))
			continue;
		jobs[i].run = true;
		count++;
		if (pthread_create(&jobs[i].th, NULL, native_main, &jobs[i]))
			native_main(&jobs[i]);
		else
			jobs[i].started = true;
	}
	for (size_t i = 0; i < n; i++)
		if (jobs[i].started)
			pthread_join(jobs[i].th, NULL);
	for (size_t i = 0; i < n; i++) {
		if (!jobs[i].run || !v[i].status)
			continue;
		pr_err("native: %s", v[i].err);
		if (!ret) {
			ret = v[i].status;
			snprintf(err, errlen, "%s", v[i].err);
		}
	}
	if (count)
		pr_info("NATIVE %s: %zu processes, %.3f s%s", op_name(op) + strlen("cuCheckpointProcess"), count,
			cuip_now() - t0, ret ? " (FAILED)" : "");
	return ret;
}

static bool want_lock(const struct cuip_native_proc *p)
{
	return p->initial == CUIP_NATIVE_RUNNING && !p->locked;
}

static bool want_checkpoint(const struct cuip_native_proc *p)
{
	return p->locked && !p->checkpointed && p->initial != CUIP_NATIVE_CHECKPOINTED;
}

static bool want_restore(const struct cuip_native_proc *p)
{
	return p->checkpointed;
}

static bool want_unlock(const struct cuip_native_proc *p)
{
	return p->locked;
}

int cuip_native_lock_all(struct cuip_native_proc *v, size_t n, unsigned timeout_ms, char *err, size_t errlen)
{
	return run_all(v, n, OP_LOCK, timeout_ms, NULL, 0, want_lock, err, errlen);
}

int cuip_native_checkpoint_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen)
{
	return run_all(v, n, OP_CHECKPOINT, 0, NULL, 0, want_checkpoint, err, errlen);
}

int cuip_native_restore_all(struct cuip_native_proc *v, size_t n, const struct cuip_gpu_pair *remap, unsigned n_remap,
			    char *err, size_t errlen)
{
	return run_all(v, n, OP_RESTORE, 0, remap, n_remap, want_restore, err, errlen);
}

int cuip_native_unlock_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen)
{
	return run_all(v, n, OP_UNLOCK, 0, NULL, 0, want_unlock, err, errlen);
}
