/*
 * check_gpus.c - the GPU pairs a restore onto other GPUs needs
 * (plugin/gpus.c, cuip_gpus_plan): GPUs all here, missing ones paired or
 * not, `auto` where clear and where not, pairs onto GPUs that are not here.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpus.h"
#include "../../test/tmpname.h"

static struct cuip_gpu gpu(int ord, unsigned char id, const char *name)
{
	struct cuip_gpu g = {.ordinal = ord};

	memset(g.uuid, id, 16);
	strcpy(g.name, name);
	return g;
}

static void uuid_str(unsigned char id, char *buf)
{
	uint8_t u[16];

	memset(u, id, 16);
	cuip_format_uuid(u, buf, 48);
}

START_TEST(gpus_all_here_need_no_pairs)
{
	struct cuip_gpu img[2] = {gpu(0, 1, "H200"), gpu(1, 2, "H200")},
			here[3] = {gpu(0, 2, "H200"), gpu(1, 1, "H200"), gpu(2, 9, "H200")};
	struct cuip_gpu_pair p[4];
	unsigned n = 0;
	char err[1024] = "";

	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 3, false, p, &n, 4, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 3, true, p, &n, 4, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(missing_gpus_are_refused_with_the_value_to_set)
{
	struct cuip_gpu img[2] = {gpu(0, 1, "H200"), gpu(1, 2, "H200")},
			here[2] = {gpu(0, 5, "H200"), gpu(1, 6, "H200")};
	struct cuip_gpu_pair p[4];
	unsigned n = 0;
	char err[2048] = "", a[48], b[48], c[48], d[48], want[512];

	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, false, p, &n, 4, err, sizeof(err)), -ENODEV);
	uuid_str(1, a);
	uuid_str(2, b);
	uuid_str(5, c);
	uuid_str(6, d);
	snprintf(want, sizeof(want), "restore with CUINTERPOSE_GPU_REMAP=%s=%s,%s=%s (or =auto)", a, c, b, d);
	ck_assert_msg(strstr(err, want), "%s", err);
	snprintf(want, sizeof(want),
		 "made on GPU(s) 0 %s (H200), 1 %s (H200); this machine has 0 %s (H200), 1 %s (H200); 2 "
		 "of the images' GPUs are neither here nor paired",
		 a, b, c, d);
	ck_assert_msg(strstr(err, want), "%s", err);
}
END_TEST

START_TEST(given_pairs_cover_the_missing_gpus)
{
	struct cuip_gpu img[2] = {gpu(0, 1, "H200"), gpu(1, 2, "H200")},
			here[2] = {gpu(0, 5, "H200"), gpu(1, 6, "H200")};
	struct cuip_gpu_pair p[4];
	unsigned n = 2;
	char err[2048] = "";

	memset(p[0].old_uuid, 1, 16);
	memset(p[0].new_uuid, 6, 16);
	memset(p[1].old_uuid, 2, 16);
	memset(p[1].new_uuid, 5, 16);
	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, false, p, &n, 4, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 2);
	n = 1; /* GPU 1 of the images left out */
	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, false, p, &n, 4, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "1 of the images' GPUs is neither here nor paired"), "%s", err);
	memset(p[0].new_uuid, 7, 16); /* onto a GPU that is not here */
	n = 2;
	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, false, p, &n, 4, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "CUINTERPOSE_GPU_REMAP maps a GPU onto GPU-07070707-"), "%s", err);
	ck_assert_msg(strstr(err, "which this machine does not have (it has 0 GPU-05050505-"), "%s", err);
}
END_TEST

START_TEST(auto_pairs_by_ordinal_only_where_clear)
{
	struct cuip_gpu img[2] = {gpu(0, 1, "H200"), gpu(1, 2, "H200")},
			here[2] = {gpu(0, 5, "H200"), gpu(1, 6, "H200")}, one[1] = {gpu(0, 5, "H200")},
			other[2] = {gpu(0, 5, "H200"), gpu(1, 6, "A100")},
			mixed[2] = {gpu(0, 1, "H200"), gpu(1, 6, "H200")};
	struct cuip_gpu_pair p[4];
	unsigned n = 0;
	char err[2048] = "";
	uint8_t u[16];

	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, true, p, &n, 4, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 2);
	memset(u, 1, 16);
	ck_assert(!memcmp(p[0].old_uuid, u, 16));
	memset(u, 5, 16);
	ck_assert(!memcmp(p[0].new_uuid, u, 16));
	memset(u, 6, 16);
	ck_assert(!memcmp(p[1].new_uuid, u, 16));

	n = 0;
	ck_assert_int_eq(cuip_gpus_plan(img, 2, one, 1, true, p, &n, 4, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "no pairing is clear (the images saw 2 GPU(s), this machine has 1)"), "%s", err);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(cuip_gpus_plan(img, 2, other, 2, true, p, &n, 4, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "no pairing is clear (GPU 1 of the images is a H200, GPU 1 here a A100)"), "%s", err);
	ck_assert_int_eq(cuip_gpus_plan(img, 2, mixed, 2, true, p, &n, 4, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "(auto pairs only when no GPU of the images is here)"), "%s", err);
	ck_assert_uint_eq(n, 0);
	/* more GPUs than pairs fit */
	ck_assert_int_eq(cuip_gpus_plan(img, 2, here, 2, true, p, &n, 1, err, sizeof(err)), -ENODEV);
}
END_TEST

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

START_TEST(the_kernel_modules_list_gives_uuids_and_models_in_pci_order)
{
	char d[160], p[256], cmd[300];

	test_tmpname(d, sizeof(d), "cuip-gpus.XXXXXX");
	struct cuip_gpu v[4];
	uint8_t u[16];

	ck_assert_ptr_nonnull(mkdtemp(d));
	snprintf(p, sizeof(p), "%s/0000:1b:00.0", d);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/0000:1b:00.0/information", d);
	put(p, "Model: \t\t NVIDIA H200\nIRQ:   \t\t 17\nGPU UUID: \t GPU-22222222-2222-2222-2222-222222222222\n");
	snprintf(p, sizeof(p), "%s/0000:0a:00.0", d);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/0000:0a:00.0/information", d);
	put(p, "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-11111111-1111-1111-1111-111111111111\n");
	snprintf(p, sizeof(p), "%s/0000:ff:00.0", d); /* no UUID line: not listed */
	ck_assert_int_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/0000:ff:00.0/information", d);
	put(p, "Model: \t\t NVIDIA H200\n");

	ck_assert_int_eq(cuip_gpus_listed(d, v, 4), 2);
	memset(u, 0x11, 16);
	ck_assert(!memcmp(v[0].uuid, u, 16));
	ck_assert_int_eq(v[0].ordinal, 0);
	ck_assert_str_eq(v[0].name, "NVIDIA H200");
	memset(u, 0x22, 16);
	ck_assert(!memcmp(v[1].uuid, u, 16));
	ck_assert_int_eq(v[1].ordinal, 1);
	ck_assert_int_eq(cuip_gpus_listed(d, v, 1), 1);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", d);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(cuip_gpus_listed(d, v, 4), 0);
}
END_TEST

Suite *gpus_suite(void);

Suite *gpus_suite(void)
{
	Suite *s = suite_create("gpus");
	TCase *t = tcase_create("restore onto other GPUs");

	tcase_set_timeout(t, 10);
	tcase_add_test(t, gpus_all_here_need_no_pairs);
	tcase_add_test(t, missing_gpus_are_refused_with_the_value_to_set);
	tcase_add_test(t, given_pairs_cover_the_missing_gpus);
	tcase_add_test(t, auto_pairs_by_ordinal_only_where_clear);
	tcase_add_test(t, the_kernel_modules_list_gives_uuids_and_models_in_pci_order);
	suite_add_tcase(s, t);
	return s;
}
