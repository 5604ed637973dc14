/*
 * guardian.c - the rollback owner that outlives criu; see guardian.h.
 * The first half runs in criu (start, progress, end), the second in the
 * guardian (watch, then roll back or kill). Criu's side is touched only by
 * criu's main thread (the coordinator calls on_phase from the hook thread,
 * before and after its phase threads); the guardian is single-threaded
 * until its rollback runs the coordinator.
 */
#include "config.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "guardian.h"
#include "log.h"

#define G_MAGIC 0x47554152u /* "RAUG" */

enum { G_PHASE = 1, G_TOPO, G_END };

struct g_hdr {
	uint32_t magic;
	uint32_t kind;
	uint32_t len;
};

struct g_hello {
	uint32_t magic;
	int32_t pid;
};

#define F_QUIESCED 1u
#define F_TORN	   2u
#define F_UNICAST  4u

/* ---- shared -------------------------------------------------------------- */

static int pidfd_open_(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int pidfd_kill(int pfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0);
}

/* CUINTERPOSE_GUARDIAN_STOP_MS: how long criu may stay stopped (0: forever). */
static int stop_bound(unsigned *ms, char *err, size_t errlen)
{
	const char *v = getenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	char *end;
	unsigned long x;

	*ms = 10000;
	if (!v || !*v)
		return 0;
	errno = 0;
	x = strtoul(v, &end, 10);
	if (errno || *end || x > 3600000) {
		snprintf(err, errlen, "CUINTERPOSE_GUARDIAN_STOP_MS=%s: expected milliseconds, 0 to 3600000", v);
		return -EINVAL;
	}
	*ms = (unsigned)x;
	return 0;
}

/* ---- the guardian -------------------------------------------------------- */

static struct {
	bool restore;
	pid_t criu;
	int ch, pidfd, imgdir, logfd;
	unsigned stop_ms;
	struct cuip_group *g;
	struct cuip_native_proc *nat;
	size_t n_nat;
	const char *freeze_cgroup;
	Cuip__Topology **topo; /* restore: unused */
	pid_t *tree;	       /* restore */
	int *tree_fd;
	size_t n_tree;
	char phase[64]; /* last progress seen, for the log */
	bool after;
	double t_lost;
} W;

static void glog(bool err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void glog(bool err, const char *fmt, ...)
{
	char line[1024], stamp[64];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (err)
		pr_err("guardian: %s", line);
	else
		pr_info("guardian: %s", line);
	if (W.logfd < 0 && W.imgdir >= 0)
		W.logfd = openat(W.imgdir, CUIP_GUARDIAN_LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (W.logfd < 0)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	dprintf(W.logfd, "%s.%03ldZ cuinterpose guardian %d (criu %d): %s\n", stamp, ts.tv_nsec / 1000000,
		(int)getpid(), (int)W.criu, line);
}

static bool read_full(int fd, void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		got += (size_t)n;
	}
	return true;
}

static void apply_flags(const uint8_t *f, size_t n)
{
	for (size_t i = 0; i < n && i < W.g->n; i++) {
		W.g->p[i].quiesced = f[i] & F_QUIESCED;
		W.g->p[i].torn_down = f[i] & F_TORN;
		W.g->p[i].unicast_down = f[i] & F_UNICAST;
	}
}

/* As coord.c's has_mc: multicast state that PREPARE_MULTICAST detaches. */
static bool holds_mc(const Cuip__ProcessState *st)
{
	if (!st)
		return true;
	if (st->n_mc_bindings)
		return true;
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->kind == CUIP__ALLOC_KIND__KIND_MULTICAST)
			return true;
	return false;
}

/* Before a phase: what its steps may do before anyone answers (coord.c's
 * step_quiesce and step_flag mark the same before they send). */
static void apply_before(const char *phase)
{
	for (size_t i = 0; i < W.g->n; i++) {
		struct cuip_part *p = &W.g->p[i];

		if (!strcmp(phase, "QUIESCE")) {
			p->quiesced = true;
		} else if (!strncmp(phase, "PREPARE_MULTICAST", 17)) {
			p->torn_down |= holds_mc(p->st);
		} else if (!strncmp(phase, "PREPARE_UNICAST", 15)) {
			p->torn_down = p->unicast_down = true;
		}
	}
}

/* One message; false on EOF (criu gone or closed). *end: G_END came. */
static bool read_msg(bool *end)
{
	struct g_hdr h;
	uint8_t *buf;

	if (!read_full(W.ch, &h, sizeof(h)) || h.magic != G_MAGIC || h.len > (1u << 30))
		return false;
	buf = malloc(h.len + 1);
	if (!buf || !read_full(W.ch, buf, h.len)) {
		free(buf);
		return false;
	}
	buf[h.len] = 0;
	if (h.kind == G_END) {
		pr_debug("guardian: released: %s", (char *)buf);
		*end = true;
	} else if (h.kind == G_PHASE && h.len >= 1 + 48 && W.g) {
		W.after = buf[0];
		snprintf(W.phase, sizeof(W.phase), "%.48s", (char *)buf + 1);
		if (W.after)
			apply_flags(buf + 1 + 48, h.len - 1 - 48);
		else
			apply_before(W.phase);
	} else if (h.kind == G_TOPO && h.len >= 4 && W.g) {
		uint32_t i;
		Cuip__Topology *t;

		memcpy(&i, buf, 4);
		t = cuip__topology__unpack(NULL, h.len - 4, buf + 4);
		if (t && i < W.g->n) {
			if (W.topo[i])
				cuip__topology__free_unpacked(W.topo[i], NULL);
			W.topo[i] = t;
			W.g->p[i].st = t->state;
			W.g->p[i].carriers = t->carriers;
			W.g->p[i].n_carriers = t->n_carriers;
			W.g->p[i].n_carrier_files = 0;
			for (size_t k = 0; k < t->n_carrier_files && k < CUIP_CARRIER_FILES_MAX; k++)
				W.g->p[i].carrier_files[W.g->p[i].n_carrier_files++] = t->carrier_files[k];
		} else if (t) {
			cuip__topology__free_unpacked(t, NULL);
		}
	}
	free(buf);
	return true;
}

/* What criu sent before it went: read without blocking. */
static bool drain(void)
{
	bool end = false;
	struct pollfd pf = {.fd = W.ch, .events = POLLIN};

	while (!end && W.ch >= 0 && poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN))
		if (!read_msg(&end))
			break;
	return end;
}

static char proc_state(pid_t pid)
{
	char path[64], buf[512], *rp;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' ? rp[2] : 0;
}

static pid_t tracer_of(pid_t pid)
{
	char path[64], line[256];
	int t = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "TracerPid: %d", &t) == 1)
			break;
	fclose(f);
	return t;
}

/* Read a short cgroup file into buf (trailing newline dropped): 0 or -errno. */
static int read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/*
 * --freeze-cgroup: CRIU freezes the job's cgroup unless the plugin asked
 * for interrupt-only seizing; either way a frozen cgroup left behind by a
 * dead criu would keep every task (and the driver's restore threads) from
 * running. v2: cgroup.freeze; v1: freezer.state.
 */
static void thaw_cgroup(void)
{
	char path[PATH_MAX + 32], was[32];
	const char *file, *thawed;
	int fd;

	if (!W.freeze_cgroup || !*W.freeze_cgroup)
		return;
	snprintf(path, sizeof(path), "%s/cgroup.freeze", W.freeze_cgroup);
	file = "cgroup.freeze";
	thawed = "0";
	if (read_small(path, was, sizeof(was))) {
		snprintf(path, sizeof(path), "%s/freezer.state", W.freeze_cgroup);
		file = "freezer.state";
		thawed = "THAWED";
		if (read_small(path, was, sizeof(was))) {
			glog(true, "cannot read the state of the freezer cgroup %s: %s", W.freeze_cgroup,
			     strerror(errno));
			return;
		}
	}
	if (!strcmp(was, thawed))
		return;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, thawed, strlen(thawed)) != (ssize_t)strlen(thawed))
		glog(true, "cannot thaw the freezer cgroup %s (%s is %s): %s", W.freeze_cgroup, file, was,
		     strerror(errno));
	else
		glog(false, "thawed the freezer cgroup %s (%s was %s)", W.freeze_cgroup, file, was);
	if (fd >= 0)
		close(fd);
}

/* The kernel detaches criu's tracees as criu exits; wait until it has. */
static void wait_untraced(const pid_t *pids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < 500 && tracer_of(pids[i]) == W.criu; k++)
			usleep(10000);
}

static int rollback_native(void)
{
	char err[512];
	pid_t *pids = calloc(W.n_nat ? W.n_nat : 1, sizeof(*pids));
	int ret = 0, touched = 0;

	if (!pids)
		return -ENOMEM;
	for (size_t i = 0; i < W.n_nat; i++)
		pids[i] = W.nat[i].pid;
	wait_untraced(pids, W.n_nat);
	free(pids);
	ret = cuip_native_open(W.g->o->libcuda, err, sizeof(err));
	if (ret) {
		glog(true, "cannot start a native agent: %s", err);
		return ret;
	}
	for (size_t i = 0; i < W.n_nat; i++) {
		int st = cuip_native_state(W.nat[i].pid);

		W.nat[i].locked = st == CUIP_NATIVE_LOCKED || st == CUIP_NATIVE_CHECKPOINTED;
		W.nat[i].checkpointed = st == CUIP_NATIVE_CHECKPOINTED;
		touched += W.nat[i].locked;
		if (st < 0)
			glog(true, "pid %d: the driver does not say its state", (int)W.nat[i].pid);
		else if (W.nat[i].locked)
			glog(false, "pid %d is natively %s", (int)W.nat[i].pid, cuip_native_state_name(st));
	}
	if (touched) {
		ret = cuip_native_restore_all(W.nat, W.n_nat, W.g->o->remap, 0, err, sizeof(err));
		if (!ret)
			ret = cuip_native_unlock_all(W.nat, W.n_nat, err, sizeof(err));
		if (ret)
			glog(true, "native restore/unlock failed: %s", err);
		else
			glog(false, "native restore and unlock of %d processes done", touched);
	}
	cuip_native_close();
	return ret;
}

static void __attribute__((noreturn)) rollback_dump(const char *why)
{
	bool any = false;
	int ret = 0;

	glog(true, "%s; last progress: %s %s; rolling the job back (%zu participants, %zu CUDA processes)", why,
	     W.after ? "after" : "in", W.phase[0] ? W.phase : "discovery", W.g->n, W.n_nat);
	thaw_cgroup();
	if (W.n_nat)
		ret = rollback_native();
	for (size_t i = 0; i < W.g->n; i++)
		any |= W.g->p[i].quiesced;
	if (!ret && any) {
		pid_t *pids = calloc(W.g->n, sizeof(*pids));

		for (size_t i = 0; pids && i < W.g->n; i++)
			pids[i] = W.g->p[i].pid;
		if (pids)
			wait_untraced(pids, W.g->n);
		free(pids);
		ret = cuip_group_rollback(W.g);
		if (ret)
			glog(true, "rollback of the participants failed: %s", W.g->err);
	}
	if (ret)
		glog(true, "ROLLBACK FAILED after %.3f s: the job's CUDA processes must be restarted",
		     cuip_now() - W.t_lost);
	else
		glog(false, "rollback complete in %.3f s: the job runs with its sharing intact", cuip_now() - W.t_lost);
	_exit(ret ? 1 : 0);
}

static void __attribute__((noreturn)) kill_restored(const char *why)
{
	glog(true,
	     "%s, before the restore's commit point: killing the restored tree (%zu processes, root %d) so "
	     "that it does not run half-built; the images are unchanged, restore again",
	     why, W.n_tree, W.n_tree ? (int)W.tree[0] : 0);
	for (size_t i = 0; i < W.n_tree; i++)
		if (W.tree_fd[i] >= 0 && pidfd_kill(W.tree_fd[i], SIGKILL) && errno != ESRCH)
			glog(true, "cannot kill pid %d: %s", (int)W.tree[i], strerror(errno));
	glog(false, "restored tree killed %.3f s after criu was lost", cuip_now() - W.t_lost);
	_exit(0);
}

static void __attribute__((noreturn)) lost(const char *why)
{
	if (W.restore)
		kill_restored(why);
	rollback_dump(why);
}

/* Close what criu had open but the guardian must not hold (a container
 * runtime waits for EOF on criu's sockets and pipes). */
static void close_inherited(const int *keep, size_t n)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);

	while (d && (de = readdir(d))) {
		int fd = atoi(de->d_name);
		bool k = de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d) || fd == devnull;

		for (size_t i = 0; i < n; i++)
			k |= keep[i] == fd;
		if (k)
			continue;
		if (fd <= 2 && devnull >= 0)
			dup2(devnull, fd);
		else
			close(fd);
	}
	if (d)
		closedir(d);
	if (devnull > 2)
		close(devnull);
}

static void __attribute__((noreturn)) guardian_main(void)
{
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	int (*log_fd)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "log_get_fd");
	struct g_hello h = {.magic = G_MAGIC, .pid = getpid()};
	int keep[4] = {W.ch, W.imgdir, log_fd ? log_fd() : 2, -1};
	double stopped_since = 0;
	sigset_t none;

	prctl(PR_SET_NAME, CUIP_GUARDIAN_COMM);
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	cuip_agent_forget();
	if (W.g) {
		W.g->on_phase = NULL; /* the rollback below reports to nobody */
		W.g->client = "guardian";
	}
	W.logfd = -1;
	W.pidfd = pidfd_open_(W.criu);
	keep[3] = W.pidfd;
	if (W.pidfd < 0 || getppid() == W.criu)
		_exit(1);
	close_inherited(keep, 4);
	if (W.restore) {
		W.tree_fd = calloc(W.n_tree ? W.n_tree : 1, sizeof(int));
		if (!W.tree_fd)
			_exit(1);
		for (size_t i = 0; i < W.n_tree; i++)
			W.tree_fd[i] = pidfd_open_(W.tree[i]);
	} else {
		W.topo = calloc(W.g->n ? W.g->n : 1, sizeof(*W.topo));
		if (!W.topo)
			_exit(1);
		for (size_t i = 0; i < W.g->n; i++) {
			W.g->p[i].fd = -1; /* criu's connections are criu's */
			W.g->p[i].inspect = W.g->p[i].save = NULL;
		}
	}
	if (write(W.ch, &h, sizeof(h)) != sizeof(h))
		_exit(1);
	for (;;) {
		struct pollfd pf[2] = {{.fd = W.pidfd, .events = POLLIN}, {.fd = W.ch, .events = POLLIN}};
		bool end = false;
		int n = poll(pf, W.ch >= 0 ? 2 : 1, W.stop_ms ? 50 : -1);

		if (n < 0 && errno != EINTR)
			_exit(1);
		if (n > 0 && W.ch >= 0 && (pf[1].revents & (POLLIN | POLLHUP))) {
			if (!read_msg(&end)) {
				close(W.ch);
				W.ch = -1;
			}
			if (end)
				_exit(0);
			continue; /* read everything before looking at criu */
		}
		if (n > 0 && (pf[0].revents & POLLIN)) {
			W.t_lost = cuip_now();
			if (drain())
				_exit(0);
			lost("criu exited (killed or crashed)");
		}
		if (W.stop_ms) {
			char s = proc_state(W.criu);

			if (s != 'T' && s != 't') {
				stopped_since = 0;
			} else if (!stopped_since) {
				stopped_since = cuip_now();
			} else if (cuip_now() - stopped_since >= W.stop_ms / 1000.0) {
				struct pollfd p1 = {.fd = W.pidfd, .events = POLLIN};

				W.t_lost = stopped_since;
				glog(true,
				     "criu (pid %d) has been stopped for %u ms (CUINTERPOSE_GUARDIAN_STOP_MS): "
				     "killing it",
				     (int)W.criu, W.stop_ms);
				pidfd_kill(W.pidfd, SIGKILL);
				poll(&p1, 1, 10000);
				if (drain())
					_exit(0);
				lost("criu was stopped beyond the bound");
			}
		}
	}
}

/* ---- criu's side --------------------------------------------------------- */

static struct {
	pid_t pid;
	int fd;
} G = {.fd = -1};

static int start(char *err, size_t errlen)
{
	struct g_hello h = {0};
	struct pollfd pf;
	sigset_t s, old;
	int sv[2], st, ret = 0;
	pid_t c1;

	if (stop_bound(&W.stop_ms, err, errlen))
		return -EINVAL;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		ret = -errno;
		snprintf(err, errlen, "cannot create the guardian's channel: %s", strerror(errno));
		return ret;
	}
	W.criu = getpid();
	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	sigprocmask(SIG_BLOCK, &s, &old); /* criu's handlers would call our child an error */
	c1 = fork();
	if (c1 == 0) {
		pid_t c2;

		setsid();
		c2 = fork();
		if (c2 == 0) {
			close(sv[0]);
			W.ch = sv[1];
			guardian_main();
		}
		_exit(c2 < 0);
	}
	close(sv[1]);
	if (c1 < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot fork the guardian: %s", strerror(errno));
		close(sv[0]);
		goto out;
	}
	while (waitpid(c1, &st, __WALL) < 0 && errno == EINTR)
		;
	pf = (struct pollfd){.fd = sv[0], .events = POLLIN};
	if (poll(&pf, 1, 10000) != 1 || read(sv[0], &h, sizeof(h)) != sizeof(h) || h.magic != G_MAGIC) {
		snprintf(err, errlen, "the guardian did not start");
		close(sv[0]);
		ret = -EPIPE;
		goto out;
	}
	G.fd = sv[0];
	G.pid = h.pid;
	pr_info("guardian pid %d watches this %s (stop bound %u ms)", (int)G.pid, W.restore ? "restore" : "dump",
		W.stop_ms);
out:
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}

int cuip_guardian_start_dump(struct cuip_group *g, struct cuip_native_proc *nat, size_t n_nat,
			     const char *freeze_cgroup, char *err, size_t errlen)
{
	memset(&W, 0, sizeof(W));
	W.g = g;
	W.nat = nat;
	W.n_nat = n_nat;
	W.freeze_cgroup = freeze_cgroup;
	W.imgdir = g->imgdir;
	W.ch = -1;
	return start(err, errlen);
}

int cuip_guardian_start_restore(const pid_t *tree, size_t n, int imgdir, char *err, size_t errlen)
{
	memset(&W, 0, sizeof(W));
	W.restore = true;
	W.tree = (pid_t *)tree;
	W.n_tree = n;
	W.imgdir = imgdir;
	W.ch = -1;
	return start(err, errlen);
}

static int send_msg(uint32_t kind, const void *a, size_t alen, const void *b, size_t blen)
{
	struct g_hdr h = {.magic = G_MAGIC, .kind = kind, .len = (uint32_t)(alen + blen)};
	struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)a, alen}, {(void *)b, blen}};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = 3};
	size_t want = sizeof(h) + alen + blen;
	ssize_t n;

	if (G.fd < 0)
		return -EPIPE;
	do
		n = sendmsg(G.fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)want)
		return 0;
	/* A short write to a stream socket only happens when the peer is
	 * gone or the buffer was full: finish it blockingly. */
	for (size_t done = n > 0 ? (size_t)n : 0; n >= 0 && done < want;) {
		char tmp[sizeof(h)];
		const char *src;
		size_t off = done, len;

		if (off < sizeof(h)) {
			memcpy(tmp, &h, sizeof(h));
			src = tmp + off;
			len = sizeof(h) - off;
		} else if (off < sizeof(h) + alen) {
			src = (const char *)a + (off - sizeof(h));
			len = alen - (off - sizeof(h));
		} else {
			src = (const char *)b + (off - sizeof(h) - alen);
			len = blen - (off - sizeof(h) - alen);
		}
		n = send(G.fd, src, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			n = 0;
		done += n > 0 ? (size_t)n : 0;
		if (done == want)
			return 0;
	}
	return -EPIPE;
}

static int send_topologies(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		Cuip__Topology t;
		uint8_t *buf;
		uint32_t idx = (uint32_t)i;
		size_t len;
		int ret;

		if (!g->p[i].st)
			continue;
		cuip_group_topology(g, i, &t);
		len = cuip__topology__get_packed_size(&t);
		buf = malloc(len ? len : 1);
		if (!buf)
			return -ENOMEM;
		cuip__topology__pack(&t, buf);
		ret = send_msg(G_TOPO, &idx, sizeof(idx), buf, len);
		free(buf);
		if (ret)
			return ret;
	}
	return 0;
}

int cuip_guardian_phase(struct cuip_group *g, const char *phase, bool after)
{
	uint8_t head[1 + 48] = {after};
	uint8_t *flags;
	int ret;

	if (G.fd < 0)
		return 0; /* none, or its loss was reported once: criu rolls back itself */
	flags = calloc(g->n ? g->n : 1, 1);
	if (!flags)
		return -ENOMEM;
	snprintf((char *)head + 1, 48, "%s", phase);
	for (size_t i = 0; i < g->n; i++)
		flags[i] = (g->p[i].quiesced ? F_QUIESCED : 0) | (g->p[i].torn_down ? F_TORN : 0) |
			   (g->p[i].unicast_down ? F_UNICAST : 0);
	ret = 0;
	if (after && (!strcmp(phase, "INSPECT") || !strcmp(phase, "REINSPECT") || !strcmp(phase, "SAVE")))
		ret = send_topologies(g);
	if (!ret)
		ret = send_msg(G_PHASE, head, sizeof(head), flags, g->n);
	free(flags);
	if (ret) {
		close(G.fd);
		G.fd = -1;
		snprintf(g->err, sizeof(g->err),
			 "the guardian (pid %d) is gone: refusing to go on with %s without it (nobody could roll the "
			 "job "
			 "back if criu died)",
			 (int)G.pid, phase);
		return -EPIPE;
	}
	return 0;
}

void cuip_guardian_end(const char *how)
{
	if (G.fd < 0)
		return;
	send_msg(G_END, how, strlen(how), NULL, 0);
	close(G.fd);
	G.fd = -1;
	G.pid = 0;
}

pid_t cuip_guardian_pid(void)
{
	return G.pid;
}
