/*
 * wl.c - the test workloads' shared library (see wl.h): ranks, descriptor
 * passing, the file command protocol, readiness and failure reports,
 * patterns, checksums and the driver calls every workload repeats.
 * Callers: test/e2e/e2e_*.c, test/gpu/gpu_job.c (built by test/gpu/build.sh),
 * test/workloads/vmm_share.c. Per-process state (wl_dir, wl_rank, wl_why),
 * single-threaded: no locks.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wl.h"

const char *wl_dir = ".";
int wl_rank;
char wl_why[512];
const char *wl_prog = "workload";

#define STAGE (16 * WL_MIB) /* host staging of fill and check */

/* Formatted aside first: an argument may be wl_why itself. */
static void set_why(const char *fmt, va_list ap)
{
	char buf[sizeof(wl_why)];

	vsnprintf(buf, sizeof(buf), fmt, ap);
	memcpy(wl_why, buf, sizeof(buf));
}

int wl_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	set_why(fmt, ap);
	va_end(ap);
	return -1;
}

void wl_die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	set_why(fmt, ap);
	va_end(ap);
	wl_failed(wl_prog);
	exit(1);
}

const char *wl_err(CUresult r)
{
	const char *n = NULL;

	if (cuGetErrorName(r, &n) != CUDA_SUCCESS || !n)
		return "?";
	return n;
}

/* ---- ranks and messages -------------------------------------------------- */

int wl_fork_ranks(int nprocs, int *peer, pid_t *pids, unsigned flags)
{
	int type = SOCK_STREAM | (flags & WL_CLOEXEC ? SOCK_CLOEXEC : 0);

	wl_rank = 0;
	if (flags & WL_SUBREAPER)
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	for (int r = 1; r < nprocs; r++) {
		int sv[2];
		pid_t pid;

		if (socketpair(AF_UNIX, type, 0, sv))
			return wl_fail("socketpair: %s", strerror(errno));
		pid = fork();
		if (pid < 0)
			return wl_fail("fork: %s", strerror(errno));
		if (pid == 0) {
			wl_rank = r;
			close(sv[0]);
			for (int q = 1; q < r; q++)
				close(peer[q]);
			peer[0] = sv[1];
			if (flags & WL_PDEATHSIG)
				prctl(PR_SET_PDEATHSIG, SIGKILL);
			return r;
		}
		close(sv[1]);
		peer[r] = sv[0];
		if (pids)
			pids[r] = pid;
	}
	return 0;
}

void wl_reap(void)
{
	while (wait(NULL) > 0 || errno == EINTR)
		;
}

int wl_send(int sock, const void *buf, size_t len, int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = sizeof(ctl.b);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	while ((n = sendmsg(sock, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)len)
		return wl_fail("rank %d: sendmsg: %s", wl_rank, n < 0 ? strerror(errno) : "short write");
	return 0;
}

int wl_recv(int sock, void *buf, size_t len, int *fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
	ssize_t n;

	if (fd)
		*fd = -1;
	while ((n = recvmsg(sock, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
		int got;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		memcpy(&got, CMSG_DATA(c), sizeof(int));
		if (fd && *fd < 0)
			*fd = got;
		else
			close(got);
	}
	if (n != (ssize_t)len)
		return wl_fail("rank %d: recvmsg: %s", wl_rank,
			       n < 0	? strerror(errno)
			       : n == 0 ? "the peer is gone"
					: "short message");
	return 0;
}

int wl_recv_fd(int sock, void *buf, size_t len)
{
	int fd;

	if (wl_recv(sock, buf, len, &fd))
		return -1;
	if (fd < 0)
		return wl_fail("rank %d: no descriptor received", wl_rank);
	return fd;
}

/* ---- the command protocol ------------------------------------------------ */

static int write_whole(const char *path, const char *text)
{
	char tmp[4200];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	fprintf(f, "%s\n", text);
	if (fclose(f))
		return -1;
	return rename(tmp, path);
}

void wl_answer(long seq, const char *text)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/r%d.%ld", wl_dir, wl_rank, seq);
	write_whole(path, text);
}

void wl_serve(wl_cmd_fn fn, unsigned poll_ms)
{
	struct timespec nap = {(time_t)(poll_ms / 1000), (long)(poll_ms % 1000) * 1000000};
	char path[4096], line[256];
	long last = 0;

	snprintf(path, sizeof(path), "%s/cmd", wl_dir);
	for (;;) {
		char verb[32] = "", out[512] = "ok", fail[sizeof(wl_why) + 8];
		unsigned a = 0, b = 0;
		FILE *f = fopen(path, "r");
		long seq = 0;
		int ret;

		if (!f || !fgets(line, sizeof(line), f) || sscanf(line, "%ld %31s %u %u", &seq, verb, &a, &b) < 2 ||
		    seq <= last) {
			if (f)
				fclose(f);
			nanosleep(&nap, NULL);
			continue;
		}
		fclose(f);
		last = seq;
		wl_why[0] = 0;
		ret = fn(verb, a, b, out, sizeof(out));
		if (ret < 0) {
			snprintf(fail, sizeof(fail), "fail %s", wl_why);
			wl_answer(seq, fail);
		} else {
			wl_answer(seq, out);
		}
		if (ret == WL_EXIT)
			return;
	}
}

int wl_ready(const char *fmt, ...)
{
	char path[4096], text[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	snprintf(path, sizeof(path), "%s/r%d.ready", wl_dir, wl_rank);
	return write_whole(path, text) ? wl_fail("cannot write %s: %s", path, strerror(errno)) : 0;
}

int wl_failed(const char *prog)
{
	char path[4096];

	snprintf(path, sizeof(path), "%s/r%d.failed", wl_dir, wl_rank);
	write_whole(path, wl_why);
	fprintf(stderr, "%s rank %d: %s\n", prog, wl_rank, wl_why);
	return 1;
}

/* ---- patterns and checksums ---------------------------------------------- */

static void *stage(void)
{
	static void *buf;

	if (!buf)
		buf = malloc(STAGE);
	return buf;
}

/* A pattern of bytes (unit 1) or words (unit 4). */
struct elems {
	unsigned unit;
	wl_byte_fn byte;
	wl_word_fn word;
	const void *arg;
};

static uint32_t elem(const struct elems *e, uint64_t i)
{
	return e->unit == 1 ? e->byte(i, e->arg) : e->word(i, e->arg);
}

static uint32_t elem_at(const struct elems *e, const void *buf, uint64_t i)
{
	return e->unit == 1 ? ((const uint8_t *)buf)[i] : ((const uint32_t *)buf)[i];
}

/* Write n elements at va (what == NULL), or read them back and compare. */
static int staged(CUdeviceptr va, uint64_t n, const struct elems *e, const char *what)
{
	const uint64_t per = STAGE / e->unit;
	uint8_t *buf = stage();

	if (!buf)
		return wl_fail("out of memory");
	for (uint64_t done = 0; done < n;) {
		uint64_t m = n - done < per ? n - done : per;
		CUdeviceptr at = va + done * e->unit;
		CUresult r;

		if (!what) {
			for (uint64_t i = 0; i < m; i++) {
				uint32_t v = elem(e, done + i);

				if (e->unit == 1)
					buf[i] = (uint8_t)v;
				else
					((uint32_t *)buf)[i] = v;
			}
			WL_CK(cuMemcpyHtoD(at, buf, m * e->unit));
			done += m;
			continue;
		}
		r = cuMemcpyDtoH(buf, at, m * e->unit);
		if (r != CUDA_SUCCESS)
			return wl_fail("rank %d: cuMemcpyDtoH of %s at %#llx failed: %s (%d)", wl_rank, what,
				       (unsigned long long)va, wl_err(r), (int)r);
		for (uint64_t i = 0; i < m; i++) {
			uint32_t want = elem(e, done + i), got = elem_at(e, buf, i);

			if (got != want)
				return wl_fail("rank %d: %s at %#llx: %s %llu is %#x, expected %#x", wl_rank, what,
					       (unsigned long long)va, e->unit == 1 ? "byte" : "word",
					       (unsigned long long)(done + i), got, want);
		}
		done += m;
	}
	return 0;
}

int wl_fill_bytes(CUdeviceptr va, uint64_t len, wl_byte_fn fn, const void *arg)
{
	struct elems e = {.unit = 1, .byte = fn, .arg = arg};

	return staged(va, len, &e, NULL);
}

int wl_fill_words(CUdeviceptr va, uint64_t nwords, wl_word_fn fn, const void *arg)
{
	struct elems e = {.unit = 4, .word = fn, .arg = arg};

	return staged(va, nwords, &e, NULL);
}

int wl_check_bytes(CUdeviceptr va, uint64_t len, wl_byte_fn fn, const void *arg, const char *what)
{
	struct elems e = {.unit = 1, .byte = fn, .arg = arg};

	return staged(va, len, &e, what);
}

int wl_check_words(CUdeviceptr va, uint64_t nwords, wl_word_fn fn, const void *arg, const char *what)
{
	struct elems e = {.unit = 4, .word = fn, .arg = arg};

	return staged(va, nwords, &e, what);
}

/* The common byte pattern: k's bytes, generation gen over the first glen. */
struct gen_key {
	unsigned k, gen;
	uint64_t glen;
};

uint8_t wl_pattern(uint64_t off, unsigned k, unsigned gen)
{
	return (uint8_t)((off * 31) ^ (k * 17) ^ gen ^ (off >> 12) ^ (off >> 20));
}

static uint8_t gen_byte(uint64_t off, const void *arg)
{
	const struct gen_key *key = arg;

	return wl_pattern(off, key->k, off < key->glen ? key->gen : 0);
}

int wl_put_pattern(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen)
{
	struct gen_key key = {k, gen, len};

	if (wl_fill_bytes(va, len, gen_byte, &key))
		return -1;
	WL_CK(cuCtxSynchronize());
	return 0;
}

int wl_check_pattern(CUdeviceptr va, uint64_t len, unsigned k, unsigned gen, uint64_t glen, const char *what)
{
	struct gen_key key = {k, gen, glen};

	return wl_check_bytes(va, len, gen_byte, &key, what);
}

int wl_check_range(CUdeviceptr base, size_t size, CUdeviceptr inner, const char *what)
{
	CUdeviceptr got = 0;
	size_t gsize = 0;

	if (cuMemGetAddressRange(&got, &gsize, inner) != CUDA_SUCCESS || got != base || gsize != size)
		return wl_fail("%s: address range %#llx+%zu, expected %#llx+%zu", what, (unsigned long long)got, gsize,
			       (unsigned long long)base, size);
	return 0;
}

uint32_t wl_fnv1a(uint32_t h, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

int wl_device_sum(CUdeviceptr va, size_t len, uint32_t *sum)
{
	uint8_t *buf = stage();

	if (!buf)
		return wl_fail("out of memory");
	*sum = WL_FNV_INIT;
	for (size_t done = 0; done < len;) {
		size_t m = len - done < STAGE ? len - done : STAGE;

		WL_CK(cuMemcpyDtoH(buf, va + done, m));
		*sum = wl_fnv1a(*sum, buf, m);
		done += m;
	}
	return 0;
}

/* ---- driver calls -------------------------------------------------------- */

int wl_context(int ord, CUdevice *dev, CUcontext *ctx)
{
	WL_CK(cuInit(0));
	WL_CK(cuDeviceGet(dev, ord));
	WL_CK(cuDevicePrimaryCtxRetain(ctx, *dev));
	WL_CK(cuCtxSetCurrent(*ctx));
	return 0;
}

CUmemAllocationProp wl_prop(int ord, CUmemAllocationHandleType types)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = types;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = ord;
	return p;
}

int wl_map(CUmemGenericAllocationHandle h, size_t size, int dev0, int ndev, CUdeviceptr *va)
{
	CUmemAccessDesc ad[16];

	if (ndev < 1 || ndev > 16)
		return wl_fail("wl_map: %d devices", ndev);
	memset(ad, 0, sizeof(ad));
	for (int i = 0; i < ndev; i++) {
		ad[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		ad[i].location.id = dev0 + i;
		ad[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	WL_CK(cuMemAddressReserve(va, size, 0, 0, 0));
	WL_CK(cuMemMap(*va, size, 0, h, 0));
	WL_CK(cuMemSetAccess(*va, size, ad, (size_t)ndev));
	return 0;
}

int wl_import(int fd, CUmemGenericAllocationHandle *h)
{
	WL_CK(cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	return 0;
}

int wl_export(CUmemGenericAllocationHandle h, int *fd)
{
	WL_CK(cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	return 0;
}
