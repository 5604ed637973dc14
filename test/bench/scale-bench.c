/*
 * scale-bench - how cuinterpose's own bookkeeping grows with the number of
 * tracked allocations (issue 11), on the fake driver.
 *
 *   scale-bench worker DIR RANK NPROC NALLOC SHARE_EVERY
 *	run under the interposer (LD_PRELOAD) and fakecuda-run, on GPU RANK
 *	modulo the device count: create NALLOC
 *	POSIX-capable allocations of one granule each, map them, tag each with
 *	8 bytes, export every SHARE_EVERY-th (the rest stay private) and import
 *	and map every other rank's shared ones. Then write DIR/rRANK.ready
 *	("pid") and wait: SIGUSR1 checks every tag (own and imported) and
 *	writes DIR/rRANK.vSEQ "ok" or "FAIL ..."; SIGTERM exits.
 *   scale-bench coord DIR NPROC SOCKDIR IMGDIR [native]
 *	drive the workers like the plugin does, with the plugin's own
 *	coordinator (plugin/coord.c): dump phases (HANDSHAKE .. PREPARE_UNICAST),
 *	optionally native lock/checkpoint/restore/unlock (each process alone,
 *	then all in parallel), then the rebuild (LOAD .. VERIFY, RESUME); one
 *	line per phase with its wall time, and a summary line "SUMMARY ...".
 *
 * scale-bench.sh runs the sizes and prints the ratios.
 */
#include "config.h"

#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "criulog.h"
#include "native.h"

#define CK(x)                                                                                               \
	do {                                                                                                \
		CUresult r_ = (x);                                                                          \
		if (r_ != CUDA_SUCCESS) {                                                                   \
			fprintf(stderr, "rank %d: %s failed: %d (line %d)\n", rank, #x, (int)r_, __LINE__); \
			exit(1);                                                                            \
		}                                                                                           \
	} while (0)

static int rank;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void raise_nofile(void)
{
	struct rlimit rl = {.rlim_cur = 1 << 20, .rlim_max = 1 << 20};

	if (setrlimit(RLIMIT_NOFILE, &rl)) {
		getrlimit(RLIMIT_NOFILE, &rl);
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static void put_file(const char *dir, const char *name, const char *text)
{
	char tmp[4200], path[4200];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(tmp, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) || rename(tmp, path)) {
		perror(path);
		exit(1);
	}
}

static void wait_file(const char *dir, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	while (access(path, F_OK))
		usleep(2000);
}

/* ---- worker ---------------------------------------------------------------- */

static volatile sig_atomic_t want_verify, want_quit;

static void on_sig(int s)
{
	if (s == SIGUSR1)
		want_verify = 1;
	else
		want_quit = 1;
}

struct mapped {
	CUdeviceptr va;
	uint64_t tag;
};

static uint64_t tag_of(int r, long i)
{
	return 0x5ca1e00000000000ull | (uint64_t)r << 32 | (uint64_t)i;
}

static int worker(int argc, char **argv)
{
	const char *dir;
	int nproc, every, nfd = 0, seq = 0;
	long nalloc, nshared, nm = 0;
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr own, imp;
	struct mapped *m;
	size_t gran;
	CUcontext ctx;
	CUdevice dev;
	int *tickets, ndev = 1;
	char *line;
	size_t cap, len = 0;

	if (argc != 7)
		return 2;
	dir = argv[2];
	rank = atoi(argv[3]);
	nproc = atoi(argv[4]);
	nalloc = atol(argv[5]);
	every = atoi(argv[6]);
	nshared = (nalloc + every - 1) / every;
	raise_nofile();
	signal(SIGUSR1, on_sig);
	signal(SIGTERM, on_sig);
	CK(cuInit(0));
	CK(cuDeviceGetCount(&ndev));
	CK(cuDeviceGet(&dev, rank % (ndev > 0 ? ndev : 1))); /* rank r on GPU r mod count */
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	acc.location.id = dev; /* imported memory of another GPU: through peer access */
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	m = calloc((size_t)(nalloc + nshared * nproc), sizeof(*m));
	tickets = calloc((size_t)nshared, sizeof(*tickets));
	cap = 64 + (size_t)nshared * 12;
	line = malloc(cap);
	if (!m || !tickets || !line)
		return 1;
	CK(cuMemAddressReserve(&own, gran * (size_t)nalloc, 0, 0, 0));
	CK(cuMemAddressReserve(&imp, gran * (size_t)(nshared * nproc), 0, 0, 0));
	len = (size_t)snprintf(line, cap, "%d", (int)getpid());
	for (long i = 0; i < nalloc; i++) {
		CUmemGenericAllocationHandle h;
		CUdeviceptr va = own + gran * (size_t)i;

		CK(cuMemCreate(&h, gran, &prop, 0));
		CK(cuMemMap(va, gran, 0, h, 0));
		CK(cuMemSetAccess(va, gran, &acc, 1));
		m[nm] = (struct mapped){va, tag_of(rank, i)};
		CK(cuMemcpyHtoD(va, &m[nm].tag, sizeof(m[nm].tag)));
		nm++;
		if (i % every == 0) {
			int fd;
			CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			tickets[nfd++] = fd;
			len += (size_t)snprintf(line + len, cap - len, " %d", fd);
		}
		CK(cuMemRelease(h)); /* the mapping keeps it */
	}
	line[len++] = '\n';
	line[len] = 0;
	{
		char name[32];
		snprintf(name, sizeof(name), "t%d", rank);
		put_file(dir, name, line);
	}
	/* Import every other rank's shared allocations through /proc/PID/fd
	 * (root): the tickets are memfds, reopening keeps their seals. */
	for (int q = 0, slot = 0; q < nproc; q++) {
		char name[32], path[4200];
		FILE *f;
		int pid, fd;
		long i = 0;

		if (q == rank)
			continue;
		snprintf(name, sizeof(name), "t%d", q);
		wait_file(dir, name);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		f = fopen(path, "r");
		if (!f || fscanf(f, "%d", &pid) != 1)
			return 1;
		while (fscanf(f, "%d", &fd) == 1) {
			char p[64];
			CUmemGenericAllocationHandle h;
			CUdeviceptr va = imp + gran * (size_t)slot++;
			uint64_t got = 0;
			int tfd;

			snprintf(p, sizeof(p), "/proc/%d/fd/%d", pid, fd);
			tfd = open(p, O_RDONLY | O_CLOEXEC);
			if (tfd < 0) {
				fprintf(stderr, "rank %d: %s: %s\n", rank, p, strerror(errno));
				return 1;
			}
			CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)tfd,
							  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
			close(tfd);
			CK(cuMemMap(va, gran, 0, h, 0));
			CK(cuMemSetAccess(va, gran, &acc, 1));
			CK(cuMemRelease(h));
			m[nm] = (struct mapped){va, tag_of(q, i * every)};
			CK(cuMemcpyDtoH(&got, va, sizeof(got)));
			if (got != m[nm].tag) {
				fprintf(stderr, "rank %d: import from rank %d: tag %llx\n", rank, q,
					(unsigned long long)got);
				return 1;
			}
			nm++;
			i++;
		}
		fclose(f);
	}
	{
		char name[32], text[32];
		snprintf(name, sizeof(name), "r%d.ready", rank);
		snprintf(text, sizeof(text), "%d\n", (int)getpid());
		put_file(dir, name, text);
	}
	while (!want_quit) {
		pause();
		if (want_verify) {
			char name[32], text[256] = "ok\n";
			want_verify = 0;
			for (long i = 0; i < nm; i++) {
				uint64_t got = 0;
				CUresult r = cuMemcpyDtoH(&got, m[i].va, sizeof(got));
				if (r != CUDA_SUCCESS || got != m[i].tag) {
					snprintf(text, sizeof(text),
						 "FAIL at %#llx: result %d, tag %llx, expected %llx\n",
						 (unsigned long long)m[i].va, (int)r, (unsigned long long)got,
						 (unsigned long long)m[i].tag);
					break;
				}
			}
			snprintf(name, sizeof(name), "r%d.v%d", rank, ++seq);
			put_file(dir, name, text);
		}
	}
	for (int i = 0; i < nfd; i++)
		close(tickets[i]);
	return 0;
}

/* ---- coordinator ------------------------------------------------------------ */

struct mark {
	const char *name;
	double t;
};
static struct mark marks[64];
static int nmarks;
static double t_last;

static void after_phase(struct cuip_group *g, enum cuip_gphase ph, int status)
{
	const char *phase = cuip_gphase_name(ph);
	double t = now();

	(void)g;
	if (nmarks < 64)
		marks[nmarks++] = (struct mark){phase, t - t_last};
	printf("  %-22s %8.3f s%s\n", phase, t - t_last, status ? "  FAILED" : "");
	t_last = t;
}

static double phase_sum(const char *const *names)
{
	double s = 0;

	for (int i = 0; i < nmarks; i++)
		for (const char *const *n = names; *n; n++)
			if (!strcmp(marks[i].name, *n))
				s += marks[i].t;
	return s;
}

static int find_sock(const char *sockdir, pid_t pid, char *out, size_t len)
{
	char pre[32];
	struct dirent *de;
	DIR *d = opendir(sockdir);

	snprintf(pre, sizeof(pre), "%d-", (int)pid);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!strncmp(de->d_name, pre, strlen(pre)) && strstr(de->d_name, ".sock")) {
			snprintf(out, len, "%s/%s", sockdir, de->d_name);
			closedir(d);
			return 0;
		}
	}
	closedir(d);
	return -ENOENT;
}

#define NATIVE_ROUNDS 9

static int env_int(const char *name, int def)
{
	const char *v = getenv(name);

	return v && *v ? atoi(v) : def;
}

/* Lock, checkpoint, restore, unlock of v[0..n) (each step for all at once);
 * dt[0..3] the wall time of each step, dt[4] their sum. */
static int native_cycle(struct cuip_native_proc *v, size_t n, unsigned tmo, double dt[5])
{
	char err[512];
	double t = now(), t0 = t;
	int ret = cuip_native_lock_all(v, n, tmo, err, sizeof(err));

	dt[0] = now() - t;
	t = now();
	if (!ret)
		ret = cuip_native_checkpoint_all(v, n, err, sizeof(err));
	dt[1] = now() - t;
	t = now();
	if (!ret)
		ret = cuip_native_restore_all(v, n, NULL, 0, err, sizeof(err));
	dt[2] = now() - t;
	t = now();
	if (!ret)
		ret = cuip_native_unlock_all(v, n, err, sizeof(err));
	dt[3] = now() - t;
	dt[4] = now() - t0;
	if (ret)
		fprintf(stderr, "native: %s\n", err);
	for (size_t i = 0; i < n; i++)
		v[i].locked = v[i].checkpointed = false;
	return ret;
}

static int coord(int argc, char **argv)
{
	static const char *const insp[] = {"HANDSHAKE", "INSPECT", "PREFLIGHT", NULL};
	static const char *const prep[] = {"QUIESCE", "PREPARE_MULTICAST", "SAVE", "IMAGES", "PREPARE_UNICAST", NULL};
	static const char *const rest[] = {"LOAD", "REBUILD_CREATORS", "REBUILD_IMPORTERS", "VERIFY", NULL};
	struct cuip_group g = {0};
	struct cuip_opts o;
	const char *dir, *sockdir, *imgdir;
	bool native;
	double t_dump, t_reb, t_i, t_p, t_r, t_save, t_load, nat_par = 0, nat_max = 0;
	const Cuip__Topology **tp;
	Cuip__Topology *topo;
	char err[512];
	int n, ret;

	if (argc < 6)
		return 2;
	dir = argv[2];
	n = atoi(argv[3]);
	sockdir = argv[4];
	imgdir = argv[5];
	native = argc > 6 && !strcmp(argv[6], "native");
	raise_nofile();
	if (cuip_opts_load(&o, err, sizeof(err))) {
		fprintf(stderr, "options: %s\n", err);
		return 1;
	}
	g.o = &o;
	g.n = (size_t)n;
	g.p = calloc((size_t)n, sizeof(*g.p));
	g.imgdir = open(imgdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	g.after_phase = after_phase;
	if (!g.p || g.imgdir < 0)
		return 1;
	for (int i = 0; i < n; i++) {
		char name[32], path[4200];
		FILE *f;

		snprintf(name, sizeof(name), "r%d.ready", i);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		f = fopen(path, "r");
		if (!f || fscanf(f, "%d", &g.p[i].pid) != 1)
			return 1;
		fclose(f);
		g.p[i].vpid = g.p[i].pid;
		g.p[i].fd = -1;
		if (find_sock(sockdir, g.p[i].pid, g.p[i].sock, sizeof(g.p[i].sock))) {
			fprintf(stderr, "no control socket for pid %d in %s\n", g.p[i].pid, sockdir);
			return 1;
		}
	}
	printf("dump phases (plugin coordinator, %d processes):\n", n);
	t_last = now();
	t_dump = t_last;
	ret = cuip_group_dump(&g);
	t_dump = now() - t_dump;
	if (ret) {
		fprintf(stderr, "dump failed: %s\n", g.err);
		return 1;
	}
	if (native) {
		struct cuip_native_proc *v = calloc((size_t)n, sizeof(*v));

		if (!v || cuip_native_open(o.libcuda, err, sizeof(err))) {
			fprintf(stderr, "native: %s\n", err);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			v[i].pid = g.p[i].pid;
			if (cuip_native_probe(v[i].pid, &v[i].restore_tid, &v[i].initial, err, sizeof(err))) {
				fprintf(stderr, "native probe: %s\n", err);
				return 1;
			}
		}
		/* Rounds of: each process alone, then all at once; the ratio
		 * of each round, and the round with the median ratio reported. */
		double ratio[NATIVE_ROUNDS], par[NATIVE_ROUNDS], slow[NATIVE_ROUNDS], sum[NATIVE_ROUNDS];
		int rounds = env_int("SCALE_NATIVE_ROUNDS", 3), mid = 0;

		rounds = rounds < 1 ? 1 : rounds > NATIVE_ROUNDS ? NATIVE_ROUNDS : rounds;
		for (int k = 0; k < rounds; k++) {
			double step[5], smax[5] = {0}, grp[5];

			slow[k] = sum[k] = 0;
			printf("native lock+checkpoint+restore+unlock, round %d, each process alone:", k + 1);
			for (int i = 0; i < n; i++) {
				if (native_cycle(&v[i], 1, o.lock_timeout_ms, step))
					return 1;
				printf(" %.3f", step[4]);
				for (int x = 0; x < 5; x++)
					smax[x] = step[x] > smax[x] ? step[x] : smax[x];
				sum[k] += step[4];
			}
			slow[k] = smax[4];
			if (native_cycle(v, (size_t)n, o.lock_timeout_ms, grp))
				return 1;
			par[k] = grp[4];
			ratio[k] = par[k] / slow[k];
			printf(" s\n  all %d in parallel: %.3f s = %.2f x the slowest alone (%.3f s), %.2f x their sum "
			       "(%.3f s)\n"
			       "  per step, all at once / slowest alone: lock %.3f/%.3f checkpoint %.3f/%.3f restore "
			       "%.3f/%.3f unlock %.3f/%.3f\n",
			       n, par[k], ratio[k], slow[k], par[k] / sum[k], sum[k], grp[0], smax[0], grp[1], smax[1],
			       grp[2], smax[2], grp[3], smax[3]);
		}
		for (int k = 0; k < rounds; k++) {
			int below = 0;
			for (int j = 0; j < rounds; j++)
				below += ratio[j] < ratio[k];
			if (below == (rounds - 1) / 2)
				mid = k;
		}
		nat_par = par[mid];
		nat_max = slow[mid];
		printf("native, all %d in parallel: %.3f s = %.2f x the slowest alone (%.3f s), median of %d rounds; "
		       "%.2f x the sum of all alone (what a serial loop takes)\n",
		       n, nat_par, nat_par / nat_max, nat_max, rounds, nat_par / sum[mid]);
		free(v);
	}
	topo = calloc((size_t)n, sizeof(*topo));
	tp = calloc((size_t)n, sizeof(*tp));
	if (!topo || !tp)
		return 1;
	for (int i = 0; i < n; i++) {
		cuip_group_topology(&g, (size_t)i, &topo[i]);
		tp[i] = &topo[i];
	}
	printf("rebuild phases:\n");
	t_last = now();
	t_reb = t_last;
	ret = cuip_group_rebuild(&g, tp);
	t_reb = now() - t_reb;
	if (ret) {
		fprintf(stderr, "rebuild failed: %s\n", g.err);
		return 1;
	}
	t_i = phase_sum(insp);
	t_p = phase_sum(prep);
	t_r = phase_sum(rest);
	{
		static const char *const s[] = {"SAVE", NULL}, *const l[] = {"LOAD", NULL};
		t_save = phase_sum(s);
		t_load = phase_sum(l);
	}
	printf("SUMMARY procs=%d inspect=%.3f prepare=%.3f save=%.3f restore=%.3f load=%.3f total=%.3f "
	       "dump_wall=%.3f rebuild_wall=%.3f native_par=%.3f native_max_single=%.3f\n",
	       n, t_i, t_p, t_save, t_r, t_load, t_i + t_p + t_r, t_dump, t_reb, nat_par, nat_max);
	free(topo);
	free(tp);
	close(g.imgdir);
	g.imgdir = -1;
	cuip_group_free(&g);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "worker"))
		return worker(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "coord"))
		return coord(argc, argv);
	fprintf(stderr, "usage: scale-bench worker DIR RANK NPROC NALLOC SHARE_EVERY\n"
			"       scale-bench coord DIR NPROC SOCKDIR IMGDIR [native]\n");
	return 2;
}
