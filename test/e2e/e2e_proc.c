/*
 * e2e_proc - a job shaped like a torch.multiprocessing one, for the tests of
 * processes that are not plain participants (issue 22):
 *
 *   e2e_proc DIR [--held] [--plain]
 *
 *   rank 0  the creator (the tree's root, interposer preloaded): NSH shared
 *           VMM allocations exported as tickets it keeps open, one cuMemAlloc
 *           shared by legacy IPC; sends its pid, the tickets' descriptor
 *           numbers and the IPC handle to every child as plain bytes
 *   rank 1  importer through pidfd_open + pidfd_getfd (PyTorch's
 *           expandable_segments): takes the creator's ticket descriptors
 *           itself, imports, maps, closes them (as torch does)
 *   rank 2  preloaded, no CUDA until told ("cuda 2"): the resource tracker
 *   rank 3  (--held) as rank 2, but its first cuInit is held inside the fake
 *           driver (FAKECUDA_INIT_HOLD=DIR/hold) until DIR/hold exists
 *   --sem   rank 0 also holds a named POSIX semaphore, as Python's
 *           multiprocessing makes them under spawn: glibc mapped it under a
 *           temporary name it then unlinked, the file lives on as sem.NAME
 *           (removed at exit)
 *   last    (--plain) runs without the interposer (LD_PRELOAD removed): own
 *           cuMemAlloc memory (native checkpoint); at start it tries the
 *           creator's ticket (via pidfd_getfd) and IPC handle, which must
 *           fail cleanly; the results are in its ready line
 *
 * Every rank writes DIR/r<rank>.ready ("pid <pid> ...") and serves commands
 * as e2e_group does (DIR/cmd "<seq> <verb> [a] [b]", answers DIR/r<rank>.<seq>):
 *
 *   cuda R G    rank R begins CUDA: cuInit, a context, a private cuMemAlloc
 *               with its pattern, then imports shared allocation 0 through
 *               pidfd_getfd and checks its bytes (generation G written)
 *   verify G    every byte of what this rank holds has its pattern; the first
 *               WRITE_LEN bytes of shared allocation 0 have generation G;
 *               answers "ok" and the addresses
 *   write R G   rank R writes generation G into shared allocation 0
 *   closesock R rank R closes its listening sockets (the interposer's)
 *   spawn K     rank 0 starts a new child (exec of itself, as spawn does):
 *               K=0 with the interposer and no CUDA, K=1 without the
 *               interposer and with CUDA; the child writes DIR/spawned<K>.ready
 *   rawcuda R   rank R initializes a second copy of the driver, loaded with
 *               dlmopen(LM_ID_NEWLM) where the interposer is not preloaded
 *   fork D      rank 0 forks a helper without exec (as a DataLoader worker
 *               is made), which forks one of its own when D is 2: each
 *               inherits what the driver mapped, writes DIR/forked<depth>.ready
 *               ("pid P") and sleeps; on SIGUSR1 it calls cuInit, cuDeviceGet
 *               and cuMemAlloc and appends their CUresults to
 *               DIR/forked<depth>.cuda; on SIGUSR2 it maps (PROT_NONE,
 *               shared) the device file E2E_OTHER_DEVICE names
 *
 * E2E_SOCKDIR_RANK=R:DIR gives rank R's first cuInit CUINTERPOSE_SOCKET_DIR=DIR.
 *   exit        leave (the children die with rank 0)
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "wl.h"

#define MIB	  (1ull << 20)
#define NSH	  2
#define WRITE_LEN (64 * 1024)
#define MAXRANK	  5

struct info { /* creator -> children, plain bytes */
	int32_t pid;
	int32_t fd[NSH];
	CUipcMemHandle ipc;
};

static const uint64_t sh_size[NSH] = {2 * MIB, 6 * MIB};
static const uint64_t priv_size = MIB + 4096;
static const uint64_t ipc_size = 2 * MIB;

static int held_rank = -1, plain_rank = -1, want_sem;
static char sem_name[64];
static struct info info;
static CUdevice dev;
static CUcontext ctx;
static bool cuda_on;
static CUmemGenericAllocationHandle sh_h[NSH];
static CUdeviceptr sh_va[NSH], priv_va, ipc_va;
static int nsh_mapped; /* importers: 1 (allocation 0), creator NSH */
static char extra[256];

#define CK(call) WL_CK(call)

static int start_cuda(void)
{
	if (wl_context(0, &dev, &ctx))
		return -1;
	CK(cuMemAlloc(&priv_va, priv_size));
	if (wl_put_pattern(priv_va, priv_size, 100 + (unsigned)wl_rank, 0))
		return -1;
	cuda_on = true;
	return 0;
}

/* PyTorch's expandable_segments: take the creator's descriptor itself. */
static int getfd(int num)
{
	int pidfd = (int)syscall(SYS_pidfd_open, info.pid, 0), fd;

	if (pidfd < 0)
		return wl_fail("pidfd_open(%d): %s", info.pid, strerror(errno));
	fd = (int)syscall(SYS_pidfd_getfd, pidfd, num, 0);
	close(pidfd);
	if (fd < 0)
		return wl_fail("pidfd_getfd(%d, %d): %s", info.pid, num, strerror(errno));
	return fd;
}

static int import_one(int k, unsigned gen)
{
	int fd = getfd(info.fd[k]);

	if (fd < 0)
		return -1;
	CUresult r = cuMemImportFromShareableHandle(&sh_h[k], (void *)(uintptr_t)fd,
						    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	if (r != CUDA_SUCCESS)
		return wl_fail("import of shared[%d] through pidfd_getfd: %s (%d)", k, wl_err(r), (int)r);
	if (wl_map(sh_h[k], sh_size[k], dev, 1, &sh_va[k]) ||
	    wl_check_pattern(sh_va[k], sh_size[k], (unsigned)k, k == 0 ? gen : 0, k == 0 ? WRITE_LEN : 0, "import"))
		return -1;
	return 0;
}

static int do_cuda(unsigned gen)
{
	if (cuda_on)
		return wl_fail("rank %d already uses CUDA", wl_rank);
	const char *sd = getenv("E2E_SOCKDIR_RANK");

	if (wl_rank == held_rank)
		setenv("FAKECUDA_INIT_HOLD", extra, 1);
	if (sd && atoi(sd) == wl_rank && strchr(sd, ':'))
		setenv("CUINTERPOSE_SOCKET_DIR", strchr(sd, ':') + 1, 1);
	if (start_cuda() || import_one(0, gen))
		return -1;
	nsh_mapped = 1;
	return 0;
}

/* CUDA begun behind the interposer's back: the driver loaded again in a
 * new link namespace (where LD_PRELOAD does not apply) and its cuInit
 * called directly. */
static int do_rawcuda(void)
{
	void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult (*init)(unsigned);

	if (!h)
		return wl_fail("dlmopen(libcuda.so.1): %s", dlerror());
	init = (CUresult(*)(unsigned))dlsym(h, "cuInit");
	if (!init)
		return wl_fail("no cuInit in the second libcuda");
	CK(init(0));
	return 0;
}

static pid_t spawned_pid[4];
static int nspawned;

static volatile sig_atomic_t forked_usr1, forked_usr2;

static void forked_signal(int sig)
{
	if (sig == SIGUSR1)
		forked_usr1 = 1;
	else
		forked_usr2 = 1;
}

/* A forked helper at depth d (1, 2): says it is ready, then answers the
 * signals until its parent dies. */
static __attribute__((noreturn)) void forked_helper(int depth)
{
	char path[4096];
	FILE *f;
	int d = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGUSR1, forked_signal);
	signal(SIGUSR2, forked_signal);
	while (d < depth && fork() == 0) { /* the child goes one deeper */
		d++;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	}
	snprintf(path, sizeof(path), "%s/forked%d.ready", wl_dir, d);
	f = fopen(path, "w");
	if (!f)
		_exit(1);
	fprintf(f, "pid %d\n", getpid());
	fclose(f);
	for (;;) {
		pause();
		if (forked_usr1) {
			CUdevice dv = -1;
			CUdeviceptr p = 0;
			CUresult ri, rd, rm;

			forked_usr1 = 0;
			ri = cuInit(0);
			rd = cuDeviceGet(&dv, 0);
			rm = cuMemAlloc(&p, 4096);
			snprintf(path, sizeof(path), "%s/forked%d.cuda", wl_dir, d);
			f = fopen(path, "a");
			if (f) {
				fprintf(f, "cuInit %d cuDeviceGet %d cuMemAlloc %d\n", (int)ri, (int)rd, (int)rm);
				fclose(f);
			}
		}
		if (forked_usr2) {
			const char *other = getenv("E2E_OTHER_DEVICE");
			int fd = other ? open(other, O_RDWR | O_CLOEXEC) : -1;

			forked_usr2 = 0;
			if (fd >= 0)
				mmap(NULL, 4096, PROT_NONE, MAP_SHARED, fd, 0);
			snprintf(path, sizeof(path), "%s/forked%d.other", wl_dir, d);
			f = fopen(path, "w");
			if (f) {
				fprintf(f, "%s\n", fd >= 0 ? "mapped" : "failed");
				fclose(f);
			}
		}
	}
}

static int do_fork(int depth)
{
	pid_t pid;

	if (depth < 1 || depth > 2)
		return wl_fail("fork depth %d: 1 or 2", depth);
	pid = fork();
	if (pid < 0)
		return wl_fail("fork: %s", strerror(errno));
	if (pid == 0)
		forked_helper(depth);
	return 0;
}

static int do_spawn(unsigned kind, const char *self)
{
	pid_t pid;

	if (nspawned == 4)
		return wl_fail("too many spawned children");
	pid = fork();

	if (pid < 0)
		return wl_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		char k[16];

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		snprintf(k, sizeof(k), "%u", kind);
		if (kind)
			unsetenv("LD_PRELOAD");
		execl("/proc/self/exe", self, "--spawned", wl_dir, k, (char *)NULL);
		_exit(127);
	}
	spawned_pid[nspawned++] = pid;
	return 0;
}

/* The spawned child: CUDA or not, then it says so and waits. */
static int spawned(unsigned kind)
{
	char path[4096];
	FILE *f;

	if (kind && start_cuda())
		return -1;
	snprintf(path, sizeof(path), "%s/spawned%u.ready", wl_dir, kind);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "pid %d\n", getpid());
	fclose(f);
	for (;;)
		pause();
}

/* Close every listening socket (as an application that closes descriptors
 * it does not know would close the interposer's). */
static int do_closesock(void)
{
	int n = 0;

	for (int fd = 3; fd < 1024; fd++) {
		int on = 0;
		socklen_t l = sizeof(on);

		if (!getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &l) && on && !close(fd))
			n++;
	}
	return n ? 0 : wl_fail("no listening socket to close");
}

static int do_verify(unsigned gen, char *out, size_t len)
{
	int n;

	if (!cuda_on) {
		snprintf(out, len, "ok no-cuda");
		return 0;
	}
	for (int k = 0; k < nsh_mapped; k++)
		if (wl_check_pattern(sh_va[k], sh_size[k], (unsigned)k, k == 0 ? gen : 0, k == 0 ? WRITE_LEN : 0,
				     "shared"))
			return -1;
	if (wl_check_pattern(priv_va, priv_size, 100 + (unsigned)wl_rank, 0, 0, "private"))
		return -1;
	if (wl_rank == 0 && wl_check_pattern(ipc_va, ipc_size, 7, 0, 0, "ipc"))
		return -1;
	n = snprintf(out, len, "ok priv %#llx", (unsigned long long)priv_va);
	for (int k = 0; k < nsh_mapped; k++)
		n += snprintf(out + n, len - (size_t)n, " sh%d %#llx", k, (unsigned long long)sh_va[k]);
	return 0;
}

static const char *self_name = "e2e_proc";

static int command(const char *verb, unsigned a, unsigned b, char *out, size_t len)
{
	if (!strcmp(verb, "verify"))
		return do_verify(a, out, len);
	if (!strcmp(verb, "write"))
		return (int)a == wl_rank && cuda_on ? wl_put_pattern(sh_va[0], WRITE_LEN, 0, b) : 0;
	if (!strcmp(verb, "cuda"))
		return (int)a == wl_rank ? do_cuda(b) : 0;
	if (!strcmp(verb, "spawn"))
		return wl_rank == 0 ? do_spawn(a, self_name) : 0;
	if (!strcmp(verb, "fork"))
		return wl_rank == 0 ? do_fork((int)a) : 0;
	if (!strcmp(verb, "rawcuda"))
		return (int)a == wl_rank ? do_rawcuda() : 0;
	if (!strcmp(verb, "closesock"))
		return (int)a == wl_rank ? do_closesock() : 0;
	if (!strcmp(verb, "exit")) {
		if (sem_name[0])
			sem_unlink(sem_name);
		return WL_EXIT;
	}
	return wl_fail("unknown command %s", verb);
}

static int creator(void)
{
	CUmemAllocationProp p;

	if (start_cuda())
		return -1;
	p = wl_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	info.pid = getpid();
	for (int k = 0; k < NSH; k++) {
		CK(cuMemCreate(&sh_h[k], sh_size[k], &p, 0));
		if (wl_map(sh_h[k], sh_size[k], dev, 1, &sh_va[k]) ||
		    wl_put_pattern(sh_va[k], sh_size[k], (unsigned)k, 0))
			return -1;
		CK(cuMemExportToShareableHandle(&info.fd[k], sh_h[k], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	}
	nsh_mapped = NSH;
	CK(cuMemAlloc(&ipc_va, ipc_size));
	if (wl_put_pattern(ipc_va, ipc_size, 7, 0))
		return -1;
	CK(cuIpcGetMemHandle(&info.ipc, ipc_va));
	return 0;
}

/* Without the interposer: a ticket and an emulated IPC handle are nothing
 * the driver knows; both must fail, and the process goes on. */
static int plain(void)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	CUresult ri, rp;
	int fd;

	if (start_cuda())
		return -1;
	fd = getfd(info.fd[0]);
	if (fd < 0)
		return -1;
	ri = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	if (ri == CUDA_SUCCESS)
		return wl_fail("a process without the interposer imported a ticket");
	rp = cuIpcOpenMemHandle(&va, info.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (rp == CUDA_SUCCESS)
		return wl_fail("a process without the interposer opened an emulated IPC handle");
	snprintf(extra, sizeof(extra), " ticket-import %d ipc-open %d", (int)ri, (int)rp);
	return 0;
}

int main(int argc, char **argv)
{
	int peer[MAXRANK], nranks = 3;

	wl_prog = "e2e_proc";
	if (argc == 4 && !strcmp(argv[1], "--spawned")) {
		wl_dir = argv[2];
		wl_rank = 9;
		return spawned((unsigned)atoi(argv[3])) ? 1 : 0;
	}
	self_name = argv[0];
	if (argc == 6 && !strcmp(argv[1], "--plain-child")) {
		wl_dir = argv[2];
		wl_rank = plain_rank = atoi(argv[3]);
		if (wl_recv(atoi(argv[4]), &info, sizeof(info), NULL))
			return wl_failed(wl_prog);
		goto run;
	}
	if (argc < 2) {
		fprintf(stderr, "usage: e2e_proc DIR [--held] [--plain]\n");
		return 2;
	}
	wl_dir = argv[1];
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--held"))
			held_rank = nranks++;
		else if (!strcmp(argv[i], "--plain"))
			plain_rank = nranks++;
		else if (!strcmp(argv[i], "--sem"))
			want_sem = 1;
	}
	snprintf(extra, sizeof(extra), "%s/hold", wl_dir); /* the held rank's release file */
	/* Fork every child before any CUDA call (as spawn would start them). */
	if (wl_fork_ranks(nranks, peer, NULL, WL_PDEATHSIG | WL_CLOEXEC) < 0)
		return wl_failed(wl_prog);
	if (wl_rank && wl_rank == plain_rank) {
		char a[16], b[16];
		int fd = dup(peer[0]); /* without CLOEXEC, for the exec */
		snprintf(a, sizeof(a), "%d", wl_rank);
		snprintf(b, sizeof(b), "%d", fd);
		unsetenv("LD_PRELOAD");
		execl("/proc/self/exe", argv[0], "--plain-child", wl_dir, a, b, "x", (char *)NULL);
		_exit(127);
	}
	if (wl_rank) {
		if (wl_recv(peer[0], &info, sizeof(info), NULL))
			_exit(1);
		goto run;
	}
	if (creator())
		return wl_failed(wl_prog);
	if (want_sem) {
		sem_t *sem;

		snprintf(sem_name, sizeof(sem_name), "/cuip-e2e-%d", (int)getpid());
		sem = sem_open(sem_name, O_CREAT | O_EXCL, 0600, 1);
		if (sem == SEM_FAILED) {
			wl_fail("sem_open(%s): %s", sem_name, strerror(errno));
			return wl_failed(wl_prog);
		}
	}
	for (int r = 1; r < nranks; r++)
		if (wl_send(peer[r], &info, sizeof(info), -1))
			return wl_failed(wl_prog);
run:
	if (wl_rank == 1 && (start_cuda() || import_one(0, 0) || import_one(1, 0)))
		return wl_failed(wl_prog);
	if (wl_rank == 1)
		nsh_mapped = NSH;
	if (wl_rank == plain_rank && plain())
		return wl_failed(wl_prog);
	if (wl_ready("pid %d rank %d cuda %d%s", getpid(), wl_rank, cuda_on, wl_rank == plain_rank ? extra : ""))
		return 1;
	wl_serve(command, 20);
	for (int i = 0; i < nspawned; i++)
		kill(spawned_pid[i], SIGKILL); /* they wait forever */
	if (wl_rank == 0)
		wl_reap();
	return 0;
}
