/*
 * check_guardian.c - the guardian's lifecycle without CRIU (a forked child
 * plays criu: it starts the guardian, reports progress, then dies, commits
 * or loses it), the restore guardian's care for processes it did not make,
 * the reading of pstree.img, and the parsing of CUINTERPOSE_TEST_FAULT and
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
#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "guardian.h"
#include "pstree.h"
#include "../../test/tmpname.h"

static char dir[64];
/* fake criu -> test: the guardian's pid (a shared page: fork copies the rest) */
static volatile pid_t *shared_pid;
static pid_t guardian;

static void mkdir_tmp(void)
{
	test_tmpname(dir, sizeof(dir), "cuip-guard.XXXXXX");
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
	if (gp <= 0 || cuip_guardian_phase(&g, cuip_gphase_name(CUIP_GPHASE_QUIESCE), false) ||
	    cuip_guardian_phase(&g, cuip_gphase_name(CUIP_GPHASE_QUIESCE), true))
		_exit(11);
	if (how == COMMIT) {
		cuip_guardian_end("commit: test");
	} else if (how == LOSE) {
		kill(gp, SIGKILL);
		/* not our child (double fork): wait until it is gone */
		for (int i = 0; i < 1000 && kill(gp, 0) == 0; i++)
			usleep(10000);
		ret = cuip_guardian_phase(&g, cuip_gphase_name(CUIP_GPHASE_PREPARE_MULTICAST), false);
		if (ret != -EPIPE || !strstr(g.err, "is gone: refusing to go on with PREPARE_MULTICAST"))
			_exit(12);
		/* reported once; criu's own rollback then runs unhindered */
		if (cuip_guardian_phase(&g, cuip_gphase_name(CUIP_GPHASE_RESUME), false))
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
	ck_assert_str_eq(err, "CUINTERPOSE_GUARDIAN_STOP_MS=soon: want ms, 0 .. 3600000");
	ck_assert_int_eq(cuip_guardian_pid(), 0);
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
}
END_TEST

/*
 * Restore: the images' root pid is held by a process that started before
 * the guardian (an unrelated process that has the pid): when criu dies the
 * guardian says so and leaves it alone.
 */
START_TEST(restore_leaves_unrelated)
{
	struct cuip_pstree_task t = {0};
	char buf[4096], want[128];
	pid_t other = fork(), c;
	int st;

	ck_assert_int_ge(other, 0);
	if (other == 0) {
		pause();
		_exit(0);
	}
	mkdir_tmp();
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	t.pid = other;
	t.ppid = getpid();
	c = fork();
	ck_assert_int_ge(c, 0);
	if (c == 0) {
		struct cuip_pstree img = {.t = &t, .n = 1};
		char err[256];

		if (cuip_guardian_start_restore(&img, open(dir, O_RDONLY | O_DIRECTORY), err, sizeof(err)))
			_exit(10);
		_exit(cuip_guardian_pid() > 0 ? 0 : 11); /* dies before any commit */
	}
	ck_assert_int_eq(waitpid(c, &st, 0), c);
	ck_assert_int_eq(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
	read_log(buf, sizeof(buf), "restored tree killed");
	snprintf(want, sizeof(want), "pid %d (of the images) is not a process of this restore", (int)other);
	ck_assert_msg(strstr(buf, "criu exited (killed or crashed), before the restore's commit point"), "log: %s",
		      buf);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	ck_assert_msg(strstr(buf, "no process of the restored tree exists: nothing to kill"), "log: %s", buf);
	ck_assert_int_eq(kill(other, 0), 0); /* alive */
	kill(other, SIGKILL);
	ck_assert_int_eq(waitpid(other, &st, 0), other);
	rm_tmp();
}
END_TEST

/*
 * Restore into a new pid namespace: fake criu clones the images' root (pid
 * 1 there) itself, and that init forks a helper (pid 2 there) that the
 * images lack, as CRIU's own helpers can be while it restores. Looking at
 * the namespace alone would pass such an init over; the guardian knows it
 * as criu's child, and when criu dies it kills it, and the namespace with
 * it. Unprivileged, a user namespace makes the pid namespace possible.
 */
START_TEST(restore_kills_ns_init_seen_as_child)
{
	struct cuip_pstree_task t = {.pid = 1};
	char buf[4096] = "", want[160];
	int st, fake;
	pid_t c, init, reaped = 0;

	mkdir_tmp();
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	if (!shared_pid) {
		shared_pid = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		ck_assert_ptr_ne((void *)shared_pid, MAP_FAILED);
	}
	*shared_pid = 0;
	/* the init outlives fake criu: it comes back to this process */
	ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	c = fork();
	ck_assert_int_ge(c, 0);
	if (c == 0) {
		struct cuip_pstree img = {.t = &t, .n = 1};
		char err[256];
		pid_t i;

		if (cuip_guardian_start_restore(&img, open(dir, O_RDONLY | O_DIRECTORY), err, sizeof(err)))
			_exit(10);
		if (geteuid() && unshare(CLONE_NEWUSER))
			_exit(11);
		if (unshare(CLONE_NEWPID))
			_exit(12);
		i = fork();
		if (i < 0)
			_exit(13);
		if (i == 0) { /* pid 1 of the new namespace, and a helper at pid 2 */
			if (fork() == 0)
				for (;;)
					pause();
			for (;;)
				pause();
		}
		*shared_pid = i;
		read_log(buf, sizeof(buf), "is pid 1 of a new pid namespace: this restore's tree");
		_exit(strstr(buf, "this restore's tree") ? 0 : 14); /* dies before any commit */
	}
	ck_assert_int_eq(waitpid(c, &st, 0), c);
	fake = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	init = *shared_pid;
	if (init > 0)
		read_log(buf, sizeof(buf), "restored tree killed");
	/* Reaped within 10 s (it came back to this subreaper), else killed
	 * here: whatever the verdict, nothing of the namespace outlives the
	 * test. */
	for (int i = 0; init > 0 && i < 1000 && (reaped = waitpid(init, &st, WNOHANG)) == 0; i++)
		usleep(10000);
	if (init > 0 && reaped == 0) {
		kill(init, SIGKILL);
		waitpid(init, NULL, 0);
	}
	ck_assert_int_eq(fake, 0);
	ck_assert_int_gt(init, 0);
	snprintf(want, sizeof(want), "pid %d, criu's child, is pid 1 of a new pid namespace", (int)init);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	snprintf(want, sizeof(want), "the restored tree is the pid namespace of pid %d (pid 1 there, criu's child)",
		 (int)init);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	snprintf(want, sizeof(want), "killed pid %d ", (int)init);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	ck_assert_msg(reaped == init, "the init was not reaped within 10 s of the guardian's kill");
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "init ended with status 0x%x", st);
	rm_tmp();
}
END_TEST

/* Between the restore guardian's look at the tree and its kill (the test
 * seam), the root forks the images' second process. */
struct race {
	volatile int go;    /* guardian -> root: fork it now */
	volatile int ready; /* root -> guardian: forked */
};
static struct race *race;

static void fork_in_the_window(void)
{
	race->go = 1;
	for (int i = 0; i < 5000 && !race->ready; i++)
		usleep(1000);
}

/* clone3 with the pid of the images in this pid namespace (as CRIU forks
 * the tree); the kernel's struct clone_args up to set_tid_size. */
static pid_t fork_at(pid_t pid)
{
	struct {
		uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
			set_tid_size;
	} a = {.exit_signal = SIGCHLD, .set_tid = (uint64_t)(uintptr_t)&pid, .set_tid_size = 1};

	return (pid_t)syscall(SYS_clone3, &a, sizeof(a));
}

enum { ROOT = 400, CHILD = 500 };

/* pid 1 of the test's pid namespace: fake criu restores a root at ROOT
 * and dies; the root forks CHILD in the guardian's window. Both come back
 * here; each must end by SIGKILL within 10 s. 0, or where it went wrong. */
static int race_init(void)
{
	struct cuip_pstree_task t[2] = {{.pid = ROOT}, {.pid = CHILD, .ppid = ROOT}};
	int st, dead = 0, code = 0;
	pid_t c;

	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		return 20;
	cuip_guardian_test_before_kill = fork_in_the_window;
	c = fork();
	if (c < 0)
		return 21;
	if (c == 0) { /* fake criu */
		struct cuip_pstree img = {.t = t, .n = 2};
		char err[256];
		pid_t root;

		t[0].ppid = getpid();
		if (cuip_guardian_start_restore(&img, open(dir, O_RDONLY | O_DIRECTORY), err, sizeof(err)))
			_exit(22);
		root = fork_at(ROOT);
		if (root < 0)
			_exit(23);
		if (root == 0) {
			for (int i = 0; i < 10000 && !race->go; i++)
				usleep(1000);
			if (race->go && fork_at(CHILD) == 0)
				for (;;)
					pause();
			race->ready = 1;
			sleep(10);
			_exit(0);
		}
		_exit(0); /* dies before any commit */
	}
	if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st))
		return WIFEXITED(st) ? WEXITSTATUS(st) : 24;
	/* the root and its child, reparented to this init (and the guardian) */
	for (int i = 0; i < 1000 && dead < 2; i++) {
		pid_t r = waitpid(-1, &st, WNOHANG);

		if (r == ROOT || r == CHILD) {
			dead++;
			if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
				code = r == ROOT ? 25 : 26;
		} else if (r <= 0) {
			usleep(10000);
		}
	}
	if (dead < 2) {
		kill(CHILD, SIGKILL);
		kill(ROOT, SIGKILL);
		code = 27;
	}
	return code;
}

/*
 * The tree grows while the guardian kills it: after the guardian looked
 * (the root alive, its child not yet forked) and before its SIGKILL, the
 * root forks the images' next process, which then passes to the reaper.
 * One look would leave it running half-built; the guardian looks again
 * once its victims are dead and kills it. In a pid namespace of the test
 * (a user namespace too when unprivileged) so that the images' pids are
 * the processes' own.
 */
START_TEST(restore_kills_child_forked_after_look)
{
	char buf[4096], want[128];
	int st;
	pid_t x;

	mkdir_tmp();
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	race = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne((void *)race, MAP_FAILED);
	x = fork();
	ck_assert_int_ge(x, 0);
	if (x == 0) {
		uid_t uid = geteuid();
		gid_t gid = getegid();
		pid_t i;

		if (uid) {
			char map[64];
			int fd;

			if (unshare(CLONE_NEWUSER))
				_exit(30);
			fd = open("/proc/self/setgroups", O_WRONLY);
			if (fd < 0 || write(fd, "deny", 4) != 4)
				_exit(31);
			close(fd);
			snprintf(map, sizeof(map), "0 %u 1", (unsigned)uid);
			fd = open("/proc/self/uid_map", O_WRONLY);
			if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map))
				_exit(32);
			close(fd);
			snprintf(map, sizeof(map), "0 %u 1", (unsigned)gid);
			fd = open("/proc/self/gid_map", O_WRONLY);
			if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map))
				_exit(33);
			close(fd);
		}
		if (unshare(CLONE_NEWPID | CLONE_NEWNS))
			_exit(34);
		i = fork();
		if (i < 0)
			_exit(35);
		if (i == 0)
			_exit(race_init());
		_exit(waitpid(i, &st, 0) == i && WIFEXITED(st) ? WEXITSTATUS(st) : 36);
	}
	ck_assert_int_eq(waitpid(x, &st, 0), x);
	read_log(buf, sizeof(buf), "restored tree killed");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the namespace's init: status 0x%x; log: %s", st, buf);
	snprintf(want, sizeof(want), "killed pid %d ", ROOT);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	ck_assert_msg(strstr(buf, "1 more process(es) of the images appeared after the look before"), "log: %s", buf);
	snprintf(want, sizeof(want), "killed pid %d ", CHILD);
	ck_assert_msg(strstr(buf, want), "log: %s", buf);
	munmap((void *)race, 4096);
	rm_tmp();
}
END_TEST

/* A pstree.img of two processes, 100 (root, ppid 1) and 101 (ppid 100,
 * threads 101 and 102 packed), both in group and session 100, as CRIU
 * writes it. */
static const uint8_t pstree2[] = {
	0x19, 0x43, 0x56, 0x54, 0x30, 0x30, 0x27, 0x50, /* IMG_COMMON, PSTREE */
	8,    0,    0,	  0,	0x08, 100,  0x10, 1,	0x18, 100, 0x20, 100, 12,  0,
	0,    0,    0x08, 101,	0x10, 100,  0x18, 100,	0x20, 100, 0x2a, 2,   101, 102,
};

/* The reader the restore's guardian starts from (protocol/pstree.h): every
 * field, and each way a damaged image is refused. */
START_TEST(pstree_reads)
{
	struct cuip_pstree pt;
	char err[256] = "", path[128];
	uint8_t bad[sizeof(pstree2)];
	int dfd, fd;

	ck_assert_int_eq(cuip_pstree_parse(&pt, pstree2, sizeof(pstree2), err, sizeof(err)), 0);
	ck_assert_uint_eq(pt.n, 2);
	ck_assert_int_eq(pt.t[0].pid, 100);
	ck_assert_int_eq(pt.t[0].ppid, 1);
	ck_assert_int_eq(pt.t[0].sid, 100);
	ck_assert_uint_eq(pt.t[0].n_threads, 0);
	ck_assert_int_eq(pt.t[1].pid, 101);
	ck_assert_int_eq(pt.t[1].ppid, 100);
	ck_assert_int_eq(pt.t[1].pgid, 100);
	ck_assert_uint_eq(pt.t[1].n_threads, 2);
	ck_assert_int_eq(pt.t[1].threads[0], 101);
	ck_assert_int_eq(pt.t[1].threads[1], 102);
	ck_assert(cuip_pstree_has(&pt, 101) && !cuip_pstree_has(&pt, 102));
	cuip_pstree_free(&pt);

	ck_assert_int_eq(cuip_pstree_parse(&pt, pstree2, sizeof(pstree2) - 1, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "entry 2 at byte 20: size 12 runs past the end, 11 bytes left");
	ck_assert_int_eq(cuip_pstree_parse(&pt, pstree2, 8, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "no entry, no process tree");
	ck_assert_int_eq(cuip_pstree_parse(&pt, pstree2, 8 + 12 + 2, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "entry 2 at byte 20: 2 bytes left, short of its 4-byte size");
	memcpy(bad, pstree2, sizeof(bad));
	bad[7] = 0;
	ck_assert_int_eq(cuip_pstree_parse(&pt, bad, sizeof(bad), err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "magic 0x54564319 0x00273030, not a pstree image's (0x54564319 0x50273030)");
	memcpy(bad, pstree2, sizeof(bad));
	bad[12] = 0x10; /* the first entry without its pid */
	bad[13] = 7;
	ck_assert_int_eq(cuip_pstree_parse(&pt, bad, sizeof(bad), err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "entry 1 at byte 8: 8 bytes that do not decode as a pstree entry");
	ck_assert_ptr_null(pt.t);

	mkdir_tmp();
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(cuip_pstree_read(dfd, CUIP_PSTREE_IMG, &pt, err, sizeof(err)), -ENOENT);
	ck_assert_str_eq(err, "");
	snprintf(path, sizeof(path), "%s/pstree.img", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_eq(write(fd, pstree2, sizeof(pstree2)), (ssize_t)sizeof(pstree2));
	close(fd);
	ck_assert_int_eq(cuip_pstree_read(dfd, CUIP_PSTREE_IMG, &pt, err, sizeof(err)), 0);
	ck_assert_uint_eq(pt.n, 2);
	cuip_pstree_free(&pt);
	unlink(path);
	close(dfd);
	rm_tmp();
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
	tcase_add_test(tc, restore_leaves_unrelated);
	tcase_add_test(tc, restore_kills_ns_init_seen_as_child);
	tcase_add_test(tc, restore_kills_child_forked_after_look);
	tcase_add_test(tc, pstree_reads);
	suite_add_tcase(s, tc);
	return s;
}
