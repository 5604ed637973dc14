/*
 * ctr_outside - a sharing peer outside the container, for t-podman.sh.
 *
 *   ctr_outside TICKET READY
 *
 * Runs on the host with the interposer preloaded: rebuilds the ticket (the
 * bytes of a container process's cuinterpose ticket, copied through
 * /proc/PID/fd) as a sealed memfd, imports the allocation behind it, writes
 * "import: <CUresult> pid <pid>" into READY and then holds the import until
 * SIGTERM (the plugin must refuse to checkpoint the container while it
 * does). Exit 0 after SIGTERM with the import held, 1 when the import
 * failed, 2 on a usage or setup error. Single-threaded; no locks.
 */
#include <cuda.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static int sealed_copy(const char *path)
{
	char buf[4096];
	ssize_t n;
	int in, fd;

	in = open(path, O_RDONLY);
	if (in < 0)
		return -1;
	n = read(in, buf, sizeof(buf));
	close(in);
	fd = memfd_create("cuinterpose-ticket", MFD_ALLOW_SEALING);
	if (n <= 0 || fd < 0 || write(fd, buf, n) != n ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE))
		return -1;
	return fd;
}

int main(int argc, char **argv)
{
	CUmemGenericAllocationHandle h;
	const char *name = NULL;
	struct sigaction sa = {.sa_handler = on_term};
	sigset_t none, term;
	CUresult r;
	FILE *f;
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: ctr_outside TICKET READY\n");
		return 2;
	}
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigprocmask(SIG_BLOCK, &term, NULL); /* delivered only in sigsuspend */
	sigaction(SIGTERM, &sa, NULL);
	fd = sealed_copy(argv[1]);
	if (fd < 0 || cuInit(0) != CUDA_SUCCESS)
		return 2;
	r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	cuGetErrorName(r, &name);
	f = fopen(argv[2], "w");
	if (!f)
		return 2;
	fprintf(f, "import: %s pid %d\n", name ? name : "?", (int)getpid());
	fclose(f);
	if (r != CUDA_SUCCESS)
		return 1;
	sigemptyset(&none);
	while (!stop)
		sigsuspend(&none);
	cuMemRelease(h);
	return 0;
}
