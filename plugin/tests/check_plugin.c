/*
 * check_plugin.c - runs the plugin's unit test suites (Check).
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <stdlib.h>

Suite *rules_suite(void);
Suite *coord_suite(void);
Suite *discovery_suite(void);
Suite *agent_suite(void);
Suite *startgate_suite(void);
Suite *guardian_suite(void);
Suite *devfiles_suite(void);
Suite *gpus_suite(void);

int main(void)
{
	SRunner *sr = srunner_create(rules_suite());
	int failed;

	srunner_add_suite(sr, coord_suite());
	srunner_add_suite(sr, discovery_suite());
	srunner_add_suite(sr, agent_suite());
	srunner_add_suite(sr, startgate_suite());
	srunner_add_suite(sr, guardian_suite());
	srunner_add_suite(sr, devfiles_suite());
	srunner_add_suite(sr, gpus_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
