/*
 * test_resolve.c - every resolution path leads to the interposer's wrapper
 * of the right ABI variant, and only on success.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static const char *const wrapped[] = {"cuInit",
				      "cuMemCreate",
				      "cuMemRelease",
				      "cuMemRetainAllocationHandle",
				      "cuMemMap",
				      "cuMemUnmap",
				      "cuMemSetAccess",
				      "cuMemExportToShareableHandle",
				      "cuMemImportFromShareableHandle",
				      "cuMemGetAllocationPropertiesFromHandle",
				      "cuMulticastBindMem",
				      "cuMulticastBindMem_v2",
				      "cuMulticastBindAddr",
				      "cuMulticastBindAddr_v2",
				      "cuGetProcAddress",
				      "cuGetProcAddress_v2",
				      "cuMemcpyHtoD_v2",
				      "cuMemcpyDtoH_v2",
				      "cuLaunchKernel",
				      NULL};

START_TEST(direct_symbols_are_the_interposers)
{
	for (int i = 0; wrapped[i]; i++)
		h_ours_sym(wrapped[i]);
	/* Entry points we do not replace are the driver's own. */
	ck_assert(!h_ours(dlsym(RTLD_DEFAULT, "cuDeviceGet")));
	ck_assert_ptr_eq(dlsym(RTLD_DEFAULT, "cuDeviceGet"), h_real("cuDeviceGet"));
}
END_TEST

START_TEST(dlsym_on_the_driver_handle_returns_wrappers)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);

	ck_assert_ptr_nonnull(h);
	for (int i = 0; wrapped[i]; i++)
		ck_assert_ptr_eq(dlsym(h, wrapped[i]), h_ours_sym(wrapped[i]));
	ck_assert_ptr_eq(dlsym(h, "cuDeviceGet"), h_real("cuDeviceGet"));
	ck_assert_ptr_null(dlsym(h, "cuNoSuchEntryPoint"));
	/* Something only we would define stays unresolved through the driver. */
	ck_assert_ptr_null(dlsym(h, "cuip_client_connect"));
	dlclose(h);
}
END_TEST

struct vcase {
	const char *sym;
	int version;
	const char *expect; /* our symbol, or NULL: the real driver's */
};

static const struct vcase vcases[] = {
	{"cuMemCreate", 10020, "cuMemCreate"},
	{"cuMemCreate", 13000, "cuMemCreate"},
	{"cuGetProcAddress", 11030, "cuGetProcAddress"},
	{"cuGetProcAddress", 11080, "cuGetProcAddress"},
	{"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
	{"cuGetProcAddress", 13000, "cuGetProcAddress_v2"},
	{"cuMulticastBindMem", 12010, "cuMulticastBindMem"},
	{"cuMulticastBindMem", 13000, "cuMulticastBindMem"},
	{"cuMulticastBindMem", 13010, "cuMulticastBindMem_v2"},
	{"cuMulticastBindAddr", 13000, "cuMulticastBindAddr"},
	{"cuMulticastBindAddr", 13010, "cuMulticastBindAddr_v2"},
	{"cuMemImportFromShareableHandle", 12000, "cuMemImportFromShareableHandle"},
	{"cuCtxCreate", 3020, "cuCtxCreate_v2"},
	{"cuCtxCreate", 11040, "cuCtxCreate_v3"},
	{"cuCtxCreate", 12050, "cuCtxCreate_v4"},
	{"cuCtxCreate", 13000, "cuCtxCreate_v4"},
	{"cuDeviceGet", 13000, NULL},
	{NULL, 0, NULL},
};

static void check_case(const struct vcase *c, const char *how, CUresult r, void *p)
{
	ck_assert_msg(r == CUDA_SUCCESS, "%s@%d (%s) -> %d", c->sym, c->version, how, (int)r);
	if (c->expect)
		ck_assert_msg(p == h_ours_sym(c->expect), "%s@%d (%s): %p is not our %s (%p)", c->sym, c->version, how,
			      p, c->expect, h_ours_sym(c->expect));
	else
		ck_assert_msg(!h_ours(p) && p, "%s@%d should be the driver's", c->sym, c->version);
}

START_TEST(get_proc_address_picks_the_variant_by_version)
{
	gpa1_fn v1 = (gpa1_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress");
	gpa2_fn v2 = (gpa2_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
	gpa2_fn v2p = (gpa2_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2_ptsz");

	ck_assert(h_ours((void *)v1) && h_ours((void *)v2) && h_ours((void *)v2p));
	for (const struct vcase *c = vcases; c->sym; c++) {
		CUdriverProcAddressQueryResult st = 77;
		void *p = NULL;
		CUresult r;
		r = v2(c->sym, &p, c->version, 0, &st);
		check_case(c, "v2", r, p);
		ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
		p = NULL;
		r = v2p(c->sym, &p, c->version, 0, &st);
		check_case(c, "v2_ptsz", r, p);
		p = NULL;
		r = v2(c->sym, &p, c->version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
		check_case(c, "v2 ptds", r, p);
		p = NULL;
		r = v1(c->sym, &p, c->version, 0);
		check_case(c, "v1", r, p);
	}
}
END_TEST

START_TEST(failed_lookups_stay_failures_with_the_drivers_outputs)
{
	gpa2_fn ours = (gpa2_fn)h_ours_sym("cuGetProcAddress_v2");
	gpa2_fn drv = (gpa2_fn)h_real("cuGetProcAddress_v2");
	static const struct {
		const char *sym;
		int ver;
	} bad[] = {{"cuMemCreate", 10000}, {"cuNoSuchThing", 13000}, {"cuMulticastBindMem", 11000}};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		void *p1 = (void *)0x1234, *p2 = (void *)0x1234;
		CUdriverProcAddressQueryResult s1 = 77, s2 = 77;
		CUresult r1 = ours(bad[i].sym, &p1, bad[i].ver, 0, &s1);
		CUresult r2 = drv(bad[i].sym, &p2, bad[i].ver, 0, &s2);
		ck_assert_int_ne(r1, CUDA_SUCCESS);
		ck_assert_int_eq(r1, r2);
		ck_assert_ptr_eq(p1, p2);
		ck_assert_int_eq(s1, s2);
	}
}
END_TEST

typedef int (*rt_fn)(const char *, void **, unsigned long long, int *);
typedef int (*rtv_fn)(const char *, void **, unsigned, unsigned long long, int *);

START_TEST(runtime_entry_point_lookups_return_wrappers)
{
	const char *stub = getenv("CUIP_CUDART_STUB");
	void *h;
	rt_fn ep, ep_ptsz;
	rtv_fn epv, epv_ptsz;
	void *p;
	int st;

	ck_assert_ptr_nonnull(stub);
	h = dlopen(stub, RTLD_NOW | RTLD_GLOBAL);
	ck_assert_msg(h != NULL, "%s", dlerror());
	ep = (rt_fn)dlsym(h, "cudaGetDriverEntryPoint");
	ep_ptsz = (rt_fn)dlsym(h, "cudaGetDriverEntryPoint_ptsz");
	epv = (rtv_fn)dlsym(h, "cudaGetDriverEntryPointByVersion");
	epv_ptsz = (rtv_fn)dlsym(h, "cudaGetDriverEntryPointByVersion_ptsz");
	ck_assert(h_ours((void *)ep) && h_ours((void *)ep_ptsz) && h_ours((void *)epv) && h_ours((void *)epv_ptsz));

	CK(cuInit(0));
	ck_assert_int_eq(ep("cuMemCreate", &p, 0, &st), 0);
	ck_assert_ptr_eq(p, h_ours_sym("cuMemCreate"));
	ck_assert_int_eq(ep_ptsz("cuMemMap", &p, 0, &st), 0);
	ck_assert_ptr_eq(p, h_ours_sym("cuMemMap"));
	ck_assert_int_eq(ep("cuGetProcAddress", &p, 0, &st), 0);
	ck_assert_ptr_eq(p, h_ours_sym("cuGetProcAddress_v2"));
	for (const struct vcase *c = vcases; c->sym; c++) {
		p = NULL;
		ck_assert_int_eq(epv(c->sym, &p, (unsigned)c->version, 0, &st), 0);
		check_case(c, "ByVersion", CUDA_SUCCESS, p);
		p = NULL;
		ck_assert_int_eq(epv_ptsz(c->sym, &p, (unsigned)c->version, 0, &st), 0);
		check_case(c, "ByVersion_ptsz", CUDA_SUCCESS, p);
	}
	p = (void *)0x5678;
	ck_assert_int_ne(epv("cuNoSuchThing", &p, 13000, 0, &st), 0);
	ck_assert(!h_ours(p));
}
END_TEST

START_TEST(wrappers_forward_arguments_unchanged)
{
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h = 0xabcdef;

	h_init(0);
	prop = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	/* The driver sees our caller's NULL, and the error comes back. */
	CK_ERR(cuMemCreate(NULL, h_gran(), &prop, 0), CUDA_ERROR_INVALID_VALUE);
	/* A size the driver refuses: the output is untouched. */
	CK_ERR(cuMemCreate(&h, 12345, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(h, 0xabcdef);
	CK_ERR(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(h, 0xabcdef);
	CK_ERR(cuMemRetainAllocationHandle(&h, (void *)0x1000), CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(h, 0xabcdef);
}
END_TEST

Suite *resolve_suite(void);
Suite *resolve_suite(void)
{
	Suite *s = suite_create("resolve");
	TCase *tc = tcase_create("paths");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, direct_symbols_are_the_interposers);
	tcase_add_test(tc, dlsym_on_the_driver_handle_returns_wrappers);
	tcase_add_test(tc, get_proc_address_picks_the_variant_by_version);
	tcase_add_test(tc, failed_lookups_stay_failures_with_the_drivers_outputs);
	tcase_add_test(tc, runtime_entry_point_lookups_return_wrappers);
	tcase_add_test(tc, wrappers_forward_arguments_unchanged);
	suite_add_tcase(s, tc);
	return s;
}
