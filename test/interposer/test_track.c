/*
 * test_track.c - tracked VMM records: logical handles, one driver handle
 * per allocation, retain aliasing, mappings, access merging, ownership.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static bool logical(CUmemGenericAllocationHandle h)
{
	return (h >> TAG_SHIFT) == TAG;
}

static const Cuip__Allocation *find_alloc(const Cuip__ProcessState *st, size_t i)
{
	ck_assert_uint_gt(st->n_allocations, i);
	return st->allocations[i];
}

START_TEST(create_map_unmap_release_leaves_nothing)
{
	CUmemGenericAllocationHandle h;
	size_t g;
	CUdeviceptr va;
	Cuip__ProcessState *st;
	int fds;

	h_init(0);
	g = h_gran();
	/* Warm up: the first round may open lazily what stays open anyway. */
	va = h_create_map(2 * g, &h);
	h_unmap_release(va, 2 * g, h);
	fds = h_nfds();
	va = h_create_map(2 * g, &h);
	ck_assert(logical(h));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_int_eq(find_alloc(st, 0)->owner, CUIP__OWNER__OWNER_NATIVE);
	ck_assert_int_eq(find_alloc(st, 0)->origin, CUIP__ORIGIN__ORIGIN_VMM_CREATE);
	ck_assert_uint_eq(find_alloc(st, 0)->props->size, 2 * g);
	ck_assert_uint_eq(st->n_mappings, 1);
	ck_assert_uint_eq(st->mappings[0]->va, va);
	ck_assert_uint_eq(st->mappings[0]->size, 2 * g);
	ck_assert_uint_eq(st->mappings[0]->n_access, 1);
	h_state_free(st);
	h_fill(va, 2 * g, 7);
	ck_assert(h_check(va, 2 * g, 7));
	h_unmap_release(va, 2 * g, h);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->n_mappings, 0);
	h_state_free(st);
	ck_assert_int_eq(h_nfds_settled(fds), fds);
}
END_TEST

START_TEST(handle_type_none_stays_native_and_untracked)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h;
	Cuip__ProcessState *st;

	h_init(0);
	p = h_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CK(cuMemCreate(&h, h_gran(), &p, 0));
	ck_assert(!logical(h));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
	CK(cuMemRelease(h));
}
END_TEST

START_TEST(fabric_handle_types_are_tracked_as_unsupported)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h;
	Cuip__ProcessState *st;
	int fabric = -1;

	h_init(0);
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC);
	/* Without IMEX the driver refuses, and nothing is tracked. */
	unsetenv("FAKECUDA_FABRIC");
	CK_ERR(cuMemCreate(&h, h_gran(), &p, 0), CUDA_ERROR_NOT_SUPPORTED);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->counters->unsupported, 0);
	h_state_free(st);
	/* A fabric-capable system accepts both kinds; they cannot be carried. */
	setenv("FAKECUDA_FABRIC", "1", 1);
	CK(cuDeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0));
	ck_assert_int_eq(fabric, 1);
	CK(cuMemCreate(&h, h_gran(), &p, 0));
	ck_assert(logical(h));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_int_eq(find_alloc(st, 0)->owner, CUIP__OWNER__OWNER_UNSUPPORTED);
	ck_assert_str_eq(find_alloc(st, 0)->unsupported_reason,
			 "handle types POSIX_FILE_DESCRIPTOR|FABRIC: fabric handles cannot be carried");
	ck_assert_uint_eq(st->counters->unsupported, 1);
	h_state_free(st);
	CK(cuMemRelease(h));
	p = h_prop(0, CU_MEM_HANDLE_TYPE_FABRIC);
	CK(cuMemCreate(&h, h_gran(), &p, 0));
	st = h_state(0);
	ck_assert_str_eq(find_alloc(st, 0)->unsupported_reason, "handle type FABRIC: fabric handles cannot be carried");
	ck_assert_uint_eq(st->counters->unsupported, 1);
	h_state_free(st);
	CK(cuMemRelease(h));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->counters->unsupported, 0);
	h_state_free(st);
	unsetenv("FAKECUDA_FABRIC");
}
END_TEST

START_TEST(retain_aliases_one_driver_handle_and_released_handles_are_refused)
{
	CUmemGenericAllocationHandle h, h2;
	size_t g;
	CUdeviceptr va;
	CUmemAllocationProp p;
	Cuip__ProcessState *st;

	h_init(0);
	g = h_gran();
	va = h_create_map(g, &h);
	CK(cuMemRetainAllocationHandle(&h2, (void *)(va + 100)));
	ck_assert_uint_eq(h2, h);
	st = h_state(0);
	ck_assert_uint_eq(find_alloc(st, 0)->app_handles, 2);
	h_state_free(st);
	/* The query answers from the driver's answer recorded with the handle
	 * (qtable.c): every byte written, the driver's own values; without a
	 * place to write, the driver's error. */
	memset(&p, 0xa5, sizeof(p));
	CK(cuMemGetAllocationPropertiesFromHandle(&p, h));
	ck_assert_int_eq(p.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	{
		CUmemAllocationProp want = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

		ck_assert_msg(!memcmp(&p, &want, sizeof(p)), "the query's bytes differ from the creation's");
	}
	CK_ERR(cuMemGetAllocationPropertiesFromHandle(NULL, h), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemRelease(h));
	CK(cuMemRelease(h2));
	/* Released: refused, although the mapping keeps the memory alive. */
	CK_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemGetAllocationPropertiesFromHandle(&p, h), CUDA_ERROR_INVALID_VALUE);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_uint_eq(find_alloc(st, 0)->app_handles, 0);
	h_state_free(st);
	/* Recover a handle by address: a new logical value. */
	CK(cuMemRetainAllocationHandle(&h2, (void *)va));
	ck_assert(logical(h2));
	ck_assert_uint_ne(h2, h);
	h_unmap_release(va, g, h2);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
}
END_TEST

START_TEST(raw_handles_in_the_tag_space_are_rejected)
{
	CUmemGenericAllocationHandle fake = (TAG << TAG_SHIFT) | 0x1234;
	CUdeviceptr va;
	size_t g;

	h_init(0);
	g = h_gran();
	CK(cuMemAddressReserve(&va, g, 0, 0, 0));
	CK_ERR(cuMemRelease(fake), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemMap(va, g, 0, fake, 0), CUDA_ERROR_INVALID_VALUE);
	int fd;
	CK_ERR(cuMemExportToShareableHandle(&fd, fake, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_INVALID_VALUE);
	CK(cuMemAddressFree(va, g));
}
END_TEST

START_TEST(overlapping_maps_are_refused)
{
	CUmemGenericAllocationHandle h1, h2;
	CUmemAllocationProp p;
	CUdeviceptr va;
	size_t g;

	h_init(0);
	g = h_gran();
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(cuMemCreate(&h1, 2 * g, &p, 0));
	CK(cuMemCreate(&h2, 2 * g, &p, 0));
	CK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
	CK(cuMemMap(va + g, 2 * g, 0, h1, 0));
	CK_ERR(cuMemMap(va, 2 * g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemMap(va + 2 * g, 2 * g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemMap(va + g, 2 * g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
	CK(cuMemUnmap(va + g, 2 * g));
	CK(cuMemMap(va, 2 * g, 0, h2, 0));
	CK(cuMemUnmap(va, 2 * g));
	CK(cuMemRelease(h1));
	CK(cuMemRelease(h2));
	CK(cuMemAddressFree(va, 4 * g));
}
END_TEST

static bool has_access(const Cuip__Mapping *m, int dev)
{
	size_t n = 0;

	for (size_t i = 0; i < m->n_access; i++)
		if (m->access[i]->location_id == dev && m->access[i]->va == m->va && m->access[i]->size == m->size &&
		    m->access[i]->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			n++;
	return n == 1;
}

START_TEST(access_is_merged_per_location_over_any_subrange)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp p;
	CUdeviceptr va;
	const int n = 40; /* more pieces than any fixed descriptor table */
	CUmemAccessDesc d0 = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc d1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc both[2] = {d0, d1};
	size_t g;
	Cuip__ProcessState *st;
	int ndev = 0;

	h_init(0);
	CK(cuDeviceGetCount(&ndev));
	ck_assert_int_ge(ndev, 2);
	g = h_gran();
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(cuMemCreate(&h, (size_t)n * g, &p, 0));
	CK(cuMemAddressReserve(&va, (size_t)n * g, 0, 0, 0));
	/* One allocation, n mappings of one granule each, back to back. */
	for (int i = 0; i < n; i++)
		CK(cuMemMap(va + (size_t)i * g, g, (size_t)i * g, h, 0));
	/* Device 0 over everything, twice; device 1 mapping by mapping on
	 * every third one, then over [10, 20) together with device 0. */
	CK(cuMemSetAccess(va, (size_t)n * g, &d0, 1));
	CK(cuMemSetAccess(va, (size_t)n * g, &d0, 1));
	for (int i = 0; i < n; i += 3)
		CK(cuMemSetAccess(va + (size_t)i * g, g, &d1, 1));
	CK(cuMemSetAccess(va + 10 * g, 10 * g, both, 2));
	st = h_state(0);
	ck_assert_uint_eq(st->n_mappings, (size_t)n);
	for (int i = 0; i < n; i++) {
		Cuip__Mapping *m = st->mappings[i];
		bool want1 = i % 3 == 0 || (i >= 10 && i < 20);
		ck_assert_uint_eq(m->va, va + (size_t)i * g);
		ck_assert_uint_eq(m->offset, (size_t)i * g);
		ck_assert(has_access(m, 0));
		ck_assert_int_eq(has_access(m, 1), want1);
		ck_assert_uint_eq(m->n_access, want1 ? 2 : 1);
	}
	h_state_free(st);
	/* Unmapping part of the range keeps the rest exactly. */
	CK(cuMemUnmap(va, 20 * g));
	st = h_state(0);
	ck_assert_uint_eq(st->n_mappings, (size_t)n - 20);
	ck_assert_uint_eq(st->mappings[0]->va, va + 20 * g);
	ck_assert(!has_access(st->mappings[0], 1)); /* mapping 20 */
	ck_assert(has_access(st->mappings[1], 1));  /* mapping 21 */
	h_state_free(st);
	CK(cuMemUnmap(va + 20 * g, (size_t)(n - 20) * g));
	CK(cuMemAddressFree(va, (size_t)n * g));
	CK(cuMemRelease(h));
}
END_TEST

START_TEST(thousands_of_create_release_rounds_do_not_grow)
{
	const int rounds = 10000, warm = 500;
	long rss0 = 0;
	int fds0 = 0;
	size_t g;

	h_init(0);
	g = h_gran();
	for (int i = 0; i < rounds; i++) {
		CUmemGenericAllocationHandle h;
		CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		CK(cuMemCreate(&h, g, &p, 0));
		if (i % 10 == 0) {
			int fd = h_export(h); /* tickets and the export cache too */
			close(fd);
		}
		CK(cuMemRelease(h));
		if (i == warm) {
			rss0 = h_rss_kb();
			fds0 = h_nfds();
		}
	}
	ck_assert_int_eq(h_nfds_settled(fds0), fds0);
	if (!h_asan()) /* ASan's quarantine grows by design */
		ck_assert_msg(h_rss_kb() - rss0 < 2048, "RSS grew from %ld to %ld KiB", rss0, h_rss_kb());
	Cuip__ProcessState *st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
}
END_TEST

/* Each one-granule cuMemAlloc is a VMM allocation in its own reservation
 * under the interposer; the fake once ran out of reservations at 4,096
 * (CUDA_ERROR_OUT_OF_MEMORY from cuMemAddressReserve) where the real driver
 * has no such limit. */
START_TEST(ten_thousand_one_granule_allocations_each_reserved)
{
	enum { N = 10000 };
	static CUdeviceptr p[N];
	uint32_t v[2], w[2];
	size_t g;
	int i;

	setenv("FAKECUDA_VMM_GRANULARITY_KB", "64", 1); /* 625 MiB in all */
	h_init(0);
	g = h_gran();
	ck_assert_uint_eq(g, 64 << 10);
	for (i = 0; i < N; i++) {
		CK(cuMemAlloc(&p[i], g));
		ck_assert(i == 0 || p[i] != p[i - 1]);
	}
	for (i = 0; i < N; i += N / 4 - 1) {
		v[0] = (uint32_t)i;
		v[1] = ~(uint32_t)i;
		CK(cuMemcpyHtoD(p[i] + g - sizeof(v), v, sizeof(v)));
	}
	for (i = 0; i < N; i += N / 4 - 1) {
		CK(cuMemcpyDtoH(w, p[i] + g - sizeof(w), sizeof(w)));
		ck_assert_uint_eq(w[0], (uint32_t)i);
		ck_assert_uint_eq(w[1], ~(uint32_t)i);
	}
	for (i = 0; i < N; i++)
		CK(cuMemFree(p[i]));
	Cuip__ProcessState *st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
	unsetenv("FAKECUDA_VMM_GRANULARITY_KB");
}
END_TEST

Suite *track_suite(void);
Suite *track_suite(void)
{
	Suite *s = suite_create("track");
	TCase *tc = tcase_create("records");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, create_map_unmap_release_leaves_nothing);
	tcase_add_test(tc, handle_type_none_stays_native_and_untracked);
	tcase_add_test(tc, fabric_handle_types_are_tracked_as_unsupported);
	tcase_add_test(tc, retain_aliases_one_driver_handle_and_released_handles_are_refused);
	tcase_add_test(tc, raw_handles_in_the_tag_space_are_rejected);
	tcase_add_test(tc, overlapping_maps_are_refused);
	tcase_add_test(tc, access_is_merged_per_location_over_any_subrange);
	tcase_add_test(tc, thousands_of_create_release_rounds_do_not_grow);
	tcase_add_test(tc, ten_thousand_one_granule_allocations_each_reserved);
	suite_add_tcase(s, tc);
	return s;
}
