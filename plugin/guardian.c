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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "gphase.h"
#include "guardian.h"
#include "proc.h"
#include "outside.h"
#include "procstat.h"
#include "pstree.h"
#include "criulog.h"
#include "settings.h"
#include "wire.h"

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
	uint64_t v = 0;
	int ret = cuip_setting_number("CUINTERPOSE_GUARDIAN_STOP_MS", &v, err, errlen);

	*ms = (unsigned)v; /* the default, also for a bad value */
	return ret < 0 ? ret : 0;
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
	Cuip__GuardianMessage **topo; /* per participant, the last topology (restore: unused) */
	struct cuip_pstree img;	      /* restore: the images' tree */
	unsigned long long t0;	      /* restore: the guardian's start, in clock ticks since boot */
	int *pre_fd;		      /* restore: per image process, the process at its pid when the guardian started */
	int depth;		      /* restore: how many pid namespaces deep the guardian is (NSpid's levels) */
	int init_fd;		      /* restore in a new pid namespace: a pidfd of its init, seen as criu's child */
	pid_t root_ppid;	      /* restore: the parent of the images' root when first found, or -1 */
	pid_t init_pid;
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

static void apply_flags(const Cuip__GuardianPhase *ph)
{
	for (size_t i = 0; i < ph->n_flags && i < W.g->n; i++) {
		W.g->p[i].quiesced = ph->flags[i]->quiesced;
		W.g->p[i].torn_down = ph->flags[i]->torn_down;
		W.g->p[i].unicast_down = ph->flags[i]->unicast_down;
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
static void apply_before(enum cuip_gphase phase)
{
	for (size_t i = 0; i < W.g->n; i++) {
		struct cuip_part *p = &W.g->p[i];

		switch (cuip_gphase_base(phase)) {
		case CUIP_GPHASE_QUIESCE:
			p->quiesced = true;
			break;
		case CUIP_GPHASE_PREPARE_MULTICAST:
			p->torn_down |= holds_mc(p->st);
			break;
		case CUIP_GPHASE_PREPARE_UNICAST:
			p->torn_down = p->unicast_down = true;
			break;
		default:
			break;
		}
	}
}

/* Participant t->index's topology, kept with its message. */
static void take_topology(Cuip__GuardianMessage *m)
{
	const Cuip__Topology *t = m->topology->topology;
	uint32_t i = m->topology->index;
	struct cuip_part *p = &W.g->p[i];

	if (W.topo[i])
		cuip__guardian_message__free_unpacked(W.topo[i], NULL);
	W.topo[i] = m;
	p->st = t->state;
	p->carriers = t->carriers;
	p->n_carriers = t->n_carriers;
	p->n_carrier_files = 0;
	for (size_t k = 0; k < t->n_carrier_files && k < CUIP_CARRIER_FILES_MAX; k++)
		p->carrier_files[p->n_carrier_files++] = t->carrier_files[k];
}

/* One message; false when the channel is done: EOF (criu gone or closed)
 * or a message this build cannot read (logged; the guardian then watches
 * criu without it). *end: criu ended the duty. */
static bool read_msg(bool *end)
{
	Cuip__GuardianMessage *m;
	char err[256];
	int ret = cuip_msg_recv(W.ch, CUIP_KIND_GUARDIAN, &cuip__guardian_message__descriptor, NULL,
				(ProtobufCMessage **)&m, NULL, err, sizeof(err));

	if (ret) {
		if (ret != -ECONNRESET)
			glog(true, "criu's channel: %s; watching criu without it", err);
		return false;
	}
	switch (m->body_case) {
	case CUIP__GUARDIAN_MESSAGE__BODY_END:
		pr_debug("guardian: released: %s", m->end);
		*end = true;
		break;
	case CUIP__GUARDIAN_MESSAGE__BODY_PHASE:
		if (!W.g)
			break;
		W.after = m->phase->after;
		snprintf(W.phase, sizeof(W.phase), "%.48s", m->phase->phase);
		if (W.after)
			apply_flags(m->phase);
		else
			apply_before(cuip_gphase_parse(W.phase));
		break;
	case CUIP__GUARDIAN_MESSAGE__BODY_TOPOLOGY:
		if (W.g && m->topology->index < W.g->n) {
			take_topology(m);
			return true; /* kept */
		}
		glog(true, "criu sent the topology of participant %u of %zu: ignored", m->topology->index,
		     W.g ? W.g->n : 0);
		break;
	default:
		glog(true, "criu sent a guardian message of unknown kind %d: ignored", (int)m->body_case);
	}
	cuip__guardian_message__free_unpacked(m, NULL);
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

/* Field 3 of /proc/PID/stat; 0 when it cannot be read. */
static char proc_state(pid_t pid)
{
	struct cuip_proc_stat st;

	return cuip_proc_stat_read(pid, &st) ? 0 : st.state;
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

/* Read a short cgroup or /proc file into buf (trailing newline dropped): 0
 * or -errno. */
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

/* Gone for good: no such process, or a zombie. */
static bool gone(pid_t pid)
{
	char s = proc_state(pid);

	return !s || s == 'Z' || s == 'X';
}

/* The driver's state of pid; a query that fails (the agent's bound: the
 * target's restore thread busy or stopped) is asked again, up to 3 times,
 * while the process lives. */
static int native_state_of(pid_t pid)
{
	int st = -EIO;

	for (int k = 0; k < 3 && !gone(pid); k++) {
		st = cuip_native_state(pid);
		if (st >= 0)
			break;
	}
	return st;
}

/*
 * The assertion before any "rollback complete" (#45): every CUDA process
 * that lives is natively RUNNING again, by the driver's word after the
 * unlock, not by our flags. One that is not (left locked or checkpointed,
 * failed, or unreadable) fails the rollback, named in the log: the job
 * would otherwise be reported rolled back with a process that cannot run.
 */
static int check_running(void)
{
	int ret = 0;

	for (size_t i = 0; i < W.n_nat; i++) {
		int st = native_state_of(W.nat[i].pid);

		if (st == CUIP_NATIVE_RUNNING || (st < 0 && gone(W.nat[i].pid)))
			continue;
		glog(true, "pid %d is natively %s after the rollback's unlock: it cannot run", (int)W.nat[i].pid,
		     st < 0 ? "unreadable" : cuip_native_state_name(st));
		ret = -EIO;
	}
	return ret;
}

static int rollback_native(void)
{
	char err[512];
	pid_t *pids = calloc(W.n_nat ? W.n_nat : 1, sizeof(*pids));
	int ret = 0, touched = 0, unknown = 0;

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
		int st = native_state_of(W.nat[i].pid);

		W.nat[i].locked = st == CUIP_NATIVE_LOCKED || st == CUIP_NATIVE_CHECKPOINTED;
		W.nat[i].checkpointed = st == CUIP_NATIVE_CHECKPOINTED;
		touched += W.nat[i].locked;
		if (st < 0 && gone(W.nat[i].pid)) {
			glog(true, "pid %d died during the dump", (int)W.nat[i].pid);
		} else if (st < 0) {
			/* Alive, and nobody knows whether it is locked: a
			 * rollback that went on would call it running. */
			glog(true, "pid %d: the driver does not say its state: it may be left locked",
			     (int)W.nat[i].pid);
			unknown++;
		} else if (W.nat[i].locked) {
			glog(false, "pid %d is natively %s", (int)W.nat[i].pid, cuip_native_state_name(st));
		}
	}
	if (touched) { /* the others still get their restore and unlock */
		ret = cuip_native_restore_all(W.nat, W.n_nat, W.g->o->remap, 0, err, sizeof(err));
		if (!ret)
			ret = cuip_native_unlock_all(W.nat, W.n_nat, err, sizeof(err));
		if (ret)
			glog(true, "native restore/unlock failed: %s", err);
		else
			glog(false, "native restore and unlock of %d processes done", touched);
	}
	/* after a failure too: the log names every process left unable to run */
	if (check_running() && !ret)
		ret = -EIO;
	if (unknown && !ret)
		ret = -EIO;
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

/* /proc/PID/stat: its parent and its start (clock ticks after boot); 0, or
 * -1 when it is gone. */
static int stat_of(pid_t pid, pid_t *ppid, unsigned long long *start)
{
	struct cuip_proc_stat st;

	if (cuip_proc_stat_read(pid, &st))
		return -1;
	*ppid = st.ppid;
	*start = st.start;
	return 0;
}

/* /proc/PID/status's NSpid (outside.h): how many levels, and the innermost
 * pid. */
static int nspid_of(pid_t pid, pid_t *inner)
{
	pid_t v[32];
	int n = cuip_proc_nspid(pid, v, 32);

	if (n > 0 && n <= 32)
		*inner = v[n - 1];
	return n;
}

static ino_t pidns_of(pid_t pid)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
	return stat(path, &st) ? 0 : st.st_ino;
}

/* PID is pid 1 of a pid namespace one level below the guardian's. */
static bool pid1_below(pid_t pid)
{
	pid_t inner = 0;

	return nspid_of(pid, &inner) == W.depth + 1 && inner == 1;
}

/* The images' root is pid 1: CRIU restores them in a new pid namespace. */
static bool images_in_new_pidns(void)
{
	return W.img.n && W.img.t[0].pid == 1;
}

struct victim {
	pid_t pid;
	int fd;
};

/*
 * The images' processes that this restore created (no pid namespace: CRIU
 * gives each its pid of the images), beyond the n already in v: a process
 * at such a pid counts only if it started after the guardian (which the
 * plugin started at init(RESTORE), before criu forks anything), and, below
 * the root, if its parent is its parent of the images (already counted) or
 * the root's parent (the reaper that took both from the dead criu, and
 * that takes the children of every victim killed). Anything else at one
 * of those pids is not ours and is left alone (said on the first look).
 * Returns the new count.
 */
static size_t find_tree(struct victim *v, size_t n, bool first)
{
	for (size_t i = 0; i < W.img.n; i++) {
		pid_t pid = W.img.t[i].pid, ppid;
		unsigned long long start;
		bool ours, seen = false;
		int fd;

		for (size_t k = 0; k < n && !seen; k++)
			seen = v[k].pid == pid;
		if (seen)
			continue;
		fd = pidfd_open_(pid);
		if (fd < 0)
			continue;
		if (stat_of(pid, &ppid, &start)) {
			close(fd);
			continue;
		}
		/* the one that held the pid before the restore began, still there */
		ours = start >= W.t0 && !(W.pre_fd[i] >= 0 && !pidfd_kill(W.pre_fd[i], 0));
		if (ours && i) {
			bool parent_ours = ppid == W.root_ppid;

			for (size_t k = 0; k < n && !parent_ours; k++)
				parent_ours = v[k].pid == ppid && ppid == W.img.t[i].ppid;
			ours = parent_ours;
		}
		/* the pidfd pins the process read: still alive, it is the one */
		if (ours && pidfd_kill(fd, 0)) {
			close(fd);
			continue;
		}
		if (!ours) {
			if (first)
				glog(false,
				     "pid %d (of the images) is not a process of this restore (started before it or "
				     "under another parent): left alone",
				     (int)pid);
			close(fd);
			continue;
		}
		if (!i)
			W.root_ppid = ppid;
		v[n++] = (struct victim){.pid = pid, .fd = fd};
	}
	return n;
}

/*
 * The images' root is pid 1: CRIU restores the tree in a new pid namespace
 * whose init is the root, at a pid of our namespace that the images do not
 * say. It is the process one namespace level below ours whose pid there is
 * 1, started after the guardian, and every process of its namespace has a
 * pid of the images there. Killing it kills its whole namespace.
 */
static size_t find_ns_init(struct victim *v)
{
	pid_t found = 0;
	int many = 0;
	struct dirent *de;
	DIR *d = opendir("/proc");

	if (!d) {
		glog(true, "cannot list /proc: %s", strerror(errno));
		return 0;
	}
	while ((de = readdir(d))) {
		pid_t pid = (pid_t)atoi(de->d_name), ppid;
		unsigned long long start;

		ino_t ns;
		bool all;

		if (pid <= 0 || !pid1_below(pid))
			continue;
		if (stat_of(pid, &ppid, &start)) {
			glog(false,
			     "pid %d is pid 1 of a pid namespace whose /proc/%d/stat cannot be read: passed over",
			     (int)pid, (int)pid);
			continue;
		}
		if (start < W.t0) {
			/* said, so that a restore whose init was not found shows
			 * every init it passed over and why */
			glog(false,
			     "pid %d is pid 1 of a pid namespace that started before this guardian: not this "
			     "restore's",
			     (int)pid);
			continue;
		}
		/* A namespace is born with its init and dies with it: one whose
		 * init started after the guardian did not exist before the
		 * restore began. (Not by the namespace's inode: a namespace of
		 * an earlier restore, gone since, may have left its number to
		 * this one.) */
		ns = pidns_of(pid);
		all = ns != 0;
		if (!all)
			glog(false,
			     "pid %d is pid 1 of a pid namespace this guardian cannot read (/proc/%d/ns/pid): "
			     "passed over",
			     (int)pid, (int)pid);
		{
			struct dirent *e2;
			DIR *d2 = opendir("/proc");

			while (all && d2 && (e2 = readdir(d2))) {
				pid_t q = (pid_t)atoi(e2->d_name), qi = 0;

				if (q > 0 && pidns_of(q) == ns && nspid_of(q, &qi) == W.depth + 1 &&
				    !cuip_pstree_has(&W.img, qi)) {
					all = false;
					glog(false,
					     "pid %d is pid 1 of a pid namespace that also holds pid %d (%d there), "
					     "which "
					     "is not in the images: passed over",
					     (int)pid, (int)q, (int)qi);
				}
			}
			if (d2)
				closedir(d2);
			if (!all)
				continue;
		}
		if (found)
			many++;
		found = pid;
	}
	closedir(d);
	if (many) {
		glog(true, "%d new pid namespaces look like this restore's: killing none of them", many + 1);
		return 0;
	}
	if (found) {
		int fd = pidfd_open_(found);

		if (fd >= 0) {
			v[0] = (struct victim){.pid = found, .fd = fd};
			glog(false, "the restored tree is the pid namespace of pid %d (pid 1 there)", (int)found);
			return 1;
		}
		glog(true, "pid %d, pid 1 of this restore's pid namespace, cannot be pinned: %s", (int)found,
		     strerror(errno));
	}
	return 0;
}

/*
 * A restore into a new pid namespace: criu clones the images' root into it
 * itself, so while criu runs, its child one level below the guardian whose
 * pid there is 1 is this restore's init, with no other evidence needed
 * (CRIU may have helpers of its own in that namespace while it restores).
 * Pinned by a pidfd taken before checking that it is still criu's child,
 * so that the pid cannot have passed to another process. Called while
 * criu lives, until found; an init that exits while criu lives (a restore
 * that failed and is retried, or a probe of criu's own) is let go.
 */
static void watch_ns_init(void)
{
	char path[64], buf[4096];
	struct dirent *de;
	DIR *d;

	if (W.init_fd >= 0) {
		struct pollfd pf = {.fd = W.init_fd, .events = POLLIN};

		if (poll(&pf, 1, 0) != 1)
			return;
		glog(false, "pid %d, criu's child in a new pid namespace, exited while criu runs: let go",
		     (int)W.init_pid);
		close(W.init_fd);
		W.init_fd = -1;
		W.init_pid = 0;
	}
	snprintf(path, sizeof(path), "/proc/%d/task", (int)W.criu);
	d = opendir(path);
	if (!d)
		return;
	while (W.init_fd < 0 && (de = readdir(d))) {
		int tid = atoi(de->d_name);
		char *p = buf, *end;

		snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)W.criu, tid);
		if (tid <= 0 || read_small(path, buf, sizeof(buf)))
			continue;
		for (long c; (c = strtol(p, &end, 10)) > 0 && end != p; p = end) {
			unsigned long long start;
			pid_t ppid;
			int fd;

			if (!pid1_below((pid_t)c))
				continue;
			fd = pidfd_open_((pid_t)c);
			if (fd < 0)
				continue;
			if (stat_of((pid_t)c, &ppid, &start) || ppid != W.criu || start < W.t0) {
				close(fd);
				continue;
			}
			W.init_fd = fd;
			W.init_pid = (pid_t)c;
			glog(false, "pid %d, criu's child, is pid 1 of a new pid namespace: this restore's tree",
			     (int)c);
			break;
		}
	}
	closedir(d);
}

/* The init of the restored tree's pid namespace: the one seen as criu's
 * child if it still lives, else found by its namespace. */
static size_t ns_init(struct victim *v)
{
	if (W.init_fd >= 0 && pidfd_kill(W.init_fd, 0) == 0) {
		v[0] = (struct victim){.pid = W.init_pid, .fd = W.init_fd};
		glog(false, "the restored tree is the pid namespace of pid %d (pid 1 there, criu's child)",
		     (int)W.init_pid);
		return 1;
	}
	if (W.init_fd >= 0)
		glog(false, "pid %d, seen as criu's child in a new pid namespace, is gone: looking for another",
		     (int)W.init_pid);
	return find_ns_init(v);
}

/*
 * What exists before criu forks anything: a process at a pid of the
 * images (pinned by a pidfd: while it lives, the pid is its own, and it is
 * not this restore's).
 */
static void note_preexisting(void)
{
	W.pre_fd = calloc(W.img.n ? W.img.n : 1, sizeof(int));
	if (!W.pre_fd)
		_exit(1);
	for (size_t i = 0; i < W.img.n; i++)
		W.pre_fd[i] = pidfd_open_(W.img.t[i].pid);
}

/* Kill v[from..n) and wait until each has exited, within 10 s of losing
 * criu; 0, or how many still run (each said). *failed is set when a kill
 * was refused. */
static size_t kill_victims(struct victim *v, size_t from, size_t n, int *failed)
{
	size_t left = 0;

	for (size_t i = from; i < n; i++) {
		char comm[32];

		cuip_proc_comm(v[i].pid, comm, sizeof(comm));
		if (pidfd_kill(v[i].fd, SIGKILL) && errno != ESRCH) {
			glog(true, "cannot kill pid %d: %s", (int)v[i].pid, strerror(errno));
			*failed = 1;
		} else {
			glog(false, "killed pid %d (%s)", (int)v[i].pid, comm);
		}
	}
	/* bounded: SIGKILL ends a process within moments, stopped or traced */
	for (size_t i = from; i < n; i++) {
		struct pollfd pf = {.fd = v[i].fd, .events = POLLIN};
		double rest = 10.0 - (cuip_now() - W.t_lost);

		if (rest <= 0 || poll(&pf, 1, (int)(rest * 1000)) != 1) {
			glog(true, "pid %d did not exit within 10 s of SIGKILL", (int)v[i].pid);
			left++;
		}
	}
	return left;
}

/* Test seam (guardian.h): NULL in the product. */
void (*cuip_guardian_test_before_kill)(void);

/*
 * Kill what this restore made of the tree. In a new pid namespace, its
 * init: the namespace dies with it. Without one, the processes at the
 * images' pids, in rounds: a process found alive may fork another of the
 * images (CRIU's restore forks the tree from its root down) after the look
 * and before its SIGKILL, so once every victim of a round has exited (its
 * children passed to the reaper), the images' pids are looked at again,
 * until a look finds no new process. A victim cannot fork once dead, and
 * each round kills at least one process of the images, so this ends.
 */
static void __attribute__((noreturn)) kill_restored(const char *why)
{
	struct victim *v = calloc(W.img.n ? W.img.n : 1, sizeof(*v));
	bool pidns = images_in_new_pidns();
	size_t n = 0, left = 0;
	int ret = 0, rounds = 0;

	glog(true,
	     "%s, before the restore's commit point: killing the restored tree (%zu processes in the images, root "
	     "%d%s) so that it does not run half-built; the images are unchanged, restore again",
	     why, W.img.n, W.img.n ? (int)W.img.t[0].pid : 0, pidns ? " in a new pid namespace" : "");
	if (!v)
		_exit(1);
	for (;;) {
		size_t from = n;

		n = pidns ? ns_init(v) : find_tree(v, n, rounds == 0);
		if (n == from)
			break;
		if (rounds)
			glog(false,
			     "%zu more process(es) of the images appeared after the look before (forked by a victim "
			     "before its SIGKILL)",
			     n - from);
		rounds++;
		if (cuip_guardian_test_before_kill)
			cuip_guardian_test_before_kill();
		left += kill_victims(v, from, n, &ret);
		if (pidns || left)
			break;
	}
	if (!n)
		glog(false, "no process of the restored tree exists: nothing to kill");
	if (left) {
		glog(true, "%zu process(es) of the restored tree still run: kill them before restoring again", left);
		_exit(1);
	}
	glog(false, "restored tree killed %.3f s after criu was lost", cuip_now() - W.t_lost);
	_exit(ret);
}

static void __attribute__((noreturn)) lost(const char *why)
{
	if (W.restore)
		kill_restored(why);
	rollback_dump(why);
}

static void __attribute__((noreturn)) guardian_main(void)
{
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	int (*log_fd)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "log_get_fd");
	Cuip__GuardianMessage h = CUIP__GUARDIAN_MESSAGE__INIT;
	int keep[4] = {W.ch, W.imgdir, log_fd ? log_fd() : 2, -1};
	double stopped_since = 0;
	sigset_t none;
	bool watch;

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
	cuip_proc_close_inherited(keep, 4);
	if (W.restore) {
		struct rlimit rl;
		pid_t ppid, self_inner;

		/* two pidfds per process of the images, at most */
		if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		if (stat_of(getpid(), &ppid, &W.t0))
			_exit(1);
		W.depth = nspid_of(getpid(), &self_inner);
		W.init_fd = -1;
		W.root_ppid = -1;
		note_preexisting();
	} else {
		W.topo = calloc(W.g->n ? W.g->n : 1, sizeof(*W.topo));
		if (!W.topo)
			_exit(1);
		for (size_t i = 0; i < W.g->n; i++) {
			W.g->p[i].fd = -1; /* criu's connections are criu's */
			W.g->p[i].inspect = W.g->p[i].save = NULL;
		}
	}
	watch = W.restore && images_in_new_pidns();
	/* poll() says a message starts; this bounds one that never ends
	 * (criu stopped mid-write), so the stop bound below still runs. */
	setsockopt(W.ch, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){2, 0}, sizeof(struct timeval));
	h.body_case = CUIP__GUARDIAN_MESSAGE__BODY_HELLO;
	h.hello = getpid();
	if (cuip_msg_send(W.ch, CUIP_KIND_GUARDIAN, &h.base, -1))
		_exit(1);
	for (;;) {
		struct pollfd pf[2] = {{.fd = W.pidfd, .events = POLLIN}, {.fd = W.ch, .events = POLLIN}};
		bool end = false;
		int n = poll(pf, W.ch >= 0 ? 2 : 1, W.stop_ms || watch ? 50 : -1);

		if (n < 0 && errno != EINTR)
			_exit(1);
		if (watch)
			watch_ns_init();
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
	Cuip__GuardianMessage *h = NULL;
	struct pollfd pf;
	char why[256] = "no answer within 10 s";
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
	if (poll(&pf, 1, 10000) != 1 ||
	    cuip_msg_recv(sv[0], CUIP_KIND_GUARDIAN, &cuip__guardian_message__descriptor, NULL, (ProtobufCMessage **)&h,
			  NULL, why, sizeof(why)) ||
	    h->body_case != CUIP__GUARDIAN_MESSAGE__BODY_HELLO) {
		snprintf(err, errlen, "the guardian did not start: %s", h ? "its first message is not a hello" : why);
		if (h)
			cuip__guardian_message__free_unpacked(h, NULL);
		close(sv[0]);
		ret = -EPIPE;
		goto out;
	}
	G.fd = sv[0];
	G.pid = h->hello;
	cuip__guardian_message__free_unpacked(h, NULL);
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

int cuip_guardian_start_restore(const struct cuip_pstree *img, int imgdir, char *err, size_t errlen)
{
	int ret;

	memset(&W, 0, sizeof(W));
	W.restore = true;
	W.img = *img;
	W.imgdir = imgdir;
	W.ch = -1;
	ret = start(err, errlen);
	memset(&W.img, 0, sizeof(W.img)); /* the guardian has its copy; the caller owns img */
	return ret;
}

static int send_msg(const Cuip__GuardianMessage *m)
{
	if (G.fd < 0)
		return -EPIPE;
	return cuip_msg_send(G.fd, CUIP_KIND_GUARDIAN, &m->base, -1);
}

static int send_topologies(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		Cuip__GuardianMessage m = CUIP__GUARDIAN_MESSAGE__INIT;
		Cuip__GuardianTopology gt = CUIP__GUARDIAN_TOPOLOGY__INIT;
		Cuip__Topology t;
		int ret;

		if (!g->p[i].st)
			continue;
		cuip_group_topology(g, i, &t);
		gt.index = (uint32_t)i;
		gt.topology = &t;
		m.body_case = CUIP__GUARDIAN_MESSAGE__BODY_TOPOLOGY;
		m.topology = &gt;
		ret = send_msg(&m);
		if (ret)
			return ret;
	}
	return 0;
}

static int send_phase(struct cuip_group *g, const char *phase, bool after)
{
	Cuip__GuardianMessage m = CUIP__GUARDIAN_MESSAGE__INIT;
	Cuip__GuardianPhase ph = CUIP__GUARDIAN_PHASE__INIT;
	Cuip__GuardianFlags *fv = calloc(g->n ? g->n : 1, sizeof(*fv));
	Cuip__GuardianFlags **fp = calloc(g->n ? g->n : 1, sizeof(*fp));
	int ret = -ENOMEM;

	if (!fv || !fp)
		goto out;
	for (size_t i = 0; i < g->n; i++) {
		cuip__guardian_flags__init(&fv[i]);
		fv[i].has_quiesced = fv[i].has_torn_down = fv[i].has_unicast_down = true;
		fv[i].quiesced = g->p[i].quiesced;
		fv[i].torn_down = g->p[i].torn_down;
		fv[i].unicast_down = g->p[i].unicast_down;
		fp[i] = &fv[i];
	}
	ph.phase = (char *)phase;
	ph.after = after;
	ph.n_flags = g->n;
	ph.flags = fp;
	m.body_case = CUIP__GUARDIAN_MESSAGE__BODY_PHASE;
	m.phase = &ph;
	ret = send_msg(&m);
out:
	free(fv);
	free(fp);
	return ret;
}

int cuip_guardian_phase(struct cuip_group *g, const char *phase, bool after)
{
	enum cuip_gphase ph = cuip_gphase_parse(phase);
	int ret = 0;

	if (G.fd < 0)
		return 0; /* none, or its loss was reported once: criu rolls back itself */
	if (after && (ph == CUIP_GPHASE_INSPECT || ph == CUIP_GPHASE_REINSPECT || ph == CUIP_GPHASE_SAVE))
		ret = send_topologies(g);
	if (!ret)
		ret = send_phase(g, phase, after);
	if (ret == -ENOMEM) {
		/* Nothing was sent (the frame is encoded before the first
		 * byte goes): the channel stays, and the guardian still gets
		 * the end of its duty when criu rolls back. */
		snprintf(g->err, sizeof(g->err), "out of memory for the guardian's report of %s", phase);
		return ret;
	}
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
	Cuip__GuardianMessage m = CUIP__GUARDIAN_MESSAGE__INIT;

	if (G.fd < 0)
		return;
	m.body_case = CUIP__GUARDIAN_MESSAGE__BODY_END;
	m.end = (char *)how;
	send_msg(&m);
	close(G.fd);
	G.fd = -1;
	G.pid = 0;
}

pid_t cuip_guardian_pid(void)
{
	return G.pid;
}
