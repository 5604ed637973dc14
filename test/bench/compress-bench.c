/*
 * compress-bench.c - would compressing carrier chunks pay? Reads a file of
 * checkpointed bytes (weights, a cache, a carrier image), cuts it into the
 * carrier's 1 MiB chunks and, for each codec Debian ships as a well-kept
 * library (zstd levels 1 and 3, LZ4), compresses and decompresses every
 * chunk on T threads, checks that every byte comes back, and prints the
 * ratio and the rates next to a plain memcpy of the same chunks (the
 * baseline, same run). Zero chunks are skipped by all and counted apart
 * (the carrier never stores them); ratios and rates are of the rest. The libraries are loaded at run time (libzstd.so.1,
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
static uint8_t **kept; /* per chunk: its compressed bytes (allocated and touched before timing) */
static size_t *klen, cap;
static pthread_barrier_t phase; /* the threads and main: start, compressed, decompressed */

struct job {
	enum codec c;
	unsigned t;
	uint64_t in_bytes, out_bytes, zero_chunks;
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

static size_t chunk_len(size_t k)
{
	return total - k * CHUNK < CHUNK ? total - k * CHUNK : CHUNK;
}

/* This thread's chunks (every nthreads-th), each phase started together
 * with the others at a barrier; zero chunks are skipped by every codec
 * (the carrier never stores them) and counted apart. */
static void *run(void *arg)
{
	struct job *j = arg;
	uint8_t *back = malloc(CHUNK);

	if (!back)
		j->bad = ENOMEM;
	else
		memset(back, 1, CHUNK);
	pthread_barrier_wait(&phase);
	for (size_t k = j->t; k < nchunks && !j->bad; k += nthreads) {
		const uint8_t *in = data + k * CHUNK;
		size_t n = chunk_len(k), m = 0;

		klen[k] = 0;
		if (all_zero(in, n)) {
			j->zero_chunks++;
			continue;
		}
		switch (j->c) {
		case MEMCPY:
			memcpy(kept[k], in, n);
			m = n;
			break;
		case ZSTD1:
		case ZSTD3:
			m = L.zcomp(kept[k], cap, in, n, j->c == ZSTD1 ? 1 : 3);
			if (L.ziserr(m))
				j->bad = EIO;
			break;
		case LZ4: {
			int r = L.lcomp((const char *)in, (char *)kept[k], (int)n, (int)cap);
			if (r <= 0)
				j->bad = EIO;
			m = r > 0 ? (size_t)r : 0;
			break;
		}
		}
		klen[k] = m;
		j->in_bytes += n;
		j->out_bytes += m;
	}
	pthread_barrier_wait(&phase);
	for (size_t k = j->t; k < nchunks && !j->bad; k += nthreads) {
		size_t n = chunk_len(k), m = 0;

		if (!klen[k])
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
	pthread_barrier_wait(&phase);
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
	/* stored: compressed / non-zero bytes; rates: non-zero bytes per second
	 * of wall time, every thread started at once. */
	printf("%-18s %8s %8s %14s %14s\n", "codec", "stored", "zero", "compress GB/s", "decompress GB/s");
	cap = CHUNK + CHUNK / 8 + 4096;
	kept = calloc(nchunks, sizeof(*kept));
	klen = calloc(nchunks, sizeof(*klen));
	for (size_t k = 0; kept && k < nchunks; k++) {
		kept[k] = malloc(cap);
		if (!kept[k])
			break;
		memset(kept[k], 1, cap); /* faulted in before any timing */
	}
	if (!kept || !klen || !kept[nchunks - 1]) {
		fprintf(stderr, "compress-bench: out of memory for %zu chunk buffers\n", nchunks);
		return 2;
	}
	for (int c = MEMCPY; c <= LZ4; c++) {
		struct job *j = calloc(nthreads, sizeof(*j));
		pthread_t *th = calloc(nthreads, sizeof(*th));
		uint64_t in = 0, out = 0, zero = 0;
		double t0, t1, t2;
		int bad = 0;

		if (!j || !th || pthread_barrier_init(&phase, NULL, nthreads + 1)) {
			fprintf(stderr, "compress-bench: cannot set up %u threads\n", nthreads);
			return 2;
		}
		for (unsigned t = 0; t < nthreads; t++) {
			j[t] = (struct job){.c = (enum codec)c, .t = t};
			if (pthread_create(&th[t], NULL, run, &j[t])) {
				fprintf(stderr, "compress-bench: cannot start thread %u\n", t);
				return 2; /* the started ones wait at the barrier: exit ends them */
			}
		}
		pthread_barrier_wait(&phase);
		t0 = now();
		pthread_barrier_wait(&phase);
		t1 = now();
		pthread_barrier_wait(&phase);
		t2 = now();
		for (unsigned t = 0; t < nthreads; t++) {
			pthread_join(th[t], NULL);
			in += j[t].in_bytes;
			out += j[t].out_bytes;
			zero += j[t].zero_chunks;
			bad = bad ? bad : j[t].bad;
		}
		pthread_barrier_destroy(&phase);
		if (bad) {
			printf("%-18s FAILED: %s\n", codec_name[c], strerror(bad));
			rc = 1;
		} else if (in) {
			printf("%-18s %8.3f %8zu %14.2f %14.2f\n", codec_name[c], (double)out / (double)in,
			       (size_t)zero, (double)in / (t1 - t0) / 1e9, (double)in / (t2 - t1) / 1e9);
		} else {
			printf("%-18s every chunk is zero\n", codec_name[c]);
		}
		free(j);
		free(th);
	}
	for (size_t k = 0; k < nchunks; k++)
		free(kept[k]);
	free(kept);
	free(klen);
	free(buf);
	return rc;
}
