/*
 * test_log.c - the interposer's log (interposer/core/log.c): lines go to stderr
 * at once, or are held in memory (cuip_log_hold, while a process is being
 * restored) and written in order when the hold ends; past 64 KiB held the
 * rest are counted and the count is reported, and a forked child starts
 * with nothing held. stderr is a file here.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "../tmpname.h"

static char path[64];
static int saved_stderr = -1;

static void setup(void)
{
	int fd = mkstemp(test_tmpname(path, sizeof(path), "cuip-test-log.XXXXXX"));

	ck_assert_int_ge(fd, 0);
	saved_stderr = dup(STDERR_FILENO);
	ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
	close(fd);
	cuip_log_level = 2;
}

static void teardown(void)
{
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	unlink(path);
	memcpy(path + strlen(path) - 6, "XXXXXX", 6);
}

/* What stderr (the file) holds so far, NUL-terminated; caller frees. */
static char *written(size_t *len)
{
	struct stat st;
	char *buf;
	int fd = open(path, O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	buf = calloc(1, (size_t)st.st_size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(read(fd, buf, (size_t)st.st_size), st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

START_TEST(held_lines_come_out_in_order_when_the_hold_ends)
{
	char expect[256], *w;
	size_t len;
	int pid = (int)getpid();

	pr_info("before %d", 1);
	cuip_log_hold(true);
	pr_info("held %d", 2);
	pr_err("held %d", 3);
	pr_debug("below the level %d", 4);
	w = written(&len);
	snprintf(expect, sizeof(expect), "cuinterpose[%d]: before 1\n", pid);
	ck_assert_str_eq(w, expect); /* nothing of the held lines yet */
	free(w);
	cuip_log_hold(true); /* holding again changes nothing */
	cuip_log_hold(false);
	pr_info("after %d", 5);
	cuip_log_hold(false); /* nothing held: nothing written */
	w = written(&len);
	snprintf(expect, sizeof(expect),
		 "cuinterpose[%d]: before 1\ncuinterpose[%d]: held 2\ncuinterpose[%d]: held 3\ncuinterpose[%d]: after "
		 "5\n",
		 pid, pid, pid, pid);
	ck_assert_str_eq(w, expect);
	free(w);
}
END_TEST

START_TEST(past_64_kib_held_lines_are_counted_and_reported)
{
	char line[1000], *w, *last;
	size_t len, n = 0;

	memset(line, 'x', sizeof(line) - 1);
	line[sizeof(line) - 1] = 0;
	cuip_log_hold(true);
	for (int i = 0; i < 100; i++)
		pr_info("%03d %s", i, line);
	pr_info("short"); /* would fit, but comes after dropped lines: dropped too */
	w = written(&len);
	ck_assert_uint_eq(len, 0);
	free(w);
	cuip_log_hold(false);
	w = written(&len);
	for (char *p = w; (p = strchr(p, '\n')); p++)
		n++;
	/* each line is 1023 bytes with its prefix and newline: 64 of them fit */
	ck_assert_uint_eq(n, 64 + 1);
	ck_assert_ptr_nonnull(strstr(w, " 000 xxx"));
	ck_assert_ptr_nonnull(strstr(w, " 063 xxx"));
	ck_assert_ptr_null(strstr(w, " 064 xxx"));
	ck_assert_ptr_null(strstr(w, "short"));
	last = strrchr(w, ':');
	ck_assert_ptr_nonnull(last);
	ck_assert_str_eq(last, ": 37 log lines of the restore dropped (more than 64 KiB held)\n");
	free(w);
}
END_TEST

START_TEST(a_forked_child_starts_with_nothing_held)
{
	char *w;
	size_t len;
	pid_t pid;
	int st;

	cuip_log_hold(true);
	pr_info("parent's held line");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pr_info("child's line"); /* not held: written at once */
		cuip_log_hold(false);	 /* nothing of the parent's to write */
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_int_eq(st, 0);
	w = written(&len);
	ck_assert_ptr_nonnull(strstr(w, "child's line"));
	ck_assert_ptr_null(strstr(w, "parent's held line"));
	free(w);
	cuip_log_hold(false);
	w = written(&len);
	ck_assert_ptr_nonnull(strstr(w, "parent's held line"));
	free(w);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("hold");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, held_lines_come_out_in_order_when_the_hold_ends);
	tcase_add_test(tc, past_64_kib_held_lines_are_counted_and_reported);
	tcase_add_test(tc, a_forked_child_starts_with_nothing_held);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
