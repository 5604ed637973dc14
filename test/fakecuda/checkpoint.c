/*
 * The caller side of the checkpoint API (cuCheckpointProcess*): finds the
 * target's mailbox (mailbox.h) in /proc/PID/maps, maps it through
 * /proc/PID/map_files/ (needs CAP_SYS_ADMIN, like the real driver's caller
 * needs root), posts the request and waits for the target's restore thread.
 * GetState and GetRestoreThreadId read the mailbox directly, so they answer
 * even while the target is frozen.  Concurrent callers serialize with flock()
 * on the mailbox; no state of this process is touched, so the calls answer
 * before cuInit too (FK_CALL_ANY), as NVIDIA's driver does.
 *
 * Pids are the caller's, as with the real driver: a target in a child pid
 * namespace stored the pid and restore tid it sees itself in its mailbox, so
 * both are translated through NSpid in /proc (the caller's procfs).
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "mailbox.h"

struct target {
	int fd;
	struct fk_mailbox *mb;
};

/* The pid `id` (a process or a thread under /proc) has in its own, innermost
 * pid namespace: the last NSpid field; `id` itself without NSpid. */
static int inner_pid(const char *status_path, int id)
{
	char line[256];
	int inner = id;
	FILE *f = fopen(status_path, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *p = line + 6, *end;

		if (strncmp(line, "NSpid:", 6))
			continue;
		for (;;) {
			long v = strtol(p, &end, 10);
			if (end == p)
				break;
			inner = (int)v;
			p = end;
		}
		break;
	}
	fclose(f);
	return inner;
}

static CUresult target_open(int pid, struct target *t)
{
	char path[64], line[512];
	unsigned long lo = 0, hi = 0;
	FILE *f;
	int found = 0;

	/* No such process: CUDA_ERROR_OPERATING_SYSTEM, as NVIDIA's driver
	 * answers (measured on an H200 for a free and a negative pid, every
	 * action, with or without cuInit in the caller). */
	if (pid <= 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return CUDA_ERROR_OPERATING_SYSTEM;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "/memfd:" FK_MB_NAME) && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
			found = 1;
			break;
		}
	fclose(f);
	if (!found)
		return CUDA_ERROR_NOT_INITIALIZED; /* the process never called cuInit */
	snprintf(path, sizeof(path), "/proc/%d/map_files/%lx-%lx", pid, lo, hi);
	t->fd = open(path, O_RDWR | O_CLOEXEC);
	if (t->fd < 0)
		return errno == EPERM || errno == EACCES ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
	t->mb = mmap(NULL, FK_MB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
	if (t->mb == MAP_FAILED) {
		close(t->fd);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (t->mb->magic != FK_MB_MAGIC || t->mb->version != FK_MB_VERSION || t->mb->pid != inner_pid(path, pid)) {
		munmap(t->mb, FK_MB_SIZE);
		close(t->fd);
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	return CUDA_SUCCESS;
}

/* Alive and not a zombie: a dead target's restore thread will never answer. */
static int target_alive(int pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static void target_close(struct target *t)
{
	munmap(t->mb, FK_MB_SIZE);
	close(t->fd);
}

/* Posts one request and waits for the restore thread's answer (as long as the target lives). */
static CUresult request(int pid, uint32_t action, uint32_t timeout_ms, const CUcheckpointRestoreArgs *ra,
			CUprocessState *state)
{
	struct target t;
	struct fk_mailbox *mb;
	CUresult r = target_open(pid, &t);
	uint32_t seq;

	if (r)
		return r;
	mb = t.mb;
	flock(t.fd, LOCK_EX);
	mb->action = action;
	mb->timeout_ms = timeout_ms;
	mb->npairs = ra ? ra->gpuPairsCount : 0;
	if (mb->npairs)
		memcpy(mb->pairs, ra->gpuPairs, sizeof(mb->pairs[0]) * mb->npairs);
	seq = __atomic_load_n(&mb->req_seq, __ATOMIC_ACQUIRE) + 1;
	__atomic_store_n(&mb->req_seq, seq, __ATOMIC_RELEASE);
	syscall(SYS_futex, &mb->req_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	for (;;) {
		struct timespec ts = {0, 100000000};
		uint32_t d = __atomic_load_n(&mb->done_seq, __ATOMIC_ACQUIRE);

		if (d == seq) {
			r = (CUresult)mb->result;
			break;
		}
		syscall(SYS_futex, &mb->done_seq, FUTEX_WAIT, d, &ts, NULL, 0);
		if (!target_alive(pid)) {
			/* Unlock reopens the API before it answers; a target
			 * that exits at once was unlocked all the same. */
			r = action == FK_MB_UNLOCK &&
					    __atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) == CU_PROCESS_STATE_RUNNING
				    ? CUDA_SUCCESS
				    : CUDA_ERROR_INVALID_VALUE;
			break;
		}
	}
	if (state && r == CUDA_SUCCESS)
		*state = (CUprocessState)__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE);
	flock(t.fd, LOCK_UN);
	target_close(&t);
	return r;
}

static int all_zero(const void *p, size_t n)
{
	const unsigned char *c = p;

	for (size_t i = 0; i < n; i++)
		if (c[i])
			return 0;
	return 1;
}

/* The caller's tid of the target's thread that calls itself `own` in its pid
 * namespace (the task directory names are the caller's tids). */
static int caller_tid(int pid, int own)
{
	char path[96];
	struct dirent *de;
	int found = -1;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (inner_pid(path, pid) == pid)
		return own; /* same pid namespace */
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d)
		return -1;
	while (found < 0 && (de = readdir(d))) {
		int tid = atoi(de->d_name);

		snprintf(path, sizeof(path), "/proc/%d/task/%d/status", pid, tid);
		if (tid > 0 && inner_pid(path, tid) == own)
			found = tid;
	}
	closedir(d);
	return found;
}

static CUresult get_restore_tid(int pid, int *tid)
{
	struct target t;
	CUresult r;
	int own;

	if (!tid)
		return CUDA_ERROR_INVALID_VALUE;
	r = target_open(pid, &t);
	if (r)
		return r;
	own = __atomic_load_n(&t.mb->restore_tid, __ATOMIC_ACQUIRE);
	target_close(&t);
	own = caller_tid(pid, own);
	if (own <= 0)
		return CUDA_ERROR_INVALID_VALUE; /* the restore thread is gone */
	*tid = own;
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	FK_CALL_ANY("cuCheckpointProcessGetRestoreThreadId", get_restore_tid(pid, tid));
}

/*
 * Answered by the target's restore thread, like the other actions: NVIDIA's
 * driver (r580, measured on an H200) blocks GetState while the target's
 * threads are stopped, and only GetRestoreThreadId answers then.
 */
static CUresult get_state(int pid, CUprocessState *state)
{
	if (!state)
		return CUDA_ERROR_INVALID_VALUE;
	return request(pid, FK_MB_STATE, 0, NULL, state);
}

FK_API CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	FK_CALL_ANY("cuCheckpointProcessGetState", get_state(pid, state));
}

static CUresult ck_lock(int pid, CUcheckpointLockArgs *args)
{
	if (args && (args->reserved0 || !all_zero(args->reserved1, sizeof(args->reserved1))))
		return CUDA_ERROR_INVALID_VALUE;
	return request(pid, FK_MB_LOCK, args ? args->timeoutMs : 0, NULL, NULL);
}

FK_API CUresult CUDAAPI cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	FK_CALL_ANY("cuCheckpointProcessLock", ck_lock(pid, args));
}

static CUresult ck_checkpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	if (args && !all_zero(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	return request(pid, FK_MB_CHECKPOINT, 0, NULL, NULL);
}

FK_API CUresult CUDAAPI cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	FK_CALL_ANY("cuCheckpointProcessCheckpoint", ck_checkpoint(pid, args));
}

static CUresult ck_restore(int pid, CUcheckpointRestoreArgs *args)
{
	if (args) {
		if (args->gpuPairsCount > FKW_MAX_DEV || (args->gpuPairsCount && !args->gpuPairs) ||
		    !all_zero(args->reserved, sizeof(args->reserved)) || args->reserved1)
			return CUDA_ERROR_INVALID_VALUE;
	}
	return request(pid, FK_MB_RESTORE, 0, args, NULL);
}

FK_API CUresult CUDAAPI cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	FK_CALL_ANY("cuCheckpointProcessRestore", ck_restore(pid, args));
}

static CUresult ck_unlock(int pid, CUcheckpointUnlockArgs *args)
{
	if (args && !all_zero(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	return request(pid, FK_MB_UNLOCK, 0, NULL, NULL);
}

FK_API CUresult CUDAAPI cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	FK_CALL_ANY("cuCheckpointProcessUnlock", ck_unlock(pid, args));
}
