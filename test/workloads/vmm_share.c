/*
 * vmm_share - a test workload: a parent and N children sharing CUDA VMM
 * memory through POSIX file descriptors, written against the plain driver
 * API (it knows nothing of cuinterpose).
 *
 *   vmm_share [-n CHILDREN] [-r READY_FILE] [-o RESULT_FILE] [--once] [--sizes MiB,MiB,...]
 *
 * Setup: the parent forks the children before any CUDA call, then creates
 * the shared allocations (default 2, 10 and 32 MiB: 10 is not a multiple of
 * 8 MiB), maps them, fills them with a pattern and sends each child an
 * exported FD per allocation over a socketpair (SCM_RIGHTS); every child
 * imports, maps and verifies them. Beside them, every process holds private
 * memory that is never shared: cuMemAlloc, a POSIX-capable VMM allocation
 * that is never exported and a handle-type-0 VMM allocation.
 *
 * Then it writes "<parent pid> <child pids...>" to READY_FILE and waits.
 * SIGUSR1 runs one round: every process verifies every byte of everything
 * it maps at the addresses it mapped them at setup; one child writes a new
 * pattern into one shared allocation and every other process checks it sees
 * it; the parent exports that allocation afresh and a child imports it at a
 * new address and checks its bytes. Each round appends "round R ok" or
 * "round R FAIL: why" to RESULT_FILE (default stdout). SIGUSR2 changes nothing:
 * every process appends "state S rank K pid P:" and, per allocation it maps,
 * its address, size and a checksum of its bytes, then "state S ok" (what the
 * demo compares before the dump and after the restore). SIGTERM/SIGINT: tear
 * everything down and exit 0 if every round passed, 1 otherwise. --once
 * runs one round right after setup and exits.
 *
 * Built as test/interposer/vmm_share in the build tree (plain ELF, no
 * libtool wrapper or rpath: it loads whichever libcuda.so.1 is found).
 * vmm_share-criu.sh beside this file drives it through criu dump/restore.
 */
#include <cuda.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wl.h"

#define MAX_SHARED 16
#define MAX_CHILD  16
#define PRIV_SIZE  (4u << 20)

struct shared {
	size_t size;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	uint32_t version;
};

/* Private, never-shared memory of one process. */
struct priv {
	CUdeviceptr linear; /* cuMemAlloc */
	CUmemGenericAllocationHandle posix_h, none_h;
	CUdeviceptr posix_va, none_va;
	size_t vmm_size;
};

enum op { OP_VERIFY = 1, OP_WRITE, OP_CHECK, OP_FRESH, OP_QUIT, OP_READY, OP_OK, OP_FAIL, OP_ALLOC, OP_STATE };

struct msg {
	int op;
	int idx;
	uint32_t version;
	uint32_t round;
	uint64_t size;
	char why[200];
};

static struct shared sh[MAX_SHARED];
static int nsh;
static struct priv pv;
static CUdevice dev;
static size_t gran;
static volatile sig_atomic_t want_round, want_quit, want_state;
static FILE *out; /* RESULT_FILE (append), shared by every process: one line per fflush */
static char failure[256];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	if (failure[0])
		return;
	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
}

#define CK(call)                                                                 \
	({                                                                       \
		CUresult r_ = (call);                                            \
		if (r_ != CUDA_SUCCESS)                                          \
			fail("rank %d: %s failed: %d", wl_rank, #call, (int)r_); \
		r_ == CUDA_SUCCESS;                                              \
	})

/* A call of the workload library (wl.h): 1 if it worked, else 0 with its failure recorded. */
static int ok_wl(int ret)
{
	if (ret)
		fail("rank %d: %s", wl_rank, wl_why);
	return !ret;
}

struct pattern {
	uint32_t key, v;
};

static uint32_t word(uint64_t j, const void *arg)
{
	const struct pattern *p = arg;
	uint32_t x = p->key * 0x9E3779B1u ^ (uint32_t)j * 2654435761u ^ (uint32_t)(j >> 32) ^ p->v * 0x85EBCA77u;

	x ^= x >> 15;
	return x * 0x2C1B3C6Du;
}

static int fill(CUdeviceptr va, size_t size, uint32_t key, uint32_t v)
{
	struct pattern p = {key, v};

	return ok_wl(wl_fill_words(va, size / 4, word, &p));
}

static int check(CUdeviceptr va, size_t size, uint32_t key, uint32_t v, const char *what)
{
	struct pattern p = {key, v};

	return ok_wl(wl_check_words(va, size / 4, word, &p, what));
}

static CUmemAllocationProp prop_of(CUmemAllocationHandleType types)
{
	return wl_prop(dev, types);
}

static int map_rw(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr *va)
{
	return ok_wl(wl_map(h, size, dev, 1, va));
}

static void unmap_free(CUdeviceptr va, size_t size)
{
	CK(cuMemUnmap(va, size));
	CK(cuMemAddressFree(va, size));
}

static int gpu_init(void)
{
	CUcontext ctx;
	CUmemAllocationProp p;

	if (!ok_wl(wl_context(0, &dev, &ctx)))
		return 0;
	p = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	return CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

static size_t round_up(size_t v)
{
	return (v + gran - 1) / gran * gran;
}

static int priv_setup(void)
{
	CUmemAllocationProp p;
	uint32_t key = 1000 + (uint32_t)wl_rank * 3;

	pv.vmm_size = round_up(PRIV_SIZE);
	if (!CK(cuMemAlloc(&pv.linear, PRIV_SIZE)) || !fill(pv.linear, PRIV_SIZE, key, 0))
		return 0;
	p = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (!CK(cuMemCreate(&pv.posix_h, pv.vmm_size, &p, 0)) || !map_rw(pv.posix_h, pv.vmm_size, &pv.posix_va) ||
	    !fill(pv.posix_va, pv.vmm_size, key + 1, 0))
		return 0;
	p = prop_of(CU_MEM_HANDLE_TYPE_NONE);
	return CK(cuMemCreate(&pv.none_h, pv.vmm_size, &p, 0)) && map_rw(pv.none_h, pv.vmm_size, &pv.none_va) &&
	       fill(pv.none_va, pv.vmm_size, key + 2, 0);
}

static int priv_check(void)
{
	uint32_t key = 1000 + (uint32_t)wl_rank * 3;

	return check(pv.linear, PRIV_SIZE, key, 0, "cuMemAlloc memory") &&
	       check(pv.posix_va, pv.vmm_size, key + 1, 0, "never-shared POSIX VMM memory") &&
	       check(pv.none_va, pv.vmm_size, key + 2, 0, "handle-type-0 VMM memory");
}

static void priv_teardown(void)
{
	CK(cuMemFree(pv.linear));
	unmap_free(pv.posix_va, pv.vmm_size);
	CK(cuMemRelease(pv.posix_h));
	unmap_free(pv.none_va, pv.vmm_size);
	CK(cuMemRelease(pv.none_h));
}

/* ---- messages ------------------------------------------------------------ */

/* FNV-1a over the bytes at va, read back from the device. */
static int sum(CUdeviceptr va, size_t size, uint32_t *h)
{
	return ok_wl(wl_device_sum(va, size, h));
}

/* One line for STATE: this process's pid, then every allocation it maps:
 * address, size and checksum of its bytes (shared ones first). */
static int state_line(uint32_t n)
{
	char line[2048];
	size_t len;
	uint32_t h;

	len = (size_t)snprintf(line, sizeof(line), "state %u rank %d pid %d:", n, wl_rank, (int)getpid());
	for (int i = 0; i < nsh; i++) {
		if (!sum(sh[i].va, sh[i].size, &h))
			return 0;
		len += (size_t)snprintf(line + len, sizeof(line) - len, " shared%d %#llx %zu MiB %08x", i,
					(unsigned long long)sh[i].va, sh[i].size >> 20, h);
	}
	const struct {
		const char *name;
		CUdeviceptr va;
		size_t size;
	} p[] = {{"cuMemAlloc", pv.linear, PRIV_SIZE},
		 {"posix", pv.posix_va, pv.vmm_size},
		 {"none", pv.none_va, pv.vmm_size}};
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) {
		if (!sum(p[i].va, p[i].size, &h))
			return 0;
		len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %#llx %zu MiB %08x", p[i].name,
					(unsigned long long)p[i].va, p[i].size >> 20, h);
	}
	fprintf(out, "%s\n", line);
	fflush(out);
	return 1;
}

static int send_msg(int s, const struct msg *m, int fd)
{
	return wl_send(s, m, sizeof(*m), fd);
}

static int recv_msg(int s, struct msg *m, int *fd)
{
	return wl_recv(s, m, sizeof(*m), fd);
}

static struct msg mk(int op, int idx, uint32_t version)
{
	struct msg m = {.op = op, .idx = idx, .version = version};
	return m;
}

/* ---- child --------------------------------------------------------------- */

static int import_map(int fd, size_t size, CUmemGenericAllocationHandle *h, CUdeviceptr *va)
{
	int ok = CK(cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));

	close(fd);
	return ok && map_rw(*h, size, va);
}

static int child_main(int s)
{
	struct msg m, r;
	int fd, ok = gpu_init() && priv_setup();

	for (;;) {
		if (recv_msg(s, &m, &fd))
			return 1;
		failure[0] = 0;
		switch (m.op) {
		case OP_ALLOC:
			sh[m.idx].size = m.size;
			sh[m.idx].version = m.version;
			if (m.idx + 1 > nsh)
				nsh = m.idx + 1;
			if (!ok)
				close(fd);
			else
				ok = import_map(fd, m.size, &sh[m.idx].h, &sh[m.idx].va) &&
				     check(sh[m.idx].va, m.size, (uint32_t)m.idx, m.version, "imported memory");
			break;
		case OP_READY:
			break;
		case OP_STATE:
			ok = state_line(m.round);
			break;
		case OP_VERIFY:
			ok = priv_check();
			for (int i = 0; ok && i < nsh; i++)
				ok = check(sh[i].va, sh[i].size, (uint32_t)i, sh[i].version, "shared memory");
			break;
		case OP_WRITE:
			sh[m.idx].version = m.version;
			ok = fill(sh[m.idx].va, sh[m.idx].size, (uint32_t)m.idx, m.version) && CK(cuCtxSynchronize());
			break;
		case OP_CHECK:
			sh[m.idx].version = m.version;
			ok = check(sh[m.idx].va, sh[m.idx].size, (uint32_t)m.idx, m.version,
				   "memory written by a peer");
			break;
		case OP_FRESH: {
			CUmemGenericAllocationHandle h;
			CUdeviceptr va;
			ok = import_map(fd, sh[m.idx].size, &h, &va) &&
			     check(va, sh[m.idx].size, (uint32_t)m.idx, m.version, "freshly imported memory");
			if (ok) {
				unmap_free(va, sh[m.idx].size);
				ok = CK(cuMemRelease(h)) && !failure[0];
			}
			break;
		}
		case OP_QUIT:
			for (int i = 0; i < nsh; i++) {
				unmap_free(sh[i].va, sh[i].size);
				CK(cuMemRelease(sh[i].h));
			}
			priv_teardown();
			r = mk(failure[0] ? OP_FAIL : OP_OK, 0, 0);
			snprintf(r.why, sizeof(r.why), "%s", failure);
			send_msg(s, &r, -1);
			return failure[0] ? 1 : 0;
		}
		if (fd >= 0 && m.op != OP_ALLOC && m.op != OP_FRESH)
			close(fd);
		r = mk(ok ? OP_OK : OP_FAIL, 0, 0);
		snprintf(r.why, sizeof(r.why), "%s", failure[0] ? failure : "setup failed");
		if (send_msg(s, &r, -1))
			return 1;
	}
}

/* ---- parent -------------------------------------------------------------- */

static int nchild;
static int peer[MAX_CHILD + 1]; /* rank 0: peer[c + 1] is child c's socket; a child: peer[0] */
static pid_t pids[MAX_CHILD + 1];
static int *const csock = peer + 1; /* child c's socket and pid */
static pid_t *const cpid = pids + 1;

/* Send to one child and wait for its answer. */
static int ask(int c, struct msg m, int fd)
{
	struct msg r;

	if (send_msg(csock[c], &m, fd) || recv_msg(csock[c], &r, NULL)) {
		fail("child %d (pid %d) is gone", c + 1, (int)cpid[c]);
		return 0;
	}
	if (r.op != OP_OK) {
		fail("%s", r.why);
		return 0;
	}
	return 1;
}

static int export_fd(int i, int *fd)
{
	return CK(cuMemExportToShareableHandle(fd, sh[i].h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

static int parent_setup(const size_t *sizes)
{
	CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	if (!gpu_init() || !priv_setup())
		return 0;
	for (int i = 0; i < nsh; i++) {
		sh[i].size = round_up(sizes[i]);
		if (!CK(cuMemCreate(&sh[i].h, sh[i].size, &p, 0)) || !map_rw(sh[i].h, sh[i].size, &sh[i].va) ||
		    !fill(sh[i].va, sh[i].size, (uint32_t)i, 0))
			return 0;
		for (int c = 0; c < nchild; c++) {
			int fd;
			struct msg m = mk(OP_ALLOC, i, 0);
			m.size = sh[i].size;
			if (!export_fd(i, &fd))
				return 0;
			int ok = ask(c, m, fd);
			close(fd);
			if (!ok)
				return 0;
		}
	}
	for (int c = 0; c < nchild; c++)
		if (!ask(c, mk(OP_READY, 0, 0), -1))
			return 0;
	return 1;
}

static int run_round(uint32_t round)
{
	int i = nsh ? (int)(round % (uint32_t)nsh) : 0;
	uint32_t v;

	failure[0] = 0;
	if (!priv_check())
		return 0;
	for (int k = 0; k < nsh; k++)
		if (!check(sh[k].va, sh[k].size, (uint32_t)k, sh[k].version, "shared memory"))
			return 0;
	for (int c = 0; c < nchild; c++)
		if (!ask(c, mk(OP_VERIFY, 0, 0), -1))
			return 0;
	if (!nsh)
		return 1;
	/* A write through one process is seen by every other. */
	v = sh[i].version + 1;
	if (nchild) {
		if (!ask(0, mk(OP_WRITE, i, v), -1))
			return 0;
	} else if (!fill(sh[i].va, sh[i].size, (uint32_t)i, v)) {
		return 0;
	}
	sh[i].version = v;
	if (!check(sh[i].va, sh[i].size, (uint32_t)i, v, "memory written by a peer"))
		return 0;
	for (int c = 1; c < nchild; c++)
		if (!ask(c, mk(OP_CHECK, i, v), -1))
			return 0;
	if (nchild)
		sh[i].version = v;
	/* A fresh export, imported at a new address. */
	if (nchild) {
		int fd, ok;
		if (!export_fd(i, &fd))
			return 0;
		ok = ask(nchild - 1, mk(OP_FRESH, i, v), fd);
		close(fd);
		if (!ok)
			return 0;
	}
	return 1;
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		want_round = 1;
	else if (sig == SIGUSR2)
		want_state = 1;
	else
		want_quit = 1;
}

static void report(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(FILE *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fflush(f);
	fsync(fileno(f));
}

int main(int argc, char **argv)
{
	size_t sizes[MAX_SHARED] = {2u << 20, 10u << 20, 32u << 20};
	const char *ready = NULL, *result = NULL;
	int once = 0, all_ok = 1, status;
	uint32_t round = 0;
	uint32_t nstate = 0;
	sigset_t block, old;

	out = stdout;

	nsh = 3;
	nchild = 2;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			nchild = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
			ready = argv[++i];
		} else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			result = argv[++i];
		} else if (!strcmp(argv[i], "--once")) {
			once = 1;
		} else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
			char *s = argv[++i], *e;
			for (nsh = 0; *s && nsh < MAX_SHARED; nsh++) {
				sizes[nsh] = (size_t)(strtod(s, &e) * (1 << 20));
				s = *e == ',' ? e + 1 : e;
			}
		} else {
			fprintf(stderr,
				"usage: %s [-n CHILDREN] [-r READY_FILE] [-o RESULT_FILE] [--once] "
				"[--sizes MiB,...]\n",
				argv[0]);
			return 2;
		}
	}
	if (nchild < 0 || nchild > MAX_CHILD) {
		fprintf(stderr, "vmm_share: at most %d children\n", MAX_CHILD);
		return 2;
	}
	if (result && !(out = fopen(result, "a"))) {
		perror(result);
		return 2;
	}
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGUSR2);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &old);
	signal(SIGUSR1, on_signal);
	signal(SIGUSR2, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);

	/* Children first, before any CUDA call. */
	if (wl_fork_ranks(nchild + 1, peer, pids, WL_CLOEXEC) < 0) {
		fprintf(stderr, "vmm_share: %s\n", wl_why);
		return 1;
	}
	if (wl_rank) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		signal(SIGUSR1, SIG_IGN);
		signal(SIGUSR2, SIG_IGN);
		signal(SIGINT, SIG_IGN);
		signal(SIGTERM, SIG_DFL);
		exit(child_main(peer[0]));
	}

	if (!parent_setup(sizes)) {
		report(out, "setup FAIL: %s\n", failure);
		all_ok = 0;
		want_quit = 1;
	} else if (ready) {
		FILE *f = fopen(ready, "w");
		if (f) {
			fprintf(f, "%d", (int)getpid());
			for (int c = 0; c < nchild; c++)
				fprintf(f, " %d", (int)cpid[c]);
			fprintf(f, "\n");
			fclose(f);
		}
	}
	if (once)
		want_round = 1;
	while (!want_quit) {
		if (want_round) {
			want_round = 0;
			round++;
			if (run_round(round)) {
				report(out, "round %u ok\n", round);
			} else {
				report(out, "round %u FAIL: %s\n", round, failure);
				all_ok = 0;
			}
			if (once)
				break;
			continue;
		}
		if (want_state) {
			struct msg m = mk(OP_STATE, 0, 0);
			int ok;

			want_state = 0;
			failure[0] = 0;
			m.round = ++nstate;
			ok = state_line(nstate);
			for (int c = 0; ok && c < nchild; c++)
				ok = ask(c, m, -1);
			if (ok)
				report(out, "state %u ok\n", nstate);
			else
				report(out, "state %u FAIL: %s\n", nstate, failure);
			continue;
		}
		sigsuspend(&old);
	}
	for (int c = 0; c < nchild; c++) {
		if (!ask(c, mk(OP_QUIT, 0, 0), -1)) {
			report(out, "teardown FAIL: %s\n", failure);
			all_ok = 0;
		}
		close(csock[c]);
	}
	if (nsh && sh[0].h) {
		for (int i = 0; i < nsh; i++) {
			unmap_free(sh[i].va, sh[i].size);
			CK(cuMemRelease(sh[i].h));
		}
		priv_teardown();
	}
	for (int c = 0; c < nchild; c++) {
		if (waitpid(cpid[c], &status, 0) != cpid[c] || !WIFEXITED(status) || WEXITSTATUS(status)) {
			report(out, "child %d (pid %d) exited badly\n", c + 1, (int)cpid[c]);
			all_ok = 0;
		}
	}
	if (failure[0] && all_ok) {
		report(out, "teardown FAIL: %s\n", failure);
		all_ok = 0;
	}
	return all_ok ? 0 : 1;
}
