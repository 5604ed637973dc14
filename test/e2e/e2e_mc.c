/*
 * e2e_mc - the multicast job the end-to-end tests checkpoint: NPROCS ranks,
 * rank r on fake device r, one POSIX multicast object created by rank 0 and
 * imported by the others through interposer tickets, a 4 MiB member per
 * rank, plus one unicast VMM allocation rank 0 shares with every rank.
 *
 *   e2e_mc DIR NPROCS MAPMB [--untracked R] [--private]
 *
 * Binds: rank 0 BindMem (v1); odd ranks BindAddr_v2 of the first half and
 * BindMem of the second, then unbind the second and bind it again by
 * address (PyTorch's pattern); other ranks BindMem_v2. Every rank maps MAPMB
 * MiB of the object (more than the 4 MiB requested when the fake rounds the
 * capacity up, FAKECUDA_MC_ROUND_MB). --untracked R: rank R tries to bind
 * private (untracked) memory instead, which must be refused, and leaves its
 * device unbound. --private: one process drives two devices with a handle
 * type 0 object and two members (NPROCS must be 1).
 *
 * Protocol as e2e_group: DIR/r<rank>.ready, commands in DIR/cmd, answers in
 * DIR/r<rank>.<seq>:
 *   verify G     every byte of every member this rank sees (but an --untracked
 *                rank's unbound one), of the multicast mapping and of the
 *                shared unicast allocation is word(G, i)
 * (the first command is "write 0 0": other ranks may still be binding
 * before they are ready)
 *   write R G    rank R writes word(G, i) through its multicast mapping and
 *                into the shared unicast allocation
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);

#define MiB	(1ul << 20)
#define MEMBER	(4 * MiB)
#define UNICAST (2 * MiB)

static const char *dir;
static int rank;

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

static int send_fd(int s, int fd)
{
	char c = 0, cbuf[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {&c, 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(s, &mh, 0) == 1 ? 0 : -1;
}

static int recv_fd(int s)
{
	char c, cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&c, 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(s, &mh, 0) != 1 || !(cm = CMSG_FIRSTHDR(&mh)))
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

static CUdeviceptr reserve_map(CUmemGenericAllocationHandle h, size_t size, int ndev, int dev0)
{
	CUmemAccessDesc d[16];
	CUdeviceptr va;

	for (int i = 0; i < ndev; i++)
		d[i] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, dev0 + i}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemMap(va, size, 0, h, 0));
	CK(cuMemSetAccess(va, size, d, (size_t)ndev));
	return va;
}

static void member_on(int dev, CUmemGenericAllocationHandle *h, CUdeviceptr *va, size_t size)
{
	CUmemAllocationProp p = {0};

	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CK(cuMemCreate(h, size, &p, 0));
	*va = reserve_map(*h, size, 1, dev);
}

static int check(CUdeviceptr va, size_t size, uint32_t g)
{
	uint32_t *b = malloc(size);
	int bad = -1;

	CK(cuMemcpyDtoH(b, va, size));
	for (size_t i = 0; i < size / 4 && bad < 0; i++)
		if (b[i] != word(g, i))
			bad = (int)i;
	free(b);
	return bad;
}

static void fill(CUdeviceptr va, size_t size, uint32_t g)
{
	uint32_t *b = malloc(size);

	for (size_t i = 0; i < size / 4; i++)
		b[i] = word(g, i);
	CK(cuMemcpyHtoD(va, b, size));
	free(b);
}

/* The answer to command seq appears whole (written aside, then renamed). */
static void answer(long seq, const char *ans)
{
	char tmp[512], fin[512];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s/r%d.%ld.tmp", dir, rank, seq);
	snprintf(fin, sizeof(fin), "%s/r%d.%ld", dir, rank, seq);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s\n", ans);
	fclose(f);
	rename(tmp, fin);
}

int main(int argc, char **argv)
{
	int nprocs, mapmb, untracked = -1, priv = 0, sv[16][2];
	CUmemGenericAllocationHandle mc, mem[2], uni;
	CUdeviceptr mva, memva[2], uva;
	CUcontext ctx;
	CUdevice dev;
	char path[512];
	long seen = 0;
	FILE *f;

	if (argc < 4)
		return 2;
	dir = argv[1];
	nprocs = atoi(argv[2]);
	mapmb = atoi(argv[3]);
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--untracked") && i + 1 < argc)
			untracked = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--private"))
			priv = 1;
	}
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
	CK(cuDeviceGet(&dev, rank));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));

	CUmulticastObjectProp mp = {0};
	mp.numDevices = priv ? 2 : (unsigned)nprocs;
	mp.size = MEMBER;
	mp.handleTypes = priv ? CU_MEM_HANDLE_TYPE_NONE : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (rank == 0) {
		CUmemAllocationProp up = {0};
		int t, ut;

		CK(cuMulticastCreate(&mc, &mp));
		up.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		up.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		up.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		CK(cuMemCreate(&uni, UNICAST, &up, 0));
		if (!priv) {
			CK(cuMemExportToShareableHandle(&t, mc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			CK(cuMemExportToShareableHandle(&ut, uni, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
			for (int r = 1; r < nprocs; r++)
				if (send_fd(sv[r][0], t) || send_fd(sv[r][0], ut))
					die("send ticket");
			close(t);
			close(ut);
		}
	} else {
		int t = recv_fd(sv[rank][1]), ut = recv_fd(sv[rank][1]);

		if (t < 0 || ut < 0)
			die("recv ticket");
		CK(cuMemImportFromShareableHandle(&mc, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CK(cuMemImportFromShareableHandle(&uni, (void *)(uintptr_t)ut,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		close(t);
		close(ut);
	}
	uva = reserve_map(uni, UNICAST, 1, rank);
	CK(cuMulticastAddDevice(mc, rank));
	if (priv)
		CK(cuMulticastAddDevice(mc, 1));
	member_on(rank, &mem[0], &memva[0], MEMBER);
	if (priv)
		member_on(1, &mem[1], &memva[1], MEMBER);
	if (rank == untracked) {
		CUmemAllocationProp p = {0};
		CUmemGenericAllocationHandle ph;

		p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.location.id = rank;
		CK(cuMemCreate(&ph, MEMBER, &p, 0));
		if (cuMulticastBindMem(mc, 0, ph, 0, MEMBER, 0) != CUDA_ERROR_NOT_SUPPORTED)
			die("binding untracked memory was not refused");
	} else if (rank == 0) {
		CK(cuMulticastBindMem(mc, 0, mem[0], 0, MEMBER, 0));
		if (priv)
			CK(cuMulticastBindMem_v2(mc, 1, 0, mem[1], 0, MEMBER, 0));
	} else if (rank % 2) {
		CK(cuMulticastBindAddr_v2(mc, rank, 0, memva[0], MEMBER / 2, 0));
		CK(cuMulticastBindMem(mc, MEMBER / 2, mem[0], MEMBER / 2, MEMBER / 2, 0));
		CK(cuMulticastUnbind(mc, rank, MEMBER / 2, MEMBER / 2));
		CK(cuMulticastBindAddr_v2(mc, rank, MEMBER / 2, memva[0] + MEMBER / 2, MEMBER / 2, 0));
	} else {
		CK(cuMulticastBindMem_v2(mc, rank, 0, mem[0], 0, MEMBER, 0));
	}
	mva = reserve_map(mc, (size_t)mapmb * MiB, priv ? 2 : 1, rank);

	snprintf(path, sizeof(path), "%s/r%d.ready", dir, rank);
	f = fopen(path, "w");
	if (!f)
		die("ready file");
	fprintf(f, "pid %d mc %#llx member %#llx unicast %#llx\n", getpid(), (unsigned long long)mva,
		(unsigned long long)memva[0], (unsigned long long)uva);
	fclose(f);

	for (;;) {
		char line[256], verb[32] = "", ans[256] = "ok";
		long seq = 0;
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
			int bad;
			/* an untracked rank's member is not bound: multicast writes never reach it */
			if (rank != untracked && (bad = check(memva[0], MEMBER, (uint32_t)a)) >= 0)
				snprintf(ans, sizeof(ans), "fail member word %d", bad);
			else if (priv && (bad = check(memva[1], MEMBER, (uint32_t)a)) >= 0)
				snprintf(ans, sizeof(ans), "fail second member word %d", bad);
			else if ((bad = check(mva, MEMBER, (uint32_t)a)) >= 0)
				snprintf(ans, sizeof(ans), "fail multicast word %d", bad);
			else if ((bad = check(uva, UNICAST, (uint32_t)a)) >= 0)
				snprintf(ans, sizeof(ans), "fail unicast word %d", bad);
			else
				snprintf(ans, sizeof(ans), "ok mc %#llx member %#llx unicast %#llx",
					 (unsigned long long)mva, (unsigned long long)memva[0],
					 (unsigned long long)uva);
		} else if (!strcmp(verb, "write")) {
			if (a == rank) {
				fill(mva, MEMBER, (uint32_t)b);
				fill(uva, UNICAST, (uint32_t)b);
				CK(cuCtxSynchronize());
			}
		} else {
			snprintf(ans, sizeof(ans), "fail unknown verb %s", verb);
		}
		answer(seq, ans);
	}
	if (rank == 0)
		while (wait(NULL) > 0)
			;
	return 0;
}
