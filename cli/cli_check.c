/*
 * cli_check.c - `cuinterpose check [--json] [--libdir DIR] [--criu PATH]
 * [--criu-check]`: diagnose the environment a checkpoint needs.
 *
 * One line per diagnosis, OK / WARN / FAIL, each FAIL or WARN saying what
 * to do:
 *   criu       found, `criu --version` >= 4.0 (the device hooks);
 *              with --criu-check also `criu check`
 *   breakpoint this machine delivers x86 hardware breakpoints, or the
 *              criu found is >= 4.2 and falls back without them (probed
 *              in a traced child, see hwbp_probe)
 *   plugin     cuinterpose_plugin.so in CRIU's plugin dir (/usr/lib/criu,
 *              or --libdir, as criu's -L), and no cuda_plugin.so beside it
 *   driver     libcuda.so.1 (or $CUINTERPOSE_LIBCUDA) loads, its version,
 *              the checkpoint API (cuCheckpointProcessLock) is exported
 *   interposer the library `cuinterpose run` would preload
 *   sockets    $CUINTERPOSE_SOCKET_DIR (default /run/cuinterpose): a
 *              directory, sticky when world-writable
 *   pid N      every process with libcuinterpose.so mapped (or each
 *              --pid): its control socket answers a handshake and INSPECT,
 *              and its phase is ACTIVE
 * Exit status: 0 when nothing FAILs (warnings allowed), 1 otherwise,
 * 2 usage. Called from cli.c's main; single-threaded, no locks.
 */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <sys/user.h>
#endif

#include "cli.h"
#include "client.h"
#include "proc.h"
#include "procstat.h"

enum verdict { CK_OK, CK_WARN, CK_FAIL };

struct check {
	int json;
	int n; /* lines printed (JSON commas) */
	int fails, warns;
};

static void report(struct check *c, enum verdict v, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void report(struct check *c, enum verdict v, const char *name, const char *fmt, ...)
{
	static const char *const tag[] = {"OK", "WARN", "FAIL"};
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->fails += v == CK_FAIL;
	c->warns += v == CK_WARN;
	if (c->json) {
		printf("%s{\"check\":", c->n ? "," : "");
		cli_jstr(name);
		printf(",\"status\":\"%s\",\"message\":", tag[v]);
		cli_jstr(msg);
		printf("}");
	} else {
		printf("%-4s %-10s %s\n", tag[v], name, msg);
	}
	c->n++;
}

/* Run argv, capture up to len-1 bytes of stdout+stderr; exit status or -1. */
static int capture(char *const argv[], char *out, size_t len)
{
	int pfd[2], st;
	size_t got = 0;
	ssize_t r;
	pid_t pid;

	out[0] = 0;
	if (pipe2(pfd, O_CLOEXEC))
		return -1;
	pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(pfd[1]);
	while (got + 1 < len && (r = read(pfd[0], out + got, len - 1 - got)) > 0)
		got += (size_t)r;
	out[got] = 0;
	/* Drain the rest so the child never blocks on a full pipe. */
	while ((r = read(pfd[0], &st, sizeof(st))) > 0)
		;
	close(pfd[0]);
	if (waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int find_criu(const char *want, char *buf, size_t len)
{
	const char *path = getenv("PATH");
	char dirs[4096];

	if (want) {
		snprintf(buf, len, "%s", want);
		return access(buf, X_OK);
	}
	snprintf(dirs, sizeof(dirs), "%s:/usr/local/sbin:/usr/sbin:/sbin", path ? path : "");
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		if (snprintf(buf, len, "%s/criu", *d ? d : ".") < (int)len && access(buf, X_OK) == 0)
			return 0;
	}
	return -1;
}

/*
 * Hardware breakpoints. After its parasite runs, compel (CRIU's code
 * injector) arms an execute breakpoint in DR0/DR7, PTRACE_CONTs the task
 * and waits in wait4 for the SIGTRAP. A VM that does not virtualize the
 * debug registers never delivers it: CRIU < 4.2 then waits forever, in
 * every dump; 4.2 probes them at start (kerndat) and falls back to stopping
 * the task without them, as CRIU_FAULT=130 makes older versions do.
 */
enum hwbp {
	HWBP_FIRES,    /* SIGTRAP stop with DR6.B0 set */
	HWBP_SILENT,   /* armed, but the child ran past it or no trap came */
	HWBP_UNPROBED, /* cannot tell: ptrace refused, not x86_64... */
};

#define HWBP_WAIT_MS 2000

#if defined(__x86_64__)
#define DR7_L0	  0x1UL /* local enable of DR0; RW0 = 00 (execute), LEN0 = 00 */
#define DR6_B0	  0x1UL /* DR0's condition was met */
#define DR_OFF(n) offsetof(struct user, u_debugreg[n])

/* The probe child calls it right after its first stop, through a volatile
 * pointer so that the call lands on the address armed in DR0 (no inlined
 * or cloned copy). */
static void __attribute__((noinline)) hwbp_target(void)
{
	__asm__ volatile("" ::: "memory");
}

static void (*volatile hwbp_call)(void) = hwbp_target;

/* waitpid(pid) for at most ms (polling WNOHANG): 0 and *st, *reaped when
 * the child is gone; or -1 with errno (ETIMEDOUT: no change in time). */
static int wait_bounded(pid_t pid, int *st, int *reaped, int ms)
{
	struct timespec tick = {0, 10 * 1000 * 1000};

	for (int waited = 0;; waited += 10) {
		pid_t r = waitpid(pid, st, WNOHANG);

		if (r == pid) {
			*reaped = WIFEXITED(*st) || WIFSIGNALED(*st);
			return 0;
		}
		if (r < 0 && errno != EINTR)
			return -1;
		if (waited >= ms) {
			errno = ETIMEDOUT;
			return -1;
		}
		nanosleep(&tick, NULL);
	}
}

/* The tracer's side of hwbp_probe, on its child pid: wait for its first
 * stop, arm DR0 and DR7, continue it, wait for the trap. */
static enum hwbp hwbp_trace(pid_t pid, int *reaped, char *why, size_t len)
{
	unsigned long dr6;
	int st;

	if (wait_bounded(pid, &st, reaped, HWBP_WAIT_MS)) {
		snprintf(why, len, "the probe child did not stop: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (WIFEXITED(st)) {
		snprintf(why, len, "PTRACE_TRACEME: %s", strerror(WEXITSTATUS(st)));
		return HWBP_UNPROBED;
	}
	if (!WIFSTOPPED(st) || WSTOPSIG(st) != SIGSTOP) {
		snprintf(why, len, "the probe child did not stop as expected (wait status %#x)", (unsigned)st);
		return HWBP_UNPROBED;
	}
	if (ptrace(PTRACE_POKEUSER, pid, DR_OFF(0), (unsigned long)hwbp_call)) {
		snprintf(why, len, "PTRACE_POKEUSER DR0: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (ptrace(PTRACE_POKEUSER, pid, DR_OFF(7), DR7_L0)) {
		snprintf(why, len, "PTRACE_POKEUSER DR7: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (ptrace(PTRACE_CONT, pid, NULL, NULL)) {
		snprintf(why, len, "PTRACE_CONT: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (wait_bounded(pid, &st, reaped, HWBP_WAIT_MS)) {
		if (errno != ETIMEDOUT) {
			snprintf(why, len, "waitpid: %s", strerror(errno));
			return HWBP_UNPROBED;
		}
		snprintf(why, len, "no trap within %d ms", HWBP_WAIT_MS);
		return HWBP_SILENT;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		snprintf(why, len, "an execute breakpoint armed in DR0 did not stop the probe child");
		return HWBP_SILENT;
	}
	if (!WIFSTOPPED(st) || WSTOPSIG(st) != SIGTRAP) {
		/* Another signal, or killed from outside: no answer either way. */
		snprintf(why, len, "the probe child left its stop other than by a SIGTRAP (wait status %#x)",
			 (unsigned)st);
		return HWBP_UNPROBED;
	}
	errno = 0;
	dr6 = (unsigned long)ptrace(PTRACE_PEEKUSER, pid, DR_OFF(6), NULL);
	if (errno) {
		snprintf(why, len, "PTRACE_PEEKUSER DR6: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (!(dr6 & DR6_B0)) {
		snprintf(why, len, "SIGTRAP without DR6.B0 (DR6 %#lx)", dr6);
		return HWBP_SILENT;
	}
	return HWBP_FIRES;
}

/*
 * Arm DR0 on hwbp_target in a traced child, as compel does, and see whether
 * the trap comes: the child stops itself (PTRACE_TRACEME, SIGSTOP), the
 * parent writes DR0 and DR7 with PTRACE_POKEUSER and continues it, then
 * waits at most HWBP_WAIT_MS for a SIGTRAP stop with DR6.B0 set. The child
 * is killed and reaped on every path. Why it did not fire, or could not
 * be probed, in why.
 */
static enum hwbp hwbp_probe(char *why, size_t len)
{
	int st, reaped = 0;
	enum hwbp res;
	pid_t pid;

	pid = fork();
	if (pid < 0) {
		snprintf(why, len, "fork: %s", strerror(errno));
		return HWBP_UNPROBED;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (ptrace(PTRACE_TRACEME, 0, NULL, NULL))
			_exit(errno); /* never 0: the parent tells it from running past */
		raise(SIGSTOP);
		hwbp_call();
		_exit(0);
	}
	res = hwbp_trace(pid, &reaped, why, len);
	if (!reaped) {
		kill(pid, SIGKILL);
		/* SIGKILL ends a traced, stopped child too: this wait returns. */
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
	}
	return res;
}
#else
static enum hwbp hwbp_probe(char *why, size_t len)
{
	snprintf(why, len, "hardware breakpoints are probed on x86_64 only");
	return HWBP_UNPROBED;
}
#endif

/*
 * The breakpoint line for the probe's result bp (why: its reason) and criu
 * version ver (maj.min); fault130: CRIU_FAULT=130 is set here, which makes
 * CRIU < 4.2 skip the breakpoints too. Pure: the verdict, message in msg.
 */
static enum verdict hwbp_diagnose(enum hwbp bp, const char *why, const char *ver, int maj, int min, int fault130,
				  char *msg, size_t len)
{
	int falls_back = maj > 4 || (maj == 4 && min >= 2);

	switch (bp) {
	case HWBP_FIRES:
		snprintf(msg, len, "hardware breakpoints fire here (DR0 execute breakpoint trapped, DR6.B0 set)");
		return CK_OK;
	case HWBP_UNPROBED:
		snprintf(msg, len, "hardware breakpoints not probed (%s)%s", why,
			 falls_back ? ""
				    : "; if criu hangs in dump, run it with CRIU_FAULT=130 or install CRIU >= 4.2");
		return CK_OK;
	case HWBP_SILENT:
		break;
	}
	if (falls_back) {
		snprintf(msg, len,
			 "hardware breakpoints do not fire here (%s); criu %s detects it and falls back to "
			 "no-breakpoint mode",
			 why, ver);
		return CK_OK;
	}
	if (fault130) {
		snprintf(msg, len,
			 "hardware breakpoints do not fire here (%s); criu %s skips them only with CRIU_FAULT=130, "
			 "set in this environment: every criu dump and restore without it hangs; install CRIU >= 4.2 "
			 "(contrib/install-deps.sh builds 4.2.1)",
			 why, ver);
		return CK_WARN;
	}
	snprintf(msg, len,
		 "criu %s will hang in every dump here: this machine does not deliver hardware breakpoints (%s) "
		 "and CRIU < 4.2 waits for them forever; install CRIU >= 4.2 (contrib/install-deps.sh builds "
		 "4.2.1) or run criu with CRIU_FAULT=130",
		 ver, why);
	return CK_FAIL;
}

static void check_breakpoint(struct check *c, const char *ver, int maj, int min)
{
	const char *fault = getenv("CRIU_FAULT");
	char why[256] = "", msg[1024];
	enum hwbp bp = hwbp_probe(why, sizeof(why));
	enum verdict v = hwbp_diagnose(bp, why, ver, maj, min, fault && !strcmp(fault, "130"), msg, sizeof(msg));

	report(c, v, "breakpoint", "%s", msg);
}

static void check_criu(struct check *c, const char *want, int run_check)
{
	char criu[1024], out[4096], ver[32] = "";
	int maj = 0, min = 0, rc;
	const char *v;

	if (find_criu(want, criu, sizeof(criu))) {
		if (want)
			report(c, CK_FAIL, "criu", "%s is not an executable; pass the criu binary with --criu PATH",
			       want);
		else
			report(c, CK_FAIL, "criu",
			       "criu not found in PATH, /usr/local/sbin, /usr/sbin or /sbin; install CRIU >= 4.0 "
			       "(contrib/install-deps.sh builds 4.2.1)");
		return;
	}
	rc = capture((char *const[]){criu, "--version", NULL}, out, sizeof(out));
	v = strstr(out, "Version:");
	if (rc || !v || sscanf(v, "Version: %d.%d", &maj, &min) < 1 || sscanf(v, "Version: %31s", ver) != 1) {
		report(c, CK_FAIL, "criu", "%s --version did not report a version (exit %d); reinstall CRIU >= 4.0",
		       criu, rc);
		return;
	}
	if (maj < 4) {
		report(c, CK_FAIL, "criu",
		       "%s is CRIU %d.%d, which lacks the device hooks (PAUSE_DEVICES, CHECKPOINT_DEVICES) added "
		       "in 4.0; install CRIU >= 4.0 (contrib/install-deps.sh builds 4.2.1)",
		       criu, maj, min);
		return;
	}
	report(c, CK_OK, "criu", "%s is CRIU %d.%d (device hooks present)", criu, maj, min);
	check_breakpoint(c, ver, maj, min);
	if (!run_check)
		return;
	rc = capture((char *const[]){criu, "check", NULL}, out, sizeof(out));
	if (rc) {
		char *nl = strrchr(out, '\n');
		while (nl && nl > out && nl[1] == 0) {
			*nl = 0;
			nl = strrchr(out, '\n');
		}
		report(c, CK_FAIL, "criu-check",
		       "`%s check` failed (exit %d): %s; see CRIU's documentation for the "
		       "kernel feature it names",
		       criu, rc, nl ? nl + 1 : out);
	} else {
		report(c, CK_OK, "criu-check", "`%s check` passes", criu);
	}
}

static void check_plugin(struct check *c, const char *libdir)
{
	char p[4096];
	struct stat st;

	snprintf(p, sizeof(p), "%s/cuda_plugin.so", libdir);
	if (access(p, F_OK) == 0)
		report(c, CK_FAIL, "plugin",
		       "%s is installed beside cuinterpose: CRIU runs only the first plugin that handles a device "
		       "hook and cuinterpose refuses to load with it; move it out of %s (cuinterpose replaces it)",
		       p, libdir);
	snprintf(p, sizeof(p), "%s/cuinterpose_plugin.so", libdir);
	if (stat(p, &st)) {
		report(c, CK_FAIL, "plugin",
		       "%s: %s; run `make install` (plugin directory set by configure --with-criu-plugindir) or "
		       "pass criu the directory holding it with -L/--libdir and this command --libdir",
		       p, strerror(errno));
		return;
	}
	if (!S_ISREG(st.st_mode) || access(p, R_OK)) {
		report(c, CK_FAIL, "plugin", "%s is not a readable file; reinstall it with `make install`", p);
		return;
	}
	report(c, CK_OK, "plugin", "%s (%lld bytes)", p, (long long)st.st_size);
}

typedef int (*drv_version_fn)(int *);

static void check_driver(struct check *c)
{
	const char *lib = getenv("CUINTERPOSE_LIBCUDA");
	drv_version_fn ver;
	void *h;
	int v = 0;

	if (!lib || !*lib)
		lib = "libcuda.so.1";
	h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		report(c, CK_FAIL, "driver",
		       "cannot load %s (%s): install the NVIDIA driver, or point CUINTERPOSE_LIBCUDA at the "
		       "driver library (criu loads the same one); without a GPU, run cuinterpose and criu under "
		       "the fake driver: %s cuinterpose check",
		       lib, dlerror(), CUIP_FAKECUDA_RUN);
		return;
	}
	ver = (drv_version_fn)dlsym(h, "cuDriverGetVersion");
	if (!ver || ver(&v) || v <= 0) {
		report(c, CK_FAIL, "driver", "%s does not answer cuDriverGetVersion; is it a CUDA driver library?",
		       lib);
		goto out;
	}
	if (!dlsym(h, "cuCheckpointProcessLock")) {
		report(c, CK_FAIL, "driver",
		       "%s (CUDA %d.%d) lacks the checkpoint API (cuCheckpointProcessLock): upgrade the NVIDIA "
		       "driver to r570 or newer",
		       lib, v / 1000, v % 1000 / 10);
		goto out;
	}
	report(c, CK_OK, "driver", "%s: CUDA %d.%d, checkpoint API present%s", lib, v / 1000, v % 1000 / 10,
	       v >= 12080 ? "" : " (GPU remap needs r580 / CUDA 12.8)");
out:
	dlclose(h);
}

static void check_interposer(struct check *c)
{
	char lib[4096];

	if (cli_find_lib(lib, sizeof(lib)))
		report(c, CK_WARN, "interposer",
		       "libcuinterpose.so not found (%s): `cuinterpose run` cannot start jobs; run `make install` "
		       "or set CUINTERPOSE_LIB",
		       lib);
	else
		report(c, CK_OK, "interposer", "`cuinterpose run` preloads %s", lib);
}

static void check_sockdir(struct check *c)
{
	const char *env = getenv("CUINTERPOSE_SOCKET_DIR");
	const char *d = env && *env ? env : "/run/cuinterpose";
	char parent[4096], *slash;
	struct stat st;

	if (lstat(d, &st)) {
		if (errno != ENOENT) {
			report(c, CK_FAIL, "sockets", "%s: %s", d, strerror(errno));
			return;
		}
		snprintf(parent, sizeof(parent), "%s", d);
		slash = strrchr(parent, '/');
		if (slash)
			*(slash == parent ? slash + 1 : slash) = 0;
		if (slash && access(parent, W_OK | X_OK))
			report(c, CK_WARN, "sockets",
			       "%s does not exist and %s is not writable: jobs fall back to /tmp/cuinterpose-<uid>; "
			       "create it with `install -d -m 1777 %s`",
			       d, parent, d);
		else
			report(c, CK_OK, "sockets",
			       "%s does not exist yet; the first CUDA process creates it (mode 1777)", d);
		return;
	}
	if (!S_ISDIR(st.st_mode)) {
		report(c, CK_FAIL, "sockets",
		       "%s is not a directory: no job can create its control socket there; remove it or set "
		       "CUINTERPOSE_SOCKET_DIR",
		       d);
		return;
	}
	if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
		report(c, CK_FAIL, "sockets",
		       "%s is world-writable without the sticky bit (mode %04o): any user can remove other jobs' "
		       "control sockets; `chmod 1777 %s`",
		       d, (unsigned)(st.st_mode & 07777), d);
		return;
	}
	if (access(d, W_OK | X_OK)) {
		report(c, CK_WARN, "sockets",
		       "%s (mode %04o, uid %u) is not writable by uid %u: its jobs fall back to "
		       "/tmp/cuinterpose-%u; `chmod 1777 %s` to share it",
		       d, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)getuid(), (unsigned)getuid(),
		       d);
		return;
	}
	report(c, CK_OK, "sockets", "%s (mode %04o)", d, (unsigned)(st.st_mode & 07777));
}

/* What a process has mapped: 1 the interposer, 2 a CUDA driver library. */
static int maps_of(const char *pid)
{
	char p[300], line[1024];
	int found = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%s/maps", pid);
	f = fopen(p, "re");
	while (f && fgets(line, sizeof(line), f)) {
		if (strstr(line, "/libcuinterpose.so"))
			found |= 1;
		if (strstr(line, "/libcuda.so"))
			found |= 2;
	}
	if (f)
		fclose(f);
	return found;
}

/* The state letter of /proc/PID/stat ('T' stopped, 't' traced...). */
static char state_of(pid_t pid)
{
	struct cuip_proc_stat st;

	return cuip_proc_stat_read(pid, &st) ? '?' : st.state;
}

static void comm_of(const char *pid, char *buf, size_t len)
{
	char p[300];
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%s/comm", pid);
	buf[0] = 0;
	f = fopen(p, "re");
	if (f) {
		if (fgets(buf, (int)len, f))
			buf[strcspn(buf, "\n")] = 0;
		fclose(f);
	}
}

#define ASK_TIMEOUT_MS 5000

/* Handshake + INSPECT one process; its phase in *phase. */
static int ask(pid_t pid, const char *path, int *phase, char *failure, size_t flen, char *err, size_t errlen)
{
	Cuip__Response *resp;
	int s, ret;

	s = cli_connect_proc(pid, path);
	if (s < 0) {
		snprintf(err, errlen, "cannot connect: %s", strerror(-s));
		return s;
	}
	/* A stopped or hung process must not hang the diagnosis. */
	cuip_client_timeout(s, ASK_TIMEOUT_MS);
	ret = cli_ask_state(s, "cli-check", ASK_TIMEOUT_MS, &resp, err, errlen);
	if (ret)
		return ret;
	*phase = resp->state->phase;
	snprintf(failure, flen, "%s", resp->state->failure ? resp->state->failure : "");
	cuip_client_free(resp);
	return 0;
}

static void check_one(struct check *c, const char *spid, int asked)
{
	char name[64], comm[32], path[512], err[256] = "", failure[512] = "", st;
	pid_t pid = atoi(spid);
	int phase = 0, maps = maps_of(spid);

	snprintf(name, sizeof(name), "pid %d", (int)pid);
	if (!(maps & 1)) {
		if (asked)
			report(c, CK_FAIL, name,
			       kill(pid, 0) && errno == ESRCH
				       ? "no such process"
				       : "does not run the interposer: start the job with `cuinterpose run -- CMD` "
					 "(every "
					 "CUDA process that shares memory needs it from its first CUDA call)");
		return;
	}
	comm_of(spid, comm, sizeof(comm));
	{
		char shm[512];
		int nshm = cuip_proc_unlinked_shm(pid, shm, sizeof(shm));

		if (nshm > 0)
			report(c, CK_WARN, name,
			       "%s maps or holds %d unlinked /dev/shm file(s) (%s, e.g. Python multiprocessing "
			       "semaphores): give criu dump --link-remap (README \"PyTorch and torch.multiprocessing "
			       "jobs\")",
			       comm, nshm, shm);
		if (nshm > 0 && (nshm = cuip_proc_stale_link_remaps(pid, shm, sizeof(shm))) > 0)
			report(c, CK_WARN, name,
			       "%d link_remap file(s) in its /dev/shm (%s), left by an earlier criu dump --link-remap "
			       "whose images were not restored here: criu dump --link-remap fails \"File exists\" when "
			       "its new link takes one of those names; remove them once no restore needs them",
			       nshm, shm);
	}
	if (cli_find_socket(pid, path, sizeof(path))) {
		int serr = 0, s = cuip_proc_start_state(pid, &serr); /* protocol/startmark.h */

		if (s == 1 /* STARTING */)
			report(c, CK_OK, name, "%s is starting CUDA (inside its first cuInit)", comm);
		else if (s == 2 || s == 4 || (s <= 0 && (maps & 2)))
			report(c, CK_WARN, name,
			       "%s uses CUDA and runs the interposer but has no control socket (%s; see the sockets "
			       "line); a dump of its tree is refused",
			       comm,
			       s == 4	? strerror(serr)
			       : s == 2 ? "it was closed, or the control thread is gone"
					: "its CUDA did not start through the interposer");
		else
			report(c, CK_OK, name,
			       "%s runs the interposer and has not used CUDA yet (no participant: an ordinary process "
			       "to a checkpoint)",
			       comm);
		return;
	}
	if (ask(pid, path, &phase, failure, sizeof(failure), err, sizeof(err))) {
		st = state_of(pid);
		report(c, CK_FAIL, name,
		       "%s: control socket %s does not answer (%s)%s: a dump of its tree would fail; %s", comm, path,
		       err, st == 'T' || st == 't' ? ", the process is stopped" : "",
		       st == 'T' || st == 't' ? "resume it (SIGCONT, detach the debugger or the dead criu)"
					      : "the interposer's control thread is stuck: restart the job");
		return;
	}
	if (phase == CUIP__PHASE__PHASE_FAILED)
		report(c, CK_FAIL, name, "%s: interposer FAILED: %s; restart the job", comm,
		       failure[0] ? failure : "no reason recorded");
	else if (phase != CUIP__PHASE__PHASE_ACTIVE)
		report(c, CK_WARN, name,
		       "%s: phase %s (a checkpoint is in progress, or one stopped half-way: its CUDA calls wait "
		       "at the gate)",
		       comm, cuip_phase_name(phase));
	else
		report(c, CK_OK, name, "%s: socket %s answers, phase ACTIVE", comm, path);
}

static void check_processes(struct check *c, char **pids, int npids)
{
	struct dirent *de;
	int found = 0;
	DIR *d;

	for (int i = 0; i < npids; i++)
		check_one(c, pids[i], 1);
	if (npids)
		return;
	d = opendir("/proc");
	while (d && (de = readdir(d))) {
		if (!isdigit((unsigned char)de->d_name[0]) || atoi(de->d_name) == getpid() ||
		    !(maps_of(de->d_name) & 1))
			continue;
		found++;
		check_one(c, de->d_name, 0);
	}
	if (d)
		closedir(d);
	if (!found)
		report(c, CK_OK, "processes", "no running process has the interposer loaded");
}

static void usage(FILE *f)
{
	fprintf(f, "usage: cuinterpose check [--json] [--libdir DIR] [--criu PATH] [--criu-check]\n"
		   "                         [--pid PID]... [--no-processes]\n"
		   "  --libdir DIR   CRIU plugin directory to check (criu -L; default /usr/lib/criu)\n"
		   "  --criu PATH    criu binary (default: PATH, then /usr/local/sbin, /usr/sbin, /sbin)\n"
		   "  --criu-check   also run `criu check`\n"
		   "  --pid PID      diagnose this process only (repeatable; default: every process\n"
		   "                 with the interposer loaded)\n"
		   "  --no-processes skip the running processes\n"
		   "  exit 0 when nothing FAILs, 1 otherwise, 2 usage\n");
}

int cli_check(int argc, char **argv)
{
	const char *libdir = "/usr/lib/criu", *criu = NULL;
	struct check c = {0};
	int run_check = 0, procs = 1, npids = 0;
	char **pids = calloc((size_t)argc, sizeof(*pids));
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},	{"libdir", required_argument, NULL, 'l'},
		{"criu", required_argument, NULL, 'c'}, {"criu-check", no_argument, NULL, 'C'},
		{"pid", required_argument, NULL, 'p'},	{"no-processes", no_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},	{NULL, 0, NULL, 0}};
	const char *arg;

	if (!pids)
		return 1;
	cli_opt_start();

	for (int o; (o = cli_opt_next(argc, argv, opts, &arg)) != -1;) {
		switch (o) {
		case 'j':
			c.json = 1;
			break;
		case 'l':
			libdir = optarg;
			break;
		case 'c':
			criu = optarg;
			break;
		case 'C':
			run_check = 1;
			break;
		case 'p':
			if (atoi(optarg) > 0 && strspn(optarg, "0123456789") == strlen(optarg)) {
				pids[npids++] = optarg;
				break;
			}
			/* fall through */
		case ':':
			if (o == 'p' || optopt == 'p')
				fprintf(stderr, "cuinterpose check: --pid needs a PID (a process id > 0), got %s%s%s\n",
					o == 'p' ? "'" : "nothing", o == 'p' ? optarg : "", o == 'p' ? "'" : "");
			else
				fprintf(stderr, "cuinterpose check: --%s needs a %s\n",
					optopt == 'l' ? "libdir" : "criu",
					optopt == 'l' ? "directory" : "path to the criu binary");
			usage(stderr);
			free(pids);
			return 2;
		case 'n':
			procs = 0;
			break;
		case 'h':
			usage(stdout);
			free(pids);
			return 0;
		default:
			fprintf(stderr, "cuinterpose check: %s '%s'\n",
				o == 1 && arg[0] != '-' ? "unexpected argument" : "unknown option", arg);
			usage(stderr);
			free(pids);
			return 2;
		}
	}
	if (cli_opt_dashdash()) {
		fprintf(stderr, "cuinterpose check: unknown option '--'\n");
		usage(stderr);
		free(pids);
		return 2;
	}
	if (c.json)
		printf("{\"checks\":[");
	check_criu(&c, criu, run_check);
	check_plugin(&c, libdir);
	check_driver(&c);
	check_interposer(&c);
	check_sockdir(&c);
	if (procs || npids) /* an explicit --pid wins over --no-processes */
		check_processes(&c, pids, npids);
	free(pids);
	if (c.json)
		printf("],\"fails\":%d,\"warnings\":%d,\"ok\":%s}\n", c.fails, c.warns, c.fails ? "false" : "true");
	else
		printf("%s: %d failure(s), %d warning(s)\n", c.fails ? "FAIL" : "OK", c.fails, c.warns);
	return c.fails ? 1 : 0;
}
