/*
 * e2e_mc - the multicast job the end-to-end tests checkpoint: NPROCS ranks,
 * rank r on fake device r, one POSIX multicast object created by rank 0 and
 * imported by the others through interposer tickets, a 4 MiB member per
 * rank, plus one unicast VMM allocation rank 0 shares with every rank.
 *
 *   e2e_mc DIR NPROCS MAPMB [--untracked R] [--private]
 *
 * Binds: rank 0 BindMem (v1); odd ranks BindAddr_v2 of the first half and
 * BindMem of the second, then unbind the second and bind it again by
 * address (PyTorch's pattern); other ranks BindMem_v2. Every rank maps MAPMB
 * MiB of the object (more than the 4 MiB requested when the fake rounds the
 * capacity up, FAKECUDA_MC_ROUND_MB). --untracked R: rank R tries to bind
 * private (untracked) memory instead, which must be refused, and leaves its
 * device unbound. --private: one process drives two devices with a handle
 * type 0 object and two members (NPROCS must be 1).
 *
 * Protocol as e2e_group: DIR/r<rank>.ready, commands in DIR/cmd, answers in
 * DIR/r<rank>.<seq>:
 *   verify G     every byte of every member this rank sees (but an --untracked
 *                rank's unbound one), of the multicast mapping and of the
 *                shared unicast allocation is word(G, i)
 * (the first command is "write 0 0": other ranks may still be binding
 * before they are ready)
 *   write R G    rank R writes word(G, i) through its multicast mapping and
 *                into the shared unicast allocation
 *   exit
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wl.h"

CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);

#define MiB	(1ul << 20)
#define MEMBER	(4 * MiB)
#define UNICAST (2 * MiB)

#define CK(x) WL_CK_DIE(x)

static uint32_t word(uint32_t g, size_t i)
{
	return g * 0x01000193u ^ (uint32_t)i * 2654435761u;
}

static CUdeviceptr reserve_map(CUmemGenericAllocationHandle h, size_t size, int ndev, int dev0)
{
	CUdeviceptr va;

	if (wl_map(h, size, dev0, ndev, &va))
		wl_die("%s", wl_why);
	return va;
}

static void member_on(int dev, CUmemGenericAllocationHandle *h, CUdeviceptr *va, size_t size)
{
	CUmemAllocationProp p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	CK(cuMemCreate(h, size, &p, 0));
	*va = reserve_map(*h, size, 1, dev);
}

static int check(CUdeviceptr va, size_t size, uint32_t g)
{
	uint32_t *b = malloc(size);
	int bad = -1;

	CK(cuMemcpyDtoH(b, va, size));
	for (size_t i = 0; i < size / 4 && bad < 0; i++)
		if (b[i] != word(g, i))
			bad = (int)i;
	free(b);
	return bad;
}

static void fill(CUdeviceptr va, size_t size, uint32_t g)
{
	uint32_t *b = malloc(size);

	for (size_t i = 0; i < size / 4; i++)
		b[i] = word(g, i);
	CK(cuMemcpyHtoD(va, b, size));
	free(b);
}

static int untracked = -1, priv;
static CUdeviceptr mva, memva[2], uva;

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	int bad;

	if (!strcmp(verb, "exit"))
		return WL_EXIT;
	if (!strcmp(verb, "verify")) {
		/* an untracked rank's member is not bound: multicast writes never reach it */
		if (wl_rank != untracked && (bad = check(memva[0], MEMBER, a)) >= 0)
			return wl_fail("member word %d", bad);
		if (priv && (bad = check(memva[1], MEMBER, a)) >= 0)
			return wl_fail("second member word %d", bad);
		if ((bad = check(mva, MEMBER, a)) >= 0)
			return wl_fail("multicast word %d", bad);
		if ((bad = check(uva, UNICAST, a)) >= 0)
			return wl_fail("unicast word %d", bad);
		snprintf(out, len, "ok mc %#llx member %#llx unicast %#llx", (unsigned long long)mva,
			 (unsigned long long)memva[0], (unsigned long long)uva);
		return 0;
	}
	if (!strcmp(verb, "write")) {
		if ((int)a == wl_rank) {
			fill(mva, MEMBER, b);
			fill(uva, UNICAST, b);
			CK(cuCtxSynchronize());
		}
		return 0;
	}
	return wl_fail("unknown verb %s", verb);
}

int main(int argc, char **argv)
{
	int nprocs, mapmb, peer[16];
	CUmemGenericAllocationHandle mc, mem[2], uni;
	CUcontext ctx;
	CUdevice dev;

	if (argc < 4)
		return 2;
	wl_prog = "e2e_mc";
	wl_dir = argv[1];
	nprocs = atoi(argv[2]);
	mapmb = atoi(argv[3]);
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--untracked") && i + 1 < argc)
			untracked = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--private"))
			priv = 1;
	}
	if (nprocs < 1 || nprocs > 16)
		return 2;
	if (wl_fork_ranks(nprocs, peer, NULL, WL_SUBREAPER) < 0 || wl_context(wl_rank, &dev, &ctx))
		wl_die("%s", wl_why);

	CUmulticastObjectProp mp = {0};
	mp.numDevices = priv ? 2 : (unsigned)nprocs;
	mp.size = MEMBER;
	mp.handleTypes = priv ? CU_MEM_HANDLE_TYPE_NONE : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (wl_rank == 0) {
		CUmemAllocationProp up = wl_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		int t, ut;

		CK(cuMulticastCreate(&mc, &mp));
		CK(cuMemCreate(&uni, UNICAST, &up, 0));
		if (!priv) {
			CK(cuMemExportToShareableHandle(&t, mc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			CK(cuMemExportToShareableHandle(&ut, uni, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			for (int r = 1; r < nprocs; r++)
				if (wl_send(peer[r], "", 1, t) || wl_send(peer[r], "", 1, ut))
					wl_die("send ticket: %s", wl_why);
			close(t);
			close(ut);
		}
	} else {
		char c;
		int t = wl_recv_fd(peer[0], &c, 1), ut = t < 0 ? -1 : wl_recv_fd(peer[0], &c, 1);

		if (t < 0 || ut < 0)
			wl_die("recv ticket: %s", wl_why);
		CK(cuMemImportFromShareableHandle(&mc, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CK(cuMemImportFromShareableHandle(&uni, (void *)(uintptr_t)ut,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(t);
		close(ut);
	}
	uva = reserve_map(uni, UNICAST, 1, wl_rank);
	CK(cuMulticastAddDevice(mc, wl_rank));
	if (priv)
		CK(cuMulticastAddDevice(mc, 1));
	member_on(wl_rank, &mem[0], &memva[0], MEMBER);
	if (priv)
		member_on(1, &mem[1], &memva[1], MEMBER);
	if (wl_rank == untracked) {
		CUmemAllocationProp p = wl_prop(wl_rank, CU_MEM_HANDLE_TYPE_NONE);
		CUmemGenericAllocationHandle ph;

		CK(cuMemCreate(&ph, MEMBER, &p, 0));
		if (cuMulticastBindMem(mc, 0, ph, 0, MEMBER, 0) != CUDA_ERROR_NOT_SUPPORTED)
			wl_die("binding untracked memory was not refused");
	} else if (wl_rank == 0) {
		CK(cuMulticastBindMem(mc, 0, mem[0], 0, MEMBER, 0));
		if (priv)
			CK(cuMulticastBindMem_v2(mc, 1, 0, mem[1], 0, MEMBER, 0));
	} else if (wl_rank % 2) {
		CK(cuMulticastBindAddr_v2(mc, wl_rank, 0, memva[0], MEMBER / 2, 0));
		CK(cuMulticastBindMem(mc, MEMBER / 2, mem[0], MEMBER / 2, MEMBER / 2, 0));
		CK(cuMulticastUnbind(mc, wl_rank, MEMBER / 2, MEMBER / 2));
		CK(cuMulticastBindAddr_v2(mc, wl_rank, MEMBER / 2, memva[0] + MEMBER / 2, MEMBER / 2, 0));
	} else {
		CK(cuMulticastBindMem_v2(mc, wl_rank, 0, mem[0], 0, MEMBER, 0));
	}
	mva = reserve_map(mc, (size_t)mapmb * MiB, priv ? 2 : 1, wl_rank);
	if (wl_ready("pid %d mc %#llx member %#llx unicast %#llx", getpid(), (unsigned long long)mva,
		     (unsigned long long)memva[0], (unsigned long long)uva))
		wl_die("%s", wl_why);
	wl_serve(command, 20);
	if (wl_rank == 0)
		wl_reap();
	return 0;
}
