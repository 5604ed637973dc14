/*
 * Test helpers (see harness.h).  The devd of a test case is started by an
 * unchecked fixture in Check's parent process and stopped after the case.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include "harness.h"

static char dir[64];
static char sock[128];

const char *fkt_name(CUresult r)
{
	const char *n = NULL;

	cuGetErrorName(r, &n);
	return n ? n : "?";
}

void fkt_devd_start(const char *env)
{
	const char *devd = getenv("FAKECUDA_DEVD");
	char pidpath[160];
	pid_t pid;
	int st;

	ck_assert_msg(devd != NULL, "FAKECUDA_DEVD not set (run through make check)");
	snprintf(dir, sizeof(dir), "/tmp/fakecuda-test-XXXXXX");
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

void fkt_devd_stop(void)
{
	char pidpath[160], buf[32] = "";
	FILE *f;
	pid_t pid = 0;

	snprintf(pidpath, sizeof(pidpath), "%s.pid", sock);
	f = fopen(pidpath, "r");
	if (f) {
		if (fgets(buf, sizeof(buf), f))
			pid = atoi(buf);
		fclose(f);
	}
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

void fkt_devd1(void)
{
	fkt_devd_start("FAKECUDA_MEM_MB=256");
}

void fkt_devd2(void)
{
	fkt_devd_start("FAKECUDA_DEVICES=2 FAKECUDA_MEM_MB=256");
}

CUcontext fkt_init_ctx(int dev)
{
	CUcontext c;

	CK(cuInit(0));
	CK(cuDevicePrimaryCtxRetain(&c, dev));
	CK(cuCtxSetCurrent(c));
	return c;
}

CUmemGenericAllocationHandle fkt_vmm_create(size_t size, int dev, int posix)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	p.requestedHandleTypes = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
	CK(cuMemCreate(&h, size, &p, 0));
	return h;
}

CUdeviceptr fkt_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev)
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

CUfunction fkt_kernel(const char *name)
{
	CUmodule m;
	CUfunction f;

	CK(cuModuleLoadData(&m, "any image"));
	CK(cuModuleGetFunction(&f, m, name));
	return f;
}

pid_t fkt_spawn(int (*fn)(int sock, void *arg), void *arg, int *sockp)
{
	int sv[2];
	pid_t pid;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		_exit(fn(sv[1], arg));
	}
	close(sv[1]);
	*sockp = sv[0];
	return pid;
}

int fkt_wait(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int fkt_send_fd(int s, int fd, const void *buf, size_t len)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} ctl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(s, &mh, 0) == (ssize_t)len ? 0 : -1;
}

int fkt_recv_fd(int s, int *fd, void *buf, size_t len)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
	struct cmsghdr *c;

	if (recvmsg(s, &mh, MSG_WAITALL) != (ssize_t)len)
		return -1;
	c = CMSG_FIRSTHDR(&mh);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(fd, CMSG_DATA(c), sizeof(int));
	return 0;
}

int fkt_send(int s, const void *buf, size_t len)
{
	return write(s, buf, len) == (ssize_t)len ? 0 : -1;
}

int fkt_recv(int s, void *buf, size_t len)
{
	return recv(s, buf, len, MSG_WAITALL) == (ssize_t)len ? 0 : -1;
}

int fkt_is_root(void)
{
	return geteuid() == 0;
}

size_t fkt_free_mem(void)
{
	size_t f = 0, t = 0;

	CK(cuMemGetInfo(&f, &t));
	return f;
}

size_t fkt_free_mem_settles(size_t want)
{
	size_t f = fkt_free_mem();

	for (int i = 0; i < 500 && f != want; i++) {
		usleep(10000);
		f = fkt_free_mem();
	}
	return f;
}

int fkt_fds_like(pid_t pid, const char *like, long long *bytes)
{
	char fddir[64], path[400], link[128];
	struct dirent *d;
	DIR *dp;
	int n = 0;

	snprintf(fddir, sizeof(fddir), "/proc/%d/fd", (int)pid);
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

int fkt_count_fds(pid_t pid)
{
	return fkt_fds_like(pid, NULL, NULL);
}

pid_t fkt_devd_pid(void)
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

int64_t fkt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fkt_fill(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = seed ^ (uint32_t)(i * 2654435761u);
}

int fkt_check(const uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (seed ^ (uint32_t)(i * 2654435761u)))
			return 0;
	return 1;
}

long long fkt_arena_bytes(void)
{
	long long bytes = -1;

	ck_assert_int_eq(fkt_fds_like(fkt_devd_pid(), "memfd:fakecuda-dev0", &bytes), 1);
	ck_assert_int_ge(bytes, 0);
	return bytes;
}
