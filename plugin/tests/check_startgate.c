/*
 * check_startgate.c - the plugin's half of the start gate and the start
 * marker (protocol/startmark.h) against this very process: a file named
 * like the interposer mapped here stands for the library, a memfd named
 * like the marker for the marker page; a child holds the gate exclusively
 * as a process marking STARTING would. Also which /dev/shm files need
 * criu's --link-remap.
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "startmark.h"
#include "proc.h"
#include "startgate.h"
#include "../../test/tmpname.h"

static char lib[64];
static void *libmap;
static struct cuip_mark *mark;

static void setup(void)
{
	int fd;

	{
		char name[64];

		snprintf(name, sizeof(name), "libcuinterpose.so-gate.%d", (int)getpid());
		test_tmpname(lib, sizeof(lib), name);
	}
	fd = open(lib, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	libmap = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(libmap, MAP_FAILED);
	close(fd);
}

static void teardown(void)
{
	cuip_startgate_release();
	munmap(libmap, 4096);
	unlink(lib);
	if (mark)
		munmap(mark, 4096);
	mark = NULL;
}

static void mark_map(uint32_t state, int32_t err)
{
	if (!mark) {
		int fd = memfd_create(CUIP_MARK_NAME, MFD_CLOEXEC);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(ftruncate(fd, 4096), 0);
		mark = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		ck_assert_ptr_ne(mark, MAP_FAILED);
		close(fd);
	}
	mark->magic = CUIP_MARK_MAGIC;
	mark->pid = getpid();
	mark->err = err;
	mark->state = state;
}

START_TEST(gate_is_held_shared_once_per_library_file)
{
	char err[512] = "";

	ck_assert_int_eq(cuip_startgate_hold(getpid(), 1000, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_startgate_hold(getpid(), 1000, err, sizeof(err)), 0);
	ck_assert_uint_eq(cuip_startgate_held(), 1);
	/* A process passing the gate (LOCK_EX) now waits: the lock is held. */
	int fd = open(lib, O_RDONLY | O_CLOEXEC);
	ck_assert_int_lt(flock(fd, LOCK_EX | LOCK_NB), 0);
	ck_assert_int_eq(errno, EWOULDBLOCK);
	/* Another checkpoint shares it. */
	ck_assert_int_eq(flock(fd, LOCK_SH | LOCK_NB), 0);
	cuip_startgate_release();
	ck_assert_uint_eq(cuip_startgate_held(), 0);
	flock(fd, LOCK_UN);
	ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
	close(fd);
}
END_TEST

START_TEST(gate_held_exclusively_too_long_is_refused_naming_the_pid)
{
	char err[512] = "", c;
	int p[2];
	pid_t kid;

	ck_assert_int_eq(pipe(p), 0);
	kid = fork();
	if (kid == 0) {
		int fd = open(lib, O_RDONLY);
		if (flock(fd, LOCK_EX))
			_exit(1);
		(void)!write(p[1], "x", 1);
		pause();
		_exit(0);
	}
	ck_assert_int_eq(read(p[0], &c, 1), 1);
	ck_assert_int_eq(cuip_startgate_hold(getpid(), 200, err, sizeof(err)), -ETIMEDOUT);
	ck_assert_msg(strstr(err, "stayed locked for 200 ms") && strstr(err, "of pid"), "%s", err);
	ck_assert_uint_eq(cuip_startgate_held(), 0);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	ck_assert_int_eq(cuip_startgate_hold(getpid(), 1000, err, sizeof(err)), 0);
	close(p[0]);
	close(p[1]);
}
END_TEST

START_TEST(gate_of_a_process_without_the_interposer_is_an_error)
{
	char err[512] = "";
	pid_t kid = fork();

	if (kid == 0) {
		munmap(libmap, 4096);
		pause();
		_exit(0);
	}
	for (int i = 0; i < 1000 && cuip_proc_has_interposer(kid) == 1; i++)
		usleep(1000); /* until the child has unmapped it */
	ck_assert_int_eq(cuip_startgate_hold(kid, 200, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "cannot open the interposer library mapped by pid"), "%s", err);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
}
END_TEST

START_TEST(marker_states_are_read_from_the_process)
{
	char err[512] = "";
	int serr = -1;

	ck_assert_int_eq(cuip_proc_start_state(getpid(), &serr), CUIP_MARK_NONE);
	mark_map(CUIP_MARK_STARTED, 0);
	ck_assert_int_eq(cuip_proc_start_state(getpid(), &serr), CUIP_MARK_STARTED);
	ck_assert_int_eq(cuip_startgate_settle(getpid(), 100, &serr, err, sizeof(err)), CUIP_MARK_STARTED);
	mark_map(CUIP_MARK_NOSOCKET, ENAMETOOLONG);
	ck_assert_int_eq(cuip_startgate_settle(getpid(), 100, &serr, err, sizeof(err)), CUIP_MARK_NOSOCKET);
	ck_assert_int_eq(serr, ENAMETOOLONG);
	mark_map(CUIP_MARK_FAILED, 0);
	ck_assert_int_eq(cuip_proc_start_state(getpid(), &serr), CUIP_MARK_FAILED);
	mark->magic = 0x1234;
	ck_assert_int_eq(cuip_startgate_settle(getpid(), 100, &serr, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "cannot read the start marker of pid"), "%s", err);
}
END_TEST

START_TEST(a_process_stuck_starting_cuda_is_refused_after_the_wait)
{
	char err[512] = "";
	int serr;

	mark_map(CUIP_MARK_STARTING, 0);
	ck_assert_int_eq(cuip_startgate_settle(getpid(), 150, &serr, err, sizeof(err)), -ETIMEDOUT);
	ck_assert_msg(strstr(err, "has been starting CUDA (inside its first cuInit) for 150 ms"), "%s", err);
}
END_TEST

START_TEST(a_process_starting_cuda_is_waited_for)
{
	char err[512] = "";
	int serr;
	pid_t kid;

	mark_map(CUIP_MARK_STARTING, 0);
	kid = fork(); /* shares the marker page: finishes "starting" meanwhile */
	if (kid == 0) {
		usleep(50000);
		__atomic_store_n(&mark->state, CUIP_MARK_STARTED, __ATOMIC_RELEASE);
		_exit(0);
	}
	ck_assert_int_eq(cuip_startgate_settle(getpid(), 10000, &serr, err, sizeof(err)), CUIP_MARK_STARTED);
	waitpid(kid, NULL, 0);
}
END_TEST

START_TEST(only_shm_files_living_on_under_another_name_need_link_remap)
{
	char a[64], b[64], first[PATH_MAX];
	void *m;
	int fd;

	snprintf(a, sizeof(a), "/dev/shm/cuip-check-a.%d", (int)getpid());
	snprintf(b, sizeof(b), "/dev/shm/cuip-check-b.%d", (int)getpid());
	fd = open(a, O_RDWR | O_CREAT | O_EXCL, 0600);
	ck_assert_msg(fd >= 0, "%s: %s", a, strerror(errno));
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(m, MAP_FAILED);
	close(fd);
	ck_assert_int_eq(cuip_proc_unlinked_shm(getpid(), first, sizeof(first)), 0);
	/* glibc's sem_open: map a temporary name, link the final one, drop the first */
	ck_assert_int_eq(link(a, b), 0);
	ck_assert_int_eq(unlink(a), 0);
	ck_assert_int_eq(cuip_proc_unlinked_shm(getpid(), first, sizeof(first)), 1);
	ck_assert_msg(!strncmp(first, a, strlen(a)) && strstr(first, " (deleted)"), "%s", first);
	/* no name left: CRIU saves it as a ghost file, no option needed */
	ck_assert_int_eq(unlink(b), 0);
	ck_assert_int_eq(cuip_proc_unlinked_shm(getpid(), first, sizeof(first)), 0);
	munmap(m, 4096);
}
END_TEST

Suite *startgate_suite(void);

Suite *startgate_suite(void)
{
	Suite *s = suite_create("startgate");
	TCase *t = tcase_create("live");

	tcase_add_checked_fixture(t, setup, teardown);
	tcase_set_timeout(t, 20);
	tcase_add_test(t, gate_is_held_shared_once_per_library_file);
	tcase_add_test(t, gate_held_exclusively_too_long_is_refused_naming_the_pid);
	tcase_add_test(t, gate_of_a_process_without_the_interposer_is_an_error);
	tcase_add_test(t, marker_states_are_read_from_the_process);
	tcase_add_test(t, a_process_stuck_starting_cuda_is_refused_after_the_wait);
	tcase_add_test(t, a_process_starting_cuda_is_waited_for);
	tcase_add_test(t, only_shm_files_living_on_under_another_name_need_link_remap);
	suite_add_tcase(s, t);
	return s;
}
