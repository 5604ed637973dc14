/*
 * test_main.c - the interposer's Check runner. Run through run-test.sh
 * (libcuinterpose.so preloaded, a private fake driver and socket directory).
 */
#include <check.h>
#include <stdlib.h>

Suite *resolve_suite(void);
Suite *track_suite(void);
Suite *share_suite(void);
Suite *ops_suite(void);
Suite *ipc_suite(void);
Suite *mc_suite(void);
Suite *slab_suite(void);
Suite *pool_suite(void);
Suite *query_suite(void);

int main(void)
{
	SRunner *sr = srunner_create(resolve_suite());
	int failed;

	srunner_add_suite(sr, track_suite());
	srunner_add_suite(sr, share_suite());
	srunner_add_suite(sr, ops_suite());
	srunner_add_suite(sr, ipc_suite());
	srunner_add_suite(sr, mc_suite());
	srunner_add_suite(sr, slab_suite());
	srunner_add_suite(sr, pool_suite());
	srunner_add_suite(sr, query_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
