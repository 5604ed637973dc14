/*
 * e2e_pool - the stream-ordered memory pool jobs the end-to-end tests
 * checkpoint: NPROCS ranks (rank 0 forks the others; a subreaper), each with
 * private pool memory: a block of its device's default pool (cuMemAllocAsync,
 * as cudaMallocAsync does) on one stream and a block of its own POSIX-capable
 * pool that is never exported (cuMemAllocFromPoolAsync) on another.
 *
 *   e2e_pool DIR NPROCS [--shared] [--mib N] [--cache N]
 *
 * --mib N: each block is N MiB (default 2); test/gpu/run.sh runs this same
 * program on the GPU machine (built there as gpu_pool by test/gpu/build.sh).
 *
 * --cache N: each rank's two pools keep N MiB more reserved, as JAX's
 * cuda_async allocator preallocates: the default pool's release threshold
 * raised to keep everything (the private pool's already is), a block of N
 * MiB allocated from each, written and freed, so the pools hold it cached.
 *
 * --shared: rank 0 also makes a POSIX pool, allocates a block from it,
 * exports the pool to every rank (SCM_RIGHTS) and the block
 * (cuMemPoolExportPointer); the others import the pool, set access and
 * import the pointer, as cuda.core, CuPy and RAPIDS do.
 *
 * Protocol as e2e_group: DIR/r<rank>.ready ("pid P default A private B
 * shared C"), commands in DIR/cmd, answers in DIR/r<rank>.<seq>:
 *   write R G     rank R writes word(G, i) into every block it holds
 *                 (asynchronously on its streams, then synchronizes)
 *   verify G      every byte of every block this rank holds is word(G, i)
 *   pools         "ok default R U private R U": each pool's reserved and used
 *                 bytes (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, USED_MEM_CURRENT)
 *   churn         allocate and free a temporary block on each stream (the
 *                 pools still work), answer "ok"
 *   release-importers   ranks > 0 free the imported pointer and destroy
 *                 the imported pool
 *   release-creator     rank 0 frees the shared block and destroys its pool
 *   exit
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wl.h"

#define MiB (1ul << 20)

static size_t block = 2 * MiB, nw;
static uint32_t *host;

#define CK(x) WL_CK_DIE(x)

static uint32_t word(uint32_t g, size_t i)
{
	return g * 0x01000193u ^ (uint32_t)i * 2654435761u;
}

static CUmemoryPool new_pool(int dev)
{
	CUmemPoolProps pp;
	CUmemoryPool p;
	cuuint64_t keep = ~0ull;

	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = dev;
	CK(cuMemPoolCreate(&p, &pp));
	CK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	return p;
}

static void fill(CUdeviceptr va, uint32_t g, CUstream st)
{
	for (size_t i = 0; i < nw; i++)
		host[i] = word(g, i);
	CK(cuMemcpyHtoDAsync(va, host, block, st));
	CK(cuStreamSynchronize(st));
}

/* -1: all good, else the first bad word. */
static long check(CUdeviceptr va, uint32_t g, CUstream st)
{
	memset(host, 0, block);
	CK(cuMemcpyDtoHAsync(host, va, block, st));
	CK(cuStreamSynchronize(st));
	for (size_t i = 0; i < nw; i++)
		if (host[i] != word(g, i))
			return (long)i;
	return -1;
}

static CUdeviceptr dflt, priv, shr;
static CUmemoryPool own, spool;
static CUstream s1, s2;

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	long bad;

	if (!strcmp(verb, "exit"))
		return WL_EXIT;
	if (!strcmp(verb, "verify")) {
		/* G 0 is the shared block's first pattern; private blocks carry their rank's own. */
		uint32_t g = a;
		uint32_t gd = g ? g : 1000 + (uint32_t)wl_rank, gp = g ? g : 2000 + (uint32_t)wl_rank;

		if ((bad = check(dflt, gd, s1)) >= 0)
			return wl_fail("default-pool block word %ld", bad);
		if ((bad = check(priv, gp, s2)) >= 0)
			return wl_fail("private-pool block word %ld", bad);
		if (shr && (bad = check(shr, g, s1)) >= 0)
			return wl_fail("shared-pool block word %ld", bad);
		snprintf(out, len, "ok default %#llx private %#llx shared %#llx", (unsigned long long)dflt,
			 (unsigned long long)priv, (unsigned long long)shr);
	} else if (!strcmp(verb, "write")) {
		if ((int)a == wl_rank) {
			fill(dflt, b, s1);
			fill(priv, b, s2);
			if (shr)
				fill(shr, b, s1);
		}
	} else if (!strcmp(verb, "pools")) {
		cuuint64_t v[4];
		CUmemoryPool dp;

		CK(cuDeviceGetDefaultMemPool(&dp, 0));
		CK(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v[0]));
		CK(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v[1]));
		CK(cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v[2]));
		CK(cuMemPoolGetAttribute(own, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v[3]));
		snprintf(out, len, "ok default %llu %llu private %llu %llu", (unsigned long long)v[0],
			 (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3]);
	} else if (!strcmp(verb, "churn")) {
		CUdeviceptr t1, t2;

		CK(cuMemAllocAsync(&t1, block, s1));
		CK(cuMemAllocFromPoolAsync(&t2, block, own, s2));
		CK(cuMemsetD32Async(t1, 0x5a5a5a5au, nw, s1));
		CK(cuMemsetD32Async(t2, 0xa5a5a5a5u, nw, s2));
		CK(cuMemFreeAsync(t1, s1));
		CK(cuMemFreeAsync(t2, s2));
		CK(cuStreamSynchronize(s1));
		CK(cuStreamSynchronize(s2));
	} else if (!strcmp(verb, "release-importers") || !strcmp(verb, "release-creator")) {
		int mine = (wl_rank == 0) == !strcmp(verb, "release-creator");

		if (mine && spool) {
			CK(cuMemFreeAsync(shr, s1));
			CK(cuStreamSynchronize(s1));
			CK(cuMemPoolDestroy(spool));
			spool = NULL;
			shr = 0;
		}
	} else {
		return wl_fail("unknown verb %s", verb);
	}
	return 0;
}

int main(int argc, char **argv)
{
	int nprocs, shared = 0, peer[16];
	size_t cache = 0;
	CUcontext ctx;
	CUdevice dev;

	if (argc < 3)
		return 2;
	wl_prog = "e2e_pool";
	wl_dir = argv[1];
	nprocs = atoi(argv[2]);
	if (nprocs < 1 || nprocs > 16)
		return 2;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--shared"))
			shared = 1;
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			block = (size_t)atol(argv[++i]) * MiB;
		else if (!strcmp(argv[i], "--cache") && i + 1 < argc)
			cache = (size_t)atol(argv[++i]) * MiB;
	}
	nw = block / 4;
	host = malloc(block);
	if (!nw || !host)
		return 2;
	if (wl_fork_ranks(nprocs, peer, NULL, WL_SUBREAPER) < 0 || wl_context(0, &dev, &ctx))
		wl_die("%s", wl_why);
	CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	CK(cuMemAllocAsync(&dflt, block, s1));
	own = new_pool(0);
	CK(cuMemAllocFromPoolAsync(&priv, block, own, s2));
	fill(dflt, 1000 + (uint32_t)wl_rank, s1);
	fill(priv, 2000 + (uint32_t)wl_rank, s2);
	if (cache) {
		cuuint64_t keep = ~0ull;
		CUdeviceptr c1, c2;
		CUmemoryPool dp;

		CK(cuDeviceGetDefaultMemPool(&dp, 0));
		CK(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
		CK(cuMemAllocAsync(&c1, cache, s1));
		CK(cuMemAllocFromPoolAsync(&c2, cache, own, s2));
		CK(cuMemsetD32Async(c1, 0x11111111u, cache / 4, s1));
		CK(cuMemsetD32Async(c2, 0x22222222u, cache / 4, s2));
		CK(cuMemFreeAsync(c1, s1));
		CK(cuMemFreeAsync(c2, s2));
		CK(cuStreamSynchronize(s1));
		CK(cuStreamSynchronize(s2));
	}

	if (shared && wl_rank == 0) {
		CUmemPoolPtrExportData ed;
		int fd;

		spool = new_pool(0);
		CK(cuMemAllocFromPoolAsync(&shr, block, spool, s1));
		fill(shr, 0, s1);
		CK(cuMemPoolExportToShareableHandle(&fd, spool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CK(cuMemPoolExportPointer(&ed, shr));
		for (int r = 1; r < nprocs; r++)
			if (wl_send(peer[r], &ed, sizeof(ed), fd))
				wl_die("send pool: %s", wl_why);
		close(fd);
	} else if (shared) {
		CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemPoolPtrExportData ed;
		int fd = wl_recv_fd(peer[0], &ed, sizeof(ed));

		if (fd < 0)
			wl_die("recv pool: %s", wl_why);
		CK(cuMemPoolImportFromShareableHandle(&spool, (void *)(intptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		close(fd);
		CK(cuMemPoolSetAccess(spool, &ad, 1));
		CK(cuMemPoolImportPointer(&shr, spool, &ed));
	}

	if (wl_ready("pid %d default %#llx private %#llx shared %#llx", getpid(), (unsigned long long)dflt,
		     (unsigned long long)priv, (unsigned long long)shr))
		wl_die("%s", wl_why);
	wl_serve(command, 20);
	CK(cuMemFreeAsync(dflt, s1));
	CK(cuMemFreeAsync(priv, s2));
	CK(cuStreamSynchronize(s1));
	CK(cuStreamSynchronize(s2));
	CK(cuMemPoolDestroy(own));
	return 0;
}
