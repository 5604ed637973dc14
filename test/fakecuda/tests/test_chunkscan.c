/*
 * The chunk scan kernel (carrier/chunkscan.h) on the fake driver: the real
 * embedded PTX (cuip_chunkscan_ptx) loads with cuModuleLoadData, its
 * cuip_chunkscan runs with the real argument layout and answers, chunk by
 * chunk, what cuip_chunkscan_host answers on the same bytes; the PTX
 * parser's errors are the real driver's; FAKECUDA_COPY_LOG records each
 * device-to-host copy and nothing else.  One process per test (Check's
 * fork mode), one devd per case.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "../../carrier/chunkscan.h"
#include "../../tmpname.h"

static const uint64_t keys[2] = {0x0123456789abcdefull % CUIP_P61, 0x1ffffffffffff0f1ull};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill_random(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(next_rand() >> 24);
}

static CUfunction load_scan(CUmodule *mod)
{
	CUfunction f;

	CK(cuModuleLoadData(mod, cuip_chunkscan_ptx));
	CK(cuModuleGetFunction(&f, *mod, CUIP_CHUNKSCAN_KERNEL));
	return f;
}

/* Launches the scan of [base, base+size) in chunk_size chunks, results in out. */
static CUresult launch_scan(CUfunction f, CUdeviceptr base, unsigned long long size, unsigned int chunk_size,
			    CUdeviceptr out, CUstream st)
{
	unsigned long long k0 = keys[0], k1 = keys[1];
	void *args[] = {&base, &size, &chunk_size, &k0, &k1, &out};
	unsigned grid = (unsigned)((size + chunk_size - 1) / chunk_size);

	return cuLaunchKernel(f, grid, 1, 1, CUIP_CHUNKSCAN_THREADS, 1, 1, 0, st, args, NULL);
}

/* Scans the device bytes and checks every chunk against host[] (the same bytes). */
static void scan_and_compare(CUfunction f, CUdeviceptr base, const unsigned char *host, size_t size, unsigned int cs,
			     CUdeviceptr out, uint64_t *res)
{
	size_t n = (size + cs - 1) / cs;

	CK(launch_scan(f, base, size, cs, out, NULL));
	CK(cuCtxSynchronize());
	CK(cuMemcpyDtoH(res, out, 24 * n));
	for (size_t c = 0; c < n; c++) {
		uint64_t want[3];
		size_t len = size - c * cs < cs ? size - c * cs : cs;

		cuip_chunkscan_host(host + c * cs, len, keys, want);
		ck_assert_msg(res[3 * c] == want[0] && res[3 * c + 1] == want[1] && res[3 * c + 2] == want[2],
			      "chunk %zu of %u bytes at base %#llx: device (%llx %llx %llu) host (%llx %llx %llu)", c,
			      cs, (unsigned long long)base, (unsigned long long)res[3 * c],
			      (unsigned long long)res[3 * c + 1], (unsigned long long)res[3 * c + 2],
			      (unsigned long long)want[0], (unsigned long long)want[1], (unsigned long long)want[2]);
	}
}

#define SZ ((size_t)(6 * MiB + 4099))

START_TEST(embedded_ptx_scans_as_the_host_function)
{
	static const unsigned int sizes[] = {64 << 10, 1 << 20, 4 << 20, 4096 + 4, 1000, 17, 8 << 20};
	unsigned char *h = malloc(SZ + 16);
	uint64_t *res = malloc(24 * (SZ / 17 + 2));
	CUdeviceptr d, out;
	CUmodule mod;
	CUfunction f;

	ck_assert_ptr_nonnull(h);
	ck_assert_ptr_nonnull(res);
	h_init(0);
	f = load_scan(&mod);
	CK(cuMemAlloc(&d, SZ + 16));
	CK(cuMemAlloc(&out, 24 * (SZ / 17 + 2)));
	/* random, then a zero MiB, a zero 64 KiB run inside random data, random to the end */
	fill_random(h, SZ + 16);
	memset(h + MiB, 0, MiB);
	memset(h + 3 * MiB + 65536, 0, 65536);
	CK(cuMemcpyHtoD(d, h, SZ + 16));
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		scan_and_compare(f, d, h, SZ, sizes[i], out, res);
		scan_and_compare(f, d + 3, h + 3, SZ, sizes[i], out, res); /* unaligned base */
	}
	/* one flipped byte changes its chunk's hashes and no other chunk's */
	{
		const unsigned int cs = 64 << 10;
		size_t n = (SZ + cs - 1) / cs, at = MiB + 12345;
		uint64_t *before = malloc(24 * n);

		ck_assert_ptr_nonnull(before);
		scan_and_compare(f, d, h, SZ, cs, out, before);
		h[at] ^= 0x10;
		CK(cuMemcpyHtoD(d + at, h + at, 1));
		scan_and_compare(f, d, h, SZ, cs, out, res);
		for (size_t c = 0; c < n; c++) {
			int same = res[3 * c] == before[3 * c] && res[3 * c + 1] == before[3 * c + 1];

			ck_assert_int_eq(same, c != at / cs);
		}
		ck_assert_uint_eq(before[3 * (at / cs) + 2], 0); /* it was a zero chunk */
		ck_assert_uint_eq(res[3 * (at / cs) + 2], 1);
		free(before);
	}
	CK(cuModuleUnload(mod));
	free(h);
	free(res);
}
END_TEST

/* The `extra` buffer layout (natural alignment: 4 bytes of padding after chunk_size), and a stream. */
START_TEST(launch_through_extra_and_a_stream)
{
	struct {
		CUdeviceptr base;
		unsigned long long size;
		unsigned int cs;
		unsigned long long k0, k1;
		CUdeviceptr out;
	} a;
	size_t asz = sizeof(a);
	void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &a, CU_LAUNCH_PARAM_BUFFER_SIZE, &asz, CU_LAUNCH_PARAM_END};
	unsigned char h[100000];
	uint64_t res[3 * 4], want[3];
	CUstream st;
	CUmodule mod;
	CUfunction f;

	h_init(0);
	f = load_scan(&mod);
	fill_random(h, sizeof(h));
	CK(cuMemAlloc(&a.base, sizeof(h)));
	CK(cuMemAlloc(&a.out, sizeof(res)));
	CK(cuMemcpyHtoD(a.base, h, sizeof(h)));
	a.size = sizeof(h);
	a.cs = 32768;
	a.k0 = keys[0];
	a.k1 = keys[1];
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CK(cuLaunchKernel(f, 4, 1, 1, CUIP_CHUNKSCAN_THREADS, 1, 1, 0, st, NULL, extra));
	CK(cuMemcpyDtoHAsync(res, a.out, sizeof(res), st));
	CK(cuStreamSynchronize(st));
	for (int c = 0; c < 4; c++) {
		size_t len = c < 3 ? 32768 : sizeof(h) - 3 * 32768;

		cuip_chunkscan_host(h + 32768 * c, len, keys, want);
		ck_assert(res[3 * c] == want[0] && res[3 * c + 1] == want[1] && res[3 * c + 2] == 1);
	}
}
END_TEST

/* VMM memory: a chunk across two allocations mapped side by side (read in
 * pieces) and chunks of a never-written allocation (arena holes: zeros,
 * scanned without being touched). */
START_TEST(chunks_across_mappings_and_of_holes)
{
	size_t g;
	CUmemGenericAllocationHandle h1, h2;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	unsigned char *h;
	uint64_t *res;
	CUdeviceptr va, out, fresh;
	long long before;
	CUmodule mod;
	CUfunction f;

	h_init(0);
	g = h_gran();
	h = malloc(2 * g);
	res = malloc(24 * (2 * g / 4096));
	ck_assert_ptr_nonnull(h);
	ck_assert_ptr_nonnull(res);
	h1 = h_vmm_create(g, 0, 0);
	h2 = h_vmm_create(g, 0, 0);
	f = load_scan(&mod);
	CK(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
	CK(cuMemMap(va, g, 0, h1, 0));
	CK(cuMemMap(va + g, g, 0, h2, 0));
	CK(cuMemSetAccess(va, 2 * g, &acc, 1));
	CK(cuMemAlloc(&out, 24 * (2 * g / 4096)));
	fill_random(h, 2 * g);
	CK(cuMemcpyHtoD(va, h, 2 * g));
	scan_and_compare(f, va, h, 2 * g, (unsigned int)(2 * g), out, res);
	scan_and_compare(f, va + 5, h + 5, 2 * g - 5, (unsigned int)(g / 3), out, res);
	/* a fresh allocation is holes: all (0,0,0), and still holes after */
	CK(cuMemAlloc(&fresh, 16 * MiB));
	before = h_arena_bytes();
	memset(h, 0, 2 * g);
	scan_and_compare(f, fresh, h, 2 * g, 65536, out, res);
	ck_assert_int_eq(h_arena_bytes(), before);
	free(h);
	free(res);
}
END_TEST

/* 2 GiB of zeros, never written (holes) and written (memset): a few seconds at most. */
START_TEST(two_gib_of_zeros_scan_quickly)
{
	const size_t size = 2048 * MiB, cs = 1 << 20, n = size / cs;
	uint64_t *res = malloc(24 * n);
	CUdeviceptr d, out;
	CUmodule mod;
	CUfunction f;
	int64_t t0, t1, t2;

	ck_assert_ptr_nonnull(res);
	h_init(0);
	f = load_scan(&mod);
	CK(cuMemAlloc(&d, size));
	CK(cuMemAlloc(&out, 24 * n));
	t0 = h_now_ms();
	CK(launch_scan(f, d, size, cs, out, NULL));
	CK(cuCtxSynchronize());
	t1 = h_now_ms();
	CK(cuMemsetD8(d, 0, size));
	CK(cuCtxSynchronize());
	t2 = h_now_ms();
	CK(launch_scan(f, d, size, cs, out, NULL));
	CK(cuCtxSynchronize());
	t2 = h_now_ms() - t2;
	CK(cuMemcpyDtoH(res, out, 24 * n));
	for (size_t c = 0; c < n; c++)
		ck_assert(!res[3 * c] && !res[3 * c + 1] && !res[3 * c + 2]);
	fprintf(stderr, "2 GiB of zeros: %lld ms as holes, %lld ms written\n", (long long)(t1 - t0), (long long)t2);
	ck_assert_int_lt(t1 - t0, 2000);
	ck_assert_int_lt(t2, 10000);
	CK(cuMemFree(d));
	free(res);
}
END_TEST

static CUresult load(const char *ptx)
{
	CUmodule m;
	CUresult r = cuModuleLoadData(&m, ptx);

	if (!r)
		CK(cuModuleUnload(m));
	return r;
}

#define PTX_HEAD                   \
	"//\n// a comment\n//\n\n" \
	".version 8.0\n"           \
	".target sm_80\n"          \
	".address_size 64\n\n"
#define SCAN_PARAMS                                                                                                   \
	"(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u32 c,\n\t.param .u64 d,\n\t.param .u64 e,\n\t.param .u64 " \
	"f\n)"

START_TEST(ptx_errors_are_the_drivers)
{
	static const char *const invalid[] = {
		"", /* not PTX: accepted as any image is, below */
		".version 8.0\n.address_size 64\n.visible .entry k() { ret; }\n", /* no .target */
		".version 8.0\n.target sm_80\nthis is no PTX\n",
		".version 8.0\n.target sm_80\n.visible .entry k() { ret;\n",	/* unbalanced */
		".version 8.0\n.target sm_100\n.visible .entry k() { ret; }\n", /* newer than the device (9.0) */
		".version 8.0\n.target sm_80\n.address_size 32\n",
		".version x.y\n.target sm_80\n",
		".version 8.0\n.target gfx90a\n",
		".version 8.0\n.target sm_80\n.visible .entry k(.param .u64) { ret; }\n", /* a param with no name */
		".version 8.0\n.target sm_80\n.visible .entry k(.param .v2 a) { ret; }\n",
		".version 8.0\n.target sm_80\n/* unterminated comment\n",
		".version 8.0\n.target sm_80\n.target sm_80\n",
	};
	CUmodule m;
	CUfunction f;
	char *big;

	h_init(0);
	CK(load(invalid[0]));
	for (size_t i = 1; i < sizeof(invalid) / sizeof(invalid[0]); i++)
		ck_assert_msg(load(invalid[i]) == CUDA_ERROR_INVALID_PTX, "accepted: %s", invalid[i]);
	CK_ERR(load(".version 10.0\n.target sm_80\n"), CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
	CK(load(".version 9.0\n.target sm_90a\n.address_size 64\n"));
	CK(load(".version 7.0\n.target sm_52, debug\n.global .align 4 .u32 x[2] = {1, 2};\n"));
	/* no NUL within 64 MiB */
	big = malloc((64u << 20) + 64);
	ck_assert_ptr_nonnull(big);
	memset(big, ' ', (64u << 20) + 64);
	memcpy(big, ".version 8.0\n.target sm_80\n", 27);
	CK_ERR(load(big), CUDA_ERROR_INVALID_PTX);
	big[(64u << 20) - 1] = 0;
	CK(load(big));
	free(big);

	/* functions: only the entries declared that the fake runs, with their declared parameters */
	CK(cuModuleLoadData(&m, cuip_chunkscan_ptx));
	CK_ERR(cuModuleGetFunction(&f, m, "fake_fill_u32"), CUDA_ERROR_NOT_FOUND); /* not declared */
	CK_ERR(cuModuleGetFunction(&f, m, "cuip_chunkscan_"), CUDA_ERROR_NOT_FOUND);
	CK(cuModuleUnload(m));
	CK(cuModuleLoadData(&m, PTX_HEAD ".visible .entry other" SCAN_PARAMS "\n{\n\tret;\n}\n"
					 ".visible .entry cuip_chunkscan(.param .u64 a) { ret; }\n"
					 ".visible .entry fake_fill_u32(.param .u64 a, .param .u64 b, .param .u32 c)\n"
					 ".maxntid 256, 1, 1\n{\n\tret;\n}\n"));
	CK_ERR(cuModuleGetFunction(&f, m, "other"), CUDA_ERROR_NOT_FOUND);	    /* declared, not run by the fake */
	CK_ERR(cuModuleGetFunction(&f, m, "cuip_chunkscan"), CUDA_ERROR_NOT_FOUND); /* other parameters */
	CK(cuModuleGetFunction(&f, m, "fake_fill_u32"));
	CK(cuModuleUnload(m));
	CK(cuModuleLoadData(&m, PTX_HEAD "// .globl\tcuip_chunkscan\n.visible .entry cuip_chunkscan" SCAN_PARAMS
					 "\n{\n\t.reg .b64 %rd<4>;\n\tret;\n}\n"));
	CK(cuModuleGetFunction(&f, m, "cuip_chunkscan"));
	CK(cuModuleUnload(m));
	/* a function of an unloaded module */
	CK_ERR(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
}
END_TEST

START_TEST(launches_outside_the_contract_are_refused)
{
	CUdeviceptr d, out;
	CUmodule mod;
	CUfunction f;
	unsigned long long size = 10 * 65536 + 1, k = 1;
	unsigned int cs = 65536, zero = 0;
	void *args[] = {&d, &size, &cs, &k, &k, &out}, *zargs[] = {&d, &size, &zero, &k, &k, &out};

	h_init(0);
	f = load_scan(&mod);
	CK(cuMemAlloc(&d, size));
	CK(cuMemAlloc(&out, 24 * 11));
	CK(cuLaunchKernel(f, 11, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
	CK_ERR(cuLaunchKernel(f, 10, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 12, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 11, 1, 1, 128, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 11, 1, 1, 256, 2, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 11, 2, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, NULL, zargs, NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuLaunchKernel(f, 11, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	CK(cuCtxSynchronize());
	/* out of bounds (device memory it cannot reach) faults asynchronously and sticks */
	size = 64ull << 20;
	cs = 1 << 20;
	CK(cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
	CK_ERR(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
}
END_TEST

/* Lines of path as "pid P dtoh N" with this pid: their count, the sum of N. */
static int copy_lines(const char *path, unsigned long long *bytes)
{
	FILE *fp = fopen(path, "r");
	char line[128];
	int n = 0;

	*bytes = 0;
	if (!fp)
		return 0;
	while (fgets(line, sizeof(line), fp)) {
		int pid;
		unsigned long long b;

		ck_assert_msg(sscanf(line, "pid %d dtoh %llu\n", &pid, &b) == 2, "bad line %s", line);
		ck_assert_int_eq(pid, getpid());
		n++;
		*bytes += b;
	}
	fclose(fp);
	return n;
}

START_TEST(copy_log_records_each_device_to_host_copy)
{
	char path[64];
	int fd = mkstemp(test_tmpname(path, sizeof(path), "fakecuda-copylog-XXXXXX"));
	unsigned char h[3 << 16];
	unsigned long long bytes;
	CUdeviceptr d, out;
	CUstream st;
	CUmodule mod;
	CUfunction f;

	ck_assert_int_ge(fd, 0);
	close(fd);
	setenv("FAKECUDA_COPY_LOG", path, 1);
	h_init(0);
	f = load_scan(&mod);
	fill_random(h, sizeof(h));
	CK(cuMemAlloc(&d, sizeof(h)));
	CK(cuMemAlloc(&out, 24 * 3));
	CK(cuMemcpyHtoD(d, h, sizeof(h)));
	CK(cuMemcpyDtoD(out, d, 24 * 3));
	CK(launch_scan(f, d, sizeof(h), 1 << 16, out, NULL));
	CK(cuCtxSynchronize());
	ck_assert_int_eq(copy_lines(path, &bytes), 0); /* the scan copied nothing to the host */
	CK(cuMemcpyDtoH(h, out, 24 * 3));
	ck_assert_int_eq(copy_lines(path, &bytes), 1);
	ck_assert_uint_eq(bytes, 72);
	CK(cuStreamCreate(&st, 0));
	CK(cuMemcpyDtoHAsync(h, d, 1000, st));
	CK(cuStreamSynchronize(st));
	CK(cuMemcpy((CUdeviceptr)(uintptr_t)h, d, 7)); /* unified addressing: device to host */
	CK(cuMemcpy(d, (CUdeviceptr)(uintptr_t)h, 7)); /* host to device: not logged */
	ck_assert_int_eq(copy_lines(path, &bytes), 3);
	ck_assert_uint_eq(bytes, 72 + 1000 + 7);
	unlink(path);
}
END_TEST

/* A devd with room for 2 GiB. */
static void big_devd(void)
{
	h_devd_start("FAKECUDA_MEM_MB=3072");
}

static Suite *suite(void)
{
	Suite *s = suite_create("fakecuda-chunkscan");
	TCase *t1 = tcase_create("one-device"), *big = tcase_create("big-device");

	tcase_add_unchecked_fixture(t1, h_devd1, h_devd_stop);
	tcase_set_timeout(t1, 60);
	tcase_add_test(t1, embedded_ptx_scans_as_the_host_function);
	tcase_add_test(t1, launch_through_extra_and_a_stream);
	tcase_add_test(t1, chunks_across_mappings_and_of_holes);
	tcase_add_test(t1, ptx_errors_are_the_drivers);
	tcase_add_test(t1, launches_outside_the_contract_are_refused);
	tcase_add_test(t1, copy_log_records_each_device_to_host_copy);
	suite_add_tcase(s, t1);
	tcase_add_unchecked_fixture(big, big_devd, h_devd_stop);
	tcase_set_timeout(big, 60);
	tcase_add_test(big, two_gib_of_zeros_scan_quickly);
	suite_add_tcase(s, big);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
