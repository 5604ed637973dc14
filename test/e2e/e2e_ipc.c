/*
 * e2e_ipc - a legacy-IPC CUDA job for the end-to-end tests, written as an
 * unmodified application would be: rank 0 cuMemAllocs NBUF buffers, fills
 * them, sends cuIpcGetMemHandle handles to NPROCS-1 importers (forked before
 * any CUDA call) that cuIpcOpenMemHandle each twice.
 *
 *   e2e_ipc DIR NPROCS [--two-devices]
 *
 * --two-devices: odd ranks run on device 1 and enable peer access to device
 * 0; rank 0 also enables peer access from device 1 to its device 0 memory.
 * Protocol as e2e_group (DIR/r<rank>.ready "pid <pid> va <va>...", DIR/cmd):
 *   verify G   buffer 0 starts with generation G, the rest has its pattern;
 *              addresses and sizes (cuMemGetAddressRange) unchanged; with
 *              two devices, device 1 has read-write access to every buffer
 *   write R G  rank R writes generation G at the start of buffer 0
 *   fresh      rank 0 allocates and sends a new buffer; importers open it,
 *              check it and close it
 *   reopen     importers open buffer 0's handle again (same address), close
 *   exit
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wl.h"

#define NBUF	 2
#define MAXPROCS 8
#define HEAD	 4096

static const size_t buf_size[NBUF] = {3u << 20 | 4096, 1u << 20};
static int nprocs, two;
static int peer[MAXPROCS];
static CUdeviceptr va[NBUF];
static CUipcMemHandle handle[NBUF];

struct key {
	int b;
	size_t from; /* word index of the first word written */
	uint32_t gen;
};

static uint32_t word(uint64_t j, const void *arg)
{
	const struct key *k = arg;
	size_t i = k->from + j;

	return i < HEAD / 4 ? k->gen * 977u + (uint32_t)i : (uint32_t)(k->b * 0x9e3779b9u) ^ (uint32_t)i;
}

/* Write bytes [from, to) of buffer b's pattern of generation gen. */
static int fill(int b, CUdeviceptr p, size_t from, size_t to, uint32_t gen)
{
	struct key k = {b, from / 4, gen};

	return wl_fill_words(p + from, (to - from) / 4, word, &k);
}

static int check(int b, CUdeviceptr p, size_t size, uint32_t gen)
{
	struct key k = {b, 0, gen};
	char what[32];

	snprintf(what, sizeof(what), "buffer %d", b);
	if (wl_check_words(p, size / 4, word, &k, what) || wl_check_range(p, size, p + 64, what))
		return -1;
	if (two) {
		CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
		unsigned long long f = 0;
		if (cuMemGetAccess(&f, &l1, p) || f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return wl_fail("buffer %d: device 1 has access %llu", b, f);
	}
	return 0;
}

static int xfer(int s, void *p, size_t n, int out)
{
	return out ? wl_send(s, p, n, -1) : wl_recv(s, p, n, NULL);
}

static int setup(void)
{
	CUcontext c0, c1;
	CUdevice d0, d1;

	if (cuInit(0) || cuDeviceGet(&d0, 0) || cuDevicePrimaryCtxRetain(&c0, d0))
		return wl_fail("cuInit/device 0");
	if (two) {
		if (cuDeviceGet(&d1, 1) || cuDevicePrimaryCtxRetain(&c1, d1))
			return wl_fail("device 1");
		/* device 1 may access device 0's memory */
		if (cuCtxSetCurrent(c1) || cuCtxEnablePeerAccess(c0, 0))
			return wl_fail("peer access 1 -> 0");
	}
	if (cuCtxSetCurrent(two && wl_rank % 2 ? c1 : c0))
		return wl_fail("context");
	return 0;
}

static int open_all(int b, CUdeviceptr *p)
{
	CUdeviceptr q;

	if (cuIpcOpenMemHandle(p, handle[b], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
	    cuIpcOpenMemHandle(&q, handle[b], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || q != *p)
		return wl_fail("cuIpcOpenMemHandle of buffer %d", b);
	return cuIpcCloseMemHandle(q) ? wl_fail("close of the second open of buffer %d", b) : 0;
}

static int do_fresh(void)
{
	CUipcMemHandle h;
	CUdeviceptr p;
	int ret = 0;

	if (wl_rank == 0) {
		if (cuMemAlloc(&p, 2u << 20) || fill(7, p, 0, 2u << 20, 5) || cuIpcGetMemHandle(&h, p))
			return wl_fail("fresh buffer");
		for (int r = 1; r < nprocs; r++)
			if (xfer(peer[r], &h, sizeof(h), 1))
				return -1;
		for (int r = 1; r < nprocs; r++) {
			char c;
			if (xfer(peer[r], &c, 1, 0) || c != 'y')
				ret = wl_fail("rank %d could not open the fresh buffer", r);
		}
		return cuMemFree(p) ? wl_fail("cuMemFree") : ret;
	}
	char c = 'y';
	if (xfer(peer[0], &h, sizeof(h), 0))
		return -1;
	if (cuIpcOpenMemHandle(&p, h, 0) || check(7, p, 2u << 20, 5) || cuIpcCloseMemHandle(p))
		c = 'n';
	return xfer(peer[0], &c, 1, 1) || c != 'y' ? -1 : 0;
}

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	int ret = 0, n;

	if (!strcmp(verb, "verify")) {
		for (int k = 0; k < NBUF && !ret; k++)
			ret = check(k, va[k], buf_size[k], k ? 0 : a);
	} else if (!strcmp(verb, "write")) {
		ret = (int)a == wl_rank ? fill(0, va[0], 0, HEAD, b) : 0;
	} else if (!strcmp(verb, "fresh")) {
		ret = do_fresh();
	} else if (!strcmp(verb, "reopen")) {
		CUdeviceptr p;
		if (wl_rank && (cuIpcOpenMemHandle(&p, handle[0], 0) || p != va[0] || cuIpcCloseMemHandle(p)))
			ret = wl_fail("reopen of buffer 0 gave %#llx, not %#llx", (unsigned long long)p,
				      (unsigned long long)va[0]);
	} else if (!strcmp(verb, "exit")) {
		ret = WL_EXIT;
	} else {
		ret = wl_fail("unknown command %s", verb);
	}
	/* every answer names the buffers' addresses */
	n = snprintf(out, len, "ok");
	for (int k = 0; k < NBUF; k++)
		n += snprintf(out + n, len - (size_t)n, " %#llx", (unsigned long long)va[k]);
	return ret;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	wl_prog = "e2e_ipc";
	wl_dir = argv[1];
	nprocs = atoi(argv[2]);
	two = argc > 3 && !strcmp(argv[3], "--two-devices");
	if (nprocs < 2 || nprocs > MAXPROCS)
		return 2;
	if (wl_fork_ranks(nprocs, peer, NULL, WL_PDEATHSIG) < 0 || setup())
		return wl_failed(wl_prog);
	for (int b = 0; b < NBUF; b++) {
		if (wl_rank == 0) {
			if (cuMemAlloc(&va[b], buf_size[b]) || fill(b, va[b], 0, buf_size[b], 0) ||
			    cuIpcGetMemHandle(&handle[b], va[b])) {
				wl_fail("buffer %d", b);
				return wl_failed(wl_prog);
			}
			for (int r = 1; r < nprocs; r++)
				if (xfer(peer[r], &handle[b], sizeof(handle[b]), 1))
					return wl_failed(wl_prog);
		} else if (xfer(peer[0], &handle[b], sizeof(handle[b]), 0) || open_all(b, &va[b])) {
			return wl_failed(wl_prog);
		}
	}
	if (wl_ready("pid %d va %#llx %#llx", getpid(), (unsigned long long)va[0], (unsigned long long)va[1]))
		return 1;
	wl_serve(command, 20);
	if (wl_rank == 0)
		wl_reap();
	return 0;
}
