/*
 * compress-bench.c - would compressing carrier chunks pay? Reads a file of
 * checkpointed bytes (weights, a cache, a carrier image), cuts it into the
 * carrier's 1 MiB chunks and, for each codec Debian ships as a well-kept
 * library (zstd levels 1 and 3, LZ4), compresses and decompresses every
 * chunk on T threads, checks that every byte comes back, and prints the
 * ratio and the rates next to a plain memcpy of the same chunks (the
 * baseline, same run). Zero chunks are counted apart (the carrier never
 * stores them). The libraries are loaded at run time (libzstd.so.1,
 * liblz4.so.1), so the bench builds without their headers and runs where
 * only the runtime libraries are installed.
 *
 *   compress-bench FILE [THREADS]
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)

typedef size_t (*zstd_bound_fn)(size_t);
typedef size_t (*zstd_comp_fn)(void *, size_t, const void *, size_t, int);
typedef size_t (*zstd_decomp_fn)(void *, size_t, const void *, size_t);
typedef unsigned (*zstd_iserr_fn)(size_t);
typedef int (*lz4_bound_fn)(int);
typedef int (*lz4_comp_fn)(const char *, char *, int, int);
typedef int (*lz4_decomp_fn)(const char *, char *, int, int);

static struct {
	zstd_bound_fn zbound;
	zstd_comp_fn zcomp;
	zstd_decomp_fn zdecomp;
	zstd_iserr_fn ziserr;
	lz4_bound_fn lbound;
	lz4_comp_fn lcomp;
	lz4_decomp_fn ldecomp;
} L;

enum codec { MEMCPY, ZSTD1, ZSTD3, LZ4 };
static const char *const codec_name[] = {"memcpy (baseline)", "zstd -1", "zstd -3", "lz4"};

static const uint8_t *data;
static size_t nchunks, total;
static unsigned nthreads;

struct job {
	enum codec c;
	unsigned t;
	uint64_t out_bytes, zero_chunks;
	double comp_s, decomp_s;
	int bad; /* a chunk that did not come back, or a codec error */
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && !memcmp(p, p + 1, n - 1));
}

/* Compress and decompress this thread's chunks (every nthreads-th). */
static void *run(void *arg)
{
	struct job *j = arg;
	size_t cap = CHUNK + CHUNK / 8 + 4096;
	uint8_t *out = malloc(cap), *back = malloc(CHUNK);
	uint8_t **kept = calloc(nchunks, sizeof(*kept));
	size_t *klen = calloc(nchunks, sizeof(*klen));
	double t;

	if (!out || !back || !kept || !klen) {
		j->bad = ENOMEM;
		goto out;
	}
	t = now();
	for (size_t k = j->t; k < nchunks && !j->bad; k += nthreads) {
		const uint8_t *in = data + k * CHUNK;
		size_t n = total - k * CHUNK < CHUNK ? total - k * CHUNK : CHUNK, m = 0;

		if (j->c != MEMCPY && all_zero(in, n)) {
			j->zero_chunks++;
			continue;
		}
		switch (j->c) {
		case MEMCPY:
			memcpy(out, in, n);
			m = n;
			break;
		case ZSTD1:
		case ZSTD3:
			m = L.zcomp(out, cap, in, n, j->c == ZSTD1 ? 1 : 3);
			if (L.ziserr(m))
				j->bad = EIO;
			break;
		case LZ4: {
			int r = L.lcomp((const char *)in, (char *)out, (int)n, (int)cap);
			if (r <= 0)
				j->bad = EIO;
			m = (size_t)r;
			break;
		}
		}
		if (j->bad)
			break;
		kept[k] = malloc(m);
		if (!kept[k]) {
			j->bad = ENOMEM;
			break;
		}
		memcpy(kept[k], out, m);
		klen[k] = m;
		j->out_bytes += m;
	}
	j->comp_s = now() - t;
	t = now();
	for (size_t k = j->t; k < nchunks && !j->bad; k += nthreads) {
		size_t n = total - k * CHUNK < CHUNK ? total - k * CHUNK : CHUNK, m = 0;

		if (!kept[k])
			continue; /* a zero chunk */
		switch (j->c) {
		case MEMCPY:
			memcpy(back, kept[k], klen[k]);
			m = klen[k];
			break;
		case ZSTD1:
		case ZSTD3:
			m = L.zdecomp(back, CHUNK, kept[k], klen[k]);
			if (L.ziserr(m))
				m = 0;
			break;
		case LZ4: {
			int r = L.ldecomp((const char *)kept[k], (char *)back, (int)klen[k], CHUNK);
			m = r < 0 ? 0 : (size_t)r;
			break;
		}
		}
		if (m != n || memcmp(back, data + k * CHUNK, n))
			j->bad = EBADMSG;
	}
	j->decomp_s = now() - t;
out:
	for (size_t k = 0; kept && k < nchunks; k++)
		free(kept[k]);
	free(kept);
	free(klen);
	free(out);
	free(back);
	return NULL;
}

static int load_libs(void)
{
	void *z = dlopen("libzstd.so.1", RTLD_NOW), *l = dlopen("liblz4.so.1", RTLD_NOW);

	if (!z || !l) {
		fprintf(stderr, "compress-bench: libzstd.so.1 or liblz4.so.1 is not installed: %s\n", dlerror());
		return -1;
	}
	L.zbound = (zstd_bound_fn)dlsym(z, "ZSTD_compressBound");
	L.zcomp = (zstd_comp_fn)dlsym(z, "ZSTD_compress");
	L.zdecomp = (zstd_decomp_fn)dlsym(z, "ZSTD_decompress");
	L.ziserr = (zstd_iserr_fn)dlsym(z, "ZSTD_isError");
	L.lbound = (lz4_bound_fn)dlsym(l, "LZ4_compressBound");
	L.lcomp = (lz4_comp_fn)dlsym(l, "LZ4_compress_default");
	L.ldecomp = (lz4_decomp_fn)dlsym(l, "LZ4_decompress_safe");
	if (!L.zbound || !L.zcomp || !L.zdecomp || !L.ziserr || !L.lbound || !L.lcomp || !L.ldecomp) {
		fprintf(stderr, "compress-bench: a zstd or lz4 entry point is missing\n");
		return -1;
	}
	if (L.zbound(CHUNK) > CHUNK + CHUNK / 8 + 4096 || (size_t)L.lbound(CHUNK) > CHUNK + CHUNK / 8 + 4096) {
		fprintf(stderr, "compress-bench: a codec's bound exceeds the output buffer\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct stat st;
	uint8_t *buf;
	int fd, rc = 0;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: compress-bench FILE [THREADS]\n");
		return 2;
	}
	nthreads = argc == 3 ? (unsigned)atoi(argv[2]) : 16;
	if (nthreads < 1 || nthreads > 256 || load_libs())
		return 2;
	fd = open(argv[1], O_RDONLY);
	if (fd < 0 || fstat(fd, &st) || st.st_size <= 0) {
		fprintf(stderr, "compress-bench: %s: %s\n", argv[1], fd < 0 ? strerror(errno) : "empty");
		return 2;
	}
	total = (size_t)st.st_size;
	buf = malloc(total);
	for (size_t got = 0; buf && got < total;) {
		ssize_t r = pread(fd, buf + got, total - got, (off_t)got);
		if (r <= 0) {
			fprintf(stderr, "compress-bench: reading %s failed\n", argv[1]);
			return 2;
		}
		got += (size_t)r;
	}
	close(fd);
	if (!buf)
		return 2;
	data = buf;
	nchunks = (total + CHUNK - 1) / CHUNK;
	printf("%s: %zu bytes, %zu chunks of 1 MiB, %u threads\n", argv[1], total, nchunks, nthreads);
	printf("%-18s %8s %8s %14s %14s\n", "codec", "stored", "zero", "compress GB/s", "decompress GB/s");
	for (int c = MEMCPY; c <= LZ4; c++) {
		struct job *j = calloc(nthreads, sizeof(*j));
		pthread_t *th = calloc(nthreads, sizeof(*th));
		uint64_t out = 0, zero = 0;
		double cs = 0, ds = 0;
		int bad = 0;

		for (unsigned t = 0; t < nthreads; t++) {
			j[t] = (struct job){.c = (enum codec)c, .t = t};
			pthread_create(&th[t], NULL, run, &j[t]);
		}
		for (unsigned t = 0; t < nthreads; t++) {
			pthread_join(th[t], NULL);
			out += j[t].out_bytes;
			zero += j[t].zero_chunks;
			cs = j[t].comp_s > cs ? j[t].comp_s : cs;
			ds = j[t].decomp_s > ds ? j[t].decomp_s : ds;
			bad = bad ? bad : j[t].bad;
		}
		if (bad) {
			printf("%-18s FAILED: %s\n", codec_name[c], strerror(bad));
			rc = 1;
		} else {
			printf("%-18s %8.3f %8zu %14.2f %14.2f\n", codec_name[c], (double)out / (double)total,
			       (size_t)zero, (double)total / cs / 1e9, (double)total / ds / 1e9);
		}
		free(j);
		free(th);
	}
	free(buf);
	return rc;
}
