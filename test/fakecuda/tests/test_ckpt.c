/*
 * The native checkpoint API on the fake driver, driven from this process
 * against forked targets: the state machine, bytes and addresses across
 * checkpoint/restore, GPU remap by UUID, the lock's blocking and timeout, and
 * each refusal measured on the real driver (docs/driver-facts.md).  Every test needs root
 * (the mailbox is reached through /proc/PID/map_files): without it the whole
 * program exits 77 (skip) before running any.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define NW (64 * 1024) /* 256 KiB of uint32 */
static uint32_t buf[NW];

static CUprocessState state_of(pid_t pid)
{
	CUprocessState st = CU_PROCESS_STATE_FAILED;

	CK(cuCheckpointProcessGetState(pid, &st));
	return st;
}

/* How many mappings of device arenas (devd memfds) and sockets the process holds. */
static void device_footprint(pid_t pid, int *windows, int *sockets)
{
	char path[64], line[512], link[128];
	struct dirent *d;
	FILE *f;
	DIR *dir;

	*windows = *sockets = 0;
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:fakecuda-dev"))
			(*windows)++;
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while ((d = readdir(dir))) {
		char p2[600];
		ssize_t n;

		snprintf(p2, sizeof(p2), "%s/%s", path, d->d_name);
		n = readlink(p2, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = 0;
			if (!strncmp(link, "socket:", 7))
				(*sockets)++;
		}
	}
	closedir(dir);
}

/* Descriptors of devd's device arenas the process holds. */
static int arena_fds(pid_t pid)
{
	return h_fds_like(pid, "memfd:fakecuda-dev", NULL);
}

/* The process's virtual size in GiB (the arena reservations are terabytes). */
static unsigned long vm_gib(pid_t pid)
{
	char path[64], line[256];
	unsigned long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmSize: %lu kB", &kb) == 1)
			break;
	fclose(f);
	return kb >> 20;
}

struct addrs {
	CUdeviceptr lin, vmm;
	CUuuid uuid0;
};

/* Target with private memory only: cuMemAlloc + a never-exported POSIX-capable VMM allocation. */
static int private_target(void *arg, int s)
{
	int dev = arg ? *(int *)arg : 0;
	struct addrs a;
	CUmemGenericAllocationHandle h;
	size_t n = NW;
	uint32_t one = 1;
	void *args[] = {&a.lin, &n, &one};
	char m;
	int ok;

	h_init(dev);
	CK(cuMemAlloc(&a.lin, sizeof(buf)));
	h = h_vmm_create(2 * MiB, dev, 1);
	a.vmm = h_vmm_map(h, 2 * MiB, dev);
	h_pattern(buf, NW, 0x1234);
	CK(cuMemcpyHtoD(a.lin, buf, sizeof(buf)));
	h_pattern(buf, NW, 0x5678);
	CK(cuMemcpyHtoD(a.vmm + MiB, buf, sizeof(buf)));
	CK(cuDeviceGetUuid(&a.uuid0, 0));
	h_send(s, &a, sizeof(a));
	if (h_recv(s, &m, 1)) /* 'v': verify */
		return 2;
	CK(cuMemcpyDtoH(buf, a.lin, sizeof(buf)));
	ok = h_pattern_ok(buf, NW, 0x1234);
	CK(cuMemcpyDtoH(buf, a.vmm + MiB, sizeof(buf)));
	ok = ok && h_pattern_ok(buf, NW, 0x5678);
	CK(cuLaunchKernel(h_kernel("fake_add_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	CK(cuMemcpyDtoH(buf, a.lin, sizeof(buf)));
	for (int i = 0; i < NW; i++)
		buf[i] -= 1;
	ok = ok && h_pattern_ok(buf, NW, 0x1234);
	CK(cuDeviceGetUuid(&a.uuid0, 0));
	h_send(s, &ok, sizeof(ok));
	h_send(s, &a.uuid0, sizeof(a.uuid0));
	return ok ? 0 : 3;
}

START_TEST(private_bytes_survive_checkpoint_at_same_addresses)
{
	struct addrs a;
	char path[64], comm[32] = "";
	size_t before, during;
	int s, tid = 0, ok = 0, w, k;
	FILE *f;
	pid_t pid;
	CUuuid u;

	pid = h_fork(private_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &a, sizeof(a)), 0);
	before = h_free_mem();

	CK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", pid, tid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(comm, sizeof(comm), f));
	fclose(f);
	ck_assert_str_eq(comm, "fakecuda-rstr\n");
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK_ERR(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK(cuCheckpointProcessLock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	CK_ERR(cuCheckpointProcessLock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	device_footprint(pid, &w, &k);
	ck_assert_int_eq(w, 1); /* the device's arena, mapped once for both allocations */
	ck_assert_int_ge(k, 2); /* the device connection (+ the test socketpair) */
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	/* everything device-side is released, the device connection is closed
	 * (devd handles the target's hangup unordered with our requests) */
	during = h_free_mem_settles(before + sizeof(buf) + 2 * MiB);
	ck_assert_uint_ge(during, before + sizeof(buf) + 2 * MiB);
	ck_assert_int_eq(arena_fds(pid), 0);
	device_footprint(pid, &w, &k);
	ck_assert_int_eq(w, 0);
	ck_assert_int_eq(k, 1);
	CK(cuCheckpointProcessGetRestoreThreadId(pid, &k));
	ck_assert_int_eq(k, tid);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK(cuCheckpointProcessRestore(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	ck_assert_uint_eq(h_free_mem(), before);
	CK(cuCheckpointProcessUnlock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &ok, sizeof(ok)), 0);
	ck_assert_int_eq(h_recv(s, &u, sizeof(u)), 0);
	ck_assert_int_eq(ok, 1);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* Two contexts, the primary's stack limit raised to 2048 bytes per thread,
 * the created one's left at 1024; at 'z' both go to 0. */
static int stacks_target(void *arg, int s)
{
	CUcontext prim, mine;
	char m;

	(void)arg;
	prim = h_init(0);
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048));
	CK(cuCtxCreate(&mine, NULL, 0, 0));
	h_send(s, "r", 1);
	if (h_recv(s, &m, 1)) /* 'z': lower both */
		return 2;
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0));
	CK(cuCtxSetCurrent(prim));
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0));
	h_send(s, "r", 1);
	return h_recv(s, &m, 1) ? 3 : 0; /* the last round's 'z' */
}

/* The last FAKECUDA_CKPT_LOG line's stack bytes ("... S bytes of context stacks"). */
static unsigned long long logged_stack_bytes(const char *log)
{
	char line[256], last[256] = "";
	unsigned long long v = ~0ull;
	FILE *f = fopen(log, "r");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		strcpy(last, line);
	fclose(f);
	ck_assert_msg(sscanf(last, "pid %*d native checkpoint saved %*u bytes in %*u allocations and %llu bytes", &v) ==
			      1,
		      "%s", last);
	return v;
}

/* The native checkpoint copies each context's stack reservation (limit x
 * the threads the device holds, FK_STACK_THREADS on the fake) as NVIDIA's
 * does (ctxrss.py: 264 MiB of an H200 context at 1024 bytes per thread);
 * lowered to 0 it copies none. */
START_TEST(native_checkpoint_copies_each_contexts_stack_reservation)
{
	char log[300], m;
	pid_t pid;
	int s;

	snprintf(log, sizeof(log), "%s/ckpt-stacks.log", getenv("CUIP_TMP") ? getenv("CUIP_TMP") : "/tmp");
	unlink(log);
	setenv("FAKECUDA_CKPT_LOG", log, 1);
	pid = h_fork(stacks_target, NULL, &s);
	h_init(0);
	for (int round = 0; round < 2; round++) {
		ck_assert_int_eq(h_recv(s, &m, 1), 0);
		CK(cuCheckpointProcessLock(pid, NULL));
		CK(cuCheckpointProcessCheckpoint(pid, NULL));
		ck_assert_uint_eq(logged_stack_bytes(log), round ? 0 : (2048ull + 1024) * 1024);
		CK(cuCheckpointProcessRestore(pid, NULL));
		CK(cuCheckpointProcessUnlock(pid, NULL));
		h_send(s, "z", 1);
	}
	ck_assert_int_eq(h_wait(pid), 0);
	unsetenv("FAKECUDA_CKPT_LOG");
	unlink(log);
}
END_TEST

/* NVIDIA's driver answers the checkpoint API in a caller that never called
 * cuInit (measured on an H200, test/gpu/facts.sh "no-cuinit"); so does the fake. */
START_TEST(caller_that_never_called_cuinit_drives_the_checkpoint_api)
{
	struct addrs a;
	char path[64], comm[32] = "";
	int s, tid = 0, tid2 = 0, ok = 0;
	FILE *f;
	pid_t pid;
	CUuuid u;
	CUdevice d;

	pid = h_fork(private_target, NULL, &s);
	ck_assert_int_eq(h_recv(s, &a, sizeof(a)), 0);
	/* This process has no CUDA: every other entry point says so. */
	CK_ERR(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
	CK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", pid, tid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(comm, sizeof(comm), f));
	fclose(f);
	ck_assert_str_eq(comm, "fakecuda-rstr\n");
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK(cuCheckpointProcessLock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	CK(cuCheckpointProcessGetRestoreThreadId(pid, &tid2));
	ck_assert_int_eq(tid2, tid);
	CK(cuCheckpointProcessRestore(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	CK(cuCheckpointProcessUnlock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	CK_ERR(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED); /* still none here */
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &ok, sizeof(ok)), 0);
	ck_assert_int_eq(h_recv(s, &u, sizeof(u)), 0);
	ck_assert_int_eq(ok, 1); /* bytes back at the same addresses */
	ck_assert_int_eq(h_wait(pid), 0);
	/* A target gone: refused as from an initialized caller. */
	CK_ERR(cuCheckpointProcessGetState(pid, &(CUprocessState){0}), CUDA_ERROR_OPERATING_SYSTEM);
}
END_TEST

/* private_target as pid 1 of a fresh pid namespace (unshare --pid --fork):
 * the intermediate child stays in ours and passes the exit status on. */
static int ns_target(void *arg, int s)
{
	int st, inner;
	pid_t pid;

	if (unshare(CLONE_NEWPID))
		return 10;
	pid = fork();
	if (pid < 0)
		return 11;
	if (pid == 0) {
		inner = getpid();
		h_send(s, &inner, sizeof(inner));
		_exit(private_target(arg, s));
	}
	close(s);
	if (waitpid(pid, &st, 0) != pid)
		return 12;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(caller_drives_a_process_in_a_child_pid_namespace_by_its_own_pid)
{
	char path[96], comm[32] = "", line[64] = "";
	struct addrs a;
	pid_t mid, pid;
	int s, inner = 0, tid = 0, ok = 0;
	CUuuid u;
	FILE *f;

	mid = h_fork(ns_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &inner, sizeof(inner)), 0);
	ck_assert_int_eq(inner, 1); /* it sees itself as pid 1 */
	ck_assert_int_eq(h_recv(s, &a, sizeof(a)), 0);
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", mid, mid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	pid = atoi(line);
	ck_assert_int_gt(pid, 1);

	/* Our pid for it and our tid for its restore thread, as the real driver's API takes. */
	CK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", pid, tid);
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "restore tid %d is not a thread of pid %d in our namespace", tid, pid);
	ck_assert_ptr_nonnull(fgets(comm, sizeof(comm), f));
	fclose(f);
	ck_assert_str_eq(comm, "fakecuda-rstr\n");
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	/* Its own pid names another process here (not a CUDA one). */
	ck_assert_int_ne(cuCheckpointProcessLock(1, NULL), CUDA_SUCCESS);
	CK(cuCheckpointProcessLock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	CK(cuCheckpointProcessRestore(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	CK(cuCheckpointProcessUnlock(pid, NULL));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &ok, sizeof(ok)), 0);
	ck_assert_int_eq(h_recv(s, &u, sizeof(u)), 0);
	ck_assert_int_eq(ok, 1); /* bytes back at the same addresses */
	ck_assert_int_eq(h_wait(mid), 0);
}
END_TEST

START_TEST(checkpoint_api_errors_for_other_processes)
{
	CUprocessState st;
	int tid;
	pid_t pid;

	pid = fork();
	if (pid == 0) {
		pause();
		_exit(0);
	}
	h_init(0);
	CK_ERR(cuCheckpointProcessGetState(pid, &st), CUDA_ERROR_NOT_INITIALIZED);
	CK_ERR(cuCheckpointProcessGetRestoreThreadId(pid, &tid), CUDA_ERROR_NOT_INITIALIZED);
	CK_ERR(cuCheckpointProcessLock(pid, NULL), CUDA_ERROR_NOT_INITIALIZED);
	kill(pid, SIGKILL);
	h_wait(pid);
	/* No such process, as the H200 answers for every action. */
	CK_ERR(cuCheckpointProcessGetState(pid, &st), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessGetRestoreThreadId(pid, &tid), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessLock(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessLock(-5, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessGetState(getpid(), NULL), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

/* Targets that hold shared memory: 0 = VMM importer, 1 = IPC importer, 2 = exporter, 3 = multicast holder. */
static int sharing_target(void *arg, int s)
{
	int kind = *(int *)arg, fd;
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;
	char m;

	if (kind == 0) {
		if ((fd = h_recv_fd(s, &m, 1)) < 0)
			return 2;
		h_init(0);
		CK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(fd); /* "FD closed after import" */
		p = h_vmm_map(h, 2 * MiB, 0);
	} else if (kind == 1) {
		CUipcMemHandle ih;

		if (h_recv(s, &ih, sizeof(ih)))
			return 2;
		h_init(0);
		CK(cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	} else if (kind == 2) {
		h_init(0);
		h = h_vmm_create(2 * MiB, 0, 1);
		p = h_vmm_map(h, 2 * MiB, 0);
		h_pattern(buf, NW, 0x77);
		CK(cuMemcpyHtoD(p, buf, sizeof(buf)));
		CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		h_send_fd(s, fd, "f", 1); /* and keep our FD open */
	} else {
		CUmulticastObjectProp mp;

		h_init(0);
		memset(&mp, 0, sizeof(mp));
		mp.numDevices = 1;
		mp.size = 2 * MiB;
		CK(cuMulticastCreate(&h, &mp));
		CK(cuMulticastAddDevice(h, 0));
		p = 0;
	}
	h_send(s, "r", 1);
	if (h_recv(s, &m, 1))
		return 0; /* killed by the test: stuck CHECKPOINTED */
	if (kind == 2) {
		CK(cuMemcpyDtoH(buf, p, sizeof(buf)));
		if (!h_pattern_ok(buf, NW, 0x77))
			return 3;
	}
	CK(cuCtxSynchronize());
	return 0;
}

START_TEST(sharing_processes_fail_native_checkpoint_as_measured)
{
	int kind = _i, s, fd;
	CUmemGenericAllocationHandle h = 0, imp = 0;
	CUdeviceptr lin = 0;
	char m;
	pid_t pid;

	pid = h_fork(sharing_target, &kind, &s);
	h_init(0);
	if (kind == 0) {
		h = h_vmm_create(2 * MiB, 0, 1);
		CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		h_send_fd(s, fd, "f", 1);
		close(fd);
	} else if (kind == 1) {
		CUipcMemHandle ih;

		CK(cuMemAlloc(&lin, MiB));
		CK(cuIpcGetMemHandle(&ih, lin));
		h_send(s, &ih, sizeof(ih));
	} else if (kind == 2) {
		fd = h_recv_fd(s, &m, 1);
		ck_assert_int_ge(fd, 0);
		CK(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(fd);
	}
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	CK(cuCheckpointProcessLock(pid, NULL));
	if (kind == 3) {
		/* multicast: refused cleanly, nothing changed */
		CK_ERR(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_NOT_SUPPORTED);
		ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
		CK(cuCheckpointProcessUnlock(pid, NULL));
		h_send(s, "c", 1);
		ck_assert_int_eq(h_wait(pid), 0);
		return;
	}
	CK(cuCheckpointProcessCheckpoint(pid, NULL)); /* "succeeds" in every case */
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	if (kind == 2) {
		CK(cuCheckpointProcessRestore(pid, NULL));
		CK(cuCheckpointProcessUnlock(pid, NULL));
		h_send(s, "c", 1);
		ck_assert_int_eq(h_wait(pid), 0);
		return;
	}
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), kind == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), kind == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	kill(pid, SIGKILL);
	h_wait(pid);
}
END_TEST

START_TEST(restore_remaps_gpus_by_uuid)
{
	CUcheckpointRestoreArgs ra;
	CUcheckpointGpuPair pairs[2];
	CUuuid u0, u1, after;
	struct addrs a;
	size_t f0, t;
	int s, ok = 0, dev = 0;
	pid_t pid;

	pid = h_fork(private_target, &dev, &s);
	h_init(1);
	CK(cuDeviceGetUuid(&u0, 0));
	CK(cuDeviceGetUuid(&u1, 1));
	ck_assert_int_eq(h_recv(s, &a, sizeof(a)), 0);
	CK(cuCheckpointProcessLock(pid, NULL));
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	CK(cuMemGetInfo(&f0, &t));
	ck_assert_uint_eq(f0, t); /* device 1 is empty */
	memset(&ra, 0, sizeof(ra));
	memset(pairs, 0, sizeof(pairs));
	pairs[0].oldUuid = u1; /* does not name the checkpointed GPU 0 */
	pairs[0].newUuid = u0;
	ra.gpuPairs = pairs;
	ra.gpuPairsCount = 1;
	CK_ERR(cuCheckpointProcessRestore(pid, &ra), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_CHECKPOINTED);
	pairs[0].oldUuid = u0;
	pairs[0].newUuid = u1;
	pairs[1].oldUuid = u1;
	pairs[1].newUuid = u0;
	ra.gpuPairsCount = 2;
	CK(cuCheckpointProcessRestore(pid, &ra));
	CK(cuMemGetInfo(&f0, &t));
	ck_assert_uint_le(f0, t - 2 * MiB - sizeof(buf)); /* the target's memory now lives on device 1 */
	CK(cuCheckpointProcessUnlock(pid, NULL));
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &ok, sizeof(ok)), 0);
	ck_assert_int_eq(h_recv(s, &after, sizeof(after)), 0);
	ck_assert_int_eq(ok, 1);
	ck_assert(memcmp(&after, &u1, sizeof(u1)) == 0); /* its device 0 is now the old device 1 */
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* Target for the lock: a slow kernel in flight, then a thread that calls the API while locked. */
static int slow_target(void *arg, int s)
{
	CUdeviceptr p;
	size_t n = 16;
	uint32_t v = 1;
	void *args[] = {&p, &n, &v};
	int64_t t0, dt;
	char m;

	setenv("FAKECUDA_KERNEL_DELAY_US", "600000", 1);
	h_init(0);
	CK(cuMemAlloc(&p, 64));
	CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	h_send(s, "k", 1);
	if (h_recv(s, &m, 1)) /* the parent holds the lock now */
		return 2;
	t0 = h_now_ms();
	CK(cuCtxSynchronize()); /* blocks until unlock */
	dt = h_now_ms() - t0;
	h_send(s, &dt, sizeof(dt));
	return 0;
}

START_TEST(lock_waits_for_device_work_times_out_and_blocks_api_calls)
{
	CUcheckpointLockArgs la;
	int64_t t0, dt;
	int s;
	char m;
	pid_t pid;

	pid = h_fork(slow_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	memset(&la, 0, sizeof(la));
	la.timeoutMs = 100;
	t0 = h_now_ms();
	CK_ERR(cuCheckpointProcessLock(pid, &la), CUDA_ERROR_NOT_READY); /* kernel still running */
	ck_assert_int_ge(h_now_ms() - t0, 90);
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_RUNNING);
	la.reserved0 = 1;
	CK_ERR(cuCheckpointProcessLock(pid, &la), CUDA_ERROR_INVALID_VALUE);
	la.reserved0 = 0;
	la.timeoutMs = 0; /* no timeout: waits for the kernel */
	CK(cuCheckpointProcessLock(pid, &la));
	ck_assert_int_eq(state_of(pid), CU_PROCESS_STATE_LOCKED);
	h_send(s, "l", 1);
	usleep(300000);
	CK(cuCheckpointProcessUnlock(pid, NULL));
	ck_assert_int_eq(h_recv(s, &dt, sizeof(dt)), 0);
	ck_assert_int_ge(dt, 250);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

#define MANY  3000
#define SMALL (64 << 10)

/* Target with MANY small private allocations, each with its own bytes at one reservation. */
static int many_target(void *arg, int s)
{
	static CUmemGenericAllocationHandle h[MANY];
	static uint32_t w[SMALL / 4];
	CUdeviceptr va;
	char m;
	int bad = 0;

	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1);
	h_init(0);
	CK(cuMemAddressReserve(&va, (size_t)MANY * SMALL, 0, 0, 0));
	for (int i = 0; i < MANY; i++) {
		CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

		h[i] = h_vmm_create(SMALL, 0, i % 8 == 0);
		CK(cuMemMap(va + (size_t)i * SMALL, SMALL, 0, h[i], 0));
		CK(cuMemSetAccess(va + (size_t)i * SMALL, SMALL, &ad, 1));
		h_pattern(w, SMALL / 4, 0x10000u + (uint32_t)i);
		CK(cuMemcpyHtoD(va + (size_t)i * SMALL, w, SMALL));
	}
	h_send(s, "r", 1);
	if (h_recv(s, &m, 1)) /* 'v': verify */
		return 2;
	for (int i = 0; i < MANY; i++) {
		CK(cuMemcpyDtoH(w, va + (size_t)i * SMALL, SMALL));
		bad += !h_pattern_ok(w, SMALL / 4, 0x10000u + (uint32_t)i);
	}
	h_send(s, &bad, sizeof(bad));
	for (int i = 0; i < MANY; i++) {
		CK(cuMemUnmap(va + (size_t)i * SMALL, SMALL));
		CK(cuMemRelease(h[i]));
	}
	return bad ? 3 : 0;
}

/* Native restore re-creates thousands of allocations with every byte (the
 * batching itself is measured by the scale benchmark, not asserted here). */
START_TEST(thousands_of_allocations_survive_native_checkpoint)
{
	size_t before;
	unsigned long vm0;
	int s, bad = -1, w, k;
	char m;
	pid_t pid;

	pid = h_fork(many_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	before = h_free_mem();
	ck_assert_int_eq(arena_fds(pid), 1);
	device_footprint(pid, &w, &k);
	ck_assert_int_eq(w, 1); /* the arena is mapped once, however many allocations */
	vm0 = vm_gib(pid);	/* with the arena's reservation (terabytes) */
	CK(cuCheckpointProcessLock(pid, NULL));
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	/* nothing of device memory is left in the process for CRIU to dump,
	 * and the arena's reservation is gone with its mapping */
	device_footprint(pid, &w, &k);
	ck_assert_int_eq(w, 0);
	ck_assert_int_eq(arena_fds(pid), 0);
	ck_assert_uint_le(vm_gib(pid) + 1024, vm0);
	ck_assert_uint_eq(h_free_mem_settles(before + (size_t)MANY * SMALL), before + (size_t)MANY * SMALL);
	CK(cuCheckpointProcessRestore(pid, NULL));
	ck_assert_uint_eq(h_free_mem(), before);
	ck_assert_int_eq(arena_fds(pid), 1);
	device_footprint(pid, &w, &k);
	ck_assert_int_eq(w, 1); /* the new arena, mapped once */
	CK(cuCheckpointProcessUnlock(pid, NULL));
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &bad, sizeof(bad)), 0);
	ck_assert_int_eq(bad, 0);
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert_uint_eq(h_free_mem_settles(before + (size_t)MANY * SMALL), before + (size_t)MANY * SMALL);
}
END_TEST

#define SCATTER 4000

/* Linear memory, 4 KiB each (every 7th a little more: not a whole number of
 * pages), then every third freed and created again: the arena ranges are not
 * contiguous any more, nor in slot order. */
static size_t scatter_size(int i)
{
	return i % 7 == 0 ? 4096 + 100 : 4096;
}

static int scatter_target(void *arg, int s)
{
	static CUdeviceptr p[SCATTER];
	static uint32_t w[(4096 + 100) / 4];
	char m;
	int bad = 0;

	size_t start, held;

	h_init(0);
	start = h_free_mem();
	for (int i = 0; i < SCATTER; i++) {
		CK(cuMemAlloc(&p[i], scatter_size(i)));
		h_pattern(w, scatter_size(i) / 4, 0x5000u + (uint32_t)i);
		CK(cuMemcpyHtoD(p[i], w, scatter_size(i)));
	}
	for (int i = 0; i < SCATTER; i += 3) {
		CK(cuMemFree(p[i]));
		CK(cuMemAlloc(&p[i], scatter_size(i)));
		h_pattern(w, scatter_size(i) / 4, 0x9000u + (uint32_t)i);
		CK(cuMemcpyHtoD(p[i], w, scatter_size(i)));
	}
	held = start - h_free_mem();
	h_send(s, "r", 1);
	h_send(s, &held, sizeof(held));
	if (h_recv(s, &m, 1)) /* 'v': verify */
		return 2;
	for (int i = 0; i < SCATTER; i++) {
		CK(cuMemcpyDtoH(w, p[i], scatter_size(i)));
		bad += !h_pattern_ok(w, scatter_size(i) / 4, (i % 3 ? 0x5000u : 0x9000u) + (uint32_t)i);
	}
	h_send(s, &bad, sizeof(bad));
	return bad ? 3 : 0;
}

/* Bytes checked after two native cycles of thousands of scattered
 * allocations; every checkpoint gives devd's arena pages back (the freed
 * ranges are punched out merged). */
START_TEST(scattered_allocations_survive_native_cycles_and_arena_pages_return)
{
	long long idle;
	size_t before, held = 0, live = 0;
	int s, bad = -1;
	char m;
	pid_t pid;

	for (int i = 0; i < SCATTER; i++)
		live += scatter_size(i);
	idle = h_arena_bytes();
	pid = h_fork(scatter_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	/* Small cuMemAlloc requests are packed into 2 MiB chunks, as on the
	 * H200 (mem.c): what the target holds is whole chunks. */
	ck_assert_int_eq(h_recv(s, &held, sizeof(held)), 0);
	ck_assert_uint_eq(held % (2 * MiB), 0);
	ck_assert_uint_ge(held, live);
	ck_assert_uint_le(held, live + live / 4 + 2 * MiB);
	before = h_free_mem();
	ck_assert_int_ge(h_arena_bytes(), idle + SCATTER * 4096ll);
	for (int round = 0; round < 2; round++) {
		CK(cuCheckpointProcessLock(pid, NULL));
		CK(cuCheckpointProcessCheckpoint(pid, NULL));
		ck_assert_uint_eq(h_free_mem_settles(before + held), before + held);
		ck_assert_int_le(h_arena_bytes(), idle); /* devd punched out every range */
		CK(cuCheckpointProcessRestore(pid, NULL));
		ck_assert_uint_eq(h_free_mem(), before);
		ck_assert_int_ge(h_arena_bytes(), idle + SCATTER * 4096ll);
		CK(cuCheckpointProcessUnlock(pid, NULL));
	}
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &bad, sizeof(bad)), 0);
	ck_assert_int_eq(bad, 0);
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert_uint_eq(h_free_mem_settles(before + held), before + held);
	ck_assert_int_le(h_arena_bytes(), idle);
}
END_TEST

/* A target whose release is still queued (flushes held off for 10 s) when it is locked. */
static int queued_target(void *arg, int s)
{
	CUmemGenericAllocationHandle keep, gone;
	CUdeviceptr va;
	char m;
	int ok;

	setenv("FAKECUDA_FLUSH_US", "10000000", 1);
	h_init(0);
	keep = h_vmm_create(4 * MiB, 0, 0);
	gone = h_vmm_create(4 * MiB, 0, 0);
	va = h_vmm_map(keep, 4 * MiB, 0);
	h_pattern(buf, NW, 0x9090);
	CK(cuMemcpyHtoD(va + MiB, buf, sizeof(buf)));
	h_free_mem();		/* devd has both allocations */
	CK(cuMemRelease(gone)); /* queued */
	h_send(s, "r", 1);
	if (h_recv(s, &m, 1)) /* 'v': verify */
		return 2;
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoH(buf, va + MiB, sizeof(buf)));
	ok = h_pattern_ok(buf, NW, 0x9090);
	h_send(s, &ok, sizeof(ok));
	CK(cuMemUnmap(va, 4 * MiB));
	CK(cuMemRelease(keep));
	return ok ? 0 : 3;
}

/* Lock sends the queued one-way messages; checkpoint/restore carry on from there. */
START_TEST(lock_sends_queued_releases_before_checkpoint)
{
	size_t before, tot;
	int64_t t0;
	int s, ok = 0;
	char m;
	pid_t pid;

	pid = h_fork(queued_target, NULL, &s);
	h_init(0);
	CK(cuMemGetInfo(&before, &tot));
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	ck_assert_uint_eq(h_free_mem(), tot - 8 * MiB); /* the release waits in the target's queue */
	t0 = h_now_ms();
	CK(cuCheckpointProcessLock(pid, NULL));
	ck_assert_uint_eq(h_free_mem_settles(tot - 4 * MiB), tot - 4 * MiB);
	ck_assert_int_lt(h_now_ms() - t0, 5000); /* long before the 10 s flush */
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	ck_assert_uint_eq(h_free_mem_settles(tot), tot);
	ck_assert_int_eq(arena_fds(pid), 0);
	CK(cuCheckpointProcessRestore(pid, NULL));
	ck_assert_uint_eq(h_free_mem(), tot - 4 * MiB); /* only what the target still holds */
	CK(cuCheckpointProcessUnlock(pid, NULL));
	h_send(s, "v", 1);
	ck_assert_int_eq(h_recv(s, &ok, sizeof(ok)), 0);
	ck_assert_int_eq(ok, 1);
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert_uint_eq(h_free_mem_settles(tot), tot);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fakecuda-checkpoint");
	TCase *t1 = tcase_create("one-device"), *t2 = tcase_create("two-devices");

	tcase_add_unchecked_fixture(t1, h_devd1, h_devd_stop);
	tcase_add_unchecked_fixture(t2, h_devd2, h_devd_stop);
	tcase_set_timeout(t1, 30);
	tcase_set_timeout(t2, 30);
	tcase_add_test(t1, private_bytes_survive_checkpoint_at_same_addresses);
	tcase_add_test(t1, native_checkpoint_copies_each_contexts_stack_reservation);
	tcase_add_test(t1, checkpoint_api_errors_for_other_processes);
	tcase_add_test(t1, caller_that_never_called_cuinit_drives_the_checkpoint_api);
	tcase_add_test(t1, caller_drives_a_process_in_a_child_pid_namespace_by_its_own_pid);
	tcase_add_loop_test(t1, sharing_processes_fail_native_checkpoint_as_measured, 0, 4);
	tcase_add_test(t1, lock_waits_for_device_work_times_out_and_blocks_api_calls);
	tcase_add_test(t1, thousands_of_allocations_survive_native_checkpoint);
	tcase_add_test(t1, lock_sends_queued_releases_before_checkpoint);
	tcase_add_test(t1, scattered_allocations_survive_native_cycles_and_arena_pages_return);
	tcase_add_test(t2, restore_remaps_gpus_by_uuid);
	suite_add_tcase(s, t1);
	suite_add_tcase(s, t2);
	return s;
}

int main(void)
{
	if (!h_is_root()) {
		fprintf(stderr, "SKIP: the checkpoint API needs root (/proc/PID/map_files)\n");
		return 77;
	}
	return h_run(suite(), NULL);
}
