/*
 * check_agent.c - the native agent (agent.c) through native.c's API, as
 * the hooks use it, against a scripted driver (stubcuda.c, named by
 * $CUIP_STUBCUDA): driver calls run in a child process, in parallel; the
 * caller keeps one thread and never maps the driver; failures name the
 * call, the pid and the CUresult; a dead agent is reaped, reported and
 * replaced, and the states are read back for the rollback.
 */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "criulog.h"
#include "native.h"

static const char *stub(void)
{
	const char *s = getenv("CUIP_STUBCUDA");

	ck_assert_msg(s != NULL, "CUIP_STUBCUDA is not set (run through make check)");
	return s;
}

static int count_tasks(pid_t pid)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static int maps_has(pid_t pid, const char *what)
{
	char path[64], line[4096];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, what) != NULL;
	fclose(f);
	return found;
}

static void procs(struct cuip_native_proc *v, size_t n, pid_t first)
{
	memset(v, 0, n * sizeof(*v));
	for (size_t i = 0; i < n; i++)
		v[i].pid = first + (pid_t)i;
}

static void assert_reaped(pid_t pid)
{
	errno = 0;
	ck_assert_int_eq(waitpid(pid, NULL, WNOHANG | __WALL), -1);
	ck_assert_int_eq(errno, ECHILD);
}

START_TEST(driver_calls_run_in_parallel_in_a_child_that_is_reaped)
{
	struct cuip_native_proc v[8];
	struct cuip_gpu_pair pairs[2];
	char err[512] = "";
	double t0;
	pid_t agent;

	ck_assert_int_eq(cuip_native_open(stub(), err, sizeof(err)), 0);
	agent = cuip_agent_pid();
	ck_assert_int_gt(agent, 0);
	ck_assert_int_ne(agent, getpid());
	procs(v, 8, 1001);
	t0 = cuip_now();
	ck_assert_int_eq(cuip_native_lock_all(v, 8, 1000, err, sizeof(err)), 0);
	/* eight 200 ms calls at once, not one after the other */
	ck_assert_msg(cuip_now() - t0 < 0.9, "8 locks took %.3f s", cuip_now() - t0);
	for (int i = 0; i < 8; i++)
		ck_assert(v[i].locked);
	ck_assert_int_eq(cuip_native_checkpoint_all(v, 8, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_native_state(1004), CUIP_NATIVE_CHECKPOINTED);
	memset(pairs, 0xAA, sizeof(pairs));
	pairs[1].new_uuid[0] = 0xBB;
	ck_assert_int_eq(cuip_native_restore_all(v, 8, pairs, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_native_unlock_all(v, 8, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_native_state(1008), CUIP_NATIVE_RUNNING);
	/* the driver and its threads are the agent's, never ours */
	ck_assert_int_eq(count_tasks(getpid()), 1);
	ck_assert(!maps_has(getpid(), "libstubcuda"));
	ck_assert(maps_has(agent, "libstubcuda"));
	ck_assert_int_eq(cuip_agent_pid(), agent); /* one agent for the whole stage */
	cuip_native_close();
	ck_assert_int_eq(cuip_agent_pid(), 0);
	assert_reaped(agent);
	ck_assert_int_eq(cuip_native_state(1001), -ENOENT);
}
END_TEST

START_TEST(failures_name_the_call_the_pid_and_the_cuda_error)
{
	struct cuip_native_proc v[3];
	struct cuip_gpu_pair pair;
	char err[512] = "";
	int tid = 0, st = -1;

	ck_assert_int_eq(cuip_native_open(stub(), err, sizeof(err)), 0);
	/* the driver asks for cuInit: the agent calls it once and retries */
	ck_assert_int_eq(cuip_native_probe(1001, &tid, &st, err, sizeof(err)), 0);
	ck_assert_int_eq(tid, 1002);
	ck_assert_int_eq(st, CUIP_NATIVE_RUNNING);
	ck_assert_int_eq(cuip_native_probe(5, &tid, &st, err, sizeof(err)), -ENOENT);

	procs(v, 3, 1012); /* 1012 locks, 1013 times out, 1014 locks */
	ck_assert_int_eq(cuip_native_lock_all(v, 3, 50, err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, "cuCheckpointProcessLock(pid 1013) failed: CUDA_ERROR_NOT_READY (600)");
	ck_assert(v[0].locked && !v[1].locked && v[2].locked);
	ck_assert_int_eq(cuip_native_unlock_all(v, 3, err, sizeof(err)), 0);
	ck_assert(!v[0].locked && !v[2].locked);

	procs(v, 1, 1077); /* says yes, stays running */
	ck_assert_int_eq(cuip_native_lock_all(v, 1, 50, err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, "after cuCheckpointProcessLock pid 1077 is running, expected locked");

	procs(v, 1, 1020);
	ck_assert_int_eq(cuip_native_lock_all(v, 1, 50, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_native_checkpoint_all(v, 1, err, sizeof(err)), 0);
	memset(&pair, 0, sizeof(pair)); /* one pair where two are needed */
	ck_assert_int_eq(cuip_native_restore_all(v, 1, &pair, 1, err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, "cuCheckpointProcessRestore(pid 1020) failed: CUDA_ERROR_INVALID_VALUE (1)");
	ck_assert(v[0].checkpointed);
	cuip_native_close();
}
END_TEST

START_TEST(a_dead_agent_is_reaped_reported_and_replaced)
{
	struct cuip_native_proc v[2];
	char err[512] = "";
	pid_t agent;

	ck_assert_int_eq(cuip_native_open(stub(), err, sizeof(err)), 0);
	agent = cuip_agent_pid();
	procs(v, 2, 1065); /* 1066 aborts the agent inside Lock */
	ck_assert_int_eq(cuip_native_lock_all(v, 2, 1000, err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "cuCheckpointProcessLock(pid 1065): no answer: the native agent") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "died with 2 driver calls in flight: killed by signal 6") != NULL, "%s", err);
	assert_reaped(agent);
	/* a new agent read the states back (a fresh stub: nothing locked) */
	ck_assert_int_gt(cuip_agent_pid(), 0);
	ck_assert_int_ne(cuip_agent_pid(), agent);
	ck_assert(!v[0].locked && !v[1].locked);
	procs(v, 1, 1001);
	ck_assert_int_eq(cuip_native_lock_all(v, 1, 1000, err, sizeof(err)), 0);
	ck_assert(v[0].locked);
	agent = cuip_agent_pid();
	cuip_native_close();
	assert_reaped(agent);
	ck_assert_int_eq(count_tasks(getpid()), 1);
}
END_TEST

/* The reply is a wire.c frame: one of another version, or damaged, stops
 * the agent and counts as its death (the states are read back). */
START_TEST(a_reply_this_build_cannot_read_stops_the_agent)
{
	static const struct {
		pid_t pid;
		const char *why;
	} cases[] = {
		{1088, "native agent message has format version 2, this build reads version 1"},
		{1089, "native agent message checksum mismatch (corrupt)"},
		/* a frame that starts and never ends: the receive bound (10 s) */
		{1087, "native agent message payload cut short (16 bytes expected)"},
	};
	struct cuip_native_proc v[1];
	char err[512] = "";

	ck_assert_int_eq(cuip_native_open(stub(), err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		pid_t agent = cuip_agent_pid();

		procs(v, 1, cases[i].pid);
		ck_assert_int_eq(cuip_native_lock_all(v, 1, 1000, err, sizeof(err)), -EIO);
		ck_assert_msg(strstr(err, "cuCheckpointProcessLock(pid") != NULL, "%s", err);
		ck_assert_msg(strstr(err, "was stopped: its answer to 1 driver call(s) cannot be read: ") != NULL, "%s",
			      err);
		ck_assert_msg(strstr(err, cases[i].why) != NULL, "%s", err);
		assert_reaped(agent);
		/* a fresh agent read the state back: its own stub, nothing locked */
		ck_assert_int_gt(cuip_agent_pid(), 0);
		ck_assert_int_ne(cuip_agent_pid(), agent);
		ck_assert(!v[0].locked);
	}
	procs(v, 1, 1001);
	ck_assert_int_eq(cuip_native_lock_all(v, 1, 1000, err, sizeof(err)), 0);
	ck_assert(v[0].locked);
	cuip_native_close();
	ck_assert_int_eq(count_tasks(getpid()), 1);
}
END_TEST

START_TEST(missing_driver_or_checkpoint_api_is_refused_clearly)
{
	char err[512] = "";

	ck_assert_int_eq(cuip_native_open("/nonexistent/libcuda.so.1", err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "cannot load the CUDA driver /nonexistent/libcuda.so.1") != NULL, "%s", err);
	ck_assert_int_eq(cuip_agent_pid(), 0);
	ck_assert_int_eq(cuip_native_open("libc.so.6", err, sizeof(err)), -ENOTSUP);
	ck_assert_str_eq(err,
			 "the CUDA driver libc.so.6 has no cuCheckpointProcess* API (driver r555 or newer is needed)");
	ck_assert_int_eq(cuip_agent_pid(), 0);
	ck_assert(!cuip_native_available());
	ck_assert_int_eq(count_tasks(getpid()), 1);
}
END_TEST

Suite *agent_suite(void);

Suite *agent_suite(void)
{
	Suite *s = suite_create("agent");
	TCase *t = tcase_create("native agent");

	tcase_set_timeout(t, 40);
	tcase_add_test(t, driver_calls_run_in_parallel_in_a_child_that_is_reaped);
	tcase_add_test(t, failures_name_the_call_the_pid_and_the_cuda_error);
	tcase_add_test(t, a_dead_agent_is_reaped_reported_and_replaced);
	tcase_add_test(t, a_reply_this_build_cannot_read_stops_the_agent);
	tcase_add_test(t, missing_driver_or_checkpoint_api_is_refused_clearly);
	suite_add_tcase(s, t);
	return s;
}
