/*
 * ckpt-shim - the command line of NVIDIA's `cuda-checkpoint` that CRIU's
 * upstream cuda_plugin uses, over the same driver API
 * (cuCheckpointProcess*), for machines without that binary. run.sh puts it
 * in PATH as `cuda-checkpoint` for the baseline only when no real one is
 * found, and says so in its output.
 *
 *   cuda-checkpoint -h
 *   cuda-checkpoint --get-state --pid P          running|locked|checkpointed
 *   cuda-checkpoint --get-restore-tid --pid P    the restore thread's tid
 *   cuda-checkpoint --action lock|checkpoint|restore|unlock --pid P [--timeout MS]
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CRIU's cuda_plugin passes the restore thread's id for --get-state: the
 * driver API wants the process (thread group) id. */
static int tgid_of(int pid)
{
	char path[64], line[128];
	int tgid = pid;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	if (!f)
		return pid;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Tgid: %d", &tgid) == 1)
			break;
	fclose(f);
	return tgid;
}

static int fail(const char *what, CUresult r)
{
	const char *n = "?";

	cuGetErrorName(r, &n);
	fprintf(stderr, "cuda-checkpoint (cuinterpose shim): %s: %s\n", what, n);
	printf("%s: %s\n", what, n);
	return 1;
}

int main(int argc, char **argv)
{
	const char *action = NULL;
	int pid = 0, get_state = 0, get_tid = 0;
	unsigned timeout = 0;
	CUresult r;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: cuda-checkpoint --action lock|checkpoint|restore|unlock --pid PID "
			       "[--timeout MS]\n       cuda-checkpoint --get-state --pid PID\n"
			       "       cuda-checkpoint --get-restore-tid --pid PID\n"
			       "(cuinterpose test shim over cuCheckpointProcess*)\n");
			return 0;
		} else if (!strcmp(argv[i], "--action") && i + 1 < argc) {
			action = argv[++i];
		} else if (!strcmp(argv[i], "--pid") && i + 1 < argc) {
			pid = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			timeout = (unsigned)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--get-state")) {
			get_state = 1;
		} else if (!strcmp(argv[i], "--get-restore-tid")) {
			get_tid = 1;
		} else {
			fprintf(stderr, "cuda-checkpoint (shim): unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	if (pid <= 0 || (!action && !get_state && !get_tid))
		return fprintf(stderr, "cuda-checkpoint (shim): --pid and an action are needed\n"), 2;
	pid = tgid_of(pid);
	r = cuInit(0);
	if (r != CUDA_SUCCESS)
		return fail("cuInit", r);
	if (get_state) {
		CUprocessState st;
		r = cuCheckpointProcessGetState(pid, &st);
		if (r != CUDA_SUCCESS)
			return fail("get-state", r);
		printf("%s\n", st == CU_PROCESS_STATE_RUNNING	     ? "running"
			       : st == CU_PROCESS_STATE_LOCKED	     ? "locked"
			       : st == CU_PROCESS_STATE_CHECKPOINTED ? "checkpointed"
								     : "failed");
		return 0;
	}
	if (get_tid) {
		int tid;
		r = cuCheckpointProcessGetRestoreThreadId(pid, &tid);
		if (r != CUDA_SUCCESS)
			return fail("get-restore-tid", r);
		printf("%d\n", tid);
		return 0;
	}
	if (!strcmp(action, "lock")) {
		CUcheckpointLockArgs a;
		memset(&a, 0, sizeof(a));
		a.timeoutMs = timeout;
		r = cuCheckpointProcessLock(pid, &a);
	} else if (!strcmp(action, "checkpoint")) {
		r = cuCheckpointProcessCheckpoint(pid, NULL);
	} else if (!strcmp(action, "restore")) {
		r = cuCheckpointProcessRestore(pid, NULL);
	} else if (!strcmp(action, "unlock")) {
		r = cuCheckpointProcessUnlock(pid, NULL);
	} else {
		return fprintf(stderr, "cuda-checkpoint (shim): unknown action %s\n", action), 2;
	}
	return r == CUDA_SUCCESS ? 0 : fail(action, r);
}
