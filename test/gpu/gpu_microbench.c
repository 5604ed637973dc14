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
 */
#include <cuda.h>
#include <stdint.h>
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
static CUdeviceptr buf;
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

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 200000;
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
	CK(cuMemAlloc(&buf, 4096));
	CK(cuModuleLoadData(&mod, kernels_fatbin));
	CK(cuModuleGetFunction(&k_add, mod, "fake_add_u32"));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	bench("props", loop_props, iters, reps);
	bench("copy+launch", loop_copy_launch, iters / 4 + 1, reps);
	bench("launch", loop_launch, iters / 4 + 1, reps);
	return 0;
}
