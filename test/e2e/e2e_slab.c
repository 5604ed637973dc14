/*
 * e2e_slab - a job of many small cuMemAlloc buffers for the end-to-end
 * tests (the interposer carves them out of slabs, ipc.c). Rank 0 allocates
 * NP buffers of odd and round sizes (4 KiB, 64 KiB, 1..30000 bytes), frees
 * every third and allocates it again with another size, fills each with its
 * own pattern, and sends cuIpcGetMemHandle handles of two buffers that lie
 * inside slabs (not at a slab's start) to NPROCS-1 importers, forked before
 * any CUDA call, which open them.
 *
 *   e2e_slab DIR NPROCS
 *
 * Protocol as e2e_ipc (DIR/r<rank>.ready, DIR/cmd, DIR/r<rank>.<seq>):
 *   verify G   every byte of every buffer (rank 0) or of the two shared ones
 *              (importers): shared buffer 0 holds generation G, the rest
 *              generation 0; cuMemGetAddressRange of an inner address gives
 *              each buffer's own base and size. The answer names every
 *              address (a hash of all of them, and the shared ones).
 *   write R G  rank R writes generation G over shared buffer 0
 *   churn      rank 0 frees every odd unshared buffer (after a restore:
 *              free of restored pieces), checks that an address inside a
 *              freed one is no allocation, allocates them again with other
 *              sizes and fills them (generation 0)
 *   exit
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wl.h"

#define NP	 400
#define MAXPROCS 8
#define S0	 4 /* the shared buffers */
#define S1	 6

static int nprocs, churns;
static int peer[MAXPROCS];
static CUdeviceptr va[NP];
static size_t sz[NP];
static CUipcMemHandle handle[2];

static size_t size_of(int i, int round)
{
	switch ((i + round) % 4) {
	case 0:
		return 4096;
	case 1:
		return 65536;
	case 2:
		return 1 + (size_t)(i * 7919 + round * 31) % 30000;
	default:
		return 777 + (size_t)i + (size_t)round;
	}
}

struct key {
	int i;
	uint32_t gen;
};

static uint8_t byte(uint64_t j, const void *arg)
{
	const struct key *k = arg;

	return (uint8_t)(k->i * 131 + j * 7 + k->gen * 29 + (j >> 8));
}

static int fill(int i, CUdeviceptr p, size_t n, uint32_t gen)
{
	struct key k = {i, gen};

	return wl_fill_bytes(p, n, byte, &k);
}

static int check(int i, CUdeviceptr p, size_t n, uint32_t gen)
{
	struct key k = {i, gen};
	char what[64];

	snprintf(what, sizeof(what), "buffer %d (%zu bytes)", i, n);
	return wl_check_bytes(p, n, byte, &k, what) || wl_check_range(p, n, p + n / 2, what) ? -1 : 0;
}

static int xfer(int s, void *p, size_t n, int out)
{
	return out ? wl_send(s, p, n, -1) : wl_recv(s, p, n, NULL);
}

static int alloc_fill(int i, int round)
{
	sz[i] = size_of(i, round);
	if (cuMemAlloc(&va[i], sz[i]) != CUDA_SUCCESS)
		return wl_fail("cuMemAlloc(%zu) of buffer %d", sz[i], i);
	if (va[i] % 512)
		return wl_fail("buffer %d at %#llx is not 512-byte aligned", i, (unsigned long long)va[i]);
	return fill(i, va[i], sz[i], 0);
}

static int setup(void)
{
	CUcontext c0;
	CUdevice d0;

	if (cuInit(0) || cuDeviceGet(&d0, 0) || cuDevicePrimaryCtxRetain(&c0, d0) || cuCtxSetCurrent(c0))
		return wl_fail("cuInit/device 0");
	if (wl_rank)
		return 0;
	for (int i = 0; i < NP; i++)
		if (alloc_fill(i, 0))
			return -1;
	for (int i = 0; i < NP; i += 3) /* freed and allocated again */
		if (cuMemFree(va[i]) || alloc_fill(i, 1))
			return wl_fail("free and allocate again buffer %d: %s", i, wl_why);
	return 0;
}

static int do_churn(void)
{
	CUdeviceptr base;
	size_t got;

	if (wl_rank)
		return 0;
	churns++;
	for (int i = 1; i < NP; i += 2) {
		if (i == S0 || i == S1)
			continue;
		if (cuMemFree(va[i]) != CUDA_SUCCESS)
			return wl_fail("cuMemFree of restored buffer %d", i);
		if (cuMemFree(va[i]) != CUDA_ERROR_INVALID_VALUE)
			return wl_fail("second cuMemFree of buffer %d was not refused", i);
	}
	/* A freed piece is no allocation any more (pieces are disjoint, and
	 * nothing was allocated since). */
	if (cuMemGetAddressRange(&base, &got, va[1]) == CUDA_SUCCESS && base == va[1])
		return wl_fail("freed buffer 1 at %#llx still has an address range", (unsigned long long)va[1]);
	for (int i = 1; i < NP; i += 2)
		if (i != S0 && i != S1 && alloc_fill(i, 1 + churns))
			return -1;
	return 0;
}

static int verify(uint32_t gen)
{
	for (int i = 0; i < NP; i++) {
		if (wl_rank && i != S0 && i != S1)
			continue;
		if (check(i, va[i], sz[i], i == S0 ? gen : 0))
			return -1;
	}
	return 0;
}

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	uint64_t h = 0;
	int ret;

	if (!strcmp(verb, "verify"))
		ret = verify(a);
	else if (!strcmp(verb, "write"))
		ret = (int)a == wl_rank ? fill(S0, va[S0], sz[S0], b) : 0;
	else if (!strcmp(verb, "churn"))
		ret = do_churn();
	else if (!strcmp(verb, "exit"))
		ret = WL_EXIT;
	else
		ret = wl_fail("unknown command %s", verb);
	/* every answer names the addresses: a hash of all, and the shared ones */
	for (int i = 0; wl_rank == 0 && i < NP; i++)
		h = (h ^ va[i] ^ sz[i]) * 0x100000001b3ull;
	snprintf(out, len, "ok %016llx %#llx %#llx", (unsigned long long)h, (unsigned long long)va[S0],
		 (unsigned long long)va[S1]);
	return ret;
}

static int share(void)
{
	const int idx[2] = {S0, S1};

	for (int k = 0; k < 2; k++) {
		int i = idx[k];

		if (wl_rank == 0) {
			CUdeviceptr base;
			size_t got;
			if (cuIpcGetMemHandle(&handle[k], va[i]))
				return wl_fail("cuIpcGetMemHandle of buffer %d", i);
			/* An inner address is no allocation's base: refused. */
			if (cuIpcGetMemHandle(&handle[k], va[i] + 512) != CUDA_ERROR_INVALID_VALUE)
				return wl_fail("cuIpcGetMemHandle inside buffer %d was not refused", i);
			if (cuMemGetAddressRange(&base, &got, va[i]) || cuIpcGetMemHandle(&handle[k], base))
				return wl_fail("handle of buffer %d again", i);
			for (int r = 1; r < nprocs; r++)
				if (xfer(peer[r], &handle[k], sizeof(handle[k]), 1) ||
				    xfer(peer[r], &sz[i], sizeof(sz[i]), 1))
					return -1;
		} else {
			if (xfer(peer[0], &handle[k], sizeof(handle[k]), 0) || xfer(peer[0], &sz[i], sizeof(sz[i]), 0))
				return -1;
			if (cuIpcOpenMemHandle(&va[i], handle[k], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
				return wl_fail("cuIpcOpenMemHandle of buffer %d", i);
			if (check(i, va[i], sz[i], 0))
				return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	wl_prog = "e2e_slab";
	wl_dir = argv[1];
	nprocs = atoi(argv[2]);
	if (nprocs < 2 || nprocs > MAXPROCS)
		return 2;
	if (wl_fork_ranks(nprocs, peer, NULL, WL_PDEATHSIG) < 0 || setup() || share())
		return wl_failed(wl_prog);
	if (wl_ready("pid %d va %#llx %#llx", getpid(), (unsigned long long)va[S0], (unsigned long long)va[S1]))
		return 1;
	wl_serve(command, 20);
	if (wl_rank == 0)
		wl_reap();
	return 0;
}
