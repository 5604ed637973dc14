/*
 * release.c - what the job gives back before a checkpoint.
 *
 * A framework's caching allocator keeps freed device memory reserved, and a
 * checkpoint carries every reserved byte. The job may register hooks
 * (cuinterpose_on_checkpoint, cuinterpose.h) that give such memory back,
 * and CUINTERPOSE_RELEASE names built-in ones for Python jobs: `torch`
 * (torch.cuda.empty_cache()), `cupy` (the default memory pools'
 * free_all_blocks()) and `python:STATEMENT` (run in the job's __main__).
 * QUIESCE (ops.c) runs them while the job still runs, before it closes
 * the gate, on the `cuinterpose-rel` thread (every asynchronous signal blocked; Python
 * hooks take the GIL as any thread would), and waits at most its timeout:
 * past it the checkpoint carries what is allocated when the gate closes,
 * and the hooks finish on their own (their CUDA calls wait at the closed
 * gate). Like drain.c, one thread at a time, started on demand (a
 * cuip_worker, thread.h): a QUIESCE that finds the previous round still
 * running neither waits for it nor runs the hooks again.
 * The thread runs the job's code, so its name is outside the plugin's
 * "cuip-" prefix: a restore lets the interposer's own threads run before
 * the job resumes, never this one (a hook that went on running, or a
 * thread ending meanwhile, would break that window).
 *
 * Owns the hook table (rel_mu) and the release worker (its own lock). Calls no other module of the interposer but the
 * runtime (its thread and deadline helpers) and the log; what the hooks
 * call reaches the interposer as the application's calls do.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuinterpose.h"
#include "cuip.h"
#include "driver.h"
#include "log.h"
#include "release.h"
#include "runtime.h"
#include "settings.h"
#include "thread.h"

struct hook {
	void (*fn)(void *);
	void *arg;
};

static pthread_mutex_t rel_mu = PTHREAD_MUTEX_INITIALIZER; /* the hook table */
static struct hook hooks[CUINTERPOSE_MAX_HOOKS];
static unsigned nhooks;

/* ---- the built-in Python hooks ------------------------------------------ */

/* Each runs in a fresh namespace, so the job's __main__ is left alone;
 * a framework the job has not imported (or whose CUDA it has not started)
 * is not touched. */
static const struct {
	const char *name, *code;
} builtin[] = {
	{"torch", "exec(\"import sys\\nt = sys.modules.get('torch')\\n"
		  "if t is not None and t.cuda.is_initialized():\\n    t.cuda.empty_cache()\\n\", {})"},
	{"cupy", "exec(\"import sys\\ncp = sys.modules.get('cupy')\\nif cp is not None:\\n"
		 "    cp.get_default_memory_pool().free_all_blocks()\\n"
		 "    cp.get_default_pinned_memory_pool().free_all_blocks()\\n\", {})"},
};

static const char *python_code; /* CUINTERPOSE_RELEASE's, NULL: none */
static char release_value[128]; /* its value at load, for messages */
unsigned cuip_release_timeout_ms = 5000;

/* The Python C API of the interpreter this process runs, if any: the
 * python3 executable (or an embedding program's libpython) exports it. */
struct python {
	int (*is_initialized)(void);
	int (*gil_ensure)(void);
	void (*gil_release)(int);
	int (*run)(const char *);
};

static bool python_find(struct python *py)
{
	py->is_initialized = (int (*)(void))cuip_real_dlsym(RTLD_DEFAULT, "Py_IsInitialized");
	py->gil_ensure = (int (*)(void))cuip_real_dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
	py->gil_release = (void (*)(int))cuip_real_dlsym(RTLD_DEFAULT, "PyGILState_Release");
	py->run = (int (*)(const char *))cuip_real_dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
	return py->is_initialized && py->gil_ensure && py->gil_release && py->run;
}

static void python_hook(char *why, size_t len)
{
	struct python py;
	int g, r;

	if (!python_find(&py) || !py.is_initialized()) {
		snprintf(why, len, "CUINTERPOSE_RELEASE=%s needs a Python process; this one runs no interpreter",
			 release_value);
		return;
	}
	g = py.gil_ensure();
	r = py.run(python_code); /* an exception's traceback goes to stderr */
	py.gil_release(g);
	if (r)
		snprintf(why, len, "CUINTERPOSE_RELEASE=%s raised an exception (its traceback is on stderr)",
			 release_value);
}

__attribute__((constructor)) static void release_env(void)
{
	const char *v;
	uint64_t ms = 0;
	char err[160];

	/* A bad value of either variable makes cuInit fail (runtime.c,
	 * cuip_settings_refused); the timeout keeps the table's default. */
	cuip_setting_number("CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS", &ms, err, sizeof(err));
	cuip_release_timeout_ms = (unsigned)ms;
	v = getenv("CUINTERPOSE_RELEASE");
	if (!v || !*v || !strcmp(v, "none"))
		return;
	snprintf(release_value, sizeof(release_value), "%s", v);
	if (!strncmp(v, "python:", 7) && v[7]) {
		python_code = strdup(v + 7); /* the job may change its environment */
		return;
	}
	for (size_t i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
		if (!strcmp(v, builtin[i].name))
			python_code = builtin[i].code;
}

/* ---- the release thread --------------------------------------------------- */

/* One round: the built-in Python hook, then the registered ones in order. */
static int release_round(char *msg, size_t len)
{
	struct hook h[CUINTERPOSE_MAX_HOOKS];
	unsigned n;

	pthread_mutex_lock(&rel_mu);
	n = nhooks;
	memcpy(h, hooks, sizeof(h));
	pthread_mutex_unlock(&rel_mu);
	if (python_code)
		python_hook(msg, len);
	for (unsigned i = 0; i < n; i++)
		h[i].fn(h[i].arg);
	return msg[0] ? -EIO : 0;
}

/* The job's code (a Python interpreter, a framework) gets the stack a
 * thread of its own would get by default. */
static struct cuip_worker releaser = CUIP_WORKER_INIT("cuinterpose-rel", release_round, 8 << 20);

bool cuip_release_wanted(void)
{
	bool w;

	pthread_mutex_lock(&rel_mu);
	w = nhooks > 0 || python_code;
	pthread_mutex_unlock(&rel_mu);
	return w;
}

int cuip_release_run(unsigned timeout_ms, char *msg, size_t len)
{
	int ret;

	msg[0] = 0;
	if (!cuip_release_wanted())
		return 0;
	/* A round still running (an earlier QUIESCE went on without it):
	 * neither waited for again nor queued behind it. */
	if (cuip_worker_busy(&releaser)) {
		snprintf(msg, len, "the release hooks of an earlier checkpoint have not returned yet; not run again");
		return -EBUSY;
	}
	ret = cuip_worker_run(&releaser, timeout_ms, msg, len);
	if (ret == -ETIMEDOUT)
		snprintf(msg, len, "the release hooks did not return within %u ms", timeout_ms);
	return ret;
}

CUIP_API int cuinterpose_on_checkpoint(void (*fn)(void *arg), void *arg)
{
	int ret = 0;

	if (!fn)
		return -EINVAL;
	pthread_mutex_lock(&rel_mu);
	if (nhooks == CUINTERPOSE_MAX_HOOKS)
		ret = -ENOSPC;
	else
		hooks[nhooks++] = (struct hook){fn, arg};
	pthread_mutex_unlock(&rel_mu);
	return ret;
}

static void fork_child(void)
{
	/* A forked child has no release thread and none of its parent's
	 * hooks (they name the parent's allocator state). */
	nhooks = 0;
	pthread_mutex_init(&rel_mu, NULL);
	cuip_worker_fork_child(&releaser);
}
CUIP_FORK_HOOK(release, NULL, NULL, fork_child);
