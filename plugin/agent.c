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
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "settings.h"
#include "wire.h"

_Static_assert(sizeof(pid_t) == sizeof(int32_t), "pids travel as int32");

/* How long the agent may take to load the driver and say hello. */
#define HELLO_WAIT_MS 30000
/* How long the rest of a frame may take once its first byte came. */
#define FRAME_WAIT_S 10

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
	const Cuip__AgentRequest *req;
	struct cuip_agent_result *r;
	pthread_t th;
	bool started;
};

static void *work_main(void *a)
{
	struct work *w = a;
	const Cuip__AgentRequest *q = w->req;
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
		for (size_t i = 0; i < q->n_remap; i++) { /* 16 bytes each: checked by invalid_request */
			memcpy(pairs[i].oldUuid.bytes, q->remap[i]->old_uuid.data, 16);
			memcpy(pairs[i].newUuid.bytes, q->remap[i]->new_uuid.data, 16);
		}
		if (q->n_remap) {
			ra.gpuPairs = pairs;
			ra.gpuPairsCount = (unsigned)q->n_remap;
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

/* A request the agent can run: NULL, or what is wrong with it. */
static const char *invalid_request(const Cuip__AgentMessage *m)
{
	const Cuip__AgentRequest *q = m->request;

	if (m->body_case != CUIP__AGENT_MESSAGE__BODY_REQUEST)
		return "a message that is not a request";
	if (q->n_pids > CUIP_AGENT_BATCH || q->n_remap > CUIP_MAX_REMAP)
		return "a request larger than the agent's batch";
	for (size_t i = 0; i < q->n_remap; i++)
		if (q->remap[i]->old_uuid.len != 16 || q->remap[i]->new_uuid.len != 16)
			return "a GPU pair whose UUIDs are not 16 bytes";
	return NULL;
}

/* The answer to q from res[0..n): one frame on fd. */
static int reply(int fd, const Cuip__AgentRequest *q, struct cuip_agent_result *res)
{
	static Cuip__AgentResult rv[CUIP_AGENT_BATCH];
	static Cuip__AgentResult *rp[CUIP_AGENT_BATCH];
	Cuip__AgentReply rep = CUIP__AGENT_REPLY__INIT;
	Cuip__AgentMessage m = CUIP__AGENT_MESSAGE__INIT;

	for (size_t i = 0; i < q->n_pids; i++) {
		cuip__agent_result__init(&rv[i]);
		rv[i].pid = res[i].pid;
		rv[i].cu = res[i].cu;
		rv[i].has_tid = true;
		rv[i].tid = res[i].tid;
		rv[i].state_cu = res[i].state_cu;
		rv[i].state = res[i].state;
		rv[i].cu_name = res[i].cu_name[0] ? res[i].cu_name : NULL;
		rp[i] = &rv[i];
	}
	rep.op = q->op;
	rep.n_results = q->n_pids;
	rep.results = rp;
	m.body_case = CUIP__AGENT_MESSAGE__BODY_REPLY;
	m.reply = &rep;
	return cuip_msg_send(fd, CUIP_KIND_AGENT, &m.base, -1);
}

/* Requests until criu closes the channel; a request that does not decode
 * or cannot be run ends the agent with status 3 (criu reports it). */
static int serve(int fd)
{
	static struct work w[CUIP_AGENT_BATCH];
	static struct cuip_agent_result res[CUIP_AGENT_BATCH];

	for (;;) {
		Cuip__AgentMessage *m;
		const Cuip__AgentRequest *q;
		const char *bad;
		char err[256];
		int ret = cuip_msg_recv(fd, CUIP_KIND_AGENT, &cuip__agent_message__descriptor, NULL,
					(ProtobufCMessage **)&m, NULL, err, sizeof(err));

		if (ret == -ECONNRESET)
			return 0; /* criu closed the channel (or died) */
		if (ret) {
			fprintf(stderr, "cuinterpose native agent: %s\n", err);
			return 3;
		}
		if ((bad = invalid_request(m))) {
			fprintf(stderr, "cuinterpose native agent: criu sent %s\n", bad);
			cuip__agent_message__free_unpacked(m, NULL);
			return 3;
		}
		q = m->request;
		memset(res, 0, q->n_pids * sizeof(*res));
		for (size_t i = 0; i < q->n_pids; i++) {
			res[i].pid = q->pids[i];
			w[i] = (struct work){.req = q, .r = &res[i]};
			if (pthread_create(&w[i].th, NULL, work_main, &w[i]))
				work_main(&w[i]);
			else
				w[i].started = true;
		}
		for (size_t i = 0; i < q->n_pids; i++)
			if (w[i].started)
				pthread_join(w[i].th, NULL);
		ret = reply(fd, q, res);
		cuip__agent_message__free_unpacked(m, NULL);
		if (ret)
			return 0; /* criu is gone */
	}
}

static int load(const char *lib, char *err, size_t errlen)
{
	void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	if (!dl) {
		snprintf(err, errlen, "cannot load the CUDA driver %.200s: %.200s", lib, dlerror());
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
		snprintf(err, errlen,
			 "the CUDA driver %.300s has no cuCheckpointProcess* API (driver r555 or newer is needed)",
			 lib);
		return -ENOTSUP;
	}
	return 0;
}

/* The child: a clean process around libcuda, then requests until EOF. */
static void __attribute__((noreturn)) agent_main(int fd, pid_t parent, const char *lib)
{
	Cuip__AgentHello h = CUIP__AGENT_HELLO__INIT;
	Cuip__AgentMessage m = CUIP__AGENT_MESSAGE__INIT;
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	char err[480] = "";
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

	h.status = load(lib, err, sizeof(err));
	h.error = h.status ? err : NULL;
	m.body_case = CUIP__AGENT_MESSAGE__BODY_HELLO;
	m.hello = &h;
	if (cuip_msg_send(fd, CUIP_KIND_AGENT, &m.base, -1) || h.status)
		_exit(h.status ? 2 : 1);
	_exit(serve(fd)); /* no atexit handlers: the driver's threads may still be in it */
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

/* Wait up to ms for the agent's next message (ms < 0: no bound), then read
 * it: 0 with *out set, -ETIMEDOUT, or the reader's error (err filled). */
static int agent_recv(int ms, Cuip__AgentMessage **out, char *err, size_t errlen)
{
	struct pollfd pfd = {.fd = A.fd, .events = POLLIN};
	int pr;

	do
		pr = poll(&pfd, 1, ms);
	while (pr < 0 && errno == EINTR);
	if (pr == 0)
		return -ETIMEDOUT;
	return cuip_msg_recv(A.fd, CUIP_KIND_AGENT, &cuip__agent_message__descriptor, NULL, (ProtobufCMessage **)out,
			     NULL, err, errlen);
}

static int spawn(char *err, size_t errlen)
{
	Cuip__AgentMessage *m = NULL;
	pid_t parent = getpid();
	char why[256];
	sigset_t old;
	int sv[2], ret = 0;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
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
	/* poll() bounds the wait for an answer to start; this bounds a frame
	 * that starts and never ends (a broken agent): no read blocks for
	 * longer. */
	setsockopt(A.fd, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){FRAME_WAIT_S, 0}, sizeof(struct timeval));
	ret = agent_recv(HELLO_WAIT_MS, &m, why, sizeof(why));
	if (ret == -ETIMEDOUT) {
		kill(A.pid, SIGKILL);
		reap(2000);
		snprintf(err, errlen, "the native agent did not start: no answer within %d ms of loading %s",
			 HELLO_WAIT_MS, A.lib);
		ret = -EPIPE;
	} else if (ret == -ECONNRESET || ret == -ENODATA) {
		reap(2000);
		snprintf(err, errlen, "the native agent did not start: %s", A.exit_why);
		ret = -EPIPE;
	} else if (ret || m->body_case != CUIP__AGENT_MESSAGE__BODY_HELLO) {
		reap(0);
		snprintf(err, errlen, "the native agent did not start: its first message: %s",
			 ret ? why : "not a hello");
		ret = -EPROTO;
	} else if (m->hello->status) {
		snprintf(err, errlen, "%s", m->hello->error ? m->hello->error : "the native agent failed to start");
		ret = m->hello->status < 0 ? m->hello->status : -EIO;
		reap(2000);
	}
	if (m)
		cuip__agent_message__free_unpacked(m, NULL);
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
 * under CRIU's own 10 s dump timeout; its value was checked against the
 * settings table at init, cuip_opts_load).
 * Lock has its own timeout, plus that margin; checkpoint and restore move
 * all of a process's device memory and take as long as they take.
 */
static int answer_wait_ms(enum cuip_agent_op op, unsigned timeout_ms)
{
	uint64_t v = 0;
	char err[160];
	long margin;

	/* checked at init: a bad value is not expected here, and it leaves
	 * the table's default */
	cuip_setting_number("CUINTERPOSE_DRIVER_TIMEOUT_MS", &v, err, sizeof(err));
	margin = (long)v;
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

/* The reply answers op on pids[0..n), in order: NULL, or what is wrong. */
static const char *invalid_reply(const Cuip__AgentMessage *m, enum cuip_agent_op op, const pid_t *pids, size_t n)
{
	if (m->body_case != CUIP__AGENT_MESSAGE__BODY_REPLY)
		return "a message that is not a reply";
	if (m->reply->op != (uint32_t)op)
		return "the reply to another operation";
	if (m->reply->n_results != n)
		return "a reply with another number of results";
	for (size_t i = 0; i < n; i++)
		if (m->reply->results[i]->pid != pids[i])
			return "results for other pids";
	return NULL;
}

static void copy_results(const Cuip__AgentReply *rep, struct cuip_agent_result *res)
{
	for (size_t i = 0; i < rep->n_results; i++) {
		const Cuip__AgentResult *r = rep->results[i];

		res[i] = (struct cuip_agent_result){
			.pid = r->pid, .cu = r->cu, .tid = r->tid, .state_cu = r->state_cu, .state = r->state};
		snprintf(res[i].cu_name, sizeof(res[i].cu_name), "%s", r->cu_name ? r->cu_name : "");
	}
}

int cuip_agent_call(enum cuip_agent_op op, const pid_t *pids, size_t n, unsigned timeout_ms,
		    const struct cuip_gpu_pair *remap, unsigned n_remap, struct cuip_agent_result *res, char *err,
		    size_t errlen)
{
	int wait_ms = answer_wait_ms(op, timeout_ms);
	Cuip__GpuPair pv[CUIP_MAX_REMAP], *pp[CUIP_MAX_REMAP];
	Cuip__AgentRequest q = CUIP__AGENT_REQUEST__INIT;
	Cuip__AgentMessage m = CUIP__AGENT_MESSAGE__INIT, *in = NULL;
	const char *bad = NULL;
	char why[256];
	pid_t agent;
	sigset_t old;
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
	for (unsigned i = 0; i < n_remap; i++) {
		cuip__gpu_pair__init(&pv[i]);
		pv[i].old_uuid = (ProtobufCBinaryData){16, (uint8_t *)remap[i].old_uuid};
		pv[i].new_uuid = (ProtobufCBinaryData){16, (uint8_t *)remap[i].new_uuid};
		pp[i] = &pv[i];
	}
	q.op = op;
	q.has_timeout_ms = true;
	q.timeout_ms = timeout_ms;
	q.n_remap = n_remap;
	q.remap = pp;
	q.n_pids = n;
	q.pids = (int32_t *)pids;
	m.body_case = CUIP__AGENT_MESSAGE__BODY_REQUEST;
	m.request = &q;
	agent = A.pid;
	block_chld(&old);
	ret = cuip_msg_send(A.fd, CUIP_KIND_AGENT, &m.base, -1);
	if (ret == -ENOMEM) {
		snprintf(err, errlen, "out of memory for a request to the native agent");
		goto out;
	}
	if (!ret)
		ret = agent_recv(wait_ms, &in, why, sizeof(why));
	if (!ret && (bad = invalid_reply(in, op, pids, n)))
		ret = -EPROTO;
	if (ret == -ETIMEDOUT) {
		/* The agent is stuck in the driver: kill it (a fresh one
		 * starts on the next call) and name the processes. */
		kill(agent, SIGKILL);
		reap(2000);
		snprintf(err, errlen,
			 "%s timed out after %d ms for pid %d%s (is the process stopped? "
			 "CUINTERPOSE_DRIVER_TIMEOUT_MS sets this limit)",
			 op_call_name(op), wait_ms, (int)pids[0], n > 1 ? " and others" : "");
	} else if (ret == -ECONNRESET || ret == -ENODATA || ret == -EPIPE) {
		reap(2000);
		snprintf(err, errlen, "the native agent (pid %d) died with %zu driver calls in flight: %s", agent, n,
			 A.exit_why);
		ret = -EPIPE;
	} else if (ret) {
		/* Alive but its answer unreadable (another format, damaged,
		 * cut off mid-frame past the receive bound, or no memory here
		 * to read it): the stream is out of step and nothing more it
		 * says can be trusted, so it is stopped, and the caller reads
		 * the states again through a fresh one, as after a death. */
		kill(agent, SIGKILL);
		reap(2000);
		snprintf(err, errlen,
			 "the native agent (pid %d) was stopped: its answer to %zu driver call(s) cannot be read: %s",
			 agent, n, bad ? bad : why);
		ret = -EPIPE;
	} else {
		copy_results(in->reply, res);
	}
out:
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (in)
		cuip__agent_message__free_unpacked(in, NULL);
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
