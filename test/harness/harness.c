/*
 * harness.c - the test suites' one harness (see harness.h).  The devd of a
 * test case is started by an unchecked fixture in Check's parent process
 * and stopped after the case.  Test code, single-threaded: no locks.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "wl.h"
#include "../tmpname.h"

static char dir[64];
static char sock[128];
static CUdevice cur_dev;

const char *h_name(CUresult r)
{
	const char *n = NULL;

	cuGetErrorName(r, &n);
	return n ? n : "?";
}

int h_run(Suite *first, ...)
{
	SRunner *sr = srunner_create(first);
	Suite *s;
	va_list ap;
	int failed;

	va_start(ap, first);
	while ((s = va_arg(ap, Suite *)))
		srunner_add_suite(sr, s);
	va_end(ap);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

int64_t h_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the fake device service -------------------------------------------- */

void h_devd_start(const char *env)
{
	const char *devd = getenv("FAKECUDA_DEVD");
	char pidpath[160];
	pid_t pid;
	int st;

	ck_assert_msg(devd != NULL, "FAKECUDA_DEVD not set (run through make check)");
	test_tmpname(dir, sizeof(dir), "fakecuda-test-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/devd.sock", dir);
	setenv("FAKECUDA_SOCKET", sock, 1);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char *copy = env ? strdup(env) : NULL, *save = NULL, *kv;

		for (kv = copy ? strtok_r(copy, " ", &save) : NULL; kv; kv = strtok_r(NULL, " ", &save))
			putenv(kv);
		execl(devd, devd, "--socket", sock, "--daemon", (char *)NULL);
		_exit(127);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fakecuda-devd failed to start");
	snprintf(pidpath, sizeof(pidpath), "%s.pid", sock);
	ck_assert_int_eq(access(pidpath, F_OK), 0);
}

void h_devd_stop(void)
{
	char pidpath[160];
	pid_t pid = h_devd_pid();

	if (pid > 0 && kill(pid, SIGTERM) == 0)
		for (int i = 0; i < 400 && kill(pid, 0) == 0; i++) {
			waitpid(pid, NULL, WNOHANG); /* ours when we are its subreaper */
			usleep(5000);
		}
	unlink(sock);
	snprintf(pidpath, sizeof(pidpath), "%s.lock", sock);
	unlink(pidpath);
	rmdir(dir);
}

void h_devd1(void)
{
	h_devd_start("FAKECUDA_MEM_MB=256");
}

void h_devd2(void)
{
	h_devd_start("FAKECUDA_DEVICES=2 FAKECUDA_MEM_MB=256");
}

pid_t h_devd_pid(void)
{
	char pidpath[160], buf[32] = "";
	FILE *f;

	snprintf(pidpath, sizeof(pidpath), "%s.pid", sock);
	f = fopen(pidpath, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return atoi(buf);
}

long long h_arena_bytes(void)
{
	long long bytes = -1;

	ck_assert_int_eq(h_fds_like(h_devd_pid(), "memfd:fakecuda-dev0", &bytes), 1);
	ck_assert_int_ge(bytes, 0);
	return bytes;
}

/* ---- the driver ---------------------------------------------------------- */

CUcontext h_init(int ord)
{
	CUcontext ctx;

	CK(cuInit(0));
	CK(cuDeviceGet(&cur_dev, ord));
	CK(cuDevicePrimaryCtxRetain(&ctx, cur_dev));
	CK(cuCtxSetCurrent(ctx));
	return ctx;
}

CUmemAllocationProp h_prop(int ord, unsigned types)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = ord;
	p.requestedHandleTypes = (CUmemAllocationHandleType)types;
	return p;
}

size_t h_gran(void)
{
	CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	size_t g;

	CK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	return g;
}

CUmemGenericAllocationHandle h_vmm_create(size_t size, int dev, int posix)
{
	CUmemAllocationProp p = h_prop(dev, posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE);
	CUmemGenericAllocationHandle h;

	CK(cuMemCreate(&h, size, &p, 0));
	return h;
}

CUdeviceptr h_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev)
{
	CUmemAccessDesc ad;
	CUdeviceptr va;

	memset(&ad, 0, sizeof(ad));
	ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ad.location.id = dev;
	ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemMap(va, size, 0, h, 0));
	CK(cuMemSetAccess(va, size, &ad, 1));
	return va;
}

CUdeviceptr h_create_map(size_t size, CUmemGenericAllocationHandle *h)
{
	*h = h_vmm_create(size, cur_dev, 1);
	return h_vmm_map(*h, size, cur_dev);
}

void h_unmap_release(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
	CK(cuMemUnmap(va, size));
	CK(cuMemAddressFree(va, size));
	CK(cuMemRelease(h));
}

int h_export(CUmemGenericAllocationHandle h)
{
	int fd = -1;

	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	ck_assert_int_ge(fd, 0);
	return fd;
}

CUfunction h_kernel(const char *name)
{
	CUmodule m;
	CUfunction f;

	CK(cuModuleLoadData(&m, "any image"));
	CK(cuModuleGetFunction(&f, m, name));
	return f;
}

size_t h_free_mem(void)
{
	size_t f = 0, t = 0;

	CK(cuMemGetInfo(&f, &t));
	return f;
}

/* ---- patterns ------------------------------------------------------------ */

void h_pattern(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

int h_pattern_ok(const uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (seed ^ (uint32_t)(i * 2654435761u)))
			return 0;
	return 1;
}

void h_fill(CUdeviceptr va, size_t size, uint32_t seed)
{
	uint32_t *b = malloc(size);

	ck_assert_ptr_nonnull(b);
	h_pattern(b, size / 4, seed);
	CK(cuMemcpyHtoD(va, b, size));
	free(b);
}

bool h_check(CUdeviceptr va, size_t size, uint32_t seed)
{
	uint32_t *b = malloc(size);
	bool ok;

	ck_assert_ptr_nonnull(b);
	ok = cuMemcpyDtoH(b, va, size) == CUDA_SUCCESS && h_pattern_ok(b, size / 4, seed);
	free(b);
	return ok;
}

/* ---- processes and descriptors ------------------------------------------- */

pid_t h_fork(int (*fn)(void *arg, int sock), void *arg, int *sockp)
{
	int sv[2];
	pid_t pid;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		_exit(fn(arg, sv[1]));
	}
	close(sv[1]);
	*sockp = sv[0];
	return pid;
}

int h_wait(pid_t pid)
{
	return waitchild(pid, H_WAIT_MS);
}

/* Descriptor passing is the workload library's (test/workloads/wl.c). */
int h_send_fd(int s, int fd, const void *buf, size_t len)
{
	return wl_send(s, buf, len, fd);
}

int h_recv_fd(int s, void *buf, size_t len)
{
	int fd;

	return wl_recv(s, buf, len, &fd) ? -2 : fd;
}

int h_send(int s, const void *buf, size_t len)
{
	return write(s, buf, len) == (ssize_t)len ? 0 : -1;
}

int h_recv(int s, void *buf, size_t len)
{
	return recv(s, buf, len, MSG_WAITALL) == (ssize_t)len ? 0 : -1;
}

/* ---- accounting ---------------------------------------------------------- */

int h_is_root(void)
{
	return geteuid() == 0;
}

bool h_asan(void)
{
	return dlsym(RTLD_DEFAULT, "__asan_init") != NULL;
}

int h_fds_like(pid_t pid, const char *like, long long *bytes)
{
	char fddir[64], path[400], link[128];
	struct dirent *d;
	DIR *dp;
	int n = 0;

	if (pid)
		snprintf(fddir, sizeof(fddir), "/proc/%d/fd", (int)pid);
	else
		snprintf(fddir, sizeof(fddir), "/proc/self/fd");
	dp = opendir(fddir);
	if (!dp)
		return -1;
	while ((d = readdir(dp))) {
		ssize_t k;

		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", fddir, d->d_name);
		k = like ? readlink(path, link, sizeof(link) - 1) : 0;
		if (like && (k <= 0 || (link[k] = 0, !strstr(link, like))))
			continue;
		n++;
		if (bytes) {
			struct stat st;

			ck_assert_int_eq(stat(path, &st), 0);
			*bytes = (long long)st.st_blocks * 512;
		}
	}
	closedir(dp);
	return n;
}

int h_count_fds(pid_t pid)
{
	return h_fds_like(pid, NULL, NULL);
}

int h_nfds(void)
{
	return h_count_fds(0) - 1; /* the directory being read */
}

long h_rss_kb(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long pages = 0, rss = 0;

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
			rss = 0;
		fclose(f);
	}
	return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

long h_settles(long (*read)(void), long want, int ms)
{
	int64_t end = h_now_ms() + ms;
	long v = read();

	while (v != want && h_now_ms() < end) {
		usleep(10000);
		v = read();
	}
	return v;
}

static long read_nfds(void)
{
	return h_nfds();
}

static long read_free_mem(void)
{
	return (long)h_free_mem();
}

int h_nfds_settled(int want)
{
	return (int)h_settles(read_nfds, want, 2000);
}

size_t h_free_mem_settles(size_t want)
{
	return (size_t)h_settles(read_free_mem, (long)want, 5000);
}
