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
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define NBUF	 2
#define MAXPROCS 8
#define HEAD	 4096

static const size_t buf_size[NBUF] = {3u << 20 | 4096, 1u << 20};
static const char *dir;
static int rank, nprocs, two;
static int peer[MAXPROCS];
static CUdeviceptr va[NBUF];
static CUipcMemHandle handle[NBUF];
static char why[256];

static int failf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return -1;
}

static uint32_t word(int b, size_t i, uint32_t gen)
{
	return i < HEAD / 4 ? gen * 977u + (uint32_t)i : (uint32_t)(b * 0x9e3779b9u) ^ (uint32_t)i;
}

static int fill(int b, CUdeviceptr p, size_t size, size_t from, size_t to, uint32_t gen)
{
	uint32_t *w = malloc(size);
	int ret = 0;

	if (!w)
		return failf("out of memory");
	if (cuMemcpyDtoH(w, p, size) != CUDA_SUCCESS)
		ret = failf("read of buffer %d", b);
	for (size_t i = from / 4; i < to / 4; i++)
		w[i] = word(b, i, gen);
	if (!ret && cuMemcpyHtoD(p, w, size) != CUDA_SUCCESS)
		ret = failf("write of buffer %d", b);
	free(w);
	return ret;
}

static int check(int b, CUdeviceptr p, size_t size, uint32_t gen)
{
	uint32_t *w = malloc(size);
	CUdeviceptr base = 0;
	size_t got = 0;
	int ret = 0;

	if (!w)
		return failf("out of memory");
	if (cuMemcpyDtoH(w, p, size) != CUDA_SUCCESS)
		ret = failf("read of buffer %d at %#llx", b, (unsigned long long)p);
	for (size_t i = 0; !ret && i < size / 4; i++)
		if (w[i] != word(b, i, gen))
			ret = failf("buffer %d word %zu: %#x, expected %#x", b, i, w[i], word(b, i, gen));
	free(w);
	if (!ret && (cuMemGetAddressRange(&base, &got, p + 64) || base != p || got != size))
		ret = failf("buffer %d: address range %#llx+%zu, expected %#llx+%zu", b, (unsigned long long)base, got,
			    (unsigned long long)p, size);
	if (!ret && two) {
		CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
		unsigned long long f = 0;
		if (cuMemGetAccess(&f, &l1, p) || f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			ret = failf("buffer %d: device 1 has access %llu", b, f);
	}
	return ret;
}

static int xfer(int s, void *p, size_t n, int out)
{
	return (size_t)(out ? write(s, p, n) : read(s, p, n)) == n ? 0 : failf("socket");
}

static int setup(void)
{
	CUcontext c0, c1;
	CUdevice d0, d1;

	if (cuInit(0) || cuDeviceGet(&d0, 0) || cuDevicePrimaryCtxRetain(&c0, d0))
		return failf("cuInit/device 0");
	if (two) {
		if (cuDeviceGet(&d1, 1) || cuDevicePrimaryCtxRetain(&c1, d1))
			return failf("device 1");
		/* device 1 may access device 0's memory */
		if (cuCtxSetCurrent(c1) || cuCtxEnablePeerAccess(c0, 0))
			return failf("peer access 1 -> 0");
	}
	if (cuCtxSetCurrent(two && rank % 2 ? c1 : c0))
		return failf("context");
	return 0;
}

static int open_all(int b, CUdeviceptr *p)
{
	CUdeviceptr q;

	if (cuIpcOpenMemHandle(p, handle[b], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
	    cuIpcOpenMemHandle(&q, handle[b], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || q != *p)
		return failf("cuIpcOpenMemHandle of buffer %d", b);
	return cuIpcCloseMemHandle(q) ? failf("close of the second open of buffer %d", b) : 0;
}

static int do_fresh(void)
{
	CUipcMemHandle h;
	CUdeviceptr p;
	int ret = 0;

	if (rank == 0) {
		if (cuMemAlloc(&p, 2u << 20) || fill(7, p, 2u << 20, 0, 2u << 20, 5) || cuIpcGetMemHandle(&h, p))
			return failf("fresh buffer");
		for (int r = 1; r < nprocs; r++)
			if (xfer(peer[r], &h, sizeof(h), 1))
				return -1;
		for (int r = 1; r < nprocs; r++) {
			char c;
			if (xfer(peer[r], &c, 1, 0) || c != 'y')
				ret = failf("rank %d could not open the fresh buffer", r);
		}
		return cuMemFree(p) ? failf("cuMemFree") : ret;
	}
	char c = 'y';
	if (xfer(peer[0], &h, sizeof(h), 0))
		return -1;
	if (cuIpcOpenMemHandle(&p, h, 0) || check(7, p, 2u << 20, 5) || cuIpcCloseMemHandle(p))
		c = 'n';
	return xfer(peer[0], &c, 1, 1) || c != 'y' ? -1 : 0;
}

static void answer(long seq, int ok)
{
	char path[4096], tmp[4200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/r%d.%ld", dir, rank, seq);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return;
	if (ok) {
		fprintf(f, "ok");
		for (int b = 0; b < NBUF; b++)
			fprintf(f, " %#llx", (unsigned long long)va[b]);
		fprintf(f, "\n");
	} else {
		fprintf(f, "fail %s\n", why);
	}
	fclose(f);
	rename(tmp, path);
}

static void serve(void)
{
	char path[4096], line[256];
	long last = 0;

	snprintf(path, sizeof(path), "%s/cmd", dir);
	for (;;) {
		char verb[32] = "";
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
		if (!strcmp(verb, "verify")) {
			for (int k = 0; k < NBUF && !ret; k++)
				ret = check(k, va[k], buf_size[k], k ? 0 : a);
		} else if (!strcmp(verb, "write")) {
			ret = (int)a == rank ? fill(0, va[0], buf_size[0], 0, HEAD, b) : 0;
		} else if (!strcmp(verb, "fresh")) {
			ret = do_fresh();
		} else if (!strcmp(verb, "reopen")) {
			CUdeviceptr p;
			if (rank && (cuIpcOpenMemHandle(&p, handle[0], 0) || p != va[0] || cuIpcCloseMemHandle(p)))
				ret = failf("reopen of buffer 0 gave %#llx, not %#llx", (unsigned long long)p,
					    (unsigned long long)va[0]);
		} else if (!strcmp(verb, "exit")) {
			answer(seq, 1);
			while (rank == 0 && wait(NULL) > 0)
				;
			exit(0);
		} else {
			ret = failf("unknown command %s", verb);
		}
		answer(seq, ret == 0);
	}
}

int main(int argc, char **argv)
{
	char path[4096];
	FILE *f;

	if (argc < 3)
		return 2;
	dir = argv[1];
	nprocs = atoi(argv[2]);
	two = argc > 3 && !strcmp(argv[3], "--two-devices");
	if (nprocs < 2 || nprocs > MAXPROCS)
		return 2;
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
			break;
		}
		close(sv[1]);
		peer[r] = sv[0];
	}
	if (setup())
		goto fail;
	for (int b = 0; b < NBUF; b++) {
		if (rank == 0) {
			if (cuMemAlloc(&va[b], buf_size[b]) || fill(b, va[b], buf_size[b], 0, buf_size[b], 0) ||
			    cuIpcGetMemHandle(&handle[b], va[b])) {
				failf("buffer %d", b);
				goto fail;
			}
			for (int r = 1; r < nprocs; r++)
				if (xfer(peer[r], &handle[b], sizeof(handle[b]), 1))
					goto fail;
		} else if (xfer(peer[0], &handle[b], sizeof(handle[b]), 0) || open_all(b, &va[b])) {
			goto fail;
		}
	}
	snprintf(path, sizeof(path), "%s/r%d.ready", dir, rank);
	f = fopen(path, "w");
	if (!f)
		return 1;
	fprintf(f, "pid %d va %#llx %#llx\n", getpid(), (unsigned long long)va[0], (unsigned long long)va[1]);
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
	fprintf(stderr, "e2e_ipc rank %d: %s\n", rank, why);
	return 1;
}
