/*
 * test_ops.c - checkpoint operations over the control socket (issue 5).
 */
#include "harness.h"

Suite *ops_suite(void);
Suite *ops_suite(void)
{
	return suite_create("ops");
}
