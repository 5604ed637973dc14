/*
 * Memory sharing on the fake driver: VMM handles, mappings, access and
 * reference counts; POSIX-FD export/import between processes; legacy IPC
 * between processes; multicast objects spanning two processes.  Children are
 * forked before the test's own cuInit and talk over a socketpair.
 */
#include <dirent.h>
#include <stddef.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define N (256 * 1024) /* uint32 words: 1 MiB */
static uint32_t buf[N];

START_TEST(vmm_map_access_unmap_release_and_refcounts)
{
	CUmemGenericAllocationHandle h, h2;
	CUmemAllocationProp prop;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	unsigned long long flags;
	CUdeviceptr va, va2;
	size_t before, g;
	int fd;

	h_init(0);
	before = h_free_mem();
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location = loc;
	CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	ck_assert_uint_eq(g, 2 * MiB);
	CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	ck_assert_uint_eq(g, 2 * MiB);
	CK_ERR(cuMemCreate(&h, MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	CK_ERR(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);

	h = h_vmm_create(4 * MiB, 0, 0);
	ck_assert_uint_eq(h >> 48, 0); /* the top 16 bits are free for an interposer's tags */
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	CK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
	ck_assert_int_eq(prop.location.id, 0);
	CK_ERR(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE);
	CK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
	CK_ERR(cuMemMap(va + 4096, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemMap(va, 6 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemMap(va, 4 * MiB, 0, h, 0));
	CK_ERR(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemMap(va + 4 * MiB, 2 * MiB, 2 * MiB, h, 0)); /* a second view of the upper half */
	/* no access yet: like a GPU, the mapping cannot be touched */
	CK_ERR(cuMemcpyHtoD(va, buf, 16), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemGetAccess(&flags, &loc, va));
	ck_assert_uint_eq(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	{
		CUmemAccessDesc ad = {loc, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

		CK(cuMemSetAccess(va, 6 * MiB, &ad, 1));
	}
	CK(cuMemGetAccess(&flags, &loc, va + 5 * MiB));
	ck_assert_uint_eq(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	h_pattern(buf, N, 1);
	CK(cuMemcpyHtoD(va + 2 * MiB, buf, sizeof(buf)));
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoH(buf, va + 4 * MiB, sizeof(buf))); /* aliasing view sees the same bytes */
	ck_assert(h_pattern_ok(buf, N, 1));

	/* released handle: the mappings keep the memory */
	CK(cuMemRelease(h));
	CK_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	CK(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 3 * MiB)));
	ck_assert_uint_eq(h2, h);
	CK(cuMemRelease(h2));
	CK_ERR(cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE); /* must cover whole mappings */
	CK_ERR(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemUnmap(va, 4 * MiB));
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	CK(cuMemUnmap(va + 4 * MiB, 2 * MiB));
	ck_assert_uint_eq(h_free_mem(), before);
	CK(cuMemAddressFree(va, 8 * MiB));
	CK_ERR(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);

	/* a private VMM allocation is visible to kernels only on devices with access */
	h = h_vmm_create(2 * MiB, 0, 0);
	va2 = h_vmm_map(h, 2 * MiB, 0);
	{
		size_t n = 4;
		uint32_t v = 77;
		void *args[] = {&va2, &n, &v};

		CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
		CK(cuMemcpyDtoH(buf, va2, 16));
		ck_assert_uint_eq(buf[3], 77);
	}
}
END_TEST

/* Child: imports the allocation it is sent, checks the parent's bytes, writes its own. */
static int importer(void *arg, int s)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	char m;
	int fd;

	if ((fd = h_recv_fd(s, &m, 1)) < 0)
		return 2;
	h_init(0);
	CK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	va = h_vmm_map(h, 4 * MiB, 0);
	CK(cuMemcpyDtoH(buf, va, sizeof(buf)));
	if (!h_pattern_ok(buf, N, 0xaaaa))
		return 3;
	h_pattern(buf, N, 0xbbbb);
	CK(cuMemcpyHtoD(va + 2 * MiB, buf, sizeof(buf)));
	CK(cuCtxSynchronize());
	h_send(s, "w", 1);
	h_recv(s, &m, 1); /* hold the import until the parent has looked */
	return 0;
}

START_TEST(posix_export_import_across_processes_same_bytes_both_ways)
{
	CUmemGenericAllocationHandle h, self;
	CUdeviceptr va;
	size_t before;
	int s, fd;
	char m;
	pid_t pid = h_fork(importer, NULL, &s);

	h_init(0);
	before = h_free_mem();
	h = h_vmm_create(4 * MiB, 0, 1);
	va = h_vmm_map(h, 4 * MiB, 0);
	h_pattern(buf, N, 0xaaaa);
	CK(cuMemcpyHtoD(va, buf, sizeof(buf)));
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(h_send_fd(s, fd, "f", 1), 0);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	CK(cuMemcpyDtoH(buf, va + 2 * MiB, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, N, 0xbbbb));

	/* importing in the same process works too and names the same memory */
	CK(cuMemImportFromShareableHandle(&self, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	CK(cuMemRelease(self));
	CK_ERR(cuMemImportFromShareableHandle(&self, (void *)(intptr_t)0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);

	/* exporter drops everything but the export FD: the physical memory lives on */
	CK(cuMemUnmap(va, 4 * MiB));
	CK(cuMemRelease(h));
	h_send(s, "q", 1);
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	close(fd);
	/* devd notices the last copy of the export going away (not ordered with our requests) */
	ck_assert_uint_eq(h_free_mem_settles(before), before);
}
END_TEST

static int ipc_child(void *arg, int s)
{
	CUipcMemHandle ih;
	CUdeviceptr p, p2;

	if (h_recv(s, &ih, sizeof(ih)))
		return 2;
	h_init(0);
	CK_ERR(cuIpcOpenMemHandle(&p, ih, 2), CUDA_ERROR_INVALID_VALUE);
	CK(cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CK(cuIpcOpenMemHandle(&p2, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	if (p != p2)
		return 3;
	CK(cuMemcpyDtoH(buf, p, sizeof(buf)));
	if (!h_pattern_ok(buf, N, 0x1111))
		return 4;
	h_pattern(buf, N, 0x2222);
	CK(cuMemcpyHtoD(p, buf, sizeof(buf)));
	CK(cuIpcCloseMemHandle(p));
	CK(cuIpcCloseMemHandle(p));
	CK_ERR(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
	h_send(s, "d", 1);
	return 0;
}

START_TEST(legacy_ipc_across_processes)
{
	CUipcMemHandle ih;
	CUdeviceptr a, p;
	int s;
	char m;
	pid_t pid = h_fork(ipc_child, NULL, &s);

	h_init(0);
	CK(cuMemAlloc(&a, sizeof(buf)));
	h_pattern(buf, N, 0x1111);
	CK(cuMemcpyHtoD(a, buf, sizeof(buf)));
	CK_ERR(cuIpcGetMemHandle(&ih, a + 16), CUDA_ERROR_INVALID_VALUE);
	CK(cuIpcGetMemHandle(&ih, a));
	CK_ERR(cuIpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
	h_send(s, &ih, sizeof(ih));
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	ck_assert_int_eq(h_wait(pid), 0);
	CK(cuMemcpyDtoH(buf, a, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, N, 0x2222));
	CK(cuMemFree(a));
}
END_TEST

/* Child on device 1: joins the team, binds its own memory by address (13.1 form). */
static int mc_member(void *arg, int s)
{
	CUmemGenericAllocationHandle mc, h;
	CUdeviceptr va;
	char m;
	int fd;

	if ((fd = h_recv_fd(s, &m, 1)) < 0)
		return 2;
	h_init(1);
	CK(cuMemImportFromShareableHandle(&mc, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	h = h_vmm_create(4 * MiB, 1, 0);
	va = h_vmm_map(h, 4 * MiB, 1);
	CK(cuMemsetD32(va, 0, MiB));
	usleep(300000); /* the parent's bind must wait for us */
	CK(cuMulticastAddDevice(mc, 1));
	CK(cuMulticastBindAddr_v2(mc, 1, 0, va, 4 * MiB, 0));
	h_send(s, "b", 1);
	h_recv(s, &m, 1); /* parent wrote through the multicast mapping */
	CK(cuMemcpyDtoH(buf, va + MiB, sizeof(buf)));
	if (!h_pattern_ok(buf, N, 0x3333))
		return 3;
	h_send(s, "c", 1);
	h_recv(s, &m, 1);
	return 0;
}

START_TEST(multicast_across_two_processes)
{
	CUmulticastObjectProp mp;
	CUmemGenericAllocationHandle mc, h;
	CUdeviceptr mine, mcva;
	size_t g;
	int64_t t0;
	int s, fd;
	char m;
	pid_t pid = h_fork(mc_member, NULL, &s);

	h_init(0);
	memset(&mp, 0, sizeof(mp));
	mp.numDevices = 2;
	mp.size = 4 * MiB;
	mp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CK(cuMulticastGetGranularity(&g, &mp, CU_MULTICAST_GRANULARITY_MINIMUM));
	ck_assert_uint_eq(g, 2 * MiB);
	CK(cuMulticastCreate(&mc, &mp));
	ck_assert_uint_eq(mc >> 48, 0);
	CK(cuMemExportToShareableHandle(&fd, mc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	h_send_fd(s, fd, "m", 1);
	close(fd);
	CK(cuMulticastAddDevice(mc, 0));
	CK_ERR(cuMulticastAddDevice(mc, 0), CUDA_ERROR_INVALID_VALUE);
	h = h_vmm_create(4 * MiB, 0, 0);
	mine = h_vmm_map(h, 4 * MiB, 0);
	CK(cuMemsetD32(mine, 0, MiB));
	t0 = h_now_ms();
	CK(cuMulticastBindMem(mc, 0, h, 0, 4 * MiB, 0)); /* blocks until device 1 joined */
	ck_assert_int_ge(h_now_ms() - t0, 200);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);

	/* map the multicast object and write through it: every member gets the bytes */
	mcva = h_vmm_map(mc, 4 * MiB, 0);
	h_pattern(buf, N, 0x3333);
	CK(cuMemcpyHtoD(mcva + MiB, buf, sizeof(buf)));
	{
		size_t n = 16;
		uint32_t v = 0x5a5a5a5a;
		void *args[] = {&mcva, &n, &v};

		CK(cuLaunchKernel(h_kernel("fake_fill_u32"), 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
		CK(cuCtxSynchronize());
	}
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoH(buf, mine + MiB, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, N, 0x3333));
	CK(cuMemcpyDtoH(buf, mine, 64));
	ck_assert_uint_eq(buf[15], 0x5a5a5a5a);
	h_send(s, "w", 1);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);

	CK(cuMulticastUnbind(mc, 0, 0, 4 * MiB));
	CK_ERR(cuMulticastUnbind(mc, 0, 0, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemUnmap(mcva, 4 * MiB));
	CK(cuMemRelease(mc));
	h_send(s, "q", 1);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

START_TEST(multicast_capacity_rounding)
{
	CUmulticastObjectProp mp;
	CUmemGenericAllocationHandle mc;
	CUdeviceptr va;
	int rounded = _i; /* 0: default devd, 1: devd rounding to 512 MiB */

	if (rounded) {
		h_devd_stop();
		h_devd_start("FAKECUDA_DEVICES=2 FAKECUDA_MC_ROUND_MB=512");
	}
	h_init(0);
	memset(&mp, 0, sizeof(mp));
	mp.numDevices = 1;
	mp.size = 2 * MiB;
	CK(cuMulticastCreate(&mc, &mp));
	CK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
	if (rounded)
		CK(cuMemMap(va, 8 * MiB, 0, mc, 0)); /* beyond the request, within the rounded extent */
	else
		CK_ERR(cuMemMap(va, 8 * MiB, 0, mc, 0), CUDA_ERROR_INVALID_VALUE);
	mp.size = MiB;
	CK_ERR(cuMulticastCreate(&mc, &mp), CUDA_ERROR_INVALID_VALUE);
	if (rounded)
		h_devd_stop(); /* ours; the fixture's devd was stopped above */
}
END_TEST

/*
 * A member bound in two slices (the second bound after the first, so devd
 * lists it first) reads back through the multicast mapping as one range:
 * every byte comes from the binding that covers it, not only the slice met
 * first.
 */
START_TEST(multicast_read_spans_slices_bound_separately)
{
	CUmulticastObjectProp mp;
	CUmemGenericAllocationHandle mc, h;
	CUdeviceptr mine, mcva;
	static uint32_t whole[MiB];

	h_init(0);
	memset(&mp, 0, sizeof(mp));
	mp.numDevices = 1;
	mp.size = 4 * MiB;
	CK(cuMulticastCreate(&mc, &mp));
	CK(cuMulticastAddDevice(mc, 0));
	h = h_vmm_create(4 * MiB, 0, 0);
	mine = h_vmm_map(h, 4 * MiB, 0);
	h_pattern(whole, MiB, 0x4444);
	CK(cuMemcpyHtoD(mine, whole, sizeof(whole)));
	CK(cuMulticastBindAddr_v2(mc, 0, 0, mine, 2 * MiB, 0));
	CK(cuMulticastBindMem(mc, 2 * MiB, h, 2 * MiB, 2 * MiB, 0));
	mcva = h_vmm_map(mc, 4 * MiB, 0);
	memset(whole, 0, sizeof(whole));
	CK(cuMemcpyDtoH(whole, mcva, sizeof(whole)));
	ck_assert(h_pattern_ok(whole, MiB, 0x4444));
	CK(cuMemUnmap(mcva, 4 * MiB));
	CK(cuMulticastUnbind(mc, 0, 0, 2 * MiB));
	CK(cuMulticastUnbind(mc, 0, 2 * MiB, 2 * MiB));
	CK(cuMemRelease(mc));
}
END_TEST

#define MANY 3000

/* Every allocation is a range of one arena: devd's descriptors do not grow with them. */
START_TEST(thousands_of_allocations_keep_devd_descriptors_flat)
{
	static CUmemGenericAllocationHandle h[MANY];
	CUdeviceptr va;
	size_t before, g = 64 << 10;
	int fds0;
	pid_t devd = h_devd_pid();

	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1);
	h_init(0);
	before = h_free_mem();
	fds0 = h_count_fds(devd);
	ck_assert_int_gt(fds0, 0);
	CK(cuMemAddressReserve(&va, MANY * g, 0, 0, 0));
	for (int i = 0; i < MANY; i++) {
		uint32_t w[2] = {(uint32_t)i, ~(uint32_t)i};
		CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

		h[i] = h_vmm_create(g, 0, i % 8 == 0);
		CK(cuMemMap(va + i * g, g, 0, h[i], 0));
		CK(cuMemSetAccess(va + i * g, g, &ad, 1));
		CK(cuMemcpyHtoD(va + i * g + g - sizeof(w), w, sizeof(w)));
	}
	ck_assert_uint_eq(h_free_mem(), before - MANY * g);
	ck_assert_int_eq(h_count_fds(devd), fds0);
	for (int i = 0; i < MANY; i++) {
		uint32_t w[2];

		CK(cuMemcpyDtoH(w, va + i * g + g - sizeof(w), sizeof(w)));
		ck_assert_uint_eq(w[0], (uint32_t)i);
		ck_assert_uint_eq(w[1], ~(uint32_t)i);
	}
	for (int i = 0; i < MANY; i++) {
		CK(cuMemUnmap(va + i * g, g));
		CK(cuMemRelease(h[i]));
	}
	ck_assert_uint_eq(h_free_mem(), before);
	ck_assert_int_eq(h_count_fds(devd), fds0);
	CK(cuMemAddressFree(va, MANY * g));
}
END_TEST

/* A freed allocation's pages leave devd's arena (punched out), not only its accounting. */
START_TEST(freed_memory_returns_to_the_system)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	long long idle, busy;

	h_init(0);
	idle = h_arena_bytes();
	h = h_vmm_create(32 * MiB, 0, 0);
	va = h_vmm_map(h, 32 * MiB, 0);
	CK(cuMemsetD32(va, 0xdeadbeef, 8 * MiB));
	busy = h_arena_bytes();
	ck_assert_int_ge(busy, idle + 32 * (long long)MiB);
	CK(cuMemUnmap(va, 32 * MiB));
	CK(cuMemRelease(h));
	h_free_mem(); /* a request on our connection: devd has processed the release */
	ck_assert_int_le(h_arena_bytes(), idle);
	/* a new allocation never reuses the range: it reads zeros */
	h = h_vmm_create(32 * MiB, 0, 0);
	CK(cuMemMap(va, 32 * MiB, 0, h, 0));
	{
		CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		uint32_t w[4] = {1, 1, 1, 1};

		CK(cuMemSetAccess(va, 32 * MiB, &ad, 1));
		CK(cuMemcpyDtoH(w, va + 16 * MiB, sizeof(w)));
		ck_assert_uint_eq(w[0] | w[1] | w[2] | w[3], 0);
	}
	CK(cuMemUnmap(va, 32 * MiB));
	CK(cuMemRelease(h));
	CK(cuMemAddressFree(va, 32 * MiB));
}
END_TEST

/* cuMemRelease does not wait for devd, yet the releasing process's cuMemGetInfo is exact. */
START_TEST(one_way_release_is_seen_by_mem_get_info)
{
	size_t before;

	h_init(0);
	before = h_free_mem();
	for (int i = 0; i < 200; i++) {
		CUmemGenericAllocationHandle h = h_vmm_create(2 * MiB, 0, i & 1);

		ck_assert_uint_eq(h_free_mem(), before - 2 * MiB);
		CK(cuMemRelease(h));
		ck_assert_uint_eq(h_free_mem(), before);
		CK_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE); /* validated locally */
	}
}
END_TEST

/* The export FD alone keeps the memory: an import after the creator let go sees its bytes. */
START_TEST(import_after_creator_released_sees_the_bytes)
{
	CUmemGenericAllocationHandle h, imp;
	CUmemAllocationProp prop;
	CUdeviceptr va;
	size_t before;
	int fd, fd2;

	h_init(0);
	before = h_free_mem();
	h = h_vmm_create(4 * MiB, 0, 1);
	va = h_vmm_map(h, 4 * MiB, 0);
	h_pattern(buf, N, 0x7777);
	CK(cuMemcpyHtoD(va + 3 * MiB, buf, sizeof(buf)));
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemUnmap(va, 4 * MiB));
	CK(cuMemRelease(h));
	CK(cuMemAddressFree(va, 4 * MiB));
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	fd2 = dup(fd); /* any open copy keeps it alive */
	close(fd);
	CK(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd2);
	CK(cuMemGetAllocationPropertiesFromHandle(&prop, imp));
	ck_assert_int_eq(prop.location.id, 0);
	ck_assert_uint_eq(prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	va = h_vmm_map(imp, 4 * MiB, 0);
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoH(buf, va + 3 * MiB, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, N, 0x7777));
	ck_assert_uint_eq(h_free_mem(), before - 4 * MiB);
	CK(cuMemUnmap(va, 4 * MiB));
	CK(cuMemRelease(imp));
	/* the export closed before our release; devd frees it asynchronously */
	ck_assert_uint_eq(h_free_mem_settles(before), before);
	CK(cuMemAddressFree(va, 4 * MiB));
}
END_TEST

/* Only an export FD imports: anything else is CUDA_ERROR_INVALID_VALUE and left untouched. */
START_TEST(import_of_a_non_export_fd_is_invalid_value)
{
	CUmemGenericAllocationHandle h;
	unsigned char rec[128];
	int p[2], sv[2], fd;
	char c;

	h_init(0);
	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(write(p[1], rec, 100), 100);
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)p[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	fd = open("/dev/null", O_RDONLY);
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	close(fd);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	/* empty: does not block */
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)sv[1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	/* short */
	ck_assert_int_eq(write(sv[0], "\x45\x4b\x58\x46", 4), 4);
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)sv[1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	/* foreign bytes of the right length */
	memset(rec, 0x5a, sizeof(rec));
	ck_assert_int_eq(write(sv[0], rec, sizeof(rec)), (ssize_t)sizeof(rec));
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)sv[1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(read(sv[1], &c, 1), 1); /* only peeked at */
	ck_assert_int_eq(c, 0x45);
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	close(sv[0]);
	close(sv[1]);
	close(p[0]);
	close(p[1]);
}
END_TEST

/* Lines of /proc/self/maps: the process's VMAs. */
static int vma_count(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;

	ck_assert_ptr_nonnull(f);
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

#define VMA_MANY 4000

/* Allocations are offsets of one arena mapping: create, import and release map nothing. */
START_TEST(thousands_of_creates_imports_releases_keep_vmas_flat)
{
	static CUmemGenericAllocationHandle h[VMA_MANY], imp[VMA_MANY / 8];
	static int fd[VMA_MANY / 8];
	const size_t g = 4096;
	CUdeviceptr va;
	size_t before;
	int v0, v1, k = 0;

	setenv("FAKECUDA_VMM_GRANULARITY_KB", "4", 1);
	h_init(0);
	before = h_free_mem();
	CK(cuMemAddressReserve(&va, VMA_MANY * g, 0, 0, 0));
	h[0] = h_vmm_create(g, 0, 1); /* the arena gets mapped */
	v0 = vma_count();
	for (int i = 1; i < VMA_MANY; i++)
		h[i] = h_vmm_create(g, 0, i % 8 == 0);
	for (int i = 0; i < VMA_MANY; i += 8, k++) {
		CK(cuMemExportToShareableHandle(&fd[k], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CK(cuMemImportFromShareableHandle(&imp[k], (void *)(intptr_t)fd[k],
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(fd[k]);
	}
	/* flat: a window per allocation would be thousands (slack for the
	 * allocator of a sanitizer build) */
	ck_assert_int_le(vma_count(), v0 + 8);
	/* bytes written through one handle's mapping are read through the import's */
	for (int i = 0, j = 0; i < VMA_MANY; i += 8 * 50, j += 50) {
		uint32_t w = 0x5eed0000u + (uint32_t)i, r = 0;
		CUdeviceptr a = h_vmm_map(h[i], g, 0), b = h_vmm_map(imp[j], g, 0);

		CK(cuMemcpyHtoD(a + 100, &w, sizeof(w)));
		CK(cuMemcpyDtoH(&r, b + 100, sizeof(r)));
		ck_assert_uint_eq(r, w);
		CK(cuMemUnmap(a, g));
		CK(cuMemUnmap(b, g));
		CK(cuMemAddressFree(a, g));
		CK(cuMemAddressFree(b, g));
	}
	ck_assert_uint_eq(h_free_mem(), before - VMA_MANY * g);
	v1 = vma_count();
	for (int i = 0; i < VMA_MANY; i++)
		CK(cuMemRelease(h[i]));
	for (int j = 0; j < k; j++)
		CK(cuMemRelease(imp[j]));
	ck_assert_int_le(vma_count(), v1 + 8);
	ck_assert_int_le(v1, v0 + 8);
	ck_assert_uint_eq(h_free_mem_settles(before), before);
	CK(cuMemAddressFree(va, VMA_MANY * g));
}
END_TEST

/* Another process polls free memory; it answers how long the release took to show. */
static int observer(void *arg, int s)
{
	size_t want, fr, tot;
	int64_t t0, ms = -1;

	h_init(0);
	if (h_recv(s, &want, sizeof(want)))
		return 2;
	t0 = h_now_ms();
	while (h_now_ms() - t0 < 5000) {
		CK(cuMemGetInfo(&fr, &tot));
		if (fr == want) {
			ms = h_now_ms() - t0;
			break;
		}
	}
	h_send(s, &ms, sizeof(ms));
	return 0;
}

/* Releases are queued, but another process sees one within a few milliseconds. */
START_TEST(queued_release_is_seen_by_another_process_soon)
{
	CUmemGenericAllocationHandle h;
	size_t before, want;
	int64_t ms;
	int s;
	pid_t pid = h_fork(observer, NULL, &s);

	h_init(0);
	before = h_free_mem();
	h = h_vmm_create(64 * MiB, 0, 0);
	ck_assert_uint_eq(h_free_mem(), before - 64 * MiB);
	CK(cuMemRelease(h)); /* queued; no request of ours follows */
	want = before;
	h_send(s, &want, sizeof(want));
	ck_assert_int_eq(h_recv(s, &ms, sizeof(ms)), 0);
	ck_assert_int_ge(ms, 0);
	ck_assert_int_lt(ms, 250); /* the worker flushes within 1 ms; slack for a loaded machine */
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* The creator: exports, passes the FD, closes it and releases at once. */
static int quick_creator(void *arg, int s)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	int fd;
	char m;

	h_init(0);
	h = h_vmm_create(2 * MiB, 0, 1);
	va = h_vmm_map(h, 2 * MiB, 0);
	h_pattern(buf, N, 0x4242);
	CK(cuMemcpyHtoD(va + MiB, buf, sizeof(buf)));
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (h_send_fd(s, fd, "f", 1))
		return 2;
	close(fd);
	CK(cuMemUnmap(va, 2 * MiB));
	CK(cuMemRelease(h));
	h_free_mem();	      /* devd has processed our release */
	if (h_recv(s, &m, 1)) /* wait for the importer's go */
		return 3;
	h_send(s, "d", 1);
	return 0;
}

/*
 * The importer's IMPORT_REF waits in its queue (flushes held off for 10 s)
 * while every application copy of the export FD is closed and the creator
 * released: the queue's own copy keeps the allocation alive.
 */
START_TEST(queued_import_keeps_the_allocation_when_every_fd_is_closed)
{
	CUmemGenericAllocationHandle imp;
	CUdeviceptr va;
	size_t before, tot;
	int s, fd;
	char m;
	pid_t pid = h_fork(quick_creator, NULL, &s);

	setenv("FAKECUDA_FLUSH_US", "10000000", 1);
	h_init(0);
	CK(cuMemGetInfo(&before, &tot));
	before = tot; /* devd is ours and the creator's only */
	fd = h_recv_fd(s, &m, 1);
	ck_assert_int_ge(fd, 0);
	CK(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	h_send(s, "g", 1);
	ck_assert_int_eq(h_recv(s, &m, 1), 0);
	ck_assert_int_eq(h_wait(pid), 0); /* the creator is gone too */
	usleep(20000);			  /* devd would have freed it by now if nothing held it */
	va = h_vmm_map(imp, 2 * MiB, 0);
	memset(buf, 0, sizeof(buf));
	CK(cuMemcpyDtoH(buf, va + MiB, sizeof(buf)));
	ck_assert(h_pattern_ok(buf, N, 0x4242));
	ck_assert_uint_eq(h_free_mem(), before - 2 * MiB); /* our request sent the IMPORT_REF first */
	CK(cuMemUnmap(va, 2 * MiB));
	CK(cuMemRelease(imp));
	ck_assert_uint_eq(h_free_mem_settles(before), before);
	CK(cuMemAddressFree(va, 2 * MiB));
}
END_TEST

/* fork sends the parent's queue (the child cannot, and must not keep its descriptors). */
START_TEST(fork_sends_queued_releases_and_the_child_has_no_device)
{
	CUmemGenericAllocationHandle h, imp;
	size_t before, after_create, fr, tot;
	int64_t ms;
	int s, fd, st;
	pid_t child, pid = h_fork(observer, NULL, &s);

	setenv("FAKECUDA_FLUSH_US", "10000000", 1);
	h_init(0);
	before = h_free_mem();
	h = h_vmm_create(64 * MiB, 0, 1);
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	after_create = h_free_mem();
	ck_assert_uint_eq(after_create, before - 64 * MiB);
	/* queued: an import (with its copy of the FD), then both releases */
	CK(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	CK(cuMemRelease(h));
	CK(cuMemRelease(imp));
	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		/* No device state: every call fails, no arena mapping or
		 * descriptor, and no socket connected to devd (the device
		 * connection) is left open. */
		int bad = cuMemGetInfo(&fr, &tot) != CUDA_ERROR_NOT_INITIALIZED;
		const char *devd = getenv("FAKECUDA_SOCKET");
		FILE *f = fopen("/proc/self/maps", "r");
		char line[512];

		while (f && fgets(line, sizeof(line), f))
			bad |= (strstr(line, "fakecuda-dev") != NULL) << 1;
		if (f)
			fclose(f);
		bad |= (h_fds_like(getpid(), "memfd:fakecuda-dev", NULL) != 0) << 2;
		for (int i = 0; i < 1024; i++) {
			struct sockaddr_un sa;
			socklen_t len = sizeof(sa);

			if (!getpeername(i, (struct sockaddr *)&sa, &len) && sa.sun_family == AF_UNIX && devd &&
			    len > offsetof(struct sockaddr_un, sun_path) && !strcmp(sa.sun_path, devd))
				bad |= 8;
		}
		_exit(bad);
	}
	ck_assert_int_eq(waitpid(child, &st, 0), child);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	/* the observer sees the releases long before the 10 s flush delay */
	h_send(s, &before, sizeof(before));
	ck_assert_int_eq(h_recv(s, &ms, sizeof(ms)), 0);
	ck_assert_int_ge(ms, 0);
	ck_assert_int_lt(ms, 1000);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* An arena offset beyond the process's reservation is refused cleanly. */
START_TEST(offset_beyond_the_arena_reservation_is_out_of_memory)
{
	CUmemGenericAllocationHandle h[4], extra;
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUdeviceptr va;
	size_t before;

	setenv("FAKECUDA_ARENA_SPAN_MB", "8", 1); /* a fresh devd: offsets 0, 2, 4, 6 MiB fit */
	h_init(0);
	before = h_free_mem();
	for (int i = 0; i < 4; i++)
		h[i] = h_vmm_create(2 * MiB, 0, 0);
	CK_ERR(cuMemCreate(&extra, 2 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_uint_eq(h_free_mem(), before - 8 * MiB); /* devd's allocation was given back */
	va = h_vmm_map(h[3], 2 * MiB, 0);
	CK(cuMemsetD32(va, 0x01020304, 2 * MiB / 4));
	CK(cuMemcpyDtoH(buf, va + 2 * MiB - 16, 16));
	ck_assert_uint_eq(buf[3], 0x01020304);
	CK(cuMemUnmap(va, 2 * MiB));
	CK(cuMemAddressFree(va, 2 * MiB));
	for (int i = 0; i < 4; i++)
		CK(cuMemRelease(h[i]));
	ck_assert_uint_eq(h_free_mem(), before);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fakecuda-share");
	TCase *t1 = tcase_create("one-device"), *t2 = tcase_create("two-devices");
	TCase *t3 = tcase_create("arena-span");

	tcase_add_unchecked_fixture(t1, h_devd1, h_devd_stop);
	tcase_add_unchecked_fixture(t2, h_devd2, h_devd_stop);
	tcase_add_unchecked_fixture(t3, h_devd1, h_devd_stop);
	tcase_set_timeout(t1, 30);
	tcase_set_timeout(t2, 30);
	tcase_set_timeout(t3, 30); /* one devd start and one allocation: seconds at most, as t1 */
	tcase_add_test(t1, vmm_map_access_unmap_release_and_refcounts);
	tcase_add_test(t1, posix_export_import_across_processes_same_bytes_both_ways);
	tcase_add_test(t1, legacy_ipc_across_processes);
	tcase_add_test(t1, thousands_of_allocations_keep_devd_descriptors_flat);
	tcase_add_test(t1, freed_memory_returns_to_the_system);
	tcase_add_test(t1, one_way_release_is_seen_by_mem_get_info);
	tcase_add_test(t1, import_after_creator_released_sees_the_bytes);
	tcase_add_test(t1, import_of_a_non_export_fd_is_invalid_value);
	tcase_add_test(t1, thousands_of_creates_imports_releases_keep_vmas_flat);
	tcase_add_test(t1, queued_release_is_seen_by_another_process_soon);
	tcase_add_test(t1, queued_import_keeps_the_allocation_when_every_fd_is_closed);
	tcase_add_test(t1, fork_sends_queued_releases_and_the_child_has_no_device);
	tcase_add_test(t3, offset_beyond_the_arena_reservation_is_out_of_memory);
	tcase_add_test(t2, multicast_across_two_processes);
	tcase_add_test(t1, multicast_read_spans_slices_bound_separately);
	tcase_add_loop_test(t2, multicast_capacity_rounding, 0, 2);
	suite_add_tcase(s, t1);
	suite_add_tcase(s, t2);
	suite_add_tcase(s, t3);
	return s;
}

int main(void)
{
	return h_run(suite(), NULL);
}
