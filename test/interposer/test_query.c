/*
 * test_query.c - the lock-free tracked query and the per-thread API gate
 * (interposer/core/qtable.c's logical-handle table, interposer/core/gate.c) under
 * concurrency: queries racing creates and releases (and the table growing),
 * QUIESCE closing the gate on busy threads while threads come and go, a
 * fork child's gate, the gate without membarrier (a seccomp filter), and
 * QUIESCE with a call in flight that needs the state lock to leave. Run
 * under the ASan build too: a query that read a freed record, or a closer
 * that read an exited thread's slot, fails there.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static CUcontext ctx0;

static void thread_ctx(void)
{
	CK(cuCtxSetCurrent(ctx0));
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void ms_sleep(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&t, NULL);
}

static size_t gran;

/* cuInit, device 0's primary context current in this and later threads,
 * 64 KiB granules (thousands of records fit the fake's memory). */
static void init(void)
{
	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1);
	h_init(0);
	CK(cuCtxGetCurrent(&ctx0));
	gran = h_gran();
	ck_assert_uint_eq(gran, 64 << 10);
}

static CUmemGenericAllocationHandle create(void)
{
	CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemGenericAllocationHandle h = 0;

	return cuMemCreate(&h, gran, &p, 0) == CUDA_SUCCESS ? h : 0;
}

/* ---- queries racing create and release ------------------------------------ */

#define NSLOT	 64
#define NRING	 256
#define NQUERY	 3
#define NCHURN	 2
#define BURST	 2600 /* more records than half the first table (4096): it grows */
#define DURATION 2.0

static struct {
	_Atomic uint64_t slot[NSLOT];	  /* live handles, taken by exchange */
	_Atomic uint64_t released[NRING]; /* handles whose release returned */
	atomic_uint next_released;
	atomic_bool stop;
	atomic_ulong ok, refused, bad;
	CUmemGenericAllocationHandle stable;
	char why[256];
	pthread_mutex_t why_mu;
} Q = {.why_mu = PTHREAD_MUTEX_INITIALIZER};

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...)
{
	va_list ap;

	atomic_fetch_add(&Q.bad, 1);
	pthread_mutex_lock(&Q.why_mu);
	if (!Q.why[0]) {
		va_start(ap, fmt);
		vsnprintf(Q.why, sizeof(Q.why), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&Q.why_mu);
}

static bool props_right(const CUmemAllocationProp *p)
{
	return p->type == CU_MEM_ALLOCATION_TYPE_PINNED && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
	       p->location.id == 0 && p->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

static void release_checked(CUmemGenericAllocationHandle h)
{
	CUmemAllocationProp p;
	CUresult r = cuMemRelease(h);

	if (r != CUDA_SUCCESS) {
		bad("release of %#llx: %d", (unsigned long long)h, (int)r);
		return;
	}
	/* Refused from the moment the release returned, in every thread. */
	r = cuMemGetAllocationPropertiesFromHandle(&p, h);
	if (r != CUDA_ERROR_INVALID_VALUE)
		bad("query of released %#llx in its releasing thread: %d", (unsigned long long)h, (int)r);
	atomic_store(&Q.released[atomic_fetch_add(&Q.next_released, 1) % NRING], h);
}

static void *churn(void *arg)
{
	static CUmemGenericAllocationHandle burst[NCHURN][BURST];
	CUmemGenericAllocationHandle *b = burst[(intptr_t)arg];
	unsigned seed = (unsigned)(intptr_t)arg * 7919u + 1;

	thread_ctx();
	while (!atomic_load(&Q.stop)) {
		/* Single handles through the shared slots. */
		for (int k = 0; k < 200; k++) {
			CUmemGenericAllocationHandle h = create(), old;

			if (!h) {
				bad("cuMemCreate failed in a churn thread");
				return NULL;
			}
			old = atomic_exchange(&Q.slot[rand_r(&seed) % NSLOT], h);
			if (old)
				release_checked(old);
		}
		/* A burst: the table grows while others query. */
		for (int k = 0; k < BURST / NCHURN; k++) {
			b[k] = create();
			if (!b[k]) {
				bad("cuMemCreate failed in a burst");
				return NULL;
			}
			if (k % 16 == 0) {
				CUmemGenericAllocationHandle old = atomic_exchange(&Q.slot[k % NSLOT], b[k]);
				if (old)
					release_checked(old);
				b[k] = 0;
			}
		}
		for (int k = 0; k < BURST / NCHURN; k++)
			if (b[k])
				release_checked(b[k]);
	}
	return NULL;
}

static void *query(void *arg)
{
	CUmemAllocationProp p;
	unsigned long n = 0;

	(void)arg;
	thread_ctx();
	while (!atomic_load(&Q.stop)) {
		for (int i = 0; i < NSLOT; i++) {
			uint64_t h = atomic_load(&Q.slot[i]);
			CUresult r;

			if (!h)
				continue;
			memset(&p, 0xa5, sizeof(p));
			r = cuMemGetAllocationPropertiesFromHandle(&p, h);
			if (r == CUDA_SUCCESS && props_right(&p))
				atomic_fetch_add(&Q.ok, 1);
			else if (r == CUDA_ERROR_INVALID_VALUE)
				atomic_fetch_add(&Q.refused, 1); /* released meanwhile */
			else
				bad("query of %#llx: %d (type %d loc %d/%d types %#x)", (unsigned long long)h, (int)r,
				    (int)p.type, (int)p.location.type, p.location.id, (unsigned)p.requestedHandleTypes);
		}
		for (int i = 0; i < 8; i++) {
			uint64_t h = atomic_load(&Q.released[(n + (unsigned long)i) % NRING]);
			CUresult r;

			if (h && (r = cuMemGetAllocationPropertiesFromHandle(&p, h)) != CUDA_ERROR_INVALID_VALUE)
				bad("query of released %#llx: %d", (unsigned long long)h, (int)r);
		}
		n += 8;
		if (cuMemGetAllocationPropertiesFromHandle(&p, Q.stable) != CUDA_SUCCESS || !props_right(&p))
			bad("query of the stable handle %#llx failed", (unsigned long long)Q.stable);
	}
	return NULL;
}

START_TEST(queries_race_creates_and_releases_and_refuse_released_handles)
{
	pthread_t q[NQUERY], c[NCHURN];
	Cuip__ProcessState *st;
	CUmemAllocationProp p;
	double t0;

	init();
	Q.stable = create();
	ck_assert(Q.stable >> TAG_SHIFT == TAG);
	for (int i = 0; i < NQUERY; i++)
		ck_assert_int_eq(pthread_create(&q[i], NULL, query, NULL), 0);
	for (intptr_t i = 0; i < NCHURN; i++)
		ck_assert_int_eq(pthread_create(&c[i], NULL, churn, (void *)i), 0);
	t0 = now_s();
	/* At least DURATION, and at least one burst each (the table grew); a
	 * failure or a stall ends it early (and fails below). */
	while (now_s() - t0 < DURATION || atomic_load(&Q.next_released) < 2 * BURST)
		if (atomic_load(&Q.bad) || now_s() - t0 > 200)
			break;
		else
			ms_sleep(50);
	atomic_store(&Q.stop, true);
	for (int i = 0; i < NCHURN; i++)
		pthread_join(c[i], NULL);
	for (int i = 0; i < NQUERY; i++)
		pthread_join(q[i], NULL);
	ck_assert_msg(atomic_load(&Q.bad) == 0, "%lu bad results; first: %s", atomic_load(&Q.bad), Q.why);
	ck_assert_uint_ge(atomic_load(&Q.next_released), 2 * BURST);
	ck_assert_uint_gt(atomic_load(&Q.ok), 0);
	for (int i = 0; i < NSLOT; i++) {
		uint64_t h = atomic_exchange(&Q.slot[i], 0);
		if (h) {
			CK(cuMemRelease(h));
			CK_ERR(cuMemGetAllocationPropertiesFromHandle(&p, h), CUDA_ERROR_INVALID_VALUE);
		}
	}
	for (int i = 0; i < NRING; i++)
		if (atomic_load(&Q.released[i]))
			CK_ERR(cuMemGetAllocationPropertiesFromHandle(&p, atomic_load(&Q.released[i])),
			       CUDA_ERROR_INVALID_VALUE);
	/* Only the stable record is left, and it still answers. */
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	h_state_free(st);
	CK(cuMemGetAllocationPropertiesFromHandle(&p, Q.stable));
	ck_assert(props_right(&p));
	CK(cuMemRelease(Q.stable));
	CK_ERR(cuMemGetAllocationPropertiesFromHandle(&p, Q.stable), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

/* ---- the gate: QUIESCE on busy threads, threads coming and going --------- */

#define NWORK	4
#define NCYCLES 8

static struct {
	atomic_ulong started[NWORK], done[NWORK];
	atomic_ulong spawned;
	atomic_bool stop;
	atomic_ulong bad;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
} G;

static void gated_pair(CUstream s)
{
	CUmemAllocationProp p;

	if (cuMemGetAllocationPropertiesFromHandle(&p, G.h) != CUDA_SUCCESS ||
	    cuMemsetD32Async(G.va, 7, 1, s) != CUDA_SUCCESS)
		atomic_fetch_add(&G.bad, 1);
}

static void *worker(void *arg)
{
	intptr_t i = (intptr_t)arg;
	CUstream s;

	thread_ctx();
	if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		atomic_fetch_add(&G.bad, 1);
		return NULL;
	}
	while (!atomic_load(&G.stop)) {
		atomic_fetch_add(&G.started[i], 1);
		gated_pair(s);
		atomic_fetch_add(&G.done[i], 1);
	}
	cuStreamSynchronize(s);
	cuStreamDestroy(s);
	return NULL;
}

static void *short_lived(void *arg)
{
	(void)arg;
	thread_ctx();
	for (int k = 0; k < 10; k++)
		gated_pair(NULL);
	return NULL;
}

/* Threads that make a few gated calls and exit, over and over. */
static void *spawner(void *arg)
{
	(void)arg;
	while (!atomic_load(&G.stop)) {
		pthread_t t;

		if (pthread_create(&t, NULL, short_lived, NULL)) {
			atomic_fetch_add(&G.bad, 1);
			return NULL;
		}
		pthread_join(t, NULL);
		atomic_fetch_add(&G.spawned, 1);
	}
	return NULL;
}

static Cuip__Response *call(int s, Cuip__Request *req)
{
	Cuip__Response *r = NULL;

	ck_assert_int_eq(h_request(s, req, -1, &r, NULL), 0);
	ck_assert_ptr_nonnull(r);
	return r;
}

static uint64_t gate_waits(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *r;
	uint64_t w;

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	r = call(s, &req);
	ck_assert_int_eq(r->status, 0);
	ck_assert(r->state->counters && r->state->counters->has_gate_waits);
	w = r->state->counters->gate_waits;
	cuip__response__free_unpacked(r, NULL);
	return w;
}

/* Every worker inside a call it started (blocked at the closed gate). */
static bool all_held(void)
{
	for (int i = 0; i < NWORK; i++)
		if (atomic_load(&G.started[i]) != atomic_load(&G.done[i]) + 1)
			return false;
	return true;
}

START_TEST(quiesce_holds_busy_threads_and_exited_threads_leave_no_count)
{
	pthread_t w[NWORK], sp;
	unsigned long before[NWORK], spawned;
	uint64_t waits0;
	int s;

	init();
	G.va = h_create_map(gran, &G.h);
	for (intptr_t i = 0; i < NWORK; i++)
		ck_assert_int_eq(pthread_create(&w[i], NULL, worker, (void *)i), 0);
	ck_assert_int_eq(pthread_create(&sp, NULL, spawner, NULL), 0);
	s = h_connect(0);
	for (int cycle = 0; cycle < NCYCLES; cycle++) {
		Cuip__Request req = CUIP__REQUEST__INIT;
		Cuip__Quiesce q = CUIP__QUIESCE__INIT;
		Cuip__Response *r;
		double t0;

		/* Let every worker and some short-lived threads run first. */
		spawned = atomic_load(&G.spawned);
		for (int i = 0; i < NWORK; i++)
			before[i] = atomic_load(&G.done[i]);
		t0 = now_s();
		for (int i = 0; i < NWORK; i++)
			while (atomic_load(&G.done[i]) == before[i] && now_s() - t0 < 30)
				ms_sleep(5);
		while (atomic_load(&G.spawned) < spawned + 2 && now_s() - t0 < 30)
			ms_sleep(5);
		for (int i = 0; i < NWORK; i++)
			ck_assert_uint_gt(atomic_load(&G.done[i]), before[i]);
		ck_assert_uint_ge(atomic_load(&G.spawned), spawned + 2);

		waits0 = gate_waits(s);
		q.timeout_ms = 20000;
		req.body_case = CUIP__REQUEST__BODY_QUIESCE;
		req.quiesce = &q;
		r = call(s, &req);
		ck_assert_msg(r->status == 0, "cycle %d: QUIESCE: %d %s", cycle, r->status, r->error ? r->error : "");
		cuip__response__free_unpacked(r, NULL);
		/* A worker may still finish the iteration whose calls passed
		 * before the gate closed (done catches up with started), but
		 * no further one: it comes to the gate and stays there. */
		for (int i = 0; i < NWORK; i++)
			before[i] = atomic_load(&G.started[i]);
		t0 = now_s();
		while (!all_held() && now_s() - t0 < 30)
			ms_sleep(5);
		ck_assert_msg(all_held(), "cycle %d: a worker is not held at the closed gate", cycle);
		ms_sleep(200);
		for (int i = 0; i < NWORK; i++)
			ck_assert_uint_le(atomic_load(&G.done[i]), before[i]);
		ck_assert_uint_ge(gate_waits(s), waits0 + NWORK);

		req.body_case = CUIP__REQUEST__BODY_RESUME;
		req.resume = 1;
		r = call(s, &req);
		ck_assert_msg(r->status == 0, "cycle %d: RESUME: %d %s", cycle, r->status, r->error ? r->error : "");
		cuip__response__free_unpacked(r, NULL);
	}
	atomic_store(&G.stop, true);
	for (int i = 0; i < NWORK; i++)
		pthread_join(w[i], NULL);
	pthread_join(sp, NULL);
	ck_assert_uint_eq(atomic_load(&G.bad), 0);
	close(s);
	h_unmap_release(G.va, gran, G.h);
}
END_TEST

/* ---- fork ---------------------------------------------------------------- */

static int child_calls(void *arg, int sock)
{
	CUmemGenericAllocationHandle h = *(CUmemGenericAllocationHandle *)arg;
	CUmemAllocationProp p;
	CUresult r;

	(void)sock;
	alarm(60); /* a child stuck at the parent's closed gate fails, not hangs */
	/* The parent's gate was closed and its records are not ours: the
	 * call passes the child's open gate and the handle names nothing. */
	r = cuMemGetAllocationPropertiesFromHandle(&p, h);
	return r == CUDA_ERROR_INVALID_VALUE ? 0 : 10 + (int)r;
}

START_TEST(a_child_forked_while_the_gate_is_closed_has_an_open_gate)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp p;
	Cuip__Response *r;
	pid_t pid;
	int s, sock;

	init();
	h = create();
	CK(cuMemGetAllocationPropertiesFromHandle(&p, h));
	s = h_connect(0);
	q.timeout_ms = 20000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	r = call(s, &req);
	ck_assert_int_eq(r->status, 0);
	cuip__response__free_unpacked(r, NULL);
	pid = h_fork(child_calls, &h, &sock);
	ck_assert_int_eq(h_wait(pid), 0);
	close(sock);
	req.body_case = CUIP__REQUEST__BODY_RESUME;
	req.resume = 1;
	r = call(s, &req);
	ck_assert_int_eq(r->status, 0);
	cuip__response__free_unpacked(r, NULL);
	close(s);
	CK(cuMemGetAllocationPropertiesFromHandle(&p, h));
	CK(cuMemRelease(h));
}
END_TEST

/* ---- without membarrier -------------------------------------------------- */

/* Make membarrier fail with ENOSYS in every thread of this process. */
static int deny_membarrier(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_membarrier, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -1;
	return (int)syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

static int quiesce_status(int s, unsigned timeout_ms, char *err, size_t len)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r = NULL;
	int st;

	q.timeout_ms = timeout_ms;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	if (h_request(s, &req, -1, &r, NULL) || !r)
		return -1000;
	st = r->status;
	snprintf(err, len, "%s", r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	return st;
}

static int resume_status(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *r = NULL;
	int st;

	req.body_case = CUIP__REQUEST__BODY_RESUME;
	req.resume = 1;
	if (h_request(s, &req, -1, &r, NULL) || !r)
		return -1000;
	st = r->status;
	cuip__response__free_unpacked(r, NULL);
	return st;
}

/* arg 0: membarrier denied before the first gated call (the gate fences
 * each call; QUIESCE still holds busy threads); 1: denied after the gate
 * relied on it (QUIESCE refused with -EIO, the gate stays open). */
static int no_membarrier_child(void *arg, int sock)
{
	int late = *(int *)arg, s, st, ret = 0;
	pthread_t w[2];
	unsigned long d0[2];
	char err[512];
	double t0;

	(void)sock;
	alarm(120);
	if (!late && deny_membarrier())
		return 2;
	init();
	G.va = h_create_map(gran, &G.h);
	gated_pair(NULL);
	if (late && deny_membarrier())
		return 3;
	for (intptr_t i = 0; i < 2; i++)
		if (pthread_create(&w[i], NULL, worker, (void *)i))
			return 4;
	t0 = now_s();
	while ((atomic_load(&G.done[0]) == 0 || atomic_load(&G.done[1]) == 0) && now_s() - t0 < 30)
		ms_sleep(5);
	s = h_connect(0);
	st = quiesce_status(s, 20000, err, sizeof(err));
	d0[0] = atomic_load(&G.started[0]); /* done never passes these now */
	d0[1] = atomic_load(&G.started[1]);
	if (!late) {
		if (st != 0)
			ret = 5;
		t0 = now_s();
		while (!(atomic_load(&G.started[0]) == atomic_load(&G.done[0]) + 1 &&
			 atomic_load(&G.started[1]) == atomic_load(&G.done[1]) + 1) &&
		       now_s() - t0 < 30)
			ms_sleep(5);
		ms_sleep(200);
		if (!ret && (atomic_load(&G.done[0]) > d0[0] || atomic_load(&G.done[1]) > d0[1]))
			ret = 6; /* a call passed the closed gate */
		if (!ret && resume_status(s) != 0)
			ret = 7;
	} else {
		if (st != -EIO || !strstr(err, "cannot close the API gate"))
			ret = 8;
		/* Refused, the gate open: the workers go on. */
		d0[0] = atomic_load(&G.done[0]);
		t0 = now_s();
		while (atomic_load(&G.done[0]) == d0[0] && now_s() - t0 < 30)
			ms_sleep(5);
		if (!ret && atomic_load(&G.done[0]) == d0[0])
			ret = 9;
	}
	atomic_store(&G.stop, true);
	pthread_join(w[0], NULL);
	pthread_join(w[1], NULL);
	if (!ret && atomic_load(&G.bad))
		ret = 10;
	close(s);
	return ret;
}

START_TEST(without_membarrier_the_gate_fences_each_call)
{
	int late = 0, sock;
	pid_t pid = h_fork(no_membarrier_child, &late, &sock); /* before any CUDA use here */

	ck_assert_int_eq(h_wait(pid), 0);
	close(sock);
}
END_TEST

START_TEST(membarrier_failing_after_use_refuses_quiesce_and_keeps_the_gate_open)
{
	int late = 1, sock;
	pid_t pid = h_fork(no_membarrier_child, &late, &sock);

	ck_assert_int_eq(h_wait(pid), 0);
	close(sock);
}
END_TEST

/* ---- QUIESCE and a call in flight that needs the state lock -------------- */

/*
 * An import takes the state lock after its FETCH from the creator returns.
 * QUIESCE once closed the gate with the state lock held, so an import in
 * flight at that moment could not leave, and QUIESCE timed out with "CUDA
 * calls still in flight" (t-joined-during-dump in loaded runs). Here the
 * creator (a child) is stopped while the import waits for its FETCH, and is
 * continued only once the gate is closed.
 */
struct lockin {
	int ticket, tid;
	CUmemGenericAllocationHandle h, gone;
	CUresult r;
	atomic_bool done, stop;
	atomic_ulong probes;
};

static int stopped_creator(void *arg, int sock)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	size_t size;
	int t;
	char c;

	(void)arg;
	alarm(120);
	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1); /* as init() in the parent */
	h_init(0);
	size = h_gran();
	va = h_create_map(size, &h);
	h_fill(va, size, 77);
	t = h_export(h);
	if (t < 0 || h_send_fd(sock, t, &size, sizeof(size)))
		return 2;
	close(t);
	if (read(sock, &c, 1) != 1)
		return 3;
	h_unmap_release(va, size, h);
	return 0;
}

static void *importing(void *arg)
{
	struct lockin *L = arg;

	thread_ctx();
	L->tid = (int)syscall(SYS_gettid);
	L->r = cuMemImportFromShareableHandle(&L->h, (void *)(uintptr_t)L->ticket,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	atomic_store(&L->done, true);
	return NULL;
}

/* Gated queries of a released handle (no lock, no driver, no syscall): the
 * thread blocks only at a closed gate. */
static void *probing(void *arg)
{
	struct lockin *L = arg;
	CUmemAllocationProp p;

	L->tid = (int)syscall(SYS_gettid);
	while (!atomic_load(&L->stop)) {
		if (cuMemGetAllocationPropertiesFromHandle(&p, L->gone) != CUDA_ERROR_INVALID_VALUE)
			bad("query of a released handle passed");
		atomic_fetch_add(&L->probes, 1);
	}
	return NULL;
}

/* The syscall thread tid of this process is blocked in, -1 when running. */
static long blocked_in(int tid)
{
	char path[64], buf[64] = "";
	FILE *f;
	long nr = -1;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	f = fopen(path, "re");
	if (f && fgets(buf, sizeof(buf), f) && strncmp(buf, "running", 7))
		nr = strtol(buf, NULL, 10);
	if (f)
		fclose(f);
	return nr;
}

struct quiesce_call {
	int sock, status;
	char err[512];
};

static void *quiescing(void *arg)
{
	struct quiesce_call *c = arg;

	c->status = quiesce_status(c->sock, 5000, c->err, sizeof(c->err));
	return NULL;
}

START_TEST(quiesce_lets_a_call_in_flight_take_the_state_lock)
{
	struct lockin L = {.ticket = -1};
	struct lockin P = {0};
	struct quiesce_call qc = {0};
	pthread_t imp, probe, qt;
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr va;
	unsigned long n;
	size_t size = 0;
	pid_t pid;
	double t0;
	int sock, st, still;

	pid = h_fork(stopped_creator, NULL, &sock); /* before any CUDA use here */
	init();
	L.ticket = h_recv_fd(sock, &size, sizeof(size));
	ck_assert_int_ge(L.ticket, 0);
	ck_assert_uint_eq(size, gran);
	P.gone = create();
	ck_assert(P.gone);
	CK(cuMemRelease(P.gone));
	ck_assert_int_eq(pthread_create(&probe, NULL, probing, &P), 0);
	t0 = now_s();
	while (atomic_load(&P.probes) < 100 && now_s() - t0 < 30)
		ms_sleep(5);
	ck_assert_uint_ge(atomic_load(&P.probes), 100);

	/* The creator stops; the import waits inside the gate for its FETCH. */
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	ck_assert_int_eq(waitpid(pid, &st, WUNTRACED), pid);
	ck_assert(WIFSTOPPED(st));
	ck_assert_int_eq(pthread_create(&imp, NULL, importing, &L), 0);
	t0 = now_s();
	while ((!L.tid || blocked_in(L.tid) != SYS_recvmsg) && now_s() - t0 < 30)
		ms_sleep(5);
	ck_assert_msg(blocked_in(L.tid) == SYS_recvmsg, "the import is not waiting for its FETCH (syscall %ld)",
		      blocked_in(L.tid));
	ck_assert(!atomic_load(&L.done));

	/* QUIESCE: the gate closes (the probe blocks at it), the import is
	 * in flight. */
	qc.sock = h_connect(0);
	qc.status = -2000;
	ck_assert_int_eq(pthread_create(&qt, NULL, quiescing, &qc), 0);
	t0 = now_s();
	for (still = 0; still < 5 && now_s() - t0 < 30; ms_sleep(10)) {
		n = atomic_load(&P.probes);
		ms_sleep(10);
		still = blocked_in(P.tid) == SYS_futex && atomic_load(&P.probes) == n ? still + 1 : 0;
	}
	ck_assert_msg(still == 5, "the probe is not held at the closed gate");

	/* The creator answers; the import takes the state lock and leaves,
	 * and QUIESCE completes. */
	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	pthread_join(imp, NULL);
	pthread_join(qt, NULL);
	ck_assert_msg(qc.status == 0, "QUIESCE with an import in flight: %d %s", qc.status, qc.err);
	CK(L.r);
	n = atomic_load(&P.probes);
	ms_sleep(100);
	ck_assert_uint_eq(atomic_load(&P.probes), n); /* still held */
	ck_assert_int_eq(resume_status(qc.sock), 0);
	t0 = now_s();
	while (atomic_load(&P.probes) == n && now_s() - t0 < 30)
		ms_sleep(5);
	ck_assert_uint_gt(atomic_load(&P.probes), n);
	atomic_store(&P.stop, true);
	pthread_join(probe, NULL);
	ck_assert_uint_eq(atomic_load(&Q.bad), 0);

	/* The import is whole: the creator's bytes. */
	CK(cuMemAddressReserve(&va, gran, 0, 0, 0));
	CK(cuMemMap(va, gran, 0, L.h, 0));
	CK(cuMemSetAccess(va, gran, &d, 1));
	ck_assert(h_check(va, gran, 77));
	h_unmap_release(va, gran, L.h);
	close(L.ticket);
	close(qc.sock);
	ck_assert_int_eq(write(sock, "q", 1), 1);
	ck_assert_int_eq(h_wait(pid), 0);
	close(sock);
}
END_TEST

Suite *query_suite(void);
Suite *query_suite(void)
{
	Suite *s = suite_create("query");
	TCase *tc = tcase_create("lockfree");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, queries_race_creates_and_releases_and_refuse_released_handles);
	tcase_add_test(tc, quiesce_holds_busy_threads_and_exited_threads_leave_no_count);
	tcase_add_test(tc, a_child_forked_while_the_gate_is_closed_has_an_open_gate);
	tcase_add_test(tc, without_membarrier_the_gate_fences_each_call);
	tcase_add_test(tc, membarrier_failing_after_use_refuses_quiesce_and_keeps_the_gate_open);
	tcase_add_test(tc, quiesce_lets_a_call_in_flight_take_the_state_lock);
	suite_add_tcase(s, tc);
	return s;
}
