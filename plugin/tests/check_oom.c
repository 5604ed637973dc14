/*
 * check_oom.c - out-of-memory injection over the plugin's coordinator: the
 * coordinator, its preflight and the protocol library under them (the
 * control client, protobuf-c's decoding, the images) are compiled again,
 * for this test only, with test/harness/failalloc.h in front (the n-th
 * allocation fails); the fake participants' threads (participants.c) are
 * exempt, so only the coordinator's own allocations fail. For each path a clean run counts them, then the
 * path runs again with the 1st, the 2nd, ... the last failing. A run that
 * fails must say why, and must leave the job as the coordinator promises:
 * a dump that fails leaves every participant running (rolled back, every
 * gate reopened); a restore that fails resumes no participant before all
 * are rebuilt and verified. Paths: a dump, a restore from its images, a
 * rollback over a rebuild that died.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "failalloc.h"
#include "images.h"
#include "participants.h"

#define GROUP 3

/* The outcome of one armed run, checked against the path's promise. */
typedef int path_fn(void);
typedef void after_fn(int rc);

/* A failed run's error: negative, with a message that does not blame the
 * participants or the bytes for memory that ran out. */
static void assert_said_why(const char *name, unsigned long n, int rc)
{
	ck_assert_msg(rc < 0, "%s: allocation %lu failed: returned %d", name, n, rc);
	ck_assert_msg(g.err[0], "%s: allocation %lu failed: error %d without a message", name, n, rc);
	ck_assert_msg(!strstr(g.err, "corrupt") && !strstr(g.err, "injected"), "%s: allocation %lu: %s", name, n,
		      g.err);
}

/* Every participant runs: its last request was RESUME (or it never left
 * ACTIVE) and its phase is ACTIVE again. */
static void assert_all_running(const char *name, unsigned long n)
{
	for (int i = 0; i < GROUP; i++)
		ck_assert_msg(fk[i].phase == 0 || fk[i].phase == CUIP__PHASE__PHASE_ACTIVE,
			      "%s: allocation %lu: participant %d left in phase %d", name, n, i, fk[i].phase);
}

/*
 * Run setup + fn clean (it must succeed), then with each of fn's
 * allocations failing in turn, each time on fresh participants; after()
 * checks each run's outcome against the path's promise. Returns the clean
 * run's count.
 */
static unsigned long exhaust(const char *name, void (*setup)(void), path_fn *fn, after_fn *after)
{
	unsigned long total, failures = 0;
	int rc;

	fakes_setup();
	setup();
	failalloc_arm(0);
	rc = fn();
	total = failalloc_count();
	ck_assert_msg(rc == 0, "%s, clean: %s", name, g.err);
	ck_assert_msg(total > 0, "%s: no allocation counted: the injection reaches nothing", name);
	after(rc);
	group_done();
	fakes_teardown();
	for (unsigned long n = 1; n <= total; n++) {
		fakes_setup();
		setup();
		failalloc_arm(n);
		rc = fn();
		ck_assert_msg(failalloc_fired(), "%s: allocation %lu of %lu not reached", name, n, total);
		failalloc_arm(0);
		if (rc) {
			assert_said_why(name, n, rc);
			failures++;
		}
		after(rc);
		group_done();
		fakes_teardown();
	}
	ck_assert_msg(failures > 0, "%s: no failed allocation was ever reported", name);
	fprintf(stderr, "%s: %lu allocations, %lu of them reported when they failed\n", name, total, failures);
	return total;
}

/* ---- a dump ---------------------------------------------------------------- */

/* The group with the data phases watched, as by default (the monitor's
 * own allocations are on the path). */
static void group(void)
{
	group_of(GROUP);
	opts.stall_timeout_ms = 60000;
}

static int dump(void)
{
	return cuip_group_dump(&g);
}

/* A dump that failed was rolled back: every participant runs, and one that
 * tore its memory down had it loaded again first (creator 0 carries). */
static void after_dump(int rc)
{
	char err[256];

	if (!rc) {
		struct cuip_ckpt c;

		ck_assert_msg(cuip_images_read(g.imgdir, &c, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(cuip_images_verify_carriers(g.imgdir, &c, err, sizeof(err)) == 0, "%s", err);
		cuip_images_free(&c);
		ck_assert_int_lt(ev_first(-1, "REQ RESUME"), 0);
		return;
	}
	ck_assert_msg(!g.rollback_failed, "dump: the rollback failed: %s", g.err);
	assert_all_running("dump", 0);
	if (ev_first(-1, "REQ PREPARE_UNICAST") >= 0)
		ck_assert_int_gt(ev_last(0, "REQ LOAD"), ev_first(-1, "REQ PREPARE_UNICAST"));
}

START_TEST(a_dump_that_runs_out_of_memory_says_so_and_leaves_the_job_running)
{
	exhaust("dump", group, dump, after_dump);
}
END_TEST

/* ---- a restore --------------------------------------------------------------- */

static struct cuip_ckpt dumped;

/* The group dumped (clean), its images read back, every log cleared: the
 * participants now stand for the restored processes. */
static void dumped_group(void)
{
	char err[256];

	group_of(GROUP);
	ck_assert_msg(cuip_group_dump(&g) == 0, "%s", g.err);
	ck_assert_msg(cuip_images_read(g.imgdir, &dumped, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < GROUP; i++)
		fk[i].nlog = 0;
	nev = 0;
	opts.stall_timeout_ms = 60000;
}

static int restore(void)
{
	return cuip_group_rebuild(&g, (const Cuip__Topology *const *)dumped.topo);
}

/* A restore that cannot finish resumes no one before every participant
 * is rebuilt and verified (a RESUME whose own answer could not be read may
 * have reached some); one that finished resumed everyone. */
static void after_restore(int rc)
{
	int first_resume = ev_first(-1, "REQ RESUME");

	if (rc && first_resume >= 0)
		for (int i = 0; i < GROUP; i++) {
			int verified = ev_first(i, "REP VERIFY");

			ck_assert_msg(verified >= 0 && verified < first_resume,
				      "restore failed (%s), yet a participant was resumed before %d was verified",
				      g.err, i);
		}
	if (!rc)
		for (int i = 0; i < GROUP; i++)
			ck_assert_int_ge(ev_first(i, "REP RESUME"), 0);
	cuip_images_free(&dumped);
}

START_TEST(a_restore_that_runs_out_of_memory_resumes_no_one_half_built)
{
	exhaust("restore", dumped_group, restore, after_restore);
}
END_TEST

/* ---- a rollback ---------------------------------------------------------------- */

/* A dump whose rollback died in REBUILD_IMPORTERS (participant 1 refused
 * it): the job waits, torn down, for the guardian's rollback. */
static void rollback_pending(void)
{
	group();
	fk[2].fail_on = "PREPARE_UNICAST";
	fk[1].fail_on = "REBUILD2";
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert(g.rollback_failed);
	fk[1].fail_on = NULL;
	fk[2].fail_on = NULL;
	g.err[0] = 0;
}

static int rollback(void)
{
	return cuip_group_rollback(&g);
}

/* A rollback that failed says so and can be run again; the second one
 * leaves every participant running. */
static void after_rollback(int rc)
{
	if (rc) {
		ck_assert(g.rollback_failed);
		ck_assert_msg(cuip_group_rollback(&g) == 0, "rollback after the failed one: %s", g.err);
	}
	ck_assert(!g.rollback_failed);
	assert_all_running("rollback", 0);
}

START_TEST(a_rollback_that_runs_out_of_memory_can_be_run_again)
{
	exhaust("rollback", rollback_pending, rollback, after_rollback);
}
END_TEST

int main(void)
{
	fake_thread_start = failalloc_exempt_thread;
	Suite *s = suite_create("coordinator out of memory");
	TCase *t = tcase_create("each allocation fails in turn");
	SRunner *sr;
	int failed;

	tcase_set_timeout(t, 120);
	tcase_add_test(t, a_dump_that_runs_out_of_memory_says_so_and_leaves_the_job_running);
	tcase_add_test(t, a_restore_that_runs_out_of_memory_resumes_no_one_half_built);
	tcase_add_test(t, a_rollback_that_runs_out_of_memory_can_be_run_again);
	suite_add_tcase(s, t);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
