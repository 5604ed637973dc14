/*
 * Fake driver basics: initialization, devices, contexts, streams and events,
 * linear memory and copies, kernels, cuGetProcAddress, error names and fault
 * injection.  One process per test (Check's fork mode), one devd per case.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

START_TEST(calls_before_init_are_not_initialized)
{
	CUprocessState st;
	CUdevice d;
	CUdeviceptr p;
	int v = 0;

	CK_ERR(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
	CK_ERR(cuMemAlloc(&p, 4096), CUDA_ERROR_NOT_INITIALIZED);
	/* The checkpoint API needs no cuInit in the caller (as on the H200): it
	 * checks its arguments, and this process is no CUDA process to act on. */
	CK_ERR(cuCheckpointProcessGetState(getpid(), NULL), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuCheckpointProcessGetState(getpid(), &st), CUDA_ERROR_NOT_INITIALIZED);
	CK(cuDriverGetVersion(&v));
	ck_assert_int_eq(v, 13000);
	CK_ERR(cuInit(1), CUDA_ERROR_INVALID_VALUE);
	CK(cuInit(0));
	CK(cuInit(0));
	CK(cuDeviceGet(&d, 0));
}
END_TEST

START_TEST(init_without_devd_reports_no_device)
{
	setenv("FAKECUDA_SOCKET", "/nonexistent/devd.sock", 1);
	CK_ERR(cuInit(0), CUDA_ERROR_NO_DEVICE);
}
END_TEST

/* cuInit with stderr captured: its result, what it printed in msg. */
static CUresult init_capturing(char *msg, size_t len)
{
	char path[] = "/tmp/fakecuda-stderr-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	CUresult r;
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	unlink(path);
	dup2(fd, 2);
	r = cuInit(0);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, msg, len - 1, 0);
	msg[n > 0 ? n : 0] = 0;
	close(fd);
	return r;
}

/* The case's devd serves 1 device of 256 MiB (h_devd1). */
START_TEST(devd_of_another_configuration_is_refused_naming_it)
{
	static const char *const asks[][2] = {
		{"FAKECUDA_DEVICES", "2"},
		{"FAKECUDA_MEM_MB", "4096"},
		{"FAKECUDA_UUID_SEED", "7"},
		{"FAKECUDA_MC_GRANULARITY_MB", "4"},
		{"FAKECUDA_MC_REC_GRANULARITY_MB", "8"},
		{"FAKECUDA_MC_ROUND_MB", "512"},
	};
	char msg[1024], want[128];
	int n = 0;
	CUdevice d;

	for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
		setenv(asks[i][0], asks[i][1], 1);
		ck_assert_int_eq(init_capturing(msg, sizeof(msg)), CUDA_ERROR_SYSTEM_NOT_READY);
		snprintf(want, sizeof(want), "this process asks %s=%s ", asks[i][0], asks[i][1]);
		ck_assert_msg(strstr(msg, want), "no \"%s\" in: %s", want, msg);
		ck_assert_msg(strstr(msg, "runs FAKECUDA_DEVICES=1 FAKECUDA_MEM_MB=256 FAKECUDA_UUID_SEED=0 "
					  "FAKECUDA_MC_GRANULARITY_MB=2 FAKECUDA_MC_REC_GRANULARITY_MB=2 "
					  "FAKECUDA_MC_ROUND_MB=0, "),
			      "running configuration not named: %s", msg);
		ck_assert_ptr_nonnull(strstr(msg, getenv("FAKECUDA_SOCKET")));
		CK_ERR(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
		unsetenv(asks[i][0]);
	}
	/* What the devd runs, asked for explicitly (another spelling too), is fine. */
	setenv("FAKECUDA_DEVICES", "1", 1);
	setenv("FAKECUDA_MEM_MB", "0x100", 1);
	ck_assert_int_eq(init_capturing(msg, sizeof(msg)), CUDA_SUCCESS);
	ck_assert_str_eq(msg, "");
	CK(cuDeviceGetCount(&n));
	ck_assert_int_eq(n, 1);
	unsetenv("FAKECUDA_DEVICES");
	unsetenv("FAKECUDA_MEM_MB");
}
END_TEST

START_TEST(devices_have_stable_uuids_names_and_attributes)
{
	CUuuid u0, u1, again;
	char name[64];
	int n, v;
	size_t total;

	CK(cuInit(0));
	CK(cuDeviceGetCount(&n));
	ck_assert_int_eq(n, 2);
	CK(cuDeviceGetUuid(&u0, 0));
	CK(cuDeviceGetUuid(&u1, 1));
	CK(cuDeviceGetUuid(&again, 0));
	ck_assert(memcmp(&u0, &u1, sizeof(u0)) != 0);
	ck_assert(memcmp(&u0, &again, sizeof(u0)) == 0);
	CK(cuDeviceGetName(name, sizeof(name), 1));
	ck_assert_str_eq(name, "Fake H200");
	CK(cuDeviceTotalMem(&total, 0));
	ck_assert_uint_eq(total, 256 * MiB);
	CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
	ck_assert_int_eq(v, 1);
	CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
	ck_assert_int_eq(v, 1);
	CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
	ck_assert_int_eq(v, 1);
	CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1));
	ck_assert_int_eq(v, 1);
	CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0));
	ck_assert_int_eq(v, 0);
	CK_ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2), CUDA_ERROR_INVALID_DEVICE);
	CK(cuDeviceCanAccessPeer(&v, 0, 1));
	ck_assert_int_eq(v, 1);
	CK(cuDeviceCanAccessPeer(&v, 0, 0));
	ck_assert_int_eq(v, 0);
}
END_TEST

START_TEST(context_stack_and_primary_contexts)
{
	CUcontext a, b, cur, p, p2;
	CUdevice d;
	unsigned int flags;
	int active;

	CK(cuInit(0));
	CK(cuCtxGetCurrent(&cur));
	ck_assert_ptr_null(cur);
	CK_ERR(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
	CK(cuCtxCreate(&a, NULL, 0, 0));
	CK(cuCtxCreate(&b, NULL, 0, 1));
	CK(cuCtxGetCurrent(&cur));
	ck_assert_ptr_eq(cur, b);
	CK(cuCtxGetDevice(&d));
	ck_assert_int_eq(d, 1);
	CK(cuCtxPopCurrent(&cur));
	ck_assert_ptr_eq(cur, b);
	CK(cuCtxGetCurrent(&cur));
	ck_assert_ptr_eq(cur, a);
	CK(cuCtxPushCurrent(b));
	CK(cuCtxEnablePeerAccess(a, 0));
	CK_ERR(cuCtxEnablePeerAccess(a, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	CK(cuCtxDisablePeerAccess(a));
	CK_ERR(cuCtxDisablePeerAccess(a), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	CK(cuCtxDestroy(b));
	CK_ERR(cuCtxDestroy(b), CUDA_ERROR_INVALID_CONTEXT);
	CK_ERR(cuCtxPushCurrent(b), CUDA_ERROR_INVALID_CONTEXT);

	CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
	ck_assert_int_eq(active, 0);
	CK(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC));
	CK(cuDevicePrimaryCtxRetain(&p, 0));
	CK(cuDevicePrimaryCtxRetain(&p2, 0));
	ck_assert_ptr_eq(p, p2);
	CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
	ck_assert_int_eq(active, 1);
	ck_assert_uint_eq(flags, CU_CTX_SCHED_BLOCKING_SYNC);
	CK_ERR(cuCtxDestroy(p), CUDA_ERROR_INVALID_CONTEXT);
	CK(cuDevicePrimaryCtxRelease(0));
	CK(cuDevicePrimaryCtxRelease(0));
	CK_ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
	CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
	ck_assert_int_eq(active, 0);
}
END_TEST

START_TEST(linear_memory_copies_and_errors)
{
	uint32_t in[1024], out[1024];
	CUdeviceptr a, b, base;
	size_t size, before;

	h_init(0);
	before = h_free_mem();
	for (int i = 0; i < 1024; i++)
		in[i] = (uint32_t)i * 2654435761u;
	CK(cuMemAlloc(&a, sizeof(in)));
	CK(cuMemAlloc(&b, sizeof(in)));
	ck_assert_uint_lt(h_free_mem(), before);
	CK(cuMemcpyHtoD(a, in, sizeof(in)));
	CK(cuMemcpyDtoD(b, a, sizeof(in)));
	CK(cuMemcpyDtoH(out, b, sizeof(out)));
	ck_assert_mem_eq(in, out, sizeof(in));
	CK(cuMemcpy((CUdeviceptr)(uintptr_t)out, a + 8, 8)); /* unified addressing */
	ck_assert_uint_eq(out[0], in[2]);
	CK(cuMemsetD8(a, 0xab, 3));
	CK(cuMemsetD32(a + 4, 0x11223344, 2));
	CK(cuMemcpyDtoH(out, a, 16));
	ck_assert_uint_eq(out[0], 0x00abababu | (in[0] & 0xff000000u));
	ck_assert_uint_eq(out[1], 0x11223344u);
	CK_ERR(cuMemsetD32(a + 2, 1, 1), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemGetAddressRange(&base, &size, a + 100));
	ck_assert_uint_eq(base, a);
	ck_assert_uint_ge(size, sizeof(in));
	/* Small allocations share a chunk (mem.c): a's end is b; past b's end
	 * is no allocation. */
	CK(cuMemcpyHtoD(a + size, in, 4));
	CK_ERR(cuMemcpyHtoD(b + size, in, 4), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemcpyDtoH(out, b + size - 2, 4), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemFree(a + 4), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemFree(b));
	CK_ERR(cuMemFree(b), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemAlloc(&b, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
	CK(cuMemFree(a));
	ck_assert_uint_eq(h_free_mem(), before);
}
END_TEST

START_TEST(device_addresses_fault_on_host_access)
{
	CUdeviceptr a;
	pid_t pid;
	int s;

	h_init(0);
	CK(cuMemAlloc(&a, 4096));
	pid = fork();
	if (pid == 0) {
		volatile char c;

		signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: die like a process touching a GPU address */
		c = *(volatile char *)(uintptr_t)a;
		(void)c;
		_exit(0);
	}
	s = h_wait(pid);
	ck_assert_int_eq(s, 128 + 11); /* SIGSEGV, as on a GPU address */
}
END_TEST

START_TEST(host_memory)
{
	void *p;
	char buf[64];

	h_init(0);
	CK(cuMemAllocHost(&p, 4096));
	memset(p, 1, 4096);
	CK(cuMemFreeHost(p));
	CK_ERR(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemHostAlloc(&p, 4096, CU_MEMHOSTALLOC_PORTABLE));
	CK(cuMemFreeHost(p));
	CK(cuMemHostRegister(buf, sizeof(buf), 0));
	CK_ERR(cuMemHostRegister(buf + 8, 8, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	CK(cuMemHostUnregister(buf));
	CK_ERR(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}
END_TEST

/*
 * The real driver has no table limits; the fake's tables grow (they were
 * 4,096 reservations, 64 contexts, 1,024 streams, 4,096 events).  Every
 * object stays usable, handles stay distinct, and freed entries are reused.
 */
#define N_RESV 12000
#define N_STRM 3000
#define N_EVT  10000
#define N_CTX  200
START_TEST(tables_grow_past_ten_thousand_reservations_and_thousands_of_streams_and_events)
{
	static CUdeviceptr va[N_RESV];
	static CUstream st[N_STRM];
	static CUevent ev[N_EVT];
	static CUcontext cx[N_CTX];
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	CUcontext prim, cur;
	CUdevice dev;
	uint32_t w[4] = {0};
	size_t g = 64 << 10;
	int i;

	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1);
	prim = h_init(0);
	for (i = 0; i < N_RESV; i++) {
		CK(cuMemAddressReserve(&va[i], g, 0, 0, 0));
		ck_assert(i == 0 || va[i] != va[i - 1]);
	}
	/* The last one and the first one work: map, write, read back. */
	h = h_vmm_create(g, 0, 0);
	for (i = N_RESV - 1; i >= 0; i -= N_RESV - 1) {
		uint32_t v[4] = {(uint32_t)i, 1, 2, 3};

		CK(cuMemMap(va[i], g, 0, h, 0));
		CK(cuMemSetAccess(va[i], g, &d, 1));
		CK(cuMemcpyHtoD(va[i] + g - sizeof(v), v, sizeof(v)));
		CK(cuMemcpyDtoH(w, va[i] + g - sizeof(w), sizeof(w)));
		ck_assert_int_eq(memcmp(v, w, sizeof(v)), 0);
		CK(cuMemUnmap(va[i], g));
		if (i == 0)
			break;
	}
	CK(cuMemRelease(h));
	CK_ERR(cuMemAddressFree(va[N_RESV - 1], 2 * g), CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < N_RESV; i++)
		CK(cuMemAddressFree(va[i], g));
	CK_ERR(cuMemAddressFree(va[0], g), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemAddressReserve(&va[0], g, 0, 0, 0)); /* a freed entry is taken again */
	CK(cuMemAddressFree(va[0], g));

	for (i = 0; i < N_STRM; i++)
		CK(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
	for (i = 0; i < N_EVT; i++) {
		CK(cuEventCreate(&ev[i], 0));
		CK(cuEventRecord(ev[i], st[i % N_STRM]));
	}
	CK(cuStreamWaitEvent(st[0], ev[N_EVT - 1], 0));
	CK(cuEventSynchronize(ev[N_EVT - 1]));
	CK(cuStreamSynchronize(st[N_STRM - 1]));
	CK(cuEventQuery(ev[N_EVT - 1]));
	for (i = 0; i < N_EVT; i++)
		CK(cuEventDestroy(ev[i]));
	CK_ERR(cuEventQuery(ev[0]), CUDA_ERROR_INVALID_HANDLE);
	for (i = 0; i < N_STRM; i++)
		CK(cuStreamDestroy(st[i]));
	CK_ERR(cuStreamSynchronize(st[N_STRM - 1]), CUDA_ERROR_INVALID_HANDLE);

	CK(cuDeviceGet(&dev, 0));
	for (i = 0; i < N_CTX; i++) {
		CK(cuCtxCreate(&cx[i], NULL, 0, dev));
		CK(cuCtxPopCurrent(&cur)); /* the stack stays short; the table grows */
		ck_assert_ptr_eq(cur, cx[i]);
		ck_assert(i == 0 || cx[i] != cx[i - 1]);
	}
	CK(cuCtxSetCurrent(cx[N_CTX - 1]));
	CK(cuStreamCreate(&st[0], 0)); /* in the newest context */
	CK(cuStreamSynchronize(st[0]));
	for (i = N_CTX - 1; i >= 0; i--)
		CK(cuCtxDestroy(cx[i]));
	CK_ERR(cuStreamSynchronize(st[0]), CUDA_ERROR_INVALID_HANDLE); /* went with its context */
	CK(cuCtxSetCurrent(prim));
	unsetenv("FAKECUDA_VMM_GRANULARITY_KB");
}
END_TEST

START_TEST(streams_run_in_order_and_events_time_them)
{
	uint32_t out[256];
	CUdeviceptr a;
	CUstream s;
	CUevent e0, e1;
	CUfunction fill = 0, add = 0;
	size_t n = 256;
	uint32_t v = 5, d = 3;
	void *fa[] = {&a, &n, &v}, *aa[] = {&a, &n, &d};
	float ms;

	setenv("FAKECUDA_KERNEL_DELAY_US", "50000", 1);
	h_init(0);
	fill = h_kernel("fake_fill_u32");
	add = h_kernel("fake_add_u32");
	CK(cuMemAlloc(&a, sizeof(out)));
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuEventCreate(&e0, 0));
	CK(cuEventCreate(&e1, 0));
	CK(cuEventRecord(e0, s));
	CK(cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, s, fa, NULL));
	CK(cuLaunchKernel(add, 1, 1, 1, 256, 1, 1, 0, s, aa, NULL));
	CK(cuEventRecord(e1, s));
	CK_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	CK_ERR(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
	CK_ERR(cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_NOT_READY);
	CK(cuMemcpyDtoHAsync(out, a, sizeof(out), s));
	CK(cuStreamSynchronize(s));
	CK(cuEventSynchronize(e1));
	CK(cuEventQuery(e1));
	CK(cuStreamQuery(s));
	for (int i = 0; i < 256; i++)
		ck_assert_uint_eq(out[i], 8);
	CK(cuEventElapsedTime(&ms, e0, e1));
	ck_assert_float_ge(ms, 90.0f);
	CK(cuStreamWaitEvent(s, e1, 0));
	CK(cuEventDestroy(e0));
	CK_ERR(cuEventRecord(e0, s), CUDA_ERROR_INVALID_HANDLE);
	CK(cuStreamDestroy(s));
	CK_ERR(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	CK(cuStreamCreateWithPriority(&s, 0, -1));
	CK(cuMemsetD32Async(a, 9, 256, s));
	CK(cuCtxSynchronize());
	CK(cuMemcpyDtoH(out, a, 4));
	ck_assert_uint_eq(out[0], 9);
}
END_TEST

/* The tid of this process's thread named comm, or -1. */
static pid_t thread_named(const char *comm)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	pid_t tid = -1;

	ck_assert_ptr_nonnull(d);
	while (tid < 0 && (e = readdir(d))) {
		char path[sizeof(e->d_name) + 32], name[32] = "";
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (f && fgets(name, sizeof(name), f) && !strncmp(name, comm, strlen(comm)) &&
		    name[strlen(comm)] == '\n')
			tid = atoi(e->d_name);
		if (f)
			fclose(f);
	}
	closedir(d);
	return tid;
}

/* The state letter of thread tid of this process ('t': ptrace-stopped). */
static char thread_state(pid_t tid)
{
	char path[64], buf[256], *p;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
	fclose(f);
	p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	return p[2];
}

/* The child: stops thread *arg of its parent as CRIU does (ptrace), says so,
 * and holds it until the parent is done (its exit detaches). */
static int stop_thread(void *arg, int sock)
{
	pid_t tid = *(pid_t *)arg;
	char c = 0;
	int st;

	if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) || ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) ||
	    waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st))
		return 1;
	if (h_send(sock, "s", 1))
		return 1;
	h_recv(sock, &c, 1);
	return 0;
}

#define STOPPED_COPIES 1500 /* per thread: two threads queue more than the ring's 1,024 */

struct producer {
	CUcontext ctx;
	CUdeviceptr dst;
	uint64_t src[STOPPED_COPIES]; /* read when a copy runs */
	CUresult r;
};

/* One copy of 8 bytes per word on a stream of its own, as the interposer's
 * LOAD threads queue one per small allocation, then a wait for them. */
static void *produce(void *arg)
{
	struct producer *p = arg;
	CUstream s;

	p->r = cuCtxSetCurrent(p->ctx);
	if (!p->r)
		p->r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	for (int i = 0; !p->r && i < STOPPED_COPIES; i++)
		p->r = cuMemcpyHtoDAsync(p->dst + 8 * (CUdeviceptr)i, &p->src[i], 8, s);
	if (!p->r)
		p->r = cuStreamSynchronize(s);
	return NULL;
}

/*
 * As on the H200, where a restore's asynchronous copies complete while CRIU
 * keeps every thread of the process stopped but the interposer's (issue 32):
 * the worker is stopped inside its idle wait, and two threads queue more
 * copies than the ring holds and wait for them. They run the work themselves
 * (a full ring and a wait both execute the oldest item); before, the first
 * producer to find the ring full waited for the worker forever, and a
 * waiter's wakeup of it blocked on the stopped worker's place in the same
 * condition variable. A hang fails on the case's timeout.
 */
START_TEST(device_work_completes_while_the_worker_is_stopped)
{
	static struct producer p[2];
	static uint64_t got[2][STOPPED_COPIES];
	CUcontext ctx = h_init(0);
	pthread_t t[2];
	pid_t tid, tracer;
	char c = 0;
	int sock;

	CK(cuMemAlloc(&p[0].dst, sizeof(got)));
	p[1].dst = p[0].dst + sizeof(got[0]);
	CK(cuCtxSynchronize()); /* the worker is idle, in its wait */
	tid = thread_named("fakecuda-work");
	ck_assert_int_gt(tid, 0);
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY); /* where Yama restricts ptrace */
	tracer = h_fork(stop_thread, &tid, &sock);
	ck_assert_int_eq(h_recv(sock, &c, 1), 0);
	ck_assert_int_eq(thread_state(tid), 't');
	for (int k = 0; k < 2; k++) {
		p[k].ctx = ctx;
		for (int i = 0; i < STOPPED_COPIES; i++)
			p[k].src[i] = 0x5100000000000000ull | (uint64_t)k << 32 | (uint64_t)i;
		ck_assert_int_eq(pthread_create(&t[k], NULL, produce, &p[k]), 0);
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(pthread_join(t[k], NULL), 0);
		CK(p[k].r);
	}
	CK(cuMemcpyDtoH(got, p[0].dst, sizeof(got)));
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < STOPPED_COPIES; i++)
			ck_assert_uint_eq(got[k][i], p[k].src[i]);
	ck_assert_int_eq(thread_state(tid), 't'); /* none of it was the worker's */
	ck_assert_int_eq(h_send(sock, "d", 1), 0);
	ck_assert_int_eq(h_wait(tracer), 0);
	close(sock);
	CK(cuCtxSynchronize()); /* the worker runs again */
}
END_TEST

START_TEST(kernels_do_checkable_work)
{
	uint32_t out[1000];
	CUdeviceptr a, b;
	size_t n = 1000, bytes = 4000;
	uint32_t v = 0xdeadbeef;
	void *fa[] = {&a, &n, &v}, *ca[] = {&b, &a, &bytes};
	struct {
		CUdeviceptr p;
		size_t n;
		uint32_t d;
	} packed = {0, 1000, 1};
	size_t psize = sizeof(packed);
	void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize,
			 CU_LAUNCH_PARAM_END};
	CUfunction f;
	CUmodule m;

	h_init(0);
	CK(cuMemAlloc(&a, 4000));
	CK(cuMemAlloc(&b, 4000));
	packed.p = b;
	CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 4, 1, 1, 256, 1, 1, 0, NULL, fa, NULL));
	CK(cuLaunchKernel(h_kernel("fake_copy"), 1, 1, 1, 1, 1, 1, 0, NULL, ca, NULL));
	CK(cuLaunchKernel(h_kernel("fake_add_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
	CK(cuMemcpyDtoH(out, b, sizeof(out)));
	for (int i = 0; i < 1000; i++)
		ck_assert_uint_eq(out[i], 0xdeadbef0u);
	CK(cuModuleLoadData(&m, "x"));
	CK_ERR(cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
	CK_ERR(cuLaunchKernel(h_kernel("fake_copy"), 1, 1, 1, 2048, 1, 1, 0, NULL, ca, NULL), CUDA_ERROR_INVALID_VALUE);
	CK(cuModuleUnload(m));
	CK_ERR(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
	/* a kernel touching an unmapped address fails asynchronously and sticks */
	n = 1 << 30;
	CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, fa, NULL));
	CK_ERR(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
}
END_TEST

START_TEST(context_limits_and_their_stack_reservation)
{
	size_t v;
	CUdeviceptr a;
	size_t n = 1;
	uint32_t x = 1;
	void *args[] = {&a, &n, &x};
	CUcontext c, p;

	p = h_init(0);
	CK(cuCtxCreate(&c, NULL, 0, 0));
	CK_ERR(cuCtxGetLimit(NULL, CU_LIMIT_STACK_SIZE), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuCtxGetLimit(&v, (CUlimit)99), CUDA_ERROR_UNSUPPORTED_LIMIT);
	CK_ERR(cuCtxSetLimit((CUlimit)99, 1), CUDA_ERROR_UNSUPPORTED_LIMIT);
	/* The H200's defaults (ctxrss.py). */
	CK(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
	ck_assert_uint_eq(v, 1024);
	CK(cuCtxGetLimit(&v, CU_LIMIT_PRINTF_FIFO_SIZE));
	ck_assert_uint_eq(v, 8650752);
	CK(cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE));
	ck_assert_uint_eq(v, 8u << 20);
	CK(cuCtxGetLimit(&v, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT));
	ck_assert_uint_eq(v, 2048);
	/* The device runtime's sync depth is refused; its pending launches go down to 32. */
	CK_ERR(cuCtxGetLimit(&v, CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH), CUDA_ERROR_UNSUPPORTED_LIMIT);
	CK_ERR(cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 0), CUDA_ERROR_UNSUPPORTED_LIMIT);
	CK(cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 0));
	CK(cuCtxGetLimit(&v, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT));
	ck_assert_uint_eq(v, 32);
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0));
	CK(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
	ck_assert_uint_eq(v, 0);
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 16));
	CK(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
	ck_assert_uint_eq(v, 16);
	/* printf FIFO and heap have minimums; the FIFO is fixed once a kernel ran. */
	CK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0));
	CK(cuCtxGetLimit(&v, CU_LIMIT_PRINTF_FIFO_SIZE));
	ck_assert_uint_eq(v, 512u << 10);
	CK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0));
	CK(cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE));
	ck_assert_uint_eq(v, 4u << 20);
	CK(cuMemAlloc(&a, 4));
	CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	CK(cuCtxSynchronize());
	CK_ERR(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 1 << 20), CUDA_ERROR_INVALID_VALUE);
	CK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 16u << 20));
	CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
	CK(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
	ck_assert_uint_eq(v, 4096);
	/* Each context has its own. */
	CK(cuCtxDestroy(c));
	CK(cuCtxSetCurrent(p));
	CK(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
	ck_assert_uint_eq(v, 1024);
}
END_TEST

START_TEST(get_proc_address_resolves_by_version)
{
	CUdriverProcAddressQueryResult st;
	void *fn;

	CK(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, &st));
	ck_assert_ptr_eq(fn, (void *)cuMemAlloc);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
	CK(cuGetProcAddress("cuCtxCreate", &fn, 13000, 0, &st));
	ck_assert_ptr_eq(fn, (void *)cuCtxCreate);
	CK(cuGetProcAddress("cuCtxCreate", &fn, 11040, 0, &st));
	ck_assert_ptr_ne(fn, (void *)cuCtxCreate);
	ck_assert_ptr_nonnull(fn);
	CK(cuGetProcAddress("cuMulticastBindMem", &fn, 13000, 0, &st));
	ck_assert_ptr_eq(fn, (void *)cuMulticastBindMem);
	CK(cuGetProcAddress("cuMulticastBindMem", &fn, 13010, 0, &st));
	ck_assert_ptr_ne(fn, (void *)cuMulticastBindMem);
	CK_ERR(cuGetProcAddress("cuMulticastCreate", &fn, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	ck_assert_ptr_null(fn);
	CK_ERR(cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	CK(cuGetProcAddress("cuCheckpointProcessLock", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
	ck_assert_ptr_eq(fn, (void *)cuCheckpointProcessLock);
}
END_TEST

START_TEST(error_names_and_strings)
{
	const char *s;

	CK(cuGetErrorName(CUDA_ERROR_NOT_SUPPORTED, &s));
	ck_assert_str_eq(s, "CUDA_ERROR_NOT_SUPPORTED");
	CK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
	ck_assert_str_eq(s, "out of memory");
	CK_ERR(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

START_TEST(fault_injection_fails_the_nth_call_having_done_nothing)
{
	CUdeviceptr a, b, c;
	size_t before;

	setenv("FAKECUDA_FAIL", "cuMemAlloc:2:CUDA_ERROR_OUT_OF_MEMORY,cuStreamSynchronize:1", 1);
	h_init(0);
	before = h_free_mem();
	CK(cuMemAlloc(&a, 4096));
	b = 0;
	CK_ERR(cuMemAlloc(&b, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_uint_eq(b, 0);
	CK(cuMemAlloc(&c, 4096));
	CK_ERR(cuStreamSynchronize(NULL), CUDA_ERROR_UNKNOWN);
	CK(cuStreamSynchronize(NULL));
	CK(cuMemFree(a));
	CK(cuMemFree(c));
	ck_assert_uint_eq(h_free_mem(), before);
}
END_TEST

START_TEST(forked_child_of_initialized_process_cannot_use_cuda)
{
	pid_t pid;

	h_init(0);
	pid = fork();
	if (pid == 0) {
		CUdevice d;

		_exit(cuDeviceGet(&d, 0) == CUDA_ERROR_NOT_INITIALIZED && cuInit(0) == CUDA_ERROR_NOT_INITIALIZED ? 0
														  : 1);
	}
	ck_assert_int_eq(h_wait(pid), 0);
	CK(cuCtxSynchronize());
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fakecuda-basic");
	TCase *t1 = tcase_create("one-device"), *t2 = tcase_create("two-devices");

	tcase_add_unchecked_fixture(t1, h_devd1, h_devd_stop);
	tcase_add_unchecked_fixture(t2, h_devd2, h_devd_stop);
	tcase_set_timeout(t1, 30);
	tcase_set_timeout(t2, 30);
	tcase_add_test(t1, calls_before_init_are_not_initialized);
	tcase_add_test(t1, init_without_devd_reports_no_device);
	tcase_add_test(t1, devd_of_another_configuration_is_refused_naming_it);
	tcase_add_test(t1, linear_memory_copies_and_errors);
	tcase_add_test(t1, device_addresses_fault_on_host_access);
	tcase_add_test(t1, host_memory);
	tcase_add_test(t1, streams_run_in_order_and_events_time_them);
	tcase_add_test(t1, device_work_completes_while_the_worker_is_stopped);
	tcase_add_test(t1, tables_grow_past_ten_thousand_reservations_and_thousands_of_streams_and_events);
	tcase_add_test(t1, kernels_do_checkable_work);
	tcase_add_test(t1, context_limits_and_their_stack_reservation);
	tcase_add_test(t1, get_proc_address_resolves_by_version);
	tcase_add_test(t1, error_names_and_strings);
	tcase_add_test(t1, fault_injection_fails_the_nth_call_having_done_nothing);
	tcase_add_test(t1, forked_child_of_initialized_process_cannot_use_cuda);
	tcase_add_test(t2, devices_have_stable_uuids_names_and_attributes);
	tcase_add_test(t2, context_stack_and_primary_contexts);
	suite_add_tcase(s, t1);
	suite_add_tcase(s, t2);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
