/*
 * e2e_pool - the stream-ordered memory pool jobs the end-to-end tests
 * checkpoint: NPROCS ranks (rank 0 forks the others; a subreaper), each with
 * private pool memory: a block of its device's default pool (cuMemAllocAsync,
 * as cudaMallocAsync does) on one stream and a block of its own POSIX-capable
 * pool that is never exported (cuMemAllocFromPoolAsync) on another.
 *
 *   e2e_pool DIR NPROCS [--shared] [--mib N]
 *
 * --mib N: each block is N MiB (default 2); test/gpu/run.sh runs this same
 * program on the GPU machine (built there as gpu_pool by test/gpu/build.sh).
 *
 * --shared: rank 0 also makes a POSIX pool, allocates a block from it,
 * exports the pool to every rank (SCM_RIGHTS) and the block
 * (cuMemPoolExportPointer); the others import the pool, set access and
 * import the pointer, as cuda.core, CuPy and RAPIDS do.
 *
 * Protocol as e2e_group: DIR/r<rank>.ready ("pid P default A private B
 * shared C"), commands in DIR/cmd, answers in DIR/r<rank>.<seq>:
 *   write R G     rank R writes word(G, i) into every block it holds
 *                 (asynchronously on its streams, then synchronizes)
 *   verify G      every byte of every block this rank holds is word(G, i)
 *   churn         allocate and free a temporary block on each stream (the
 *                 pools still work), answer "ok"
 *   release-importers   ranks > 0 free the imported pointer and destroy
 *                 the imported pool
 *   release-creator     rank 0 frees the shared block and destroys its pool
 *   exit
 */
#include <cuda.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MiB (1ul << 20)

static const char *dir;
static int rank;
static size_t block = 2 * MiB, nw;
static uint32_t *host;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	char path[512], msg[512];
	va_list ap;
	FILE *f;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(path, sizeof(path), "%s/r%d.failed", dir, rank);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "%s\n", msg);
		fclose(f);
	}
	fprintf(stderr, "rank %d: %s\n", rank, msg);
	exit(1);
}

#define CK(x)                                                                    \
	do {                                                                     \
		CUresult r_ = (x);                                               \
		if (r_ != CUDA_SUCCESS)                                          \
			die("%s:%d: %s -> %d", __FILE__, __LINE__, #x, (int)r_); \
	} while (0)

static uint32_t word(uint32_t g, size_t i)
{
	return g * 0x01000193u ^ (uint32_t)i * 2654435761u;
}

/* The message carries the pointer export data; the FD the pool. */
static int send_fd(int s, int fd, const void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {(void *)buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(s, &mh, 0) == (ssize_t)len ? 0 : -1;
}

static int recv_fd(int s, void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(s, &mh, MSG_WAITALL) != (ssize_t)len || !(cm = CMSG_FIRSTHDR(&mh)))
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

static CUmemoryPool new_pool(int dev)
{
	CUmemPoolProps pp;
	CUmemoryPool p;
	cuuint64_t keep = ~0ull;

	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = dev;
	CK(cuMemPoolCreate(&p, &pp));
	CK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
	return p;
}

static void fill(CUdeviceptr va, uint32_t g, CUstream st)
{
	for (size_t i = 0; i < nw; i++)
		host[i] = word(g, i);
	CK(cuMemcpyHtoDAsync(va, host, block, st));
	CK(cuStreamSynchronize(st));
}

/* -1: all good, else the first bad word. */
static long check(CUdeviceptr va, uint32_t g, CUstream st)
{
	memset(host, 0, block);
	CK(cuMemcpyDtoHAsync(host, va, block, st));
	CK(cuStreamSynchronize(st));
	for (size_t i = 0; i < nw; i++)
		if (host[i] != word(g, i))
			return (long)i;
	return -1;
}

static void answer(long seq, const char *ans)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/r%d.%ld", dir, rank, seq);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		die("answer file");
	fprintf(f, "%s\n", ans);
	fclose(f);
	rename(tmp, path);
}

int main(int argc, char **argv)
{
	int nprocs, shared = 0, sv[16][2];
	CUdeviceptr dflt, priv, shr = 0;
	CUmemoryPool own, spool = NULL;
	CUstream s1, s2;
	CUcontext ctx;
	CUdevice dev;
	char path[512];
	long seen = 0;
	FILE *f;

	if (argc < 3)
		return 2;
	dir = argv[1];
	nprocs = atoi(argv[2]);
	if (nprocs < 1 || nprocs > 16)
		return 2;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--shared"))
			shared = 1;
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			block = (size_t)atol(argv[++i]) * MiB;
	}
	nw = block / 4;
	host = malloc(block);
	if (!nw || !host)
		return 2;
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	for (int r = 1; r < nprocs; r++) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]))
			die("socketpair");
		pid_t p = fork();
		if (p == 0) {
			rank = r;
			break;
		}
	}
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
	CK(cuMemAllocAsync(&dflt, block, s1));
	own = new_pool(0);
	CK(cuMemAllocFromPoolAsync(&priv, block, own, s2));
	fill(dflt, 1000 + (uint32_t)rank, s1);
	fill(priv, 2000 + (uint32_t)rank, s2);

	if (shared && rank == 0) {
		CUmemPoolPtrExportData ed;
		int fd;

		spool = new_pool(0);
		CK(cuMemAllocFromPoolAsync(&shr, block, spool, s1));
		fill(shr, 0, s1);
		CK(cuMemPoolExportToShareableHandle(&fd, spool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CK(cuMemPoolExportPointer(&ed, shr));
		for (int r = 1; r < nprocs; r++)
			if (send_fd(sv[r][0], fd, &ed, sizeof(ed)))
				die("send pool");
		close(fd);
	} else if (shared) {
		CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemPoolPtrExportData ed;
		int fd = recv_fd(sv[rank][1], &ed, sizeof(ed));

		if (fd < 0)
			die("recv pool");
		CK(cuMemPoolImportFromShareableHandle(&spool, (void *)(intptr_t)fd,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		close(fd);
		CK(cuMemPoolSetAccess(spool, &ad, 1));
		CK(cuMemPoolImportPointer(&shr, spool, &ed));
	}

	snprintf(path, sizeof(path), "%s/r%d.ready", dir, rank);
	f = fopen(path, "w");
	if (!f)
		die("ready file");
	fprintf(f, "pid %d default %#llx private %#llx shared %#llx\n", getpid(), (unsigned long long)dflt,
		(unsigned long long)priv, (unsigned long long)shr);
	fclose(f);

	for (;;) {
		char line[256], verb[32] = "", ans[256] = "ok";
		long seq = 0, bad;
		int a = 0, b = 0;
		struct timespec nap = {0, 20000000};

		snprintf(path, sizeof(path), "%s/cmd", dir);
		f = fopen(path, "r");
		if (!f || !fgets(line, sizeof(line), f) || sscanf(line, "%ld %31s %d %d", &seq, verb, &a, &b) < 2 ||
		    seq <= seen) {
			if (f)
				fclose(f);
			nanosleep(&nap, NULL);
			continue;
		}
		fclose(f);
		seen = seq;
		if (!strcmp(verb, "exit")) {
			answer(seq, "ok");
			break;
		}
		if (!strcmp(verb, "verify")) {
			/* G 0 is the shared block's first pattern; private blocks carry their rank's own. */
			uint32_t g = (uint32_t)a;
			uint32_t gd = g ? g : 1000 + (uint32_t)rank, gp = g ? g : 2000 + (uint32_t)rank;

			if ((bad = check(dflt, gd, s1)) >= 0)
				snprintf(ans, sizeof(ans), "fail default-pool block word %ld", bad);
			else if ((bad = check(priv, gp, s2)) >= 0)
				snprintf(ans, sizeof(ans), "fail private-pool block word %ld", bad);
			else if (shr && (bad = check(shr, g, s1)) >= 0)
				snprintf(ans, sizeof(ans), "fail shared-pool block word %ld", bad);
			else
				snprintf(ans, sizeof(ans), "ok default %#llx private %#llx shared %#llx",
					 (unsigned long long)dflt, (unsigned long long)priv, (unsigned long long)shr);
		} else if (!strcmp(verb, "write")) {
			if (a == rank) {
				fill(dflt, (uint32_t)b, s1);
				fill(priv, (uint32_t)b, s2);
				if (shr)
					fill(shr, (uint32_t)b, s1);
			}
		} else if (!strcmp(verb, "churn")) {
			CUdeviceptr t1, t2;

			CK(cuMemAllocAsync(&t1, block, s1));
			CK(cuMemAllocFromPoolAsync(&t2, block, own, s2));
			CK(cuMemsetD32Async(t1, 0x5a5a5a5au, nw, s1));
			CK(cuMemsetD32Async(t2, 0xa5a5a5a5u, nw, s2));
			CK(cuMemFreeAsync(t1, s1));
			CK(cuMemFreeAsync(t2, s2));
			CK(cuStreamSynchronize(s1));
			CK(cuStreamSynchronize(s2));
		} else if (!strcmp(verb, "release-importers") || !strcmp(verb, "release-creator")) {
			int mine = (rank == 0) == !strcmp(verb, "release-creator");

			if (mine && spool) {
				CK(cuMemFreeAsync(shr, s1));
				CK(cuStreamSynchronize(s1));
				CK(cuMemPoolDestroy(spool));
				spool = NULL;
				shr = 0;
			}
		} else {
			snprintf(ans, sizeof(ans), "fail unknown verb %s", verb);
		}
		answer(seq, ans);
	}
	CK(cuMemFreeAsync(dflt, s1));
	CK(cuMemFreeAsync(priv, s2));
	CK(cuStreamSynchronize(s1));
	CK(cuStreamSynchronize(s2));
	CK(cuMemPoolDestroy(own));
	return 0;
}
