/*
 * Stream-ordered memory pools on the fake driver against what the H200
 * showed (docs/driver-facts.md): the pool API's values and refusals, pool sharing across
 * processes (export the pool, then pointers; import, set access, import
 * pointers), private pools surviving native checkpoint byte for byte, and a
 * sharing process left with a device descriptor after native checkpoint whose
 * restore then fails with CUDA_ERROR_OPERATING_SYSTEM.  Each test case has
 * its own devd; the checkpoint cases need root.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define NW (64 * 1024) /* 256 KiB of uint32 */
static uint32_t buf[NW];

static CUmemoryPool make_pool(int posix)
{
	CUmemPoolProps pp;
	CUmemoryPool p;

	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = 0;
	CK(cuMemPoolCreate(&p, &pp));
	return p;
}

static cuuint64_t attr64(CUmemoryPool p, CUmemPool_attribute a)
{
	cuuint64_t v = ~0ull;

	CK(cuMemPoolGetAttribute(p, a, &v));
	return v;
}

START_TEST(pool_api_values_and_refusals)
{
	CUmemoryPool def, cur, p, np;
	CUmemPoolProps pp;
	CUmemPoolPtrExportData ed;
	CUmemAccess_flags fl;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUdeviceptr a, b, c;
	CUstream st;
	cuuint64_t v;
	void *fn = NULL;
	int iv = -1, fd;

	h_init(0);
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CK(cuDeviceGetDefaultMemPool(&def, 0));
	CK(cuDeviceGetMemPool(&cur, 0));
	ck_assert_ptr_eq(def, cur);
	CK_ERR(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuDeviceGetDefaultMemPool(&def, 7), CUDA_ERROR_INVALID_DEVICE);

	/* Attributes: defaults, read-only ones, resets of the high marks to 0 only. */
	p = make_pool(1);
	CK(cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &iv));
	ck_assert_int_eq(iv, 1);
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	v = 1;
	CK_ERR(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
	v = 8 * MiB;
	CK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));

	/* Stream-ordered allocation, bytes through the stream, reuse of a freed block. */
	CK(cuMemAllocFromPoolAsync(&a, sizeof(buf), p, st));
	h_pattern(buf, NW, 0x51);
	CK(cuMemcpyHtoDAsync(a, buf, sizeof(buf), st));
	CK(cuStreamSynchronize(st)); /* the fake reads pageable memory when the copy runs */
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoHAsync(buf, a, sizeof(buf), st));
	CK(cuStreamSynchronize(st));
	ck_assert(h_pattern_ok(buf, NW, 0x51));
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), sizeof(buf));
	CK(cuMemFreeAsync(a, st));
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), sizeof(buf)); /* below the threshold */
	CK(cuMemAllocFromPoolAsync(&b, sizeof(buf), p, st));
	ck_assert_uint_eq(b, a);
	CK_ERR(cuMemFreeAsync(b + 4096, st), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemFreeAsync(b, st));
	CK_ERR(cuMemFreeAsync(b, st), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemPoolTrimTo(p, 0));
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), sizeof(buf));
	v = 0;
	CK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v));
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0);

	/* The current pool serves cuMemAllocAsync. */
	CK(cuDeviceSetMemPool(0, p));
	CK(cuDeviceGetMemPool(&cur, 0));
	ck_assert_ptr_eq(cur, p);
	CK(cuMemAllocAsync(&c, MiB, st));
	ck_assert_uint_eq(attr64(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MiB);
	CK(cuMemsetD32Async(c, 0xabcd1234u, MiB / 4, st));
	CK(cuMemcpyDtoHAsync(buf, c, 16, st));
	CK(cuStreamSynchronize(st));
	ck_assert_uint_eq(buf[3], 0xabcd1234u);

	/* Sharing: pointers only once the pool itself was exported (measured). */
	CK_ERR(cuMemPoolExportPointer(&ed, c), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemPoolExportPointer(&ed, c));
	close(fd);
	np = make_pool(0);
	CK_ERR(cuMemPoolExportToShareableHandle(&fd, np, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemPoolImportFromShareableHandle(&cur, (void *)(intptr_t)0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						  0),
	       CUDA_ERROR_INVALID_VALUE);
	CK(cuMemPoolGetAccess(&fl, p, &loc));
	ck_assert_int_eq(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CK(cuMemPoolDestroy(np));
	CK_ERR(cuMemAllocFromPoolAsync(&a, MiB, np, st), CUDA_ERROR_INVALID_VALUE);

	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	CK_ERR(cuMemPoolCreate(&np, &pp), CUDA_ERROR_NOT_SUPPORTED);
	pp.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	pp.location.id = 5;
	CK_ERR(cuMemPoolCreate(&np, &pp), CUDA_ERROR_INVALID_DEVICE);

	/* cudaMallocAsync reaches the driver through cuGetProcAddress. */
	CK(cuGetProcAddress("cuMemAllocAsync", &fn, 12000, 0, NULL));
	ck_assert_ptr_eq(fn, (void *)cuMemAllocAsync);

	CK(cuMemFreeAsync(c, st));
	/* Destroying the current pool makes the default current again. */
	CK(cuMemPoolDestroy(p));
	CK(cuDeviceGetMemPool(&cur, 0));
	ck_assert_ptr_eq(cur, def);
	CK(cuStreamDestroy(st));
}
END_TEST

struct share_msg {
	CUmemPoolPtrExportData ed;
	CUdeviceptr va;
};

/* Importer: pool from the FD, access, then the pointer; checks and writes bytes. */
static int importer(void *arg, int s)
{
	struct share_msg sm;
	CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemoryPool ip;
	CUdeviceptr p, q;
	CUmemPoolPtrExportData bad;
	int fd, wait_ckpt = arg != NULL;
	char m;

	if ((fd = h_recv_fd(s, &sm, sizeof(sm))) < 0)
		return 2;
	h_init(0);
	CK(cuMemPoolImportFromShareableHandle(&ip, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	close(fd);
	CK(cuMemPoolSetAccess(ip, &ad, 1));
	memcpy(&bad, &sm.ed, sizeof(bad));
	bad.reserved[8] ^= 1; /* another pool's token */
	if (cuMemPoolImportPointer(&q, ip, &bad) != CUDA_ERROR_INVALID_VALUE)
		return 4;
	if (cuMemAllocFromPoolAsync(&q, MiB, ip, NULL) != CUDA_ERROR_INVALID_VALUE)
		return 5; /* imported pools hand out nothing */
	CK(cuMemPoolImportPointer(&p, ip, &sm.ed));
	CK(cuMemcpyDtoH(buf, p, sizeof(buf)));
	if (!h_pattern_ok(buf, NW, 0x99))
		return 3;
	h_pattern(buf, NW, 0xaa);
	CK(cuMemcpyHtoD(p, buf, sizeof(buf)));
	if (wait_ckpt) {
		h_send(s, "r", 1);
		h_recv(s, &m, 1);
		return 0; /* killed while stuck CHECKPOINTED */
	}
	CK(cuMemFreeAsync(p, NULL));
	CK(cuMemPoolDestroy(ip));
	h_send(s, "d", 1);
	return 0;
}

START_TEST(pool_shared_across_processes_by_fd)
{
	struct share_msg sm;
	CUmemoryPool p;
	CUdeviceptr a;
	int s, fd;
	char m;
	pid_t pid = h_fork(importer, NULL, &s);

	h_init(0);
	p = make_pool(1);
	CK(cuMemAllocFromPoolAsync(&a, sizeof(buf), p, NULL));
	h_pattern(buf, NW, 0x99);
	CK(cuMemcpyHtoD(a, buf, sizeof(buf)));
	CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemPoolExportPointer(&sm.ed, a));
	sm.va = a;
	ck_assert_int_eq(h_send_fd(s, fd, &sm, sizeof(sm)), 0);
	close(fd);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	ck_assert_int_eq(m, 'd');
	ck_assert_int_eq(h_wait(pid), 0);
	CK(cuMemcpyDtoH(buf, a, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, NW, 0xaa)); /* the importer's write */
	CK(cuMemFreeAsync(a, NULL));
	CK(cuMemPoolDestroy(p));
}
END_TEST

static int sockets_of(pid_t pid)
{
	return h_fds_like(pid, "socket:", NULL);
}

/* A private pool job: bytes in two pools (default and a POSIX-capable one never exported). */
static int private_pool_target(void *arg, int s)
{
	CUmemoryPool p;
	CUdeviceptr a, b, c;
	CUstream st;
	char m;
	int ok;

	(void)arg;
	h_init(0);
	CK(cuStreamCreate(&st, 0));
	p = make_pool(1);
	CK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &(cuuint64_t){~0ull}));
	CK(cuMemAllocAsync(&a, sizeof(buf), st));
	CK(cuMemAllocFromPoolAsync(&b, sizeof(buf), p, st));
	h_pattern(buf, NW, 0x11);
	CK(cuMemcpyHtoDAsync(a, buf, sizeof(buf), st));
	CK(cuStreamSynchronize(st));
	h_pattern(buf, NW, 0x22);
	CK(cuMemcpyHtoDAsync(b, buf, sizeof(buf), st));
	CK(cuStreamSynchronize(st));
	h_send(s, "r", 1);
	if (h_recv(s, &m, 1))
		return 2;
	CK(cuMemcpyDtoH(buf, a, sizeof(buf)));
	ok = h_pattern_ok(buf, NW, 0x11);
	CK(cuMemcpyDtoH(buf, b, sizeof(buf)));
	ok = ok && h_pattern_ok(buf, NW, 0x22);
	CK(cuMemFreeAsync(b, st));
	CK(cuMemAllocFromPoolAsync(&c, sizeof(buf), p, st));
	ok = ok && c == b; /* the pool still works, same block */
	CK(cuMemFreeAsync(c, st));
	CK(cuMemFreeAsync(a, st));
	CK(cuStreamSynchronize(st));
	CK(cuMemPoolDestroy(p));
	return ok ? 0 : 3;
}

START_TEST(private_pools_survive_native_checkpoint)
{
	int s;
	char m;
	pid_t pid;

	if (!h_is_root()) {
		fprintf(stderr, "skipped: the checkpoint API needs root\n");
		return;
	}
	pid = h_fork(private_pool_target, NULL, &s);
	h_init(0);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	CK(cuCheckpointProcessLock(pid, NULL));
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	ck_assert_int_eq(sockets_of(pid), 1); /* only the test's own: nothing left for CRIU to trip on */
	CK(cuCheckpointProcessRestore(pid, NULL));
	CK(cuCheckpointProcessUnlock(pid, NULL));
	h_send(s, "v", 1);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* The exporter side of a shared pool, as a target (the test process imports). */
static int exporter_target(void *arg, int s)
{
	struct share_msg sm;
	CUmemoryPool p;
	CUdeviceptr a;
	int fd;
	char m;

	(void)arg;
	h_init(0);
	p = make_pool(1);
	CK(cuMemAllocFromPoolAsync(&a, sizeof(buf), p, NULL));
	h_pattern(buf, NW, 0x99);
	CK(cuMemcpyHtoD(a, buf, sizeof(buf)));
	CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemPoolExportPointer(&sm.ed, a));
	close(fd); /* the pool stays shared: the driver holds its descriptor */
	CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	h_send_fd(s, fd, &sm, sizeof(sm));
	close(fd);
	h_send(s, "r", 1);
	h_recv(s, &m, 1);
	return 0;
}

/* _i: 0 the exporter is checkpointed, 1 the importer. */
START_TEST(sharing_a_pool_loses_cuda_at_native_restore_as_measured)
{
	struct share_msg sm;
	CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemoryPool p, ip;
	CUdeviceptr a, q;
	int s, fd;
	char m;
	pid_t pid;

	if (!h_is_root()) {
		fprintf(stderr, "skipped: the checkpoint API needs root\n");
		return;
	}
	if (_i == 0) {
		pid = h_fork(exporter_target, NULL, &s);
		h_init(0);
		fd = h_recv_fd(s, &sm, sizeof(sm));
		ck_assert_int_ge(fd, 0);
		CK(cuMemPoolImportFromShareableHandle(&ip, (void *)(intptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		close(fd);
		CK(cuMemPoolSetAccess(ip, &ad, 1));
		CK(cuMemPoolImportPointer(&q, ip, &sm.ed));
	} else {
		pid = h_fork(importer, (void *)1, &s);
		h_init(0);
		p = make_pool(1);
		CK(cuMemAllocFromPoolAsync(&a, sizeof(buf), p, NULL));
		h_pattern(buf, NW, 0x99);
		CK(cuMemcpyHtoD(a, buf, sizeof(buf)));
		CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CK(cuMemPoolExportPointer(&sm.ed, a));
		ck_assert_int_eq(h_send_fd(s, fd, &sm, sizeof(sm)), 0);
		close(fd);
	}
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	CK(cuCheckpointProcessLock(pid, NULL));
	CK(cuCheckpointProcessCheckpoint(pid, NULL)); /* "succeeds" */
	ck_assert_int_eq(cuCheckpointProcessGetState(pid, &(CUprocessState){0}), CUDA_SUCCESS);
	/* The device descriptor CRIU cannot dump is still open. */
	ck_assert_int_eq(sockets_of(pid), 2);
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	CK_ERR(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CK_ERR(cuCheckpointProcessRestore(pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
	kill(pid, SIGKILL);
	h_wait(pid);
}
END_TEST

START_TEST(forked_child_keeps_no_pool_descriptor)
{
	CUmemoryPool p;
	int fd, before, child;
	pid_t c;

	h_init(0);
	p = make_pool(1);
	before = sockets_of(getpid());
	c = fork(); /* a child forked while nothing is shared: its count */
	if (c == 0)
		_exit(sockets_of(getpid()));
	child = h_wait(c);
	CK(cuMemPoolExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	ck_assert_int_eq(sockets_of(getpid()), before + 1);
	c = fork();
	if (c == 0)
		_exit(sockets_of(getpid()));
	ck_assert_int_eq(h_wait(c), child);
	close(fd);
	CK(cuMemPoolDestroy(p)); /* no longer shared: the descriptor goes */
	ck_assert_int_eq(sockets_of(getpid()), before);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fakecuda-pool");
	TCase *t = tcase_create("pool");

	tcase_add_unchecked_fixture(t, h_devd1, h_devd_stop);
	tcase_set_timeout(t, 30);
	tcase_add_test(t, pool_api_values_and_refusals);
	tcase_add_test(t, pool_shared_across_processes_by_fd);
	tcase_add_test(t, private_pools_survive_native_checkpoint);
	tcase_add_loop_test(t, sharing_a_pool_loses_cuda_at_native_restore_as_measured, 0, 2);
	tcase_add_test(t, forked_child_keeps_no_pool_descriptor);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
