/*
 * test_procstat.c - the one /proc/PID/stat parser (protocol/procstat.c):
 * command names with spaces and parentheses, lines that are not stat
 * lines, a live child named to fool a parser that stops at the first ')',
 * and a process that is gone.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "procstat.h"

/* Fields 5 to 24 of a stat line, its starttime (field 22) 4242. */
#define TAIL " 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 4242 1000 200"

START_TEST(comm_with_spaces_and_parentheses_ends_at_the_last_paren)
{
	struct cuip_proc_stat st;

	ck_assert_int_eq(cuip_proc_stat_parse("42 (a) b (c)) S 7" TAIL "\n", &st), 0);
	ck_assert_str_eq(st.comm, "a) b (c)");
	ck_assert_int_eq(st.state, 'S');
	ck_assert_int_eq(st.ppid, 7);
	ck_assert_uint_eq(st.start, 4242);
	ck_assert_int_eq(cuip_proc_stat_parse("9 (my prog) Z 1" TAIL, &st), 0);
	ck_assert_str_eq(st.comm, "my prog");
	ck_assert_int_eq(st.state, 'Z');
	ck_assert_int_eq(st.ppid, 1);
	ck_assert_int_eq(cuip_proc_stat_parse("9 () R 0" TAIL, &st), 0);
	ck_assert_str_eq(st.comm, "");
}
END_TEST

START_TEST(what_is_not_a_stat_line_is_refused)
{
	struct cuip_proc_stat st;

	ck_assert_int_eq(cuip_proc_stat_parse("", &st), -EINVAL);
	ck_assert_int_eq(cuip_proc_stat_parse("hello", &st), -EINVAL);
	ck_assert_int_eq(cuip_proc_stat_parse("1 (x)S 1" TAIL, &st), -EINVAL);
	ck_assert_int_eq(cuip_proc_stat_parse("1 (x) S", &st), -EINVAL);
	ck_assert_int_eq(cuip_proc_stat_parse("1 (x) S one" TAIL, &st), -EINVAL);
	/* cut before starttime (field 22) */
	ck_assert_int_eq(cuip_proc_stat_parse("1 (x) S 1 7 7 0 -1 4194560 100 0 0 0 1 2", &st), -EINVAL);
	ck_assert_int_eq(cuip_proc_stat_parse("1 (x) S 1 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12x 3", &st),
			 -EINVAL);
}
END_TEST

START_TEST(a_live_child_with_a_tricky_name_then_gone)
{
	static const char name[] = ") Z 1 (x";
	struct cuip_proc_stat st, me;
	int pfd[2], status;
	char c;
	pid_t kid;

	ck_assert_int_eq(pipe(pfd), 0);
	kid = fork();
	ck_assert_int_ge(kid, 0);
	if (!kid) {
		close(pfd[0]);
		prctl(PR_SET_NAME, name);
		if (write(pfd[1], "n", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(pfd[1]);
	ck_assert_int_eq(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	ck_assert_int_eq(cuip_proc_stat_read(kid, &st), 0);
	ck_assert_str_eq(st.comm, name);
	ck_assert_msg(st.state == 'S' || st.state == 'R', "state %c", st.state);
	ck_assert_int_eq(st.ppid, getpid());
	ck_assert_int_eq(cuip_proc_stat_read(getpid(), &me), 0);
	ck_assert_uint_ge(st.start, me.start);
	ck_assert_uint_gt(st.start, 0);
	kill(kid, SIGKILL);
	ck_assert_int_eq(waitpid(kid, &status, 0), kid);
	ck_assert_int_eq(cuip_proc_stat_read(kid, &st), -ENOENT);
	ck_assert_int_eq(cuip_proc_stat_start(kid, &st.start, NULL), -ENOENT);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("procstat");
	TCase *tc = tcase_create("procstat");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, comm_with_spaces_and_parentheses_ends_at_the_last_paren);
	tcase_add_test(tc, what_is_not_a_stat_line_is_refused);
	tcase_add_test(tc, a_live_child_with_a_tricky_name_then_gone);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
