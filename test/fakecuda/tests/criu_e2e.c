/*
 * End-to-end with real CRIU on the fake driver: a process using only private
 * fake device memory cannot be dumped while its device connection is open
 * (and keeps running); after native lock + checkpoint it can; `criu restore`
 * brings it back, native restore + unlock put the bytes back at the same
 * device addresses, and the workload verifies them and launches a kernel.
 *
 * Needs root and $CRIU; exits 77 (skip) otherwise, and under AddressSanitizer
 * (CRIU would have to walk its terabytes of shadow mappings).  Runs as a
 * subreaper: this machine's PID 1 does not reap (docs/driver-facts.md, "CRIU").
 */
#include <cuda.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "../../tmpname.h"

static char dir[64], sock[128];

static int skip(const char *why)
{
	printf("SKIP: %s\n", why);
	return 77;
}

static const char *ename(CUresult r)
{
	const char *n = "?";

	cuGetErrorName(r, &n);
	return n;
}

#define FAIL(...)                                      \
	do {                                           \
		fprintf(stderr, "FAIL: " __VA_ARGS__); \
		fputc('\n', stderr);                   \
		goto out;                              \
	} while (0)
#define CU(x)                                            \
	do {                                             \
		CUresult r_ = (x);                       \
		if (r_ != CUDA_SUCCESS)                  \
			FAIL("%s -> %s", #x, ename(r_)); \
	} while (0)

static int exists(const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static int wait_file(const char *name, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (exists(name))
			return 0;
		usleep(10000);
	}
	return -1;
}

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	printf("+ %s\n", cmd);
	fflush(stdout);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void show(const char *name)
{
	run("tail -n 15 %s/%s", dir, name);
}

static pid_t reap(pid_t pid, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(10000);
	}
	return -1;
}

int main(void)
{
	const char *criu = getenv("CRIU"), *devd = getenv("FAKECUDA_DEVD"), *wl = getenv("FAKECUDA_WORKLOAD");
	CUprocessState st;
	int tid, tid2, rc = 1, status;
	char path[256], line[256];
	pid_t pid = -1, devd_pid = 0;
	FILE *f;

#if defined(__SANITIZE_ADDRESS__)
	return skip("built with AddressSanitizer");
#endif
	if (geteuid() != 0)
		return skip("criu needs root");
	if (!criu || !*criu || access(criu, X_OK) < 0)
		return skip("no criu binary (configure found none)");
	if (!devd || !wl)
		return skip("run through make check");
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	test_tmpname(dir, sizeof(dir), "fakecuda-criu-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	/* An empty plugin directory: whatever is installed in CRIU's default
	 * one (cuinterpose's own plugin, say) must not drive this test. */
	snprintf(path, sizeof(path), "%s/noplugins", dir);
	if (mkdir(path, 0700))
		FAIL("mkdir %s", path);
	snprintf(sock, sizeof(sock), "%s/devd.sock", dir);
	setenv("FAKECUDA_SOCKET", sock, 1);
	if (run("%s --socket %s --daemon", devd, sock))
		FAIL("fakecuda-devd did not start");
	snprintf(path, sizeof(path), "%s.pid", sock);
	f = fopen(path, "r");
	if (f) {
		if (fgets(line, sizeof(line), f))
			devd_pid = atoi(line);
		fclose(f);
	}

	pid = fork();
	if (pid == 0) {
		char log[256];

		setsid();
		snprintf(log, sizeof(log), "%s/workload.log", dir);
		if (!freopen("/dev/null", "r", stdin) || !freopen(log, "w", stdout) || !freopen(log, "a", stderr))
			_exit(126);
		execl(wl, wl, dir, (char *)NULL);
		_exit(127);
	}
	if (wait_file("ready", 20000))
		FAIL("workload did not get ready");
	CU(cuInit(0));
	CU(cuCheckpointProcessGetRestoreThreadId(pid, &tid));

	/* 1. the open device connection makes the process undumpable; it keeps running */
	if (run("%s dump -t %d -D %s -L %s/noplugins -o dump-refused.log -v4 --leave-running >/dev/null 2>&1", criu,
		pid, dir, dir) == 0)
		FAIL("criu dump succeeded with the device connection open");
	run("grep -m2 'Error' %s/dump-refused.log", dir);
	if (waitpid(pid, &status, WNOHANG) != 0)
		FAIL("the workload died after the refused dump");
	CU(cuCheckpointProcessGetState(pid, &st));
	if (st != CU_PROCESS_STATE_RUNNING)
		FAIL("state %d after the refused dump", st);

	/* 2. native lock + checkpoint releases the device: now CRIU can dump it */
	CU(cuCheckpointProcessLock(pid, NULL));
	CU(cuCheckpointProcessCheckpoint(pid, NULL));
	if (run("%s dump -t %d -D %s -L %s/noplugins -o dump.log -v4", criu, pid, dir, dir)) {
		show("dump.log");
		FAIL("criu dump of the checkpointed process failed");
	}
	if (reap(pid, 5000) < 0)
		FAIL("the dumped workload did not exit");

	/* 3. criu restore, then native restore + unlock */
	if (run("%s restore -D %s -L %s/noplugins -o restore.log -v4 --restore-detached --pidfile %s/restored.pid",
		criu, dir, dir, dir)) {
		show("restore.log");
		FAIL("criu restore failed");
	}
	CU(cuCheckpointProcessGetState(pid, &st));
	if (st != CU_PROCESS_STATE_CHECKPOINTED)
		FAIL("state %d after criu restore", st);
	CU(cuCheckpointProcessGetRestoreThreadId(pid, &tid2));
	if (tid2 != tid)
		FAIL("restore thread %d became %d", tid, tid2);
	CU(cuCheckpointProcessRestore(pid, NULL));
	CU(cuCheckpointProcessUnlock(pid, NULL));
	CU(cuCheckpointProcessGetState(pid, &st));
	if (st != CU_PROCESS_STATE_RUNNING)
		FAIL("state %d after unlock", st);

	/* 4. the workload checks every byte at the same addresses and runs a kernel */
	snprintf(path, sizeof(path), "%s/go", dir);
	fclose(fopen(path, "w"));
	status = reap(pid, 20000);
	pid = -1;
	snprintf(path, sizeof(path), "%s/result", dir);
	f = fopen(path, "r");
	if (!f || !fgets(line, sizeof(line), f))
		FAIL("no result from the restored workload (exit %d)", status);
	fclose(f);
	printf("workload: %s", line);
	if (strncmp(line, "ok", 2) || status != 0)
		FAIL("restored workload: %s", line);
	{
		char before[128] = "";

		snprintf(path, sizeof(path), "%s/addrs", dir);
		f = fopen(path, "r");
		if (!f || !fgets(before, sizeof(before), f))
			FAIL("no addresses from the workload");
		fclose(f);
		if (strcmp(before, line + 3))
			FAIL("device addresses moved: %s -> %s", before, line + 3);
	}
	rc = 0;
	printf("PASS: refused dump, native checkpoint, criu dump/restore, native restore, bytes and kernel verified\n");
out:
	if (pid > 0) {
		kill(pid, SIGKILL);
		reap(pid, 2000);
	}
	if (devd_pid > 0) {
		kill(devd_pid, SIGTERM);
		reap(devd_pid, 2000);
	}
	if (rc == 0)
		run("rm -rf %s", dir);
	else
		printf("logs kept in %s\n", dir);
	return rc;
}
