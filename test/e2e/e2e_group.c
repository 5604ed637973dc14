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
 *                private allocation: device work a QUIESCE has to drain);
 *                MS 0: until DIR/busy.release exists (the fake's
 *                FAKECUDA_KERNEL_HOLD, at most 120 s)
 *   exit         leave
 *
 * --private: no shared allocations at all (private memory only).
 * E2E_PRIVATE_MB=N: the private cuMemAlloc is N MiB (benchmarks).
 * E2E_SMALL=N: rank 0 also holds N private and N shared allocations of one
 * granule each (thousands of carrier items: runs of hundreds of copies per
 * staging buffer), mapped side by side in one reservation per kind; every
 * other rank imports and maps each shared one. verify checks each one's
 * words (its own id first: one restored in another's place shows) and that
 * its address still names it; write R G also puts G into word 1 of every
 * small shared allocation, through rank R's mappings.
 * --raw: an extra child without the interposer exports an allocation whose
 * raw driver FD rank 1 imports (the interposer counts a raw import).
 * E2E_RELEASE=free (with E2E_RESERVED_MB): each rank registers a checkpoint
 * hook (cuinterpose_on_checkpoint, looked up at run time) that frees the
 * reservation, as a caching allocator gives back its free blocks; verify
 * allocates it again when it is gone (and checks that it reads zero).
 * Registration is checked too: NULL is refused with -EINVAL, and the 17th
 * hook with -ENOSPC. E2E_RELEASE=slow:MS: the hook sleeps MS ms and frees
 * nothing.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wl.h"

#define MIB	  (1ull << 20)
#define NSHARED	  3
#define MAXPROCS  8
#define WRITE_LEN (64 * 1024)
#define MAXFRESH  8

static const uint64_t shared_size[NSHARED] = {2 * MIB, 6 * MIB, 10 * MIB};
static uint64_t private_size = 3 * MIB + 4096; /* cuMemAlloc: any size (E2E_PRIVATE_MB) */
/* E2E_RESERVED_MB: a cuMemAlloc the job never writes, as a framework's
 * cache keeps reserved memory (the fake's fresh memory reads zero); verify
 * checks that it still reads zero. */
static uint64_t reserved_size;
static CUdeviceptr resv_va; /* 0 once a release hook freed it; under resv_mu */
static pthread_mutex_t resv_mu = PTHREAD_MUTEX_INITIALIZER;
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
static unsigned nsmall;	      /* E2E_SMALL */
static size_t gran;
static CUdeviceptr small_priv, small_sh; /* reservations: allocation j at base + j * gran */

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
	if (reserved_size)
		WL_CK(cuMemAlloc(&resv_va, reserved_size));
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

/* Word i of small allocation id (private j: j, shared j: nsmall + j): the id
 * first, the generation second (shared ones: write R G), a mix after. */
struct small_key {
	uint32_t id, gen;
};

static uint32_t small_word(uint64_t i, const void *arg)
{
	const struct small_key *k = arg;

	if (i == 0)
		return 0x5a000000u | k->id;
	if (i == 1)
		return k->gen;
	return k->id * 2654435761u ^ (uint32_t)i * 40503u;
}

static int map_at(CUmemGenericAllocationHandle h, CUdeviceptr va)
{
	CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

	WL_CK(cuMemMap(va, gran, 0, h, 0));
	WL_CK(cuMemSetAccess(va, gran, &ad, 1));
	WL_CK(cuMemRelease(h)); /* the mapping keeps it */
	return 0;
}

/* One small allocation of rank 0, made, mapped at va and filled; *fd its
 * export (shared) or -1. */
static int create_small(CUdeviceptr va, uint32_t id, int shared, int *fd)
{
	CUmemAllocationProp p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	struct small_key key = {id, 0};
	CUmemGenericAllocationHandle h;

	*fd = -1;
	WL_CK(cuMemCreate(&h, gran, &p, 0));
	if (shared && wl_export(h, fd))
		return -1;
	if (map_at(h, va))
		return -1;
	return wl_fill_words(va, gran / 4, small_word, &key);
}

/* E2E_SMALL: rank 0 makes them and sends each shared one to every rank
 * (closing its export FD once sent: the importers' handles keep it). */
static int setup_small(void)
{
	CUmemAllocationProp p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	WL_CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	WL_CK(cuMemAddressReserve(&small_sh, gran * nsmall, 0, 0, 0));
	if (wl_rank == 0)
		WL_CK(cuMemAddressReserve(&small_priv, gran * nsmall, 0, 0, 0));
	for (unsigned j = 0; j < nsmall; j++) {
		CUmemGenericAllocationHandle h;
		uint64_t tag;
		int fd;

		if (wl_rank) {
			fd = wl_recv_fd(peer[0], &tag, sizeof(tag));
			if (fd < 0)
				return -1;
			if (tag != j)
				return wl_fail("small shared %u came as %llu", j, (unsigned long long)tag);
			if (wl_import(fd, &h) || map_at(h, small_sh + gran * j))
				return -1;
			close(fd);
			continue;
		}
		if (create_small(small_priv + gran * j, j, 0, &fd) ||
		    create_small(small_sh + gran * j, nsmall + j, 1, &fd))
			return -1;
		for (int r = 1; r < nprocs; r++)
			if (wl_send(peer[r], &(uint64_t){j}, sizeof(uint64_t), fd))
				return -1;
		close(fd);
	}
	return 0;
}

/* Every small allocation still has its words (shared ones generation gen)
 * at its address, and the address still names a live allocation. */
/* The never-written reservation still reads zero, every byte. */
static int check_zero(CUdeviceptr va, uint64_t size)
{
	static uint8_t buf[1 << 20];

	for (uint64_t o = 0; o < size; o += sizeof(buf)) {
		size_t n = size - o < sizeof(buf) ? (size_t)(size - o) : sizeof(buf);

		WL_CK(cuMemcpyDtoH(buf, va + o, n));
		for (size_t i = 0; i < n; i++)
			if (buf[i])
				return wl_fail("reserved cuMemAlloc: byte %llu is %#x, not 0",
					       (unsigned long long)(o + i), buf[i]);
	}
	return 0;
}

static int verify_small(unsigned gen)
{
	for (unsigned j = 0; j < nsmall; j++) {
		for (int shared = wl_rank == 0 ? 0 : 1; shared < 2; shared++) {
			CUdeviceptr va = (shared ? small_sh : small_priv) + gran * j;
			struct small_key key = {shared ? nsmall + j : j, shared ? gen : 0};
			CUmemGenericAllocationHandle h;
			char what[48];

			snprintf(what, sizeof(what), "small %s[%u]", shared ? "shared" : "private", j);
			if (wl_check_words(va, gran / 4, small_word, &key, what))
				return -1;
			WL_CK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)va));
			WL_CK(cuMemRelease(h));
		}
	}
	return 0;
}

/* write R G, small part: G into word 1 of every small shared allocation. */
static int write_small(unsigned gen)
{
	uint32_t g = gen;

	for (unsigned j = 0; j < nsmall; j++)
		WL_CK(cuMemcpyHtoD(small_sh + gran * j + 4, &g, sizeof(g)));
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

/* The checkpoint hooks of E2E_RELEASE, on the interposer's release thread. */
static void release_reserved(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&resv_mu);
	if (resv_va && cuCtxSetCurrent(ctx) == CUDA_SUCCESS && cuMemFree(resv_va) == CUDA_SUCCESS)
		resv_va = 0;
	pthread_mutex_unlock(&resv_mu);
}

/* Until MS ms have passed: a checkpoint may cut a sleep short (EINTR). */
static void release_slowly(void *arg)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		usleep(10000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 < (long)(uintptr_t)arg);
}

static void release_nothing(void *arg)
{
	(void)arg;
}

static int register_release(const char *how)
{
	int (*reg)(void (*)(void *), void *) =
		(int (*)(void (*)(void *), void *))dlsym(RTLD_DEFAULT, "cuinterpose_on_checkpoint");
	int ret;

	if (!reg)
		return wl_fail("E2E_RELEASE: cuinterpose_on_checkpoint is not there (no interposer?)");
	if ((ret = reg(NULL, NULL)) != -EINVAL)
		return wl_fail("cuinterpose_on_checkpoint(NULL) gave %d, not -EINVAL", ret);
	if (!strncmp(how, "slow:", 5))
		ret = reg(release_slowly, (void *)(uintptr_t)strtoul(how + 5, NULL, 10));
	else if (!strcmp(how, "free"))
		ret = reg(release_reserved, NULL);
	else
		return wl_fail("E2E_RELEASE=%s is neither free nor slow:MS", how);
	if (ret)
		return wl_fail("cuinterpose_on_checkpoint gave %d", ret);
	for (int i = 1; i < 16; i++)
		if ((ret = reg(release_nothing, NULL)))
			return wl_fail("hook %d: cuinterpose_on_checkpoint gave %d", i + 1, ret);
	if ((ret = reg(release_nothing, NULL)) != -ENOSPC)
		return wl_fail("hook 17: cuinterpose_on_checkpoint gave %d, not -ENOSPC", ret);
	return 0;
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
	pthread_mutex_lock(&resv_mu);
	if (reserved_size && !resv_va && cuMemAlloc(&resv_va, reserved_size) != CUDA_SUCCESS)
		resv_va = 0;
	if (reserved_size && !resv_va) {
		pthread_mutex_unlock(&resv_mu);
		return wl_fail("cannot allocate the released reservation again");
	}
	if (check_zero(resv_va, reserved_size)) {
		pthread_mutex_unlock(&resv_mu);
		return -1;
	}
	pthread_mutex_unlock(&resv_mu);
	WL_CK(cuMemGetAddressRange(&base, &sz, priv_va));
	if (base != priv_va || sz < private_size)
		return wl_fail("cuMemGetAddressRange(private) gives %#llx+%zu", (unsigned long long)base, sz);
	WL_CK(cuCtxGetLimit(&sz, CU_LIMIT_STACK_SIZE));
	if (sz != stack_limit())
		return wl_fail("stack limit %zu bytes per thread, not the %zu it had at start", sz, stack_limit());
	for (int f = 0; f < nfresh; f++)
		if (wl_check_pattern(sh_va[NSHARED + f], 2 * MIB, 50 + (unsigned)f, 0, 0, "fresh"))
			return -1;
	if (verify_small(gen))
		return -1;
	snprintf(out, len, "ok %#llx %#llx %#llx %#llx %#llx", (unsigned long long)sh_va[0],
		 (unsigned long long)sh_va[1], (unsigned long long)sh_va[2], (unsigned long long)priv_va,
		 (unsigned long long)vmm_va);
	if (nsmall)
		snprintf(out + strlen(out), len - strlen(out), " small %u x %zu at %#llx %#llx", nsmall, gran,
			 (unsigned long long)small_priv, (unsigned long long)small_sh);
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
	char hold[4096];

	snprintf(us, sizeof(us), "%u", ms * 1000);
	snprintf(hold, sizeof(hold), "%s/busy.release", wl_dir);
	setenv("FAKECUDA_KERNEL_DELAY_US", us, 1); /* read by the fake at launch */
	if (!ms)
		setenv("FAKECUDA_KERNEL_HOLD", hold, 1);
	WL_CK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	unsetenv("FAKECUDA_KERNEL_DELAY_US");
	unsetenv("FAKECUDA_KERNEL_HOLD");
	return 0;
}

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	if (!strcmp(verb, "verify"))
		return do_verify(a, out, len);
	if (!strcmp(verb, "write"))
		return (int)a == wl_rank && (wl_put_pattern(sh_va[0], WRITE_LEN, 0, b) || write_small(b)) ? -1 : 0;
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
	if (getenv("E2E_RESERVED_MB") && atoi(getenv("E2E_RESERVED_MB")) > 0)
		reserved_size = (uint64_t)atoi(getenv("E2E_RESERVED_MB")) * MIB;
	if (getenv("E2E_SMALL") && atoi(getenv("E2E_SMALL")) > 0)
		nsmall = (unsigned)atoi(getenv("E2E_SMALL"));

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
	if (setup_cuda() || setup_shared() || (nsmall && setup_small()) ||
	    (getenv("E2E_RELEASE") && register_release(getenv("E2E_RELEASE"))))
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
