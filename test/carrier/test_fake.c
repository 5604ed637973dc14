/*
 * test_fake.c - the carrier against the fake driver (test/fakecuda): real
 * cuMemAlloc and VMM allocations on two fake devices (so two contexts in one
 * transfer), pinned staging from cuMemHostAlloc, asynchronous copies on
 * driver streams, and the driver's own fault injection (FAKECUDA_FAIL).
 * Entry points are resolved by name, as the interposer does. Each test case
 * gets a private fakecuda-devd (test/fakecuda/tests/harness.c).
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "carrier.h"
#include "harness.h"
#include "util.h"

#define KIB 1024ull

static struct carrier_ops ops;

static void *lookup(void *arg, const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static void resolve(void)
{
	char err[128];

	ck_assert_msg(carrier_ops_resolve(&ops, lookup, NULL, err, sizeof(err)) == 0, "%s", err);
}

/* Items: the mixed sizes with cuMemAlloc on device 0, plus one VMM
 * allocation mapped on device 1 (its own context). */
static const uint64_t sizes[] = {1, 4 * KIB + 3, 64 * KIB, 64 * KIB + 1, 3 * MiB + 5, 2 * MiB};
#define N	    (sizeof(sizes) / sizeof(sizes[0]))
#define VMM_ITEM    (N - 1)
#define CRC_ENTRIES 1024

struct set {
	CUcontext ctx[2];
	struct carrier_item items[N];
	uint32_t crc[N][CRC_ENTRIES];
	char name[N][32];
};

static void alloc_set(struct set *s, CUcontext c0, CUcontext c1)
{
	memset(s, 0, sizeof(*s));
	s->ctx[0] = c0;
	s->ctx[1] = c1;
	for (size_t i = 0; i < N; i++) {
		struct carrier_item *it = &s->items[i];

		snprintf(s->name[i], sizeof(s->name[i]), "alloc %zu", i);
		it->size = sizes[i];
		it->name = s->name[i];
		it->crc = s->crc[i];
		it->ncrc = CRC_ENTRIES;
		if (i == VMM_ITEM) {
			CK(cuCtxSetCurrent(c1));
			it->va = fkt_vmm_map(fkt_vmm_create(sizes[i], 1, 1), sizes[i], 1);
			it->ctx = c1;
		} else {
			CK(cuCtxSetCurrent(c0));
			CK(cuMemAlloc(&it->va, sizes[i]));
			it->ctx = c0;
		}
	}
	CK(cuCtxSetCurrent(c0));
}

static void fill_pattern(const struct set *s)
{
	for (size_t i = 0; i < N; i++) {
		uint8_t *b = malloc(sizes[i]);

		pattern_fill(b, sizes[i], (uint32_t)i + 1);
		CK(cuCtxSetCurrent(s->items[i].ctx));
		CK(cuMemcpyHtoD(s->items[i].va, b, sizes[i]));
		free(b);
	}
}

static void fill_byte(const struct set *s, uint8_t v)
{
	for (size_t i = 0; i < N; i++) {
		CK(cuCtxSetCurrent(s->items[i].ctx));
		CK(cuMemsetD8(s->items[i].va, v, sizes[i]));
	}
}

/* Index of the first wrong byte of item i (pattern, or v if v >= 0). */
static long check_item(const struct set *s, size_t i, uint64_t off, uint64_t len, int v)
{
	uint8_t *b = malloc(sizes[i]);
	long bad;

	CK(cuCtxSetCurrent(s->items[i].ctx));
	CK(cuMemcpyDtoH(b, s->items[i].va, sizes[i]));
	if (v >= 0) {
		bad = bytes_check(b + off, len, (uint8_t)v);
	} else {
		bad = pattern_check(b, sizes[i], (uint32_t)i + 1);
	}
	free(b);
	return bad;
}

/* The load side: same index, fresh allocations holding `fill`. */
static void index_like(struct set *to, const struct set *from)
{
	for (size_t i = 0; i < N; i++) {
		to->items[i].chunk_size = from->items[i].chunk_size;
		to->items[i].offset = from->items[i].offset;
		to->items[i].ncrc = from->items[i].ncrc;
		memcpy(to->crc[i], from->crc[i], sizeof(from->crc[i]));
	}
}

static struct carrier_config cfg_make(uint64_t staging, uint32_t chunk, unsigned threads)
{
	struct carrier_config c;

	ck_assert_int_eq(carrier_config_init(&c, NULL, 0), 0);
	c.staging_bytes = staging;
	c.chunk_size = chunk;
	c.threads = threads;
	return c;
}

struct world {
	CUcontext c0, c1;
	struct set src, dst;
	int fd;
};

static void world_init(struct world *w)
{
	CUdevice d1;

	resolve();
	w->c0 = fkt_init_ctx(0);
	CK(cuDeviceGet(&d1, 1));
	CK(cuDevicePrimaryCtxRetain(&w->c1, d1));
	alloc_set(&w->src, w->c0, w->c1);
	fill_pattern(&w->src);
	alloc_set(&w->dst, w->c0, w->c1);
	fill_byte(&w->dst, 0x77);
	w->fd = scratch_fd();
	ck_assert_int_ge(w->fd, 0);
}

static void save_ok(struct world *w, const struct carrier_config *c)
{
	char err[512];

	ck_assert_msg(carrier_save(&ops, c, w->fd, 0, w->src.items, N, NULL, err, sizeof(err)) == 0, "%s", err);
	index_like(&w->dst, &w->src);
}

START_TEST(roundtrip_two_devices_every_byte_and_crc)
{
	static const unsigned threads[] = {1, 2, 3, 4};
	struct world w;

	world_init(&w);
	for (size_t t = 0; t < 4; t++) {
		struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, threads[t]);
		struct carrier_stats st;
		char err[512];
		uint64_t total = 0;
		uint8_t *file;
		CUcontext cur;

		CK(cuCtxSetCurrent(w.c1));
		ck_assert_msg(carrier_save(&ops, &c, w.fd, 4096, w.src.items, N, &st, err, sizeof(err)) == 0, "%s",
			      err);
		/* The caller's context is current again. */
		CK(cuCtxGetCurrent(&cur));
		ck_assert_ptr_eq(cur, w.c1);
		for (size_t i = 0; i < N; i++)
			total += sizes[i];
		ck_assert_uint_eq(st.bytes, total);
		ck_assert_uint_le(st.staging_bytes, 1 * MiB);
		file = mmap(NULL, 4096 + total, PROT_READ, MAP_SHARED, w.fd, 0);
		ck_assert_ptr_ne(file, MAP_FAILED);
		for (size_t i = 0; i < N; i++) {
			const struct carrier_item *it = &w.src.items[i];

			ck_assert_int_eq(pattern_check(file + it->offset, it->size, (uint32_t)i + 1), -1);
			ck_assert_uint_eq(it->ncrc, carrier_nchunks(sizes[i], 64 * KIB));
			for (size_t k = 0; k < it->ncrc; k++) {
				uint64_t o = k * it->chunk_size;
				uint64_t l = it->size - o < it->chunk_size ? it->size - o : it->chunk_size;

				ck_assert_uint_eq(it->crc[k], ref_crc32c(file + it->offset + o, l));
			}
		}
		munmap(file, 4096 + total);

		fill_byte(&w.dst, 0x77);
		index_like(&w.dst, &w.src);
		ck_assert_msg(carrier_load(&ops, &c, w.fd, w.dst.items, N, &st, err, sizeof(err)) == 0, "%s", err);
		ck_assert_uint_eq(st.bytes, total);
		for (size_t i = 0; i < N; i++)
			ck_assert_msg(check_item(&w.dst, i, 0, 0, -1) == -1, "alloc %zu differs", i);
	}
}
END_TEST

static void corrupt(struct world *w, int verify_first)
{
	struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, 2);
	const struct carrier_item *it = &w->src.items[4];
	uint64_t at;
	char err[512], want[64];
	uint8_t b;

	save_ok(w, &c);
	at = it->offset + 9 * 64 * KIB + 5; /* chunk 9 of alloc 4 */
	ck_assert_int_eq(pread(w->fd, &b, 1, at), 1);
	b = ~b;
	ck_assert_int_eq(pwrite(w->fd, &b, 1, at), 1);
	c.verify_first = verify_first;
	ck_assert_int_eq(carrier_load(&ops, &c, w->fd, w->dst.items, N, NULL, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "alloc 4: chunk 9 "), "%s", err);
	snprintf(want, sizeof(want), "the index says %#010x", it->crc[9]);
	ck_assert_msg(strstr(err, want), "%s", err);
	ck_assert_int_eq(check_item(&w->dst, 4, 9 * 64 * KIB, 64 * KIB, 0x77), -1);
	if (verify_first)
		for (size_t i = 0; i < N; i++)
			ck_assert_int_eq(check_item(&w->dst, i, 0, sizes[i], 0x77), -1);
}

START_TEST(corrupt_byte_refused_chunk_never_reaches_device)
{
	struct world w;

	world_init(&w);
	corrupt(&w, 0);
}
END_TEST

START_TEST(corrupt_byte_verify_first_device_untouched)
{
	struct world w;

	world_init(&w);
	corrupt(&w, 1);
}
END_TEST

START_TEST(truncated_file_refused_device_untouched)
{
	struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, 2);
	struct world w;
	struct stat sb;
	char err[512];

	world_init(&w);
	save_ok(&w, &c);
	ck_assert_int_eq(fstat(w.fd, &sb), 0);
	ck_assert_int_eq(ftruncate(w.fd, sb.st_size - 100), 0);
	ck_assert_int_eq(carrier_load(&ops, &c, w.fd, w.dst.items, N, NULL, err, sizeof(err)), -ENODATA);
	ck_assert_msg(strstr(err, "truncated"), "%s", err);
	for (size_t i = 0; i < N; i++)
		ck_assert_int_eq(check_item(&w.dst, i, 0, sizes[i], 0x77), -1);
}
END_TEST

/*
 * Calls one transfer of the set makes with cfg(1 MiB, 64 KiB, 3 threads):
 * six 168 KiB slots (1 MiB / 6, page-aligned down) carry two 64 KiB chunks
 * per slice; each slice is one async copy and one stream wait, teardown
 * waits on every slot's stream in both contexts.
 */
#define SLOTS 6
static unsigned slices(void)
{
	unsigned k = 0;

	for (size_t i = 0; i < N; i++)
		k += (unsigned)((sizes[i] + 128 * KIB - 1) / (128 * KIB));
	return k;
}

/*
 * The n-th call of `api` after `warm` calls (one warm-up transfer) fails:
 * clean error, the source untouched, no staging, stream, descriptor or
 * mapping left, and a retry succeeds.
 */
static void injected(const char *api, unsigned warm, unsigned nth, int load, int expect, const char *needle)
{
	struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, 3);
	struct carrier_stats st;
	struct world w;
	char spec[128], err[512] = "";
	int fds, maps, rc;

	/* FAKECUDA_FAIL counts from the first call of the process. */
	snprintf(spec, sizeof(spec), "%s:%u", api, warm + nth);
	setenv("FAKECUDA_FAIL", spec, 1);
	world_init(&w);
	save_ok(&w, &c);
	if (load)
		ck_assert_msg(carrier_load(&ops, &c, w.fd, w.dst.items, N, NULL, err, sizeof(err)) == 0, "%s", err);
	fds = count_fds();
	maps = count_maps();
	if (load)
		rc = carrier_load(&ops, &c, w.fd, w.dst.items, N, &st, err, sizeof(err));
	else
		rc = carrier_save(&ops, &c, w.fd, 0, w.src.items, N, &st, err, sizeof(err));
	ck_assert_msg(rc == expect, "%s:%u -> %d (%s)", api, warm + nth, rc, err);
	ck_assert_msg(strstr(err, needle), "'%s' lacks '%s'", err, needle);
	ck_assert_uint_lt(st.bytes, st.total);
	ck_assert_int_eq(count_fds(), fds);
	ck_assert_int_eq(count_maps(), maps);
	for (size_t i = 0; i < N; i++)
		ck_assert_int_eq(check_item(&w.src, i, 0, 0, -1), -1);
	if (load)
		ck_assert_msg(carrier_load(&ops, &c, w.fd, w.dst.items, N, NULL, err, sizeof(err)) == 0, "%s", err);
	else
		ck_assert_msg(carrier_save(&ops, &c, w.fd, 0, w.src.items, N, NULL, err, sizeof(err)) == 0, "%s", err);
	if (load)
		for (size_t i = 0; i < N; i++)
			ck_assert_int_eq(check_item(&w.dst, i, 0, 0, -1), -1);
}

START_TEST(injected_dtoh_failure_clean_error)
{
	injected("cuMemcpyDtoHAsync", slices(), 3, 0, -EIO, "cuMemcpyDtoHAsync of bytes");
}
END_TEST

START_TEST(injected_sync_failure_clean_error)
{
	injected("cuStreamSynchronize", slices() + 2 * SLOTS, 2, 0, -EIO, "device copy of bytes");
}
END_TEST

START_TEST(injected_htod_failure_clean_error)
{
	injected("cuMemcpyHtoDAsync", slices(), 4, 1, -EIO, "cuMemcpyHtoDAsync of bytes");
}
END_TEST

START_TEST(injected_pinning_failure_clean_error)
{
	injected("cuMemHostAlloc", SLOTS, 3, 0, -ENOMEM, "cannot pin");
}
END_TEST

START_TEST(write_enospc_clean_error)
{
	struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, 2);
	struct world w;
	char err[512];
	int full = open("/dev/full", O_WRONLY);
	int fds, maps;

	world_init(&w);
	save_ok(&w, &c);
	fds = count_fds();
	maps = count_maps();
	ck_assert_int_eq(carrier_save(&ops, &c, full, 0, w.src.items, N, NULL, err, sizeof(err)), -ENOSPC);
	ck_assert_msg(strstr(err, "No space left on device"), "%s", err);
	ck_assert_int_eq(count_fds(), fds);
	ck_assert_int_eq(count_maps(), maps);
	close(full);
}
END_TEST

static uint64_t anon_peak;

static void sample_anon(void *arg, uint64_t done, uint64_t total)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "RssAnon:", 8)) {
			uint64_t v = strtoull(line + 8, NULL, 10) * 1024;

			if (v > anon_peak)
				anon_peak = v;
		}
	if (f)
		fclose(f);
}

START_TEST(staging_bound_for_item_8x_staging)
{
	struct carrier_config c = cfg_make(2 * MiB, 256 * KIB, 2);
	struct carrier_stats st;
	struct carrier_item it = {.size = 16 * MiB, .name = "big"}, back;
	static uint32_t crc[64];
	char err[512];
	uint8_t *b = malloc(16 * MiB);
	uint64_t base;
	int fd = scratch_fd();

	resolve();
	fkt_init_ctx(0);
	CK(cuMemAlloc(&it.va, it.size));
	pattern_fill(b, it.size, 9);
	CK(cuMemcpyHtoD(it.va, b, it.size));
	memset(b, 0, it.size); /* resident, so it does not count as extra */
	it.crc = crc;
	it.ncrc = 64;
	c.progress = sample_anon;
	c.progress_every = 256 * KIB;
	ck_assert_msg(carrier_save(&ops, &c, fd, 0, &it, 1, &st, err, sizeof(err)) == 0, "%s", err);
	sample_anon(NULL, 0, 0);
	base = anon_peak; /* after a warm-up transfer */
	anon_peak = 0;
	ck_assert_msg(carrier_save(&ops, &c, fd, 0, &it, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_le(st.staging_bytes, 2 * MiB);
	back = it;
	CK(cuMemsetD8(back.va, 0, back.size));
	ck_assert_msg(carrier_load(&ops, &c, fd, &back, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_le(st.staging_bytes, 2 * MiB);
	ck_assert_msg(anon_peak <= base + 2 * MiB + 1 * MiB, "extra anonymous memory %llu KiB with 2 MiB staging",
		      (unsigned long long)(anon_peak - base) / 1024);
	CK(cuMemcpyDtoH(b, it.va, it.size));
	ck_assert_int_eq(pattern_check(b, it.size, 9), -1);
	free(b);
	close(fd);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("carrier-fake");
	TCase *t = tcase_create("fake");

	tcase_add_unchecked_fixture(t, fkt_devd2, fkt_devd_stop);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, roundtrip_two_devices_every_byte_and_crc);
	tcase_add_test(t, corrupt_byte_refused_chunk_never_reaches_device);
	tcase_add_test(t, corrupt_byte_verify_first_device_untouched);
	tcase_add_test(t, truncated_file_refused_device_untouched);
	tcase_add_test(t, injected_dtoh_failure_clean_error);
	tcase_add_test(t, injected_sync_failure_clean_error);
	tcase_add_test(t, injected_htod_failure_clean_error);
	tcase_add_test(t, injected_pinning_failure_clean_error);
	tcase_add_test(t, write_enospc_clean_error);
	tcase_add_test(t, staging_bound_for_item_8x_staging);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(suite());
	int failed;

	srunner_run_all(r, CK_NORMAL);
	failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
