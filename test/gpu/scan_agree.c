/*
 * scan_agree - the chunk scan kernel (carrier/chunkscan_kernel.cu, the PTX
 * embedded in the carrier as cuip_chunkscan_ptx) against its host
 * reference, cuip_chunkscan_host (carrier/chunkscan.h), on a real GPU, then
 * its speed.
 *
 *   scan_agree [--size MiB] [--bench GiB] [--seed N]   (default 1024, 16, time)
 *
 * Agreement: SIZE MiB of random data with zero regions (a zero 64 MiB, zero
 * 64 KiB runs, a 1 MiB run zero but for its last byte) is scanned with
 * chunk sizes 64 KiB, 1 MiB, 4 MiB, 64 KiB + 4, 1000 bytes and 256 MiB, at
 * bases offset 0, 16 and 3 (unaligned: the byte path), with random keys
 * and with the edge keys 1 and p - 1; then 64 single bits are flipped at
 * random positions (host and device) and every chunk size is scanned
 * again.  Every chunk's (h0, h1, nonzero) must equal the host's on the
 * same bytes; the chunks holding a flip must differ from before.
 * Speed: BENCH GiB of zeros, then of random data (the agreement buffer
 * copied over), scanned with 64 KiB, 1 MiB, 4 MiB and 256 MiB chunks,
 * timed with events: "bench zeros|random CHUNK GB/s".
 * Exit 0 only if everything agreed. Built by build.sh; runs on the fake
 * driver too (fakecuda-run scan_agree --size 64 --bench 0).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chunkscan.h"

#define MiB (1ull << 20)

#define CK(call)                                                                                            \
	do {                                                                                                \
		CUresult r_ = (call);                                                                       \
		if (r_ != CUDA_SUCCESS) {                                                                   \
			const char *n_ = NULL;                                                              \
			cuGetErrorName(r_, &n_);                                                            \
			fprintf(stderr, "scan_agree: %s failed: %s (%d)\n", #call, n_ ? n_ : "?", (int)r_); \
			exit(2);                                                                            \
		}                                                                                           \
	} while (0)

static uint64_t rng;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint64_t rand_key(void)
{
	uint64_t k;

	do
		k = next() & CUIP_P61;
	while (k == 0 || k == CUIP_P61);
	return k;
}

static CUfunction scan;
static long failures;

/* The host side of one scan: chunks [c0, c1) of host[0, size), threaded. */
struct job {
	const unsigned char *host;
	uint64_t size, c0, c1;
	unsigned cs;
	const uint64_t *key, *dev;
	long bad;
};

static void *check_chunks(void *arg)
{
	struct job *j = arg;

	for (uint64_t c = j->c0; c < j->c1; c++) {
		uint64_t want[3], start = c * j->cs, len = j->size - start < j->cs ? j->size - start : j->cs;

		cuip_chunkscan_host(j->host + start, len, j->key, want);
		if (memcmp(want, j->dev + 3 * c, sizeof(want))) {
			if (j->bad++ < 5)
				fprintf(stderr,
					"scan_agree: MISMATCH chunk %llu (%llu bytes of %u-byte chunks): device %llx "
					"%llx "
					"%llu host %llx %llx %llu\n",
					(unsigned long long)c, (unsigned long long)len, j->cs,
					(unsigned long long)j->dev[3 * c], (unsigned long long)j->dev[3 * c + 1],
					(unsigned long long)j->dev[3 * c + 2], (unsigned long long)want[0],
					(unsigned long long)want[1], (unsigned long long)want[2]);
		}
	}
	return NULL;
}

static CUresult launch(CUdeviceptr base, unsigned long long size, unsigned cs, const uint64_t key[2], CUdeviceptr out,
		       CUstream st)
{
	unsigned long long k0 = key[0], k1 = key[1];
	void *args[] = {&base, &size, &cs, &k0, &k1, &out};

	return cuLaunchKernel(scan, (unsigned)((size + cs - 1) / cs), 1, 1, CUIP_CHUNKSCAN_THREADS, 1, 1, 0, st, args,
			      NULL);
}

/* Scans device [d, d+size) (host holds the same bytes), compares every chunk; the results in res. */
static void agree(CUdeviceptr d, const unsigned char *host, uint64_t size, unsigned cs, const uint64_t key[2],
		  CUdeviceptr out, uint64_t *res)
{
	uint64_t n = (size + cs - 1) / cs;
	long nt = sysconf(_SC_NPROCESSORS_ONLN), bad = 0;
	struct job jobs[64];
	pthread_t th[64];

	if (nt < 1)
		nt = 1;
	if (nt > 64)
		nt = 64;
	CK(launch(d, size, cs, key, out, NULL));
	CK(cuCtxSynchronize());
	CK(cuMemcpyDtoH(res, out, 24 * n));
	for (long t = 0; t < nt; t++) {
		jobs[t] = (struct job){host, size, n * t / nt, n * (t + 1) / nt, cs, key, res, 0};
		if (pthread_create(&th[t], NULL, check_chunks, &jobs[t]))
			check_chunks(&jobs[t]), th[t] = 0;
	}
	for (long t = 0; t < nt; t++) {
		if (th[t])
			pthread_join(th[t], NULL);
		bad += jobs[t].bad;
	}
	printf("agree chunk %9u base +%-2llu keys %016llx %016llx: %llu chunks, %ld differ\n", cs,
	       (unsigned long long)(d & 15), (unsigned long long)key[0], (unsigned long long)key[1],
	       (unsigned long long)n, bad);
	failures += bad;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void bench(const char *what, CUdeviceptr d, uint64_t size, CUdeviceptr out, const uint64_t key[2])
{
	static const unsigned sizes[] = {64 << 10, 1 << 20, 4 << 20, 256 << 20};
	CUevent e0, e1;

	CK(cuEventCreate(&e0, 0));
	CK(cuEventCreate(&e1, 0));
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		float ms = 0, best = 1e30f;

		CK(launch(d, size, sizes[i], key, out, NULL)); /* warm */
		for (int rep = 0; rep < 3; rep++) {
			CK(cuEventRecord(e0, NULL));
			CK(launch(d, size, sizes[i], key, out, NULL));
			CK(cuEventRecord(e1, NULL));
			CK(cuEventSynchronize(e1));
			CK(cuEventElapsedTime(&ms, e0, e1));
			if (ms < best)
				best = ms;
		}
		printf("bench %-6s %9u-byte chunks, %llu GiB: %.1f GB/s (%.2f ms)\n", what, sizes[i],
		       (unsigned long long)(size >> 30), size / (best * 1e-3) / 1e9, best);
	}
	CK(cuEventDestroy(e0));
	CK(cuEventDestroy(e1));
}

int main(int argc, char **argv)
{
	static const unsigned sizes[] = {64 << 10, 1 << 20, 4 << 20, (64 << 10) + 4, 1000, 256 << 20};
	static const unsigned offs[] = {0, 16, 3};
	uint64_t size_mb = 1024, bench_gb = 16, seed = (uint64_t)time(NULL);
	uint64_t size, slack = 4096, keys[2], edge[2] = {1, CUIP_P61 - 1}, *res, *before, flips[64];
	unsigned char *host;
	CUdeviceptr d, out;
	CUcontext ctx;
	CUmodule mod;
	CUdevice dev;
	int major = 0, minor = 0;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--size"))
			size_mb = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--bench"))
			bench_gb = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 0);
		else {
			fprintf(stderr, "usage: scan_agree [--size MiB] [--bench GiB] [--seed N]\n");
			return 2;
		}
	}
	if (size_mb < 2)
		size_mb = 2;
	size = size_mb * MiB;
	rng = seed * 0x9e3779b97f4a7c15ull | 1;
	printf("scan_agree: %llu MiB, seed %llu, bench %llu GiB\n", (unsigned long long)size_mb,
	       (unsigned long long)seed, (unsigned long long)bench_gb);
	keys[0] = rand_key();
	keys[1] = rand_key();

	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
	CK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
	double t_load = now_s();
	{
		CUresult r = cuModuleLoadData(&mod, cuip_chunkscan_ptx);

		if (r != CUDA_SUCCESS) {
			/* the JIT's log, through cuModuleLoadDataEx where the driver has it */
			CUresult (*ex)(CUmodule *, const void *, unsigned, CUjit_option *, void **) = NULL;
			char log[8192] = "";
			CUjit_option o[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
			void *v[] = {log, (void *)(uintptr_t)sizeof(log)};

			if (!cuGetProcAddress("cuModuleLoadDataEx", (void **)&ex, 12000, 0, NULL) && ex)
				ex(&mod, cuip_chunkscan_ptx, 2, o, v);
			fprintf(stderr, "scan_agree: cuModuleLoadData of the PTX failed: %d\n%s\n", (int)r, log);
			return 2;
		}
	}
	CK(cuModuleGetFunction(&scan, mod, CUIP_CHUNKSCAN_KERNEL));
	/* the first load on a machine JIT-compiles the PTX; later ones find it
	 * in the driver's compute cache (~/.nv/ComputeCache) */
	printf("device sm_%d%d, PTX %zu bytes loaded in %.3f s\n", major, minor, strlen(cuip_chunkscan_ptx),
	       now_s() - t_load);

	host = malloc(size + slack);
	res = malloc(24 * ((size + 999) / 1000 + 1));
	before = malloc(24 * ((size + 999) / 1000 + 1));
	if (!host || !res || !before) {
		fprintf(stderr, "scan_agree: out of host memory\n");
		return 2;
	}
	for (uint64_t i = 0; i < size + slack; i += 8) {
		uint64_t v = next();

		memcpy(host + i, &v, 8);
	}
	memset(host + 64 * MiB % size, 0, size >= 256 * MiB ? 64 * MiB : MiB); /* a zero region */
	for (uint64_t at = 5 * MiB; at + 65536 < size; at += 97 * MiB)
		memset(host + at, 0, 65536); /* zero 64 KiB runs */
	memset(host + size / 2, 0, MiB);     /* zero but for its last byte */
	host[size / 2 + MiB - 1] = 1;
	CK(cuMemAlloc(&d, size + slack));
	CK(cuMemAlloc(&out, 24 * ((size + 999) / 1000 + 1)));
	CK(cuMemcpyHtoD(d, host, size + slack));

	for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			agree(d + offs[o], host + offs[o], size - offs[o], sizes[i], keys, out, res);
	agree(d, host, size, 1 << 20, edge, out, res);
	agree(d + 3, host + 3, size - 3, 65536, edge, out, res);

	/* single-bit flips: the chunks holding them change, every chunk agrees */
	for (int f = 0; f < 64; f++)
		flips[f] = next() % (8 * size);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		unsigned cs = sizes[i];

		agree(d, host, size, cs, keys, out, before);
		for (int f = 0; f < 64; f++) {
			uint64_t byte = flips[f] / 8;

			host[byte] ^= (unsigned char)(1u << (flips[f] % 8));
			CK(cuMemcpyHtoD(d + byte, host + byte, 1));
		}
		agree(d, host, size, cs, keys, out, res);
		for (int f = 0; f < 64; f++) {
			uint64_t c = flips[f] / 8 / cs;
			int twice = 0;

			for (int g = 0; g < 64; g++)
				twice += flips[g] / 8 / cs == c;
			if (twice == 1 && !memcmp(res + 3 * c, before + 3 * c, 16)) {
				fprintf(stderr, "scan_agree: flip of bit %llu left chunk %llu's hashes unchanged\n",
					(unsigned long long)flips[f], (unsigned long long)c);
				failures++;
			}
		}
		/* flip back for the next chunk size */
		for (int f = 0; f < 64; f++) {
			uint64_t byte = flips[f] / 8;

			host[byte] ^= (unsigned char)(1u << (flips[f] % 8));
			CK(cuMemcpyHtoD(d + byte, host + byte, 1));
		}
	}
	printf("agreement: %s (%ld differences)\n", failures ? "FAILED" : "all chunks agree", failures);

	if (bench_gb) {
		uint64_t bsize = bench_gb << 30;
		CUdeviceptr b, bout;
		double t0;

		CK(cuMemAlloc(&b, bsize));
		CK(cuMemAlloc(&bout, 24 * (bsize / 65536 + 1)));
		CK(cuMemsetD8(b, 0, bsize));
		CK(cuCtxSynchronize());
		bench("zeros", b, bsize, bout, keys);
		t0 = now_s();
		for (uint64_t at = 0; at < bsize; at += size)
			CK(cuMemcpyDtoD(b + at, d, bsize - at < size ? bsize - at : size));
		CK(cuCtxSynchronize());
		printf("(random data copied in %.2f s)\n", now_s() - t0);
		bench("random", b, bsize, bout, keys);
		CK(cuMemFree(b));
		CK(cuMemFree(bout));
	}
	CK(cuModuleUnload(mod));
	return failures ? 1 : 0;
}
