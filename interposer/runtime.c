/*
 * runtime.c - the per-process runtime: identity, start, fork, logging.
 *
 * Nothing runs until the application's first successful cuInit (or the
 * first tracked call that finds the driver initialized): then the process
 * picks a random identity, records its devices and starts the control
 * server. A process that never uses CUDA leaves no socket and no thread.
 *
 * Fork: the child starts with fresh, empty state (its own identity and
 * socket once it uses CUDA); inherited records, cached exports and sockets
 * are dropped, never used. pthread_atfork takes the state and export-cache
 * locks around fork so that the child's copies are consistent to free.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cuip.h"

struct cuip_self self;
int cuip_log_level = 1;
static atomic_int started;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

void cuip_log(int level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	if (level > cuip_log_level)
		return;
	n = snprintf(buf, sizeof(buf), "cuinterpose[%d]: ", (int)getpid());
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	(void)!write(STDERR_FILENO, buf, (size_t)n);
}

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

void cuip_start(void)
{
	if (atomic_load(&started))
		return;
	pthread_mutex_lock(&start_mu);
	if (!atomic_load(&started)) {
		self.pid = getpid();
		do
			cuip_random(&self.id, sizeof(self.id));
		while (!self.id);
		devices_scan();
		if (cuip_ctl_start())
			pr_err("control socket unavailable: this process cannot be checkpointed by cuinterpose");
		atomic_store(&started, 1);
		pr_info("started: identity %016llx, socket %s", (unsigned long long)self.id, self.sock);
	}
	pthread_mutex_unlock(&start_mu);
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&start_mu);
	pthread_mutex_lock(&cuip_state_lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&cuip_state_lock);
	pthread_mutex_unlock(&start_mu);
}

static void fork_child(void)
{
	pthread_mutex_unlock(&cuip_state_lock);
	cuip_ctl_reset();
	cuip_xc_reset();
	cuip_vmm_reset();
	cuip_gate_reset();
	cuip_drain_reset();
	cuip_ctx_reset();
	memset(&self, 0, sizeof(self));
	atomic_store(&started, 0);
	pthread_mutex_init(&start_mu, NULL);
}

__attribute__((constructor)) static void cuip_init(void)
{
	const char *l = getenv("CUINTERPOSE_LOG");

	if (l && *l)
		cuip_log_level = atoi(l);
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((destructor)) static void cuip_fini(void)
{
	if (atomic_load(&started) && self.pid == getpid())
		cuip_ctl_stop();
}
