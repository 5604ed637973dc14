/*
 * e2e_thief - an unprivileged attacker for t-other-user.sh: run as another
 * uid, it tries to reach a participant's control socket and to fetch the
 * memory behind a stolen ticket.
 *
 *   e2e_thief connect SOCK   connect, say HELLO-sized garbage, read
 *   e2e_thief import TICKET  cuInit, rebuild the ticket as a sealed memfd
 *                            from the stolen bytes, import it
 *   e2e_thief hold TICKET    the same as an ordinary outside importer (for
 *                            t-outside-importer-refused.sh): on success,
 *                            print "import: CUDA_SUCCESS pid N" and keep
 *                            the memory until killed
 *
 * Prints one line: "connect: <strerror>", "connect: closed by peer",
 * "connect: answered" or "import: <CUresult>"; exit 0 when the attempt was
 * refused, 1 when it succeeded, 2 on a usage or setup error.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static int try_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 5};
	char buf[64];
	ssize_t n;
	int s;

	if (strlen(path) >= sizeof(sa.sun_path))
		return 2;
	strcpy(sa.sun_path, path);
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	if (s < 0)
		return 2;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa))) {
		printf("connect: %s\n", strerror(errno));
		return 0;
	}
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	memset(buf, 0, sizeof(buf));
	/* Anything: an accepted peer would get an answer or a protocol error. */
	/* The interposer may already have closed it: no SIGPIPE, just EPIPE. */
	if (send(s, buf, sizeof(buf), MSG_NOSIGNAL) < 0 && errno != EPIPE && errno != ECONNRESET) {
		printf("connect: %s\n", strerror(errno));
		return 0;
	}
	n = read(s, buf, sizeof(buf));
	if (n <= 0) {
		printf("connect: closed by peer\n");
		return 0;
	}
	printf("connect: answered\n");
	return 1;
}

static int try_import(const char *ticket, int hold)
{
	CUmemGenericAllocationHandle h;
	char buf[4096];
	const char *name = NULL;
	CUresult r;
	ssize_t n;
	int in, fd;

	in = open(ticket, O_RDONLY);
	if (in < 0)
		return 2;
	n = read(in, buf, sizeof(buf));
	close(in);
	fd = memfd_create("cuinterpose-ticket", MFD_ALLOW_SEALING);
	if (n <= 0 || fd < 0 || write(fd, buf, n) != n ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE))
		return 2;
	if (cuInit(0) != CUDA_SUCCESS)
		return 2;
	r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	cuGetErrorName(r, &name);
	if (hold && r == CUDA_SUCCESS) {
		printf("import: %s pid %d\n", name, (int)getpid());
		fflush(stdout);
		for (;;)
			pause();
	}
	printf("import: %s\n", name ? name : "?");
	return r == CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "connect"))
		return try_connect(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "import"))
		return try_import(argv[2], 0);
	if (argc == 3 && !strcmp(argv[1], "hold"))
		return try_import(argv[2], 1);
	fprintf(stderr, "usage: e2e_thief connect SOCK | import TICKET | hold TICKET\n");
	return 2;
}
