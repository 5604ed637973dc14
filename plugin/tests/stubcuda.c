/*
 * stubcuda.c - a scripted libcuda for the native agent's unit tests
 * (check_agent.c): only cuInit, cuGetErrorName and the checkpoint API, with
 * a per-pid state machine that lives in the agent process that loads it.
 *
 * Behaviour by pid: pid < 1000 is not a CUDA process; every call takes
 * 200 ms (to see the calls run in parallel); pid % 100 == 13: Lock answers
 * CUDA_ERROR_NOT_READY; == 66: Lock kills the agent (abort); == 77: Lock
 * "succeeds" but the state stays RUNNING; == 88 and == 89: Lock locks, then
 * writes a frame onto the agent's channel (fd 3) before the agent's own
 * reply, of a later format version (88) or with a wrong checksum (89), as
 * an agent of another build or a damaged stream would; == 87: Lock writes
 * a frame header and a quarter of its payload, then hangs (a broken
 * agent). Restore with GPU pairs wants two
 * pairs, the second mapping to a UUID starting with 0xBB. Nothing works
 * before cuInit (CUDA_ERROR_NOT_INITIALIZED), as on the fake driver.
 * State: a mutex-protected table (the agent's threads call concurrently).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>

#define SLOTS 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited;
static CUprocessState state[SLOTS];

CUresult CUDAAPI cuInit(unsigned int flags)
{
	(void)flags;
	__atomic_store_n(&inited, 1, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
	static const struct {
		CUresult r;
		const char *n;
	} names[] = {{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
		     {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
		     {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
		     {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"}};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].r == error) {
			*pStr = names[i].n;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult check(int pid)
{
	if (!__atomic_load_n(&inited, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	return pid < 1000 || pid >= 1000 + SLOTS ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Move pid from `from` to `to`, or CUDA_ERROR_ILLEGAL_STATE. */
static CUresult step(int pid, CUprocessState from, CUprocessState to)
{
	CUresult r = check(pid);

	if (r)
		return r;
	usleep(200000);
	pthread_mutex_lock(&mu);
	if (state[pid - 1000] != from)
		r = CUDA_ERROR_ILLEGAL_STATE;
	else
		state[pid - 1000] = to;
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	CUresult r = check(pid);

	if (!r)
		*tid = pid + 1;
	return r;
}

CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState *s)
{
	CUresult r = check(pid);

	if (!r) {
		pthread_mutex_lock(&mu);
		*s = state[pid - 1000];
		pthread_mutex_unlock(&mu);
	}
	return r;
}

/* wire.h's frame header, written by hand: this library links nothing of ours. */
static void write_foreign_frame(int version, uint32_t crc)
{
	struct {
		uint32_t magic;
		uint16_t version, kind;
		uint32_t len, crc;
		uint32_t payload;
	} f = {0x50495543u, (uint16_t)version, 6, 4, crc, 0x01020304u};

	if (write(3, &f, sizeof(f)) != (ssize_t)sizeof(f))
		abort();
}

CUresult CUDAAPI cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	(void)args;
	if (pid % 100 == 87 && !check(pid)) {
		struct {
			uint32_t magic;
			uint16_t version, kind;
			uint32_t len, crc;
			uint32_t payload;
		} f = {0x50495543u, 1, 6, 16, 0, 0x01020304u};

		if (write(3, &f, sizeof(f)) != (ssize_t)sizeof(f))
			abort();
		sleep(3600);
	}
	if ((pid % 100 == 88 || pid % 100 == 89) && !check(pid)) {
		CUresult r = step(pid, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED);

		write_foreign_frame(pid % 100 == 88 ? 2 : 1, 0xdeadbeefu);
		return r;
	}
	if (pid % 100 == 13 && !check(pid))
		return CUDA_ERROR_NOT_READY;
	if (pid % 100 == 66 && !check(pid))
		abort();
	if (pid % 100 == 77 && !check(pid))
		return CUDA_SUCCESS;
	return step(pid, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED);
}

CUresult CUDAAPI cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	(void)args;
	return step(pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED);
}

CUresult CUDAAPI cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	if (args && args->gpuPairsCount &&
	    (args->gpuPairsCount != 2 || (unsigned char)args->gpuPairs[1].newUuid.bytes[0] != 0xBB))
		return CUDA_ERROR_INVALID_VALUE;
	return step(pid, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED);
}

CUresult CUDAAPI cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	(void)args;
	return step(pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
}
