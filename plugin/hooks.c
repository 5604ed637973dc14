/*
 * hooks.c - the CRIU plugin: hook entry points, the per-stage state that
 * carries the group from one hook to the next, and the glue between
 * discovery (proc.c, sockdiag.c), the coordinator (coord.c), native
 * checkpoint (native.c, tracee.c) and the images (protocol/images.c).
 *
 * CRIU calls every hook from its main thread, serially; this module's state
 * (`S`) is touched only there. The whole group is handled at the first call
 * of each hook; later calls only check that nothing new appeared.
 *
 * Hook order and ptrace states (CRIU 4.1.1, criu/seize.c, cr-dump.c,
 * cr-restore.c): init(DUMP); PAUSE_DEVICES(root real pid) before anything
 * is frozen, then once per child while the tree is collected;
 * CHECKPOINT_DEVICES(real pid) for every live task after the whole tree is
 * frozen (threads in PTRACE_INTERRUPT stops); fini(DUMP, ret) after the
 * images are written, tasks still frozen, before CRIU kills them or lets
 * them run (--leave-running, or any failure). Restore: init(RESTORE)
 * before any task exists (the restore's guardian starts there),
 * POST_FORKING once the root is forked, then
 * RESUME_DEVICES_LATE(real pid) per live task, root first, after every
 * thread stopped at the syscall-exit of rt_sigreturn; its return value is
 * only logged. All pids are "real" (criu's pid namespace).
 *
 * criu stays single-threaded between hooks: a multithreaded criu cannot
 * setns() into a container's mount namespace. Driver calls run in the
 * native agent, a child process (agent.c) stopped at the end of restore and
 * in fini, before criu waits for its children; the coordinator's and
 * sock_diag's threads are joined before their calls return.
 */
#include "config.h"

#include <dlfcn.h>
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* CRIU finds the plugin through CR_PLUGIN_DESC: the one exported symbol. */
#pragma GCC visibility push(default)
#include <criu-plugin.h>
#pragma GCC visibility pop

#include "coord.h"
#include "devfiles.h"
#include "fault.h"
#include "errfmt.h"
#include "gpus.h"
#include "guardian.h"
#include "images.h"
#include "criulog.h"
#include "native.h"
#include "nvml.h"
#include "options.h"
#include "pstree.h"
#include "prefetch.h"
#include "proc.h"
#include "sockdiag.h"
#include "startgate.h"
#include "tracee.h"
#include "startmark.h"

#define PLUGIN_NAME "cuinterpose"

static struct {
	int stage;
	bool disabled; /* decline every hook with -ENOTSUP */
	bool active;   /* the dump/restore involves CUDA processes */
	bool paused;   /* first PAUSE_DEVICES done */
	int pause_ret;
	bool checkpointed; /* first CHECKPOINT_DEVICES done */
	bool resumed;	   /* first RESUME_DEVICES_LATE done */
	int resume_ret;
	bool prepared; /* participants torn down, images written */
	struct cuip_opts o;
	pid_t *tree;
	size_t n_tree;
	struct cuip_pstree img; /* restore: the images' process tree, for the guardian */
	struct cuip_group g;
	struct cuip_native_proc *nat;
	size_t n_nat;
	pid_t *ordinary; /* dump: map the interposer, have not begun CUDA */
	size_t n_ordinary;
	int listed;			   /* restore: CRIU's inventory names this plugin (-1: unknown) */
	struct cuip_ckpt parent;	   /* dump: CUINTERPOSE_PARENT as read */
	struct cuip_img_parent parent_img; /* its directory (parent_dir) and id */
	char parent_dir[PATH_MAX];
	char parent_rel[PATH_MAX];
	/* The job's pause (cuip_now() seconds, 0: not yet), see pause_line(). */
	double held_t0, held_t1, frozen_t0;
} S;

/* ---- CRIU internals, all optional ---------------------------------------- */

static void *criu_sym(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static int image_dir(void)
{
	int (*fn)(void) = (int (*)(void))criu_sym("criu_get_image_dir");

	return fn ? fn() : -EBADF;
}

/* Does criu's command line carry `flag` (optionally with a value)? */
static const char *cmdline_value(const char *flag, bool *present)
{
	static char buf[65536];
	static ssize_t len = -1;
	const char *p;

	*present = false;
	if (len < 0) {
		int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
		len = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : 0;
		if (fd >= 0)
			close(fd);
		if (len < 0)
			len = 0;
		buf[len] = 0;
	}
	for (p = buf; p < buf + len; p += strlen(p) + 1) {
		size_t fl = strlen(flag);
		if (!strncmp(p, flag, fl) && (p[fl] == 0 || p[fl] == '=')) {
			*present = true;
			if (p[fl] == '=')
				return p + fl + 1;
			p += strlen(p) + 1;
			return p < buf + len ? p : NULL;
		}
	}
	return NULL;
}

/* Will the dumped tasks keep running after the dump? */
static bool leave_running(void)
{
	int *opts = criu_sym("opts");
	bool r, lr;

	if (S.o.leave_running >= 0)
		return S.o.leave_running;
	/* cr_options.final_state is the first member of CRIU's opts in every
	 * release with device hooks: TASK_ALIVE (1) means --leave-running. */
	if (opts && (*opts == 1 || *opts == 2))
		return *opts == 1;
	cmdline_value("-R", &r);
	cmdline_value("--leave-running", &lr);
	return r || lr;
}

/* CRIU's --freeze-cgroup, for the guardian to thaw (NULL: none). */
static const char *freeze_cgroup(void)
{
	bool present;
	const char *v = cmdline_value("--freeze-cgroup", &present);

	return present ? v : NULL;
}

static unsigned lock_timeout_ms(void)
{
	const char *v;
	bool present;

	if (S.o.lock_timeout_ms)
		return S.o.lock_timeout_ms;
	v = cmdline_value("--timeout", &present);
	if (present && v && atoi(v) > 0)
		return (unsigned)atoi(v) * 1000;
	return 10000; /* CRIU's default --timeout */
}

/* ---- cuda_plugin must not be loaded beside us --------------------------- */

static int find_cuda_plugin(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	const char *base = slash ? slash + 1 : info->dlpi_name;

	if (base && !strcmp(base, "cuda_plugin.so")) {
		snprintf(arg, PATH_MAX, "%s", info->dlpi_name);
		return 1;
	}
	return 0;
}

static int refuse_cuda_plugin(void)
{
	char found[PATH_MAX] = "";
	Dl_info di;

	dl_iterate_phdr(find_cuda_plugin, found);
	if (!found[0] && dladdr((void *)&CR_PLUGIN_DESC, &di) && di.dli_fname) {
		/* CRIU loads every *.so of one directory: ours. */
		const char *slash = strrchr(di.dli_fname, '/');

		if (slash && (size_t)(slash - di.dli_fname) < sizeof(found) - 16) {
			snprintf(found, sizeof(found), "%.*s/cuda_plugin.so", (int)(slash - di.dli_fname),
				 di.dli_fname);
			if (access(found, F_OK))
				found[0] = 0;
		}
	}
	if (!found[0])
		return 0;
	pr_err("CRIU's cuda_plugin is loaded beside cuinterpose (%s): both would drive native CUDA checkpoint "
	       "and CRIU would run only one of them; remove cuda_plugin.so from the plugin directory or pass "
	       "--libdir with a directory holding only cuinterpose_plugin.so",
	       found);
	return -1;
}

/* ---- shared helpers ----------------------------------------------------- */

/* A thread left behind would break criu's setns into mount namespaces. */
static void check_single_threaded(const char *hook)
{
	pid_t *tids = NULL;
	int n = cuip_proc_threads(getpid(), "", &tids);

	free(tids);
	if (n > 1)
		pr_err("%d threads in criu after %s: criu cannot enter a mount namespace now", n, hook);
	/* Every thread the plugin starts is joined before its hook returns
	 * (native.c's agent is a process; sock_diag and the coordinator join
	 * theirs): one left is this plugin's bug. */
	assert(n <= 1);
}

static void reset_state(void)
{
	cuip_native_close();
	cuip_startgate_release();
	cuip_group_free(&S.g);
	cuip_images_free(&S.parent);
	free(S.tree);
	cuip_pstree_free(&S.img);
	free(S.nat);
	free(S.ordinary);
	memset(&S, 0, sizeof(S));
}

/*
 * A CUDA process of the tree. At restore its threads are stopped, so only
 * the restore thread is asked for; the checkpoint left it CHECKPOINTED, and
 * the state is checked after each native step once that thread runs.
 */
static int add_native(pid_t pid, bool restoring, char *err, size_t errlen)
{
	struct cuip_native_proc *nv;
	int tid, state = CUIP_NATIVE_CHECKPOINTED, ret;

	if (restoring)
		ret = cuip_native_tid(pid, &tid, err, errlen);
	else
		ret = cuip_native_probe(pid, &tid, &state, err, errlen);
	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	nv = realloc(S.nat, (S.n_nat + 1) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	S.nat = nv;
	memset(&S.nat[S.n_nat], 0, sizeof(S.nat[0]));
	S.nat[S.n_nat].pid = pid;
	S.nat[S.n_nat].restore_tid = tid;
	S.nat[S.n_nat].initial = state;
	/* At restore the driver reports what the checkpoint left behind. */
	if (state == CUIP_NATIVE_CHECKPOINTED)
		S.nat[S.n_nat].locked = S.nat[S.n_nat].checkpointed = true;
	else if (state == CUIP_NATIVE_LOCKED)
		S.nat[S.n_nat].locked = true;
	pr_debug("pid %d is a CUDA process (restore thread %d, %s)", pid, tid, cuip_native_state_name(state));
	S.n_nat++;
	return 0;
}

static int add_participant(pid_t pid, char *err, size_t errlen)
{
	struct cuip_part *np;
	pid_t vpid = cuip_proc_vpid(pid);

	if (vpid <= 0) {
		snprintf(err, errlen, "cannot read the namespace pid of %d", pid);
		return vpid ? vpid : -ESRCH;
	}
	np = realloc(S.g.p, (S.g.n + 1) * sizeof(*np));
	if (!np)
		return -ENOMEM;
	S.g.p = np;
	memset(&S.g.p[S.g.n], 0, sizeof(S.g.p[0]));
	S.g.p[S.g.n].pid = pid;
	S.g.p[S.g.n].vpid = vpid;
	S.g.p[S.g.n].fd = -1;
	S.g.n++;
	return 0;
}

static int find_sockets(char *err, size_t errlen)
{
	for (size_t i = 0; i < S.g.n; i++) {
		struct cuip_part *p = &S.g.p[i];
		int ret;

		if (p->sock[0])
			continue; /* found at discovery */
		ret = cuip_find_control_socket(p->pid, p->vpid, p->sock, sizeof(p->sock), err, errlen);
		if (ret)
			return ret;
		pr_debug("pid %d (self %d): control socket %s", p->pid, p->vpid, p->sock);
	}
	return 0;
}

/* Threads to let run: the restore threads of the CUDA processes (native),
 * the interposer's own threads of the participants (rebuild). */
struct thawed {
	struct cuip_tracee *t;
	size_t n;
};

static int thaw_add(struct thawed *th, pid_t pid, pid_t tid)
{
	struct cuip_tracee *nt = realloc(th->t, (th->n + 1) * sizeof(*nt));
	int ret;

	if (!nt)
		return -ENOMEM;
	th->t = nt;
	memset(&th->t[th->n], 0, sizeof(th->t[0]));
	th->t[th->n].pid = pid;
	th->t[th->n].tid = tid;
	ret = cuip_tracee_resume(&th->t[th->n]);
	th->n++;
	return ret;
}

static int thaw_restore_threads(struct thawed *th)
{
	for (size_t i = 0; i < S.n_nat; i++) {
		int ret = thaw_add(th, S.nat[i].pid, S.nat[i].restore_tid);
		if (ret) {
			pr_err("cannot let the CUDA restore thread %d of pid %d run", S.nat[i].restore_tid,
			       S.nat[i].pid);
			return ret;
		}
	}
	return 0;
}

static int thaw_interposer_threads(struct thawed *th, char *err, size_t errlen)
{
	for (size_t i = 0; i < S.g.n; i++) {
		pid_t *tids = NULL;
		int n = cuip_proc_threads(S.g.p[i].pid, CUIP_THREAD_PREFIX, &tids);

		if (n <= 0) {
			snprintf(err, errlen, "pid %d has no interposer threads (" CUIP_THREAD_PREFIX "*)",
				 S.g.p[i].pid);
			free(tids);
			return n ? n : -ESRCH;
		}
		for (int k = 0; k < n; k++) {
			int ret = thaw_add(th, S.g.p[i].pid, tids[k]);
			if (ret) {
				snprintf(err, errlen, "cannot let interposer thread %d of pid %d run: %s", tids[k],
					 S.g.p[i].pid, strerror(-ret));
				free(tids);
				return ret;
			}
		}
		free(tids);
	}
	return 0;
}

static int refreeze(struct thawed *th)
{
	int ret = 0;

	for (size_t i = 0; i < th->n; i++) {
		int r = cuip_tracee_stop(&th->t[i]);
		if (r && !ret)
			ret = r;
	}
	free(th->t);
	th->t = NULL;
	th->n = 0;
	return ret;
}

/* Native restore + unlock of every CUDA process, restore threads thawed. */
static int native_restore(char *err, size_t errlen)
{
	struct thawed th = {0};
	int ret;

	if (!S.n_nat)
		return 0;
	ret = thaw_restore_threads(&th);
	if (!ret)
		ret = cuip_native_restore_all(S.nat, S.n_nat, S.o.remap, S.o.n_remap, err, errlen);
	if (!ret)
		ret = cuip_native_unlock_all(S.nat, S.n_nat, err, errlen);
	if (refreeze(&th) && !ret) {
		snprintf(err, errlen, "cannot stop the CUDA restore threads again");
		ret = -EIO;
	}
	return ret;
}

/* After a QUIESCE that closed every gate: the pause began when the first
 * gate closed, not when the request went out; each participant said how
 * long it worked before its gate (release hooks, the chunk scan's
 * compile), the job still running. */
static void held_from_first_gate(const struct cuip_group *g)
{
	unsigned first = UINT_MAX;

	for (size_t i = 0; i < g->n; i++) {
		const struct cuip_part *p = &g->p[i];

		if (p->quiesced && (p->has_gate_after ? p->gate_after_ms : 0) < first)
			first = p->has_gate_after ? p->gate_after_ms : 0; /* no word: closed at once */
	}
	if (first != UINT_MAX && S.held_t0)
		S.held_t0 += first / 1000.0;
}

/* Every coordinator phase: the guardian hears of it before and after;
 * CUINTERPOSE_TEST_FAULT may strike once the guardian knows. */
static int on_phase(struct cuip_group *g, enum cuip_gphase ph, bool after, int status)
{
	const char *phase = cuip_gphase_name(ph);
	int ret = cuip_guardian_phase(g, phase, after);
	char begin[80];

	if (!after && ph == CUIP_GPHASE_QUIESCE) {
		S.held_t0 = cuip_now(); /* the gate closes with this request */
		S.held_t1 = 0;
	} else if (after && !status && ph == CUIP_GPHASE_QUIESCE) {
		held_from_first_gate(g);
	} else if (after && !status && ph == CUIP_GPHASE_RESUME && S.held_t0) {
		S.held_t1 = cuip_now(); /* every gate is open again */
	}
	if (!after) {
		snprintf(begin, sizeof(begin), "begin:%s", phase);
		cuip_fault(begin);
		return ret;
	}
	cuip_fault(phase);
	return 0;
}

/* Progress outside the coordinator (native steps): 0 or -EPIPE. */
static int note(const char *phase, bool after, char *err, size_t errlen)
{
	int ret = cuip_guardian_phase(&S.g, phase, after);

	if (ret)
		snprintf(err, errlen, "%.400s", S.g.err);
	if (after)
		cuip_fault(phase);
	return ret;
}

/* ---- dump --------------------------------------------------------------- */

static int write_native_only_inventory(void)
{
	char err[512];
	uint8_t id[16];
	int ret;

	if (getrandom(id, sizeof(id), 0) != sizeof(id))
		memset(id, 0x5a, sizeof(id));
	ret = cuip_images_write(S.g.imgdir, id, NULL, 0, 0, NULL, err, sizeof(err));
	if (ret)
		pr_err("%s", err);
	return ret;
}

/*
 * Dump with CUINTERPOSE_PARENT: read the parent checkpoint (and its own
 * chain) before anything is touched; it must be another directory than
 * this dump's, a cuinterpose checkpoint, and whole. The SAVEs then leave
 * the chunks it has to it.
 */
static int open_parent(char *err, size_t errlen)
{
	struct stat a, b;
	int fd, ret;

	if (!S.o.parent[0])
		return 0;
	fd = realpath(S.o.parent, S.parent_dir) ? open(S.parent_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (fd < 0) {
		ret = -errno;
		errfmt(err, errlen, "CUINTERPOSE_PARENT=%s: %s", S.o.parent, strerror(-ret));
		return ret;
	}
	if (!fstat(fd, &a) && !fstat(S.g.imgdir, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
		close(fd);
		errfmt(err, errlen,
		       "CUINTERPOSE_PARENT=%s: this dump's image directory is the parent checkpoint itself of its "
		       "chain; an incremental dump goes into a directory of its own",
		       S.o.parent);
		return -EINVAL;
	}
	ret = cuip_images_read(fd, &S.parent, err, errlen);
	if (ret == -ENOENT)
		errfmt(err, errlen, "CUINTERPOSE_PARENT=%s holds no cuinterpose checkpoint", S.o.parent);
	/* No directory of the chain may be this dump's: its carrier files
	 * would be rewritten while the chain reads them. */
	for (unsigned k = 0; !ret && fd >= 0 && k <= CUIP_CHAIN_MAX; k++) {
		ProtobufCMessage *m = NULL;
		const char *via;
		char why[256];
		int next = -1;

		if (!fstat(fd, &a) && !fstat(S.g.imgdir, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
			errfmt(err, errlen,
			       "CUINTERPOSE_PARENT=%s: this dump's image directory is a checkpoint of its chain; an "
			       "incremental dump goes into a directory of its own",
			       S.o.parent);
			ret = -EINVAL;
		} else if (!cuip_image_read(fd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor,
					    NULL, &m, why, sizeof(why))) {
			const Cuip__Inventory *inv = (const Cuip__Inventory *)m;

			next = inv->parent ? cuip_images_open_parent(fd, inv, &via) : -1;
			protobuf_c_message_free_unpacked(m, NULL);
		}
		close(fd);
		fd = next;
	}
	if (fd >= 0)
		close(fd);
	if (!ret && S.parent.depth + 1 >= CUIP_CHAIN_MAX) {
		errfmt(err, errlen,
		       "CUINTERPOSE_PARENT=%s already has %u checkpoints below it: a chain holds at most %d, make a "
		       "full dump",
		       S.o.parent, S.parent.depth, CUIP_CHAIN_MAX);
		ret = -E2BIG;
	}
	if (ret)
		return ret;
	S.parent_img.dir = S.parent_dir;
	memcpy(S.parent_img.id, S.parent.inv->checkpoint_id.data, 16);
	/* Relative to this dump's directory too: a chain moved as a whole. */
	{
		char link[64], self[PATH_MAX];
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", S.g.imgdir);
		n = readlink(link, self, sizeof(self) - 1);
		if (n > 0) {
			self[n] = 0;
			if (cuip_path_relative(self, S.parent_dir, S.parent_rel, sizeof(S.parent_rel)))
				S.parent_img.rel = S.parent_rel;
		}
	}
	S.g.parent = &S.parent;
	S.g.parent_img = &S.parent_img;
	pr_info("incremental dump: parent checkpoint %s (%zu participants, %u below it in its chain)", S.parent_dir,
		S.parent.n, S.parent.depth);
	return 0;
}

/*
 * Is criu's command line carrying --link-remap? (Through criu's RPC the
 * options do not show; the hint then says "if".)
 */
static bool link_remap_given(void)
{
	bool present, rpc;

	cmdline_value("--link-remap", &present);
	cmdline_value("swrk", &rpc);
	return present || rpc;
}

/* multiprocessing's semaphores are unlinked /dev/shm files: criu needs
 * --link-remap for them; say so before criu fails on them. */
static void shm_hint(pid_t pid)
{
	char path[PATH_MAX], comm[32];
	int n = cuip_proc_unlinked_shm(pid, path, sizeof(path));

	if (n <= 0)
		return;
	cuip_proc_comm(pid, comm, sizeof(comm));
	if (link_remap_given()) {
		char stale[PATH_MAX];
		int ns = cuip_proc_stale_link_remaps(pid, stale, sizeof(stale));

		pr_debug("pid %d (%s) maps or holds %d unlinked /dev/shm file(s) (%s): --link-remap given", pid, comm,
			 n, path);
		if (ns > 0)
			pr_warn("pid %d (%s): %d link_remap file(s) already in its /dev/shm (%s), left by an earlier "
				"criu dump --link-remap whose images were not restored on this machine; criu fails "
				"\"Can't link remap to ...: File exists\" when its new link takes one of those names: "
				"remove them once no restore needs them (README \"PyTorch and torch.multiprocessing "
				"jobs\")",
				pid, comm, ns, stale);
	} else
		pr_warn("pid %d (%s) maps or holds %d unlinked /dev/shm file(s) (%s, e.g. Python multiprocessing "
			"semaphores): criu dump needs --link-remap; see the README section \"PyTorch and "
			"torch.multiprocessing jobs\"",
			pid, comm, n, path);
}

static int push_ordinary(pid_t pid)
{
	pid_t *v = realloc(S.ordinary, (S.n_ordinary + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	S.ordinary = v;
	S.ordinary[S.n_ordinary++] = pid;
	return 0;
}

/*
 * One process of the dumped tree that maps the interposer, the start gate
 * held: it becomes a participant (its control socket listens), or an
 * ordinary process (it never began CUDA), or the dump is refused (CUDA
 * began but there is no control socket). A process inside its first
 * cuInit is waited for.
 */
static int classify_preloaded(pid_t pid, char *err, size_t errlen)
{
	char path[PATH_MAX], e2[512], comm[32];
	pid_t vpid = cuip_proc_vpid(pid);
	int serr = 0, s, ret;

	if (vpid <= 0) {
		snprintf(err, errlen, "cannot read the namespace pid of %d", pid);
		return vpid ? vpid : -ESRCH;
	}
	s = cuip_startgate_settle(pid, S.o.start_wait_ms, &serr, err, errlen);
	if (s < 0)
		return s;
	cuip_proc_comm(pid, comm, sizeof(comm));
	ret = cuip_find_control_socket(pid, vpid, path, sizeof(path), e2, sizeof(e2));
	if (!ret) {
		ret = add_participant(pid, err, errlen);
		if (!ret)
			snprintf(S.g.p[S.g.n - 1].sock, sizeof(S.g.p[0].sock), "%s", path);
		return ret;
	}
	if (ret != -ENOENT) {
		snprintf(err, errlen, "%s", e2);
		return ret;
	}
	switch (s) {
	case CUIP_MARK_STARTED:
		snprintf(err, errlen,
			 "pid %d (%s) initialized CUDA under the interposer but holds no listening control socket "
			 "named %d-<id>.sock (closed by the application, or its control thread is gone); it cannot be "
			 "checkpointed: restart it",
			 pid, comm, vpid);
		return -ENOENT;
	case CUIP_MARK_NOSOCKET:
		snprintf(err, errlen,
			 "pid %d (%s) initialized CUDA under the interposer but could not create its control socket "
			 "(%s; see its stderr and CUINTERPOSE_SOCKET_DIR); it cannot be checkpointed",
			 pid, comm, strerror(serr));
		return -ENOENT;
	}
	return push_ordinary(pid);
}

/* The ordinary processes must not be CUDA processes to the driver. */
static int check_ordinary(char *err, size_t errlen)
{
	for (size_t i = 0; i < S.n_ordinary; i++) {
		pid_t pid = S.ordinary[i];
		char comm[32], nerr[256] = "";
		int ctx;

		cuip_proc_comm(pid, comm, sizeof(comm));
		for (size_t k = 0; k < S.n_nat; k++) {
			if (S.nat[k].pid != pid)
				continue;
			ctx = cuip_nvml_has_context(pid, nerr, sizeof(nerr));
			if (ctx == 0) {
				/* NVML alone makes a process known to the driver's
				 * checkpoint API; it has no context and no memory,
				 * so the native checkpoint is all it needs. */
				pr_info("pid %d (%s) is known to the driver but holds no CUDA context (NVML lists it "
					"on no "
					"GPU: it only initialized NVML): checkpointed natively",
					pid, comm);
				goto next;
			}
			if (ctx < 0 && ctx != -ENOENT)
				pr_warn("cannot ask NVML whether pid %d holds a CUDA context: %s", pid, nerr);
			snprintf(
				err, errlen,
				"pid %d (%s) maps the interposer and the driver reports it as a CUDA process, but its "
				"CUDA did not start through the interposer (no start marker, no control socket); start "
				"it with `cuinterpose run` before its first CUDA call",
				pid, comm);
			return -EPROTO;
		}
		pr_debug("pid %d (%s) maps the interposer but has not initialized CUDA: an ordinary process, nothing "
			 "to save",
			 pid, comm);
next:;
	}
	return 0;
}

static bool is_native(pid_t pid)
{
	for (size_t k = 0; k < S.n_nat; k++)
		if (S.nat[k].pid == pid)
			return true;
	return false;
}

/* The devices the CUDA processes map before their native checkpoint are
 * the driver's, for now (settle_devices() keeps those the checkpoint
 * removed). */
static int learn_devices(void)
{
	for (size_t k = 0; k < S.n_nat; k++) {
		dev_t v[16];
		int n = cuip_devfiles_mapped(S.nat[k].pid, v, 16), ret;

		for (int i = 0; i < n; i++)
			if ((ret = cuip_devfiles_learn(v[i])))
				return ret;
	}
	return 0;
}

/*
 * Processes of the tree the driver does not know that hold its device
 * files: children forked after cuInit. Said, one line each; their mappings
 * and descriptors are claimed when criu meets them (devfiles.h). One that
 * maps a device file that is not the driver's is refused here, before
 * anything changes: criu could not dump it.
 */
static int note_inherited(char *err, size_t errlen)
{
	for (size_t i = 0; i < S.n_tree; i++) {
		struct cuip_devscan ds;
		char comm[32];

		if (is_native(S.tree[i]) || cuip_devfiles_scan(S.tree[i], &ds))
			continue;
		cuip_proc_comm(S.tree[i], comm, sizeof(comm));
		if (ds.other_maps) {
			snprintf(err, errlen,
				 "pid %d (%s) maps %u region(s) of a device that is not the driver's (%s at %" PRIx64
				 "): criu cannot dump such a mapping",
				 S.tree[i], comm, ds.other_maps, ds.other, ds.other_start);
			return -EOPNOTSUPP;
		}
		if (!(ds.maps + ds.fds))
			continue;
		pr_info("pid %d (%s) holds %u mapping(s) (%.1f MiB, first at %" PRIx64 ") and %u descriptor(s) of the "
			"driver's devices (%s) but is no CUDA process to the driver (forked after cuInit): they are "
			"saved without contents and restored inert",
			S.tree[i], comm, ds.maps, ds.map_bytes / 1048576.0, ds.first_start, ds.fds, ds.first);
	}
	return 0;
}

/*
 * After the native checkpoint: a device a CUDA process still maps is not
 * the driver's (forgotten: criu then refuses it, and the job is restored in
 * place), unless its major is the driver's: a checkpoint that left the
 * driver's mappings behind fails the dump. So does one that left a
 * descriptor of the driver's devices open (a process sharing a memory pool
 * keeps /dev/nvidiactl, and its native restore fails; docs/driver-facts.md, "Stream-ordered pools shared by descriptor"): only the
 * descriptors of processes the driver does not know are claimed.
 */
static int settle_devices(char *err, size_t errlen)
{
	for (size_t k = 0; k < S.n_nat; k++) {
		dev_t v[16];
		int n = cuip_devfiles_mapped(S.nat[k].pid, v, 16);

		for (int i = 0; i < n; i++) {
			if (cuip_devfiles_driver_major(v[i])) {
				snprintf(err, errlen,
					 "pid %d still maps the driver's device %u:%u after its native checkpoint",
					 S.nat[k].pid, major(v[i]), minor(v[i]));
				return -EPROTO;
			}
			cuip_devfiles_forget(v[i]);
		}
	}
	for (size_t k = 0; k < S.n_nat; k++) {
		struct cuip_devscan ds;

		if (cuip_devfiles_scan(S.nat[k].pid, &ds) || !ds.fds)
			continue;
		snprintf(err, errlen,
			 "pid %d still holds %u descriptor(s) of the driver's devices (%s) after its native checkpoint "
			 "(a memory pool shared with another process keeps one; its native restore would fail)",
			 S.nat[k].pid, ds.fds, ds.first);
		return -EPROTO;
	}
	return 0;
}

/* Policy: criu cannot dump an io_uring instance (CRIU 4.2.1 knows none), and
 * finds out only while it dumps the process's memory, after every CUDA
 * process was checkpointed; the job would then be rolled back. Refused at
 * discovery instead, naming the process, before anything changes. */
static int refuse_io_uring(char *err, size_t errlen)
{
	for (size_t i = 0; i < S.n_tree; i++) {
		char what[96], comm[32];

		if (cuip_proc_io_uring(S.tree[i], what, sizeof(what)) <= 0)
			continue; /* none, or gone: criu says what it finds */
		cuip_proc_comm(S.tree[i], comm, sizeof(comm));
		snprintf(err, errlen,
			 "pid %d (%s) %s, which criu cannot dump (a torchrun worker maps one through libuv); "
			 "nothing was changed, the job keeps running",
			 S.tree[i], comm, what);
		return -EPROTO;
	}
	return 0;
}

/*
 * Discovery: walk the tree of root, hold the start gate of every process
 * with the interposer, classify them (participants, CUDA processes, the
 * interposer without CUDA) and learn the devices. -ENOTSUP (and S.disabled)
 * when there is nothing of ours to do.
 */
static int discover_tree(pid_t root)
{
	char err[1024] = "";
	pid_t *tree;
	int n, ret;

	n = cuip_proc_tree(root, &tree);
	if (n < 0) {
		pr_err("cannot walk the process tree of pid %d: %s", root, strerror(-n));
		return n;
	}
	S.tree = tree;
	S.n_tree = (size_t)n;
	/* Hold the start gate first: from here no process of the tree begins
	 * CUDA until it is frozen; one that has begun is waited for. */
	for (size_t i = 0; i < S.n_tree; i++) {
		if (cuip_proc_has_interposer(S.tree[i]) > 0 &&
		    (ret = cuip_startgate_hold(S.tree[i], S.o.start_wait_ms, err, sizeof(err)))) {
			pr_err("dump refused: %s", err);
			return ret;
		}
	}
	for (size_t i = 0; i < S.n_tree; i++) {
		if (cuip_proc_has_interposer(S.tree[i]) <= 0)
			continue;
		shm_hint(S.tree[i]);
		if ((ret = classify_preloaded(S.tree[i], err, sizeof(err)))) {
			pr_err("dump refused: %s", err);
			return ret;
		}
	}
	ret = cuip_native_open(S.o.libcuda, err, sizeof(err));
	if (ret) {
		if (S.g.n) {
			pr_err("%s; %zu processes run the interposer (pid %d first) and need native checkpoint; "
			       "set LD_LIBRARY_PATH or CUINTERPOSE_LIBCUDA for criu",
			       err, S.g.n, S.g.p[0].pid);
			return ret;
		}
		pr_info("%s; no process runs the interposer: declining", err);
		S.disabled = true;
		return -ENOTSUP;
	}
	for (size_t i = 0; i < S.n_tree; i++) {
		if ((ret = add_native(S.tree[i], false, err, sizeof(err)))) {
			pr_err("%s", err);
			return ret;
		}
	}
	if ((ret = check_ordinary(err, sizeof(err)))) {
		pr_err("dump refused: %s", err);
		return ret;
	}
	if ((ret = learn_devices()) || (ret = note_inherited(err, sizeof(err)))) {
		pr_err("dump refused: %s", err[0] ? err : strerror(-ret));
		return ret;
	}
	if (!S.g.n && !S.n_nat) {
		cuip_native_close();
		pr_info("no CUDA process and no participant in the tree of pid %d: declining", root);
		S.disabled = true;
		return -ENOTSUP;
	}
	if ((ret = refuse_io_uring(err, sizeof(err)))) {
		pr_err("dump refused: %s", err);
		return ret;
	}
	return 0;
}

/* Policy: a process another checkpoint has natively locked or checkpointed
 * is not ours to touch; the dump is refused and fini leaves it alone. */
static int refuse_foreign_native(void)
{
	for (size_t i = 0; i < S.n_nat; i++) {
		if (S.nat[i].initial == CUIP_NATIVE_RUNNING)
			continue;
		pr_err("dump refused: pid %d is natively %s: another checkpoint of it is in progress (or was left "
		       "unfinished); this dump leaves it alone",
		       S.nat[i].pid, cuip_native_state_name(S.nat[i].initial));
		/* Not ours: fini must not restore or unlock anything. */
		for (size_t k = 0; k < S.n_nat; k++)
			S.nat[k].locked = S.nat[k].checkpointed = false;
		return -EBUSY;
	}
	return 0;
}

/* What the dump needs before the first phase: the image directory, the
 * plugin in CRIU's inventory, the parent checkpoint, the participants'
 * sockets, and the guardian that rolls the job back if criu dies. */
static int prepare_dump(void)
{
	int (*add_inv)(const char *) = (int (*)(const char *))criu_sym("add_inventory_plugin");
	char err[1024] = "";
	int ret;

	S.g.o = &S.o;
	S.g.imgdir = image_dir();
	if (S.g.imgdir < 0) {
		pr_err("CRIU did not give an image directory");
		return -EBADF;
	}
	if (add_inv && add_inv(PLUGIN_NAME))
		pr_warn("cannot record the plugin in CRIU's inventory; restore will not insist on it");
	if ((ret = refuse_foreign_native()))
		return ret;
	if (S.g.n && (ret = open_parent(err, sizeof(err)))) {
		pr_err("dump refused: %s", err);
		return ret;
	}
	if (S.g.n && (ret = find_sockets(err, sizeof(err)))) {
		pr_err("%s", err);
		return ret;
	}
	S.g.on_phase = on_phase;
	ret = cuip_guardian_start_dump(&S.g, S.nat, S.n_nat, freeze_cgroup(), err, sizeof(err));
	if (ret)
		pr_err("dump refused: %s; nothing could roll the job back if criu died", err);
	return ret;
}

/* Lock every CUDA process natively; on failure unlock them and roll the
 * group's dump back. */
static int lock_natives(void)
{
	char err[1024] = "", e2[512];
	int ret;

	if (!S.held_t0 && S.n_nat)
		S.held_t0 = cuip_now(); /* a tree without participants: the lock holds its CUDA calls */
	ret = note("native-lock", false, err, sizeof(err));
	if (!ret) {
		ret = cuip_native_lock_all(S.nat, S.n_nat, lock_timeout_ms(), err, sizeof(err));
		if (!ret)
			ret = note("native-lock", true, err, sizeof(err));
	}
	if (!ret)
		return 0;
	pr_err("dump refused: %s (lock timeout %u ms, CUINTERPOSE_LOCK_TIMEOUT_MS)", err, lock_timeout_ms());
	cuip_native_unlock_all(S.nat, S.n_nat, e2, sizeof(e2));
	if (S.prepared && !cuip_group_rollback(&S.g))
		S.prepared = false;
	return ret;
}

/* PAUSE_DEVICES for the tree of root: discovery, the dump's preparation,
 * the group's dump (or the native-only inventory), the native locks. */
static int pause_group(pid_t root)
{
	double t0 = cuip_now();
	int ret;

	if ((ret = discover_tree(root)))
		return ret;
	S.active = true;
	pr_info("dump of tree %d: %zu processes, %zu participants, %zu CUDA processes, %zu with the interposer but "
		"no CUDA",
		root, S.n_tree, S.g.n, S.n_nat, S.n_ordinary);
	if ((ret = prepare_dump()))
		return ret;
	cuip_fault("discovery");
	if (S.g.n) {
		ret = cuip_group_dump(&S.g);
		if (ret) {
			pr_err("dump refused: %s; %s", S.g.err,
			       S.g.rollback_failed ? "the rollback failed too: the job must be restarted"
						   : "the job keeps running with its sharing intact");
			return ret;
		}
		S.prepared = true;
	} else if ((ret = write_native_only_inventory())) {
		return ret;
	}
	if ((ret = lock_natives()))
		return ret;
	pr_info("PAUSE_DEVICES done: %zu participants, %zu CUDA processes locked, %" PRIu64 " bytes carried, %.3f s",
		S.g.n, S.n_nat, S.g.carried_bytes, cuip_now() - t0);
	return 0;
}

static int cuip_pause_devices(int pid)
{
	if (S.disabled || S.stage != CR_PLUGIN_STAGE__DUMP)
		return -ENOTSUP;
	if (!S.paused) {
		S.paused = true;
		if (refuse_cuda_plugin())
			return S.pause_ret = -1;
		S.pause_ret = pause_group(pid);
		check_single_threaded("PAUSE_DEVICES");
		if (!S.pause_ret && S.active)
			S.frozen_t0 = cuip_now(); /* criu seizes the root when this returns */
		return S.pause_ret;
	}
	if (S.pause_ret)
		return S.pause_ret;
	for (size_t i = 0; i < S.n_tree; i++)
		if (S.tree[i] == pid)
			return 0;
	/* A process we did not see when the group was prepared: if it maps
	 * the interposer, hold its gate and accept it only without CUDA. */
	{
		char comm[32], err[512] = "";
		int s = CUIP_MARK_NONE, serr;
		bool cuda;

		cuip_proc_comm(pid, comm, sizeof(comm));
		if (cuip_proc_has_interposer(pid) > 0) {
			if (cuip_startgate_hold(pid, S.o.start_wait_ms, err, sizeof(err)) ||
			    (s = cuip_startgate_settle(pid, S.o.start_wait_ms, &serr, err, sizeof(err))) < 0) {
				pr_err("dump refused: %s", err);
				return -1;
			}
		}
		cuda = (s != CUIP_MARK_NONE && s != CUIP_MARK_FAILED) || cuip_native_state(pid) >= 0;
		if (cuda) {
			pr_err("pid %d (%s) joined the tree after cuinterpose prepared it and uses CUDA; checkpoint "
			       "again",
			       pid, comm);
			return -1;
		}
		if (s == CUIP_MARK_NONE && cuip_proc_has_interposer(pid) > 0)
			pr_debug("pid %d (%s) joined the tree after discovery; it maps the interposer but has not "
				 "initialized CUDA: an ordinary process",
				 pid, comm);
	}
	return 0;
}

static int cuip_checkpoint_devices(int pid)
{
	struct thawed th = {0};
	char err[512];
	double t0;
	int ret;

	/* The whole tree is frozen: nobody can begin CUDA now. */
	cuip_startgate_release();
	if (S.disabled || !S.active)
		return -ENOTSUP;
	if (S.checkpointed)
		return 0;
	S.checkpointed = true;
	t0 = cuip_now();
	if ((ret = note("native-checkpoint", false, err, sizeof(err))))
		goto out;
	ret = thaw_restore_threads(&th);
	if (!ret)
		ret = cuip_native_checkpoint_all(S.nat, S.n_nat, err, sizeof(err));
	else
		snprintf(err, sizeof(err), "cannot let the CUDA restore threads run");
	if (refreeze(&th) && !ret) {
		snprintf(err, sizeof(err), "cannot stop the CUDA restore threads again");
		ret = -EIO;
	}
	if (!ret)
		ret = settle_devices(err, sizeof(err));
	if (!ret)
		ret = note("native-checkpoint", true, err, sizeof(err));
out:
	if (ret) {
		pr_err("native checkpoint failed: %s; the dump fails and the job is restored in place", err);
		return -1;
	}
	pr_info("CHECKPOINT_DEVICES done: %zu CUDA processes checkpointed, %.3f s", S.n_nat, cuip_now() - t0);
	cuip_fault_memdump(S.g.imgdir);
	check_single_threaded("CHECKPOINT_DEVICES");
	return 0;
}

/* Native restore + unlock, then the in-place rebuild of the participants:
 * the job goes on as if it had not been checkpointed. */
static int restore_in_place(void)
{
	struct thawed th = {0};
	char err[1024] = "";
	int ret;

	ret = native_restore(err, sizeof(err));
	if (ret) {
		pr_err("native restore in place failed: %s; the job cannot continue", err);
		return ret;
	}
	if (!S.g.n && S.held_t0)
		S.held_t1 = cuip_now(); /* no gate: the native unlock lets CUDA calls run */
	if (!S.prepared)
		return 0;
	ret = thaw_interposer_threads(&th, err, sizeof(err));
	if (ret)
		pr_err("%s", err);
	else
		ret = cuip_group_rollback(&S.g);
	if (refreeze(&th) && !ret)
		ret = -EIO;
	if (!ret)
		S.prepared = false;
	return ret;
}

/* ---- restore ------------------------------------------------------------ */

static void kill_tree(const char *why)
{
	pr_err("restore cannot complete: %s", why);
	pr_err("killing the restored tree (%zu processes, root %d) instead of letting it resume half-built", S.n_tree,
	       S.n_tree ? S.tree[0] : 0);
	cuip_proc_kill_all(S.tree, S.n_tree);
}

/* At restore: a participant of the checkpoint, or (no start marker beyond
 * a failed cuInit) an ordinary process; one that has begun CUDA and was
 * not a participant stays in the list for cuip_images_match to refuse. */
static bool was_participant(const struct cuip_ckpt *ck, pid_t pid)
{
	pid_t vpid = cuip_proc_vpid(pid);
	int serr, s;

	for (size_t i = 0; i < ck->n; i++)
		if (ck->inv->participants[i]->pid == vpid)
			return true;
	s = cuip_proc_start_state(pid, &serr);
	return s != CUIP_MARK_NONE && s != CUIP_MARK_FAILED;
}

static int resume_group(pid_t root)
{
	struct cuip_ckpt ck = {0};
	struct thawed th = {0};
	char err[1024] = "";
	pid_t *vpids = NULL;
	double t0 = cuip_now();
	int n, ret;

	n = cuip_proc_tree(root, &S.tree);
	if (n < 0) {
		snprintf(err, sizeof(err), "cannot walk the restored tree of pid %d: %s", root, strerror(-n));
		ret = n;
		goto fail;
	}
	S.n_tree = (size_t)n;
	S.g.o = &S.o;
	S.g.imgdir = image_dir();
	S.g.on_phase = on_phase;
	ret = cuip_images_read(S.g.imgdir, &ck, err, sizeof(err));
	if (ret)
		goto fail; /* init declined already when there was nothing of ours */
	S.active = true;
	if (!cuip_guardian_pid()) { /* started at init(RESTORE) */
		snprintf(err, sizeof(err), "no guardian watches this restore");
		ret = -EPIPE;
		goto fail;
	}
	for (size_t i = 0; i < S.n_tree; i++) {
		int has = cuip_proc_has_interposer(S.tree[i]);

		if (has > 0 && !was_participant(&ck, S.tree[i])) {
			char comm[32];

			cuip_proc_comm(S.tree[i], comm, sizeof(comm));
			pr_debug("pid %d (%s) maps the interposer but had not initialized CUDA: an ordinary process",
				 S.tree[i], comm);
			continue;
		}
		if (has > 0 && (ret = add_participant(S.tree[i], err, sizeof(err))))
			goto fail;
	}
	vpids = calloc(S.g.n ? S.g.n : 1, sizeof(*vpids));
	if (!vpids) {
		ret = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < S.g.n; i++)
		vpids[i] = S.g.p[i].vpid;
	ret = cuip_images_match(&ck, vpids, S.g.n, err, sizeof(err));
	if (ret)
		goto fail;
	/* Put the participants in inventory order: g.p[i] <-> ck.topo[i]. */
	for (size_t i = 0; i < ck.n; i++)
		for (size_t k = i; k < S.g.n; k++)
			if (S.g.p[k].vpid == ck.inv->participants[i]->pid) {
				struct cuip_part tmp = S.g.p[i];
				S.g.p[i] = S.g.p[k];
				S.g.p[k] = tmp;
			}
	/* Each carrier byte is read once, by LOAD, which checks every chunk
	 * before it copies it (cuip_images_read has checked that every file
	 * is there and long enough), unless CUINTERPOSE_VERIFY_BEFORE_RESTORE=1
	 * asks to read them all first. */
	if (S.o.verify_carriers && ck.carried_bytes) {
		double t1 = cuip_now(), dt;

		ret = cuip_images_verify_carriers(S.g.imgdir, &ck, err, sizeof(err));
		if (ret)
			goto fail;
		dt = cuip_now() - t1;
		pr_info("CARRIERS verified: %" PRIu64 " bytes, %.3f s, %.1f MB/s", ck.carried_bytes, dt,
			dt > 0 ? (double)ck.carried_bytes / dt / 1e6 : 0.0);
	}
	ret = cuip_native_open(S.o.libcuda, err, sizeof(err));
	for (size_t i = 0; !ret && i < S.n_tree; i++)
		ret = add_native(S.tree[i], true, err, sizeof(err));
	if (ret)
		goto fail;
	pr_info("restore of tree %d: %zu processes, %zu participants, %zu CUDA processes, %" PRIu64 " carried bytes",
		root, S.n_tree, S.g.n, S.n_nat, ck.carried_bytes);
	ret = native_restore(err, sizeof(err));
	if (ret)
		goto fail;
	cuip_fault("native-restore");
	if (S.g.n) {
		ret = thaw_interposer_threads(&th, err, sizeof(err));
		if (!ret)
			ret = find_sockets(err, sizeof(err));
		if (!ret) {
			cuip_prefetch_stop("LOAD"); /* LOAD reads the rest itself */
			ret = cuip_group_rebuild(&S.g, (const Cuip__Topology *const *)ck.topo);
			if (ret)
				snprintf(err, sizeof(err), "%s", S.g.err);
		}
		if (refreeze(&th) && !ret) {
			snprintf(err, sizeof(err), "cannot stop the interposer threads again");
			ret = -EIO;
		}
		if (ret)
			goto fail;
	}
	pr_info("RESUME_DEVICES_LATE done: %zu participants rebuilt, %zu CUDA processes restored, %.3f s", S.g.n,
		S.n_nat, cuip_now() - t0);
	cuip_native_close();
	free(vpids);
	cuip_images_free(&ck);
	return 0;
fail:
	cuip_native_close();
	refreeze(&th);
	kill_tree(err[0] ? err : strerror(-ret));
	cuip_guardian_end("the restore failed and criu killed the restored tree");
	free(vpids);
	cuip_images_free(&ck);
	return ret ? ret : -1;
}

static int cuip_resume_devices_late(int pid)
{
	if (S.disabled || S.stage != CR_PLUGIN_STAGE__RESTORE)
		return -ENOTSUP;
	if (!S.resumed) {
		S.resumed = true;
		S.resume_ret = resume_group(pid);
		cuip_prefetch_stop("RESUME_DEVICES_LATE");
		check_single_threaded("RESUME_DEVICES_LATE");
		return S.resume_ret;
	}
	return S.active ? S.resume_ret : -ENOTSUP;
}

/* ---- init / fini -------------------------------------------------------- */

/*
 * Have CRIU seize the tree by interrupting each task even with
 * --freeze-cgroup (it thaws a frozen cgroup first): a frozen cgroup would
 * keep the CUDA restore threads and the interposer's threads from running.
 * At init, as upstream cuda_plugin does: CRIU 4.2 chooses between freezing
 * and interrupting before it calls PAUSE_DEVICES (4.1 chose after), so a
 * choice made there came too late and a --freeze-cgroup dump failed.
 */
static void seize_by_interrupt(void)
{
	void (*interrupt_only)(void) = (void (*)(void))criu_sym("set_compel_interrupt_only_mode");

	if (interrupt_only)
		interrupt_only();
	else
		pr_warn("set_compel_interrupt_only_mode not found in criu: do not use --freeze-cgroup");
}

/*
 * Restore, before criu creates any process: an incremental checkpoint's
 * parent chain is whole (else refused), and every GPU the images' processes
 * saw is here or paired (CUINTERPOSE_GPU_REMAP, or =auto), else refused
 * naming the GPUs and the value to set (gpus.h). The pairs `auto` makes go
 * to the native restore like given ones.
 */
static int check_gpus(int dir)
{
	struct cuip_gpu img[CUIP_MAX_GPUS], here[CUIP_MAX_GPUS];
	struct cuip_ckpt ck = {0};
	char err[4096] = "";
	size_t n_img;
	int n_here, ret;

	ret = cuip_images_read(dir, &ck, err, sizeof(err));
	if (ret == -ESTALE || ret == -ELOOP) {
		/* An incremental checkpoint's parent chain is broken: no
		 * process is worth creating. */
		pr_err("restore refused before any process was created: %s", err);
		return ret;
	}
	if (ret)
		return 0; /* RESUME_DEVICES_LATE reports bad images, with the tree to kill */
	n_img = cuip_gpus_of_images(&ck, img, CUIP_MAX_GPUS);
	cuip_images_free(&ck);
	if (!n_img)
		return 0;
	/* The same GPUs, as the kernel module lists them: nothing to ask. */
	n_here = cuip_gpus_listed("/proc/driver/nvidia/gpus", here, CUIP_MAX_GPUS);
	if (n_here > 0 && !S.o.remap_auto &&
	    !cuip_gpus_plan(img, n_img, here, (size_t)n_here, false, S.o.remap, &S.o.n_remap, CUIP_MAX_REMAP, err,
			    sizeof(err)))
		return 0;
	/* Otherwise the driver's own list (its ordinals) decides and explains. */
	n_here = cuip_gpus_present(S.o.libcuda, here, CUIP_MAX_GPUS, err, sizeof(err));
	if (n_here < 0) {
		pr_err("restore refused: %s", err);
		return n_here;
	}
	ret = cuip_gpus_plan(img, n_img, here, (size_t)n_here, S.o.remap_auto, S.o.remap, &S.o.n_remap, CUIP_MAX_REMAP,
			     err, sizeof(err));
	if (ret) {
		pr_err("restore refused before any process was created: %s", err);
		return ret;
	}
	for (unsigned i = 0; S.o.remap_auto && i < S.o.n_remap; i++) {
		char a[48], b[48];

		cuip_format_uuid(S.o.remap[i].old_uuid, a, sizeof(a));
		cuip_format_uuid(S.o.remap[i].new_uuid, b, sizeof(b));
		pr_info("CUINTERPOSE_GPU_REMAP=auto: GPU %s of the images restores onto %s", a, b);
	}
	return 0;
}

/*
 * The restore's guardian, before criu forks any task (guardian.h): it
 * knows the tree from the images' pstree.img, so that criu killed while it
 * forks the tree or fills it in (CRIU's restorer) leaves no task behind.
 * The restore does not start without it.
 */
static int start_restore_guardian(int dir)
{
	char why[400], err[512];
	int ret = cuip_pstree_read(dir, CUIP_PSTREE_IMG, &S.img, why, sizeof(why));

	if (ret)
		snprintf(err, sizeof(err), "cannot read %s: %s%s%s", CUIP_PSTREE_IMG, strerror(-ret), *why ? ": " : "",
			 why);
	else
		ret = cuip_guardian_start_restore(&S.img, dir, err, sizeof(err));
	if (ret)
		pr_err("refusing to restore without a guardian: %s", err);
	return ret;
}

/* Read ahead the carriers this restore will LOAD (prefetch.h). A
 * checkpoint that cannot be read is left to resume_group to refuse. */
static void start_prefetch(int dir)
{
	struct cuip_ckpt ck = {0};
	char err[512];
	int ret = S.o.prefetch_mb ? cuip_images_read(dir, &ck, err, sizeof(err)) : 0;

	if (ret)
		pr_info("prefetch: nothing read ahead: %s", err);
	else
		cuip_prefetch_start(dir, &ck, S.o.prefetch_mb);
	cuip_images_free(&ck);
}

static int cuip_init(int stage)
{
	char err[512];

	reset_state();
	S.stage = stage;
	S.listed = -1;
	if (stage == CR_PLUGIN_STAGE__PRE_DUMP) {
		/* Pre-dump copies memory of running tasks; device state is the
		 * final dump's business. Only the device-file hooks answer:
		 * every process still maps the driver's devices. */
		S.disabled = true;
		return 0;
	}
	if (refuse_cuda_plugin())
		return -1;
	if (cuip_opts_load(&S.o, err, sizeof(err))) {
		pr_err("%s", err);
		return -1;
	}
	cuip_log_set_verbose(S.o.verbose);
	if (cuip_fault_load(err, sizeof(err))) {
		pr_err("%s", err);
		return -1;
	}
	if (stage == CR_PLUGIN_STAGE__RESTORE) {
		bool (*check)(const char *, size_t) =
			(bool (*)(const char *, size_t))criu_sym("check_and_remove_inventory_plugin");
		struct stat sb;
		int dir = image_dir();

		if (check)
			S.listed = check(PLUGIN_NAME, strlen(PLUGIN_NAME)) ? 1 : 0;
		if (dir >= 0 && fstatat(dir, CUIP_INVENTORY_IMG, &sb, 0) && S.listed != 1) {
			pr_debug("no %s in the image directory: declining", CUIP_INVENTORY_IMG);
			S.disabled = true;
		}
		if (!S.disabled)
			cuip_fault("restore-start");
		if (!S.disabled && dir >= 0 && check_gpus(dir))
			return -1;
		if (!S.disabled)
			cuip_fault("restore-guardian");
		if (!S.disabled && dir >= 0 && start_restore_guardian(dir))
			return -1;
		if (!S.disabled)
			cuip_fault("restore-init");
		if (!S.disabled && dir >= 0)
			start_prefetch(dir);
	}
	if (stage == CR_PLUGIN_STAGE__DUMP)
		seize_by_interrupt();
	pr_debug("initialized for stage %d", stage);
	return 0;
}

/*
 * The driver's device files in processes the driver does not know
 * (devfiles.h). These hooks work whether or not the tree has CUDA
 * processes, and in pre-dump, where the CUDA processes still hold their own
 * mappings: claimed, no contents saved, the job keeps running.
 */
static int cuip_handle_device_vma(int fd, const struct stat *st)
{
	int ret;

	if (S.stage == CR_PLUGIN_STAGE__RESTORE)
		return -ENOTSUP;
	ret = cuip_devfiles_claim_map(image_dir(), fd, st);
	if (ret && ret != -ENOTSUP)
		pr_err("cannot record a mapping of the driver's device: %s", strerror(-ret));
	return ret;
}

static int cuip_dump_ext_file(int fd, int id)
{
	int ret;

	if (S.stage != CR_PLUGIN_STAGE__DUMP)
		return -ENOTSUP;
	ret = cuip_devfiles_claim_fd(image_dir(), fd, (uint32_t)id);
	if (ret && ret != -ENOTSUP)
		pr_err("cannot record a descriptor of the driver's device (file id %#x): %s", (unsigned)id,
		       strerror(-ret));
	return ret;
}

/*
 * criu has forked the tree's root (and set up its namespaces); the other
 * tasks fork and fill themselves in CRIU's restorer after this. Nothing to
 * do here but to be a point where CUINTERPOSE_TEST_FAULT can strike with the
 * tree half-built: the guardian, started at init, covers it.
 */
static int cuip_post_forking(void)
{
	if (S.disabled || S.stage != CR_PLUGIN_STAGE__RESTORE)
		return -ENOTSUP;
	cuip_fault("post-forking");
	return 0;
}

static int cuip_restore_ext_file(int id)
{
	if (S.stage != CR_PLUGIN_STAGE__RESTORE)
		return -ENOTSUP;
	return cuip_devfiles_restore_fd(image_dir(), (uint32_t)id);
}

static int cuip_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff, uint64_t *new_pgoff,
			       int *plugin_fd)
{
	int ret;

	if (S.stage != CR_PLUGIN_STAGE__RESTORE)
		return -ENOTSUP;
	ret = cuip_devfiles_update_map(image_dir(), path, plugin_fd, new_pgoff);
	if (ret == 0)
		return -ENOTSUP;
	if (ret < 0) {
		pr_err("cannot restore the mapping of %s at %" PRIx64 " (offset %" PRIx64 "): %s", path, addr,
		       old_pgoff, strerror(-ret));
		return ret;
	}
	pr_debug("mapping of %s at %" PRIx64 ": restored inert (/dev/zero)", path, addr);
	return 1;
}

/*
 * The job's pause, one line at the end of a dump that froze the tree:
 * "pause: CUDA calls held H s, threads frozen F s".
 *
 * CUDA calls held: from the moment the first participant's gate closed in
 * the QUIESCE phase that closed them all (the last one, after QUIESCE
 * retries): the phase's start plus the least time a participant said it
 * worked before its gate, the job running (held_from_first_gate); in a
 * tree without participants, from the start of the native lock) until every
 * gate was open again (the RESUME of a rollback or of the in-place
 * restore that --leave-running and a failed dump do; without
 * participants, the native unlock), or else until this line: the end of
 * the dump, after which criu kills the tree. A call made in that span
 * waits at the gate; calls in flight when QUIESCE came ran to their end.
 *
 * Threads frozen: from the end of the first PAUSE_DEVICES (criu seizes the
 * tree's root right after it returns, and each child as it walks the tree,
 * after its own PAUSE_DEVICES; the whole tree is stopped by the first
 * CHECKPOINT_DEVICES) until this line in fini, which criu calls once the
 * images are written, just before it kills the tree or lets it run. Not
 * counted: the moments criu takes after fini to unlock the network and
 * kill or release the tasks.
 *
 * A dump that kills the tree ends both at this line, and held begins first
 * (QUIESCE runs inside PAUSE_DEVICES): there held >= frozen. The line says
 * which end the held span had.
 */
static void pause_line(bool lr, int ret)
{
	double now = cuip_now(), held = 0;
	char h[64];

	if (!S.frozen_t0)
		return;
	if (S.held_t0)
		held = (S.held_t1 ? S.held_t1 : now) - S.held_t0;
	if (S.held_t0)
		snprintf(h, sizeof(h), "CUDA calls held %.2f s", held);
	else
		snprintf(h, sizeof(h), "CUDA calls not held");
	pr_info("pause: %s, threads frozen %.2f s%s", h, now - S.frozen_t0,
		S.held_t1     ? "; CUDA calls ran again before the dump ended"
		: !ret && !lr ? "; the job ends with the dump"
			      : "");
}

static void cuip_fini(int stage, int ret)
{
	if (stage == CR_PLUGIN_STAGE__DUMP && S.active) {
		bool lr = leave_running(), touched = S.prepared;

		for (size_t i = 0; i < S.n_nat; i++)
			touched |= S.nat[i].locked || S.nat[i].checkpointed;
		if ((ret || lr) && touched) {
			pr_info("dump %s: restoring the job in place", ret ? "failed" : "done with --leave-running");
			if (restore_in_place())
				pr_err("the job could not be restored in place after the dump; its CUDA processes are "
				       "unusable and must be restarted");
			else
				pr_info("in-place restore complete: the job keeps running with its sharing intact");
		}
		cuip_guardian_end(ret  ? "the dump failed and criu restored the job in place"
				  : lr ? "commit: --leave-running, the job was restored in place"
				       : "commit: the dump succeeded and CRIU ends the dumped tasks");
		pause_line(lr, ret);
	}
	if (stage == CR_PLUGIN_STAGE__RESTORE)
		cuip_guardian_end(ret ? "the restore failed; CRIU ends the restored tasks"
				      : "commit: the restore is complete");
	cuip_prefetch_stop("the end of the restore");
	cuip_group_disconnect(&S.g);
	cuip_devfiles_reset();
	reset_state();
}

CR_PLUGIN_REGISTER(PLUGIN_NAME, cuip_init, cuip_fini)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__PAUSE_DEVICES, cuip_pause_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES, cuip_checkpoint_devices)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE, cuip_resume_devices_late)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA, cuip_handle_device_vma)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__UPDATE_VMA_MAP, cuip_update_vma_map)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__DUMP_EXT_FILE, cuip_dump_ext_file)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESTORE_EXT_FILE, cuip_restore_ext_file)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__POST_FORKING, cuip_post_forking)

/*
 * CRIU's plugin ABI as this plugin uses it, checked against the header it is
 * built with (contrib/install-deps.sh: CRIU 4.2.1): descriptor version 0.2.0
 * and these hook numbers have been the same since CRIU 4.0 added
 * PAUSE_DEVICES and CHECKPOINT_DEVICES. A header that renumbered them would
 * have a criu call our functions for other hooks, so such a build fails.
 */
_Static_assert(CRIU_PLUGIN_VERSION == CRIU_PLUGIN_GEN_VERSION(0, 2, 0), "criu-plugin.h: unknown plugin ABI version");
_Static_assert(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE == 9 && CR_PLUGIN_HOOK__PAUSE_DEVICES == 10 &&
		       CR_PLUGIN_HOOK__CHECKPOINT_DEVICES == 11 && CR_PLUGIN_HOOK__DUMP_EXT_FILE == 2 &&
		       CR_PLUGIN_HOOK__RESTORE_EXT_FILE == 3 && CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA == 7 &&
		       CR_PLUGIN_HOOK__UPDATE_VMA_MAP == 8 && CR_PLUGIN_HOOK__POST_FORKING == 12,
	       "criu-plugin.h: the device hooks are numbered differently from CRIU 4.0-4.2");
