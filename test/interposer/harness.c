/*
 * harness.c - see harness.h. Test code, single-threaded unless a test says
 * otherwise; no locks.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static CUdevice cur_dev;

void h_init(int ord)
{
	CUcontext ctx;

	CK(cuInit(0));
	CK(cuDeviceGet(&cur_dev, ord));
	CK(cuDevicePrimaryCtxRetain(&ctx, cur_dev));
	CK(cuCtxSetCurrent(ctx));
}

CUmemAllocationProp h_prop(int ord, unsigned types)
{
	CUmemAllocationProp p = {0};

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

CUdeviceptr h_create_map(size_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp p = h_prop(cur_dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, cur_dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr va;

	CK(cuMemCreate(h, size, &p, 0));
	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemMap(va, size, 0, *h, 0));
	CK(cuMemSetAccess(va, size, &d, 1));
	return va;
}

void h_unmap_release(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
	CK(cuMemUnmap(va, size));
	CK(cuMemAddressFree(va, size));
	CK(cuMemRelease(h));
}

static uint32_t word(uint32_t seed, size_t j)
{
	uint32_t x = seed * 0x9E3779B1u ^ (uint32_t)j * 2654435761u;
	return x ^ (x >> 13);
}

void h_fill(CUdeviceptr va, size_t size, uint32_t seed)
{
	uint32_t *b = malloc(size);

	ck_assert_ptr_nonnull(b);
	for (size_t j = 0; j < size / 4; j++)
		b[j] = word(seed, j);
	CK(cuMemcpyHtoD(va, b, size));
	free(b);
}

bool h_check(CUdeviceptr va, size_t size, uint32_t seed)
{
	uint32_t *b = malloc(size);
	bool ok = true;

	ck_assert_ptr_nonnull(b);
	if (cuMemcpyDtoH(b, va, size) != CUDA_SUCCESS)
		ok = false;
	for (size_t j = 0; ok && j < size / 4; j++)
		ok = b[j] == word(seed, j);
	free(b);
	return ok;
}

int h_export(CUmemGenericAllocationHandle h)
{
	int fd = -1;

	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	ck_assert_int_ge(fd, 0);
	return fd;
}

void *h_real(const char *name)
{
	static void *(*libc_dlsym)(void *, const char *);
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (!libc_dlsym)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
	if (!libc_dlsym)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(libc_dlsym);
	void *p = libc_dlsym(cuda, name);
	dlclose(cuda);
	return p;
}

bool h_ours(void *p)
{
	Dl_info di;

	return p && dladdr(p, &di) && di.dli_fname && strstr(di.dli_fname, "libcuinterpose");
}

void *h_ours_sym(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	ck_assert_msg(h_ours(p), "%s is not the interposer's", name);
	return p;
}

int h_nfds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the DIR itself */
}

/*
 * The interposer's own threads close their end of a control connection
 * (this process's INSPECT, a peer's FETCH) asynchronously: wait up to 2 s
 * for the count to come back to `want`, then return what it is.
 */
int h_nfds_settled(int want)
{
	int n = h_nfds();

	for (int i = 0; i < 200 && n != want; i++) {
		usleep(10000);
		n = h_nfds();
	}
	return n;
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

int h_sock_path(pid_t pid, char *buf, size_t len)
{
	const char *dir = getenv("CUINTERPOSE_SOCKET_DIR");
	char prefix[32];
	struct dirent *de;
	DIR *d;
	int ret = -ENOENT;

	if (!pid)
		pid = getpid();
	ck_assert_ptr_nonnull(dir);
	snprintf(prefix, sizeof(prefix), "%d-", (int)pid);
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		if (!strncmp(de->d_name, prefix, strlen(prefix)) && strstr(de->d_name, ".sock")) {
			snprintf(buf, len, "%s/%s", dir, de->d_name);
			ret = 0;
			break;
		}
	}
	if (d)
		closedir(d);
	return ret;
}

int h_connect(pid_t pid)
{
	char path[256], err[256];
	int s;

	ck_assert_int_eq(h_sock_path(pid, path, sizeof(path)), 0);
	s = cuip_client_connect(path);
	ck_assert_int_ge(s, 0);
	ck_assert_msg(cuip_client_handshake(s, "test", 0, NULL, err, sizeof(err)) == 0, "handshake: %s", err);
	return s;
}

int h_request(int sock, Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out)
{
	char err[256];

	return cuip_client_call(sock, req, fd_in, resp, fd_out, err, sizeof(err));
}

static Cuip__Response *held[64];

Cuip__ProcessState *h_state(pid_t pid)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp;
	int s = h_connect(pid);

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ck_assert_int_eq(h_request(s, &req, -1, &resp, NULL), 0);
	close(s);
	ck_assert_int_eq(resp->status, 0);
	ck_assert_int_eq(resp->body_case, CUIP__RESPONSE__BODY_STATE);
	for (int i = 0; i < 64; i++) {
		if (!held[i]) {
			held[i] = resp;
			break;
		}
	}
	return resp->state;
}

void h_state_free(Cuip__ProcessState *st)
{
	for (int i = 0; i < 64; i++) {
		if (held[i] && held[i]->state == st) {
			cuip__response__free_unpacked(held[i], NULL);
			held[i] = NULL;
		}
	}
}

int h_send_fd(int sock, int fd, const void *buf, size_t len)
{
	char ctl[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (fd >= 0) {
		mh.msg_control = ctl;
		mh.msg_controllen = sizeof(ctl);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

int h_recv_fd(int sock, void *buf, size_t len)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	int fd = -1;

	if (recvmsg(sock, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)len)
		return -2;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

pid_t h_fork(int (*fn)(void *arg, int sock), void *arg, int *sock)
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
	*sock = sv[0];
	return pid;
}

int h_wait(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool h_asan(void)
{
	return dlsym(RTLD_DEFAULT, "__asan_init") != NULL;
}
