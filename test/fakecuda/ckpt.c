/*
 * fakecuda-ckpt: a small cuda-checkpoint for tests, written only against
 * cuda.h (the driver API), so it works on the fake and on a real driver.
 *
 *   fakecuda-ckpt --pid P --action lock|checkpoint|restore|unlock|state|tid
 *                 [--timeout MS] [--remap OLDUUID=NEWUUID ...] [--no-init]
 *   fakecuda-ckpt --uuids      list the UUIDs of the visible devices
 *
 * --no-init skips cuInit: the checkpoint API needs none (NVIDIA's driver
 * answers it in a process that never initialized CUDA, and so does the fake).
 *
 * Prints the state (running/locked/checkpointed/failed) or the restore tid on
 * stdout; on failure prints the CUresult name on stderr and exits 1.
 */
#include <ctype.h>
#include <cuda.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAIRS 16

static int fail(const char *what, CUresult r)
{
	const char *name = NULL;

	cuGetErrorName(r, &name);
	fprintf(stderr, "fakecuda-ckpt: %s: %s\n", what, name ? name : "unknown error");
	return 1;
}

static int parse_uuid(const char *s, CUuuid *u)
{
	int n = 0;

	if (!strncmp(s, "GPU-", 4))
		s += 4;
	for (; *s && n < 32; s++) {
		int v;

		if (*s == '-')
			continue;
		if (!isxdigit((unsigned char)*s))
			return -1;
		v = isdigit((unsigned char)*s) ? *s - '0' : tolower((unsigned char)*s) - 'a' + 10;
		if (n % 2 == 0)
			u->bytes[n / 2] = (char)(v << 4);
		else
			u->bytes[n / 2] |= (char)v;
		n++;
	}
	return n == 32 && !*s ? 0 : -1;
}

static void print_uuid(const CUuuid *u)
{
	const unsigned char *b = (const unsigned char *)u->bytes;

	printf("GPU-");
	for (int i = 0; i < 16; i++)
		printf("%02x%s", b[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
	printf("\n");
}

static void usage(void)
{
	fprintf(stderr, "usage: fakecuda-ckpt --pid P --action lock|checkpoint|restore|unlock|state|tid\n"
			"                     [--timeout MS] [--remap OLDUUID=NEWUUID ...] [--no-init]\n"
			"       fakecuda-ckpt --uuids\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"pid", required_argument, NULL, 'p'},	   {"action", required_argument, NULL, 'a'},
		{"timeout", required_argument, NULL, 't'}, {"remap", required_argument, NULL, 'r'},
		{"uuids", no_argument, NULL, 'u'},	   {"no-init", no_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},	   {NULL, 0, NULL, 0}};
	static const char *const states[] = {"running", "locked", "checkpointed", "failed"};
	CUcheckpointGpuPair pairs[MAX_PAIRS];
	const char *action = NULL;
	unsigned int timeout = 0, npairs = 0;
	int pid = 0, uuids = 0, init = 1, o;
	CUresult r;

	while ((o = getopt_long(argc, argv, "p:a:t:r:unh", opts, NULL)) != -1) {
		switch (o) {
		case 'p':
			pid = atoi(optarg);
			break;
		case 'a':
			action = optarg;
			break;
		case 't':
			timeout = (unsigned int)strtoul(optarg, NULL, 10);
			break;
		case 'r': {
			char *eq = strchr(optarg, '=');

			if (!eq || npairs >= MAX_PAIRS)
				goto bad;
			*eq = 0;
			memset(&pairs[npairs], 0, sizeof(pairs[npairs]));
			if (parse_uuid(optarg, &pairs[npairs].oldUuid) || parse_uuid(eq + 1, &pairs[npairs].newUuid))
				goto bad;
			npairs++;
			break;
		}
		case 'u':
			uuids = 1;
			break;
		case 'n':
			init = 0;
			break;
		default:
			goto bad;
		}
	}
	if (uuids && !init)
		goto bad;
	r = init ? cuInit(0) : CUDA_SUCCESS;
	if (r)
		return fail("cuInit", r);
	if (uuids) {
		int n = 0;

		cuDeviceGetCount(&n);
		for (int i = 0; i < n; i++) {
			CUuuid u;

			if ((r = cuDeviceGetUuid(&u, i)))
				return fail("cuDeviceGetUuid", r);
			print_uuid(&u);
		}
		return 0;
	}
	if (!pid || !action)
		goto bad;
	if (!strcmp(action, "lock")) {
		CUcheckpointLockArgs a;

		memset(&a, 0, sizeof(a));
		a.timeoutMs = timeout;
		if ((r = cuCheckpointProcessLock(pid, &a)))
			return fail("cuCheckpointProcessLock", r);
	} else if (!strcmp(action, "checkpoint")) {
		if ((r = cuCheckpointProcessCheckpoint(pid, NULL)))
			return fail("cuCheckpointProcessCheckpoint", r);
	} else if (!strcmp(action, "restore")) {
		CUcheckpointRestoreArgs a;

		memset(&a, 0, sizeof(a));
		a.gpuPairs = npairs ? pairs : NULL;
		a.gpuPairsCount = npairs;
		if ((r = cuCheckpointProcessRestore(pid, npairs ? &a : NULL)))
			return fail("cuCheckpointProcessRestore", r);
	} else if (!strcmp(action, "unlock")) {
		if ((r = cuCheckpointProcessUnlock(pid, NULL)))
			return fail("cuCheckpointProcessUnlock", r);
	} else if (!strcmp(action, "state")) {
		CUprocessState s;

		if ((r = cuCheckpointProcessGetState(pid, &s)))
			return fail("cuCheckpointProcessGetState", r);
		printf("%s\n", (unsigned)s < 4 ? states[s] : "unknown");
	} else if (!strcmp(action, "tid")) {
		int tid;

		if ((r = cuCheckpointProcessGetRestoreThreadId(pid, &tid)))
			return fail("cuCheckpointProcessGetRestoreThreadId", r);
		printf("%d\n", tid);
	} else {
		goto bad;
	}
	return 0;
bad:
	usage();
	return 2;
}
