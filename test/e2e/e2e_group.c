/*
 * e2e_group - the CUDA job the end-to-end tests checkpoint: one creator and
 * NPROCS-1 importers sharing VMM memory through interposer tickets, next to
 * memory that native checkpoint owns (cuMemAlloc, never-exported VMM).
 *
 *   e2e_group DIR NPROCS [--raw]
 *
 * Rank 0 (the creator, the tree's root) forks the importers before any CUDA
 * call, creates SHARED allocations (sizes below, some not a multiple of the
 * carrier's staging buffer), exports each once and sends the tickets over
 * socketpairs; importers import, map at addresses of their own and keep the
 * tickets open. Every rank then writes DIR/r<rank>.ready
 * ("pid <pid> va <va>... private <va> vmm <va>") and polls DIR/cmd
 * ("<seq> <verb> [args]"), answering each new command in DIR/r<rank>.<seq>
 * with "ok ..." or "fail <why>":
 *
 *   verify G     every byte of every allocation has its pattern; the first
 *                WRITE_LEN bytes of shared allocation 0 have generation G;
 *                the application's handles and addresses still work
 *   write R G    rank R writes generation G into shared allocation 0
 *   fresh S      the creator makes, exports and sends a new allocation; the
 *                importers import and map it and check its bytes
 *   reimport     importers import again from the tickets they kept
 *   busy R MS    rank R queues a kernel that runs MS ms (adds 0 to its
 *                private allocation: device work a QUIESCE has to drain)
 *   exit         leave
 *
 * --private: no shared allocations at all (private memory only).
 * E2E_PRIVATE_MB=N: the private cuMemAlloc is N MiB (benchmarks).
 * --raw: an extra child without the interposer exports an allocation whose
 * raw driver FD rank 1 imports (the interposer counts a raw import).
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB	  (1ull << 20)
#define NSHARED	  3
#define MAXPROCS  8
#define WRITE_LEN (64 * 1024)
#define MAXFRESH  8

static const uint64_t shared_size[NSHARED] = {2 * MIB, 6 * MIB, 10 * MIB};
static uint64_t private_size = 3 * MIB + 4096; /* cuMemAlloc: any size (E2E_PRIVATE_MB) */
static const uint64_t vmm_size = 2 * MIB;

static const char *dir;
static int rank, nprocs;
static int peer[MAXPROCS]; /* rank 0: socket to rank i; others: peer[0] */
static CUcontext ctx;
static CUdevice dev;
static CUmemGenericAllocationHandle sh_handle[NSHARED + MAXFRESH];
static CUdeviceptr sh_va[NSHARED + MAXFRESH];
static int ticket[NSHARED];
static CUdeviceptr priv_va, vmm_va, raw_va;
static CUmemGenericAllocationHandle vmm_handle, raw_handle;
static int nfresh;
static int nshared = NSHARED; /* 0 with --private */
static char why[512];

static int failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int failf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return -1;
}

#define CK(call)                                                                       \
	do {                                                                           \
		CUresult r_ = (call);                                                  \
		if (r_ != CUDA_SUCCESS)                                                \
			return failf("%s failed: %d (rank %d)", #call, (int)r_, rank); \
	} while (0)

static uint8_t pattern(uint64_t off, unsigned k, unsigned gen)
{
	return (uint8_t)((off * 31) ^ (k * 17) ^ gen ^ (off >> 12) ^ (off >> 20));
}

static void fill(uint8_t *buf, uint64_t base, uint64_t len, unsigned k, unsigned gen)
{
	for (uint64_t i = 0; i < len; i++)
		buf[i] = pattern(base + i, k, gen);
}

static int put(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen)
{
	uint8_t *buf = malloc(len);

	if (!buf)
		return failf("out of memory");
	fill(buf, 0, len, k, gen);
	CUresult r = cuMemcpyHtoD(va, buf, len);
	free(buf);
	if (r != CUDA_SUCCESS)
		return failf("cuMemcpyHtoD failed: %d", (int)r);
	CK(cuCtxSynchronize());
	return 0;
}

/* Compare [va, va+len) against pattern k; the first `glen` bytes have gen. */
static int check(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen, uint64_t glen, const char *what)
{
	uint8_t *buf = malloc(len);

	if (!buf)
		return failf("out of memory");
	CUresult r = cuMemcpyDtoH(buf, va, len);
	if (r != CUDA_SUCCESS) {
		free(buf);
		return failf("cuMemcpyDtoH of %s at %#llx failed: %d", what, (unsigned long long)va, (int)r);
	}
	for (uint64_t i = 0; i < len; i++) {
		uint8_t want = pattern(i, k, i < glen ? gen : 0);
		if (buf[i] != want) {
			uint8_t got = buf[i];
			free(buf);
			return failf("%s at %#llx: byte %llu is %#x, expected %#x", what, (unsigned long long)va,
				     (unsigned long long)i, got, want);
		}
	}
	free(buf);
	return 0;
}

static int send_fd(int sock, int fd, uint64_t tag)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&tag, sizeof(tag)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

	memset(cbuf, 0, sizeof(cbuf));
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(sock, &mh, 0) == sizeof(tag) ? 0 : failf("sendmsg: %s", strerror(errno));
}

static int recv_fd(int sock, uint64_t *tag)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {tag, sizeof(*tag)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c;
	int fd = -1;

	if (recvmsg(sock, &mh, 0) != sizeof(*tag))
		return failf("recvmsg: %s", strerror(errno));
	c = CMSG_FIRSTHDR(&mh);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return failf("no descriptor received");
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

static CUmemAllocationProp props(void)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	return p;
}

static int map_rw(CUmemGenericAllocationHandle h, uint64_t size, CUdeviceptr *va)
{
	CUmemAccessDesc ad;

	CK(cuMemAddressReserve(va, size, 0, 0, 0));
	CK(cuMemMap(*va, size, 0, h, 0));
	memset(&ad, 0, sizeof(ad));
	ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ad.location.id = dev;
	ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CK(cuMemSetAccess(*va, size, &ad, 1));
	return 0;
}

static int create_shared(uint64_t size, unsigned k, int idx, int *tk)
{
	CUmemAllocationProp p = props();

	CK(cuMemCreate(&sh_handle[idx], size, &p, 0));
	if (map_rw(sh_handle[idx], size, &sh_va[idx]))
		return -1;
	if (put(sh_va[idx], size, k, 0))
		return -1;
	CK(cuMemExportToShareableHandle(tk, sh_handle[idx], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	return 0;
}

static int import_shared(int fd, uint64_t size, int idx)
{
	CK(cuMemImportFromShareableHandle(&sh_handle[idx], (void *)(uintptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	return map_rw(sh_handle[idx], size, &sh_va[idx]);
}

static int setup_cuda(void)
{
	CUmemAllocationProp p;
	int ndev = 1;

	CK(cuInit(0));
	/* E2E_SPREAD=1: rank r runs on device r % count (one process per GPU). */
	if (getenv("E2E_SPREAD"))
		CK(cuDeviceGetCount(&ndev));
	CK(cuDeviceGet(&dev, rank % ndev));
	p = props();
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	/* native-owned memory */
	CK(cuMemAlloc(&priv_va, private_size));
	if (put(priv_va, private_size, 100 + (unsigned)rank, 0))
		return -1;
	CK(cuMemCreate(&vmm_handle, vmm_size, &p, 0));
	if (map_rw(vmm_handle, vmm_size, &vmm_va) || put(vmm_va, vmm_size, 200 + (unsigned)rank, 0))
		return -1;
	return 0;
}

static int setup_shared(void)
{
	for (int k = 0; k < nshared; k++) {
		if (rank == 0) {
			if (create_shared(shared_size[k], (unsigned)k, k, &ticket[k]))
				return -1;
			for (int r = 1; r < nprocs; r++)
				if (send_fd(peer[r], ticket[k], (uint64_t)k))
					return -1;
		} else {
			uint64_t tag;
			ticket[k] = recv_fd(peer[0], &tag);
			if (ticket[k] < 0 || import_shared(ticket[k], shared_size[k], k))
				return -1;
		}
	}
	return 0;
}

/* The raw exporter: runs without the interposer, hands rank 1 a driver FD. */
static int raw_helper(int sock)
{
	CUmemAllocationProp p = props();
	CUmemGenericAllocationHandle h;
	int fd;

	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuMemCreate(&h, 2 * MIB, &p, 0));
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (send_fd(sock, fd, 99))
		return -1;
	for (;;)
		pause();
}

static int do_verify(unsigned gen, char *out, size_t len)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp p;
	CUdeviceptr base;
	size_t sz;

	for (int k = 0; k < nshared; k++) {
		char what[32];
		snprintf(what, sizeof(what), "shared[%d]", k);
		if (check(sh_va[k], shared_size[k], (unsigned)k, k == 0 ? gen : 0, k == 0 ? WRITE_LEN : 0, what))
			return -1;
		/* the application's own handle still answers, and the address
		 * maps back to an allocation of the right size */
		CK(cuMemGetAllocationPropertiesFromHandle(&p, sh_handle[k]));
		CK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)sh_va[k]));
		CK(cuMemRelease(h));
	}
	if (check(priv_va, private_size, 100 + (unsigned)rank, 0, 0, "private cuMemAlloc") ||
	    check(vmm_va, vmm_size, 200 + (unsigned)rank, 0, 0, "never-shared VMM"))
		return -1;
	CK(cuMemGetAddressRange(&base, &sz, priv_va));
	if (base != priv_va || sz < private_size)
		return failf("cuMemGetAddressRange(private) gives %#llx+%zu", (unsigned long long)base, sz);
	for (int f = 0; f < nfresh; f++)
		if (check(sh_va[NSHARED + f], 2 * MIB, 50 + (unsigned)f, 0, 0, "fresh"))
			return -1;
	snprintf(out, len, "ok %#llx %#llx %#llx %#llx %#llx", (unsigned long long)sh_va[0],
		 (unsigned long long)sh_va[1], (unsigned long long)sh_va[2], (unsigned long long)priv_va,
		 (unsigned long long)vmm_va);
	return 0;
}

static int do_fresh(void)
{
	int idx = NSHARED + nfresh, fd;
	uint64_t tag;

	if (nfresh >= MAXFRESH)
		return failf("too many fresh allocations");
	if (rank == 0) {
		if (create_shared(2 * MIB, 50 + (unsigned)nfresh, idx, &fd))
			return -1;
		for (int r = 1; r < nprocs; r++)
			if (send_fd(peer[r], fd, (uint64_t)idx))
				return -1;
		close(fd);
	} else {
		fd = recv_fd(peer[0], &tag);
		if (fd < 0 || import_shared(fd, 2 * MIB, idx))
			return -1;
		close(fd);
		if (check(sh_va[idx], 2 * MIB, 50 + (unsigned)nfresh, 0, 0, "fresh import"))
			return -1;
	}
	nfresh++;
	return 0;
}

static int do_reimport(void)
{
	for (int k = 0; rank && k < NSHARED; k++) {
		CUmemGenericAllocationHandle h;
		CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)ticket[k],
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CK(cuMemRelease(h));
	}
	return 0;
}

static int do_busy(unsigned ms)
{
	static CUfunction add;
	char us[32];

	if (!add) {
		CUmodule mod;
		CK(cuModuleLoadData(&mod, "any image"));
		CK(cuModuleGetFunction(&add, mod, "fake_add_u32"));
	}
	size_t n = private_size / 4;
	unsigned zero = 0;
	void *args[] = {&priv_va, &n, &zero};
	snprintf(us, sizeof(us), "%u", ms * 1000);
	setenv("FAKECUDA_KERNEL_DELAY_US", us, 1); /* read by the fake at launch */
	CK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	unsetenv("FAKECUDA_KERNEL_DELAY_US");
	return 0;
}

static void answer(long seq, int ok, const char *text)
{
	char path[4096], tmp[4200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/r%d.%ld", dir, rank, seq);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s\n", ok ? text : why);
	fclose(f);
	rename(tmp, path);
}

static void serve(void)
{
	char path[4096], line[256];
	long last = 0;

	snprintf(path, sizeof(path), "%s/cmd", dir);
	for (;;) {
		char verb[32] = "", out[256] = "ok";
		long seq = 0;
		unsigned a = 0, b = 0;
		FILE *f = fopen(path, "r");
		int ret = 0;

		if (!f || !fgets(line, sizeof(line), f) || sscanf(line, "%ld %31s %u %u", &seq, verb, &a, &b) < 2 ||
		    seq <= last) {
			if (f)
				fclose(f);
			usleep(20000);
			continue;
		}
		fclose(f);
		last = seq;
		why[0] = 0;
		if (!strcmp(verb, "verify"))
			ret = do_verify(a, out, sizeof(out));
		else if (!strcmp(verb, "write"))
			ret = (int)a == rank ? put(sh_va[0], WRITE_LEN, 0, b) : 0;
		else if (!strcmp(verb, "fresh"))
			ret = do_fresh();
		else if (!strcmp(verb, "reimport"))
			ret = do_reimport();
		else if (!strcmp(verb, "busy"))
			ret = (int)a == rank ? do_busy(b) : 0;
		else if (!strcmp(verb, "exit")) {
			answer(seq, 1, "ok");
			/* the importers die with rank 0 (PDEATHSIG): let them answer */
			while (rank == 0 && wait(NULL) > 0)
				;
			exit(0);
		} else
			ret = failf("unknown command %s", verb);
		answer(seq, ret == 0, out);
	}
}

int main(int argc, char **argv)
{
	int raw = argc > 3 && !strcmp(argv[3], "--raw");
	int rawsk[2] = {-1, -1};
	char path[4096];
	FILE *f;

	if (argc > 3 && !strcmp(argv[3], "--private"))
		nshared = 0;
	if (getenv("E2E_PRIVATE_MB") && atoi(getenv("E2E_PRIVATE_MB")) > 0)
		private_size = (uint64_t)atoi(getenv("E2E_PRIVATE_MB")) * MIB;

	if (argc >= 3 && !strcmp(argv[1], "--raw-helper"))
		return raw_helper(atoi(argv[2])) ? (fprintf(stderr, "raw helper: %s\n", why), 1) : 0;
	if (argc < 3) {
		fprintf(stderr, "usage: e2e_group DIR NPROCS [--raw]\n");
		return 2;
	}
	dir = argv[1];
	nprocs = atoi(argv[2]);
	if (nprocs < 1 || nprocs > MAXPROCS)
		return 2;
	if (raw && socketpair(AF_UNIX, SOCK_STREAM, 0, rawsk))
		return 1;
	for (int r = 1; r < nprocs; r++) {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
			return 1;
		pid_t pid = fork();
		if (pid == 0) {
			rank = r;
			close(sv[0]);
			for (int q = 1; q < r; q++)
				close(peer[q]);
			peer[0] = sv[1];
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			goto run;
		}
		close(sv[1]);
		peer[r] = sv[0];
	}
	if (raw && fork() == 0) {
		char fdarg[16];
		snprintf(fdarg, sizeof(fdarg), "%d", rawsk[1]);
		unsetenv("LD_PRELOAD");
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/proc/self/exe", argv[0], "--raw-helper", fdarg, (char *)NULL);
		_exit(127);
	}
run:
	if (setup_cuda() || setup_shared())
		goto fail;
	if (raw && rank == 1) {
		uint64_t tag;
		int fd = recv_fd(rawsk[0], &tag);
		if (fd < 0)
			goto fail;
		if (cuMemImportFromShareableHandle(&raw_handle, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
		    map_rw(raw_handle, 2 * MIB, &raw_va)) {
			failf("raw import failed");
			goto fail;
		}
		close(fd);
	}
	snprintf(path, sizeof(path), "%s/r%d.ready", dir, rank);
	f = fopen(path, "w");
	if (!f)
		return 1;
	fprintf(f, "pid %d va %#llx %#llx %#llx %#llx %#llx\n", getpid(), (unsigned long long)sh_va[0],
		(unsigned long long)sh_va[1], (unsigned long long)sh_va[2], (unsigned long long)priv_va,
		(unsigned long long)vmm_va);
	fclose(f);
	serve();
	return 0;
fail:
	snprintf(path, sizeof(path), "%s/r%d.failed", dir, rank);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "%s\n", why);
		fclose(f);
	}
	fprintf(stderr, "e2e_group rank %d: %s\n", rank, why);
	return 1;
}
