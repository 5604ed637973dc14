/*
 * e2e_uring - the root of a tree that holds an io_uring instance, for
 * t-io-uring-refused.sh (a torchrun worker maps one through libuv):
 *
 *   e2e_uring DIR [--fd-only] PROG [ARGS...]
 *
 * Sets up an io_uring instance with the raw system call and, unless
 * --fd-only, maps its submission ring and its SQE array as liburing does;
 * then forks and runs PROG ARGS in the child (the descriptor is close-on-exec
 * and exec drops the mappings: the child holds neither). Writes
 * DIR/uring.ready ("pid P fd F ring ADDR", ADDR 0 with --fd-only) and waits
 * for the child, exiting with its status. SIGUSR1 closes the instance
 * (unmaps, closes the descriptor) and writes DIR/uring.closed.
 *
 * Exits 77 with "io_uring: <strerror>" when the kernel refuses
 * io_uring_setup (disabled by kernel.io_uring_disabled, or not built), 2 on
 * a usage or setup error.
 */
#include <errno.h>
#include <linux/io_uring.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t close_asked;

static void on_usr1(int sig)
{
	(void)sig;
	close_asked = 1;
}

static int write_file(const char *dir, const char *name, const char *text)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

int main(int argc, char **argv)
{
	struct io_uring_params p;
	void *ring = NULL, *sqes = NULL;
	size_t ring_len = 0, sqes_len = 0;
	bool fd_only = false;
	const char *dir;
	char line[128];
	int fd, status, first = 2;
	pid_t child;

	if (argc > 2 && !strcmp(argv[2], "--fd-only")) {
		fd_only = true;
		first = 3;
	}
	if (argc <= first) {
		fprintf(stderr, "usage: e2e_uring DIR [--fd-only] PROG [ARGS...]\n");
		return 2;
	}
	dir = argv[1];
	memset(&p, 0, sizeof(p));
	fd = (int)syscall(__NR_io_uring_setup, 4, &p);
	if (fd < 0) {
		printf("io_uring: %s\n", strerror(errno));
		return 77;
	}
	if (!fd_only) {
		ring_len = p.sq_off.array + p.sq_entries * sizeof(__u32);
		sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
		ring = mmap(NULL, ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
		sqes = mmap(NULL, sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
		if (ring == MAP_FAILED || sqes == MAP_FAILED) {
			fprintf(stderr, "e2e_uring: mmap of the rings: %s\n", strerror(errno));
			return 2;
		}
	}
	/* No SA_RESTART: the signal must end the wait below. */
	struct sigaction sa = {.sa_handler = on_usr1};
	sigaction(SIGUSR1, &sa, NULL);
	child = fork();
	if (child < 0) {
		fprintf(stderr, "e2e_uring: fork: %s\n", strerror(errno));
		return 2;
	}
	if (child == 0) {
		signal(SIGUSR1, SIG_DFL);
		execv(argv[first], argv + first);
		fprintf(stderr, "e2e_uring: exec %s: %s\n", argv[first], strerror(errno));
		_exit(127);
	}
	snprintf(line, sizeof(line), "pid %d fd %d ring %p\n", (int)getpid(), fd, ring);
	if (write_file(dir, "uring.ready", line)) {
		fprintf(stderr, "e2e_uring: cannot write %s/uring.ready\n", dir);
		kill(child, SIGKILL);
		return 2;
	}
	for (;;) {
		pid_t w = waitpid(child, &status, 0);

		if (close_asked && fd >= 0) {
			if (!fd_only) {
				munmap(ring, ring_len);
				munmap(sqes, sqes_len);
			}
			close(fd);
			fd = -1;
			write_file(dir, "uring.closed", "closed\n");
		}
		if (w == child)
			break;
		if (w < 0 && errno != EINTR) {
			fprintf(stderr, "e2e_uring: waitpid: %s\n", strerror(errno));
			return 2;
		}
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
