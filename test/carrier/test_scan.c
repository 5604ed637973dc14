/*
 * test_scan.c - the device scan of a save (carrier/devscan.c) and the zero
 * chunks of a load, against the fake driver, which runs the chunk-scan
 * kernel's C version (carrier/chunkscan.h) where it keeps device memory.
 * Proves: zero chunks and chunks equal to the parent's are decided on the
 * device and never copied to the host (the fake's copy log), a single
 * flipped bit anywhere makes its chunk carried, zero chunks are set by a
 * memset at load, a corrupt zero mark is refused before the device is
 * touched, and a device that cannot scan leaves the save to the host.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "carrier.h"
#include "chunkscan.h"
#include "devscan.h"
#include "harness.h"
#include "util.h"
#include "../tmpname.h"

#define KIB   1024ull
#define CHUNK (64 * KIB)
#define SIZE  (16 * CHUNK) /* 1 MiB: 16 chunks */
#define NCH   (SIZE / CHUNK)

static struct carrier_ops ops;

static void *lookup(void *arg, const char *name)
{
	(void)arg;
	return dlsym(RTLD_DEFAULT, name);
}

/* One allocation's item with every array the scan fills. */
struct scanned {
	CUdeviceptr va;
	struct carrier_item it;
	uint32_t crc[NCH];
	uint8_t zero[NCH], inherited[NCH], sha[NCH * CARRIER_HASH_LEN], dhash[NCH * CARRIER_DHASH_LEN];
};

static char copylog[64];

/* Bytes the fake copied device-to-host since the log was last cleared. */
static uint64_t dtoh_bytes(void)
{
	FILE *f = fopen(copylog, "r");
	char line[160];
	uint64_t sum = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long b;
		int pid;

		ck_assert_msg(sscanf(line, "pid %d dtoh %llu", &pid, &b) == 2, "copy log line '%s'", line);
		sum += b;
	}
	fclose(f);
	return sum;
}

static void copylog_clear(void)
{
	int fd = open(copylog, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	close(fd);
}

static void setup(void)
{
	char err[128];

	{
		char name[64];

		snprintf(name, sizeof(name), "cuip-scan-copies.%d", (int)getpid());
		test_tmpname(copylog, sizeof(copylog), name);
	}
	setenv("FAKECUDA_COPY_LOG", copylog, 1);
	ck_assert_msg(carrier_ops_resolve(&ops, lookup, NULL, err, sizeof(err)) == 0, "%s", err);
}

/* The fake reads FAKECUDA_FAIL at its first call: set it before this. */
static void begin(void)
{
	h_init(0);
}

static void teardown(void)
{
	unlink(copylog);
	unsetenv("FAKECUDA_COPY_LOG");
}

static struct carrier_config cfg(void)
{
	struct carrier_config c;

	ck_assert_int_eq(carrier_config_init(&c, NULL, 0), 0);
	c.chunk_size = CHUNK;
	c.staging_bytes = 1 << 20;
	c.threads = 2;
	ck_assert_int_eq(c.device_scan, 1); /* the default */
	return c;
}

/* An item over s->va, asking for the scan; parent: the parent's item. */
static void item_init(struct scanned *s, const struct scanned *parent)
{
	CUcontext cur;

	CK(cuCtxGetCurrent(&cur));
	memset(&s->it, 0, sizeof(s->it));
	memset(s->zero, 0, sizeof(s->zero));
	memset(s->inherited, 0, sizeof(s->inherited));
	s->it.va = s->va;
	s->it.size = SIZE;
	s->it.ctx = cur;
	s->it.name = "scanned";
	s->it.chunk_size = CHUNK;
	s->it.crc = s->crc;
	s->it.ncrc = NCH;
	s->it.zero = s->zero;
	s->it.sha = s->sha;
	s->it.dhash = s->dhash;
	s->it.inherited = s->inherited;
	s->it.dhash_key[0] = 0x123456789abcdefull;
	s->it.dhash_key[1] = 0x0fedcba987654321ull;
	if (parent) {
		s->it.parent_dhash = parent->dhash;
		s->it.parent_crc = parent->crc;
		s->it.n_parent_sha = NCH;
	}
}

static int save(struct scanned *s, int fd, struct carrier_stats *st, char *err, size_t errlen)
{
	struct carrier_config c = cfg();

	return carrier_save(&ops, &c, fd, 0, &s->it, 1, st, err, errlen);
}

/* Chunks 3 and 9 hold a pattern, the rest zeros. */
static void fill_two_chunks(CUdeviceptr va)
{
	uint8_t *b = calloc(1, SIZE);

	pattern_fill(b + 3 * CHUNK, CHUNK, 3);
	pattern_fill(b + 9 * CHUNK, CHUNK, 9);
	CK(cuMemcpyHtoD(va, b, SIZE));
	free(b);
}

START_TEST(zero_chunks_decided_on_the_device_never_copied)
{
	struct scanned s;
	struct carrier_stats st;
	uint8_t *file = malloc(SIZE), zh[CARRIER_DHASH_LEN] = {0};
	char err[512];
	int fd = scratch_fd();

	begin();
	CK(cuMemAlloc(&s.va, SIZE));
	fill_two_chunks(s.va);
	item_init(&s, NULL);
	copylog_clear();
	ck_assert_msg(save(&s, fd, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(st.scan_device, "fell back: %s", st.scan_fallback);
	ck_assert_uint_eq(st.scanned_bytes, SIZE);
	ck_assert_uint_eq(st.copied_bytes, 2 * CHUNK);
	ck_assert_uint_eq(st.zero_bytes, 14 * CHUNK);
	/* The two data chunks and the scan's results, nothing more. */
	ck_assert_uint_eq(dtoh_bytes(), 2 * CHUNK + NCH * 3 * sizeof(uint64_t));
	ck_assert_int_eq(pread(fd, file, SIZE, 0), (ssize_t)SIZE);
	for (size_t k = 0; k < NCH; k++) {
		bool data = k == 3 || k == 9;

		ck_assert_uint_eq(s.zero[k], !data);
		ck_assert_uint_eq(s.crc[k], ref_crc32c(file + k * CHUNK, CHUNK));
		if (!data) {
			ck_assert_uint_eq(s.crc[k], carrier_zero_crc(CHUNK));
			ck_assert_int_eq(memcmp(s.dhash + k * CARRIER_DHASH_LEN, zh, sizeof(zh)), 0);
			ck_assert_int_eq(bytes_check(file + k * CHUNK, CHUNK, 0), -1);
		} else {
			uint64_t ref[3];

			cuip_chunkscan_host(file + k * CHUNK, CHUNK, s.it.dhash_key, ref);
			ck_assert_uint_eq(ref[2], 1);
			ck_assert_int_eq(memcmp(s.dhash + k * CARRIER_DHASH_LEN, &ref[0], 8),
					 0); /* little-endian host */
			ck_assert_int_eq(memcmp(s.dhash + k * CARRIER_DHASH_LEN + 8, &ref[1], 8), 0);
			ck_assert_int_eq(pattern_check(file + k * CHUNK, CHUNK, (uint32_t)k), -1);
		}
	}
	/* Zero chunks hold no block: only the two data chunks are data. */
	ck_assert_int_eq(lseek(fd, 0, SEEK_DATA), (off_t)(3 * CHUNK));
	ck_assert_int_eq(lseek(fd, 3 * CHUNK, SEEK_HOLE), (off_t)(4 * CHUNK));
	free(file);
	close(fd);
}
END_TEST

START_TEST(unchanged_against_parent_copies_nothing)
{
	struct scanned p, c;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd(), fd2 = scratch_fd();
	uint8_t *b = malloc(SIZE);

	begin();
	CK(cuMemAlloc(&p.va, SIZE));
	pattern_fill(b, SIZE, 77);
	memset(b + 5 * CHUNK, 0, CHUNK);
	CK(cuMemcpyHtoD(p.va, b, SIZE));
	item_init(&p, NULL);
	ck_assert_msg(save(&p, fd, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.copied_bytes, 15 * CHUNK);

	c.va = p.va;
	item_init(&c, &p);
	copylog_clear();
	ck_assert_msg(save(&c, fd2, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert(st.scan_device);
	ck_assert_uint_eq(st.copied_bytes, 0);
	ck_assert_uint_eq(st.inherited_bytes, 15 * CHUNK);
	ck_assert_uint_eq(st.zero_bytes, CHUNK);
	ck_assert_uint_eq(dtoh_bytes(), NCH * 3 * sizeof(uint64_t));
	for (size_t k = 0; k < NCH; k++) {
		ck_assert_uint_eq(c.inherited[k], k != 5);
		ck_assert_uint_eq(c.zero[k], k == 5);
		ck_assert_uint_eq(c.crc[k], p.crc[k]);
	}
	/* Nothing written: the child's file is all hole. */
	ck_assert_int_eq(lseek(fd2, 0, SEEK_DATA), -1);
	free(b);
	close(fd);
	close(fd2);
}
END_TEST

/* A single flipped bit, at every position of the first and last words of
 * every chunk and at 256 random positions: its chunk is carried (copied,
 * not inherited) and every other chunk is the parent's. */
START_TEST(single_flipped_bit_anywhere_is_carried)
{
	struct scanned p, c;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd(), fd2 = scratch_fd();
	uint8_t *b = malloc(SIZE);
	uint64_t pos[NCH * 64 + 256];
	size_t np = 0;

	begin();
	CK(cuMemAlloc(&p.va, SIZE));
	pattern_fill(b, SIZE, 5);
	CK(cuMemcpyHtoD(p.va, b, SIZE));
	item_init(&p, NULL);
	ck_assert_msg(save(&p, fd, &st, err, sizeof(err)) == 0, "%s", err);
	for (uint64_t k = 0; k < NCH; k++)
		for (uint64_t bit = 0; bit < 32; bit++) {
			pos[np++] = k * CHUNK * 8 + bit;
			pos[np++] = (k + 1) * CHUNK * 8 - 32 + bit;
		}
	srand(46);
	for (int r = 0; r < 256; r++)
		pos[np++] = ((uint64_t)rand() * RAND_MAX + (uint64_t)rand()) % (SIZE * 8);
	c.va = p.va;
	for (size_t i = 0; i < np; i++) {
		uint64_t byte = pos[i] / 8, k = byte / CHUNK;
		uint8_t v = b[byte] ^ (uint8_t)(1u << (pos[i] % 8));

		CK(cuMemcpyHtoD(p.va + byte, &v, 1));
		item_init(&c, &p);
		ck_assert_msg(save(&c, fd2, &st, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(st.copied_bytes == CHUNK && !c.inherited[k] && !c.zero[k],
			      "bit %llu (chunk %llu): copied %llu, inherited %u", (unsigned long long)pos[i],
			      (unsigned long long)k, (unsigned long long)st.copied_bytes, c.inherited[k]);
		ck_assert_uint_ne(c.crc[k], p.crc[k]);
		for (uint64_t j = 0; j < NCH; j++)
			ck_assert_uint_eq(c.inherited[j], j != k);
		CK(cuMemcpyHtoD(p.va + byte, &b[byte], 1));
	}
	free(b);
	close(fd);
	close(fd2);
}
END_TEST

START_TEST(zero_chunks_loaded_by_a_device_memset)
{
	struct scanned s;
	struct carrier_item ld;
	struct carrier_stats st;
	struct carrier_config c = cfg();
	char err[512];
	int fd = scratch_fd();
	uint8_t *b = malloc(SIZE);
	CUdeviceptr to;

	begin();
	CK(cuMemAlloc(&s.va, SIZE));
	fill_two_chunks(s.va);
	item_init(&s, NULL);
	ck_assert_msg(save(&s, fd, &st, err, sizeof(err)) == 0, "%s", err);
	CK(cuMemAlloc(&to, SIZE));
	CK(cuMemsetD8(to, 0xab, SIZE));
	ld = s.it;
	ld.va = to;
	ld.inherited = NULL;
	ck_assert_msg(carrier_load(&ops, &c, fd, &ld, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.zero_bytes, 14 * CHUNK);
	CK(cuMemcpyDtoH(b, to, SIZE));
	for (size_t k = 0; k < NCH; k++)
		if (k == 3 || k == 9)
			ck_assert_int_eq(pattern_check(b + k * CHUNK, CHUNK, (uint32_t)k), -1);
		else
			ck_assert_int_eq(bytes_check(b + k * CHUNK, CHUNK, 0), -1);

	/* An index that marks a data chunk zero is refused, the device untouched. */
	CK(cuMemsetD8(to, 0xab, SIZE));
	s.zero[9] = 1;
	ld.zero = s.zero;
	ck_assert_int_eq(carrier_load(&ops, &c, fd, &ld, 1, &st, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "chunk 9 is recorded as all zero"), "%s", err);
	CK(cuMemcpyDtoH(b, to, SIZE));
	ck_assert_int_eq(bytes_check(b, SIZE, 0xab), -1);
	free(b);
	close(fd);
}
END_TEST

/* A 64 MiB allocation of zeros over several batches: scanned, not copied,
 * restored as zeros by a memset over the old bytes. */
START_TEST(large_zero_allocation_scanned_not_copied)
{
	const uint64_t size = 64 << 20, chunk = 1 << 20, n = size / chunk;
	struct carrier_item it = {0}, ld;
	struct carrier_stats st;
	struct carrier_config c = cfg();
	uint32_t *crc = calloc(n, sizeof(*crc));
	uint8_t *zero = calloc(n, 1), *dh = calloc(n, CARRIER_DHASH_LEN), *b = malloc(size);
	char err[512];
	int fd = scratch_fd();
	CUdeviceptr va;

	c.chunk_size = chunk;
	begin();
	CK(cuMemAlloc(&va, size));
	CK(cuMemsetD8(va, 0, size));
	it = (struct carrier_item){.va = va,
				   .size = size,
				   .name = "zeros",
				   .chunk_size = chunk,
				   .crc = crc,
				   .ncrc = n,
				   .zero = zero,
				   .dhash = dh,
				   .dhash_key = {3, 5}};
	copylog_clear();
	ck_assert_msg(carrier_save(&ops, &c, fd, 0, &it, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert(st.scan_device);
	ck_assert_uint_eq(st.scanned_bytes, size);
	ck_assert_uint_eq(st.copied_bytes, 0);
	ck_assert_uint_eq(st.zero_bytes, size);
	ck_assert_uint_eq(dtoh_bytes(), n * 3 * sizeof(uint64_t));
	ck_assert_int_eq(lseek(fd, 0, SEEK_END), (off_t)size);
	ck_assert_int_eq(lseek(fd, 0, SEEK_DATA), -1);
	CK(cuMemsetD8(va, 0x5a, size));
	ld = it;
	ck_assert_msg(carrier_load(&ops, &c, fd, &ld, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.zero_bytes, size);
	CK(cuMemcpyDtoH(b, va, size));
	ck_assert_int_eq(bytes_check(b, size, 0), -1);
	free(crc);
	free(zero);
	free(dh);
	free(b);
	close(fd);
}
END_TEST

START_TEST(device_that_cannot_scan_leaves_the_save_to_the_host)
{
	struct scanned s;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd();
	uint8_t *file = malloc(SIZE);

	begin();
	CK(cuMemAlloc(&s.va, SIZE));
	fill_two_chunks(s.va);
	item_init(&s, NULL);
	ops.module_load_data = NULL;
	copylog_clear();
	ck_assert_msg(save(&s, fd, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert(!st.scan_device);
	ck_assert_msg(strstr(st.scan_fallback, "lacks an entry point"), "%s", st.scan_fallback);
	ck_assert_uint_eq(st.copied_bytes, SIZE);
	ck_assert_uint_eq(dtoh_bytes(), SIZE);
	ck_assert_uint_eq(st.zero_bytes, 14 * CHUNK); /* found on the host */
	ck_assert_int_eq(pread(fd, file, SIZE, 0), (ssize_t)SIZE);
	for (size_t k = 0; k < NCH; k++) {
		ck_assert_uint_eq(s.zero[k], k != 3 && k != 9);
		ck_assert_uint_eq(s.crc[k], ref_crc32c(file + k * CHUNK, CHUNK));
	}
	free(file);
	close(fd);
}
END_TEST

/* The job writing between the scan and the copy (a live pre-copy): the
 * progress callback, which the scan calls after its batch, rewrites chunk
 * 3 on the device before the pipeline copies it. */
static CUdeviceptr live_va;

static void job_writes(void *arg, uint64_t done, uint64_t total)
{
	uint8_t *b = malloc(CHUNK);

	(void)done;
	(void)total;
	if (*(int *)arg == 0) {
		pattern_fill(b, CHUNK, 33);
		CK(cuMemcpyHtoD(live_va + 3 * CHUNK, b, CHUNK));
		*(int *)arg = 1;
	}
	free(b);
}

/* A live save's hashes are those of the bytes written, so that a child
 * that finds the scanned bytes again can never inherit other bytes; a
 * save of a stopped job keeps the scan's (the bytes cannot change). */
START_TEST(live_save_hashes_the_bytes_it_wrote)
{
	for (int live = 0; live < 2; live++) {
		struct scanned s;
		struct carrier_stats st;
		struct carrier_config c = cfg();
		uint64_t old_h[3], new_h[3];
		uint8_t *b = malloc(CHUNK), *file = malloc(SIZE);
		char err[512];
		int fd = scratch_fd(), wrote = 0;

		if (!live)
			begin();
		CK(cuMemAlloc(&s.va, SIZE));
		live_va = s.va;
		fill_two_chunks(s.va);
		pattern_fill(b, CHUNK, 3);
		item_init(&s, NULL);
		cuip_chunkscan_host(b, CHUNK, s.it.dhash_key, old_h);
		c.live = live;
		c.progress = job_writes;
		c.progress_arg = &wrote;
		c.progress_every = 1;
		ck_assert_msg(carrier_save(&ops, &c, fd, 0, &s.it, 1, &st, err, sizeof(err)) == 0, "%s", err);
		ck_assert(st.scan_device);
		ck_assert_int_eq(wrote, 1);
		ck_assert_int_eq(pread(fd, file, SIZE, 0), (ssize_t)SIZE);
		ck_assert_int_eq(pattern_check(file + 3 * CHUNK, CHUNK, 33), -1); /* the bytes written */
		ck_assert_uint_eq(s.crc[3], ref_crc32c(file + 3 * CHUNK, CHUNK));
		cuip_chunkscan_host(file + 3 * CHUNK, CHUNK, s.it.dhash_key, new_h);
		ck_assert(memcmp(old_h, new_h, 16));
		ck_assert_int_eq(memcmp(s.dhash + 3 * CARRIER_DHASH_LEN, live ? new_h : old_h, 16), 0);
		free(b);
		free(file);
		close(fd);
	}
}
END_TEST

/* The first launch refused: nothing was decided, the host saves. */
START_TEST(injected_launch_failure_falls_back_to_the_host)
{
	struct scanned s;
	struct carrier_stats st;
	char err[512] = "";
	int fd = scratch_fd();

	setenv("FAKECUDA_FAIL", "cuLaunchKernel:1", 1);
	begin();
	CK(cuMemAlloc(&s.va, SIZE));
	fill_two_chunks(s.va);
	item_init(&s, NULL);
	ck_assert_msg(save(&s, fd, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert(!st.scan_device);
	ck_assert_msg(strstr(st.scan_fallback, "launching the chunk scan"), "%s", st.scan_fallback);
	ck_assert_uint_eq(st.copied_bytes, SIZE);
	ck_assert_uint_eq(st.zero_bytes, 14 * CHUNK);
	unsetenv("FAKECUDA_FAIL");
	close(fd);
}
END_TEST

/* jit-log lines since the log was made, as one string of words. */
static void jit_words(const char *log, char *out, size_t len)
{
	FILE *f = fopen(log, "r");
	char line[160], word[16];
	size_t at = 0;

	out[0] = '\0';
	if (!f)
		return;
	while (at + 1 < len && fgets(line, sizeof(line), f) && sscanf(line, "pid %*d %15s", word) == 1) {
		int n = snprintf(out + at, len - at, "%s%s", at ? " " : "", word);

		at = n > 0 && (size_t)n < len - at ? at + (size_t)n : len - 1;
	}
	fclose(f);
}

/* The compile ahead of a save (carrier_scan_warm): the driver compiles
 * the PTX once and keeps it in its cache, which the save's load then
 * finds; nothing is loaded with the scan off or the cache disabled, and a
 * driver without the entry points or a failing load says so. */
START_TEST(scan_compiled_ahead_into_the_drivers_cache)
{
	char cache[128], log[128], name[64], err[256], words[128];
	struct carrier_config c;
	struct carrier_ops o;
	double secs = -1;

	test_tmpname(cache, sizeof(cache), "cuip-jit-cache.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(cache)); /* empty: the first load compiles */
	snprintf(name, sizeof(name), "cuip-jit-log.%d", (int)getpid());
	test_tmpname(log, sizeof(log), name);
	unlink(log);
	setenv("CUDA_CACHE_PATH", cache, 1);
	setenv("FAKECUDA_JIT_LOG", log, 1);
	setenv("FAKECUDA_FAIL", "cuModuleLoadData:3:CUDA_ERROR_OUT_OF_MEMORY", 1);
	begin();
	c = cfg();
	ck_assert_msg(carrier_scan_warm(&ops, &c, &secs, err, sizeof(err)) == 0, "%s", err);
	ck_assert(secs >= 0);
	ck_assert_msg(carrier_scan_warm(&ops, &c, &secs, err, sizeof(err)) == 0, "%s", err);
	jit_words(log, words, sizeof(words));
	ck_assert_str_eq(words, "jit cached");
	/* the third load fails: -EIO naming the driver's error */
	ck_assert_int_eq(carrier_scan_warm(&ops, &c, &secs, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "cuModuleLoadData of the chunk-scan PTX failed: CUDA_ERROR_OUT_OF_MEMORY"), "%s",
		      err);
	/* nothing loaded from here on */
	unlink(log);
	c.device_scan = 0;
	ck_assert_int_eq(carrier_scan_warm(&ops, &c, &secs, err, sizeof(err)), -ECANCELED);
	ck_assert_msg(strstr(err, "the device scan is off"), "%s", err);
	c.device_scan = 1;
	setenv("CUDA_CACHE_DISABLE", "1", 1);
	ck_assert_int_eq(carrier_scan_warm(&ops, &c, &secs, err, sizeof(err)), -ECANCELED);
	ck_assert_msg(strstr(err, "CUDA_CACHE_DISABLE=1"), "%s", err);
	unsetenv("CUDA_CACHE_DISABLE");
	o = ops;
	o.module_unload = NULL;
	ck_assert_int_eq(carrier_scan_warm(&o, &c, &secs, err, sizeof(err)), -ENOTSUP);
	ck_assert_msg(strstr(err, "lacks cuModuleLoadData or cuModuleUnload"), "%s", err);
	jit_words(log, words, sizeof(words));
	ck_assert_str_eq(words, "");
	unsetenv("FAKECUDA_FAIL");
	unsetenv("FAKECUDA_JIT_LOG");
	unsetenv("CUDA_CACHE_PATH");
	{
		char cmd[160];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cache);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

/* A failure once the device ran (the copy of its results): the save
 * fails naming it, rather than trusting or dropping a decision. */
START_TEST(injected_result_copy_failure_fails_the_save)
{
	struct scanned s;
	struct carrier_stats st;
	char err[512] = "";
	int fd = scratch_fd();

	setenv("FAKECUDA_FAIL", "cuMemcpyDtoHAsync:1", 1);
	begin();
	CK(cuMemAlloc(&s.va, SIZE));
	fill_two_chunks(s.va);
	item_init(&s, NULL);
	ck_assert_int_eq(save(&s, fd, &st, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "the chunk scan of scanned failed on the device"), "%s", err);
	unsetenv("FAKECUDA_FAIL");
	close(fd);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("devscan");
	TCase *tc = tcase_create("fake");

	tcase_add_unchecked_fixture(tc, h_devd1, h_devd_stop);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, zero_chunks_decided_on_the_device_never_copied);
	tcase_add_test(tc, unchanged_against_parent_copies_nothing);
	tcase_add_test(tc, single_flipped_bit_anywhere_is_carried);
	tcase_add_test(tc, zero_chunks_loaded_by_a_device_memset);
	tcase_add_test(tc, large_zero_allocation_scanned_not_copied);
	tcase_add_test(tc, device_that_cannot_scan_leaves_the_save_to_the_host);
	tcase_add_test(tc, live_save_hashes_the_bytes_it_wrote);
	tcase_add_test(tc, injected_launch_failure_falls_back_to_the_host);
	tcase_add_test(tc, injected_result_copy_failure_fails_the_save);
	tcase_add_test(tc, scan_compiled_ahead_into_the_drivers_cache);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
