/*
 * test_ipc.c - legacy memory (ipc.c, peer.c): cuMemAlloc converted to
 * POSIX-capable VMM, the requested size from cuMemGetAddressRange, the IPC
 * handle's format, opens and closes across processes, refusal of native
 * handles, and the peer access mirror.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define IPC_MAGIC 0x50495543u

/* The handle layout ipc.c writes. */
struct ipc_handle {
	uint32_t magic;
	uint16_t version, flags;
	int32_t creator_pid;
	uint32_t reserved;
	uint64_t creator, serial, size, requested;
	uint8_t token[16];
};

static const Cuip__Allocation *find_origin(const Cuip__ProcessState *st, Cuip__Origin o)
{
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->origin == o)
			return st->allocations[i];
	return NULL;
}

START_TEST(mem_alloc_is_converted_and_reports_the_requested_size)
{
	const size_t want = 3 * MiB + 4096;
	CUdeviceptr p, base = 0;
	size_t size = 0;
	Cuip__ProcessState *st;
	const Cuip__Allocation *a;

	h_init(0);
	CK(cuMemAlloc(&p, want));
	CK(cuMemGetAddressRange(&base, &size, p + 4096));
	ck_assert_uint_eq(base, p);
	ck_assert_uint_eq(size, want);
	h_fill(p, want & ~3ul, 7);
	ck_assert(h_check(p, want & ~3ul, 7));
	st = h_state(0);
	a = find_origin(st, CUIP__ORIGIN__ORIGIN_MALLOC);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_NATIVE); /* never shared: native saves it */
	ck_assert_uint_eq(a->requested_size, want);
	ck_assert_uint_eq(a->props->size % h_gran(), 0);
	ck_assert_uint_ge(a->props->size, want);
	ck_assert_uint_eq(a->props->handle_types, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	ck_assert_uint_eq(st->n_mappings, 1);
	ck_assert_uint_eq(st->mappings[0]->va, p);
	h_state_free(st);
	CK(cuMemFree(p));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->n_mappings, 0);
	h_state_free(st);
	CK_ERR(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

START_TEST(ipc_handle_names_creator_serial_and_token_and_shares_the_allocation)
{
	CUipcMemHandle ih, ih2;
	struct ipc_handle h;
	Cuip__ProcessState *st;
	const Cuip__Allocation *a;
	CUdeviceptr p, q;

	h_init(0);
	CK(cuMemAlloc(&p, 5000));
	CK(cuIpcGetMemHandle(&ih, p));
	CK(cuIpcGetMemHandle(&ih2, p));
	ck_assert(!memcmp(&ih, &ih2, sizeof(ih))); /* one identity, one token */
	memcpy(&h, ih.reserved, sizeof(h));
	st = h_state(0);
	a = find_origin(st, CUIP__ORIGIN__ORIGIN_MALLOC);
	ck_assert_uint_eq(h.magic, IPC_MAGIC);
	ck_assert_uint_eq(h.version, 1);
	ck_assert_int_eq(h.creator_pid, getpid());
	ck_assert_uint_eq(h.creator, st->self->id);
	ck_assert_uint_eq(h.serial, a->id->serial);
	ck_assert_uint_eq(h.requested, 5000);
	ck_assert_uint_eq(h.size, a->props->size);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert(a->exported);
	h_state_free(st);
	/* As the driver: no IPC open in the exporting process. */
	CK_ERR(cuIpcOpenMemHandle(&q, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
	CK(cuMemFree(p));
}
END_TEST

struct iarg {
	CUipcMemHandle h;
	size_t size;
};

static int ipc_importer(void *arg, int sock)
{
	struct iarg x;
	CUdeviceptr p1, p2, base;
	size_t size;
	char c = 'w';
	(void)arg;

	if (read(sock, &x, sizeof(x)) != sizeof(x))
		return 10;
	h_init(0);
	if (cuIpcOpenMemHandle_v2(&p1, x.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
		return 11;
	if (cuIpcOpenMemHandle_v2(&p2, x.h, 0) || p2 != p1)
		return 12;
	if (cuMemGetAddressRange(&base, &size, p1 + 8) || base != p1 || size != x.size)
		return 13;
	if (!h_check(p1, x.size, 21))
		return 14;
	Cuip__ProcessState *st = h_state(0);
	const Cuip__Allocation *a = find_origin(st, CUIP__ORIGIN__ORIGIN_IPC_OPEN);
	if (!a || a->owner != CUIP__OWNER__OWNER_SHARED || a->ipc_opens != 2 || a->creator_pid != getppid() ||
	    st->n_mappings != 1 || st->mappings[0]->va != p1)
		return 15;
	h_state_free(st);
	h_fill(p1, x.size, 22);
	if (cuIpcCloseMemHandle(p1))
		return 16;
	if (!h_check(p1, x.size, 22)) /* one open left: still mapped */
		return 17;
	if (cuIpcCloseMemHandle(p1))
		return 18;
	if (cuIpcCloseMemHandle(p1) != CUDA_ERROR_INVALID_VALUE)
		return 19;
	st = h_state(0);
	if (st->n_allocations != 0 || st->n_mappings != 0)
		return 20;
	h_state_free(st);
	/* Open again after the last close: a fresh mapping of the same bytes. */
	if (cuIpcOpenMemHandle_v2(&p1, x.h, 0) || !h_check(p1, x.size, 22) || cuIpcCloseMemHandle(p1))
		return 21;
	return write(sock, &c, 1) == 1 ? 0 : 22;
}

START_TEST(importer_opens_twice_at_one_address_and_closes_on_the_last_close)
{
	struct iarg x = {.size = 2 * MiB + 4096};
	CUdeviceptr p;
	pid_t pid;
	int sock;
	char c;

	pid = h_fork(ipc_importer, NULL, &sock);
	h_init(0);
	CK(cuMemAlloc(&p, x.size));
	h_fill(p, x.size, 21);
	CK(cuIpcGetMemHandle(&x.h, p));
	ck_assert_int_eq(write(sock, &x, sizeof(x)), sizeof(x));
	if (read(sock, &c, 1) != 1)
		ck_abort_msg("importer exited with %d", h_wait(pid));
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert(h_check(p, x.size, 22)); /* the importer's write */
	CK(cuMemFree(p));
}
END_TEST

START_TEST(native_and_malformed_handles_are_refused)
{
	CUipcMemHandle ih;
	struct ipc_handle h;
	CUdeviceptr q = 0;

	h_init(0);
	memset(&ih, 0, sizeof(ih));
	memcpy(ih.reserved, "FKIP-not-ours", 13);
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_NOT_SUPPORTED);
	CK_ERR(cuIpcOpenMemHandle(&q, ih, 0), CUDA_ERROR_NOT_SUPPORTED);
	memset(&h, 0, sizeof(h));
	h.magic = IPC_MAGIC;
	h.version = 9;
	h.size = 2 * MiB;
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	h.version = 1;
	h.requested = 4 * MiB; /* more than the backing */
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	/* A well-formed handle naming a process that does not exist. */
	h.requested = MiB;
	h.creator = 0x1234;
	h.creator_pid = 999999;
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(q, 0);
	CK_ERR(cuIpcCloseMemHandle(0x1000), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

START_TEST(peer_access_is_mirrored_into_existing_and_future_mappings)
{
	CUcontext c0, c1;
	CUdevice d0, d1;
	CUdeviceptr p, p2;
	unsigned long long f;
	CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
	Cuip__ProcessState *st;

	CK(cuInit(0));
	CK(cuDeviceGet(&d0, 0));
	CK(cuDeviceGet(&d1, 1));
	CK(cuDevicePrimaryCtxRetain(&c0, d0));
	CK(cuDevicePrimaryCtxRetain(&c1, d1));
	CK(cuCtxSetCurrent(c0));
	CK(cuMemAlloc(&p, MiB));
	CK(cuMemGetAccess(&f, &l1, p));
	ck_assert_uint_eq(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	CK(cuCtxSetCurrent(c1));
	CK(cuCtxEnablePeerAccess(c0, 0)); /* device 1 may access device 0's memory */
	CK(cuMemGetAccess(&f, &l1, p));
	ck_assert_uint_eq(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CK(cuCtxSetCurrent(c0));
	CK(cuMemAlloc(&p2, MiB + MiB / 2)); /* future mapping: no room left in p's slab */
	CK(cuMemGetAccess(&f, &l1, p2));
	ck_assert_uint_eq(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	st = h_state(0);
	ck_assert_uint_eq(st->n_mappings, 2);
	ck_assert_uint_eq(st->mappings[1]->n_access, 2);
	ck_assert_uint_eq(st->n_peer_access, 1);
	ck_assert_int_eq(st->peer_access[0]->from_device, 1);
	ck_assert_int_eq(st->peer_access[0]->to_device, 0);
	ck_assert_uint_eq(st->mappings[0]->n_access, 2);
	h_state_free(st);
	CK(cuCtxSetCurrent(c1));
	CK(cuCtxDisablePeerAccess(c0));
	CK(cuMemGetAccess(&f, &l1, p));
	ck_assert_uint_eq(f, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	st = h_state(0);
	ck_assert_uint_eq(st->n_peer_access, 0);
	ck_assert_uint_eq(st->mappings[0]->n_access, 1);
	ck_assert_uint_eq(st->mappings[1]->n_access, 1);
	h_state_free(st);
	CK_ERR(cuCtxDisablePeerAccess(c0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	CK(cuCtxSetCurrent(c0));
	CK(cuMemFree(p));
	CK(cuMemFree(p2));
}
END_TEST

START_TEST(failures_inside_the_conversion_leave_nothing_behind)
{
	CUdeviceptr p = 0;
	Cuip__ProcessState *st;

	/* Access fails on the first conversion, the reservation on the second. */
	setenv("FAKECUDA_FAIL",
	       "cuMemSetAccess:1:CUDA_ERROR_OUT_OF_MEMORY,cuMemAddressReserve:2:CUDA_ERROR_OUT_OF_MEMORY", 1);
	h_init(0);
	CK_ERR(cuMemAlloc(&p, MiB), CUDA_ERROR_OUT_OF_MEMORY);
	CK_ERR(cuMemAlloc(&p, MiB), CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_uint_eq(p, 0);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->n_mappings, 0);
	h_state_free(st);
	CK(cuMemAlloc(&p, MiB));
	h_fill(p, MiB, 3);
	ck_assert(h_check(p, MiB, 3));
	CK(cuMemFree(p));
}
END_TEST

START_TEST(runtime_lookups_resolve_to_the_legacy_wrappers)
{
	void *fn = NULL;

	CK(cuInit(0));
	CK(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, NULL));
	ck_assert_ptr_eq(fn, h_ours_sym("cuMemAlloc_v2"));
	CK(cuGetProcAddress("cuIpcOpenMemHandle", &fn, 13000, 0, NULL));
	ck_assert_ptr_eq(fn, h_ours_sym("cuIpcOpenMemHandle_v2"));
	CK(cuGetProcAddress("cuIpcGetMemHandle", &fn, 13000, 0, NULL));
	ck_assert_ptr_eq(fn, h_ours_sym("cuIpcGetMemHandle"));
	CK(cuGetProcAddress("cuCtxEnablePeerAccess", &fn, 13000, 0, NULL));
	ck_assert_ptr_eq(fn, h_ours_sym("cuCtxEnablePeerAccess"));
	CK(cuGetProcAddress("cuMemFree", &fn, 13000, 0, NULL));
	ck_assert_ptr_eq(fn, h_ours_sym("cuMemFree_v2"));
}
END_TEST

Suite *ipc_suite(void)
{
	Suite *s = suite_create("ipc");
	TCase *tc = tcase_create("legacy");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, mem_alloc_is_converted_and_reports_the_requested_size);
	tcase_add_test(tc, ipc_handle_names_creator_serial_and_token_and_shares_the_allocation);
	tcase_add_test(tc, importer_opens_twice_at_one_address_and_closes_on_the_last_close);
	tcase_add_test(tc, native_and_malformed_handles_are_refused);
	tcase_add_test(tc, peer_access_is_mirrored_into_existing_and_future_mappings);
	tcase_add_test(tc, failures_inside_the_conversion_leave_nothing_behind);
	tcase_add_test(tc, runtime_lookups_resolve_to_the_legacy_wrappers);
	suite_add_tcase(s, tc);
	return s;
}
