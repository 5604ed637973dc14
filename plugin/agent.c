/*
 * agent.c - the native agent; see agent.h. The first half runs in the
 * agent (the child: libcuda, one thread per pid of a request), the second
 * in criu (spawn, call, stop, reap).
 */
#include "config.h"

#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

#define AGENT_MAGIC 0x43554147u /* "GAUC" */

struct agent_hello {
	uint32_t magic;
	int32_t status; /* 0, -ENOENT, -ENOTSUP */
	char err[480];
};

struct agent_req {
	uint32_t magic;
	uint32_t op;
	uint32_t timeout_ms;
	uint32_t n_remap;
	struct cuip_gpu_pair remap[CUIP_MAX_REMAP];
	uint32_t n;
	int32_t pids[CUIP_AGENT_BATCH]; /* only n are sent */
};

struct agent_rep {
	uint32_t magic;
	uint32_t op;
	uint32_t n;
	struct cuip_agent_result r[CUIP_AGENT_BATCH]; /* only n are sent */
};

#define REQ_SIZE(n) (offsetof(struct agent_req, pids) + (size_t)(n) * sizeof(int32_t))
#define REP_SIZE(n) (offsetof(struct agent_rep, r) + (size_t)(n) * sizeof(struct cuip_agent_result))

/* ---- the agent (child side) ------------------------------------------- */

typedef CUresult (*fn_init)(unsigned int);
typedef CUresult (*fn_tid)(int, int *);
typedef CUresult (*fn_state)(int, CUprocessState *);
typedef CUresult (*fn_lock)(int, CUcheckpointLockArgs *);
typedef CUresult (*fn_ckpt)(int, CUcheckpointCheckpointArgs *);
typedef CUresult (*fn_rest)(int, CUcheckpointRestoreArgs *);
typedef CUresult (*fn_unlock)(int, CUcheckpointUnlockArgs *);
typedef CUresult (*fn_errname)(CUresult, const char **);

/* Set once before the first request; read-only while worker threads run. */
static struct {
	fn_init init;
	fn_tid tid;
	fn_state state;
	fn_lock lock;
	fn_ckpt ckpt;
	fn_rest rest;
	fn_unlock unlock;
	fn_errname errname;
} drv;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;

static void do_init(void)
{
	if (drv.init)
		init_result = drv.init(0);
}

/* cuInit only when the driver asks for it, at most once (r555+ answer the
 * checkpoint API without it; the fake needs it). */
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

struct work {
	const struct agent_req *req;
	struct cuip_agent_result *r;
	pthread_t th;
	bool started;
};

static void *work_main(void *a)
{
	struct work *w = a;
	const struct agent_req *q = w->req;
	struct cuip_agent_result *r = w->r;
	int pid = r->pid;
	CUprocessState s = CU_PROCESS_STATE_FAILED;
	CUresult cu = CUDA_SUCCESS;
	const char *name = NULL;

	switch (q->op) {
	case CUIP_AGENT_PROBE:
	case CUIP_AGENT_TID:
		cu = DRV(drv.tid(pid, &r->tid));
		break;
	case CUIP_AGENT_STATE:
		break;
	case CUIP_AGENT_LOCK: {
		CUcheckpointLockArgs la;
		memset(&la, 0, sizeof(la));
		la.timeoutMs = q->timeout_ms;
		cu = DRV(drv.lock(pid, &la));
		break;
	}
	case CUIP_AGENT_CHECKPOINT: {
		CUcheckpointCheckpointArgs ca;
		memset(&ca, 0, sizeof(ca));
		cu = DRV(drv.ckpt(pid, &ca));
		break;
	}
	case CUIP_AGENT_RESTORE: {
		CUcheckpointRestoreArgs ra;
		CUcheckpointGpuPair pairs[CUIP_MAX_REMAP];
		memset(&ra, 0, sizeof(ra));
		for (unsigned i = 0; i < q->n_remap; i++) {
			memcpy(pairs[i].oldUuid.bytes, q->remap[i].old_uuid, 16);
			memcpy(pairs[i].newUuid.bytes, q->remap[i].new_uuid, 16);
		}
		if (q->n_remap) {
			ra.gpuPairs = pairs;
			ra.gpuPairsCount = q->n_remap;
		}
		cu = DRV(drv.rest(pid, &ra));
		break;
	}
	case CUIP_AGENT_UNLOCK: {
		CUcheckpointUnlockArgs ua;
		memset(&ua, 0, sizeof(ua));
		cu = DRV(drv.unlock(pid, &ua));
		break;
	}
	default:
		cu = CUDA_ERROR_INVALID_VALUE;
	}
	r->cu = (int32_t)cu;
	if (cu != CUDA_SUCCESS && drv.errname && drv.errname(cu, &name) == CUDA_SUCCESS && name)
		snprintf(r->cu_name, sizeof(r->cu_name), "%s", name);
	if (q->op == CUIP_AGENT_TID) {
		r->state_cu = CUDA_SUCCESS;
		r->state = -1;
		return NULL;
	}
	r->state_cu = (int32_t)DRV(drv.state(pid, &s));
	r->state = r->state_cu == CUDA_SUCCESS ? (int32_t)s : -1;
	return NULL;
}

static void serve(int fd, struct agent_req *q, struct agent_rep *rep)
{
	static struct work w[CUIP_AGENT_BATCH];

	for (;;) {
		ssize_t len = recv(fd, q, sizeof(*q), 0);

		if (len <= 0 && errno == EINTR)
			continue;
		if (len <= 0)
			return; /* criu closed the channel (or died) */
		if ((size_t)len < REQ_SIZE(0) || q->magic != AGENT_MAGIC || q->n > CUIP_AGENT_BATCH ||
		    (size_t)len != REQ_SIZE(q->n) || q->n_remap > CUIP_MAX_REMAP)
			return;
		memset(rep, 0, REP_SIZE(q->n));
		rep->magic = AGENT_MAGIC;
		rep->op = q->op;
		rep->n = q->n;
		for (uint32_t i = 0; i < q->n; i++) {
			rep->r[i].pid = q->pids[i];
			w[i] = (struct work){.req = q, .r = &rep->r[i]};
			if (pthread_create(&w[i].th, NULL, work_main, &w[i]))
				work_main(&w[i]);
			else
				w[i].started = true;
		}
		for (uint32_t i = 0; i < q->n; i++)
			if (w[i].started)
				pthread_join(w[i].th, NULL);
		if (send(fd, rep, REP_SIZE(q->n), MSG_NOSIGNAL) < 0)
			return;
	}
}

static int load(const char *lib, struct agent_hello *h)
{
	void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	if (!dl) {
		snprintf(h->err, sizeof(h->err), "cannot load the CUDA driver %.200s: %.200s", lib, dlerror());
		return -ENOENT;
	}
	drv.init = (fn_init)dlsym(dl, "cuInit");
	drv.tid = (fn_tid)dlsym(dl, "cuCheckpointProcessGetRestoreThreadId");
	drv.state = (fn_state)dlsym(dl, "cuCheckpointProcessGetState");
	drv.lock = (fn_lock)dlsym(dl, "cuCheckpointProcessLock");
	drv.ckpt = (fn_ckpt)dlsym(dl, "cuCheckpointProcessCheckpoint");
	drv.rest = (fn_rest)dlsym(dl, "cuCheckpointProcessRestore");
	drv.unlock = (fn_unlock)dlsym(dl, "cuCheckpointProcessUnlock");
	drv.errname = (fn_errname)dlsym(dl, "cuGetErrorName");
	if (!drv.tid || !drv.state || !drv.lock || !drv.ckpt || !drv.rest || !drv.unlock) {
		snprintf(h->err, sizeof(h->err),
			 "the CUDA driver %.300s has no cuCheckpointProcess* API (driver r555 or newer is needed)",
			 lib);
		return -ENOTSUP;
	}
	return 0;
}

/* The child: a clean process around libcuda, then requests until EOF. */
static void __attribute__((noreturn)) agent_main(int fd, pid_t parent, const char *lib)
{
	struct agent_hello h = {.magic = AGENT_MAGIC};
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	struct agent_req *q;
	struct agent_rep *rep;
	sigset_t none;

	/* Die with criu; nothing of criu's (handlers, mask, descriptors) stays. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	prctl(PR_SET_NAME, CUIP_AGENT_COMM);
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (fd != 3) {
		if (dup2(fd, 3) < 0)
			_exit(1);
		fd = 3;
	}
	for (int i = 4; i < 65536; i++) /* close_range() needs glibc 2.34 */
		close(i);

	h.status = load(lib, &h);
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) < 0 || h.status)
		_exit(h.status ? 2 : 1);
	q = malloc(sizeof(*q));
	rep = malloc(sizeof(*rep));
	if (q && rep)
		serve(fd, q, rep);
	_exit(0); /* no atexit handlers: the driver's threads may still be in it */
}

/* ---- criu side -------------------------------------------------------- */

static struct {
	pid_t pid;
	int fd;
	char lib[PATH_MAX];
	char exit_why[128]; /* how the last agent ended, when it died */
} A = {.fd = -1};

static void describe_status(int st, char *buf, size_t len)
{
	if (WIFSIGNALED(st))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	else if (WIFEXITED(st))
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	else
		snprintf(buf, len, "wait status 0x%x", st);
}

/* Reap the agent, waiting up to `ms` before SIGKILL. */
static void reap(unsigned ms)
{
	int st = 0;
	pid_t r;

	if (A.fd >= 0)
		close(A.fd);
	A.fd = -1;
	if (A.pid <= 0)
		return;
	for (unsigned waited = 0;; waited += 10) {
		r = waitpid(A.pid, &st, WNOHANG | __WALL);
		if (r != 0 || waited >= ms)
			break;
		usleep(10000);
	}
	if (r == 0) {
		kill(A.pid, SIGKILL);
		r = waitpid(A.pid, &st, __WALL);
	}
	if (r == A.pid)
		describe_status(st, A.exit_why, sizeof(A.exit_why));
	else
		snprintf(A.exit_why, sizeof(A.exit_why), "gone (already reaped: %s)", strerror(errno));
	A.pid = 0;
}

/*
 * SIGCHLD stays blocked while the agent may exit under us: criu installs
 * SIGCHLD handlers that reap any child and call it an error (dump's
 * parasite handling, restore). Delivered after the reap, such a handler
 * finds nothing to wait for.
 */
static void block_chld(sigset_t *old)
{
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	sigprocmask(SIG_BLOCK, &s, old);
}

static int spawn(char *err, size_t errlen)
{
	struct agent_hello h;
	pid_t parent = getpid();
	sigset_t old;
	int sv[2], ret = 0;
	ssize_t len;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		ret = -errno;
		snprintf(err, errlen, "cannot create the native agent's channel: %s", strerror(errno));
		return ret;
	}
	block_chld(&old);
	A.pid = fork();
	if (A.pid == 0) {
		close(sv[0]);
		agent_main(sv[1], parent, A.lib);
	}
	close(sv[1]);
	if (A.pid < 0) {
		ret = -errno;
		A.pid = 0;
		close(sv[0]);
		snprintf(err, errlen, "cannot fork the native agent: %s", strerror(errno));
		goto out;
	}
	A.fd = sv[0];
	do
		len = recv(A.fd, &h, sizeof(h), 0);
	while (len < 0 && errno == EINTR);
	if (len != (ssize_t)sizeof(h) || h.magic != AGENT_MAGIC) {
		reap(2000);
		snprintf(err, errlen, "the native agent did not start: %s", A.exit_why);
		ret = -EPIPE;
		goto out;
	}
	if (h.status) {
		h.err[sizeof(h.err) - 1] = 0;
		snprintf(err, errlen, "%s", h.err);
		ret = h.status;
		reap(2000);
	}
out:
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}

int cuip_agent_start(const char *lib, char *err, size_t errlen)
{
	if (A.pid > 0 && !strcmp(A.lib, lib))
		return 0;
	cuip_agent_stop();
	snprintf(A.lib, sizeof(A.lib), "%s", lib);
	return spawn(err, errlen);
}

pid_t cuip_agent_pid(void)
{
	return A.pid;
}

/*
 * How long to wait for the agent's answer, in ms (-1: as long as it takes).
 * The queries answer at once from a live target, but NVIDIA's driver blocks
 * GetState while the target's threads are stopped (a SIGSTOPped or frozen
 * participant): bounded by CUINTERPOSE_DRIVER_TIMEOUT_MS (default 5 s,
 * under CRIU's own 10 s dump timeout).
 * Lock has its own timeout, plus that margin; checkpoint and restore move
 * all of a process's device memory and take as long as they take.
 */
static int answer_wait_ms(enum cuip_agent_op op, unsigned timeout_ms)
{
	const char *env = getenv("CUINTERPOSE_DRIVER_TIMEOUT_MS");
	long margin = env && *env ? strtol(env, NULL, 10) : 5000;

	if (margin <= 0)
		return -1;
	switch (op) {
	case CUIP_AGENT_PROBE:
	case CUIP_AGENT_STATE:
	case CUIP_AGENT_TID:
		return (int)margin;
	case CUIP_AGENT_LOCK:
		return timeout_ms ? (int)(timeout_ms + margin) : -1;
	default:
		return -1;
	}
}

static const char *op_call_name(enum cuip_agent_op op)
{
	switch (op) {
	case CUIP_AGENT_PROBE:
		return "cuCheckpointProcessGetRestoreThreadId/GetState";
	case CUIP_AGENT_STATE:
		return "cuCheckpointProcessGetState";
	case CUIP_AGENT_TID:
		return "cuCheckpointProcessGetRestoreThreadId";
	case CUIP_AGENT_LOCK:
		return "cuCheckpointProcessLock";
	default:
		return "the driver call";
	}
}

int cuip_agent_call(enum cuip_agent_op op, const pid_t *pids, size_t n, unsigned timeout_ms,
		    const struct cuip_gpu_pair *remap, unsigned n_remap, struct cuip_agent_result *res, char *err,
		    size_t errlen)
{
	int wait_ms = answer_wait_ms(op, timeout_ms);
	bool late = false;
	struct agent_req *q;
	struct agent_rep *rep = NULL;
	pid_t agent;
	sigset_t old;
	ssize_t len;
	int ret = 0;

	if (n > CUIP_AGENT_BATCH || n_remap > CUIP_MAX_REMAP)
		return -E2BIG;
	if (!n)
		return 0;
	if (!A.lib[0]) {
		snprintf(err, errlen, "no CUDA driver library was named for the native agent");
		return -ENOENT;
	}
	if (A.pid <= 0 && (ret = spawn(err, errlen)))
		return ret;
	q = calloc(1, sizeof(*q));
	rep = malloc(sizeof(*rep));
	if (!q || !rep) {
		free(q);
		free(rep);
		return -ENOMEM;
	}
	q->magic = AGENT_MAGIC;
	q->op = op;
	q->timeout_ms = timeout_ms;
	q->n_remap = n_remap;
	if (n_remap)
		memcpy(q->remap, remap, n_remap * sizeof(*remap));
	q->n = (uint32_t)n;
	for (size_t i = 0; i < n; i++)
		q->pids[i] = pids[i];
	agent = A.pid;
	block_chld(&old);
	if (send(A.fd, q, REQ_SIZE(n), MSG_NOSIGNAL) < 0) {
		len = -1;
	} else {
		struct pollfd pfd = {.fd = A.fd, .events = POLLIN};
		int pr;

		do
			pr = poll(&pfd, 1, wait_ms);
		while (pr < 0 && errno == EINTR);
		if (pr == 0) {
			late = true;
			len = -1;
		} else {
			do
				len = recv(A.fd, rep, sizeof(*rep), 0);
			while (len < 0 && errno == EINTR);
		}
	}
	if (late) {
		/* The agent is stuck in the driver: kill it (a fresh one
		 * starts on the next call) and name the processes. */
		kill(agent, SIGKILL);
		reap(2000);
		snprintf(err, errlen,
			 "%s timed out after %d ms for pid %d%s (is the process stopped? "
			 "CUINTERPOSE_DRIVER_TIMEOUT_MS sets this limit)",
			 op_call_name(op), wait_ms, (int)pids[0], n > 1 ? " and others" : "");
		ret = -ETIMEDOUT;
	} else if (len != (ssize_t)REP_SIZE(n) || rep->magic != AGENT_MAGIC || rep->op != (uint32_t)op || rep->n != n) {
		reap(len == 0 ? 2000 : 0);
		snprintf(err, errlen, "the native agent (pid %d) died with %zu driver calls in flight: %s", agent, n,
			 A.exit_why);
		ret = -EPIPE;
	} else {
		memcpy(res, rep->r, n * sizeof(*res));
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	free(q);
	free(rep);
	return ret;
}

void cuip_agent_stop(void)
{
	sigset_t old;

	if (A.pid <= 0 && A.fd < 0)
		return;
	block_chld(&old);
	reap(2000);
	sigprocmask(SIG_SETMASK, &old, NULL);
}

void cuip_agent_forget(void)
{
	/* A fork of criu (the guardian): the agent is criu's child, not ours;
	 * our copy of criu's end of the channel must not keep it alive. */
	if (A.fd >= 0)
		close(A.fd);
	A.fd = -1;
	A.pid = 0;
}
