/*
 * check_discovery.c - participant discovery against live processes: the
 * process tree, the interposer mapping, "cuip-*" threads, the control
 * socket found through sock_diag (also inside other network and mount
 * namespaces) and the SO_PEERCRED check on connect.
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "sockdiag.h"
#include "../../test/tmpname.h"

static char tdir[48];
static pid_t child, grandchild;

static void *named_thread(void *a)
{
	prctl(PR_SET_NAME, "cuip-ctl");
	pause();
	return NULL;
}

/* The child: a grandchild, a mapped "libcuinterpose.so", a cuip-ctl thread
 * and a listening control socket, optionally in fresh net+mount namespaces. */
static void child_main(int ready, int isolate)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char lib[128], sockdir[80];
	pthread_t th;
	void *m;
	int fd, s;

	grandchild = fork();
	if (grandchild == 0) {
		pause();
		_exit(0);
	}
	snprintf(sockdir, sizeof(sockdir), "%s/run", tdir);
	if (isolate) {
		if (unshare(CLONE_NEWNET | CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount("tmpfs", sockdir, "tmpfs", 0, NULL)) {
			dprintf(ready, "E");
			_exit(1);
		}
	}
	snprintf(lib, sizeof(lib), "%s/libcuinterpose.so", tdir);
	fd = open(lib, O_RDWR | O_CREAT, 0600);
	if (ftruncate(fd, 4096))
		_exit(1);
	m = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		_exit(1);
	pthread_create(&th, NULL, named_thread, NULL);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%d-0123456789abcdef.sock", sockdir, getpid());
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 4))
		_exit(1);
	/* a decoy with the wrong pid in its name */
	int d = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/1-0123456789abcdef.sock", sockdir);
	if (bind(d, (struct sockaddr *)&sa, sizeof(sa)) || listen(d, 4))
		_exit(1);
	dprintf(ready, "%d", grandchild);
	for (;;) {
		int c = accept(s, NULL, NULL);
		if (c >= 0)
			close(c);
	}
}

static int start_child(int isolate)
{
	char buf[64] = "";
	int p[2];

	test_tmpname(tdir, sizeof(tdir), "cuip-disc-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	snprintf(buf, sizeof(buf), "%s/run", tdir);
	ck_assert_int_eq(mkdir(buf, 0700), 0);
	ck_assert_int_eq(pipe(p), 0);
	child = fork();
	if (child == 0) {
		close(p[0]);
		child_main(p[1], isolate);
	}
	close(p[1]);
	memset(buf, 0, sizeof(buf));
	ck_assert_int_gt(read(p[0], buf, sizeof(buf) - 1), 0);
	close(p[0]);
	if (buf[0] == 'E')
		return -1;
	grandchild = atoi(buf);
	return 0;
}

static void stop_child(void)
{
	char cmd[160];

	kill(grandchild, SIGKILL);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	snprintf(cmd, sizeof(cmd), "umount %.32s/run 2>/dev/null; rm -rf %s", tdir, tdir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(tree_walk_finds_children_and_grandchildren)
{
	pid_t *v;
	int n, has_child = 0, has_gc = 0;

	ck_assert_int_eq(start_child(0), 0);
	n = cuip_proc_tree(getpid(), &v);
	ck_assert_int_ge(n, 3);
	ck_assert_int_eq(v[0], getpid());
	for (int i = 0; i < n; i++) {
		has_child |= v[i] == child;
		has_gc |= v[i] == grandchild;
	}
	ck_assert(has_child && has_gc);
	free(v);
	ck_assert_int_eq(cuip_proc_has_interposer(child), 1);
	ck_assert_int_eq(cuip_proc_has_interposer(grandchild), 0);
	ck_assert_int_eq(cuip_proc_vpid(child), child);
	stop_child();
}
END_TEST

/* CRIU calls PAUSE_DEVICES before it freezes the tree: a process that exits
 * while the plugin walks the tree is no error (zdtm's transition/fork found
 * opendir("/proc/PID/task") failing with ESRCH, about 1 walk in 7000). */
START_TEST(tree_walk_survives_exiting_children)
{
	struct timespec t0, t;
	long walks = 0, failed = 0;
	int first = 0;
	pid_t forker = fork();

	ck_assert_int_ge(forker, 0);
	if (forker == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;) {
			pid_t c = fork();

			if (c == 0)
				_exit(0);
			if (c > 0)
				waitpid(c, NULL, 0);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		pid_t *v;
		int n = cuip_proc_tree(forker, &v);

		walks++;
		if (n < 0) {
			failed++;
			first = first ? first : n;
		} else {
			free(v);
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (t.tv_sec - t0.tv_sec < 2);
	kill(forker, SIGKILL);
	waitpid(forker, NULL, 0);
	ck_assert_msg(failed == 0, "%ld of %ld walks failed (first: %s)", failed, walks, strerror(-first));
	ck_assert_int_gt(walks, 100);
}
END_TEST

START_TEST(interposer_threads_are_found_by_name)
{
	pid_t *t;
	int n;

	ck_assert_int_eq(start_child(0), 0);
	for (int i = 0; i < 100; i++) { /* the thread names itself */
		n = cuip_proc_threads(child, CUIP_THREAD_PREFIX, &t);
		if (n == 1)
			break;
		free(t);
		usleep(10000);
	}
	ck_assert_int_eq(n, 1);
	ck_assert_int_ne(t[0], child);
	free(t);
	stop_child();
}
END_TEST

START_TEST(control_socket_is_found_by_sock_diag_and_peer_checked)
{
	char path[4096], err[512], want[256];
	int fd;

	ck_assert_int_eq(start_child(0), 0);
	ck_assert_int_eq(cuip_find_control_socket(child, child, path, sizeof(path), err, sizeof(err)), 0);
	snprintf(want, sizeof(want), "%s/run/%d-0123456789abcdef.sock", tdir, child);
	ck_assert_str_eq(path, want);
	fd = cuip_connect_control(child, path, child, 1000, err, sizeof(err));
	ck_assert_int_ge(fd, 0);
	close(fd);
	fd = cuip_connect_control(child, path, grandchild, 1000, err, sizeof(err));
	ck_assert_int_eq(fd, -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "not by the participant"));
	/* the grandchild has no socket of its own: a clear refusal */
	ck_assert_int_eq(cuip_find_control_socket(grandchild, grandchild, path, sizeof(path), err, sizeof(err)),
			 -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "no listening control socket"));
	stop_child();
}
END_TEST

START_TEST(control_socket_is_found_in_other_network_and_mount_namespaces)
{
	char path[4096], err[512], here[4096];
	int fd;

	if (getuid() != 0 || start_child(1)) {
		if (child > 0)
			waitpid(child, NULL, 0);
		fprintf(stderr, "skipped: needs root to create namespaces\n");
		return;
	}
	ck_assert_uint_ne(cuip_proc_ns_ino(child, "net"), cuip_proc_ns_ino(getpid(), "net"));
	ck_assert_int_eq(cuip_find_control_socket(child, child, path, sizeof(path), err, sizeof(err)), 0);
	/* the path exists only in the child's mount namespace */
	snprintf(here, sizeof(here), "%s", path);
	ck_assert_int_ne(access(here, F_OK), 0);
	fd = cuip_connect_control(child, path, child, 1000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd);
	stop_child();
}
END_TEST

Suite *discovery_suite(void);

Suite *discovery_suite(void)
{
	Suite *s = suite_create("discovery");
	TCase *t = tcase_create("live");

	tcase_set_timeout(t, 20);
	tcase_add_test(t, tree_walk_finds_children_and_grandchildren);
	tcase_add_test(t, tree_walk_survives_exiting_children);
	tcase_add_test(t, interposer_threads_are_found_by_name);
	tcase_add_test(t, control_socket_is_found_by_sock_diag_and_peer_checked);
	tcase_add_test(t, control_socket_is_found_in_other_network_and_mount_namespaces);
	suite_add_tcase(s, t);
	return s;
}
