/*
 * runtime.c - the per-process runtime: identity, devices, start, fork.
 * (Its threads and workers: thread.c.)
 *
 * Nothing runs until the application's first successful cuInit (or the
 * first tracked call that finds the driver initialized): then the process
 * picks a random identity, records its devices and runs the start hooks
 * (CUIP_START_HOOK: lifecycle.c starts the control server). A process that
 * never uses CUDA leaves no socket and no thread.
 *
 * Start gate and marker (startmark.h): the first start passes the gate (a
 * moment's flock(LOCK_EX) on our own library file, waiting while a
 * checkpoint holds it shared) and marks STARTING; cuInit's start then calls
 * the driver (cuip_start_begin/end), the start hooks run and the marker
 * says STARTED (or FAILED when cuInit failed, NOSOCKET when a start hook
 * did). start_mu makes one thread do it; the others wait for it.
 *
 * Fork: the child starts with fresh, empty state (its own identity and
 * socket once it uses CUDA). pthread_atfork takes start_mu around fork and
 * runs the fork hooks the modules register (CUIP_FORK_HOOK): record.c takes
 * cuip_state_lock around it, so that the child's copies are consistent to
 * free; in the child each module drops what it inherited, never uses it.
 *
 * Base layer: calls only the log, the driver table, the gate (its fork
 * reset), the importer helpers and client.c's identity; never a module
 * above (hooks instead).
 * Callers: the resource modules (cuip_start, identity, devices), carry.c
 * (rescan at LOAD, after a restore).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "importers.h"
#include "procstat.h"
#include "runtime.h"
#include "settings.h"
#include "startmark.h"

struct cuip_self self;
static atomic_int started;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

void cuip_random(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			/* No getrandom: mix time and addresses (tokens only
			 * guard against mistakes between cooperating peers). */
			uint64_t x = (uint64_t)clock() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)p;
			for (; len; len--, p++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				*p = (uint8_t)x;
			}
			return;
		}
		p += n;
		len -= (size_t)n;
	}
}

const uint8_t *cuip_dev_uuid(int ordinal)
{
	for (int i = 0; i < self.ndev; i++)
		if (self.dev[i].ordinal == ordinal)
			return self.dev[i].uuid;
	return NULL;
}

int cuip_dev_by_uuid(const uint8_t *uuid)
{
	for (int i = 0; i < self.ndev; i++)
		if (!memcmp(self.dev[i].uuid, uuid, 16))
			return self.dev[i].ordinal;
	return -1;
}

static void devices_scan(void)
{
	int n = 0;

	self.ndev = 0;
	if (!real.cuDeviceGetCount || real.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return;
	for (int i = 0; i < n && self.ndev < (int)(sizeof(self.dev) / sizeof(self.dev[0])); i++) {
		CUdevice d;
		CUuuid u;
		if (real.cuDeviceGet(&d, i) != CUDA_SUCCESS || real.cuDeviceGetUuid_v2(&u, d) != CUDA_SUCCESS)
			continue;
		self.dev[self.ndev].ordinal = i;
		memcpy(self.dev[self.ndev].uuid, u.bytes, 16);
		if (!real.cuDeviceGetName ||
		    real.cuDeviceGetName(self.dev[self.ndev].name, (int)sizeof(self.dev[0].name), d) != CUDA_SUCCESS)
			self.dev[self.ndev].name[0] = 0;
		self.dev[self.ndev].name[sizeof(self.dev[0].name) - 1] = 0;
		self.ndev++;
	}
}

void cuip_devices_rescan(void)
{
	devices_scan();
}

bool cuip_started(void)
{
	return atomic_load(&started);
}

/* ---- start marker and gate (startmark.h) --------------------------------- */

static struct cuip_mark *mark;

static void mark_set(uint32_t state, int err)
{
	if (!mark) {
		int fd = memfd_create(CUIP_MARK_NAME, MFD_CLOEXEC);
		void *p;

		if (fd < 0)
			return;
		p = ftruncate(fd, 4096) ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			return;
		madvise(p, 4096, MADV_DONTFORK);
		mark = p;
		mark->magic = CUIP_MARK_MAGIC;
	}
	mark->pid = (int32_t)getpid();
	mark->err = err;
	__atomic_store_n(&mark->state, state, __ATOMIC_RELEASE);
}

/*
 * Our own library file, as mapped: the path of the mapping holding this
 * function, opened and checked against the mapping's inode (a file replaced
 * on disk since it was loaded is not the gate the plugin locks).
 */
static int gate_open(char *path, size_t len)
{
	unsigned long lo, hi, ino, here = (unsigned long)(uintptr_t)&gate_open;
	char line[4096 + 128];
	struct stat st;
	FILE *f = fopen("/proc/self/maps", "re");
	int fd = -1;

	path[0] = 0;
	while (f && fgets(line, sizeof(line), f)) {
		int n = 0;

		if (sscanf(line, "%lx-%lx %*s %*x %*x:%*x %lu %n", &lo, &hi, &ino, &n) < 3 || here < lo || here >= hi)
			continue;
		line[strcspn(line, "\n")] = 0;
		if (n && line[n] == '/')
			snprintf(path, len, "%s", line + n);
		break;
	}
	if (f)
		fclose(f);
	if (!path[0])
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && (fstat(fd, &st) || st.st_ino != ino)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Wait while a checkpoint holds the gate, then mark STARTING. start_mu held. */
static void gate_pass(void)
{
	static bool warned;
	char path[4096];
	int fd = gate_open(path, sizeof(path));

	if (fd < 0) {
		if (!warned)
			pr_err("cannot open the interposer's own library file%s%s: CUDA starts without waiting for a "
			       "checkpoint in progress",
			       path[0] ? " " : "", path);
		warned = true;
	} else if (flock(fd, LOCK_EX | LOCK_NB)) {
		pr_info("starting CUDA waits: a checkpoint is in progress (start gate %s)", path);
		while (flock(fd, LOCK_EX) && errno == EINTR)
			;
		pr_info("start gate passed: the checkpoint ended");
	}
	mark_set(CUIP_MARK_STARTING, 0);
	if (fd >= 0)
		close(fd);
}

/*
 * What a FETCH tells the creator of us, for a creator that cannot see our
 * pid namespace (client.h): our pid, our pid namespace's inode and our start
 * time. A process that entered another mount namespace (nsenter --mount into
 * a container) sees a /proc that is not its pid namespace's: then the
 * namespace comes from a pidfd (PIDFD_GET_PID_NAMESPACE, Linux 6.11) and
 * the start time stays unknown.
 */
#ifndef PIDFD_GET_PID_NAMESPACE
#define PIDFD_GET_PID_NAMESPACE _IO(0xFF, 5)
#endif
static void announce_self(void)
{
	struct stat ns;
	int ours = cuip_proc_is_ours();

	cuip_client_pid = self.pid;
	cuip_client_pid_ns = 0;
	cuip_client_start = 0;
	if (ours && !stat("/proc/self/ns/pid", &ns)) {
		cuip_client_pid_ns = (uint64_t)ns.st_ino;
	} else {
		int pfd = (int)syscall(SYS_pidfd_open, self.pid, 0), nfd;

		nfd = pfd >= 0 ? ioctl(pfd, PIDFD_GET_PID_NAMESPACE, 0) : -1;
		if (nfd >= 0 && !fstat(nfd, &ns))
			cuip_client_pid_ns = (uint64_t)ns.st_ino;
		if (nfd >= 0)
			close(nfd);
		if (pfd >= 0)
			close(pfd);
	}
	if (ours && cuip_proc_stat_start(self.pid, &cuip_client_start, NULL))
		cuip_client_start = 0;
}

/* The hooks other modules register (runtime.h), bounded by the linker. */
extern const cuip_start_hook_fn __start_cuip_start_hooks[] __attribute__((weak, visibility("hidden")));
extern const cuip_start_hook_fn __stop_cuip_start_hooks[] __attribute__((weak, visibility("hidden")));
extern const struct cuip_fork_hook __start_cuip_fork_hooks[] __attribute__((weak, visibility("hidden")));
extern const struct cuip_fork_hook __stop_cuip_fork_hooks[] __attribute__((weak, visibility("hidden")));

/* Start the runtime; start_mu held, the gate passed. */
static void start_locked(void)
{
	int ret;

	self.pid = getpid();
	do
		cuip_random(&self.id, sizeof(self.id));
	while (!self.id);
	cuip_client_identity = self.id;
	announce_self();
	devices_scan();
	cuip_gate_prepare();
	ret = 0;
	for (const cuip_start_hook_fn *h = __start_cuip_start_hooks; h < __stop_cuip_start_hooks; h++) {
		int r = (*h)();
		if (r && !ret)
			ret = r;
	}
	if (ret)
		pr_err("control socket unavailable: this process cannot be checkpointed by cuinterpose");
	atomic_store(&started, 1);
	mark_set(ret ? CUIP_MARK_NOSOCKET : CUIP_MARK_STARTED, ret ? -ret : 0);
	pr_info("started: identity %016llx, socket %s", (unsigned long long)self.id, self.sock);
}

void cuip_start(void)
{
	if (atomic_load(&started))
		return;
	pthread_mutex_lock(&start_mu);
	if (!atomic_load(&started)) {
		gate_pass();
		start_locked();
	}
	pthread_mutex_unlock(&start_mu);
}

bool cuip_start_begin(void)
{
	if (atomic_load(&started))
		return false;
	pthread_mutex_lock(&start_mu);
	if (atomic_load(&started)) {
		pthread_mutex_unlock(&start_mu);
		return false;
	}
	gate_pass();
	return true;
}

void cuip_start_end(bool ok)
{
	if (ok)
		start_locked();
	else
		mark_set(CUIP_MARK_FAILED, 0);
	pthread_mutex_unlock(&start_mu);
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&start_mu);
	for (const struct cuip_fork_hook *h = __start_cuip_fork_hooks; h < __stop_cuip_fork_hooks; h++)
		if (h->prepare)
			h->prepare();
}

static void fork_parent(void)
{
	for (const struct cuip_fork_hook *h = __stop_cuip_fork_hooks; h-- > __start_cuip_fork_hooks;)
		if (h->parent)
			h->parent();
	pthread_mutex_unlock(&start_mu);
}

static void fork_child(void)
{
	for (const struct cuip_fork_hook *h = __start_cuip_fork_hooks; h < __stop_cuip_fork_hooks; h++)
		if (h->child)
			h->child();
	cuip_gate_reset(); /* gate.c is below the runtime */
	memset(&self, 0, sizeof(self));
	cuip_client_identity = 0;
	cuip_client_pid = 0;
	if (mark) /* MADV_DONTFORK: not ours; never write the parent's page */
		munmap(mark, 4096);
	mark = NULL;
	atomic_store(&started, 0);
	pthread_mutex_init(&start_mu, NULL);
}

bool cuip_private_native;
bool cuip_stacks_lower = true;

/* A two-way choice read from the environment at load: true for `other`;
 * unset, empty or `dflt`: false. Any other value makes cuInit fail
 * (cuip_settings_refused), so what it reads as does not matter. */
static bool env_choice(const char *name, const char *dflt, const char *other)
{
	const char *v = getenv(name);

	return v && *v && strcmp(v, dflt) && !strcmp(v, other);
}

/* One policy for a bad value (protocol/settings.h): the job's settings are
 * checked once, at the first cuInit, before anything changes; each bad one
 * is said on stderr with what it accepts, and every cuInit fails. */
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static bool settings_bad;

static void settings_check(void)
{
	char err[512];

	for (size_t i = 0; i < cuip_settings_count; i++) {
		const struct cuip_setting *s = &cuip_settings[i];

		if (!(s->readers & CUIP_READER_JOB) || !cuip_setting_check(s, getenv(s->name), err, sizeof(err)))
			continue;
		fprintf(stderr, "cuinterpose: pid %d: %s; cuInit fails (nothing has changed)\n", (int)getpid(), err);
		settings_bad = true;
	}
}

bool cuip_settings_refused(void)
{
	pthread_once(&settings_once, settings_check);
	return settings_bad;
}

__attribute__((constructor)) static void cuip_init(void)
{
	cuip_private_native = env_choice("CUINTERPOSE_PRIVATE", "carrier", "native");
	cuip_stacks_lower = !env_choice("CUINTERPOSE_TEST_STACKS", "lower", "keep");
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}
