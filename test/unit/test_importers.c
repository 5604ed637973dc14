/*
 * test_importers.c - the creator's record of who fetched its memory
 * (protocol/importers.c): deduplication, the bound, undoing a record whose
 * reply was not sent, forgetting the gone (exited, zombie, reused pid) and
 * reading /proc/PID/stat. Single-threaded;
 * forks short-lived children for the /proc cases.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "importers.h"
#include "procstat.h"

/* alive() stand-in: every pid below 1000 is alive, the rest gone */
static int calls;
static int alive_below_1000(const struct cuip_importer *p)
{
	calls++;
	return p->pid < 1000;
}

static struct cuip_importer im(pid_t pid, uint64_t start, uint64_t id)
{
	return (struct cuip_importer){.pid = pid, .start = start, .id = id, .uid = 0};
}

START_TEST(the_same_process_is_recorded_once)
{
	struct cuip_importers s = {0};
	struct cuip_importer a = im(10, 500, 0xa), b = im(11, 501, 0xb);

	ck_assert_int_eq(cuip_importers_add(&s, &a, alive_below_1000), 1);
	ck_assert_int_eq(cuip_importers_add(&s, &a, alive_below_1000), 0);
	ck_assert_int_eq(cuip_importers_add(&s, &b, alive_below_1000), 1);
	ck_assert_int_eq(cuip_importers_add(&s, &a, alive_below_1000), 0);
	ck_assert_uint_eq(s.n, 2);
	ck_assert_int_eq(s.e[0].pid, 10);
	ck_assert_int_eq(s.e[1].pid, 11);
	/* invisible pids (0) are told apart by identity only */
	struct cuip_importer x = im(0, 0, 0x77), y = im(0, 0, 0x78);
	ck_assert_int_eq(cuip_importers_add(&s, &x, alive_below_1000), 1);
	ck_assert_int_eq(cuip_importers_add(&s, &x, alive_below_1000), 0);
	ck_assert_int_eq(cuip_importers_add(&s, &y, alive_below_1000), 1);
	ck_assert_uint_eq(s.n, 4);
	ck_assert_uint_eq(s.dropped, 0);
	cuip_importers_free(&s);
	ck_assert_uint_eq(s.n, 0);
	ck_assert_ptr_null(s.e);
}
END_TEST

START_TEST(a_reused_pid_replaces_the_exited_process)
{
	struct cuip_importers s = {0};
	struct cuip_importer old = im(42, 100, 0xa), reused = im(42, 900, 0xc);

	ck_assert_int_eq(cuip_importers_add(&s, &old, alive_below_1000), 1);
	ck_assert_int_eq(cuip_importers_add(&s, &reused, alive_below_1000), 1);
	ck_assert_uint_eq(s.n, 1);
	ck_assert_uint_eq(s.e[0].start, 900);
	ck_assert_uint_eq(s.e[0].id, 0xc);
	cuip_importers_free(&s);
}
END_TEST

START_TEST(the_bound_forgets_the_dead_first_then_counts_the_overflow)
{
	struct cuip_importers s = {0};
	struct cuip_importer p;

	/* half gone (pid >= 1000), half alive */
	for (int i = 0; i < CUIP_IMPORTERS_MAX; i++) {
		p = im(i % 2 ? 1000 + i : 1 + i, 7, 0);
		ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), 1);
	}
	ck_assert_uint_eq(s.n, CUIP_IMPORTERS_MAX);
	ck_assert_uint_le(s.cap, CUIP_IMPORTERS_MAX);
	calls = 0;
	p = im(500, 7, 0);
	ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), 1);
	ck_assert_int_eq(calls, CUIP_IMPORTERS_MAX); /* a full set is pruned once */
	ck_assert_uint_eq(s.n, CUIP_IMPORTERS_MAX / 2 + 1);
	/* fill up with live ones: the next is not recorded, only counted */
	for (int i = 0; s.n < CUIP_IMPORTERS_MAX; i++) {
		p = im(600 + i, 7, 0);
		ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), 1);
	}
	p = im(999, 7, 0);
	ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), -ENOSPC);
	ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), -ENOSPC);
	ck_assert_uint_eq(s.dropped, 2);
	ck_assert_uint_eq(s.n, CUIP_IMPORTERS_MAX);
	/* one already recorded is still "already there", not dropped */
	p = im(600, 7, 0);
	ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), 0);
	ck_assert_uint_eq(s.dropped, 2);
	cuip_importers_free(&s);
}
END_TEST

/* A fetch whose reply was not sent takes back exactly what its add did. */
START_TEST(undo_takes_back_exactly_what_the_add_did)
{
	struct cuip_importers s = {0};
	struct cuip_importer a = im(10, 500, 0xa), b = im(11, 501, 0xb), c = im(12, 502, 0xc), p;
	int ra, rb, rc;

	ck_assert_int_eq(cuip_importers_add(&s, &a, alive_below_1000), 1);
	ck_assert_int_eq(ra = cuip_importers_add(&s, &b, alive_below_1000), 1);
	ck_assert_int_eq(cuip_importers_add(&s, &c, alive_below_1000), 1);
	/* added: forgotten, the others keep their order */
	cuip_importers_undo(&s, &b, ra);
	ck_assert_uint_eq(s.n, 2);
	ck_assert_int_eq(s.e[0].pid, 10);
	ck_assert_int_eq(s.e[1].pid, 12);
	/* already there before: another fetch of it got the memory, kept */
	ck_assert_int_eq(rc = cuip_importers_add(&s, &c, alive_below_1000), 0);
	cuip_importers_undo(&s, &c, rc);
	ck_assert_uint_eq(s.n, 2);
	ck_assert_int_eq(s.e[1].pid, 12);
	/* undoing one that is no longer there (pruned meanwhile) changes nothing */
	cuip_importers_undo(&s, &b, 1);
	ck_assert_uint_eq(s.n, 2);
	/* not recorded (full): the overflow count goes back */
	for (int i = 0; s.n < CUIP_IMPORTERS_MAX; i++) {
		p = im(100 + i, 7, 0);
		ck_assert_int_eq(cuip_importers_add(&s, &p, alive_below_1000), 1);
	}
	ck_assert_int_eq(rb = cuip_importers_add(&s, &b, alive_below_1000), -ENOSPC);
	ck_assert_int_eq(cuip_importers_add(&s, &b, alive_below_1000), -ENOSPC);
	ck_assert_uint_eq(s.dropped, 2);
	cuip_importers_undo(&s, &b, rb);
	ck_assert_uint_eq(s.dropped, 1);
	ck_assert_uint_eq(s.n, CUIP_IMPORTERS_MAX);
	cuip_importers_free(&s);
}
END_TEST

static int unknown(const struct cuip_importer *p)
{
	return p->pid == 5 ? -1 : 0;
}

START_TEST(prune_forgets_the_gone_and_keeps_what_it_cannot_tell)
{
	struct cuip_importers s = {0};
	struct cuip_importer a = im(5, 1, 0), b = im(6, 1, 0), c = im(7, 1, 0);

	cuip_importers_add(&s, &a, unknown);
	cuip_importers_add(&s, &b, unknown);
	cuip_importers_add(&s, &c, unknown);
	cuip_importers_prune(&s, unknown);
	ck_assert_uint_eq(s.n, 1);
	ck_assert_int_eq(s.e[0].pid, 5);
	cuip_importers_free(&s);
}
END_TEST

START_TEST(proc_stat_start_tells_exited_zombie_and_reused_processes)
{
	struct cuip_importer p = {0};
	uint64_t start = 0, again = 0;
	char state = 0;
	pid_t kid;
	int st;

	ck_assert_int_eq(cuip_proc_is_ours(), 1);
	ck_assert_int_eq(cuip_proc_stat_start(getpid(), &start, &state), 0);
	ck_assert_uint_gt(start, 0);
	ck_assert(state == 'R' || state == 'S');
	ck_assert_int_eq(cuip_proc_stat_start(getpid(), &again, NULL), 0);
	ck_assert_uint_eq(start, again);
	p = im(getpid(), start, 0);
	ck_assert_int_eq(cuip_importer_alive(&p), 1);
	/* the same pid started at another time: a reused pid, gone */
	p.start = start + 1;
	ck_assert_int_eq(cuip_importer_alive(&p), 0);
	/* invisible from our pid namespace: cannot tell */
	p = im(0, 0, 0x1);
	ck_assert_int_eq(cuip_importer_alive(&p), -1);

	kid = fork();
	ck_assert_int_ge(kid, 0);
	if (kid == 0)
		_exit(0);
	/* a zombie holds no memory any more */
	for (int i = 0; i < 1000; i++) {
		if (cuip_proc_stat_start(kid, &start, &state) == 0 && state == 'Z')
			break;
		usleep(10000);
	}
	ck_assert_int_eq(state, 'Z');
	p = im(kid, start, 0);
	ck_assert_int_eq(cuip_importer_alive(&p), 0);
	ck_assert_int_eq(waitpid(kid, &st, 0), kid);
	ck_assert_int_eq(cuip_proc_stat_start(kid, &start, &state), -ENOENT);
	ck_assert_int_eq(cuip_importer_alive(&p), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("importers");
	TCase *tc = tcase_create("importers");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, the_same_process_is_recorded_once);
	tcase_add_test(tc, a_reused_pid_replaces_the_exited_process);
	tcase_add_test(tc, the_bound_forgets_the_dead_first_then_counts_the_overflow);
	tcase_add_test(tc, undo_takes_back_exactly_what_the_add_did);
	tcase_add_test(tc, prune_forgets_the_gone_and_keeps_what_it_cannot_tell);
	tcase_add_test(tc, proc_stat_start_tells_exited_zombie_and_reused_processes);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
