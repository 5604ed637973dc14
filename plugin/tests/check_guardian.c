/*
 * check_guardian.c - the guardian's lifecycle without CRIU (a forked child
 * plays criu: it starts the guardian, reports progress, then dies, commits
 * or loses it) and the parsing of CUINTERPOSE_TEST_FAULT and
 * CUINTERPOSE_GUARDIAN_STOP_MS. Single-threaded; each test forks.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "guardian.h"

static char dir[64];
/* fake criu -> test: the guardian's pid (a shared page: fork copies the rest) */
static volatile pid_t *shared_pid;
static pid_t guardian;

static void mkdir_tmp(void)
{
	snprintf(dir, sizeof(dir), "/tmp/cuip-guard.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void rm_tmp(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/" CUIP_GUARDIAN_LOG, dir);
	unlink(path);
	rmdir(dir);
}

/* The guardian's log, waited for up to 10 s; "" when it never appears. */
static void read_log(char *buf, size_t len, const char *want)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/" CUIP_GUARDIAN_LOG, dir);
	buf[0] = 0;
	for (int i = 0; i < 1000; i++) {
		int fd = open(path, O_RDONLY);
		ssize_t n = fd >= 0 ? read(fd, buf, len - 1) : 0;

		if (fd >= 0)
			close(fd);
		buf[n > 0 ? n : 0] = 0;
		if (!want || strstr(buf, want))
			return;
		usleep(10000);
	}
}

enum how { DIE, COMMIT, LOSE };

/* Fake criu: start a guardian for an empty group, report QUIESCE, end. */
static void fake_criu(enum how how)
{
	struct cuip_group g = {0};
	char err[256];
	pid_t gp;
	int ret;

	g.imgdir = open(dir, O_RDONLY | O_DIRECTORY);
	ret = cuip_guardian_start_dump(&g, NULL, 0, NULL, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "start: %s\n", err);
		_exit(10);
	}
	gp = cuip_guardian_pid();
	guardian = gp;
	if (gp <= 0 || cuip_guardian_phase(&g, "QUIESCE", false) || cuip_guardian_phase(&g, "QUIESCE", true))
		_exit(11);
	if (how == COMMIT) {
		cuip_guardian_end("commit: test");
	} else if (how == LOSE) {
		kill(gp, SIGKILL);
		/* not our child (double fork): wait until it is gone */
		for (int i = 0; i < 1000 && kill(gp, 0) == 0; i++)
			usleep(10000);
		ret = cuip_guardian_phase(&g, "PREPARE_MULTICAST", false);
		if (ret != -EPIPE || !strstr(g.err, "is gone: refusing to go on with PREPARE_MULTICAST"))
			_exit(12);
		/* reported once; criu's own rollback then runs unhindered */
		if (cuip_guardian_phase(&g, "RESUME", false))
			_exit(13);
	}
	*shared_pid = guardian;
	_exit(0);
}

/* The guardian has exited (it is nobody's child here: poll, bounded). */
static void wait_guardian_gone(void)
{
	pid_t gp = *shared_pid;

	ck_assert_int_gt(gp, 0);
	for (int i = 0; i < 1000 && kill(gp, 0) == 0; i++)
		usleep(10000);
	ck_assert_msg(kill(gp, 0) && errno == ESRCH, "guardian %d still runs", (int)gp);
}

static int run_fake(enum how how)
{
	int st;
	pid_t c;

	if (!shared_pid) {
		shared_pid = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		ck_assert_ptr_ne((void *)shared_pid, MAP_FAILED);
	}
	*shared_pid = 0;
	c = fork();

	ck_assert_int_ge(c, 0);
	if (c == 0)
		fake_criu(how);
	ck_assert_int_eq(waitpid(c, &st, 0), c);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(criu_dies)
{
	char buf[4096];

	mkdir_tmp();
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	ck_assert_int_eq(run_fake(DIE), 0);
	read_log(buf, sizeof(buf), "rollback complete");
	ck_assert_msg(strstr(buf, "criu exited (killed or crashed); last progress: after QUIESCE"), "log: %s", buf);
	ck_assert_msg(strstr(buf, "rollback complete in"), "log: %s", buf);
	rm_tmp();
}
END_TEST

START_TEST(commit_releases)
{
	char buf[4096];

	mkdir_tmp();
	ck_assert_int_eq(run_fake(COMMIT), 0);
	/* the guardian exits without acting: no log, ever */
	wait_guardian_gone();
	read_log(buf, sizeof(buf), NULL);
	ck_assert_str_eq(buf, "");
	rm_tmp();
}
END_TEST

START_TEST(guardian_lost)
{
	char buf[4096];

	mkdir_tmp();
	ck_assert_int_eq(run_fake(LOSE), 0);
	wait_guardian_gone();
	read_log(buf, sizeof(buf), NULL);
	ck_assert_str_eq(buf, "");
	rm_tmp();
}
END_TEST

START_TEST(bad_stop_bound)
{
	struct cuip_group g = {0};
	char err[256] = "";

	setenv("CUINTERPOSE_GUARDIAN_STOP_MS", "soon", 1);
	ck_assert_int_eq(cuip_guardian_start_dump(&g, NULL, 0, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_GUARDIAN_STOP_MS=soon: expected milliseconds, 0 to 3600000");
	ck_assert_int_eq(cuip_guardian_pid(), 0);
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
}
END_TEST

START_TEST(fault_specs)
{
	char err[256];

	unsetenv("CUINTERPOSE_TEST_FAULT");
	ck_assert_int_eq(cuip_fault_load(err, sizeof(err)), 0);
	setenv("CUINTERPOSE_TEST_FAULT", "kill@SAVE", 1);
	ck_assert_int_eq(cuip_fault_load(err, sizeof(err)), 0);
	cuip_fault("QUIESCE"); /* another point: nothing happens */
	setenv("CUINTERPOSE_TEST_FAULT", "SAVE", 1);
	ck_assert_int_eq(cuip_fault_load(err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_TEST_FAULT=SAVE: expected ACTION@POINT");
	setenv("CUINTERPOSE_TEST_FAULT", "kill@", 1);
	ck_assert_int_eq(cuip_fault_load(err, sizeof(err)), -EINVAL);
	setenv("CUINTERPOSE_TEST_FAULT", "zap@SAVE", 1);
	ck_assert_int_eq(cuip_fault_load(err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(
		err, "CUINTERPOSE_TEST_FAULT=zap@SAVE: action 'zap' is not kill, stop, kill-agent or kill-guardian");
	unsetenv("CUINTERPOSE_TEST_FAULT");
}
END_TEST

Suite *guardian_suite(void);

Suite *guardian_suite(void)
{
	Suite *s = suite_create("guardian");
	TCase *tc = tcase_create("lifecycle");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, criu_dies);
	tcase_add_test(tc, commit_releases);
	tcase_add_test(tc, guardian_lost);
	tcase_add_test(tc, bad_stop_bound);
	tcase_add_test(tc, fault_specs);
	suite_add_tcase(s, tc);
	return s;
}
