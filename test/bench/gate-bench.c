/*
 * gate-bench - cost per call of a gated launch-class entry point, with the
 * interposer preloaded and without, in one run.
 *
 *   gate-bench [-i INTERPOSER [-i INTERPOSER2]] [-n CALLS] [-r RUNS]
 *
 * The parent re-executes itself in R rounds; a round runs one process per
 * mode back to back: plain and LD_PRELOAD=INTERPOSER (default
 * $GATE_BENCH_INTERPOSER), and INTERPOSER2 when given (say, before and
 * after a change), in an order that rotates from round to round so that no
 * mode always runs first. Per case and mode it prints the median over the
 * rounds and the minimum, and per interposer the paired ratio: the median
 * over the rounds of preloaded / plain of the same round (drift of the
 * machine between rounds cancels). A child creates a
 * context, 4 KiB of device memory and a stream, warms up, then times CALLS
 * calls of each measured entry point, synchronizing the stream every 256
 * calls (the synchronizations are part of the cost in both modes):
 *   htod-async   cuMemcpyHtoDAsync of 4 bytes
 *   memset-async cuMemsetD32Async of one word
 *   launch-bad   cuLaunchKernel of a NULL function, no synchronization: the
 *                fake refuses it (CUDA_ERROR_INVALID_HANDLE) after its own
 *                cheap checks, so the interposer's gate is most of what
 *                differs
 * A child checks /proc/self/maps: the preloaded run must have the
 * interposer mapped and the plain one must not.
 */
#include <cuda.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NCASES	 3
#define MAX_RUNS 101
#define MAX_LIBS 2
#define SYNC	 256

static const char *const case_name[NCASES] = {"htod-async", "memset-async", "launch-bad"};

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static bool interposed(void)
{
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f))
		found |= strstr(line, "libcuinterpose") != NULL;
	if (f)
		fclose(f);
	return found;
}

#define CK(x)                                                                  \
	do {                                                                   \
		CUresult r_ = (x);                                             \
		if (r_ != CUDA_SUCCESS) {                                      \
			fprintf(stderr, "gate-bench: %s: error %d\n", #x, r_); \
			exit(2);                                               \
		}                                                              \
	} while (0)

static double run_case(int c, long n, CUdeviceptr d, CUstream s)
{
	unsigned int v = 0x5a5a5a5a;
	double t0 = now_ns();

	for (long i = 0; i < n; i++) {
		if (c == 0) {
			CK(cuMemcpyHtoDAsync(d, &v, sizeof(v), s));
		} else if (c == 1) {
			CK(cuMemsetD32Async(d, v, 1, s));
		} else {
			if (cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL) != CUDA_ERROR_INVALID_HANDLE) {
				fprintf(stderr, "gate-bench: a NULL kernel was not refused\n");
				exit(2);
			}
			continue;
		}
		if (i % SYNC == SYNC - 1)
			CK(cuStreamSynchronize(s));
	}
	CK(cuStreamSynchronize(s));
	return (now_ns() - t0) / n;
}

/* One measurement: prints "ns ns ..." (one per case) on stdout. */
static int child(long n, int want_interposer)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr d;
	CUstream s;

	if (interposed() != want_interposer) {
		fprintf(stderr, "gate-bench: interposer %s\n", want_interposer ? "not loaded" : "loaded");
		return 2;
	}
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuMemAlloc(&d, 4096));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	for (int c = 0; c < NCASES; c++) {
		run_case(c, n / 10 + 1, d, s); /* warm-up */
		printf("%.1f ", run_case(c, n, d, s));
	}
	printf("\n");
	return 0;
}

static int measure(const char *self, const char *interposer, long n, double *ns)
{
	char arg[32];
	int pfd[2], status;
	FILE *f;
	pid_t pid;
	int got = 0;

	if (pipe(pfd))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		if (interposer)
			setenv("LD_PRELOAD", interposer, 1);
		else
			unsetenv("LD_PRELOAD");
		snprintf(arg, sizeof(arg), "%ld", n);
		execl(self, self, "--child", arg, interposer ? "1" : "0", (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	f = fdopen(pfd[0], "r");
	for (int c = 0; f && c < NCASES; c++)
		got += fscanf(f, "%lf", &ns[c]) == 1;
	if (f)
		fclose(f);
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) || got != NCASES)
		return -EIO;
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double min_of(const double *v, int n)
{
	double m = v[0];

	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

int main(int argc, char **argv)
{
	const char *lib[MAX_LIBS] = {getenv("GATE_BENCH_INTERPOSER"), NULL};
	/* ns[mode][case][round]: mode 0 plain, 1.. the interposers */
	static double ns[1 + MAX_LIBS][NCASES][MAX_RUNS], ratio[MAX_RUNS];
	double one[NCASES];
	long n = 200000;
	int runs = 7, nlib = 0, o;

	if (argc == 4 && !strcmp(argv[1], "--child"))
		return child(atol(argv[2]), atoi(argv[3]));
	while ((o = getopt(argc, argv, "i:n:r:")) != -1) {
		switch (o) {
		case 'i':
			if (nlib == MAX_LIBS)
				goto usage;
			lib[nlib++] = optarg;
			break;
		case 'n':
			n = atol(optarg);
			break;
		case 'r':
			runs = atoi(optarg);
			break;
		default:
			goto usage;
		}
	}
	if (!nlib)
		nlib = 1; /* $GATE_BENCH_INTERPOSER */
	for (int l = 0; l < nlib; l++)
		if (!lib[l] || !*lib[l])
			goto usage;
	if (n < 1 || runs < 1 || runs > MAX_RUNS || optind != argc)
		goto usage;
	for (int r = 0; r < runs; r++) {
		for (int k = 0; k <= nlib; k++) {
			int m = (r + k) % (nlib + 1); /* rotate which mode goes first */

			if (measure("/proc/self/exe", m ? lib[m - 1] : NULL, n, one))
				return fprintf(stderr, "gate-bench: round %d, %s failed\n", r,
					       m ? lib[m - 1] : "plain"),
				       1;
			for (int c = 0; c < NCASES; c++)
				ns[m][c][r] = one[c];
		}
	}
	printf("%ld calls per process, %d rounds; ns per call: median over the rounds (min); ratio: median of the "
	       "rounds' preloaded / plain\n",
	       n, runs);
	for (int l = 0; l < nlib; l++)
		printf("lib%d = %s\n", l + 1, lib[l]);
	printf("%-13s %18s", "call", "plain");
	for (int l = 0; l < nlib; l++)
		printf(" %14s%d %7s%d", "lib", l + 1, "ratio", l + 1);
	printf("\n");
	for (int c = 0; c < NCASES; c++) {
		double tmp[MAX_RUNS];

		memcpy(tmp, ns[0][c], sizeof(tmp[0]) * runs);
		printf("%-13s %9.1f (%6.1f)", case_name[c], median(tmp, runs), min_of(ns[0][c], runs));
		for (int l = 1; l <= nlib; l++) {
			for (int r = 0; r < runs; r++)
				ratio[r] = ns[l][c][r] / ns[0][c][r];
			memcpy(tmp, ns[l][c], sizeof(tmp[0]) * runs);
			printf(" %8.1f (%6.1f) %8.3f", median(tmp, runs), min_of(ns[l][c], runs), median(ratio, runs));
		}
		printf("\n");
	}
	return 0;
usage:
	fprintf(stderr,
		"usage: gate-bench [-i INTERPOSER [-i INTERPOSER2]] [-n CALLS] [-r RUNS 1..%d] "
		"(or GATE_BENCH_INTERPOSER)\n",
		MAX_RUNS);
	return 2;
}
