/*
 * gpu_microbench - the interposition cost: tight loops of CUDA calls the
 * interposer wraps, timed in this process. run.sh runs it with and without
 * LD_PRELOAD=libcuinterpose.so and prints the ratios.
 *
 *   gpu_microbench [ITERS] [REPS]     (default 200000 and 5)
 *
 * Prints one line per loop: "<name> <median ns per iteration> <min> <max>".
 *   props       cuMemGetAllocationPropertiesFromHandle on a POSIX-capable
 *               VMM handle (a tracked entry point: handle lookup)
 *   copy+launch cuMemcpyHtoDAsync of 4 bytes + cuLaunchKernel (fake_add_u32
 *               on 1 word), synchronized every 256 iterations (the API gate)
 *   launch      cuLaunchKernel alone, synchronized every 256 iterations
 *   copy+launch-vmm, launch-vmm
 *               the same two on a buffer the program maps itself through
 *               the VMM API (cuMemCreate + cuMemMap): the interposer backs
 *               cuMemAlloc with VMM memory, so against the plain run these
 *               say how much of the two above is the driver's own cost of
 *               VMM memory rather than the interposer's
 *   launch-null cuLaunchKernel of a NULL function, which the driver refuses
 *               (CUDA_ERROR_INVALID_HANDLE) without device work: the
 *               interposer's gate against the driver's cheapest path
 *
 *   gpu_microbench --small-allocs [N]                 (default 1000)
 *   gpu_microbench --small-allocs-ratio LIBCUINTERPOSE [N]
 *
 * Device memory that N small cuMemAlloc calls take (cuMemGetInfo before and
 * after), for 4 KiB and for 64 KiB each: --small-allocs measures this
 * process as it runs ("small-allocs <bytes each> <N> <used bytes>");
 * --small-allocs-ratio runs that twice, without LD_PRELOAD and with
 * LD_PRELOAD=LIBCUINTERPOSE, prints native, interposed and the ratio per
 * size, and exits 1 when a ratio is above 1.1 (issue 22: the interposer
 * packs small requests into slabs as the driver does).
 */
#include <cuda.h>
#include <stdint.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels_fatbin.h"

#define CK(call)                                                                            \
	do {                                                                                \
		CUresult r_ = (call);                                                       \
		if (r_ != CUDA_SUCCESS) {                                                   \
			fprintf(stderr, "gpu_microbench: %s failed: %d\n", #call, (int)r_); \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static CUmemGenericAllocationHandle h;
static CUstream s;
static CUfunction k_add;
static CUdeviceptr buf, abuf, vbuf;
static uint32_t host_word = 7;

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void loop_props(long n)
{
	CUmemAllocationProp p;

	for (long i = 0; i < n; i++)
		CK(cuMemGetAllocationPropertiesFromHandle(&p, h));
}

static void launch_one(void)
{
	/* buf is the cuMemAlloc buffer (abuf) or the VMM one (vbuf) */
	size_t n = 1;
	uint32_t d = 1;
	void *args[] = {&buf, &n, &d};

	CK(cuLaunchKernel(k_add, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void loop_copy_launch(long n)
{
	for (long i = 0; i < n; i++) {
		CK(cuMemcpyHtoDAsync(buf + 4, &host_word, 4, s));
		launch_one();
		if ((i & 255) == 255)
			CK(cuStreamSynchronize(s));
	}
	CK(cuStreamSynchronize(s));
}

static void loop_launch(long n)
{
	for (long i = 0; i < n; i++) {
		launch_one();
		if ((i & 255) == 255)
			CK(cuStreamSynchronize(s));
	}
	CK(cuStreamSynchronize(s));
}

static void loop_launch_null(long n)
{
	for (long i = 0; i < n; i++)
		if (cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL) == CUDA_SUCCESS) {
			fprintf(stderr, "gpu_microbench: a NULL kernel was launched\n");
			exit(1);
		}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void bench(const char *name, void (*fn)(long), long iters, int reps)
{
	double t[64];

	fn(iters / 10 + 1); /* warm up */
	for (int r = 0; r < reps; r++) {
		double t0 = now_ns();
		fn(iters);
		t[r] = (now_ns() - t0) / (double)iters;
	}
	qsort(t, (size_t)reps, sizeof(t[0]), cmp);
	printf("%s %.1f %.1f %.1f\n", name, t[reps / 2], t[0], t[reps - 1]);
	fflush(stdout);
}

static const size_t small_sizes[2] = {4096, 65536};

/* N allocations of each small size in this process: used bytes, printed. */
static int small_allocs(long n)
{
	CUdeviceptr *v = calloc((size_t)n, sizeof(*v));
	CUdevice dev;
	CUcontext ctx;
	size_t f0, f1, t;

	if (!v)
		return 1;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	for (int k = 0; k < 2; k++) {
		CK(cuCtxSynchronize());
		CK(cuMemGetInfo(&f0, &t));
		for (long i = 0; i < n; i++)
			CK(cuMemAlloc(&v[i], small_sizes[k]));
		CK(cuCtxSynchronize());
		CK(cuMemGetInfo(&f1, &t));
		printf("small-allocs %zu %ld %zu\n", small_sizes[k], n, f0 > f1 ? f0 - f1 : 0);
		for (long i = 0; i < n; i++)
			CK(cuMemFree(v[i]));
	}
	free(v);
	return 0;
}

/* Run --small-allocs natively (preload 0) or interposed; used[] filled. */
static int small_run(const char *lib, long n, size_t used[2])
{
	char cmd[8192], exe[4096], line[256];
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	FILE *p;
	int got = 0;

	if (len <= 0)
		return -1;
	exe[len] = 0;
	if (lib)
		snprintf(cmd, sizeof(cmd), "env LD_PRELOAD='%s' '%s' --small-allocs %ld", lib, exe, n);
	else
		snprintf(cmd, sizeof(cmd), "env -u LD_PRELOAD '%s' --small-allocs %ld", exe, n);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof(line), p)) {
		size_t each, u;
		long cnt;
		if (sscanf(line, "small-allocs %zu %ld %zu", &each, &cnt, &u) == 3)
			for (int k = 0; k < 2; k++)
				if (each == small_sizes[k]) {
					used[k] = u;
					got++;
				}
	}
	return pclose(p) == 0 && got == 2 ? 0 : -1;
}

static int small_ratio(const char *lib, long n)
{
	size_t nat[2], ours[2];
	int bad = 0;

	if (small_run(NULL, n, nat) || small_run(lib, n, ours)) {
		fprintf(stderr, "gpu_microbench: a --small-allocs run failed\n");
		return 2;
	}
	for (int k = 0; k < 2; k++) {
		double r = nat[k] ? (double)ours[k] / (double)nat[k] : 0;
		printf("small-allocs %ld x %zu KiB: native %.1f MiB, interposed %.1f MiB, ratio %.3f%s\n", n,
		       small_sizes[k] >> 10, nat[k] / 1048576.0, ours[k] / 1048576.0, r,
		       r > 1.1 || !nat[k] ? "  (above 1.1x)" : "");
		bad |= r > 1.1 || !nat[k];
	}
	return bad;
}

int main(int argc, char **argv)
{
	long iters;

	if (argc > 1 && !strcmp(argv[1], "--small-allocs"))
		return small_allocs(argc > 2 ? atol(argv[2]) : 1000);
	if (argc > 2 && !strcmp(argv[1], "--small-allocs-ratio"))
		return small_ratio(argv[2], argc > 3 ? atol(argv[3]) : 1000);
	iters = argc > 1 ? atol(argv[1]) : 200000;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	CUmemAllocationProp p;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	size_t gran;

	if (iters < 1 || reps < 1 || reps > 64)
		return fprintf(stderr, "usage: gpu_microbench [ITERS] [REPS<=64]\n"), 2;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CK(cuMemCreate(&h, gran, &p, 0));
	CK(cuMemAlloc(&abuf, 4096));
	{
		CUmemAccessDesc acc = {.location = p.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

		CK(cuMemAddressReserve(&vbuf, gran, 0, 0, 0));
		CK(cuMemMap(vbuf, gran, 0, h, 0));
		CK(cuMemSetAccess(vbuf, gran, &acc, 1));
	}
	buf = abuf;
	CK(cuModuleLoadData(&mod, kernels_fatbin));
	CK(cuModuleGetFunction(&k_add, mod, "fake_add_u32"));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	bench("props", loop_props, iters, reps);
	bench("copy+launch", loop_copy_launch, iters / 4 + 1, reps);
	bench("launch", loop_launch, iters / 4 + 1, reps);
	buf = vbuf;
	bench("copy+launch-vmm", loop_copy_launch, iters / 4 + 1, reps);
	bench("launch-vmm", loop_launch, iters / 4 + 1, reps);
	bench("launch-null", loop_launch_null, iters, reps);
	return 0;
}
