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
 *                the application's handles and addresses still work, and
 *                the context's stack limit is the one it had at start
 *                (2048 bytes per thread set on rank 0, the default 1024
 *                elsewhere)
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
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wl.h"

#define MIB	  (1ull << 20)
#define NSHARED	  3
#define MAXPROCS  8
#define WRITE_LEN (64 * 1024)
#define MAXFRESH  8

static const uint64_t shared_size[NSHARED] = {2 * MIB, 6 * MIB, 10 * MIB};
static uint64_t private_size = 3 * MIB + 4096; /* cuMemAlloc: any size (E2E_PRIVATE_MB) */
static const uint64_t vmm_size = 2 * MIB;

static int nprocs;
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

static int create_shared(uint64_t size, unsigned k, int idx, int *tk)
{
	CUmemAllocationProp p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	WL_CK(cuMemCreate(&sh_handle[idx], size, &p, 0));
	if (wl_map(sh_handle[idx], size, dev, 1, &sh_va[idx]))
		return -1;
	if (wl_put_pattern(sh_va[idx], size, k, 0))
		return -1;
	return wl_export(sh_handle[idx], tk);
}

static int import_shared(int fd, uint64_t size, int idx)
{
	if (wl_import(fd, &sh_handle[idx]))
		return -1;
	return wl_map(sh_handle[idx], size, dev, 1, &sh_va[idx]);
}

/* The stack limit verify expects: rank 0's own, the default elsewhere. */
static size_t stack_limit(void)
{
	return wl_rank == 0 ? 2048 : 1024;
}

static int setup_cuda(void)
{
	CUmemAllocationProp p;
	int ndev = 1;

	WL_CK(cuInit(0));
	/* E2E_SPREAD=1: rank r runs on device r % count (one process per GPU). */
	if (getenv("E2E_SPREAD"))
		WL_CK(cuDeviceGetCount(&ndev));
	if (wl_context(wl_rank % ndev, &dev, &ctx))
		return -1;
	/* A stack limit of the application's own on rank 0 (the others keep
	 * the driver's default): a checkpoint lowers both and must give each
	 * back (verify). */
	if (wl_rank == 0)
		WL_CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_limit()));
	p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	/* native-owned memory */
	WL_CK(cuMemAlloc(&priv_va, private_size));
	if (wl_put_pattern(priv_va, private_size, 100 + (unsigned)wl_rank, 0))
		return -1;
	WL_CK(cuMemCreate(&vmm_handle, vmm_size, &p, 0));
	if (wl_map(vmm_handle, vmm_size, dev, 1, &vmm_va) ||
	    wl_put_pattern(vmm_va, vmm_size, 200 + (unsigned)wl_rank, 0))
		return -1;
	return 0;
}

static int setup_shared(void)
{
	for (int k = 0; k < nshared; k++) {
		if (wl_rank == 0) {
			if (create_shared(shared_size[k], (unsigned)k, k, &ticket[k]))
				return -1;
			for (int r = 1; r < nprocs; r++)
				if (wl_send(peer[r], &(uint64_t){(uint64_t)k}, sizeof(uint64_t), ticket[k]))
					return -1;
		} else {
			uint64_t tag;
			ticket[k] = wl_recv_fd(peer[0], &tag, sizeof(tag));
			if (ticket[k] < 0 || import_shared(ticket[k], shared_size[k], k))
				return -1;
		}
	}
	return 0;
}

/* The raw exporter: runs without the interposer, hands rank 1 a driver FD. */
static int raw_helper(int sock)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h;
	int fd;

	if (wl_context(0, &dev, &ctx))
		return -1;
	p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	WL_CK(cuMemCreate(&h, 2 * MIB, &p, 0));
	if (wl_export(h, &fd) || wl_send(sock, &(uint64_t){99}, sizeof(uint64_t), fd))
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
		if (wl_check_pattern(sh_va[k], shared_size[k], (unsigned)k, k == 0 ? gen : 0, k == 0 ? WRITE_LEN : 0,
				     what))
			return -1;
		/* the application's own handle still answers, and the address
		 * maps back to an allocation of the right size */
		WL_CK(cuMemGetAllocationPropertiesFromHandle(&p, sh_handle[k]));
		WL_CK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)sh_va[k]));
		WL_CK(cuMemRelease(h));
	}
	if (wl_check_pattern(priv_va, private_size, 100 + (unsigned)wl_rank, 0, 0, "private cuMemAlloc") ||
	    wl_check_pattern(vmm_va, vmm_size, 200 + (unsigned)wl_rank, 0, 0, "never-shared VMM"))
		return -1;
	WL_CK(cuMemGetAddressRange(&base, &sz, priv_va));
	if (base != priv_va || sz < private_size)
		return wl_fail("cuMemGetAddressRange(private) gives %#llx+%zu", (unsigned long long)base, sz);
	WL_CK(cuCtxGetLimit(&sz, CU_LIMIT_STACK_SIZE));
	if (sz != stack_limit())
		return wl_fail("stack limit %zu bytes per thread, not the %zu it had at start", sz, stack_limit());
	for (int f = 0; f < nfresh; f++)
		if (wl_check_pattern(sh_va[NSHARED + f], 2 * MIB, 50 + (unsigned)f, 0, 0, "fresh"))
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
		return wl_fail("too many fresh allocations");
	if (wl_rank == 0) {
		if (create_shared(2 * MIB, 50 + (unsigned)nfresh, idx, &fd))
			return -1;
		for (int r = 1; r < nprocs; r++)
			if (wl_send(peer[r], &(uint64_t){(uint64_t)idx}, sizeof(uint64_t), fd))
				return -1;
		close(fd);
	} else {
		fd = wl_recv_fd(peer[0], &tag, sizeof(tag));
		if (fd < 0 || import_shared(fd, 2 * MIB, idx))
			return -1;
		close(fd);
		if (wl_check_pattern(sh_va[idx], 2 * MIB, 50 + (unsigned)nfresh, 0, 0, "fresh import"))
			return -1;
	}
	nfresh++;
	return 0;
}

static int do_reimport(void)
{
	for (int k = 0; wl_rank && k < NSHARED; k++) {
		CUmemGenericAllocationHandle h;
		WL_CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)ticket[k],
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		WL_CK(cuMemRelease(h));
	}
	return 0;
}

static int do_busy(unsigned ms)
{
	static CUfunction add;
	char us[32];

	if (!add) {
		CUmodule mod;
		WL_CK(cuModuleLoadData(&mod, "any image"));
		WL_CK(cuModuleGetFunction(&add, mod, "fake_add_u32"));
	}
	size_t n = private_size / 4;
	unsigned zero = 0;
	void *args[] = {&priv_va, &n, &zero};
	snprintf(us, sizeof(us), "%u", ms * 1000);
	setenv("FAKECUDA_KERNEL_DELAY_US", us, 1); /* read by the fake at launch */
	WL_CK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	unsetenv("FAKECUDA_KERNEL_DELAY_US");
	return 0;
}

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	if (!strcmp(verb, "verify"))
		return do_verify(a, out, len);
	if (!strcmp(verb, "write"))
		return (int)a == wl_rank ? wl_put_pattern(sh_va[0], WRITE_LEN, 0, b) : 0;
	if (!strcmp(verb, "fresh"))
		return do_fresh();
	if (!strcmp(verb, "reimport"))
		return do_reimport();
	if (!strcmp(verb, "busy"))
		return (int)a == wl_rank ? do_busy(b) : 0;
	if (!strcmp(verb, "exit"))
		return WL_EXIT;
	return wl_fail("unknown command %s", verb);
}

int main(int argc, char **argv)
{
	int raw = argc > 3 && !strcmp(argv[3], "--raw");
	int rawsk[2] = {-1, -1};

	wl_prog = "e2e_group";
	if (argc > 3 && !strcmp(argv[3], "--private"))
		nshared = 0;
	if (getenv("E2E_PRIVATE_MB") && atoi(getenv("E2E_PRIVATE_MB")) > 0)
		private_size = (uint64_t)atoi(getenv("E2E_PRIVATE_MB")) * MIB;

	if (argc >= 3 && !strcmp(argv[1], "--raw-helper"))
		return raw_helper(atoi(argv[2])) ? (fprintf(stderr, "raw helper: %s\n", wl_why), 1) : 0;
	if (argc < 3) {
		fprintf(stderr, "usage: e2e_group DIR NPROCS [--raw]\n");
		return 2;
	}
	wl_dir = argv[1];
	nprocs = atoi(argv[2]);
	if (nprocs < 1 || nprocs > MAXPROCS)
		return 2;
	if (raw && socketpair(AF_UNIX, SOCK_STREAM, 0, rawsk))
		return 1;
	if (wl_fork_ranks(nprocs, peer, NULL, WL_PDEATHSIG) < 0)
		return wl_failed(wl_prog);
	if (wl_rank == 0 && raw && fork() == 0) {
		char fdarg[16];
		snprintf(fdarg, sizeof(fdarg), "%d", rawsk[1]);
		unsetenv("LD_PRELOAD");
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl("/proc/self/exe", argv[0], "--raw-helper", fdarg, (char *)NULL);
		_exit(127);
	}
	if (setup_cuda() || setup_shared())
		return wl_failed(wl_prog);
	if (raw && wl_rank == 1) {
		uint64_t tag;
		int fd = wl_recv_fd(rawsk[0], &tag, sizeof(tag));
		if (fd < 0)
			return wl_failed(wl_prog);
		if (wl_import(fd, &raw_handle) || wl_map(raw_handle, 2 * MIB, dev, 1, &raw_va)) {
			wl_fail("raw import failed: %s", wl_why);
			return wl_failed(wl_prog);
		}
		close(fd);
	}
	if (wl_ready("pid %d va %#llx %#llx %#llx %#llx %#llx", getpid(), (unsigned long long)sh_va[0],
		     (unsigned long long)sh_va[1], (unsigned long long)sh_va[2], (unsigned long long)priv_va,
		     (unsigned long long)vmm_va))
		return 1;
	wl_serve(command, 20);
	/* the importers die with rank 0 (PDEATHSIG): let them answer */
	if (wl_rank == 0)
		wl_reap();
	return 0;
}
