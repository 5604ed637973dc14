/*
 * test_main.c - the interposer's Check runner. Run through run-test.sh
 * (libcuinterpose.so preloaded, a private fake driver and socket directory).
 */
#include "harness.h"

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
	return h_run(resolve_suite(), track_suite(), share_suite(), ops_suite(), ipc_suite(), mc_suite(), slab_suite(),
		     pool_suite(), query_suite(), NULL);
}
