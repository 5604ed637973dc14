/*
 * pipeline-bench.c - the carrier pipeline's own CPU cost, on the in-process
 * stub driver (stub.c: "device" memory is host memory, a copy is a memcpy
 * done at the stream wait): striped save and load of one item of -s MiB
 * over -F files in -d with -t threads, the minimum wall time of -r runs,
 * and the summed per-thread setup, copy wait, I/O and CRC times of that
 * run. No GPU and no fake-driver process, so what changes between two
 * builds of carrier/ is the pipeline (pinning, CRC passes,
 * system calls). Built by `make pipeline-bench`, not part of `make check`;
 * single-threaded main, no locks of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "carrier.h"
#include "stub.h"

#define MIB ((uint64_t)1024 * 1024)
/* Builds of carrier.c from before per-thread pinning have no pin_seconds
 * (-DNO_PIN_SECONDS: pinning is in setup there). */
#ifdef NO_PIN_SECONDS
#define PIN_SECONDS(s) 0.0
#else
#define PIN_SECONDS(s) (s)->pin_seconds
#endif

static void die(const char *what, int rc, const char *err)
{
	fprintf(stderr, "pipeline-bench: %s: %s (%d)\n", what, err, rc);
	exit(1);
}

static void show(const char *what, const struct carrier_stats *s)
{
	printf("%-4s %7.3f s %6.2f GB/s  setup %.3f  pin %.3f  copy %.3f  io %.3f  crc %.3f  (%u threads, %u x %" PRIu64
	       " KiB)\n",
	       what, s->seconds, s->total / s->seconds / 1e9, s->setup_seconds, PIN_SECONDS(s), s->copy_wait_seconds,
	       s->io_seconds, s->crc_seconds, s->threads, s->buffers, s->buffer_bytes >> 10);
}

int main(int argc, char **argv)
{
	uint64_t size = 512 * MIB;
	unsigned files = 4, threads = 4, runs = 5;
	const char *dir = "/tmp";
	struct carrier_config cfg;
	struct carrier_stats best_s = {0}, best_l = {0}, st;
	char err[512];
	int c, fds[CARRIER_FILES_MAX];
	uint8_t *dev;

	while ((c = getopt(argc, argv, "s:F:t:r:d:S:")) != -1) {
		switch (c) {
		case 's':
			size = strtoull(optarg, NULL, 0) * MIB;
			break;
		case 'F':
			files = (unsigned)atoi(optarg);
			break;
		case 't':
			threads = (unsigned)atoi(optarg);
			break;
		case 'r':
			runs = (unsigned)atoi(optarg);
			break;
		case 'd':
			dir = optarg;
			break;
		case 'S':
			setenv("CUINTERPOSE_STAGING_MB", optarg, 1);
			break;
		default:
			fprintf(stderr, "usage: pipeline-bench [-s MiB] [-F files] [-t threads] [-r runs] [-d dir] "
					"[-S staging MiB]\n");
			return 2;
		}
	}
	if (!files || files > CARRIER_FILES_MAX)
		die("-F", -EINVAL, "files out of range");
	if (carrier_config_init(&cfg, err, sizeof(err)))
		die("config", -EINVAL, err);
	cfg.threads = threads;
	dev = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dev == MAP_FAILED)
		die("mmap", -errno, strerror(errno));
	for (uint64_t i = 0; i < size; i += 8)
		*(uint64_t *)(dev + i) = i * 0x9E3779B97F4A7C15ull;
	for (unsigned f = 0; f < files; f++) {
		char path[4096];

		snprintf(path, sizeof(path), "%s/pipeline-bench.XXXXXX", dir);
		fds[f] = mkstemp(path);
		if (fds[f] < 0)
			die(path, -errno, strerror(errno));
		unlink(path);
	}
	stub_ops.ctx_set_current(STUB_CTX);
	for (unsigned r = 0; r < runs; r++) {
		uint64_t nc = carrier_nchunks(size, cfg.chunk_size);
		uint32_t *crc = calloc(nc, sizeof(*crc));
		struct carrier_item it = {.va = (CUdeviceptr)(uintptr_t)dev,
					  .size = size,
					  .ctx = STUB_CTX,
					  .name = "bench",
					  .crc = crc,
					  .ncrc = nc};
		int rc;

		for (unsigned f = 0; f < files; f++)
			if (ftruncate(fds[f], 0))
				die("ftruncate", -errno, strerror(errno));
		rc = carrier_save_striped(&stub_ops, &cfg, fds, files, 0, &it, 1, &st, err, sizeof(err));
		if (rc)
			die("save", rc, err);
		if (!r || st.seconds < best_s.seconds)
			best_s = st;
		rc = carrier_load_striped(&stub_ops, &cfg, fds, files, &it, 1, &st, err, sizeof(err));
		if (rc)
			die("load", rc, err);
		if (!r || st.seconds < best_l.seconds)
			best_l = st;
		carrier_items_free_extents(&it, 1);
		free(crc);
	}
	printf("%" PRIu64 " MiB, %u files, %u threads, min of %u runs\n", size / MIB, files, threads, runs);
	show("save", &best_s);
	show("load", &best_l);
	return 0;
}
