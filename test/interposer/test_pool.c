/*
 * test_pool.c - stream-ordered memory pools under the interposer: its
 * wrappers on every resolution path, what INSPECT reports of each pool, and
 * QUIESCE refusing a pool shared by FD with the gate reopened (the check
 * that closes the window between the plugin's preflight and the gate), until
 * the pool is destroyed and its last pointer freed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static CUmemoryPool posix_pool(void)
{
	CUmemPoolProps pp;
	CUmemoryPool p;

	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	CK(cuMemPoolCreate(&p, &pp));
	return p;
}

START_TEST(pool_entry_points_are_ours_on_every_path)
{
	static const char *const names[] = {"cuMemPoolCreate",
					    "cuMemPoolDestroy",
					    "cuMemPoolExportToShareableHandle",
					    "cuMemPoolImportFromShareableHandle",
					    "cuMemPoolExportPointer",
					    "cuMemPoolImportPointer",
					    "cuDeviceSetMemPool",
					    "cuMemAllocAsync",
					    "cuMemAllocFromPoolAsync",
					    "cuMemFreeAsync"};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *fn;

	h_init(0);
	ck_assert_ptr_nonnull(h);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		h_ours_sym(names[i]);
		ck_assert_msg(h_ours(dlsym(h, names[i])), "dlsym(libcuda, %s)", names[i]);
		fn = NULL;
		CK(cuGetProcAddress(names[i], &fn, 12000, 0, NULL));
		ck_assert_msg(h_ours(fn), "cuGetProcAddress(%s)", names[i]);
		fn = NULL;
		CK(cuGetProcAddress(names[i], &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
		ck_assert_msg(h_ours(fn), "cuGetProcAddress(%s, per-thread)", names[i]);
	}
	/* Lookups the driver answers with failure stay failures. */
	fn = (void *)1;
	ck_assert_int_ne(cuGetProcAddress("cuMemPoolNoSuchThing", &fn, 12000, 0, NULL), CUDA_SUCCESS);
	dlclose(h);
}
END_TEST

static Cuip__Response *quiesce(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r = NULL;

	q.timeout_ms = 5000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	ck_assert_int_eq(h_request(s, &req, -1, &r, NULL), 0);
	return r;
}

static void resume(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *r = NULL;

	req.body_case = CUIP__REQUEST__BODY_RESUME;
	req.resume = 1;
	ck_assert_int_eq(h_request(s, &req, -1, &r, NULL), 0);
	ck_assert_int_eq(r->status, 0);
	cuip__response__free_unpacked(r, NULL);
}

static const Cuip__Pool *pool_of(const Cuip__ProcessState *st, size_t i)
{
	ck_assert_uint_gt(st->n_pools, i);
	return st->pools[i];
}

START_TEST(a_shared_pool_is_reported_and_refused_until_destroyed_and_freed)
{
	CUmemoryPool priv, shr;
	CUmemPoolPtrExportData ed;
	CUdeviceptr a, b, c;
	CUstream st;
	Cuip__ProcessState *ps;
	Cuip__Response *r;
	int fd, s;

	h_init(0);
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	priv = posix_pool();
	shr = posix_pool();
	CK(cuMemAllocFromPoolAsync(&a, MiB, priv, st));
	CK(cuMemAllocFromPoolAsync(&b, MiB, shr, st));
	CK(cuMemAllocAsync(&c, MiB, st)); /* the default pool: not tracked */
	s = h_connect(0);

	/* Private (POSIX-capable, never exported): reported, not refused. */
	ps = h_state(0);
	ck_assert_uint_eq(ps->n_pools, 2);
	ck_assert(!pool_of(ps, 0)->exported && !pool_of(ps, 1)->exported);
	h_state_free(ps);
	r = quiesce(s);
	ck_assert_msg(r->status == 0, "QUIESCE: %s", r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	resume(s);

	CK(cuMemPoolExportToShareableHandle(&fd, shr, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemPoolExportPointer(&ed, b));
	ps = h_state(0);
	ck_assert_uint_eq(ps->n_pools, 2);
	ck_assert(pool_of(ps, 0)->exported); /* newest first */
	ck_assert_uint_eq(pool_of(ps, 0)->live, 1);
	ck_assert_uint_eq(pool_of(ps, 0)->pointer_exports, 1);
	ck_assert_int_eq(pool_of(ps, 0)->device, 0);
	h_state_free(ps);

	r = quiesce(s);
	ck_assert_int_eq(r->status, -EPERM);
	ck_assert_ptr_nonnull(strstr(r->error, "memory pool 2 is exported by FD"));
	ck_assert_ptr_nonnull(strstr(r->error, "gate reopened"));
	cuip__response__free_unpacked(r, NULL);
	CK(cuMemsetD32Async(b, 5, MiB / 4, st)); /* the gate is open: calls go on */
	CK(cuStreamSynchronize(st));

	/* Destroyed with a pointer still live: still shared. */
	CK(cuMemPoolDestroy(shr));
	r = quiesce(s);
	ck_assert_int_eq(r->status, -EPERM);
	ck_assert_ptr_nonnull(strstr(r->error, ", destroyed with 1 live pointer(s)"));
	cuip__response__free_unpacked(r, NULL);
	CK(cuMemFreeAsync(b, st));
	ps = h_state(0);
	ck_assert_uint_eq(ps->n_pools, 1);
	h_state_free(ps);
	r = quiesce(s);
	ck_assert_msg(r->status == 0, "QUIESCE after release: %s", r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	resume(s);
	close(s);
	close(fd);
	CK(cuMemFreeAsync(a, st));
	CK(cuMemFreeAsync(c, st));
	CK(cuMemPoolDestroy(priv));
	CK(cuStreamDestroy(st));
}
END_TEST

Suite *pool_suite(void);
Suite *pool_suite(void)
{
	Suite *s = suite_create("pool");
	TCase *t = tcase_create("pool");

	tcase_set_timeout(t, 30);
	tcase_add_test(t, pool_entry_points_are_ours_on_every_path);
	tcase_add_test(t, a_shared_pool_is_reported_and_refused_until_destroyed_and_freed);
	suite_add_tcase(s, t);
	return s;
}
