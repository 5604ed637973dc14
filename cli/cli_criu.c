/*
 * cli_criu.c - `cuinterpose checkpoint PID DIR` and `cuinterpose restore
 * DIR`: a thin front end over plain criu, for jobs outside containers.
 *
 * It builds the criu command line the job needs, prints it shell-quoted,
 * runs it bounded in time, follows the plugin's lines in criu's log to keep
 * one status line on a terminal, and prints the plugin's summary from the
 * log at the end (on failure also criu's last errors and the log's path),
 * the job's pause last ("cuinterpose: pause: CUDA calls held H s, threads
 * frozen F s", hooks.c).
 * The flags it picks, and why (README, "One-line checkpoint"):
 *   -L DIR         the plugin's directory (--libdir, default the installed
 *                  one) when it is not criu's default, /usr/lib/criu
 *   --shell-job    the tree's root does not lead its session (a job started
 *                  from a shell): dump reads it from /proc, restore from
 *                  the images' pstree.img
 *   --link-remap   dump: a process of the tree maps or holds a /dev/shm file
 *                  whose path is gone but which lives on (proc.h; what the
 *                  plugin warns about in dump.log)
 *   --tcp-established [--network-lock nftables]   dump: a process of the
 *                  tree holds a connected TCP socket (cli_tcp.c; a
 *                  torch.distributed store); nftables when criu cannot run
 *                  iptables here. Recorded in DIR/cuinterpose-criu-flags,
 *                  which restore reads to pass the same flags.
 *   --restore-detached --pidfile DIR/restored.pid   restore
 *   -v4 -o dump.log | restore.log, then what follows `--`, unchanged
 * criu is bounded by --timeout (SIGTERM, then SIGKILL); when it fails
 * after the plugin started its guardian, the command waits for the
 * guardian's rollback before it returns. Restored orphans: see reap_warn()
 * and --reap.
 * A bad value of a variable criu's plugin or the command reads stops the
 * command before anything runs, naming it and its range (settings.h).
 * Exit status: criu's (128+N when signal N killed it, 124 when --timeout
 * expired and it was killed), 1 when it stops before running criu, 2 usage.
 * Called from cli.c's main; single-threaded, no locks.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "proc.h"
#include "procstat.h"
#include "settings.h"

#ifndef CUIP_CRIU_PLUGINDIR
#define CUIP_CRIU_PLUGINDIR "/usr/lib/criu"
#endif
#define CRIU_DEFAULT_PLUGINDIR "/usr/lib/criu" /* criu's own, without -L */
#define PLUGIN_SO	       "cuinterpose_plugin.so"
#define DEFAULT_TIMEOUT_S      600
#define TICK_MS		       100
#define KILL_GRACE_S	       10 /* SIGTERM, then SIGKILL this much later */
#define FREE_WAIT_MS	       5000
#define ZOMBIE_WAIT_MS	       2000
#define ERR_LINES	       6
#define SUMMARY_MAX	       40
#define MARK		       "cuinterpose: "
#define FLAGS_FILE	       "cuinterpose-criu-flags" /* in DIR: the TCP flags the dump picked */

/* What the command line asked for, and what was derived from it. */
struct front {
	const char *name; /* "checkpoint" or "restore" */
	const char *libdir, *criu_opt;
	unsigned timeout_s;
	bool reap; /* restore: stay a subreaper (see reap_warn) */
	pid_t pid; /* checkpoint: the tree's root */
	char dir[PATH_MAX];
	char **extra; /* after `--`, passed through */
	int nextra;
	bool tty;	/* stderr is a terminal: status line */
	bool hung;	/* criu was killed past --timeout */
	pid_t guardian; /* the plugin's guardian, from the log */
	char criu[PATH_MAX];
	char log[PATH_MAX + 64];
};

/* A growing NULL-terminated argv that owns its strings. */
struct argl {
	char **v;
	size_t n, cap;
};

static int argl_add(struct argl *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int argl_add(struct argl *a, const char *fmt, ...)
{
	va_list ap;
	char *s;
	int r;

	if (a->n + 2 > a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 32;
		char **v = realloc(a->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		a->v = v;
		a->cap = cap;
	}
	va_start(ap, fmt);
	r = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (r < 0)
		return -ENOMEM;
	a->v[a->n++] = s;
	a->v[a->n] = NULL;
	return 0;
}

static void argl_free(struct argl *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* ---- command line ---- */

static void usage(FILE *f, const char *name)
{
	if (!strcmp(name, "checkpoint"))
		fprintf(f, "usage: cuinterpose checkpoint [--libdir DIR] [--criu PATH] [--timeout SECONDS] PID DIR "
			   "[-- CRIU-ARGS...]\n");
	else
		fprintf(f, "usage: cuinterpose restore [--libdir DIR] [--criu PATH] [--timeout SECONDS] [--reap] DIR "
			   "[-- CRIU-ARGS...]\n");
	fprintf(f,
		"  --libdir DIR       the plugin's directory (criu -L; default %s)\n"
		"  --criu PATH        criu binary (default: PATH, then /usr/local/sbin, /usr/sbin, /sbin)\n"
		"  --timeout SECONDS  kill criu after this long (default %d)\n",
		CUIP_CRIU_PLUGINDIR, DEFAULT_TIMEOUT_S);
	if (strcmp(name, "checkpoint"))
		fprintf(f, "  --reap             stay as the restored job's reaper until all of it has exited\n");
}

static int parse_pid(const char *s, pid_t *pid)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v <= 0 || v > INT_MAX)
		return -1;
	*pid = (pid_t)v;
	return 0;
}

/* An option's value (c: its val, 0 when missing): 0, or -1 said. */
static int parse_valued(struct front *f, int c, const char *v)
{
	int o = c ? c : optopt;
	char *end;
	long t;

	if (!c || !*v) {
		fprintf(stderr, "cuinterpose %s: --%s needs %s\n", f->name,
			o == 'l'   ? "libdir"
			: o == 'c' ? "criu"
				   : "timeout",
			o == 'l'   ? "a directory"
			: o == 'c' ? "a path to the criu binary"
				   : "a number of seconds");
		return -1;
	}
	if (o == 'l') {
		f->libdir = v;
	} else if (o == 'c') {
		f->criu_opt = v;
	} else {
		errno = 0;
		t = strtol(v, &end, 10);
		if (errno || *end || t < 1 || t > 86400 * 7) {
			fprintf(stderr, "cuinterpose %s: --timeout needs a number of seconds (1 .. 604800), got '%s'\n",
				f->name, v);
			return -1;
		}
		f->timeout_s = (unsigned)t;
	}
	return 0;
}

/* A positional argument: PID then DIR (checkpoint) or DIR (restore). */
static int parse_positional(struct front *f, const char *a, int *npos)
{
	bool ckpt = !strcmp(f->name, "checkpoint");

	if (ckpt && *npos == 0) {
		if (parse_pid(a, &f->pid)) {
			fprintf(stderr, "cuinterpose %s: '%s' is not a PID\n", f->name, a);
			return -1;
		}
	} else if (*npos == (ckpt ? 1 : 0)) {
		snprintf(f->dir, sizeof(f->dir), "%s", a);
	} else {
		fprintf(stderr, "cuinterpose %s: unexpected argument '%s' (criu's own arguments go after --)\n",
			f->name, a);
		return -1;
	}
	(*npos)++;
	return 0;
}

/* 0 to go on, 1 after --help, -1 usage error (said on stderr). What
 * follows "--" is criu's, passed through untouched. */
static int parse(struct front *f, int argc, char **argv)
{
	static const struct option ckpt_opts[] = {{"libdir", required_argument, NULL, 'l'},
						  {"criu", required_argument, NULL, 'c'},
						  {"timeout", required_argument, NULL, 't'},
						  {"help", no_argument, NULL, 'h'},
						  {NULL, 0, NULL, 0}};
	static const struct option restore_opts[] = {
		{"libdir", required_argument, NULL, 'l'},  {"criu", required_argument, NULL, 'c'},
		{"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
		{"reap", no_argument, NULL, 'r'},	   {NULL, 0, NULL, 0}};
	bool ckpt = !strcmp(f->name, "checkpoint");
	const char *arg;
	int npos = 0, c;

	cli_opt_start();
	while ((c = cli_opt_next(argc, argv, ckpt ? ckpt_opts : restore_opts, &arg)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout, f->name);
			return 1;
		case 'r':
			f->reap = true;
			break;
		case 'l':
		case 'c':
		case 't':
		case ':':
			if (parse_valued(f, c == ':' ? 0 : c, optarg))
				return -1;
			break;
		case 1:
			if (parse_positional(f, optarg, &npos))
				return -1;
			break;
		default:
			fprintf(stderr, "cuinterpose %s: unknown option '%s' (criu's own options go after --)\n",
				f->name, arg);
			return -1;
		}
	}
	if (optind < argc) {
		f->extra = argv + optind;
		f->nextra = argc - optind;
	}
	if (npos < (ckpt ? 2 : 1)) {
		fprintf(stderr, "cuinterpose %s: no %s given\n", f->name, ckpt && npos == 0 ? "PID" : "DIR");
		usage(stderr, f->name);
		return -1;
	}
	return 0;
}

/* ---- what the flags are picked from ---- */

static int find_criu(struct front *f)
{
	const char *path = getenv("PATH");
	char dirs[4096];

	if (f->criu_opt) {
		snprintf(f->criu, sizeof(f->criu), "%s", f->criu_opt);
		return access(f->criu, X_OK);
	}
	snprintf(dirs, sizeof(dirs), "%s:/usr/local/sbin:/usr/sbin:/sbin", path ? path : "");
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		if (snprintf(f->criu, sizeof(f->criu), "%s/criu", *d ? d : ".") < (int)sizeof(f->criu) &&
		    access(f->criu, X_OK) == 0)
			return 0;
	}
	return -1;
}

/* criu binary and plugin directory, before anything runs: 0 or -1 (said). */
static int find_tools(struct front *f)
{
	char so[PATH_MAX + 32];

	if (find_criu(f)) {
		fprintf(stderr, "cuinterpose %s: %s; install CRIU >= 4.0 or pass --criu PATH\n", f->name,
			f->criu_opt ? "--criu is not an executable"
				    : "criu not found in PATH, /usr/local/sbin, /usr/sbin, /sbin");
		return -1;
	}
	snprintf(so, sizeof(so), "%s/%s", f->libdir, PLUGIN_SO);
	if (access(so, R_OK)) {
		fprintf(stderr,
			"cuinterpose %s: %s: %s; install the plugin (make install) or pass the directory holding it "
			"with --libdir\n",
			f->name, so, strerror(errno));
		return -1;
	}
	return 0;
}

/* -L DIR unless DIR is criu's default plugin directory. */
static int add_libdir(const struct front *f, struct argl *a)
{
	char *want = realpath(f->libdir, NULL), *dflt = realpath(CRIU_DEFAULT_PLUGINDIR, NULL);
	bool same = want && dflt && !strcmp(want, dflt);
	int ret = 0;

	if (!same)
		ret = argl_add(a, "-L") ?: argl_add(a, "%s", want ? want : f->libdir);
	free(want);
	free(dflt);
	return ret;
}

/* State and parent of a process from /proc/PID/stat: 0 or -errno. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
	struct cuip_proc_stat st;
	int ret = cuip_proc_stat_read(pid, &st);

	if (ret)
		return ret;
	*state = st.state;
	*ppid = st.ppid;
	return 0;
}

static bool zombie_of_1(pid_t pid)
{
	char st;
	pid_t ppid;

	return !proc_stat(pid, &st, &ppid) && st == 'Z' && ppid == 1;
}

/* Zombies whose parent is PID 1 and that are still there 2 s after a first
 * look (a PID 1 that reaps takes less; some take most of a second): their
 * count. Returns at once when there is none. */
static int pid1_zombies(void)
{
	pid_t seen[64];
	int n = 0, still = 0;
	struct dirent *de;
	DIR *d = opendir("/proc");
	pid_t pid;

	while (d && (de = readdir(d)) && n < 64) {
		if (!parse_pid(de->d_name, &pid) && zombie_of_1(pid))
			seen[n++] = pid;
	}
	if (d)
		closedir(d);
	for (int waited = 0; n && waited <= ZOMBIE_WAIT_MS; waited += TICK_MS) {
		still = 0;
		for (int i = 0; i < n; i++)
			still += zombie_of_1(seen[i]);
		if (!still)
			break;
		sleep_ms(TICK_MS);
	}
	return still;
}

/*
 * A checkpoint ends the dumped tree (without --leave-running): its
 * processes are reparented to PID 1 (or the nearest subreaper) as they
 * die, and a PID 1 that does not reap leaves them zombies that keep their
 * pids, so the restore fails "Can't fork for PID: File exists". The front
 * end cannot help there (it is not the job's ancestor), only say it. A
 * restore can: with --reap it becomes a subreaper before criu runs, so the
 * restored tree is reparented to it when criu exits, and it stays to reap
 * every process of the job until the last has exited (the next checkpoint
 * included). Without --reap the restored root's parent is PID 1.
 */
static void reap_warn(const struct front *f)
{
	bool ckpt = !strcmp(f->name, "checkpoint");
	int z;

	if (f->reap)
		return;
	for (int i = 0; i < f->nextra; i++)
		if (ckpt && !strcmp(f->extra[i], "--leave-running"))
			return;
	z = pid1_zombies();
	if (!z)
		return;
	fprintf(stderr,
		"cuinterpose %s: warning: PID 1 does not reap orphans (%d zombie(s) with parent 1): %s; %s "
		"(README, \"PID 1 must reap orphans\")\n",
		f->name, z,
		ckpt ? "unless a subreaper above the job reaps them, the processes this checkpoint ends may stay "
		       "zombies that keep their pids, and the restore then fails \"Can't fork for PID: File exists\""
		     : "the restored job's parent will be PID 1 once criu exits, and the processes its next "
		       "checkpoint ends may stay zombies that block the restore after it",
		ckpt ? "start the job under a subreaper (tini -s, e2e_reaper), and restore it with cuinterpose "
		       "restore --reap"
		     : "restore with --reap to keep this command as the job's reaper");
}

/*
 * A root whose session is led from outside this pid namespace (getsid()
 * answers 0: the job was started by a shell of the parent namespace) is
 * one criu cannot dump, --shell-job or not ("A session leader of P is
 * outside of its pid namespace"): refused before criu freezes anything and
 * before DIR is made.
 */
static int check_session(const struct front *f)
{
	pid_t sid = getsid(f->pid);

	if (sid < 0) {
		fprintf(stderr, "cuinterpose %s: cannot read pid %d's session: %s\n", f->name, f->pid, strerror(errno));
		return 1;
	}
	if (sid == 0) {
		fprintf(stderr,
			"cuinterpose %s: pid %d's session leader is outside this pid namespace: criu cannot dump such "
			"a process, --shell-job or not; start the job in a session of its own (setsid) or from a "
			"shell inside the namespace\n",
			f->name, f->pid);
		return 1;
	}
	return 0;
}

/* --shell-job when the root does not lead its session (criu's own test:
 * the root's pid is not its sid); check_session() has refused sid 0. */
static int add_shell_job(const struct front *f, struct argl *a)
{
	pid_t sid = getsid(f->pid);
	char comm[64];

	if (sid == f->pid)
		return 0;
	cuip_proc_comm(sid, comm, sizeof(comm));
	fprintf(stderr, "cuinterpose %s: --shell-job: pid %d's session leader %d (%s) is outside the dumped tree\n",
		f->name, f->pid, (int)sid, comm);
	return argl_add(a, "--shell-job");
}

/* --link-remap when a process of the tree holds an unlinked /dev/shm file
 * that lives on under another name (what the plugin hints at in dump.log). */
static int add_link_remap(const struct front *f, struct argl *a)
{
	char path[PATH_MAX], comm[64];
	pid_t *tree = NULL;
	int n = cuip_proc_tree(f->pid, &tree), ret = 0;

	for (int i = 0; i < n; i++) {
		int k = cuip_proc_unlinked_shm(tree[i], path, sizeof(path));

		if (k <= 0)
			continue;
		cuip_proc_comm(tree[i], comm, sizeof(comm));
		fprintf(stderr,
			"cuinterpose %s: --link-remap: pid %d (%s) maps or holds %d unlinked /dev/shm file(s) "
			"(%s)\n",
			f->name, tree[i], comm, k, path);
		ret = argl_add(a, "--link-remap");
		break;
	}
	free(tree);
	return ret;
}

/* Did the user pass `flag` (or flag=VALUE) after --? */
static bool extra_has(const struct front *f, const char *flag)
{
	size_t l = strlen(flag);

	for (int i = 0; i < f->nextra; i++)
		if (!strncmp(f->extra[i], flag, l) && (!f->extra[i][l] || f->extra[i][l] == '='))
			return true;
	return false;
}

/* Add each space-separated word of s. */
static int argl_words(struct argl *a, const char *s)
{
	char buf[128], *save = NULL;
	int ret = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	for (char *w = strtok_r(buf, " ", &save); w && !ret; w = strtok_r(NULL, " ", &save))
		ret = argl_add(a, "%s", w);
	return ret;
}

/*
 * --tcp-established when a process of the tree holds a connected TCP
 * socket (criu refuses to dump one without it), with --network-lock
 * nftables when criu cannot lock the network with iptables here; recorded
 * in DIR for the restore, which needs the same flags. A stale record of an
 * earlier checkpoint into DIR goes first. The user's own flags after --
 * win.
 */
static int add_tcp(const struct front *f, struct argl *a)
{
	char path[PATH_MAX + 64], why[256], comm[64], flags[64];
	const char *lock = "";
	struct cli_tcp t;
	FILE *out;

	snprintf(path, sizeof(path), "%s/%s", f->dir, FLAGS_FILE);
	unlink(path);
	if (extra_has(f, "--tcp-established") || cli_tcp_connected(f->pid, &t) || !t.n)
		return 0;
	if (extra_has(f, "--network-lock"))
		snprintf(why, sizeof(why), "--network-lock given");
	else
		lock = cli_network_lock(f->criu, why, sizeof(why));
	snprintf(flags, sizeof(flags), "--tcp-established%s%s", lock && *lock ? " --network-lock " : "",
		 lock && *lock ? lock : "");
	cuip_proc_comm(t.pid, comm, sizeof(comm));
	fprintf(stderr,
		"cuinterpose %s: %s: pid %d (%s) holds %d connected TCP socket(s) (%s; e.g. torch.distributed's "
		"store); %s\n",
		f->name, flags, t.pid, comm, t.n, t.first, why);
	out = fopen(path, "we");
	if (!out || fprintf(out, "%s\n", flags) < 0 || fclose(out)) {
		fprintf(stderr, "cuinterpose %s: cannot record %s for the restore in %s: %s\n", f->name, flags, path,
			strerror(errno));
		if (out)
			fclose(out);
	}
	return argl_words(a, flags);
}

/* The flags the checkpoint recorded (add_tcp), less those the user gives
 * after --; only the words add_tcp writes are taken. */
static int add_restore_tcp(const struct front *f, struct argl *a)
{
	char path[PATH_MAX + 64], line[128] = "", keep[128] = "", *save = NULL;
	bool lock_given = extra_has(f, "--network-lock"), skip_value = false;
	FILE *in;

	snprintf(path, sizeof(path), "%s/%s", f->dir, FLAGS_FILE);
	in = fopen(path, "re");
	if (!in)
		return 0;
	if (!fgets(line, sizeof(line), in))
		line[0] = 0;
	fclose(in);
	line[strcspn(line, "\n")] = 0;
	for (char *w = strtok_r(line, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
		bool value = skip_value;

		skip_value = false;
		if (value && (!strcmp(w, "nftables") || !strcmp(w, "iptables"))) {
			if (!lock_given)
				snprintf(keep + strlen(keep), sizeof(keep) - strlen(keep), " %s", w);
			continue;
		}
		if (!strcmp(w, "--network-lock")) {
			skip_value = true;
			if (!lock_given)
				snprintf(keep + strlen(keep), sizeof(keep) - strlen(keep), " %s", w);
		} else if (!strcmp(w, "--tcp-established")) {
			if (!extra_has(f, w))
				snprintf(keep + strlen(keep), sizeof(keep) - strlen(keep), " %s", w);
		} else {
			fprintf(stderr, "cuinterpose %s: warning: %s holds '%s', not a flag it records; ignored\n",
				f->name, path, w);
			return 0;
		}
	}
	if (!keep[0])
		return 0;
	fprintf(stderr, "cuinterpose %s: %s: the checkpoint holds connected TCP sockets (recorded by its dump in %s)\n",
		f->name, keep + 1, path);
	return argl_words(a, keep + 1);
}

static int add_extra(const struct front *f, struct argl *a)
{
	int ret = 0;

	for (int i = 0; i < f->nextra && !ret; i++)
		ret = argl_add(a, "%s", f->extra[i]);
	return ret;
}

static int dump_args(const struct front *f, struct argl *a)
{
	return argl_add(a, "%s", f->criu) ?: argl_add(a, "dump") ?: argl_add(a, "-t") ?: argl_add(a, "%d", f->pid)
		?: argl_add(a, "-D") ?: argl_add(a, "%s", f->dir) ?: add_libdir(f, a) ?: add_shell_job(f, a)
		?: add_link_remap(f, a) ?: add_tcp(f, a) ?: argl_add(a, "-v4") ?: argl_add(a, "-o") ?: argl_add(a, "dump.log")
		?: add_extra(f, a);
}

/* ---- the images' process tree (restore) ---- */

/* The first id of the tree that a process holds, or 0. */
static pid_t ptree_taken(const struct cli_ptree *t)
{
	for (size_t i = 0; i < t->n; i++)
		if (!kill(t->ids[i], 0) || errno == EPERM)
			return t->ids[i];
	return 0;
}

/*
 * criu recreates every process and thread under its old id: wait a while
 * for a dump's processes to be reaped (their parent may be a moment late;
 * a live holder gets 1 s to die), then say which id is still taken and by
 * what; criu then fails "Can't fork for PID: File exists" on its own.
 */
static void ptree_wait_free(const struct front *f, const struct cli_ptree *t)
{
	char st = '?', comm[64], pcomm[64] = "?";
	pid_t p = 0, ppid = 0;

	for (int waited = 0; (p = ptree_taken(t)) && waited < FREE_WAIT_MS; waited += 50) {
		if (waited >= 1000 && !proc_stat(p, &st, &ppid) && st != 'Z')
			break;
		sleep_ms(50);
	}
	if (!p)
		return;
	cuip_proc_comm(p, comm, sizeof(comm));
	proc_stat(p, &st, &ppid);
	if (ppid > 0)
		cuip_proc_comm(ppid, pcomm, sizeof(pcomm));
	fprintf(stderr,
		"cuinterpose %s: warning: pid %d of the images is taken by a %s (%s, parent %d %s)%s; criu restore "
		"fails \"Can't fork for PID: File exists\"\n",
		f->name, p, st == 'Z' ? "zombie" : "live process", comm, ppid, pcomm,
		st == 'Z' ? " that its parent does not reap (README, \"PID 1 must reap orphans\")" : "");
}

static int add_restore_shell_job(const struct front *f, const struct cli_ptree *t, struct argl *a)
{
	if (t->root_sid == t->root)
		return 0;
	fprintf(stderr, "cuinterpose %s: --shell-job: the dumped root %d did not lead its session (%d)\n", f->name,
		t->root, t->root_sid);
	return argl_add(a, "--shell-job");
}

static int restore_args(const struct front *f, const struct cli_ptree *t, struct argl *a)
{
	return argl_add(a, "%s", f->criu) ?: argl_add(a, "restore") ?: argl_add(a, "-D") ?: argl_add(a, "%s", f->dir)
		?: add_libdir(f, a) ?: add_restore_shell_job(f, t, a) ?: add_restore_tcp(f, a)
		?: argl_add(a, "--restore-detached")
		?: argl_add(a, "--pidfile") ?: argl_add(a, "%s/restored.pid", f->dir) ?: argl_add(a, "-v4")
		?: argl_add(a, "-o") ?: argl_add(a, "restore.log") ?: add_extra(f, a);
}

/* ---- running criu ---- */

/* The log criu writes: -o FILE in the -W directory, else in -D (the last
 * of each option wins, so passed-through ones count). */
static void find_log(struct front *f, const struct argl *a)
{
	const char *dir = ".", *wdir = NULL, *out = NULL;

	for (size_t i = 1; i + 1 < a->n; i++) {
		const char *o = a->v[i], *v = a->v[i + 1];

		if (!strcmp(o, "-D") || !strcmp(o, "--images-dir"))
			dir = v;
		else if (!strcmp(o, "-W") || !strcmp(o, "--work-dir"))
			wdir = v;
		else if (!strcmp(o, "-o") || !strcmp(o, "--log-file"))
			out = v;
	}
	if (out && out[0] == '/')
		snprintf(f->log, sizeof(f->log), "%s", out);
	else
		snprintf(f->log, sizeof(f->log), "%s/%s", wdir ? wdir : dir, out ? out : "criu.log");
}

static void put_quoted(FILE *o, const char *s)
{
	static const char safe[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-";

	if (*s && strspn(s, safe) == strlen(s)) {
		fputs(s, o);
		return;
	}
	fputc('\'', o);
	for (; *s; s++) {
		if (*s == '\'')
			fputs("'\\''", o);
		else
			fputc(*s, o);
	}
	fputc('\'', o);
}

/* The exact command, one line, as a shell would take it back. */
static void print_cmdline(const struct front *f, const struct argl *a, const char *env)
{
	fprintf(stderr, "cuinterpose %s: running: %s%s", f->name, env ? env : "", env ? " " : "");
	for (size_t i = 0; i < a->n; i++) {
		if (i)
			fputc(' ', stderr);
		put_quoted(stderr, a->v[i]);
	}
	fputc('\n', stderr);
}

static pid_t spawn(const struct argl *a)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGQUIT, SIG_DFL);
		execv(a->v[0], a->v);
		fprintf(stderr, "cuinterpose: cannot execute %s: %s\n", a->v[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

/* Follows criu's log as it grows; keeps the plugin's latest phase line. */
struct follow {
	int fd;
	char buf[8192];
	size_t len;
	char phase[512];
	double t0;
};

static int term_width(void)
{
	struct winsize ws;

	return ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20 ? ws.ws_col : 80;
}

/* One status line, rewritten in place and cut to the terminal's width:
 * "[checkpoint 2.5 s] SAVE 3.2 GiB of 16.0 GiB (20%), 2.1 GB/s", the
 * phase, bytes and rate of the plugin's latest line. */
static void status_show(const struct front *f, const struct follow *fo)
{
	char line[768];

	if (!f->tty)
		return;
	snprintf(line, sizeof(line), "[%s %.1f s] %s", f->name, now_s() - fo->t0,
		 fo->phase[0] ? fo->phase : "criu running");
	fprintf(stderr, "\r%.*s\033[K", term_width() - 1, line);
}

static void status_clear(const struct front *f)
{
	if (f->tty)
		fprintf(stderr, "\r\033[K");
}

/* A plugin line worth the status line: a phase (its name in capitals:
 * SAVE, LOAD, PAUSE_DEVICES, ...) or the tree's first line. */
static bool phase_line(const char *m)
{
	return (m[0] >= 'A' && m[0] <= 'Z') || !strncmp(m, "dump of tree", 12) || !strncmp(m, "restore of tree", 15);
}

/* "SAVE in progress: 3.2 GiB of 16.0 GiB (20%), 2.1 GB/s, 1.5 s" (coord.c)
 * becomes "SAVE 3.2 GiB of 16.0 GiB (20%), 2.1 GB/s"; with SAVE's detail
 * " (decided; 1.0 GiB scanned on the device, 0.1 GiB copied to the host)"
 * that follows, ", 1.0 GiB scanned on the device, 0.1 GiB copied to the
 * host"; other lines stay. */
static void follow_line(struct front *f, struct follow *fo, char *line)
{
	static const char in_prog[] = " in progress: ", decided[] = " (decided; ";
	const int n = (int)sizeof(in_prog) - 1;
	char *m = strstr(line, MARK), *prog, *last, *detail = NULL;
	int g;

	if (m && sscanf(m + strlen(MARK), "guardian pid %d watches", &g) == 1)
		f->guardian = g;
	if (!m || !phase_line(m += strlen(MARK)))
		return;
	prog = strstr(m, in_prog);
	if (prog && (detail = strstr(prog, decided))) {
		*detail = 0; /* the time is the last piece before it */
		detail += sizeof(decided) - 1;
		detail[strcspn(detail, ")")] = 0;
	}
	last = prog ? strrchr(prog, ',') : NULL;
	if (last && last[strspn(last, ", 0123456789.")] == 's')
		snprintf(fo->phase, sizeof(fo->phase), "%.*s %.*s%s%s", (int)(prog - m), m, (int)(last - prog - n),
			 prog + n, detail ? ", " : "", detail ? detail : "");
	else
		snprintf(fo->phase, sizeof(fo->phase), "%s", m);
	if (prog) /* at once: a tick may read several of them */
		status_show(f, fo);
}

static void follow_poll(struct front *f, struct follow *fo)
{
	ssize_t r;

	if (fo->fd < 0)
		fo->fd = open(f->log, O_RDONLY | O_CLOEXEC);
	while (fo->fd >= 0 && (r = read(fo->fd, fo->buf + fo->len, sizeof(fo->buf) - 1 - fo->len)) > 0) {
		char *s = fo->buf, *nl;

		fo->len += (size_t)r;
		fo->buf[fo->len] = 0;
		while ((nl = strchr(s, '\n'))) {
			*nl = 0;
			follow_line(f, fo, s);
			s = nl + 1;
		}
		fo->len -= (size_t)(s - fo->buf);
		memmove(fo->buf, s, fo->len);
		if (fo->len == sizeof(fo->buf) - 1) /* a line longer than the buffer: drop it */
			fo->len = 0;
	}
	status_show(f, fo);
}

/* criu past its time: SIGTERM (and SIGCONT, should it be stopped), SIGKILL
 * KILL_GRACE_S later; 124 in any case. */
static int stop_hung(struct front *f, pid_t pid)
{
	int st;

	f->hung = true;
	kill(pid, SIGTERM);
	kill(pid, SIGCONT);
	for (int waited = 0; waitpid(pid, &st, WNOHANG) == 0; waited += TICK_MS) {
		if (waited == KILL_GRACE_S * 1000)
			kill(pid, SIGKILL);
		if (waited >= 2 * KILL_GRACE_S * 1000)
			break;
		sleep_ms(TICK_MS);
	}
	return 124;
}

static bool guardian_alive(pid_t pid)
{
	char st = 0;
	pid_t pp;

	return !proc_stat(pid, &st, &pp) && st != 'Z';
}

/*
 * criu failed or was killed after the plugin started its guardian, which
 * rolls the job back on its own: wait for it (as long as --timeout), so
 * that the summary holds its verdict and the job runs again when this
 * command returns.
 */
static void wait_guardian(struct front *f, struct follow *fo)
{
	double t0 = now_s();

	if (f->guardian <= 0 || !guardian_alive(f->guardian))
		return;
	snprintf(fo->phase, sizeof(fo->phase), "the plugin's guardian (pid %d) rolls the job back", f->guardian);
	while (guardian_alive(f->guardian) && now_s() - t0 < f->timeout_s) {
		follow_poll(f, fo);
		sleep_ms(TICK_MS);
	}
	if (guardian_alive(f->guardian)) {
		status_clear(f);
		fprintf(stderr,
			"cuinterpose %s: the plugin's guardian (pid %d) is still rolling the job back; see %s/%s\n",
			f->name, f->guardian, f->dir, "cuinterpose-guardian.log");
	}
}

/* Wait for criu, following its log; its exit status (128+N for signal N). */
static int watch(struct front *f, pid_t pid)
{
	struct follow fo = {.fd = -1, .t0 = now_s()};
	int st, ret;
	pid_t r;

	while ((r = waitpid(pid, &st, WNOHANG)) == 0 || (r < 0 && errno == EINTR)) {
		follow_poll(f, &fo);
		if (now_s() - fo.t0 > f->timeout_s) {
			ret = stop_hung(f, pid);
			goto out;
		}
		sleep_ms(TICK_MS);
	}
	ret = r < 0 ? 1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
out:
	if (ret)
		wait_guardian(f, &fo);
	follow_poll(f, &fo);
	status_clear(f);
	if (fo.fd >= 0)
		close(fo.fd);
	return ret;
}

/* ---- the summary ---- */

/* A plugin line of the summary: the tree, the phases that moved bytes,
 * the hooks' "done" lines, verification, rollback, refusals, failures. */
static bool summary_line(const char *m)
{
	static const char *const keep[] = {
		"dump of tree",	   " done:",	   "verified:",	      "complete", "restoring the job in place",
		"declining",	   "refused",	   "REFUSED",	      "FAILED",	  "failed",
		"cannot",	   "--link-remap", "link_remap file", "killing",  "guardian: criu exited",
		"restore of tree", "no progress",  "fault injection", "warning",  "outside the dumped tree",
	};

	if (strstr(m, " participants, ") && strstr(m, " bytes, "))
		return true;
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		if (strstr(m, keep[i]))
			return true;
	return false;
}

/* criu's own error lines ("Error (file:line): ..."), the last ERR_LINES. */
static void keep_error(char errs[ERR_LINES][512], int *n, const char *line)
{
	if (!strstr(line, "Error (") && !strstr(line, "Error:"))
		return;
	snprintf(errs[*n % ERR_LINES], sizeof(errs[0]), "%s", line);
	(*n)++;
}

static void print_summary(const struct front *f, int status)
{
	char errs[ERR_LINES][512], pause[512] = "", *line = NULL;
	int nerr = 0, shown = 0, plugin = 0;
	size_t cap = 0;
	ssize_t len;
	FILE *in = fopen(f->log, "re");

	while (in && (len = getline(&line, &cap, in)) > 0) {
		char *m = strstr(line, MARK);

		line[strcspn(line, "\n")] = 0;
		keep_error(errs, &nerr, line);
		plugin += m != NULL;
		/* the job's pause (hooks.c, pause_line): last, whatever the count */
		if (m && !strncmp(m + strlen(MARK), "pause: ", 7))
			snprintf(pause, sizeof(pause), "%s", m);
		else if (m && summary_line(m + strlen(MARK)) && shown++ < SUMMARY_MAX)
			fprintf(stderr, "%s\n", m);
	}
	free(line);
	if (in)
		fclose(in);
	if (shown > SUMMARY_MAX)
		fprintf(stderr, "cuinterpose %s: ... %d more summary lines in the log\n", f->name, shown - SUMMARY_MAX);
	if (pause[0])
		fprintf(stderr, "%s\n", pause);
	if (!in)
		fprintf(stderr, "cuinterpose %s: criu wrote no log (%s: %s)\n", f->name, f->log, strerror(errno));
	else if (!plugin)
		fprintf(stderr, "cuinterpose %s: no cuinterpose line in %s: the plugin did not run\n", f->name, f->log);
	for (int i = nerr > ERR_LINES ? nerr - ERR_LINES : 0; status && i < nerr; i++)
		fprintf(stderr, "%s\n", errs[i % ERR_LINES]);
	if (f->hung)
		fprintf(stderr,
			"cuinterpose %s: criu did not finish within %u s and was killed: it hung; its log: %s\n",
			f->name, f->timeout_s, f->log);
	else if (status)
		fprintf(stderr, "cuinterpose %s: criu failed (exit status %d); its log: %s\n", f->name, status, f->log);
	else
		fprintf(stderr, "cuinterpose %s: criu succeeded; its log: %s\n", f->name, f->log);
}

/* The plugin's variables and the command's, checked against the table
 * here, before criu starts: criu's init would refuse them too, but only
 * after the command has prepared its run. */
static int settings_ok(const struct front *f)
{
	char err[512];

	if (!cuip_settings_check_env(CUIP_READER_PLUGIN | CUIP_READER_CLI, err, sizeof(err)))
		return 1;
	fprintf(stderr, "cuinterpose %s: %s\n", f->name, err);
	return 0;
}

static int run_criu(struct front *f, const struct argl *a)
{
	const char *env = NULL;
	struct sigaction ign = {.sa_handler = SIG_IGN}, oint, oquit;
	pid_t pid;
	int status;

	find_log(f, a);
	unlink(f->log); /* what follows must be this run's */
	/* A terminal gets finer progress than the plugin's 5 s default. */
	if (f->tty && !getenv("CUINTERPOSE_PROGRESS_MS")) {
		env = "CUINTERPOSE_PROGRESS_MS=1000";
		setenv("CUINTERPOSE_PROGRESS_MS", "1000", 1);
	}
	print_cmdline(f, a, env);
	/* Ctrl-C reaches criu (same process group); its outcome is reported. */
	sigaction(SIGINT, &ign, &oint);
	sigaction(SIGQUIT, &ign, &oquit);
	pid = spawn(a);
	if (pid < 0) {
		fprintf(stderr, "cuinterpose %s: fork: %s\n", f->name, strerror(errno));
		status = 1;
	} else {
		status = watch(f, pid);
		print_summary(f, status);
	}
	sigaction(SIGINT, &oint, NULL);
	sigaction(SIGQUIT, &oquit, NULL);
	return status;
}

/* ---- the two commands ---- */

/* DIR (made for a checkpoint) as an absolute path, once find_tools() has
 * found the criu binary and the plugin: 0, or 1 after saying what failed. */
static int prepare(struct front *f)
{
	char *abs;

	f->tty = isatty(STDERR_FILENO);
	if (!strcmp(f->name, "checkpoint") && mkdir(f->dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "cuinterpose %s: cannot create %s: %s\n", f->name, f->dir, strerror(errno));
		return 1;
	}
	abs = realpath(f->dir, NULL);
	if (!abs) {
		fprintf(stderr, "cuinterpose %s: %s: %s\n", f->name, f->dir, strerror(errno));
		return 1;
	}
	snprintf(f->dir, sizeof(f->dir), "%s", abs);
	free(abs);
	return 0;
}

/* Defaults, then the options: parse()'s 0 (go on), 1 (--help), -1 (usage). */
static int setup(struct front *f, int argc, char **argv)
{
	f->libdir = CUIP_CRIU_PLUGINDIR;
	f->timeout_s = DEFAULT_TIMEOUT_S;
	return parse(f, argc, argv);
}

int cli_checkpoint(int argc, char **argv)
{
	struct front f = {.name = "checkpoint"};
	struct argl a = {0};
	int ret = setup(&f, argc, argv);

	if (ret)
		return ret < 0 ? 2 : 0;
	if (!settings_ok(&f))
		return 1;
	if (kill(f.pid, 0) && errno == ESRCH) {
		fprintf(stderr, "cuinterpose checkpoint: no such process: %d\n", f.pid);
		return 1;
	}
	if (find_tools(&f) || check_session(&f) || prepare(&f))
		return 1;
	reap_warn(&f);
	ret = dump_args(&f, &a) ? 1 : run_criu(&f, &a);
	argl_free(&a);
	return ret;
}

/* --reap: every process below, the restored job included, until none is
 * left; says how the restored root ended. */
static void reap_all(const struct front *f, pid_t root)
{
	int st;
	pid_t p;

	fprintf(stderr, "cuinterpose %s: --reap: reaping pid %d's tree until it has exited\n", f->name, root);
	while ((p = waitpid(-1, &st, 0)) > 0 || errno == EINTR) {
		if (p != root)
			continue;
		if (WIFEXITED(st))
			fprintf(stderr, "cuinterpose %s: restored pid %d exited with status %d\n", f->name, root,
				WEXITSTATUS(st));
		else
			fprintf(stderr, "cuinterpose %s: restored pid %d was killed by signal %d\n", f->name, root,
				WTERMSIG(st));
	}
}

/* After a restore: the restored root's pid on stdout (from the pidfile). */
static pid_t print_restored(const struct front *f)
{
	char path[PATH_MAX + 16];
	FILE *in;
	int pid = 0;

	snprintf(path, sizeof(path), "%s/restored.pid", f->dir);
	in = fopen(path, "re");
	if (in && fscanf(in, "%d", &pid) == 1 && pid > 0)
		printf("%d\n", pid);
	if (in)
		fclose(in);
	fflush(stdout);
	return pid;
}

int cli_restore(int argc, char **argv)
{
	struct front f = {.name = "restore"};
	struct argl a = {0};
	struct cli_ptree *t;
	char pidfile[PATH_MAX + 16], why[256];
	int ret = setup(&f, argc, argv), r;

	if (ret)
		return ret < 0 ? 2 : 0;
	if (!settings_ok(&f) || find_tools(&f) || prepare(&f))
		return 1;
	t = calloc(1, sizeof(*t));
	if (!t)
		return 1;
	snprintf(pidfile, sizeof(pidfile), "%s/pstree.img", f.dir);
	r = cli_pstree_read(pidfile, t, why, sizeof(why));
	if (r) {
		fprintf(stderr, "cuinterpose restore: cannot read %s: %s%s%s; is %s a criu image directory?\n", pidfile,
			strerror(-r), *why ? ": " : "", why, f.dir);
		free(t);
		return 1;
	}
	ptree_wait_free(&f, t);
	reap_warn(&f);
	snprintf(pidfile, sizeof(pidfile), "%s/restored.pid", f.dir);
	unlink(pidfile);
	if (f.reap && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
		fprintf(stderr, "cuinterpose restore: --reap: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
	ret = restore_args(&f, t, &a) ? 1 : run_criu(&f, &a);
	if (!ret && (r = print_restored(&f)) > 0 && f.reap)
		reap_all(&f, r);
	argl_free(&a);
	free(t);
	return ret;
}
