/*
 * check_coord.c - the coordinator against fake participant servers
 * (participants.h: threads of this test speaking the control protocol on
 * real unix sockets, or a child process with its own /proc/PID/io): phase
 * order, barriers, stop at the first failure, rollback, bytes checks, the
 * restore-side rebuild order, and the stall bound of the data phases.
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include "client.h"
#include "coord.h"
#include "criulog.h"
#include "fixtures.h"
#include "images.h"
#include "importers.h"
#include "participants.h"
#include "procstat.h"

START_TEST(dump_runs_every_phase_in_order_on_every_participant)
{
	/* INSPECT again once quiesced: SAVE goes by the records the closed gate froze. */
	static const char *creator[] = {"HANDSHAKE",	     "INSPECT", "QUIESCE",	   "INSPECT",
					"PREPARE_MULTICAST", "SAVE",	"PREPARE_UNICAST", "BYE"};
	static const char *importer[] = {"HANDSHAKE",	      "INSPECT",	 "QUIESCE", "INSPECT",
					 "PREPARE_MULTICAST", "PREPARE_UNICAST", "BYE"};
	struct cuip_ckpt c;
	char err[256];

	group_of(3);
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	assert_log(0, creator, 8);
	assert_log(1, importer, 7);
	assert_log(2, importer, 7);
	ck_assert_uint_eq(g.carried_bytes, 3 * 4096 + 17 + 8192);
	/* every connection closed */
	for (size_t i = 0; i < g.n; i++)
		ck_assert_int_eq(g.p[i].fd, -1);
	/* the images read back and the carrier bytes check out */
	ck_assert_int_eq(cuip_images_read(g.imgdir, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.n, 3);
	ck_assert_uint_eq(c.topo[0]->n_carriers, 2);
	ck_assert_int_eq(cuip_images_verify_carriers(g.imgdir, &c, err, sizeof(err)), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

START_TEST(a_participant_holding_its_reply_blocks_everyones_next_phase)
{
	group_of(3);
	fk[1].delay_on = "QUIESCE";
	fk[1].delay_ms = 300;
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	int held = ev_first(1, "REP QUIESCE");
	int next = ev_first(-1, "REQ PREPARE_MULTICAST");
	ck_assert_int_ge(held, 0);
	ck_assert_int_gt(next, held);
	/* and the same for SAVE -> PREPARE_UNICAST */
	ck_assert_int_gt(ev_first(-1, "REQ PREPARE_UNICAST"), ev_last(0, "REP SAVE"));
	group_done();
}
END_TEST

START_TEST(dump_stops_at_the_first_failing_participant_and_reopens_the_gates)
{
	group_of(3);
	fk[2].fail_on = "PREPARE_MULTICAST";
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert_ptr_nonnull(strstr(g.err, "PREPARE_MULTICAST failed on pid"));
	ck_assert_ptr_nonnull(strstr(g.err, "injected failure"));
	ck_assert_int_lt(ev_first(-1, "REQ SAVE"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ LOAD"), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_ge(ev_first(i, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(failure_after_teardown_rebuilds_from_the_saved_bytes)
{
	group_of(3);
	fk[2].fail_on = "PREPARE_UNICAST";
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	/* the creator reloads its bytes; everyone rebuilds, creators first */
	ck_assert_int_ge(ev_first(0, "REQ LOAD"), 0);
	ck_assert_int_lt(ev_first(1, "REQ LOAD"), 0);
	int last_creators = ev_last(-1, "REP REBUILD1");
	int first_importers = ev_first(-1, "REQ REBUILD2");
	ck_assert_int_ge(last_creators, 0);
	ck_assert_int_gt(first_importers, last_creators);
	ck_assert_int_gt(ev_first(-1, "REQ VERIFY"), ev_last(-1, "REP REBUILD2"));
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_first(i, "REQ RESUME"), ev_last(-1, "REP VERIFY"));
	group_done();
}
END_TEST

/* A second rollback over a rebuild that died half-way (the guardian's,
 * after criu died in its own): participants say RESTORING, their LOAD ran;
 * it goes on from REBUILD, never LOADs twice. */
START_TEST(a_rollback_over_a_half_done_rebuild_does_not_load_again)
{
	int loads;

	group_of(3);
	fk[2].fail_on = "PREPARE_UNICAST";
	fk[1].fail_on = "REBUILD2"; /* the first rollback dies in REBUILD_IMPORTERS */
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert(g.rollback_failed);
	ck_assert_int_ge(ev_first(0, "REQ LOAD"), 0);
	loads = ev_last(0, "REQ LOAD");
	fk[1].fail_on = NULL;
	fk[2].fail_on = NULL;
	ck_assert_int_eq(cuip_group_rollback(&g), 0);
	ck_assert_int_eq(ev_last(0, "REQ LOAD"), loads);
	/* rollbacks of the running job: never "restored" */
	ck_assert_int_gt(fk[0].in_place + fk[1].in_place, 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fk[i].restored, 0);
	ck_assert_int_eq(fk[0].sync_loads, 0);
	ck_assert_int_gt(ev_last(1, "REQ REBUILD2"), loads);
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_last(i, "REQ RESUME"), ev_last(-1, "REP VERIFY"));
	group_done();
}
END_TEST

START_TEST(save_moving_fewer_bytes_than_expected_is_refused)
{
	group_of(2);
	fk[0].save_short = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert_ptr_nonnull(strstr(g.err, "SAVE failed"));
	ck_assert_ptr_nonnull(strstr(g.err, "expected"));
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_ge(ev_first(1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(save_reply_with_an_extent_beyond_its_files_is_refused)
{
	group_of(2);
	fk[0].bad_extent = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPROTO);
	ck_assert_msg(strstr(g.err, "with an extent in file 7 of 1"), "%s", g.err);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_ge(ev_first(1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(save_reply_whose_extents_miss_a_byte_is_refused)
{
	group_of(2);
	fk[0].bad_extent = 2;
	ck_assert_int_eq(cuip_group_dump(&g), -EPROTO);
	ck_assert_msg(strstr(g.err, "whose extents hold"), "%s", g.err);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	group_done();
}
END_TEST

START_TEST(preflight_refusal_changes_nothing)
{
	group_of(2);
	fk[1].fx.counters.has_raw_imports = 1;
	fk[1].fx.counters.raw_imports = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPERM);
	ck_assert_ptr_nonnull(strstr(g.err, "raw"));
	ck_assert_int_lt(ev_first(-1, "REQ QUIESCE"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(restore_rebuilds_creators_before_importers_then_verifies_and_resumes)
{
	static const char *creator[] = {"HANDSHAKE", "LOAD", "REBUILD1", "REBUILD2", "VERIFY", "RESUME", "BYE"};
	static const char *importer[] = {"HANDSHAKE", "REBUILD1", "REBUILD2", "VERIFY", "RESUME", "BYE"};
	struct cuip_ckpt c;
	char err[256];

	group_of(3);
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	ck_assert_int_eq(cuip_images_read(g.imgdir, &c, err, sizeof(err)), 0);
	for (int i = 0; i < 3; i++) {
		fk[i].nlog = 0;
		fk[i].restored = fk[i].in_place = fk[i].sync_loads = 0;
	}
	nev = 0;
	opts.load_sync = 1;
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), 0);
	opts.load_sync = 0;
	assert_log(0, creator, 7);
	assert_log(1, importer, 6);
	assert_log(2, importer, 6);
	/* A restore from images says so in every LOAD and REBUILD (the
	 * interposer holds its log until RESUME), and passes the copy mode. */
	ck_assert_int_eq(fk[0].restored, 3);
	ck_assert_int_eq(fk[1].restored, 2);
	ck_assert_int_eq(fk[2].restored, 2);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fk[i].in_place, 0);
	ck_assert_int_eq(fk[0].sync_loads, 1);
	ck_assert_int_gt(ev_first(-1, "REQ REBUILD2"), ev_last(-1, "REP REBUILD1"));
	ck_assert_int_gt(ev_first(-1, "REQ REBUILD1"), ev_last(-1, "REP LOAD"));

	/* a different process answering at a checkpointed pid is refused */
	fk[2].fx.self.id = 0xdead;
	nev = 0;
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ESRCH);
	ck_assert_ptr_nonnull(strstr(g.err, "identity"));
	ck_assert_int_lt(ev_first(-1, "REQ LOAD"), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

START_TEST(an_importer_outside_the_group_refuses_the_dump)
{
	uint64_t start = 0;
	char want[160];
	pid_t kid;
	int st;

	/* a live process outside the group fetched the creator's allocation
	 * 1 (the creator recorded it): refused before QUIESCE, naming both */
	kid = fork();
	ck_assert_int_ge(kid, 0);
	if (kid == 0) {
		pause();
		_exit(0);
	}
	ck_assert_int_eq(cuip_proc_stat_start(kid, &start, NULL), 0);
	group_of(2);
	fx_importer(&fk[0].fx, 0, 0xa1, kid, start);
	/* the group is the creator alone */
	g.n = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPERM);
	snprintf(want, sizeof(want), "pid %d allocation c0:1 is imported by pid %d (identity 00000000000000a1)",
		 (int)getpid(), (int)kid);
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_ptr_nonnull(strstr(g.err, "outside the dumped tree"));
	ck_assert_int_lt(ev_first(-1, "REQ QUIESCE"), 0);
	/* an importer that exited before the dump does not block it */
	ck_assert_int_eq(kill(kid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(kid, &st, 0), kid);
	nev = 0;
	ck_assert_msg(cuip_group_dump(&g) == 0, "%s", g.err);
	g.n = 2;
	fk[0].fx.a[0].n_importers = 0;
	group_done();
}
END_TEST

/* ---- the stall bound of the data phases ----------------------------------- */

/* How long the phase named `timed` took, from its start to its barrier. */
static enum cuip_gphase timed;
static double timed_t0, timed_s = -1;

static int time_phase(struct cuip_group *grp, enum cuip_gphase phase, bool after, int status)
{
	(void)grp;
	(void)status;
	if (phase != timed)
		return 0;
	if (!after)
		timed_t0 = cuip_now();
	else
		timed_s = cuip_now() - timed_t0;
	return 0;
}

/* Dump group_of(n) (the creator's carrier is 3 * 4096 + 17 + 8192 bytes),
 * read its images back and set up the restore: every log cleared, PHASE
 * timed, the stall bound at STALL_MS. */
#define STALL_MS 300
#define CARRIED	 "20497"
static void dumped_for_restore(int n, struct cuip_ckpt *c, enum cuip_gphase phase)
{
	char err[256];

	group_of(n);
	ck_assert_msg(cuip_group_dump(&g) == 0, "%s", g.err);
	ck_assert_int_eq(cuip_images_read(g.imgdir, c, err, sizeof(err)), 0);
	for (int i = 0; i < n; i++)
		fk[i].nlog = 0;
	nev = 0;
	opts.stall_timeout_ms = STALL_MS;
	timed = phase;
	timed_s = -1;
	g.on_phase = time_phase;
}

START_TEST(the_stall_bound_defaults_to_a_minute_and_refuses_a_bad_value)
{
	struct cuip_opts o;
	char err[256];

	unsetenv("CUINTERPOSE_STALL_TIMEOUT_MS");
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_uint_eq(o.stall_timeout_ms, 60000);
	ck_assert_uint_eq(o.data_timeout_ms, 0); /* the total stays unbounded */
	setenv("CUINTERPOSE_STALL_TIMEOUT_MS", "0", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_uint_eq(o.stall_timeout_ms, 0);
	setenv("CUINTERPOSE_STALL_TIMEOUT_MS", "a while", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "CUINTERPOSE_STALL_TIMEOUT_MS=a while: want ms, 0 .. 86400000"), "%s", err);
	unsetenv("CUINTERPOSE_STALL_TIMEOUT_MS");
}
END_TEST

/* The creator (a child process: the coordinator reads its /proc/PID/io)
 * takes LOAD and then neither answers nor reads a byte. */
START_TEST(a_load_that_stops_moving_bytes_fails_within_the_stall_bound)
{
	struct cuip_ckpt c;
	char want[128];

	fk[0].forked = 1;
	fk[0].hang_on = "LOAD";
	dumped_for_restore(2, &c, CUIP_GPHASE_LOAD);
	opts.progress_ms = 0; /* the watchdog does not need the progress lines */
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ETIMEDOUT);
	snprintf(want, sizeof(want), "LOAD failed on pid %d: no progress for 0.3 s in LOAD (", (int)fk[0].child);
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(strstr(g.err, " of " CARRIED " bytes moved)"), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "LOAD took %.3f s", timed_s);
	ck_assert_int_lt(ev_first(-1, "REQ REBUILD1"), 0); /* nothing after the failed phase */
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* The same creator reads on through four stall bounds before it answers:
 * slow, not stalled. */
START_TEST(a_slow_load_that_keeps_moving_bytes_is_not_failed)
{
	struct cuip_ckpt c;

	fk[0].forked = 1;
	fk[0].trickle_on = "LOAD";
	fk[0].trickle_ms = 4 * STALL_MS;
	dumped_for_restore(2, &c, CUIP_GPHASE_LOAD);
	opts.progress_ms = 50; /* progress lines and the watchdog together */
	ck_assert_msg(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo) == 0, "%s", g.err);
	ck_assert_msg(timed_s >= 4 * STALL_MS / 1000.0, "LOAD took %.3f s", timed_s);
	ck_assert_int_ge(ev_first(1, "REP RESUME"), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* REBUILD has no byte count: the bound applies to its replies. */
START_TEST(a_rebuild_without_a_reply_fails_within_the_stall_bound)
{
	struct cuip_ckpt c;
	char want[128];

	dumped_for_restore(3, &c, CUIP_GPHASE_REBUILD_CREATORS);
	fk[1].hang_on = "REBUILD1";
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ETIMEDOUT);
	snprintf(want, sizeof(want),
		 "REBUILD_CREATORS failed on pid %d: no progress for 0.3 s in REBUILD_CREATORS (no reply)",
		 (int)getpid());
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "took %.3f s", timed_s);
	/* the others answered and only the silent one failed */
	ck_assert_int_ge(ev_first(0, "REP REBUILD1"), 0);
	ck_assert_int_ge(ev_first(2, "REP REBUILD1"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ REBUILD2"), 0);
	fk[1].hang_on = NULL;
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* At dump, a SAVE that stalls is a failed SAVE: rolled back, every gate
 * reopened, nothing torn down. */
START_TEST(a_save_that_stops_moving_bytes_fails_and_rolls_the_dump_back)
{
	char want[160];

	group_of(3);
	opts.stall_timeout_ms = STALL_MS;
	timed = CUIP_GPHASE_SAVE;
	timed_s = -1;
	g.on_phase = time_phase;
	fk[0].hang_on = "SAVE";
	ck_assert_int_eq(cuip_group_dump(&g), -ETIMEDOUT);
	snprintf(want, sizeof(want),
		 "SAVE failed on pid %d: no progress for 0.3 s in SAVE (0 of " CARRIED " bytes moved)", (int)getpid());
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "SAVE took %.3f s", timed_s);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_last(i, "REQ RESUME"), ev_first(0, "REQ SAVE"));
	ck_assert(!g.rollback_failed);
	fk[0].hang_on = NULL;
	group_done();
}
END_TEST

Suite *coord_suite(void);

Suite *coord_suite(void)
{
	Suite *s = suite_create("coordinator");
	TCase *t = tcase_create("phases");

	tcase_set_timeout(t, 30);
	tcase_add_checked_fixture(t, fakes_setup, fakes_teardown);
	tcase_add_test(t, dump_runs_every_phase_in_order_on_every_participant);
	tcase_add_test(t, a_participant_holding_its_reply_blocks_everyones_next_phase);
	tcase_add_test(t, dump_stops_at_the_first_failing_participant_and_reopens_the_gates);
	tcase_add_test(t, failure_after_teardown_rebuilds_from_the_saved_bytes);
	tcase_add_test(t, a_rollback_over_a_half_done_rebuild_does_not_load_again);
	tcase_add_test(t, save_moving_fewer_bytes_than_expected_is_refused);
	tcase_add_test(t, save_reply_with_an_extent_beyond_its_files_is_refused);
	tcase_add_test(t, save_reply_whose_extents_miss_a_byte_is_refused);
	tcase_add_test(t, preflight_refusal_changes_nothing);
	tcase_add_test(t, an_importer_outside_the_group_refuses_the_dump);
	tcase_add_test(t, restore_rebuilds_creators_before_importers_then_verifies_and_resumes);
	suite_add_tcase(s, t);

	t = tcase_create("stall bound");
	tcase_set_timeout(t, 30);
	tcase_add_checked_fixture(t, fakes_setup, fakes_teardown);
	tcase_add_test(t, the_stall_bound_defaults_to_a_minute_and_refuses_a_bad_value);
	tcase_add_test(t, a_load_that_stops_moving_bytes_fails_within_the_stall_bound);
	tcase_add_test(t, a_slow_load_that_keeps_moving_bytes_is_not_failed);
	tcase_add_test(t, a_rebuild_without_a_reply_fails_within_the_stall_bound);
	tcase_add_test(t, a_save_that_stops_moving_bytes_fails_and_rolls_the_dump_back);
	suite_add_tcase(s, t);
	return s;
}
