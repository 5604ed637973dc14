/*
 * carrier-bench.c - host-carrier throughput against its baselines, all
 * measured in the same run on the same bytes:
 *
 *   (a) plain pinned cuMemcpyDtoH / cuMemcpyHtoD of the device bytes
 *       (through one pinned buffer of up to 1 GiB, reused);
 *   (b) plain file I/O of the same byte count in the same directory: one
 *       sequential writer/reader, and the best of 2..W parallel pwrite/pread
 *       threads on disjoint ranges;
 *   (c) carrier_save / carrier_load for each thread count asked for;
 *       with -x, one file against carrier_save_striped/_load_striped over
 *       -F files (the interposer's own split, as SAVE and LOAD do), and
 *       the striped carrier's ratios to the best plain parallel write into
 *       separate files and the best parallel read (target >= 0.8);
 *
 * then carrier/(a) and carrier/(b) ratios, medians of R runs, and the peak
 * extra resident memory of each carrier run. Standalone: dlopens
 * libcuda.so.1 (the real driver or test/fakecuda's), links no CUDA library.
 * Not part of `make check`; see test/bench/carrier-bench.sh.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "carrier.h"
#include "wire.h"

#define MIB	 (1024ull * 1024)
#define GB	 1e9
#define MAX_RUNS 15

static struct {
	void *lib;
	CUresult (*init)(unsigned);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*host_alloc)(void **, size_t, unsigned);
	CUresult (*free_host)(void *);
	CUresult (*ctx_sync)(void);
} cu;

static struct carrier_ops ops;

static struct {
	uint64_t size;
	const char *dir;
	const char *lib;
	uint64_t staging_mb;
	uint32_t chunk_mb;
	unsigned threads[16], nthreads;
	unsigned writers;
	unsigned files;
	int runs;
	int device;
	int fsync_plain;
	int verify;
	uint64_t item;	    /* -i: bytes per item (0: one item per file) */
	int stripe;	    /* -x: one file, then striped over `files` by the carrier */
	unsigned cur_files; /* files of the carrier rows now running */
} opt = {
	.size = 1024 * MIB,
	.dir = "/tmp",
	.lib = "libcuda.so.1",
	.staging_mb = 224,
	.chunk_mb = 1,
	.threads = {0, 1, 2, 4, 8},
	.nthreads = 5,
	.writers = 8,
	.files = 1,
	.runs = 3,
	.verify = 1,
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "carrier-bench: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CK(call)                                         \
	do {                                             \
		CUresult r_ = (call);                    \
		if (r_ != CUDA_SUCCESS)                  \
			die("%s failed: %d", #call, r_); \
	} while (0)

static void *sym(const char *name)
{
	void *p = dlsym(cu.lib, name);

	if (!p)
		die("%s lacks %s", opt.lib, name);
	return p;
}

static void *lookup(void *arg, const char *name)
{
	return dlsym(arg, name);
}

static void load_driver(void)
{
	char err[256];

	cu.lib = dlopen(opt.lib, RTLD_NOW | RTLD_LOCAL);
	if (!cu.lib)
		die("dlopen %s: %s", opt.lib, dlerror());
	*(void **)&cu.init = sym("cuInit");
	*(void **)&cu.device_get = sym("cuDeviceGet");
	*(void **)&cu.primary_retain = sym("cuDevicePrimaryCtxRetain");
	*(void **)&cu.ctx_set = sym("cuCtxSetCurrent");
	*(void **)&cu.mem_alloc = sym("cuMemAlloc_v2");
	*(void **)&cu.mem_free = sym("cuMemFree_v2");
	*(void **)&cu.memset_d8 = sym("cuMemsetD8_v2");
	*(void **)&cu.htod = sym("cuMemcpyHtoD_v2");
	*(void **)&cu.dtoh = sym("cuMemcpyDtoH_v2");
	*(void **)&cu.host_alloc = sym("cuMemHostAlloc");
	*(void **)&cu.free_host = sym("cuMemFreeHost");
	*(void **)&cu.ctx_sync = sym("cuCtxSynchronize");
	if (carrier_ops_resolve(&ops, lookup, cu.lib, err, sizeof(err)))
		die("%s", err);
}

/* ---- resident memory ---------------------------------------------------- */

static uint64_t status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	size_t kl = strlen(key);
	uint64_t v = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = strtoull(line + kl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v * 1024;
}

static void reset_hwm(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (write(fd, "5", 1) != 1)
			fprintf(stderr, "carrier-bench: cannot reset VmHWM\n");
		close(fd);
	}
}

/* Peak RssAnon sampled from the progress callback: private memory only,
 * so a fake driver's shared device windows do not count. */
static uint64_t anon_peak, anon_base;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
	uint64_t a = status_kb("RssAnon");

	if (a > anon_peak)
		anon_peak = a;
}

/* ---- statistics --------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- baselines ------------------------------------------------------------ */

static CUdeviceptr dev;
static uint8_t *pinned; /* up to 1 GiB, pattern source and copy target */
static uint64_t pinned_len;

static double copy_gbs(int to_host)
{
	double t = now();

	for (uint64_t o = 0; o < opt.size; o += pinned_len) {
		uint64_t l = opt.size - o < pinned_len ? opt.size - o : pinned_len;

		if (to_host)
			CK(cu.dtoh(pinned, dev + o, l));
		else
			CK(cu.htod(dev + o, pinned, l));
	}
	return opt.size / (now() - t) / GB;
}

struct io_job {
	int fd;
	uint64_t off, len;
	int write;
	int rc;
};

static void *io_thread(void *arg)
{
	struct io_job *j = arg;
	uint64_t done = 0;

	while (done < j->len) {
		uint64_t l = j->len - done < 64 * MIB ? j->len - done : 64 * MIB;
		uint64_t src = (j->off + done) % pinned_len;
		ssize_t r;

		if (src + l > pinned_len)
			l = pinned_len - src;
		r = j->write ? pwrite(j->fd, pinned + src, l, j->off + done)
			     : pread(j->fd, pinned + src, l, j->off + done);
		if (r <= 0) {
			j->rc = r < 0 ? errno : EIO;
			return NULL;
		}
		done += r;
	}
	return NULL;
}

static char plain_path[4096];

/*
 * n threads on disjoint ranges: write into a fresh file, or read it back.
 * With `separate`, thread i uses its own file (write only): buffered writes
 * to one file serialize on its inode lock, to different files they need not.
 */
static double file_gbs(unsigned n, int write, int separate)
{
	struct io_job jobs[64];
	pthread_t tid[64];
	int fds[64];
	uint64_t per = (opt.size / n + 4095) / 4096 * 4096;
	double t;

	for (unsigned i = 0; i < n; i++) {
		char path[4200];

		if (i && !separate) {
			fds[i] = fds[0];
			continue;
		}
		snprintf(path, sizeof(path), "%s.%u", plain_path, i);
		if (write)
			unlink(path);
		fds[i] = open(path, write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0600);
		if (fds[i] < 0)
			die("open %s: %s", path, strerror(errno));
	}
	t = now();
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = i * per;

		jobs[i] = (struct io_job){
			fds[i], off, off >= opt.size ? 0 : (opt.size - off < per ? opt.size - off : per), write, 0};
		pthread_create(&tid[i], NULL, io_thread, &jobs[i]);
	}
	for (unsigned i = 0; i < n; i++) {
		pthread_join(tid[i], NULL);
		if (jobs[i].rc)
			die("%s %s: %s", write ? "write" : "read", plain_path, strerror(jobs[i].rc));
	}
	if (write && opt.fsync_plain)
		for (unsigned i = 0; i < (separate ? n : 1); i++)
			fdatasync(fds[i]);
	t = now() - t;
	/* The single file stays for the read that follows; separate go. */
	for (unsigned i = 0; i < (separate ? n : 1); i++) {
		char path[4200];

		close(fds[i]);
		snprintf(path, sizeof(path), "%s.%u", plain_path, i);
		if (separate)
			unlink(path);
	}
	return opt.size / t / GB;
}

/* ---- carrier runs -------------------------------------------------------- */

static char carrier_path[4096];

struct crun {
	double save_gbs, load_gbs;
	uint64_t save_hwm, load_hwm, save_anon, load_anon;
	struct carrier_stats save_st, load_st;
};

/* The carrier files and items of one run: the device bytes split into
 * opt.files equal parts, part k in file k (carrier_save_files), as a caller
 * that stripes a large allocation over several carrier files would; with
 * -i each part is cut further into items of opt.item bytes, as a job with
 * many small allocations has. */
struct cfiles {
	struct carrier_config cfg;
	struct carrier_item *it;
	size_t n;
	int fds[CARRIER_FILES_MAX];
	unsigned nf;
};

static void cfiles_open(struct cfiles *c, unsigned threads)
{
	uint64_t per;
	char err[512], path[4200];

	c->nf = opt.cur_files;
	/* Striped: the items are not split by hand, the carrier splits them. */
	per = opt.stripe ? opt.size : (opt.size / c->nf + 4095) / 4096 * 4096;
	if (carrier_config_init(&c->cfg, err, sizeof(err)))
		die("%s", err);
	c->cfg.staging_bytes = opt.staging_mb * MIB;
	c->cfg.chunk_size = opt.chunk_mb * MIB;
	c->cfg.threads = threads;
	c->cfg.progress = on_progress;
	c->cfg.progress_every = 64 * MIB;
	c->it = calloc(opt.item ? (opt.size + opt.item - 1) / opt.item + c->nf : c->nf, sizeof(*c->it));
	c->n = 0;
	for (unsigned k = 0; k < c->nf; k++) {
		uint64_t off = k * per, len = off >= opt.size ? 0 : opt.size - off < per ? opt.size - off : per;

		for (uint64_t o = 0; o < len || (!o && !len); o += opt.item ? opt.item : len) {
			uint64_t l = opt.item && len - o > opt.item ? opt.item : len - o;
			struct carrier_item *it = &c->it[c->n++];

			*it = (struct carrier_item){
				.va = dev + off + o, .size = l, .name = "bench", .file = opt.stripe ? 0 : k};
			it->ncrc = carrier_nchunks(l, c->cfg.chunk_size);
			it->crc = calloc(it->ncrc + 1, sizeof(uint32_t));
			if (!len)
				break;
		}
		snprintf(path, sizeof(path), "%s.%u", carrier_path, k);
		unlink(path);
		c->fds[k] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (c->fds[k] < 0)
			die("open %s: %s", path, strerror(errno));
	}
}

static void cfiles_save(struct cfiles *c, struct crun *out)
{
	uint64_t base = status_kb("VmRSS");
	char err[512];

	anon_base = anon_peak = status_kb("RssAnon");
	reset_hwm();
	if (opt.stripe
		    ? carrier_save_striped(&ops, &c->cfg, c->fds, c->nf, 0, c->it, c->n, &out->save_st, err,
					   sizeof(err))
		    : carrier_save_files(&ops, &c->cfg, c->fds, c->nf, 0, c->it, c->n, &out->save_st, err, sizeof(err)))
		die("%s", err);
	out->save_hwm = status_kb("VmHWM") - base;
	out->save_anon = anon_peak - anon_base;
	out->save_gbs = opt.size / out->save_st.seconds / GB;
}

/* Load back; with `verify`, the device bytes are zeroed first so that only
 * the load can bring the pattern back. */
static void cfiles_load(struct cfiles *c, struct crun *out, int verify)
{
	uint64_t base;
	char err[512];

	if (verify)
		CK(cu.memset_d8(dev, 0, opt.size));
	base = status_kb("VmRSS");
	anon_base = anon_peak = status_kb("RssAnon");
	reset_hwm();
	if (opt.stripe
		    ? carrier_load_striped(&ops, &c->cfg, c->fds, c->nf, c->it, c->n, &out->load_st, err, sizeof(err))
		    : carrier_load_files(&ops, &c->cfg, c->fds, c->nf, c->it, c->n, &out->load_st, err, sizeof(err)))
		die("%s", err);
	out->load_hwm = status_kb("VmHWM") - base;
	out->load_anon = anon_peak - anon_base;
	out->load_gbs = opt.size / out->load_st.seconds / GB;
}

static void cfiles_close(struct cfiles *c)
{
	char path[4200];

	for (unsigned k = 0; k < c->nf; k++) {
		close(c->fds[k]);
		snprintf(path, sizeof(path), "%s.%u", carrier_path, k);
		unlink(path);
	}
	carrier_items_free_extents(c->it, c->n);
	for (size_t i = 0; i < c->n; i++)
		free(c->it[i].crc);
	free(c->it);
}

/* One save and one load of the device bytes. */
static void carrier_run(unsigned threads, struct crun *out, int verify)
{
	struct cfiles c;

	cfiles_open(&c, threads);
	cfiles_save(&c, out);
	cfiles_load(&c, out, verify);
	cfiles_close(&c);
}

/* ---- fill and verify ------------------------------------------------------ */

static void pattern(uint8_t *p, uint64_t len, uint64_t seed)
{
	uint64_t *q = (uint64_t *)p;

	for (uint64_t i = 0; i < len / 8; i++)
		q[i] = (i + seed) * 0x9E3779B97F4A7C15ull;
}

static void fill_device(void)
{
	for (uint64_t o = 0; o < opt.size; o += pinned_len) {
		uint64_t l = opt.size - o < pinned_len ? opt.size - o : pinned_len;

		pattern(pinned, l, o / 8);
		CK(cu.htod(dev + o, pinned, l));
	}
}

static void verify_device(void)
{
	uint8_t *want = malloc(64 * MIB);

	for (uint64_t o = 0; o < opt.size; o += pinned_len) {
		uint64_t l = opt.size - o < pinned_len ? opt.size - o : pinned_len;

		CK(cu.dtoh(pinned, dev + o, l));
		for (uint64_t k = 0; k < l; k += 64 * MIB) {
			uint64_t kl = l - k < 64 * MIB ? l - k : 64 * MIB;

			pattern(want, kl, (o + k) / 8);
			if (memcmp(want, pinned + k, kl))
				die("device bytes differ after carrier load near offset %" PRIu64, o + k);
		}
	}
	free(want);
}

/* On opt.device: the primary context, opt.size device bytes filled with the
 * pattern, and the pinned buffer the baselines and checks use. */
static void device_setup(void)
{
	CUcontext ctx;
	CUdevice d;

	CK(cu.device_get(&d, opt.device));
	CK(cu.primary_retain(&ctx, d));
	CK(cu.ctx_set(ctx));
	CK(cu.mem_alloc(&dev, opt.size));
	pinned_len = opt.size < 1024 * MIB ? opt.size : 1024 * MIB;
	CK(cu.host_alloc((void **)&pinned, pinned_len, CU_MEMHOSTALLOC_PORTABLE));
	fill_device();
	CK(cu.ctx_sync());
}

/* ---- several processes at once (-P) -------------------------------------- */

/*
 * What the plugin does at SAVE and LOAD: every process of the job runs its
 * own carrier into its own file, all at the same time, each on its own GPU
 * when there are several. Round 1: one process moves S/P bytes; round P: P
 * processes move S/P bytes each (process i on device (D + i) mod count).
 * Overlap = aggregate throughput of round P / that of round 1 (P when the
 * processes never wait for each other). Each process starts on a common
 * signal, save and load are separate barriers, and every process verifies
 * its bytes after the load. Forks before any driver call.
 */
struct pmsg {
	int ok;
	double seconds;
};

static void xwrite(int fd, const void *b, size_t n)
{
	if (write(fd, b, n) != (ssize_t)n)
		die("pipe write: %s", strerror(errno));
}

static void xread(int fd, void *b, size_t n)
{
	if (read(fd, b, n) != (ssize_t)n)
		die("pipe read: a process of the round died");
}

static void overlap_child(unsigned i, unsigned k, int go, int back)
{
	CUresult (*count)(int *) = NULL;
	struct cfiles c;
	struct crun cr = {0};
	struct pmsg m = {1, 0};
	int n = 1;
	char b;

	load_driver();
	CK(cu.init(0));
	*(void **)&count = sym("cuDeviceGetCount");
	CK(count(&n));
	opt.device = (opt.device + (int)i) % (n ? n : 1);
	device_setup();
	snprintf(carrier_path, sizeof(carrier_path), "%s/carrier-bench-p%u-of-%u.%d", opt.dir, i, k, getpid());
	cfiles_open(&c, 0);
	xwrite(back, &m, sizeof(m)); /* ready */
	xread(go, &b, 1);
	cfiles_save(&c, &cr);
	m.seconds = cr.save_st.seconds;
	xwrite(back, &m, sizeof(m));
	xread(go, &b, 1);
	cfiles_load(&c, &cr, 1);
	verify_device(); /* dies on a mismatch: the parent sees a short read */
	m.seconds = cr.load_st.seconds;
	xwrite(back, &m, sizeof(m));
	cfiles_close(&c);
	_exit(0);
}

/* One round of k processes: wall seconds of the save and of the load. */
static void overlap_round(unsigned k, double *save, double *load, double *slow_save, double *slow_load)
{
	int go[2], back[2], st;
	pid_t pids[64];
	struct pmsg m;
	double t;

	if (pipe(go) || pipe(back))
		die("pipe: %s", strerror(errno));
	for (unsigned i = 0; i < k; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (pids[i] == 0) {
			close(go[1]);
			close(back[0]);
			overlap_child(i, k, go[0], back[1]);
		}
	}
	close(go[0]);
	close(back[1]);
	for (unsigned i = 0; i < k; i++)
		xread(back[0], &m, sizeof(m));
	*slow_save = *slow_load = 0;
	for (int phase = 0; phase < 2; phase++) {
		t = now();
		for (unsigned i = 0; i < k; i++)
			xwrite(go[1], "g", 1);
		for (unsigned i = 0; i < k; i++) {
			xread(back[0], &m, sizeof(m));
			double *slow = phase ? slow_load : slow_save;
			if (m.seconds > *slow)
				*slow = m.seconds;
		}
		*(phase ? load : save) = now() - t;
	}
	close(go[1]);
	close(back[0]);
	for (unsigned i = 0; i < k; i++)
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			die("process %u of the round of %u failed", i, k);
}

static int overlap(unsigned P)
{
	double s1[MAX_RUNS], l1[MAX_RUNS], sp[MAX_RUNS], lp[MAX_RUNS], slow_s, slow_l, ms1, ml1, msp, mlp;
	uint64_t per = opt.size / P / 4096 * 4096;

	if (!per)
		die("-s %" PRIu64 " is too small for -P %u", opt.size, P);
	opt.size = per;
	printf("carrier-bench -P %u: each process %.0f MiB on its own device (from %d, wrapping), its own carrier "
	       "file in %s;\n%d runs (medians); device bytes verified after every load\n\n",
	       P, per / (double)MIB, opt.device, opt.dir, opt.runs);
	for (int r = 0; r < opt.runs; r++) {
		overlap_round(1, &s1[r], &l1[r], &slow_s, &slow_l);
		overlap_round(P, &sp[r], &lp[r], &slow_s, &slow_l);
	}
	ms1 = median(s1, opt.runs);
	ml1 = median(l1, opt.runs);
	msp = median(sp, opt.runs);
	mlp = median(lp, opt.runs);
	printf("%-28s %9s %10s %9s %10s\n", "", "save s", "save GB/s", "load s", "load GB/s");
	printf("%-28s %9.3f %10.2f %9.3f %10.2f\n", "1 process", ms1, per / ms1 / GB, ml1, per / ml1 / GB);
	printf("%-20s%2u at once %9.3f %10.2f %9.3f %10.2f\n", "", P, msp, P * per / msp / GB, mlp, P * per / mlp / GB);
	printf("\noverlap (aggregate of %u at once / one process; %u = never waiting for each other):"
	       " save %.2f, load %.2f\n",
	       P, P, P * ms1 / msp, P * ml1 / mlp);
	return 0;
}

/* ---- main ---------------------------------------------------------------- */

static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	switch (*end) {
	case 'k':
	case 'K':
		v *= 1024;
		break;
	case 'm':
	case 'M':
		v *= MIB;
		break;
	case 'g':
	case 'G':
		v *= 1024 * MIB;
		break;
	}
	return (uint64_t)v / 8 * 8;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: carrier-bench [-s SIZE] [-d DIR] [-S STAGING_MB] [-c CHUNK_MB] [-t T1,T2,...]\n"
		"                     [-w MAX_WRITERS] [-F FILES] [-r RUNS] [-D DEVICE] [-l LIBCUDA] [-f] [-n]\n"
		"  -s  device bytes (default 1G; suffixes K M G)   -d  directory for the files (/tmp)\n"
		"  -S  carrier staging MiB (224)  -c  chunk MiB (1)  -t  carrier thread counts (0,1,2,4,8; 0: "
		"default)\n"
		"  -w  plain I/O: best of 2..W parallel threads (8)  -r  runs, median reported (3)\n"
		"  -F  carrier over this many files, the device bytes split evenly (1)\n"
		"  -i  carrier items of this many bytes each (suffixes K M G; default one per file); prints\n"
		"      the cost per item\n"
		"  -x  carrier rows for one file, then striped over -F files by the carrier itself\n"
		"      (carrier_save_striped, as the plugin's SAVE), with ratios to the best plain\n"
		"      parallel write (separate files) and read\n"
		"  -f  fdatasync the plain writes  -n  skip verifying device bytes after load\n"
		"  -P  instead: P processes at once, each SIZE/P on its own device, against one process\n");
	exit(2);
}

int main(int argc, char **argv)
{
	double d2h[MAX_RUNS], h2d[MAX_RUNS], w1[MAX_RUNS], r1[MAX_RUNS], wn[MAX_RUNS], rn[MAX_RUNS];
	unsigned wbest = 1, rbest = 1;
	unsigned procs = 0;
	int c;

	while ((c = getopt(argc, argv, "s:d:S:c:t:w:F:r:D:l:P:i:xfnh")) != -1) {
		switch (c) {
		case 's':
			opt.size = parse_size(optarg);
			break;
		case 'd':
			opt.dir = optarg;
			break;
		case 'S':
			opt.staging_mb = strtoull(optarg, NULL, 10);
			break;
		case 'c':
			opt.chunk_mb = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 't': {
			char *s = optarg, *tok;
			opt.nthreads = 0;
			while ((tok = strsep(&s, ",")) && opt.nthreads < 16)
				opt.threads[opt.nthreads++] = (unsigned)strtoul(tok, NULL, 10);
			break;
		}
		case 'w':
			opt.writers = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'F':
			opt.files = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'r':
			opt.runs = atoi(optarg);
			break;
		case 'D':
			opt.device = atoi(optarg);
			break;
		case 'l':
			opt.lib = optarg;
			break;
		case 'i':
			opt.item = parse_size(optarg);
			break;
		case 'P':
			procs = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'x':
			opt.stripe = 1;
			break;
		case 'f':
			opt.fsync_plain = 1;
			break;
		case 'n':
			opt.verify = 0;
			break;
		default:
			usage();
		}
	}
	if (!opt.size || opt.runs < 1 || opt.runs > MAX_RUNS || opt.writers < 1 || opt.writers > 64 || opt.files < 1 ||
	    opt.files > CARRIER_FILES_MAX)
		usage();
	opt.cur_files = opt.files;
	if (procs)
		return procs > 64 ? (usage(), 2) : overlap(procs);
	snprintf(plain_path, sizeof(plain_path), "%s/carrier-bench-plain.%d", opt.dir, getpid());
	snprintf(carrier_path, sizeof(carrier_path), "%s/carrier-bench-carrier.%d", opt.dir, getpid());

	load_driver();
	CK(cu.init(0));
	device_setup();

	printf("carrier-bench: %.2f GiB device memory on device %d via %s; files in %s\n", opt.size / (1024.0 * MIB),
	       opt.device, opt.lib, opt.dir);
	printf("staging %" PRIu64 " MiB, chunk %u MiB, carrier over %u file(s), %d runs (medians)%s\n\n",
	       opt.staging_mb, opt.chunk_mb, opt.files, opt.runs, opt.fsync_plain ? ", plain writes fdatasync'd" : "");

	for (int r = 0; r < opt.runs; r++) {
		d2h[r] = copy_gbs(1);
		h2d[r] = copy_gbs(0);
	}
	fill_device(); /* the H2D baseline overwrote the pattern */
	/* Plain file I/O: one thread, then the best parallel count. */
	for (int r = 0; r < opt.runs; r++) {
		w1[r] = file_gbs(1, 1, 0);
		r1[r] = file_gbs(1, 0, 0);
	}
	double m_d2h = median(d2h, opt.runs), m_h2d = median(h2d, opt.runs);
	double m_w1 = median(w1, opt.runs), m_r1 = median(r1, opt.runs), m_wn = m_w1, m_rn = m_r1, m_ws = m_w1;
	unsigned sbest = 1;

	printf("%-34s %8.2f GB/s\n", "(a) pinned cuMemcpyDtoH", m_d2h);
	printf("%-34s %8.2f GB/s\n", "(a) pinned cuMemcpyHtoD", m_h2d);
	printf("%-34s %8.2f GB/s\n", "(b) write, 1 thread", m_w1);
	printf("%-34s %8.2f GB/s\n", "(b) read back, 1 thread", m_r1);
	for (unsigned n = 2; n <= opt.writers; n *= 2) {
		double mw, mr, ms, sep[MAX_RUNS];

		for (int r = 0; r < opt.runs; r++) {
			wn[r] = file_gbs(n, 1, 0);
			rn[r] = file_gbs(n, 0, 0);
			sep[r] = file_gbs(n, 1, 1);
		}
		mw = median(wn, opt.runs);
		mr = median(rn, opt.runs);
		ms = median(sep, opt.runs);
		printf("(b) write / read, %2u threads        %8.2f / %.2f GB/s  (write to %u separate files: %.2f)\n",
		       n, mw, mr, n, ms);
		if (mw > m_wn) {
			m_wn = mw;
			wbest = n;
		}
		if (ms > m_ws) {
			m_ws = ms;
			sbest = n;
		}
		if (mr > m_rn) {
			m_rn = mr;
			rbest = n;
		}
	}
	{
		char path[4200];

		snprintf(path, sizeof(path), "%s.0", plain_path);
		unlink(path);
	}
	printf("%-34s %8.2f GB/s (%u threads)\n", "(b) best write, one file", m_wn, wbest);
	printf("%-34s %8.2f GB/s (%u threads)\n", "(b) best write, separate files", m_ws, sbest);
	/* The ratio column compares with the best plain write of the same
	 * shape: one file, or as many separate files as the carrier uses. */
	if (opt.files > 1 && !opt.stripe)
		m_wn = m_ws;
	printf("%-34s %8.2f GB/s (%u threads)\n\n", "(b) best read", m_rn, rbest);

	double best_save = 0, best_load = 0;
	int want_stripe = opt.stripe;
	unsigned passes = want_stripe ? 2 : 1;

	for (unsigned pass = 0; pass < passes; pass++) {
		/* -x: pass 0 one file (carrier_save_files), pass 1 striped;
		 * /writeN compares one file with the best one-file write,
		 * striped with the best write into separate files. */
		opt.stripe = want_stripe && pass;
		opt.cur_files = want_stripe && !pass ? 1 : opt.files;
		if (want_stripe) {
			m_wn = pass ? m_ws : m_wn;
			printf("%s\n", pass ? "carrier striped over the files by carrier_save_striped:"
					    : "carrier into one file:");
		}
		printf("(c) carrier threads   save GB/s  /D2H  /write1 /writeN   load GB/s  /H2D  /read1 /readN"
		       "  staging MiB  extra RSS MiB save/load (HWM; anon)\n");
		for (unsigned ti = 0; ti < opt.nthreads; ti++) {
			double sv[MAX_RUNS], ld[MAX_RUNS];
			struct crun cr = {0}, last = {0};
			uint64_t hwm = 0, lhwm = 0, an = 0, lan = 0;

			for (int r = 0; r < opt.runs; r++) {
				carrier_run(opt.threads[ti], &cr, opt.verify && r == opt.runs - 1);
				sv[r] = cr.save_gbs;
				ld[r] = cr.load_gbs;
				hwm = cr.save_hwm > hwm ? cr.save_hwm : hwm;
				lhwm = cr.load_hwm > lhwm ? cr.load_hwm : lhwm;
				an = cr.save_anon > an ? cr.save_anon : an;
				lan = cr.load_anon > lan ? cr.load_anon : lan;
				last = cr;
			}
			if (opt.verify)
				verify_device();
			double ms = median(sv, opt.runs), ml = median(ld, opt.runs);
			if (opt.stripe || passes == 1) {
				best_save = ms > best_save ? ms : best_save;
				best_load = ml > best_load ? ml : best_load;
			}
			printf("    %-7s %2u/%-2u %9.2f %6.3f %7.2f %7.2f %11.2f %5.3f %7.2f %6.2f %10.0f"
			       "     %.0f/%.0f; %.0f/%.0f\n",
			       opt.threads[ti] ? "" : "default", last.save_st.threads, last.load_st.threads, ms,
			       ms / m_d2h, ms / m_w1, ms / m_wn, ml, ml / m_h2d, ml / m_r1, ml / m_rn,
			       last.save_st.staging_bytes / (double)MIB, hwm / (double)MIB, lhwm / (double)MIB,
			       an / (double)MIB, lan / (double)MIB);
			printf("                      save: setup %.3fs, per-thread sums: pin %.2fs, copy wait %.2fs, "
			       "write %.2fs, crc %.2fs;"
			       " load: setup %.3fs, pin %.2fs, copy wait %.2fs, read %.2fs, crc %.2fs\n",
			       last.save_st.setup_seconds, last.save_st.pin_seconds, last.save_st.copy_wait_seconds,
			       last.save_st.io_seconds, last.save_st.crc_seconds, last.load_st.setup_seconds,
			       last.load_st.pin_seconds, last.load_st.copy_wait_seconds, last.load_st.io_seconds,
			       last.load_st.crc_seconds);
			if (opt.item) {
				double items = (double)((opt.size + opt.item - 1) / opt.item);

				/* From the median throughputs: seconds = bytes / rate. */
				printf("                      %.0f items of %" PRIu64
				       " bytes: save %.1f us, load %.1f us "
				       "per item\n",
				       items, opt.item, 1e6 * opt.size / (ms * GB) / items,
				       1e6 * opt.size / (ml * GB) / items);
			}
		}
	}
	if (passes == 2)
		printf("\nstriped over %u files, best of the thread counts: save %.2f GB/s = %.2f of the best plain "
		       "parallel write (%.2f GB/s, %u separate files); load %.2f GB/s = %.2f of the best plain "
		       "parallel read (%.2f GB/s, %u threads) (target >= 0.8)\n",
		       opt.files, best_save, best_save / m_ws, m_ws, sbest, best_load, best_load / m_rn, m_rn, rbest);
	if (opt.verify)
		printf("\ndevice bytes verified after the last load of each thread count\n");
	cu.free_host(pinned);
	cu.mem_free(dev);
	return 0;
}
