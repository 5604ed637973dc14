/*
 * test_pipeline.c - the carrier's pipeline against the deferred-copy stub
 * driver (stub.c): exact bytes and CRCs through every slicing case, refusal
 * of corrupt, truncated and mismatched carriers, write failures, injected
 * driver failures at every step, the staging bound, progress and the
 * configuration. The same behaviours against the fake driver are in
 * test_fake.c. `test_pipeline --needs-root` runs only the tests that need
 * root (a tmpfs mounted in a private mount namespace) and exits 77 without
 * it (enospc-root.sh, its own TESTS entry); the plain run leaves them out.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "carrier.h"
#include "sha256.h"
#include "stub.h"
#include "util.h"
#include "zchunk.h"
#include "../tmpname.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

/* "Device memory" for the stub: one mapping per item. */
struct dev {
	size_t n;
	uint8_t *mem[8];
	uint64_t size[8];
	uint32_t *crc[8];
	char name[8][32];
	struct carrier_item items[8];
};

static void dev_init(struct dev *d, const uint64_t *sizes, size_t n, uint8_t fill)
{
	memset(d, 0, sizeof(*d));
	d->n = n;
	for (size_t i = 0; i < n; i++) {
		size_t len = sizes[i] ? sizes[i] : 1;

		d->mem[i] = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ck_assert_ptr_ne(d->mem[i], MAP_FAILED);
		if (fill)
			memset(d->mem[i], fill, len);
		else
			pattern_fill(d->mem[i], len, (uint32_t)i + 1);
		d->size[i] = sizes[i];
		d->crc[i] = calloc(sizes[i] / 4096 + 8, sizeof(uint32_t));
		snprintf(d->name[i], sizeof(d->name[i]), "alloc %zu", i);
		d->items[i] = (struct carrier_item){
			.va = (CUdeviceptr)(uintptr_t)d->mem[i],
			.size = sizes[i],
			.ctx = STUB_CTX,
			.name = d->name[i],
			.crc = d->crc[i],
			.ncrc = sizes[i] / 4096 + 8,
		};
	}
}

static void dev_free(struct dev *d)
{
	for (size_t i = 0; i < d->n; i++) {
		munmap(d->mem[i], d->size[i] ? d->size[i] : 1);
		free(d->crc[i]);
	}
}

/* Load-side items: same index, fresh memory filled with `fill`. */
static void dev_like(struct dev *to, const struct dev *from, uint8_t fill)
{
	dev_init(to, from->size, from->n, fill);
	for (size_t i = 0; i < from->n; i++) {
		to->items[i].chunk_size = from->items[i].chunk_size;
		to->items[i].offset = from->items[i].offset;
		to->items[i].ncrc = from->items[i].ncrc;
		memcpy(to->crc[i], from->crc[i], from->items[i].ncrc * sizeof(uint32_t));
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

static void assert_no_leak(void)
{
	struct stub_counts c;

	stub_get(&c);
	ck_assert_int_eq(c.pinned_bytes, 0);
	ck_assert_int_eq(c.host_allocs, 0);
	ck_assert_int_eq(c.streams, 0);
}

static void setup(void)
{
	stub_reset();
}

/* 1 byte, 4 KiB + 3, exactly a chunk, chunk + 1, several buffers' worth. */
static const uint64_t mixed[] = {1, 4 * KIB + 3, 64 * KIB, 64 * KIB + 1, 3 * MIB + 5};
#define NMIXED (sizeof(mixed) / sizeof(mixed[0]))

static void roundtrip(const struct carrier_config *cfg, uint64_t start)
{
	struct dev src, dst;
	struct carrier_stats st;
	char err[512] = "";
	uint64_t off = start, total = 0;
	int fd = scratch_fd();
	uint8_t *file;
	struct stat sb;

	ck_assert_int_ge(fd, 0);
	dev_init(&src, mixed, NMIXED, 0);
	ck_assert_msg(carrier_save(&stub_ops, cfg, fd, start, src.items, src.n, &st, err, sizeof(err)) == 0, "%s", err);
	for (size_t i = 0; i < src.n; i++) {
		ck_assert_uint_eq(src.items[i].offset, off);
		ck_assert_uint_eq(src.items[i].chunk_size, cfg->chunk_size);
		ck_assert_uint_eq(src.items[i].ncrc, carrier_nchunks(mixed[i], cfg->chunk_size));
		off += mixed[i];
		total += mixed[i];
	}
	ck_assert_uint_eq(st.bytes, total);
	ck_assert_uint_eq(st.total, total);
	ck_assert_uint_le(st.staging_bytes, cfg->staging_bytes);
	ck_assert_int_eq(fstat(fd, &sb), 0);
	ck_assert_int_eq(sb.st_size, (off_t)off);

	/* The file holds exactly the device bytes; CRCs recomputed here. */
	file = mmap(NULL, off, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(file, MAP_FAILED);
	for (size_t i = 0; i < src.n; i++) {
		const struct carrier_item *it = &src.items[i];

		ck_assert_int_eq(pattern_check(file + it->offset, it->size, (uint32_t)i + 1), -1);
		for (size_t k = 0; k < it->ncrc; k++) {
			uint64_t o = k * it->chunk_size;
			uint64_t l = it->size - o < it->chunk_size ? it->size - o : it->chunk_size;

			ck_assert_uint_eq(it->crc[k], ref_crc32c(file + it->offset + o, l));
		}
	}
	munmap(file, off);

	dev_like(&dst, &src, 0);
	ck_assert_msg(carrier_load(&stub_ops, cfg, fd, dst.items, dst.n, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.bytes, total);
	for (size_t i = 0; i < dst.n; i++)
		ck_assert_int_eq(pattern_check(dst.mem[i], mixed[i], (uint32_t)i + 1), -1);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}

START_TEST(roundtrip_mixed_sizes_every_byte_and_crc)
{
	/* Staging 1 MiB over 2 slots per thread: buffers hold 1-8 chunks, the
	 * largest item needs several buffers, and sizes are not multiples. */
	static const unsigned threads[] = {1, 2, 3, 8};

	for (size_t t = 0; t < 4; t++) {
		struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, threads[t]);

		roundtrip(&c, 0);
		roundtrip(&c, 12345);
		c.verify_first = 1;
		roundtrip(&c, 7);
	}
}
END_TEST

/*
 * Zero runs are left as holes: a 4 MiB + 3 item whose 64 KiB units are
 * zero where the test says (an aligned run, a run straddling two units
 * that only fills one, and the tail) saved after a header the carrier
 * must keep, into a file that held 0xff bytes past the header. The file
 * reads back the header, then exactly the device bytes, ends at the
 * item's end, holds no blocks for the skipped units, and loads back.
 */
START_TEST(zero_runs_left_as_holes_read_back_as_zeros)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	static const uint64_t size[] = {4 * MIB + 3};
	const uint64_t hdr = 8 * KIB;
	struct dev src, dst;
	struct carrier_stats st;
	char err[512] = "";
	int fd = scratch_fd();
	uint8_t *ff = malloc(8 * MIB), *file;
	struct stat before, after;

	ck_assert_int_ge(fd, 0);
	memset(ff, 0xff, 8 * MIB);
	ck_assert_int_eq(pwrite(fd, ff, 8 * MIB, 0), (ssize_t)(8 * MIB));
	dev_init(&src, size, 1, 0);
	/* file offsets hdr + x: unit-aligned zero runs at file [1 MiB, 2 MiB)
	 * and [3 MiB, end); [2 MiB + 32 KiB, 2 MiB + 160 KiB) covers one whole
	 * unit ([2 MiB + 64 KiB, 2 MiB + 128 KiB)) and two halves. */
	memset(src.mem[0] + 1 * MIB - hdr, 0, 1 * MIB);
	memset(src.mem[0] + 2 * MIB + 32 * KIB - hdr, 0, 128 * KIB);
	memset(src.mem[0] + 3 * MIB - hdr, 0, size[0] - (3 * MIB - hdr));
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, hdr, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	/* skipped: at least the whole zero units ([1, 2) MiB, one unit, [3, 4)
	 * MiB and the short last unit [4 MiB, 4 MiB + 8 KiB + 3)), at most
	 * every zero byte (the halves of the straddled units too, where a
	 * slice boundary cut the unit there) */
	ck_assert_uint_ge(st.hole_bytes, 1 * MIB + 64 * KIB + 1 * MIB + 8 * KIB + 3);
	ck_assert_uint_le(st.hole_bytes, 1 * MIB + 128 * KIB + 1 * MIB + 8 * KIB + 3);
	ck_assert_int_eq(fstat(fd, &after), 0);
	ck_assert_int_eq(after.st_size, (off_t)(hdr + size[0]));
	file = mmap(NULL, hdr + size[0], PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(file, MAP_FAILED);
	ck_assert_mem_eq(file, ff, hdr);
	ck_assert_int_eq(memcmp(file + hdr, src.mem[0], size[0]), 0);
	ck_assert_uint_eq(src.crc[0][0], ref_crc32c(file + hdr, 64 * KIB));
	munmap(file, hdr + size[0]);
	/* blocks: at most the bytes written, rounded to the file system's
	 * blocks (a file system without holes is not this machine's) */
	before = after;
	ck_assert_msg((uint64_t)before.st_blocks * 512 <= hdr + size[0] - (2 * MIB + 64 * KIB) + 64 * KIB,
		      "%lld blocks of 512 for %llu bytes written", (long long)before.st_blocks,
		      (unsigned long long)(hdr + size[0] - st.hole_bytes));

	dev_like(&dst, &src, 0x5a);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(memcmp(dst.mem[0], src.mem[0], size[0]), 0);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	free(ff);
	close(fd);
}
END_TEST

/* A file that held more before and cannot shrink (a memfd sealed against
 * shrinking) is punched, never truncated: its zero runs are holes, its old
 * 0xff bytes do not show through, its size stays. A file that cannot grow
 * (sealed against growing) cannot end where its zero tail does: the save
 * fails naming the file and the size. */
START_TEST(zero_runs_punched_where_the_file_cannot_shrink)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 1);
	static const uint64_t size[] = {256 * KIB};
	const char *names[] = {"sealed.img"};
	struct dev src;
	struct carrier_stats st;
	char err[512] = "";
	uint8_t *ff = malloc(size[0]), *back = malloc(size[0]);
	int fd = memfd_create("carrier-sealed", MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	memset(ff, 0xff, size[0]);
	ck_assert_int_eq(pwrite(fd, ff, size[0], 0), (ssize_t)size[0]);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	dev_init(&src, size, 1, 0);
	memset(src.mem[0], 0, size[0]);
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.hole_bytes, size[0]);
	ck_assert_int_eq(pread(fd, back, size[0], 0), (ssize_t)size[0]);
	ck_assert_int_eq(memcmp(back, src.mem[0], size[0]), 0);
	close(fd);

	fd = memfd_create("carrier-nogrow", MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_GROW), 0);
	c.file_names = names;
	c.n_file_names = 1;
	ck_assert_int_eq(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "carrier save: cannot size sealed.img to 262144 bytes: "), "%s", err);
	assert_no_leak();
	dev_free(&src);
	free(ff);
	free(back);
	close(fd);
}
END_TEST

/*
 * Incremental save: each chunk's SHA-256 is computed as it passes; with
 * the parent's hashes, a chunk that equals its parent's is not written
 * (the file keeps a hole there, inherited set) and one that changed is.
 * A load whose extents take the inherited chunks from the parent's file
 * and the changed one from the child's gets every byte back.
 */
START_TEST(parent_chunks_are_not_written_and_a_load_through_both_files_is_whole)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	static const uint64_t size[] = {MIB + 100, 300 * KIB};
	uint8_t *sha[2], *psha[2], *inh[2], h[CARRIER_HASH_LEN];
	uint64_t poff[2], coff[2];
	struct carrier_stats st;
	struct dev src, dst;
	char err[512] = "";
	int pfd = scratch_fd(), cfd = scratch_fd(), fds[2];
	struct stat sb;

	dev_init(&src, size, 2, 0);
	for (int i = 0; i < 2; i++) {
		size_t n = carrier_nchunks(size[i], 64 * KIB);

		sha[i] = calloc(n, CARRIER_HASH_LEN);
		psha[i] = calloc(n, CARRIER_HASH_LEN);
		inh[i] = calloc(n, 1);
		src.items[i].sha = psha[i];
	}
	ck_assert_msg(carrier_save(&stub_ops, &c, pfd, 0, src.items, 2, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.inherited_bytes, 0);
	for (int i = 0; i < 2; i++) {
		poff[i] = src.items[i].offset;
		for (size_t k = 0; k < carrier_nchunks(size[i], 64 * KIB); k++) {
			uint64_t l = size[i] - k * 64 * KIB < 64 * KIB ? size[i] - k * 64 * KIB : 64 * KIB;

			cuip_sha256(src.mem[i] + k * 64 * KIB, l, h);
			ck_assert_mem_eq(psha[i] + k * CARRIER_HASH_LEN, h, CARRIER_HASH_LEN);
		}
	}
	/* Chunk 3 of item 0 changes; the rest is the parent's. */
	src.mem[0][3 * 64 * KIB + 5] ^= 0x5a;
	for (int i = 0; i < 2; i++) {
		src.items[i].sha = sha[i];
		src.items[i].parent_sha = psha[i];
		src.items[i].n_parent_sha = carrier_nchunks(size[i], 64 * KIB);
		src.items[i].inherited = inh[i];
	}
	ck_assert_msg(carrier_save(&stub_ops, &c, cfd, 0, src.items, 2, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.inherited_bytes, size[0] + size[1] - 64 * KIB);
	for (size_t k = 0; k < carrier_nchunks(size[0], 64 * KIB); k++)
		ck_assert_uint_eq(inh[0][k], k != 3);
	for (size_t k = 0; k < carrier_nchunks(size[1], 64 * KIB); k++)
		ck_assert_uint_eq(inh[1][k], 1);
	ck_assert_mem_ne(sha[0] + 3 * CARRIER_HASH_LEN, psha[0] + 3 * CARRIER_HASH_LEN, CARRIER_HASH_LEN);
	ck_assert_int_eq(fstat(cfd, &sb), 0);
	ck_assert_uint_eq((uint64_t)sb.st_size, size[0] + size[1]);
	ck_assert_msg((uint64_t)sb.st_blocks * 512 <= 128 * KIB, "%lld blocks stored for one 64 KiB chunk",
		      (long long)sb.st_blocks);
	for (int i = 0; i < 2; i++)
		coff[i] = src.items[i].offset;

	/* Load item 0 through both files: chunks 0-2 and 4.. from the
	 * parent's (file 0), chunk 3 from the child's (file 1). */
	dev_like(&dst, &src, 0);
	dst.n = 1;
	dst.items[0].ext = malloc(3 * sizeof(struct carrier_extent));
	dst.items[0].ext[0] = (struct carrier_extent){0, poff[0], 3 * 64 * KIB};
	dst.items[0].ext[1] = (struct carrier_extent){1, coff[0] + 3 * 64 * KIB, 64 * KIB};
	dst.items[0].ext[2] = (struct carrier_extent){0, poff[0] + 4 * 64 * KIB, size[0] - 4 * 64 * KIB};
	dst.items[0].next = 3;
	fds[0] = pfd;
	fds[1] = cfd;
	ck_assert_msg(carrier_load_striped(&stub_ops, &c, fds, 2, dst.items, 1, NULL, err, sizeof(err)) == 0, "%s",
		      err);
	ck_assert_int_eq(memcmp(dst.mem[0], src.mem[0], size[0]), 0);
	free(dst.items[0].ext);
	dst.n = 2;
	dev_free(&dst);

	/* Parent hashes without the arrays to fill are refused. */
	src.items[1].inherited = NULL;
	ck_assert_int_eq(carrier_save(&stub_ops, &c, cfd, 0, src.items, 2, &st, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "alloc 1: parent hashes without hash or inherited arrays"), "%s", err);
	assert_no_leak();
	for (int i = 0; i < 2; i++) {
		free(sha[i]);
		free(psha[i]);
		free(inh[i]);
	}
	dev_free(&src);
	close(pfd);
	close(cfd);
}
END_TEST

/*
 * 1,000 items of 4 KiB (a few empty, one of 4 KiB + 100) over two files,
 * alternating: each file's items are contiguous in it, so they travel in
 * runs of up to 64 (256 KiB buffers) that skip the other file's items. One
 * async copy per item, one stream wait per run, every byte and CRC where a
 * one-item-at-a-time carrier puts it.
 */
#define NSMALL 1000

START_TEST(small_items_in_runs_one_wait_per_run_every_byte_and_crc)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 1);
	static struct carrier_item items[NSMALL], back[NSMALL];
	static uint32_t crc[NSMALL][2], crc2[NSMALL][2];
	uint64_t off[2] = {0, 0}, size[NSMALL];
	uint8_t *mem = mmap(NULL, NSMALL * 8 * KIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *mem2 = mmap(NULL, NSMALL * 8 * KIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fds[2] = {scratch_fd(), scratch_fd()};
	struct stub_counts cnt;
	char err[512] = "";
	size_t nonempty = 0;

	ck_assert_ptr_ne(mem, MAP_FAILED);
	ck_assert_ptr_ne(mem2, MAP_FAILED);
	for (size_t i = 0; i < NSMALL; i++) {
		size[i] = i % 97 == 5 ? 0 : i == 501 ? 4 * KIB + 100 : 4 * KIB;
		pattern_fill(mem + i * 8 * KIB, size[i], (uint32_t)i + 1);
		items[i] = (struct carrier_item){.va = (CUdeviceptr)(uintptr_t)(mem + i * 8 * KIB),
						 .size = size[i],
						 .ctx = STUB_CTX,
						 .file = (unsigned)(i % 2),
						 .crc = crc[i],
						 .ncrc = 2};
		nonempty += size[i] != 0;
	}
	ck_assert_msg(carrier_save_files(&stub_ops, &c, fds, 2, 0, items, NSMALL, NULL, err, sizeof(err)) == 0, "%s",
		      err);
	stub_get(&cnt);
	ck_assert_int_eq(cnt.calls[STUB_DTOH], (int64_t)nonempty);
	/* 64 items a run, at most one run per file split off by the 4 KiB +
	 * 100 item, and the teardown's wait on each of the two slots. */
	ck_assert_int_le(cnt.calls[STUB_SYNC], (int64_t)(nonempty / 64 + 2 + 2 + 2));
	for (size_t i = 0; i < NSMALL; i++) {
		const struct carrier_item *it = &items[i];
		uint8_t b[4 * KIB + 100];

		ck_assert_uint_eq(it->offset, off[i % 2]);
		ck_assert_int_eq(pread(fds[i % 2], b, size[i], (off_t)it->offset), (ssize_t)size[i]);
		ck_assert_msg(pattern_check(b, size[i], (uint32_t)i + 1) == -1, "alloc %zu", i);
		ck_assert_uint_eq(it->ncrc, size[i] ? 1 : 0);
		if (size[i])
			ck_assert_uint_eq(it->crc[0], ref_crc32c(b, size[i]));
		off[i % 2] += size[i];
	}
	/* The same items one transfer each (nothing to batch): same CRCs. */
	for (size_t i = 0; i < NSMALL; i++) {
		struct carrier_item one = items[i];
		int tmp = scratch_fd();

		one.crc = crc2[i];
		one.file = 0;
		ck_assert_int_eq(carrier_save(&stub_ops, &c, tmp, items[i].offset, &one, 1, NULL, err, sizeof(err)), 0);
		ck_assert_mem_eq(crc2[i], crc[i], items[i].ncrc * sizeof(uint32_t));
		close(tmp);
	}

	memcpy(back, items, sizeof(items));
	for (size_t i = 0; i < NSMALL; i++)
		back[i].va = (CUdeviceptr)(uintptr_t)(mem2 + i * 8 * KIB);
	stub_reset();
	ck_assert_msg(carrier_load_files(&stub_ops, &c, fds, 2, back, NSMALL, NULL, err, sizeof(err)) == 0, "%s", err);
	stub_get(&cnt);
	ck_assert_int_eq(cnt.calls[STUB_HTOD], (int64_t)nonempty);
	ck_assert_int_le(cnt.calls[STUB_SYNC], (int64_t)(nonempty / 64 + 2 + 2 + 2));
	for (size_t i = 0; i < NSMALL; i++)
		ck_assert_msg(pattern_check(mem2 + i * 8 * KIB, size[i], (uint32_t)i + 1) == -1, "alloc %zu", i);
	assert_no_leak();
	munmap(mem, NSMALL * 8 * KIB);
	munmap(mem2, NSMALL * 8 * KIB);
	close(fds[0]);
	close(fds[1]);
}
END_TEST

START_TEST(roundtrip_chunk_not_dividing_buffer)
{
	/* 96 KiB buffers (three slots of 288 KiB / 3) hold one 80 KiB chunk;
	 * chunk size that is not a power of two. */
	struct carrier_config c = cfg_make(6 * 96 * KIB, 80 * KIB + 3, 3);

	roundtrip(&c, 1);
}
END_TEST

START_TEST(roundtrip_staging_smaller_than_chunk)
{
	/* A chunk must fit in a buffer: staging grows to two chunks. */
	struct carrier_config c = cfg_make(64 * KIB, 1 * MIB, 4);
	struct dev src, dst;
	uint64_t sizes[] = {5 * MIB + 17};
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd();

	dev_init(&src, sizes, 1, 0);
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.threads, 1);
	ck_assert_uint_eq(st.buffer_bytes, 1 * MIB);
	dev_like(&dst, &src, 0);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(pattern_check(dst.mem[0], sizes[0], 1), -1);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

START_TEST(several_files_roundtrip_and_refusals)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 0);
	struct dev src, dst;
	struct carrier_stats st;
	char err[512];
	int fds[3] = {scratch_fd(), scratch_fd(), scratch_fd()};
	uint64_t end[3] = {100, 100, 100};
	uint8_t b;

	dev_init(&src, mixed, NMIXED, 0);
	for (size_t i = 0; i < src.n; i++)
		src.items[i].file = (unsigned)(i % 3);
	ck_assert_msg(carrier_save_files(&stub_ops, &c, fds, 3, 100, src.items, src.n, &st, err, sizeof(err)) == 0,
		      "%s", err);
	/* Two threads per file by default, at most one per CPU (and 2). */
	ck_assert_uint_eq(st.threads, sysconf(_SC_NPROCESSORS_ONLN) >= 6  ? 6
				      : sysconf(_SC_NPROCESSORS_ONLN) < 2 ? 2
									  : sysconf(_SC_NPROCESSORS_ONLN));
	/* Each file holds its items back to back from the offset. */
	for (size_t i = 0; i < src.n; i++) {
		const struct carrier_item *it = &src.items[i];
		uint8_t *p = malloc(it->size);

		ck_assert_uint_eq(it->offset, end[it->file]);
		end[it->file] += it->size;
		ck_assert_int_eq(pread(fds[it->file], p, it->size, it->offset), (ssize_t)it->size);
		ck_assert_int_eq(pattern_check(p, it->size, (uint32_t)i + 1), -1);
		free(p);
	}
	for (int f = 0; f < 3; f++) {
		struct stat sb;

		ck_assert_int_eq(fstat(fds[f], &sb), 0);
		ck_assert_int_eq(sb.st_size, (off_t)end[f]);
	}
	dev_like(&dst, &src, 0);
	for (size_t i = 0; i < dst.n; i++)
		dst.items[i].file = src.items[i].file;
	ck_assert_msg(carrier_load_files(&stub_ops, &c, fds, 3, dst.items, dst.n, &st, err, sizeof(err)) == 0, "%s",
		      err);
	for (size_t i = 0; i < dst.n; i++)
		ck_assert_int_eq(pattern_check(dst.mem[i], mixed[i], (uint32_t)i + 1), -1);

	/* A file index beyond the array is refused. */
	dst.items[2].file = 3;
	ck_assert_int_eq(carrier_load_files(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "alloc 2: file 3"), "%s", err);
	dst.items[2].file = 2;
	/* Corruption in the third file names the allocation it carries. */
	ck_assert_int_eq(pread(fds[1], &b, 1, src.items[4].offset + 3), 1);
	b ^= 1;
	ck_assert_int_eq(pwrite(fds[1], &b, 1, src.items[4].offset + 3), 1);
	ck_assert_int_eq(carrier_load_files(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "alloc 4: chunk 0 "), "%s", err);
	/* A truncated second file too. */
	ck_assert_int_eq(ftruncate(fds[2], end[2] - 1), 0);
	ck_assert_int_eq(carrier_load_files(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)), -ENODATA);
	ck_assert_msg(strstr(err, "alloc 5") || strstr(err, "alloc 2"), "%s", err);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	for (int f = 0; f < 3; f++)
		close(fds[f]);
}
END_TEST

START_TEST(empty_and_zero_size_items)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	uint64_t sizes[] = {0, 10, 0};
	struct dev src, dst;
	char err[512];
	int fd = scratch_fd();

	ck_assert_int_eq(carrier_save(&stub_ops, &c, fd, 0, NULL, 0, NULL, err, sizeof(err)), 0);
	dev_init(&src, sizes, 3, 0);
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 3, NULL, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(src.items[0].ncrc, 0);
	ck_assert_uint_eq(src.items[2].offset, 10);
	dev_like(&dst, &src, 0);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 3, NULL, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(pattern_check(dst.mem[1], 10, 2), -1);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

/* Save the mixed set; returns the fd. */
static int saved(struct dev *src, const struct carrier_config *c)
{
	char err[512];
	int fd = scratch_fd();

	dev_init(src, mixed, NMIXED, 0);
	ck_assert_msg(carrier_save(&stub_ops, c, fd, 0, src->items, src->n, NULL, err, sizeof(err)) == 0, "%s", err);
	return fd;
}

static void corrupt_case(int verify_first)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	struct dev src, dst;
	char err[512], want[64];
	int fd = saved(&src, &c);
	const struct carrier_item *it = &src.items[4];
	uint64_t at = it->offset + 7 * 64 * KIB + 100; /* chunk 7 of alloc 4 */
	uint8_t b;

	ck_assert_int_eq(pread(fd, &b, 1, at), 1);
	b ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);

	c.verify_first = verify_first;
	dev_like(&dst, &src, 0x77);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "alloc 4: chunk 7 ") != NULL, "%s", err);
	snprintf(want, sizeof(want), "the index says %#010x", it->crc[7]);
	ck_assert_msg(strstr(err, want) != NULL, "%s", err);
	ck_assert_msg(strstr(err, "corrupt") != NULL, "%s", err);
	/* The corrupt chunk never reached the device... */
	ck_assert_int_eq(bytes_check(dst.mem[4] + 7 * 64 * KIB, 64 * KIB, 0x77), -1);
	/* ...and with verify_first nothing did. */
	if (verify_first)
		for (size_t i = 0; i < dst.n; i++)
			ck_assert_int_eq(bytes_check(dst.mem[i], dst.size[i], 0x77), -1);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}

START_TEST(corrupt_byte_refused_naming_chunk)
{
	corrupt_case(0);
}
END_TEST

START_TEST(corrupt_byte_with_verify_first_leaves_device_untouched)
{
	corrupt_case(1);
}
END_TEST

START_TEST(truncated_file_refused_before_device_touched)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	struct dev src, dst;
	char err[512];
	int fd = saved(&src, &c);
	struct stat sb;
	struct stub_counts cnt;

	ck_assert_int_eq(fstat(fd, &sb), 0);
	ck_assert_int_eq(ftruncate(fd, sb.st_size - 1), 0);
	dev_like(&dst, &src, 0x77);
	stub_reset();
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -ENODATA);
	ck_assert_msg(strstr(err, "alloc 4") && strstr(err, "truncated"), "%s", err);
	stub_get(&cnt);
	ck_assert_int_eq(cnt.calls[STUB_HTOD], 0);
	for (size_t i = 0; i < dst.n; i++)
		ck_assert_int_eq(bytes_check(dst.mem[i], dst.size[i], 0x77), -1);
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

START_TEST(index_size_mismatch_refused)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	struct dev src, dst;
	char err[512];
	int fd = saved(&src, &c);

	dev_like(&dst, &src, 0x77);
	dst.items[3].size += 64 * KIB; /* one chunk more than the index has */
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "alloc 3") && strstr(err, "size mismatch"), "%s", err);
	dst.items[3].size -= 64 * KIB;
	dst.items[2].chunk_size = 0;
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "alloc 2: chunk size 0"), "%s", err);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

START_TEST(bad_descriptors_refused)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	uint64_t sizes[] = {100};
	struct dev src;
	char err[512];
	int ro = open("/dev/null", O_RDONLY), ap = open("/dev/null", O_WRONLY | O_APPEND);

	dev_init(&src, sizes, 1, 0);
	ck_assert_int_eq(carrier_save(&stub_ops, &c, ro, 0, src.items, 1, NULL, err, sizeof(err)), -EBADF);
	ck_assert_msg(strstr(err, "not open for writing"), "%s", err);
	ck_assert_int_eq(carrier_save(&stub_ops, &c, ap, 0, src.items, 1, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "O_APPEND"), "%s", err);
	ck_assert_int_eq(carrier_save(&stub_ops, &c, 999, 0, src.items, 1, NULL, err, sizeof(err)), -EBADF);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, ap, src.items, 1, NULL, err, sizeof(err)), -EBADF);
	ck_assert_msg(strstr(err, "not open for reading"), "%s", err);
	close(ro);
	close(ap);
	dev_free(&src);
}
END_TEST

static void arm_alloc4(void);
static void arm_setctx3(void);

/* A failed save: clean error, nothing left behind. */
static void save_fails(int fd, int expect, const char *needle, void (*arm)(void))
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 3);
	struct dev src;
	char err[512] = "";
	int fds, maps;
	struct carrier_stats st;

	dev_init(&src, mixed, NMIXED, 0);
	/* Warm up on the same failing path (lazy allocations in libc and the
	 * sanitizers' allocators map new regions on first use), then count. */
	fds = scratch_fd();
	carrier_save(&stub_ops, &c, fds, 0, src.items, src.n, NULL, NULL, 0);
	close(fds);
	stub_reset();
	if (arm)
		arm();
	carrier_save(&stub_ops, &c, fd, 0, src.items, src.n, NULL, err, sizeof(err));
	lseek(fd, 0, SEEK_SET);
	fds = count_fds();
	maps = count_maps();
	stub_reset();
	if (arm)
		arm();
	ck_assert_int_eq(carrier_save(&stub_ops, &c, fd, 0, src.items, src.n, &st, err, sizeof(err)), expect);
	ck_assert_msg(strstr(err, needle) != NULL, "'%s' lacks '%s'", err, needle);
	/* Each I/O thread sets its context and pins its own staging while
	 * the others already move bytes: those may have moved all of them by
	 * the time one thread fails there, which still fails the save. */
	if (arm == arm_alloc4 || arm == arm_setctx3)
		ck_assert_uint_le(st.bytes, st.total);
	else
		ck_assert_uint_lt(st.bytes, st.total);
	assert_no_leak();
	ck_assert_int_eq(count_fds(), fds);
	ck_assert_int_eq(count_maps(), maps);
	dev_free(&src);
}

START_TEST(write_enospc_is_clean_error)
{
	int fd = open("/dev/full", O_WRONLY);

	ck_assert_int_ge(fd, 0);
	save_fails(fd, -ENOSPC, "No space left on device", NULL);
	close(fd);
}
END_TEST

START_TEST(write_efbig_under_rlimit_fsize)
{
	struct rlimit rl = {1 * MIB, RLIM_INFINITY};
	int fd = scratch_fd();

	signal(SIGXFSZ, SIG_IGN);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	save_fails(fd, -EFBIG, "File too large", NULL);
	close(fd);
}
END_TEST

START_TEST(write_enospc_on_full_tmpfs)
{
	char dir[64], path[96];
	int fd;

	/* Own mount namespace (the test runs in a forked child); main() made sure we are root. */
	ck_assert_msg(unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS): %s", strerror(errno));
	ck_assert_msg(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "private /: %s", strerror(errno));
	ck_assert_ptr_nonnull(mkdtemp(test_tmpname(dir, sizeof(dir), "carrier-tmpfs-XXXXXX")));
	ck_assert_msg(mount("tmpfs", dir, "tmpfs", 0, "size=1m") == 0, "mount tmpfs: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/carrier", dir);
	fd = open(path, O_WRONLY | O_CREAT, 0600);
	ck_assert_int_ge(fd, 0);
	save_fails(fd, -ENOSPC, "No space left on device", NULL);
	close(fd);
	umount(dir);
	rmdir(dir);
}
END_TEST

static void arm_dtoh3(void)
{
	stub_fail(STUB_DTOH, 3, CUDA_ERROR_ILLEGAL_ADDRESS);
}
static void arm_sync2(void)
{
	stub_fail(STUB_SYNC, 2, CUDA_ERROR_ILLEGAL_ADDRESS);
}
static void arm_alloc4(void)
{
	stub_fail(STUB_HOST_ALLOC, 4, CUDA_ERROR_OUT_OF_MEMORY);
}
/* Calls 1 and 2 are setup's (the context's streams, then context 0 for
 * thread 0); 3 is the first I/O thread's, before it pins its staging. */
static void arm_setctx3(void)
{
	stub_fail(STUB_SET_CTX, 3, CUDA_ERROR_INVALID_CONTEXT);
}
static void arm_stream5(void)
{
	stub_fail(STUB_STREAM_CREATE, 5, CUDA_ERROR_OUT_OF_MEMORY);
}

START_TEST(device_copy_failure_is_clean_error)
{
	int fd = scratch_fd();

	save_fails(fd, -EIO, "cuMemcpyDtoHAsync of bytes", arm_dtoh3);
	/* with 3 threads the second stream wait is either a big item's
	 * ("device copy of bytes A-B") or the small items' run ("device copies
	 * of the run"), whichever thread gets there first */
	save_fails(fd, -EIO, "device cop", arm_sync2);
	save_fails(fd, -EIO, "CUDA_ERROR_ILLEGAL_ADDRESS", arm_sync2);
	save_fails(fd, -ENOMEM, "cannot pin", arm_alloc4);
	save_fails(fd, -EIO, "cuStreamCreate failed", arm_stream5);
	save_fails(fd, -EIO, "carrier save: cuCtxSetCurrent(0x5157) failed: CUDA_ERROR_STUB (201)", arm_setctx3);
	close(fd);
}
END_TEST

START_TEST(load_copy_failure_is_clean_error)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 3);
	struct dev src, dst;
	char err[512];
	int fd = saved(&src, &c);
	int fds, maps;

	dev_like(&dst, &src, 0x77);
	/* Warm up (lazy allocations in libc and sanitizers), then count. */
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, NULL, 0), 0);
	fds = count_fds();
	maps = count_maps();
	memset(dst.mem[4], 0x77, dst.size[4]);
	stub_reset();
	stub_fail(STUB_HTOD, 2, CUDA_ERROR_ILLEGAL_ADDRESS);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "cuMemcpyHtoDAsync") && strstr(err, "CUDA_ERROR_ILLEGAL_ADDRESS"), "%s", err);
	assert_no_leak();
	stub_fail(STUB_SYNC, 3, CUDA_ERROR_ILLEGAL_ADDRESS);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "device copy of bytes"), "%s", err);
	assert_no_leak();
	ck_assert_int_eq(count_fds(), fds);
	ck_assert_int_eq(count_maps(), maps);
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

START_TEST(staging_bound_holds_for_item_8x_staging)
{
	struct carrier_config c = cfg_make(2 * MIB, 256 * KIB, 2);
	uint64_t sizes[] = {16 * MIB};
	struct dev src, dst;
	struct stub_counts cnt;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd();
	uint64_t base, peak;

	dev_init(&src, sizes, 1, 0);
	ck_assert_int_eq(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, NULL, NULL, 0), 0);
	dev_like(&dst, &src, 0);
	memset(dst.mem[0], 0, sizes[0]); /* resident before measuring */
	stub_reset();
	base = rss_now();
	reset_peak_rss();
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	peak = rss_peak();
	stub_get(&cnt);
	ck_assert_int_le(cnt.pinned_peak, 2 * MIB);
	ck_assert_uint_le(st.staging_bytes, 2 * MIB);
	/* Staging plus a little for threads, never the 16 MiB item. */
	if (peak > base)
		ck_assert_msg(peak - base <= 2 * MIB + 1 * MIB, "peak extra RSS %llu",
			      (unsigned long long)(peak - base));
	ck_assert_int_eq(pattern_check(dst.mem[0], sizes[0], 1), -1);
	assert_no_leak();
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

struct prog {
	uint64_t last, calls, total;
	int monotonic;
};

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
	struct prog *p = arg;

	p->monotonic &= done >= p->last && done <= total;
	p->last = done;
	p->total = total;
	p->calls++;
}

START_TEST(progress_reported_to_total)
{
	struct dev src, dst;
	struct prog p = {.monotonic = 1};
	char err[512];
	int fd;
	uint64_t total = 0;

	for (size_t i = 0; i < NMIXED; i++)
		total += mixed[i];
	/* One thread: a report after each slice that crosses a 256 KiB mark. */
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 1);
	c.progress = on_progress;
	c.progress_arg = &p;
	c.progress_every = 256 * KIB;
	fd = saved(&src, &c);
	ck_assert_uint_eq(p.last, total);
	ck_assert_uint_eq(p.total, total);
	ck_assert_uint_ge(p.calls, total / (512 * KIB));
	ck_assert_uint_le(p.calls, total / (256 * KIB) + 2);
	ck_assert(p.monotonic);

	/* Several threads, two passes: the total counts both. */
	memset(&p, 0, sizeof(p));
	p.monotonic = 1;
	c.threads = 3;
	c.verify_first = 1;
	dev_like(&dst, &src, 0);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, dst.n, NULL, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(p.last, 2 * total);
	ck_assert_uint_eq(p.total, 2 * total);
	ck_assert_uint_ge(p.calls, 1);
	ck_assert_uint_le(p.calls, 2 * total / (256 * KIB) + 2);
	ck_assert(p.monotonic);
	dev_free(&src);
	dev_free(&dst);
	close(fd);
}
END_TEST

/* ---- striping ------------------------------------------------------------ */

START_TEST(stripe_unit_is_a_quarter_share_in_whole_chunks)
{
	ck_assert_uint_eq(carrier_stripe_unit(8ull << 30, 16, 4 * MIB), CARRIER_STRIPE_MAX);
	ck_assert_uint_eq(carrier_stripe_unit(6 * MIB, 3, 1 * MIB), 1 * MIB);
	ck_assert_uint_eq(carrier_stripe_unit(0, 4, 1 * MIB), 1 * MIB);
	ck_assert_uint_eq(carrier_stripe_unit(100 * MIB, 1, 1 * MIB), 25 * MIB);
	ck_assert_uint_eq(carrier_stripe_unit(10 * MIB, 2, 3 * MIB), 3 * MIB);
	ck_assert_uint_eq(carrier_stripe_unit(64 * MIB, 2, 3 * MIB), 9 * MIB);
}
END_TEST

START_TEST(stripe_split_balances_files_and_narrows_crcs)
{
	uint32_t crc[4][16];
	struct carrier_item in[4], out[16];
	size_t parent[16];
	uint64_t sizes[4] = {10 * MIB, 1 * MIB + 3, 0, 5 * MIB}, load[3] = {0}, maxload = 0, minload = ~0ull;

	for (size_t i = 0; i < 4; i++)
		in[i] = (struct carrier_item){.va = 0x100000000ull * (i + 1),
					      .size = sizes[i],
					      .ctx = STUB_CTX,
					      .name = "x",
					      .chunk_size = 1 * MIB,
					      .crc = crc[i],
					      .ncrc = 16,
					      .name_offset = i == 3 ? 7 * MIB : 0};
	ck_assert_uint_eq(carrier_stripe_count(in, 4, 2 * MIB), 5 + 1 + 1 + 3);
	ck_assert_int_eq(carrier_stripe_split(in, 4, 3, 2 * MIB, out, 16, parent), 0);
	for (size_t j = 0, i = 0; j < 10; j++) {
		uint64_t off = out[j].va - in[parent[j]].va;

		ck_assert_uint_ge(parent[j], i); /* items in order, extents in order */
		i = parent[j];
		ck_assert_uint_eq(out[j].chunk_size, 1 * MIB);
		ck_assert_ptr_eq(out[j].ctx, STUB_CTX);
		ck_assert_ptr_eq(out[j].crc, in[i].crc + off / MIB);
		ck_assert_uint_eq(out[j].ncrc, carrier_nchunks(out[j].size, MIB));
		ck_assert_uint_eq(out[j].name_offset, in[i].name_offset + off);
		ck_assert_uint_eq(off % MIB, 0);
		ck_assert_uint_le(out[j].size, 2 * MIB);
		ck_assert_uint_lt(out[j].file, 3);
		/* Whole chunks, but the item's last extent. */
		if (off + out[j].size < in[i].size)
			ck_assert_uint_eq(out[j].size, 2 * MIB);
		else
			ck_assert_uint_eq(off + out[j].size, in[i].size);
		load[out[j].file] += out[j].size;
	}
	/* Item 0's five extents go round the files: 0, 1, 2, 0, 1. */
	ck_assert_uint_eq(out[0].file, 0);
	ck_assert_uint_eq(out[1].file, 1);
	ck_assert_uint_eq(out[2].file, 2);
	ck_assert_uint_eq(out[3].file, 0);
	ck_assert_uint_eq(out[4].file, 1);
	for (int f = 0; f < 3; f++) {
		maxload = load[f] > maxload ? load[f] : maxload;
		minload = load[f] < minload ? load[f] : minload;
	}
	ck_assert_uint_le(maxload - minload, 2 * MIB);
	ck_assert_uint_eq(load[0] + load[1] + load[2], 16 * MIB + 3);
	/* The empty item is one empty extent. */
	ck_assert_uint_eq(parent[6], 2);
	ck_assert_uint_eq(out[6].size, 0);

	ck_assert_int_eq(carrier_stripe_split(in, 4, 0, 2 * MIB, out, 16, parent), -EINVAL);
	ck_assert_int_eq(carrier_stripe_split(in, 4, CARRIER_FILES_MAX + 1, 2 * MIB, out, 16, parent), -EINVAL);
	ck_assert_int_eq(carrier_stripe_split(in, 4, 3, 0, out, 16, parent), -EINVAL);
	ck_assert_int_eq(carrier_stripe_split(in, 4, 3, 2 * MIB, out, 9, parent), -EINVAL);
	in[1].ncrc = 1; /* 1 MiB + 3 needs two */
	ck_assert_int_eq(carrier_stripe_split(in, 4, 3, 2 * MIB, out, 16, parent), -EINVAL);
	in[1].ncrc = 16;
	in[3].chunk_size = 0;
	ck_assert_int_eq(carrier_stripe_split(in, 4, 3, 2 * MIB, out, 16, parent), -EINVAL);
	/* A unit that is no multiple of the chunk rounds up to whole chunks. */
	in[3].chunk_size = 1 * MIB;
	ck_assert_uint_eq(carrier_stripe_count(in, 4, 1 * MIB + 1), 5 + 1 + 1 + 3);
}
END_TEST

/* Save `src` striped over nfds scratch files; checks the extents against
 * the files' bytes and CRCs. */
static void striped_save(struct dev *src, const struct carrier_config *c, int *fds, size_t nfds)
{
	uint64_t end[8] = {0};
	struct carrier_stats st;
	char err[512];

	for (size_t f = 0; f < nfds; f++)
		fds[f] = scratch_fd();
	ck_assert_msg(carrier_save_striped(&stub_ops, c, fds, nfds, 0, src->items, src->n, &st, err, sizeof(err)) == 0,
		      "%s", err);
	for (size_t i = 0; i < src->n; i++) {
		const struct carrier_item *it = &src->items[i];
		uint64_t pos = 0;

		ck_assert_ptr_nonnull(it->ext);
		ck_assert_uint_eq(it->offset, it->ext[0].offset);
		ck_assert_uint_eq(it->file, it->ext[0].file);
		ck_assert_uint_eq(it->ncrc, carrier_nchunks(it->size, it->chunk_size));
		for (size_t k = 0; k < it->next; k++) {
			const struct carrier_extent *e = &it->ext[k];
			uint8_t *p = malloc(e->size + 1);

			ck_assert_uint_lt(e->file, nfds);
			if (k + 1 < it->next)
				ck_assert_uint_eq(e->size % it->chunk_size, 0);
			ck_assert_int_eq(pread(fds[e->file], p, e->size, e->offset), (ssize_t)e->size);
			ck_assert_int_eq(memcmp(p, src->mem[i] + pos, e->size), 0);
			for (uint64_t o = 0; o < e->size; o += it->chunk_size) {
				uint64_t l = e->size - o < it->chunk_size ? e->size - o : it->chunk_size;

				ck_assert_uint_eq(it->crc[(pos + o) / it->chunk_size], ref_crc32c(p + o, l));
			}
			if (e->offset + e->size > end[e->file])
				end[e->file] = e->offset + e->size;
			pos += e->size;
			free(p);
		}
		ck_assert_uint_eq(pos, it->size);
	}
	for (size_t f = 0; f < nfds; f++) {
		struct stat sb;

		ck_assert_int_eq(fstat(fds[f], &sb), 0);
		ck_assert_uint_eq((uint64_t)sb.st_size, end[f]);
		ck_assert_uint_gt(end[f], 0); /* every file got bytes */
	}
}

/* Load-side items with the source's extents (copied: the loader's own). */
static void striped_like(struct dev *dst, const struct dev *src)
{
	dev_like(dst, src, 0);
	for (size_t i = 0; i < src->n; i++) {
		dst->items[i].ext = malloc(src->items[i].next * sizeof(struct carrier_extent));
		memcpy(dst->items[i].ext, src->items[i].ext, src->items[i].next * sizeof(struct carrier_extent));
		dst->items[i].next = src->items[i].next;
		dst->items[i].file = src->items[i].file;
	}
}

static const uint64_t big_mixed[] = {3 * MIB + 5, 1, 4 * KIB + 3, 2 * MIB, 64 * KIB + 1};
#define NBIG (sizeof(big_mixed) / sizeof(big_mixed[0]))

START_TEST(striped_roundtrip_every_byte_and_crc)
{
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 0);
	struct dev src, dst, one;
	char err[512];
	int fds[3], fd1 = scratch_fd();

	dev_init(&src, big_mixed, NBIG, 0);
	striped_save(&src, &c, fds, 3);
	/* 5 MiB + over 3 files: units of ~448 KiB, the big items in pieces. */
	ck_assert_uint_gt(src.items[0].next, 3);
	striped_like(&dst, &src);
	ck_assert_msg(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)) == 0, "%s",
		      err);
	for (size_t i = 0; i < dst.n; i++)
		ck_assert_int_eq(pattern_check(dst.mem[i], big_mixed[i], (uint32_t)i + 1), -1);
	/* One file: exactly carrier_save's layout, no extents. */
	dev_init(&one, big_mixed, NBIG, 0);
	ck_assert_msg(carrier_save_striped(&stub_ops, &c, &fd1, 1, 0, one.items, one.n, NULL, err, sizeof(err)) == 0,
		      "%s", err);
	for (size_t i = 0, off = 0; i < one.n; off += big_mixed[i], i++) {
		ck_assert_ptr_null(one.items[i].ext);
		ck_assert_uint_eq(one.items[i].offset, off);
	}
	assert_no_leak();
	carrier_items_free_extents(src.items, src.n);
	carrier_items_free_extents(dst.items, dst.n);
	ck_assert_ptr_null(src.items[0].ext);
	dev_free(&src);
	dev_free(&dst);
	dev_free(&one);
	for (int f = 0; f < 3; f++)
		close(fds[f]);
	close(fd1);
}
END_TEST

START_TEST(striped_load_refuses_bad_extents_and_names_file_and_chunk)
{
	static const char *const names[] = {"carrier-0.img", "carrier-1.img", "carrier-2.img"};
	struct carrier_config c = cfg_make(1 * MIB, 64 * KIB, 2);
	struct dev src, dst;
	struct stub_counts cnt;
	char err[512], want[160];
	int fds[3];
	struct carrier_extent *e, saved;
	uint64_t pos = 0, at;
	uint8_t b;

	c.file_names = names;
	c.n_file_names = 3;
	dev_init(&src, big_mixed, NBIG, 0);
	striped_save(&src, &c, fds, 3);
	striped_like(&dst, &src);
	e = &dst.items[0].ext[1];
	saved = *e;
	stub_reset();

	e->file = 3;
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "alloc 0: extent 1 (file 3,") && strstr(err, "names a file beyond"), "%s", err);
	*e = saved;
	e->size -= 1; /* splits a chunk */
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "alloc 0: extent 1") && strstr(err, "splits a chunk"), "%s", err);
	*e = saved;
	dst.items[0].next--; /* the last extent lost */
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "alloc 0: its ") && strstr(err, "extents hold"), "%s", err);
	dst.items[0].next++;
	dst.items[0].ncrc = 1; /* fewer checksums than the extents' chunks */
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "alloc 0: extent 0") && strstr(err, "has no checksums"), "%s", err);
	dst.items[0].ncrc = src.items[0].ncrc;
	dst.items[0].chunk_size = 0;
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strstr(err, "alloc 0: extent 0") && strstr(err, "has no chunk size"), "%s", err);
	dst.items[0].chunk_size = src.items[0].chunk_size;
	/* Nothing reached the device for any of these. */
	stub_get(&cnt);
	ck_assert_int_eq(cnt.calls[STUB_HTOD], 0);

	/* A flipped byte in the second extent of alloc 0: the chunk is
	 * numbered within the allocation, the file named. */
	pos = saved.size; /* alloc 0's bytes before extent 1 */
	at = saved.offset + 3 * 64 * KIB + 9;
	ck_assert_int_eq(pread(fds[saved.file], &b, 1, at), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fds[saved.file], &b, 1, at), 1);
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -EBADMSG);
	snprintf(want, sizeof(want), "alloc 0: chunk %llu (bytes %llu-%llu, file offset %llu) of %s has crc32c",
		 (unsigned long long)(pos / (64 * KIB) + 3), (unsigned long long)(pos + 3 * 64 * KIB),
		 (unsigned long long)(pos + 4 * 64 * KIB - 1), (unsigned long long)(saved.offset + 3 * 64 * KIB),
		 names[saved.file]);
	ck_assert_msg(strstr(err, want), "'%s' lacks '%s'", err, want);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fds[saved.file], &b, 1, at), 1);

	/* A stripe file cut short: refused before the device, naming it. */
	ck_assert_int_eq(ftruncate(fds[saved.file], saved.offset + 5), 0);
	stub_reset();
	ck_assert_int_eq(carrier_load_striped(&stub_ops, &c, fds, 3, dst.items, dst.n, NULL, err, sizeof(err)),
			 -ENODATA);
	snprintf(want, sizeof(want), "(%s; chunk %llu is missing: truncated carrier image)", names[saved.file],
		 (unsigned long long)(pos / (64 * KIB)));
	ck_assert_msg(strstr(err, want), "'%s' lacks '%s'", err, want);
	stub_get(&cnt);
	ck_assert_int_eq(cnt.calls[STUB_HTOD], 0);
	assert_no_leak();
	carrier_items_free_extents(src.items, src.n);
	carrier_items_free_extents(dst.items, dst.n);
	dev_free(&src);
	dev_free(&dst);
	for (int f = 0; f < 3; f++)
		close(fds[f]);
}
END_TEST

START_TEST(staging_sized_to_the_carrier)
{
	struct carrier_config c = cfg_make(256 * MIB, 1 * MIB, 0);
	uint64_t small[] = {4 * KIB + 3}, mid[] = {5 * MIB + 1, 3 * MIB};
	struct dev a, b;
	struct carrier_stats st;
	struct stub_counts cnt;
	char err[512];
	int fd = scratch_fd();

	dev_init(&a, small, 1, 0);
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, a.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	/* Two buffers of the one (page-rounded) chunk, not 256 MiB. */
	ck_assert_uint_le(st.staging_bytes, 16 * KIB);
	dev_init(&b, mid, 2, 0);
	stub_reset();
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, b.items, 2, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_le(st.staging_bytes, 8 * MIB + 4 * KIB);
	ck_assert_uint_ge(st.buffer_bytes, 1 * MIB);
	stub_get(&cnt);
	ck_assert_int_le(cnt.pinned_peak, 8 * MIB + 4 * KIB);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, b.items, 2, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_le(st.staging_bytes, 8 * MIB + 4 * KIB);
	assert_no_leak();
	dev_free(&a);
	dev_free(&b);
	close(fd);
}
END_TEST

/* However much staging the bound allows, a slot's buffer is at most 2 MiB
 * (BUF_MAX: what all threads have in flight stays in the host's last-level
 * cache), or one chunk where a chunk is bigger. */
START_TEST(buffers_stay_small_whatever_the_staging)
{
	struct carrier_config c = cfg_make(224 * MIB, 1 * MIB, 16);
	uint64_t sizes[] = {96 * MIB};
	struct dev src, dst;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd();

	dev_init(&src, sizes, 1, 0);
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.buffer_bytes, 2 * MIB);
	ck_assert_uint_eq(st.threads, 16);
	ck_assert_uint_le(st.staging_bytes, 16 * 2 * 2 * MIB);
	dev_like(&dst, &src, 0);
	ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.buffer_bytes, 2 * MIB);
	ck_assert_int_eq(pattern_check(dst.mem[0], sizes[0], 1), -1);
	dev_free(&dst);
	/* A 4 MiB chunk still gets a whole buffer of its own. */
	src.items[0].chunk_size = 4 * MIB;
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.buffer_bytes, 4 * MIB);
	assert_no_leak();
	dev_free(&src);
	close(fd);
}
END_TEST

/* Device->host copies issued when each slice had been written. */
struct overlap {
	uint64_t done[64];
	int64_t dtoh[64];
	unsigned n;
};

static void on_slice(void *arg, uint64_t done, uint64_t total)
{
	struct overlap *o = arg;
	struct stub_counts c;

	(void)total;
	stub_get(&c);
	if (o->n < 64) {
		o->done[o->n] = done;
		o->dtoh[o->n++] = c.calls[STUB_DTOH];
	}
}

START_TEST(save_copies_next_slice_while_writing_this_one)
{
	/* One thread, buffers of one 64 KiB chunk, a 1 MiB item: 16 slices.
	 * When slice k has been written, the copy of slice k+1 has been
	 * issued already (and only that one: two staging buffers). */
	struct carrier_config c = cfg_make(128 * KIB, 64 * KIB, 1);
	uint64_t one[] = {1 * MIB};
	struct overlap o = {.n = 0};
	struct dev src;
	struct carrier_stats st;
	char err[512];
	int fd = scratch_fd();

	c.progress = on_slice;
	c.progress_arg = &o;
	c.progress_every = 1;
	dev_init(&src, one, 1, 0);
	stub_reset();
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(st.buffer_bytes, 64 * KIB);
	ck_assert_uint_ge(o.n, 16);
	for (unsigned k = 0; k < o.n; k++) {
		uint64_t written = o.done[k] / (64 * KIB);

		if (written < 16)
			ck_assert_msg(o.dtoh[k] == (int64_t)written + 1, "after %llu slices %lld copies issued",
				      (unsigned long long)written, (long long)o.dtoh[k]);
	}
	ck_assert_int_eq(o.dtoh[o.n - 1], 16);
	dev_free(&src);
	close(fd);
}
END_TEST

START_TEST(config_from_environment)
{
	struct carrier_config c;
	char err[256];

	unsetenv("CUINTERPOSE_STAGING_MB");
	unsetenv("CUINTERPOSE_TEST_CHUNK_MB");
	unsetenv("CUINTERPOSE_TEST_CARRIER_THREADS");
	unsetenv("CUINTERPOSE_TEST_LOAD_VERIFY");
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.staging_bytes, 224 * MIB);
	ck_assert_uint_eq(c.chunk_size, 1 * MIB);
	ck_assert_uint_eq(c.threads, 0);
	ck_assert_int_eq(c.verify_first, 0);
	setenv("CUINTERPOSE_STAGING_MB", "64", 1);
	setenv("CUINTERPOSE_TEST_CHUNK_MB", "2", 1);
	setenv("CUINTERPOSE_TEST_CARRIER_THREADS", "8", 1);
	setenv("CUINTERPOSE_TEST_LOAD_VERIFY", "first", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.staging_bytes, 64 * MIB);
	ck_assert_uint_eq(c.chunk_size, 2 * MIB);
	ck_assert_uint_eq(c.threads, 8);
	ck_assert_int_eq(c.verify_first, 1);
	setenv("CUINTERPOSE_TEST_CHUNK_MB", "4x", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "CUINTERPOSE_TEST_CHUNK_MB=4x"), "%s", err);
	setenv("CUINTERPOSE_TEST_CHUNK_MB", "1024", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
	setenv("CUINTERPOSE_TEST_CHUNK_MB", "1", 1);
	setenv("CUINTERPOSE_TEST_CARRIER_THREADS", "65", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
	setenv("CUINTERPOSE_TEST_CARRIER_THREADS", "1", 1);
	setenv("CUINTERPOSE_TEST_LOAD_VERIFY", "sometimes", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
	unsetenv("CUINTERPOSE_TEST_LOAD_VERIFY");
	unsetenv("CUINTERPOSE_CARRIER_HASH");
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.hash, 1);
	ck_assert_int_eq(c.device_scan, 1);
	setenv("CUINTERPOSE_CARRIER_HASH", "sha256", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.hash, 1);
	ck_assert_int_eq(c.device_scan, 0);
	setenv("CUINTERPOSE_CARRIER_HASH", "off", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.hash, 0);
	ck_assert_int_eq(c.device_scan, 0);
	setenv("CUINTERPOSE_CARRIER_HASH", "md5", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "CUINTERPOSE_CARRIER_HASH=md5: expected \"device\", \"sha256\" or \"off\""), "%s",
		      err);
	unsetenv("CUINTERPOSE_CARRIER_HASH");
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.compress, 0);
	setenv("CUINTERPOSE_CARRIER_COMPRESS", "zstd", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.compress, 1);
	ck_assert_int_eq(c.compress_level, 1);
	setenv("CUINTERPOSE_CARRIER_COMPRESS", "zstd:-3", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.compress_level, -3);
	setenv("CUINTERPOSE_CARRIER_COMPRESS", "off", 1);
	ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.compress, 0);
	for (const char *const *v = (const char *const[]){"lz4", "zstd:", "zstd:20", "zstd:1x", "zstd:-8", NULL}; *v;
	     v++) {
		setenv("CUINTERPOSE_CARRIER_COMPRESS", *v, 1);
		ck_assert_int_eq(carrier_config_init(&c, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "CUINTERPOSE_CARRIER_COMPRESS=") && strstr(err, *v) &&
				      strstr(err, "expected \"off\", \"zstd\" or \"zstd:LEVEL\" (-7..19)"),
			      "%s: %s", *v, err);
	}
	unsetenv("CUINTERPOSE_CARRIER_COMPRESS");
}
END_TEST

/* Bytes zstd packs well (runs and a small alphabet) that are not zero. */
static void compressible_fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(1 + (i / 64 + seed) % 5 + (i % 512 == 0 ? i / 512 % 3 : 0));
}

/*
 * A compressing context in a workspace of cuip_zchunk_cctx_size(level,
 * chunk) compresses every length a chunk of that size can have, at every
 * level: zstd's parameters follow each input's own length, and a shorter
 * input can need more (level 4: 128 KiB more than 256 KiB). A failure
 * there would store the chunk raw, silently.
 */
START_TEST(compressing_contexts_fit_every_level_and_length)
{
	static const size_t chunks[] = {64 * KIB, 200 * KIB, 256 * KIB, MIB};
	static const size_t lens[] = {64 * KIB + 1, 100 * KIB, 128 * KIB, 128 * KIB + 1, 256 * KIB, MIB};
	uint8_t *src = malloc(MIB), *dst = malloc(cuip_zchunk_bound(MIB));

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	compressible_fill(src, MIB, 7);
	for (int level = CUIP_ZCHUNK_LEVEL_MIN; level <= CUIP_ZCHUNK_LEVEL_MAX; level++)
		for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
			size_t ws_len = cuip_zchunk_cctx_size(level, chunks[c]);
			void *ws = malloc(ws_len), *cctx;

			ck_assert_ptr_nonnull(ws);
			cctx = cuip_zchunk_cctx(ws, ws_len);
			ck_assert_ptr_nonnull(cctx);
			for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]) && lens[l] <= chunks[c]; l++) {
				size_t z = cuip_zchunk_compress(cctx, level, dst, cuip_zchunk_bound(lens[l]), src,
								lens[l]);

				ck_assert_msg(
					z > 0 && z < lens[l] / 4,
					"level %d, %zu-byte chunks: %zu bytes compress to %zu in a %zu-byte workspace",
					level, chunks[c], lens[l], z, ws_len);
			}
			free(ws);
		}
	/* The bound the sizing avoids: an unbounded input at level 19. */
	ck_assert_uint_lt(cuip_zchunk_cctx_size(19, MIB), cuip_zchunk_cctx_size(19, 64 * MIB) / 2);
	free(src);
	free(dst);
}
END_TEST

/*
 * Compressed chunks: a chunk of at least 64 KiB that zstd shrinks is
 * stored as its frame (stored length < chunk, fewer disk blocks), one
 * that it cannot shrink (random bytes), a zero one and a short tail stay
 * raw (0). CRCs are the raw bytes'. Loads, verify-first, striped or not,
 * give every byte back; a damaged frame, an impossible stored length and
 * a file cut inside a frame are refused naming the chunk.
 */
START_TEST(compressed_chunks_round_trip_and_damage_is_refused)
{
	struct carrier_config c = cfg_make(1 * MIB, 256 * KIB, 3);
	static const uint64_t size[] = {MIB + 100, 512 * KIB, 512 * KIB};
	uint32_t *stored[3], *sstored[3], zsum = 0;
	uint64_t off[3];
	struct carrier_stats st;
	struct dev src, dst;
	char err[512] = "";
	int fd = scratch_fd(), fds[2] = {scratch_fd(), scratch_fd()};
	struct stat sb;
	uint8_t byte;

	dev_init(&src, size, 3, 0);
	compressible_fill(src.mem[0], size[0], 1);
	memset(src.mem[2], 0, size[2]);
	compressible_fill(src.mem[2] + 256 * KIB, 256 * KIB, 2); /* chunk 0 zero, chunk 1 packs */
	for (int i = 0; i < 3; i++) {
		src.items[i].chunk_size = 256 * KIB;
		stored[i] = calloc(src.items[i].ncrc, sizeof(uint32_t));
		sstored[i] = calloc(src.items[i].ncrc, sizeof(uint32_t));
		src.items[i].stored = stored[i];
	}
	c.compress = 1;
	c.compress_level = 1;
	ck_assert_msg(carrier_save(&stub_ops, &c, fd, 0, src.items, 3, &st, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 4; k++) {
		ck_assert_uint_gt(stored[0][k], 0);
		ck_assert_uint_lt(stored[0][k], 256 * KIB - 4 * KIB);
		zsum += stored[0][k];
	}
	for (int i = 0; i < 3; i++)
		off[i] = src.items[i].offset;
	ck_assert_uint_eq(stored[0][4], 0); /* a 100-byte tail */
	ck_assert_uint_eq(stored[1][0], 0); /* random bytes */
	ck_assert_uint_eq(stored[1][1], 0);
	ck_assert_uint_eq(stored[2][0], 0); /* zero: a hole already */
	ck_assert_uint_gt(stored[2][1], 0);
	zsum += stored[2][1];
	ck_assert_uint_eq(st.zip_bytes, 5 * 256 * KIB);
	ck_assert_uint_eq(st.zip_stored, zsum);
	for (int i = 0; i < 3; i++)
		for (size_t k = 0; k < carrier_nchunks(size[i], 256 * KIB); k++) {
			uint64_t l = size[i] - k * 256 * KIB < 256 * KIB ? size[i] - k * 256 * KIB : 256 * KIB;

			ck_assert_uint_eq(src.crc[i][k], ref_crc32c(src.mem[i] + k * 256 * KIB, l));
		}
	ck_assert_int_eq(fstat(fd, &sb), 0);
	ck_assert_uint_eq((uint64_t)sb.st_size, size[0] + size[1] + size[2]);
	/* Random bytes and frames, a page each for the tail's and the frames' ends. */
	ck_assert_msg((uint64_t)sb.st_blocks * 512 <= size[1] + zsum + 7 * 4 * KIB, "%lld blocks for %u frame bytes",
		      (long long)sb.st_blocks, zsum);

	/* Back, in one pass and verify-first. */
	for (int vf = 0; vf < 2; vf++) {
		dev_like(&dst, &src, 0xee);
		for (int i = 0; i < 3; i++)
			dst.items[i].stored = stored[i];
		c.verify_first = vf;
		ck_assert_msg(carrier_load(&stub_ops, &c, fd, dst.items, 3, &st, err, sizeof(err)) == 0, "%s", err);
		for (int i = 0; i < 3; i++)
			ck_assert_int_eq(memcmp(dst.mem[i], src.mem[i], size[i]), 0);
		ck_assert_uint_eq(st.zip_bytes, 5 * 256 * KIB); /* once, verify-first too */
		ck_assert_uint_eq(st.zip_stored, zsum);
		dev_free(&dst);
	}
	c.verify_first = 0;

	/* Striped: each extent's stored lengths are its own chunks'. */
	for (int i = 0; i < 3; i++)
		src.items[i].stored = sstored[i];
	ck_assert_msg(carrier_save_striped(&stub_ops, &c, fds, 2, 0, src.items, 3, &st, err, sizeof(err)) == 0, "%s",
		      err);
	ck_assert_int_eq(memcmp(sstored[0], stored[0], 5 * sizeof(uint32_t)), 0);
	ck_assert_uint_eq(st.zip_bytes, 5 * 256 * KIB);
	dev_like(&dst, &src, 0xee);
	for (int i = 0; i < 3; i++) {
		dst.items[i].stored = sstored[i];
		dst.items[i].ext = src.items[i].ext;
		dst.items[i].next = src.items[i].next;
	}
	ck_assert_msg(carrier_load_striped(&stub_ops, &c, fds, 2, dst.items, 3, NULL, err, sizeof(err)) == 0, "%s",
		      err);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(memcmp(dst.mem[i], src.mem[i], size[i]), 0);
		dst.items[i].ext = NULL;
	}
	carrier_items_free_extents(src.items, 3);
	dev_free(&dst);

	/* A damaged frame: chunk 1 of item 0. */
	dev_like(&dst, &src, 0xee);
	for (int i = 0; i < 3; i++) {
		dst.items[i].stored = stored[i];
		dst.items[i].offset = src.items[i].offset = off[i];
	}
	ck_assert_int_eq(pread(fd, &byte, 1, (off_t)(src.items[0].offset + 256 * KIB + stored[0][1] / 2)), 1);
	byte ^= 0xff;
	ck_assert_int_eq(pwrite(fd, &byte, 1, (off_t)(src.items[0].offset + 256 * KIB + stored[0][1] / 2)), 1);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, 3, NULL, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "alloc 0: chunk 1 ") && strstr(err, "corrupt carrier image"), "%s", err);
	byte ^= 0xff;
	ck_assert_int_eq(pwrite(fd, &byte, 1, (off_t)(src.items[0].offset + 256 * KIB + stored[0][1] / 2)), 1);

	/* A stored length the chunk cannot have. */
	dst.items[0].stored = (uint32_t[5]){stored[0][0], 256 * KIB, stored[0][2], stored[0][3], 0};
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, 3, NULL, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "alloc 0: chunk 1 ") && strstr(err, "is stored compressed in 262144 bytes for its "
								      "262144 (corrupt carrier index)"),
		      "%s", err);
	dst.items[0].stored = stored[0];

	/* The file cut inside item 2's frame: refused before any read. */
	ck_assert_int_eq(ftruncate(fd, (off_t)(src.items[2].offset + 256 * KIB + stored[2][1] / 2)), 0);
	ck_assert_int_eq(carrier_load(&stub_ops, &c, fd, dst.items, 3, NULL, err, sizeof(err)), -ENODATA);
	ck_assert_msg(strstr(err, "alloc 2: ") && strstr(err, "chunk 1 is missing: truncated carrier image"), "%s",
		      err);
	dev_free(&dst);
	assert_no_leak();
	for (int i = 0; i < 3; i++) {
		free(stored[i]);
		free(sstored[i]);
	}
	dev_free(&src);
	close(fd);
	close(fds[0]);
	close(fds[1]);
}
END_TEST

static void *lookup_stub(void *arg, const char *name)
{
	return strcmp(name, (const char *)arg) ? (void *)stub_ops.ctx_get_current : NULL;
}

START_TEST(ops_resolve_names_missing_symbol)
{
	struct carrier_ops o;
	char err[128];

	ck_assert_int_eq(carrier_ops_resolve(&o, lookup_stub, "none", err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(o.memcpy_htod_async);
	ck_assert_int_eq(carrier_ops_resolve(&o, lookup_stub, "cuMemHostAlloc", err, sizeof(err)), 0);
	ck_assert_ptr_null(o.mem_host_alloc);
	ck_assert_int_eq(carrier_ops_resolve(&o, lookup_stub, "cuMemcpyDtoHAsync_v2", err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "cuMemcpyDtoHAsync_v2"), "%s", err);
}
END_TEST

static Suite *suite(int needs_root)
{
	Suite *s = suite_create("carrier-pipeline");
	TCase *t;

	if (needs_root) {
		t = tcase_create("needs-root");
		tcase_add_checked_fixture(t, setup, NULL);
		tcase_set_timeout(t, 60);
		tcase_add_test(t, write_enospc_on_full_tmpfs);
		suite_add_tcase(s, t);
		return s;
	}
	t = tcase_create("stripe");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, stripe_unit_is_a_quarter_share_in_whole_chunks);
	tcase_add_test(t, stripe_split_balances_files_and_narrows_crcs);
	tcase_add_test(t, striped_roundtrip_every_byte_and_crc);
	tcase_add_test(t, striped_load_refuses_bad_extents_and_names_file_and_chunk);
	tcase_add_test(t, staging_sized_to_the_carrier);
	tcase_add_test(t, buffers_stay_small_whatever_the_staging);
	tcase_add_test(t, save_copies_next_slice_while_writing_this_one);
	suite_add_tcase(s, t);

	t = tcase_create("pipeline");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, roundtrip_mixed_sizes_every_byte_and_crc);
	tcase_add_test(t, small_items_in_runs_one_wait_per_run_every_byte_and_crc);
	tcase_add_test(t, zero_runs_left_as_holes_read_back_as_zeros);
	tcase_add_test(t, zero_runs_punched_where_the_file_cannot_shrink);
	tcase_add_test(t, parent_chunks_are_not_written_and_a_load_through_both_files_is_whole);
	tcase_add_test(t, compressed_chunks_round_trip_and_damage_is_refused);
	tcase_add_test(t, compressing_contexts_fit_every_level_and_length);
	tcase_add_test(t, roundtrip_chunk_not_dividing_buffer);
	tcase_add_test(t, roundtrip_staging_smaller_than_chunk);
	tcase_add_test(t, several_files_roundtrip_and_refusals);
	tcase_add_test(t, empty_and_zero_size_items);
	tcase_add_test(t, corrupt_byte_refused_naming_chunk);
	tcase_add_test(t, corrupt_byte_with_verify_first_leaves_device_untouched);
	tcase_add_test(t, truncated_file_refused_before_device_touched);
	tcase_add_test(t, index_size_mismatch_refused);
	tcase_add_test(t, bad_descriptors_refused);
	tcase_add_test(t, write_enospc_is_clean_error);
	tcase_add_test(t, write_efbig_under_rlimit_fsize);
	tcase_add_test(t, device_copy_failure_is_clean_error);
	tcase_add_test(t, load_copy_failure_is_clean_error);
	tcase_add_test(t, staging_bound_holds_for_item_8x_staging);
	tcase_add_test(t, progress_reported_to_total);
	tcase_add_test(t, config_from_environment);
	tcase_add_test(t, ops_resolve_names_missing_symbol);
	suite_add_tcase(s, t);
	return s;
}

int main(int argc, char **argv)
{
	int needs_root = argc > 1 && !strcmp(argv[1], "--needs-root"), failed;
	SRunner *r;

	if (needs_root && geteuid() != 0) {
		fprintf(stderr, "SKIP: mounting a tmpfs in a private mount namespace needs root\n");
		return 77;
	}
	r = srunner_create(suite(needs_root));
	srunner_run_all(r, CK_NORMAL);
	failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
