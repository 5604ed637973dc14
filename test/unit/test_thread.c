/*
 * test_thread.c - the interposer's own threads (interposer/core/thread.c,
 * compiled here with test/harness/failalloc.h in front): a thread runs
 * named and with every signal blocked; deadlines; the worker's rounds,
 * results, messages, the caller's timeout while the round finishes on its
 * own, a thread that cannot start (out of memory) and the worker after it,
 * and a fork child's reset.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "failalloc.h"
#include "thread.h"
#include "waitchild.h"

/* ---- named threads -------------------------------------------------------- */

static char seen_name[16];
static int seen_blocked;
static sem_t ran;

static void *probe(void *arg)
{
	sigset_t cur;

	(void)arg;
	pthread_getname_np(pthread_self(), seen_name, sizeof(seen_name));
	pthread_sigmask(SIG_SETMASK, NULL, &cur);
	seen_blocked = sigismember(&cur, SIGINT) && sigismember(&cur, SIGTERM) && sigismember(&cur, SIGUSR1);
	sem_post(&ran);
	return NULL;
}

static void wait_ran(void)
{
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	ck_assert_msg(sem_timedwait(&ran, &dl) == 0, "the thread did not run within 10 s");
}

START_TEST(a_thread_runs_named_with_every_signal_blocked)
{
	sem_init(&ran, 0, 0);
	ck_assert_int_eq(cuip_thread_start(probe, NULL, "cuip-probe", 0), 0);
	wait_ran();
	ck_assert_str_eq(seen_name, "cuip-probe"); /* named before it ran */
	ck_assert_int_eq(seen_blocked, 1);
	/* The caller's own mask is as it was. */
	sigset_t cur;
	pthread_sigmask(SIG_SETMASK, NULL, &cur);
	ck_assert(!sigismember(&cur, SIGUSR1));
}
END_TEST

START_TEST(a_thread_that_cannot_start_says_so_and_never_runs)
{
	struct timespec dl;

	sem_init(&ran, 0, 0);
	failalloc_arm(1);
	ck_assert_int_eq(cuip_thread_start(probe, NULL, "cuip-probe", 0), -ENOMEM);
	ck_assert(failalloc_fired());
	failalloc_arm(0);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_nsec += 200 * 1000000L;
	if (dl.tv_nsec >= 1000000000L)
		dl.tv_sec++, dl.tv_nsec -= 1000000000L;
	ck_assert_int_eq(sem_timedwait(&ran, &dl), -1);
	ck_assert_int_eq(errno, ETIMEDOUT);
}
END_TEST

START_TEST(a_deadline_is_now_plus_the_milliseconds_on_the_monotonic_clock)
{
	struct timespec now, dl;

	for (unsigned ms = 0; ms < 3000; ms += 999) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		cuip_deadline_ms(&dl, ms);
		ck_assert_int_lt(dl.tv_nsec, 1000000000L);
		ck_assert_int_ge(dl.tv_nsec, 0);
		double d = (double)(dl.tv_sec - now.tv_sec) + (double)(dl.tv_nsec - now.tv_nsec) / 1e9;
		ck_assert_msg(d >= ms / 1000.0 && d < ms / 1000.0 + 0.5, "deadline %.3f s for %u ms", d, ms);
	}
}
END_TEST

/* ---- the worker ------------------------------------------------------------- */

static atomic_int rounds, fail_next, sleep_ms;

static int work(char *msg, size_t len)
{
	int ms = atomic_load(&sleep_ms);

	if (ms)
		usleep((useconds_t)ms * 1000);
	atomic_fetch_add(&rounds, 1);
	if (atomic_exchange(&fail_next, 0)) {
		snprintf(msg, len, "round %d failed on purpose", atomic_load(&rounds));
		return -EIO;
	}
	return 0;
}

static struct cuip_worker wk = CUIP_WORKER_INIT("cuip-test-wk", work, 0);

/* Wait (at most 10 s) until the worker has no round running. */
static void wait_idle(void)
{
	for (int i = 0; i < 1000 && cuip_worker_busy(&wk); i++)
		usleep(10000);
	ck_assert_msg(!cuip_worker_busy(&wk), "the worker's round did not end within 10 s");
}

START_TEST(a_worker_runs_a_round_and_returns_its_result_and_message)
{
	char msg[256];

	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), 0);
	ck_assert_int_eq(rounds, 1);
	ck_assert_str_eq(msg, "");
	fail_next = 1;
	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), -EIO);
	ck_assert_str_eq(msg, "round 2 failed on purpose");
	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), 0);
	ck_assert_str_eq(msg, "");
	ck_assert_int_eq(rounds, 3);
}
END_TEST

START_TEST(a_caller_past_its_timeout_returns_while_the_round_finishes)
{
	char msg[256];

	sleep_ms = 3000; /* far past the caller's 50 ms, even on a loaded machine */
	ck_assert_int_eq(cuip_worker_run(&wk, 50, msg, sizeof(msg)), -ETIMEDOUT);
	ck_assert_str_eq(msg, "");
	ck_assert(cuip_worker_busy(&wk));
	ck_assert_int_eq(rounds, 0);
	wait_idle();
	ck_assert_int_eq(rounds, 1);
	sleep_ms = 0;
	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), 0);
	ck_assert_int_eq(rounds, 2);
}
END_TEST

START_TEST(a_worker_whose_thread_cannot_start_fails_the_round_and_runs_the_next)
{
	char msg[256];

	failalloc_arm(1);
	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), -ENOMEM);
	failalloc_arm(0);
	ck_assert_str_eq(msg, "cannot start the cuip-test-wk thread: Cannot allocate memory");
	ck_assert(!cuip_worker_busy(&wk));
	ck_assert_int_eq(rounds, 0);
	ck_assert_int_eq(cuip_worker_run(&wk, 10000, msg, sizeof(msg)), 0);
	ck_assert_int_eq(rounds, 1);
}
END_TEST

START_TEST(a_fork_child_resets_the_worker_and_runs_rounds_of_its_own)
{
	char msg[256];
	int st = -1;
	pid_t child;

	/* The parent's thread is busy in a round when the child is forked. */
	sleep_ms = 2000;
	ck_assert_int_eq(cuip_worker_run(&wk, 10, msg, sizeof(msg)), -ETIMEDOUT);
	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		int before = rounds; /* the parent's round may have ended already */

		cuip_worker_fork_child(&wk);
		sleep_ms = 0;
		if (cuip_worker_busy(&wk))
			_exit(2);
		_exit(cuip_worker_run(&wk, 10000, msg, sizeof(msg)) == 0 && rounds == before + 1 ? 0 : 3);
	}
	st = waitchild(child, 15000);
	ck_assert_msg(st == 0, "child: status %d (%d: hung)", st, WAITCHILD_TIMEOUT);
	wait_idle();
	ck_assert_int_eq(rounds, 1);
}
END_TEST

/* A kept worker: every round on one thread, which stays between rounds
 * (named, waiting) and takes the next request at once. */
static atomic_long round_tid;

static int kept_work(char *msg, size_t len)
{
	(void)msg;
	(void)len;
	atomic_store(&round_tid, (long)syscall(SYS_gettid));
	atomic_fetch_add(&rounds, 1);
	return 0;
}

static struct cuip_worker kept = CUIP_WORKER_INIT_KEPT("cuip-test-kept", kept_work, 0);

/* Threads of this process named name. */
static int threads_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		char path[300], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, name, strlen(name)) && comm[strlen(name)] == '\n')
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

START_TEST(a_kept_worker_runs_every_round_on_one_thread_that_stays)
{
	char msg[256];
	long first;

	ck_assert_int_eq(cuip_worker_run(&kept, 10000, msg, sizeof(msg)), 0);
	first = atomic_load(&round_tid);
	ck_assert_int_gt(first, 0);
	ck_assert_int_ne(first, (long)syscall(SYS_gettid));
	/* between rounds the thread is there, waiting */
	usleep(100000);
	ck_assert_int_eq(threads_named("cuip-test-kept"), 1);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(cuip_worker_run(&kept, 10000, msg, sizeof(msg)), 0);
		ck_assert_int_eq(atomic_load(&round_tid), first);
	}
	ck_assert_int_eq(rounds, 4);
	ck_assert_int_eq(threads_named("cuip-test-kept"), 1);
	ck_assert(!cuip_worker_busy(&kept));
}
END_TEST

static void reset(void)
{
	rounds = fail_next = sleep_ms = 0;
}

int main(void)
{
	Suite *s = suite_create("thread");
	TCase *t = tcase_create("threads");
	SRunner *sr;
	int failed;

	tcase_set_timeout(t, 60);
	tcase_add_checked_fixture(t, reset, NULL);
	tcase_add_test(t, a_thread_runs_named_with_every_signal_blocked);
	tcase_add_test(t, a_thread_that_cannot_start_says_so_and_never_runs);
	tcase_add_test(t, a_deadline_is_now_plus_the_milliseconds_on_the_monotonic_clock);
	tcase_add_test(t, a_worker_runs_a_round_and_returns_its_result_and_message);
	tcase_add_test(t, a_caller_past_its_timeout_returns_while_the_round_finishes);
	tcase_add_test(t, a_worker_whose_thread_cannot_start_fails_the_round_and_runs_the_next);
	tcase_add_test(t, a_fork_child_resets_the_worker_and_runs_rounds_of_its_own);
	tcase_add_test(t, a_kept_worker_runs_every_round_on_one_thread_that_stays);
	suite_add_tcase(s, t);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK); /* each test a fresh process: wk and its thread are per test */
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
