/*
 * test_fake.c - the carrier against the fake driver (test/fakecuda): real
 * cuMemAlloc and VMM allocations on two fake devices (so two contexts in one
 * transfer), pinned staging (registered pages, cuMemHostAlloc as the
 * fallback), asynchronous copies on
 * driver streams, and the driver's own fault injection (FAKECUDA_FAIL).
 * Entry points are resolved by name, as the interposer does. Each test case
 * gets a private fakecuda-devd (test/harness/harness.c).
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
			it->va = h_vmm_map(h_vmm_create(sizes[i], 1, 1), sizes[i], 1);
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
	w->c0 = h_init(0);
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
 * of a large item per slice, and allocs 0-3 (135 KiB) as one run. Each
 * slice is one async copy per item in it and one stream wait; teardown
 * waits on every slot's stream in both contexts.
 */
#define SLOTS 6
static unsigned slices(void) /* async copies */
{
	unsigned k = 0;

	for (size_t i = 0; i < N; i++)
		k += (unsigned)((sizes[i] + 128 * KIB - 1) / (128 * KIB));
	return k;
}

static unsigned waits(void) /* stream waits, teardown's left out */
{
	return slices() - 3; /* allocs 0-3 share one */
}

/* One transfer under FAKECUDA_FAIL=spec (it counts from the first call of
 * the process): rc `expect` with `needle` in the message, nothing leaked,
 * the source intact, and the next transfer of the same items succeeds. */
static void injected_spec(const char *spec, int load, int expect, const char *needle)
{
	struct carrier_config c = cfg_make(1 * MiB, 64 * KIB, 3);
	struct carrier_stats st;
	struct world w;
	char err[512] = "";
	int fds, maps, rc;

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
	ck_assert_msg(rc == expect, "%s -> %d (%s)", spec, rc, err);
	if (!expect) { /* a failure the carrier works around: every byte moved, nothing left */
		ck_assert_uint_eq(st.bytes, st.total);
		ck_assert_int_eq(count_fds(), fds);
		ck_assert_int_eq(count_maps(), maps);
		if (!load)
			ck_assert_msg(carrier_load(&ops, &c, w.fd, w.dst.items, N, NULL, err, sizeof(err)) == 0, "%s",
				      err);
		for (size_t i = 0; i < N; i++)
			ck_assert_int_eq(check_item(&w.dst, i, 0, 0, -1), -1);
		return;
	}
	ck_assert_msg(strstr(err, needle), "'%s' lacks '%s'", err, needle);
	/* A thread's pinning may fail after the others moved every byte
	 * (each pins its own staging, overlapped): the transfer still fails. */
	if (expect == -ENOMEM)
		ck_assert_uint_le(st.bytes, st.total);
	else
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

/* The n-th call of `api` after `warm` calls (one warm-up transfer) fails. */
static void injected(const char *api, unsigned warm, unsigned nth, int load, int expect, const char *needle)
{
	char spec[128];

	snprintf(spec, sizeof(spec), "%s:%u", api, warm + nth);
	injected_spec(spec, load, expect, needle);
}

START_TEST(injected_dtoh_failure_clean_error)
{
	injected("cuMemcpyDtoHAsync", slices(), 3, 0, -EIO, "cuMemcpyDtoHAsync of bytes");
}
END_TEST

START_TEST(injected_sync_failure_clean_error)
{
	injected("cuStreamSynchronize", waits() + 2 * SLOTS, 2, 0, -EIO,
		 "device cop"); /* "y of bytes" or "ies of the run" */
}
END_TEST

START_TEST(injected_htod_failure_clean_error)
{
	injected("cuMemcpyHtoDAsync", slices(), 4, 1, -EIO, "cuMemcpyHtoDAsync of bytes");
}
END_TEST

/* Staging is registered pages; the driver's pinned allocation is the
 * fallback, and only both failing fails the transfer. */
START_TEST(injected_pinning_failure_clean_error)
{
	char spec[128];

	snprintf(spec, sizeof(spec), "cuMemHostRegister:%u,cuMemHostAlloc:1", SLOTS + 3);
	injected_spec(spec, 0, -ENOMEM, "cannot pin");
}
END_TEST

START_TEST(injected_register_failure_falls_back_to_driver_pinned_staging)
{
	char spec[128];

	snprintf(spec, sizeof(spec), "cuMemHostRegister:%u", SLOTS + 3);
	injected_spec(spec, 0, 0, "");
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
	h_init(0);
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

/*
 * Many small allocations, as PyTorch and vLLM make them: 1,000 items of
 * 4 KiB with a few odd sizes among them and three large items of several
 * chunks, in blocks of 100 alternating between the two devices. Small
 * contiguous items of one device travel in runs (one stream wait and one
 * pwrite/pread per run); nothing about the file may show it.
 */
#define MANY	   1000
#define MANY_CHUNK (64 * KIB)

struct many {
	CUcontext ctx[2];
	CUdeviceptr base[2];
	uint64_t span[2];
	struct carrier_item items[MANY];
	uint32_t *crc;
	char name[MANY][16];
	uint64_t total;
};

static uint64_t many_size(size_t i)
{
	switch (i) {
	case 7:
		return 4096 + 100;
	case 8:
		return 1;
	case 9:
		return 5;
	case 300:
		return 3 * MANY_CHUNK + 7; /* several chunks, a short last one */
	case 650:
		return 1 * MiB + 3; /* several buffers: its 3-byte tail starts a run */
	case 998:
		return 200 * KIB;
	default:
		return 4096;
	}
}

static int many_dev(size_t i)
{
	return (int)(i / 100 % 2);
}

/* Items carved from one allocation per device, 4 KiB apart or more (not
 * adjacent in device memory), filled with pattern seed i + 1 (or v >= 0). */
static void many_init(struct many *m, CUcontext c0, CUcontext c1)
{
	uint64_t at[2] = {0, 0};

	memset(m, 0, sizeof(*m));
	m->ctx[0] = c0;
	m->ctx[1] = c1;
	m->crc = calloc((size_t)MANY * 32, sizeof(uint32_t));
	for (size_t i = 0; i < MANY; i++)
		m->span[many_dev(i)] += (many_size(i) + 2 * 4096 - 1) / 4096 * 4096;
	for (int d = 0; d < 2; d++) {
		CK(cuCtxSetCurrent(m->ctx[d]));
		CK(cuMemAlloc(&m->base[d], m->span[d]));
	}
	for (size_t i = 0; i < MANY; i++) {
		struct carrier_item *it = &m->items[i];
		int d = many_dev(i);

		snprintf(m->name[i], sizeof(m->name[i]), "alloc %zu", i);
		it->name = m->name[i];
		it->size = many_size(i);
		it->ctx = m->ctx[d];
		it->va = m->base[d] + at[d];
		it->crc = m->crc + i * 32;
		it->ncrc = 32;
		at[d] += (it->size + 2 * 4096 - 1) / 4096 * 4096;
		m->total += it->size;
	}
	CK(cuCtxSetCurrent(c0));
}

static void many_fill(const struct many *m, int v)
{
	uint8_t *b = malloc(2 * MiB);

	for (size_t i = 0; i < MANY; i++) {
		const struct carrier_item *it = &m->items[i];

		if (v >= 0)
			memset(b, v, it->size);
		else
			pattern_fill(b, it->size, (uint32_t)i + 1);
		CK(cuCtxSetCurrent(it->ctx));
		CK(cuMemcpyHtoD(it->va, b, it->size));
	}
	CK(cuCtxSetCurrent(m->ctx[0]));
	free(b);
}

/* The first item whose device bytes are not the pattern (v < 0) or v, or -1. */
static long many_check(const struct many *m, int v)
{
	uint8_t *b = malloc(2 * MiB);
	long bad = -1;

	for (size_t i = 0; i < MANY && bad < 0; i++) {
		const struct carrier_item *it = &m->items[i];

		CK(cuCtxSetCurrent(it->ctx));
		CK(cuMemcpyDtoH(b, it->va, it->size));
		if (v >= 0 ? bytes_check(b, it->size, (uint8_t)v) != -1
			   : pattern_check(b, it->size, (uint32_t)i + 1) != -1)
			bad = (long)i;
	}
	CK(cuCtxSetCurrent(m->ctx[0]));
	free(b);
	return bad;
}

static void many_world(struct many *m)
{
	CUdevice d1;
	CUcontext c0, c1;

	resolve();
	c0 = h_init(0);
	CK(cuDeviceGet(&d1, 1));
	CK(cuDevicePrimaryCtxRetain(&c1, d1));
	many_init(m, c0, c1);
	many_fill(m, -1);
}

/* Save with 2 threads, 1 MiB staging (256 KiB buffers): runs of up to 64
 * small items; the index and file are checked by many_roundtrip. */
static void many_save(struct many *m, int fd, unsigned threads)
{
	struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, threads);
	struct carrier_stats st;
	char err[512];

	ck_assert_msg(carrier_save(&ops, &c, fd, 0, m->items, MANY, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.bytes, m->total);
	ck_assert_uint_le(st.staging_bytes, 1 * MiB);
}

START_TEST(many_small_items_two_devices_same_file_and_crcs_as_one_by_one)
{
	static const unsigned threads[] = {1, 2, 3};
	struct many m;
	int fd = scratch_fd(), ref = scratch_fd();
	uint8_t *file, *want;
	uint32_t *crc1 = calloc((size_t)MANY * 32, sizeof(uint32_t));
	char err[512];

	many_world(&m);
	/* Reference: each item in a transfer of its own (nothing to batch)
	 * at the offset a whole transfer gives it, back to back from 0. */
	for (size_t i = 0, off = 0; i < MANY; off += m.items[i].size, i++) {
		struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, 1);

		ck_assert_msg(carrier_save(&ops, &c, ref, off, &m.items[i], 1, NULL, err, sizeof(err)) == 0, "%s", err);
		ck_assert_uint_eq(m.items[i].offset, off);
	}
	memcpy(crc1, m.crc, (size_t)MANY * 32 * sizeof(uint32_t));
	want = mmap(NULL, m.total, PROT_READ, MAP_SHARED, ref, 0);
	ck_assert_ptr_ne(want, MAP_FAILED);
	for (size_t t = 0; t < 3; t++) {
		struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, threads[t]);
		struct carrier_stats st;
		uint64_t off = 0;

		memset(m.crc, 0, (size_t)MANY * 32 * sizeof(uint32_t));
		ck_assert_int_eq(ftruncate(fd, 0), 0);
		many_save(&m, fd, threads[t]);
		file = mmap(NULL, m.total, PROT_READ, MAP_SHARED, fd, 0);
		ck_assert_ptr_ne(file, MAP_FAILED);
		ck_assert_int_eq(memcmp(file, want, m.total), 0);
		for (size_t i = 0; i < MANY; i++) {
			const struct carrier_item *it = &m.items[i];

			ck_assert_uint_eq(it->offset, off);
			ck_assert_uint_eq(it->chunk_size, MANY_CHUNK);
			ck_assert_uint_eq(it->ncrc, carrier_nchunks(it->size, MANY_CHUNK));
			ck_assert_msg(pattern_check(file + off, it->size, (uint32_t)i + 1) == -1, "alloc %zu", i);
			for (size_t k = 0; k < it->ncrc; k++) {
				uint64_t o = k * MANY_CHUNK, l = it->size - o < MANY_CHUNK ? it->size - o : MANY_CHUNK;

				ck_assert_uint_eq(it->crc[k], ref_crc32c(file + off + o, l));
				ck_assert_uint_eq(it->crc[k], crc1[i * 32 + k]);
			}
			off += it->size;
		}
		munmap(file, m.total);

		many_fill(&m, 0x5a);
		ck_assert_msg(carrier_load(&ops, &c, fd, m.items, MANY, &st, err, sizeof(err)) == 0, "%s", err);
		ck_assert_uint_eq(st.bytes, m.total);
		ck_assert_int_eq(many_check(&m, -1), -1);
	}
	munmap(want, m.total);
	free(crc1);
	free(m.crc);
	close(fd);
	close(ref);
}
END_TEST

/* With one thread, copies are issued in item order, one per item (the
 * large ones one per slice): the n-th cuMemcpy*Async is item n - 1's for
 * n <= 300. Failing it in the middle of a run names that item and its
 * bytes; the copies of the run before it were issued, nothing is loaded
 * past it, and the transfer reports fewer bytes than asked for. */
static void many_injected(const char *api, int load)
{
	struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, 1);
	struct carrier_stats st;
	struct many m;
	char spec[64], err[512] = "";
	int fd = scratch_fd(), rc;

	snprintf(spec, sizeof(spec), "%s:%d", api, 150);
	setenv("FAKECUDA_FAIL", spec, 1);
	many_world(&m);
	if (load) {
		/* Saved from a second, unfailing view: the save issues no HtoD. */
		many_save(&m, fd, 1);
		many_fill(&m, 0x5a);
		rc = carrier_load(&ops, &c, fd, m.items, MANY, &st, err, sizeof(err));
	} else {
		rc = carrier_save(&ops, &c, fd, 0, m.items, MANY, &st, err, sizeof(err));
	}
	ck_assert_msg(rc == -EIO, "%d: %s", rc, err);
	snprintf(spec, sizeof(spec), "alloc 149: %s of bytes 0-4095 ", api);
	ck_assert_msg(strstr(err, spec), "'%s' lacks '%s'", err, spec);
	ck_assert_uint_lt(st.bytes, st.total);
	if (load) {
		uint8_t b[4096];

		/* Runs are at most 64 items: the one holding alloc 149 ends
		 * before alloc 200, and nothing from alloc 200 on was loaded. */
		for (size_t i = 200; i < 300; i++) {
			CK(cuCtxSetCurrent(m.items[i].ctx));
			CK(cuMemcpyDtoH(b, m.items[i].va, sizeof(b)));
			ck_assert_msg(bytes_check(b, sizeof(b), 0x5a) == -1, "alloc %zu was loaded", i);
		}
	}
	free(m.crc);
	close(fd);
}

START_TEST(many_injected_dtoh_failure_in_a_run_names_the_item)
{
	many_injected("cuMemcpyDtoHAsync", 0);
}
END_TEST

START_TEST(many_injected_htod_failure_in_a_run_names_the_item)
{
	many_injected("cuMemcpyHtoDAsync", 1);
}
END_TEST

/* A failed stream wait covers a whole run: the message names its first and
 * last items and their file range. */
START_TEST(many_injected_sync_failure_names_the_run)
{
	struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, 1);
	struct many m;
	char err[512] = "";
	int fd = scratch_fd(), rc;

	setenv("FAKECUDA_FAIL", "cuStreamSynchronize:2", 1);
	many_world(&m);
	rc = carrier_save(&ops, &c, fd, 0, m.items, MANY, NULL, err, sizeof(err));
	ck_assert_msg(rc == -EIO, "%d: %s", rc, err);
	ck_assert_msg(strstr(err, "carrier save: alloc ") && strstr(err, " through alloc ") &&
			      strstr(err, "items): device copies of the run (file offsets "),
		      "%s", err);
	free(m.crc);
	close(fd);
}
END_TEST

/* A corrupt byte inside a run, and a file cut short inside one: both are
 * refused naming the item, and no device byte of the corrupt item (nor,
 * for the short file, of any item) changes. */
START_TEST(many_corrupt_and_truncated_name_the_item)
{
	struct carrier_config c = cfg_make(1 * MiB, MANY_CHUNK, 2);
	const struct carrier_item *it;
	struct many m;
	char err[512], want[96];
	int fd = scratch_fd();
	uint8_t b;

	many_world(&m);
	many_save(&m, fd, 2);
	many_fill(&m, 0x5a);
	it = &m.items[777];
	ck_assert_int_eq(pread(fd, &b, 1, it->offset + 1234), 1);
	b = ~b;
	ck_assert_int_eq(pwrite(fd, &b, 1, it->offset + 1234), 1);
	ck_assert_int_eq(carrier_load(&ops, &c, fd, m.items, MANY, NULL, err, sizeof(err)), -EBADMSG);
	snprintf(want, sizeof(want), "alloc 777: chunk 0 (bytes 0-4095, file offset %llu)",
		 (unsigned long long)it->offset);
	ck_assert_msg(strstr(err, want), "'%s' lacks '%s'", err, want);
	{
		uint8_t d[4096];

		CK(cuCtxSetCurrent(it->ctx));
		CK(cuMemcpyDtoH(d, it->va, sizeof(d)));
		ck_assert_int_eq(bytes_check(d, sizeof(d), 0x5a), -1);
	}
	b = ~b;
	ck_assert_int_eq(pwrite(fd, &b, 1, it->offset + 1234), 1);

	many_fill(&m, 0x5a);
	it = &m.items[900];
	ck_assert_int_eq(ftruncate(fd, (off_t)(it->offset + 100)), 0);
	ck_assert_int_eq(carrier_load(&ops, &c, fd, m.items, MANY, NULL, err, sizeof(err)), -ENODATA);
	snprintf(want, sizeof(want), "alloc 900: needs file bytes %llu-%llu, the file has %llu",
		 (unsigned long long)it->offset, (unsigned long long)(it->offset + it->size - 1),
		 (unsigned long long)(it->offset + 100));
	ck_assert_msg(strstr(err, want), "'%s' lacks '%s'", err, want);
	ck_assert_int_eq(many_check(&m, 0x5a), -1);
	free(m.crc);
	close(fd);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("carrier-fake");
	TCase *t = tcase_create("fake");

	tcase_add_unchecked_fixture(t, h_devd2, h_devd_stop);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, roundtrip_two_devices_every_byte_and_crc);
	tcase_add_test(t, corrupt_byte_refused_chunk_never_reaches_device);
	tcase_add_test(t, corrupt_byte_verify_first_device_untouched);
	tcase_add_test(t, truncated_file_refused_device_untouched);
	tcase_add_test(t, injected_dtoh_failure_clean_error);
	tcase_add_test(t, injected_sync_failure_clean_error);
	tcase_add_test(t, injected_htod_failure_clean_error);
	tcase_add_test(t, injected_pinning_failure_clean_error);
	tcase_add_test(t, injected_register_failure_falls_back_to_driver_pinned_staging);
	tcase_add_test(t, write_enospc_clean_error);
	tcase_add_test(t, staging_bound_for_item_8x_staging);
	tcase_add_test(t, many_small_items_two_devices_same_file_and_crcs_as_one_by_one);
	tcase_add_test(t, many_injected_dtoh_failure_in_a_run_names_the_item);
	tcase_add_test(t, many_injected_htod_failure_in_a_run_names_the_item);
	tcase_add_test(t, many_injected_sync_failure_names_the_run);
	tcase_add_test(t, many_corrupt_and_truncated_name_the_item);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
