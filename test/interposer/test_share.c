/*
 * test_share.c - tickets, the export cache and the peer FD service, fork,
 * and the control protocol's framing.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)

START_TEST(export_mints_sealed_tickets_from_one_export)
{
	CUmemGenericAllocationHandle h;
	size_t g;
	int fds, t1, t2;
	uint8_t buf[4096];
	Cuip__Ticket *t;
	Cuip__ProcessState *st;
	char err[128];

	h_init(0);
	g = h_gran();
	h_create_map(g, &h);
	fds = h_nfds();
	t1 = h_export(h);
	t2 = h_export(h);
	/* two tickets + one cached real export */
	ck_assert_int_eq(h_nfds(), fds + 3);
	ck_assert_int_eq(fcntl(t1, F_GET_SEALS), SEALS);
	ssize_t n = pread(t1, buf, sizeof(buf), 0);
	ck_assert_int_gt(n, 0);
	ck_assert_int_eq(cuip_decode(buf, (size_t)n, CUIP_KIND_TICKET, &cuip__ticket__descriptor, NULL,
				     (ProtobufCMessage **)&t, err, sizeof(err)),
			 0);
	st = h_state(0);
	ck_assert_uint_eq(t->alloc->creator, st->self->id);
	ck_assert_uint_eq(t->alloc->serial, st->allocations[0]->id->serial);
	ck_assert_uint_eq(t->creator->pid, getpid());
	ck_assert_uint_eq(t->token.len, 16);
	ck_assert_str_eq(t->creator_socket, st->socket);
	ck_assert_int_eq(st->allocations[0]->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert(st->allocations[0]->exported);
	ck_assert_uint_eq(st->n_tickets, 1);
	h_state_free(st);
	cuip__ticket__free_unpacked(t, NULL);
	/* The seals hold. */
	ck_assert_int_lt(write(t1, "x", 1), 0);
	ck_assert_int_lt(ftruncate(t1, 0), 0);
	close(t1);
	close(t2);
}
END_TEST

START_TEST(same_process_import_aliases)
{
	CUmemGenericAllocationHandle h, h2;
	Cuip__ProcessState *st;
	int t;

	h_init(0);
	h_create_map(h_gran(), &h);
	t = h_export(h);
	CK(cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	ck_assert_uint_eq(h2, h);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_uint_eq(st->allocations[0]->app_handles, 2);
	ck_assert_uint_eq(st->counters->raw_imports, 0);
	h_state_free(st);
	close(t);
}
END_TEST

static int memfd_with(const void *buf, size_t len, bool seal)
{
	int fd = memfd_create("t", MFD_ALLOW_SEALING | MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
	if (seal)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, SEALS), 0);
	return fd;
}

START_TEST(malformed_tickets_unsealed_memfds_and_devices_are_not_tickets)
{
	CUmemGenericAllocationHandle h, out = 0x77;
	uint8_t buf[4096];
	Cuip__ProcessState *st;
	int t, bad, unsealed, dev;
	ssize_t n;

	h_init(0);
	h_create_map(h_gran(), &h);
	t = h_export(h);
	n = pread(t, buf, sizeof(buf), 0);
	/* Our magic, corrupt payload, sealed: a malformed ticket. */
	buf[n - 1] ^= 0xff;
	bad = memfd_with(buf, (size_t)n, true);
	CK_ERR(cuMemImportFromShareableHandle(&out, (void *)(uintptr_t)bad, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	       CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(out, 0x77);
	/* A valid ticket's bytes in an unsealed memfd: not a ticket, the
	 * driver gets it (and refuses it). */
	buf[n - 1] ^= 0xff;
	unsealed = memfd_with(buf, (size_t)n, false);
	ck_assert_int_ne(cuMemImportFromShareableHandle(&out, (void *)(uintptr_t)unsealed,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
			 CUDA_SUCCESS);
	dev = open("/dev/null", O_RDWR | O_CLOEXEC);
	ck_assert_int_ne(
		cuMemImportFromShareableHandle(&out, (void *)(uintptr_t)dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		CUDA_SUCCESS);
	ck_assert_uint_eq(out, 0x77);
	st = h_state(0);
	ck_assert_uint_eq(st->allocations[0]->app_handles, 1);
	ck_assert_uint_eq(st->counters->raw_imports, 0);
	h_state_free(st);
	close(t);
	close(bad);
	close(unsealed);
	close(dev);
}
END_TEST

START_TEST(raw_imports_pass_through_and_are_counted_until_released)
{
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) =
		h_real("cuMemCreate");
	CUresult (*export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) =
		h_real("cuMemExportToShareableHandle");
	CUresult (*release)(CUmemGenericAllocationHandle) = h_real("cuMemRelease");
	CUmemGenericAllocationHandle raw, imp;
	CUmemAllocationProp p;
	Cuip__ProcessState *st;
	int fd;

	h_init(0);
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(create(&raw, h_gran(), &p, 0));
	CK(export(&fd, raw, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CK(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	ck_assert_uint_ne(imp >> TAG_SHIFT, TAG);
	st = h_state(0);
	ck_assert_uint_eq(st->counters->raw_imports, 1);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
	CK(cuMemRelease(imp));
	st = h_state(0);
	ck_assert_uint_eq(st->counters->raw_imports, 0);
	h_state_free(st);
	CK(release(raw));
	close(fd);
}
END_TEST

/* ---- across processes ---------------------------------------------------- */

struct xarg {
	size_t size;
	uint32_t seed;
	int expect_fail;
};

/* Child: receive a ticket, import, map, check the parent's bytes, write a
 * new pattern, tell the parent. */
static int importer(void *arg, int sock)
{
	struct xarg *x = arg;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	char c;
	int t, fds;
	CUresult r;

	h_init(0);
	fds = h_nfds();
	t = h_recv_fd(sock, x, sizeof(*x));
	if (t < 0)
		return 10;
	(void)c;
	r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(t);
	if (x->expect_fail) {
		/* failed cleanly: an error, and nothing left open */
		return r != CUDA_SUCCESS && h_nfds() == fds ? 0 : 11;
	}
	if (r != CUDA_SUCCESS)
		return 12;
	if (cuMemAddressReserve(&va, x->size, 0, 0, 0) || cuMemMap(va, x->size, 0, h, 0) ||
	    cuMemSetAccess(va, x->size, &d, 1))
		return 13;
	if (!h_check(va, x->size, x->seed))
		return 14;
	Cuip__ProcessState *st = h_state(0);
	if (st->n_allocations != 1 || st->allocations[0]->origin != CUIP__ORIGIN__ORIGIN_VMM_IMPORT ||
	    st->allocations[0]->id->creator == st->self->id || st->allocations[0]->creator_pid != getppid())
		return 15;
	h_state_free(st);
	h_fill(va, x->size, x->seed + 1);
	if (write(sock, "w", 1) != 1 || read(sock, &c, 1) != 1)
		return 16;
	h_unmap_release(va, x->size, h);
	return 0;
}

START_TEST(forked_child_imports_from_its_parent)
{
	struct xarg x = {0};
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	pid_t pid;
	int sock, t;
	char c;

	pid = h_fork(importer, &x, &sock); /* before any CUDA use here */
	h_init(0);
	x.size = 3 * h_gran();
	x.seed = 42;
	va = h_create_map(x.size, &h);
	h_fill(va, x.size, 42);
	t = h_export(h);
	ck_assert_int_eq(h_send_fd(sock, t, &x, sizeof(x)), 0);
	close(t);
	if (read(sock, &c, 1) != 1)
		ck_abort_msg("importer exited with %d", h_wait(pid));
	ck_assert(h_check(va, x.size, 43)); /* the child's write */
	Cuip__ProcessState *st = h_state(0);
	ck_assert_uint_ge(st->counters->exports_served, 1);
	h_state_free(st);
	ck_assert_int_eq(write(sock, "q", 1), 1);
	ck_assert_int_eq(h_wait(pid), 0);
	h_unmap_release(va, x.size, h);
}
END_TEST

START_TEST(import_after_the_creator_released_fails_cleanly)
{
	struct xarg x = {.expect_fail = 1};
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	pid_t pid;
	int sock, t;

	pid = h_fork(importer, &x, &sock);
	h_init(0);
	x.size = h_gran();
	va = h_create_map(x.size, &h);
	t = h_export(h);
	h_unmap_release(va, x.size, h);
	ck_assert_int_eq(h_send_fd(sock, t, &x, sizeof(x)), 0);
	close(t);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* ---- the export cache ---------------------------------------------------- */

struct racer {
	pthread_barrier_t *b;
	CUmemGenericAllocationHandle h;
	int fd;
	CUresult r;
};

static void *race_export(void *arg)
{
	struct racer *r = arg;

	pthread_barrier_wait(r->b);
	r->r = cuMemExportToShareableHandle(&r->fd, r->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	return NULL;
}

START_TEST(eight_threads_exporting_at_once_call_the_driver_once)
{
	pthread_barrier_t b;
	pthread_t th[8];
	struct racer r[8];
	CUmemGenericAllocationHandle h;
	int fds;

	/* run-test.sh sets nothing; the second driver export would fail here. */
	setenv("FAKECUDA_FAIL", "cuMemExportToShareableHandle:2:CUDA_ERROR_UNKNOWN", 1);
	h_init(0);
	h_create_map(h_gran(), &h);
	fds = h_nfds();
	pthread_barrier_init(&b, NULL, 8);
	for (int i = 0; i < 8; i++) {
		r[i] = (struct racer){.b = &b, .h = h, .fd = -1};
		ck_assert_int_eq(pthread_create(&th[i], NULL, race_export, &r[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(r[i].r, CUDA_SUCCESS);
		ck_assert_int_ge(r[i].fd, 0);
	}
	ck_assert_int_eq(h_nfds(), fds + 8 + 1);
	for (int i = 0; i < 8; i++)
		close(r[i].fd);
	pthread_barrier_destroy(&b);
}
END_TEST

START_TEST(a_failed_driver_export_leaves_the_allocation_native)
{
	CUmemGenericAllocationHandle h;
	int fd = 1234, fds;
	Cuip__ProcessState *st;

	setenv("FAKECUDA_FAIL", "cuMemExportToShareableHandle:1:CUDA_ERROR_OUT_OF_MEMORY", 1);
	h_init(0);
	h_create_map(h_gran(), &h);
	fds = h_nfds();
	CK_ERR(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
	       CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_int_eq(fd, 1234);
	ck_assert_int_eq(h_nfds_settled(fds), fds);
	st = h_state(0);
	ck_assert_int_eq(st->allocations[0]->owner, CUIP__OWNER__OWNER_NATIVE);
	h_state_free(st);
	fd = h_export(h);
	close(fd);
}
END_TEST

/* Child: import a fresh ticket `n` times while the parent churns. */
static int churn_importer(void *arg, int sock)
{
	int n = *(int *)arg;
	char c;

	h_init(0);
	for (int i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		int t = h_recv_fd(sock, &c, 1);
		if (t < 0)
			return 10;
		CUresult r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)t,
							    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		close(t);
		if (r != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS)
			return 11;
	}
	return 0;
}

struct churn {
	volatile int stop;
	int rounds;
};

static void *churner(void *arg)
{
	struct churn *c = arg;
	size_t g = h_gran();

	while (!c->stop) {
		CUmemGenericAllocationHandle h;
		CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (cuMemCreate(&h, g, &p, 0) != CUDA_SUCCESS)
			break;
		int fd = -1;
		if (cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS)
			close(fd);
		cuMemRelease(h);
		c->rounds++;
	}
	return NULL;
}

START_TEST(the_listener_keeps_serving_while_allocations_churn)
{
	int n = 100, sock;
	struct churn c = {0};
	CUmemGenericAllocationHandle h;
	pthread_t th;
	pid_t pid;

	pid = h_fork(churn_importer, &n, &sock);
	h_init(0);
	h_create_map(h_gran(), &h);
	ck_assert_int_eq(pthread_create(&th, NULL, churner, &c), 0);
	for (int i = 0; i < n; i++) {
		int t = h_export(h);
		ck_assert_int_eq(h_send_fd(sock, t, "t", 1), 0);
		close(t);
	}
	ck_assert_int_eq(h_wait(pid), 0);
	c.stop = 1;
	pthread_join(th, NULL);
	ck_assert_int_gt(c.rounds, 0);
}
END_TEST

/* Lower RLIMIT_NOFILE to the highest open descriptor and fill every hole
 * below it, so that the next descriptor allocation fails with EMFILE.
 * Returns the dups to close afterwards (in fill[]). */
static int exhaust(struct rlimit *saved, int *fill, int max)
{
	struct rlimit low;
	int highest = 0, n = 0, fd;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	while ((de = readdir(d)))
		if (atoi(de->d_name) > highest)
			highest = atoi(de->d_name);
	closedir(d);
	getrlimit(RLIMIT_NOFILE, saved);
	low = (struct rlimit){.rlim_cur = (rlim_t)highest + 1, .rlim_max = saved->rlim_max};
	setrlimit(RLIMIT_NOFILE, &low);
	while (n < max && (fd = dup(0)) >= 0)
		fill[n++] = fd;
	return n;
}

static void unexhaust(const struct rlimit *saved, int *fill, int n)
{
	while (n--)
		close(fill[n]);
	setrlimit(RLIMIT_NOFILE, saved);
}

static int exhausted_importer(void *arg, int sock)
{
	struct rlimit rl;
	char c;
	int t, fds;
	CUmemGenericAllocationHandle h;
	CUresult r;

	(void)arg;
	h_init(0);
	t = h_recv_fd(sock, &c, 1);
	if (t < 0)
		return 10;
	int fill[256], nf;
	fds = h_nfds();
	/* No room for the socket to the creator, let alone the FD. */
	nf = exhaust(&rl, fill, 256);
	r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	unexhaust(&rl, fill, nf);
	if (r == CUDA_SUCCESS || h_nfds() != fds)
		return 11;
	/* With room again, the same ticket imports. */
	r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(t);
	return r == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS ? 0 : 12;
}

START_TEST(descriptor_exhaustion_fails_cleanly)
{
	CUmemGenericAllocationHandle h;
	struct rlimit rl;
	int fd = 4321, fds, sock, t, fill[256], nf;
	pid_t pid;

	pid = h_fork(exhausted_importer, NULL, &sock);
	h_init(0);
	h_create_map(h_gran(), &h);
	/* Creator side: no descriptor for the export or the ticket. */
	fds = h_nfds();
	nf = exhaust(&rl, fill, 256);
	CUresult r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	unexhaust(&rl, fill, nf);
	ck_assert_int_ne(r, CUDA_SUCCESS);
	ck_assert_int_eq(fd, 4321);
	ck_assert_int_le(h_nfds(), fds + 1); /* at most the cached export */
	/* Importer side. */
	t = h_export(h);
	ck_assert_int_eq(h_send_fd(sock, t, "t", 1), 0);
	close(t);
	ck_assert_int_eq(h_wait(pid), 0);
}
END_TEST

/* ---- fork ---------------------------------------------------------------- */

static int fresh_child(void *arg, int sock)
{
	CUmemGenericAllocationHandle h = *(CUmemGenericAllocationHandle *)arg;
	char path[256];

	(void)sock;
	/* Inherited records are not used: the parent's handle means nothing here. */
	if (cuMemRelease(h) != CUDA_ERROR_INVALID_VALUE)
		return 10;
	/* No socket of our own until we use CUDA. */
	if (h_sock_path(getpid(), path, sizeof(path)) == 0)
		return 11;
	return 0;
}

START_TEST(a_forked_child_starts_with_fresh_state)
{
	CUmemGenericAllocationHandle h;
	int sock;
	pid_t pid;

	h_init(0);
	h_create_map(h_gran(), &h);
	pid = h_fork(fresh_child, &h, &sock);
	ck_assert_int_eq(h_wait(pid), 0);
	/* ... and the parent's state is intact. */
	Cuip__ProcessState *st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	h_state_free(st);
}
END_TEST

/* ---- the control socket -------------------------------------------------- */

static int bind_at(const char *path, bool listening)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	if (listening)
		ck_assert_int_eq(listen(s, 1), 0);
	else {
		close(s);
		s = -1;
	}
	return s;
}

START_TEST(stale_sockets_of_dead_processes_are_removed)
{
	const char *dir = getenv("CUINTERPOSE_SOCKET_DIR");
	char stale[256], live[256];
	int l;

	mkdir(dir, 01777);
	/* pids that do not exist here; one socket still has a listener (a
	 * process of another pid namespace, say) and must stay. */
	snprintf(stale, sizeof(stale), "%s/999999-0000000000000001.sock", dir);
	snprintf(live, sizeof(live), "%s/999998-0000000000000002.sock", dir);
	bind_at(stale, false);
	l = bind_at(live, true);
	h_init(0);
	ck_assert_int_ne(access(stale, F_OK), 0);
	ck_assert_int_eq(access(live, F_OK), 0);
	close(l);
	unlink(live);
}
END_TEST

START_TEST(socket_threads_and_descriptors)
{
	char path[256], comm[64], p[300];
	struct stat sb;
	int ctl = 0, op = 0;
	bool before[1024] = {false};
	DIR *d;
	struct dirent *de;

	d = opendir("/proc/self/fd");
	while ((de = readdir(d)))
		if (atoi(de->d_name) < 1024)
			before[atoi(de->d_name)] = true;
	closedir(d);
	h_init(0);
	ck_assert_int_eq(h_sock_path(0, path, sizeof(path)), 0);
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert(S_ISSOCK(sb.st_mode));
	ck_assert_int_eq(sb.st_mode & 0777, 0600);
	d = opendir("/proc/self/task");
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(p, "r");
		if (f && fgets(comm, sizeof(comm), f)) {
			ctl += !strcmp(comm, "cuip-ctl\n");
			op += !strcmp(comm, "cuip-op\n");
		}
		if (f)
			fclose(f);
	}
	closedir(d);
	ck_assert_int_eq(ctl, 1);
	ck_assert_int_eq(op, 1);
	/* Every descriptor the interposer opened is close-on-exec. */
	d = opendir("/proc/self/fd");
	while ((de = readdir(d))) {
		int fd = atoi(de->d_name);
		if (de->d_name[0] == '.' || fd == dirfd(d) || (fd < 1024 && before[fd]))
			continue;
		ck_assert_msg(fcntl(fd, F_GETFD) & FD_CLOEXEC, "fd %d is not close-on-exec", fd);
	}
	closedir(d);
}
END_TEST

START_TEST(fetched_descriptors_are_close_on_exec_and_need_the_token)
{
	CUmemGenericAllocationHandle h;
	uint8_t buf[4096];
	Cuip__Ticket *t;
	char err[256];
	struct stat st1, st2;
	int tk, s, fd, fd2;

	h_init(0);
	h_create_map(h_gran(), &h);
	tk = h_export(h);
	ssize_t n = pread(tk, buf, sizeof(buf), 0);
	ck_assert_int_eq(cuip_decode(buf, (size_t)n, CUIP_KIND_TICKET, &cuip__ticket__descriptor, NULL,
				     (ProtobufCMessage **)&t, err, sizeof(err)),
			 0);
	s = h_connect(0);
	/* A single fetch (a batch of one): a close-on-exec dup of the export. */
	fd = cuip_fetch_on(s, t->alloc->creator, t->alloc->serial, t->token.data, t->token.len, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	fd2 = cuip_fetch_on(s, t->alloc->creator, t->alloc->serial, t->token.data, t->token.len, err, sizeof(err));
	ck_assert_int_ge(fd2, 0);
	ck_assert_int_eq(fstat(fd, &st1), 0);
	ck_assert_int_eq(fstat(fd2, &st2), 0);
	ck_assert_uint_eq(st1.st_ino, st2.st_ino); /* the same export both times */
	close(fd);
	close(fd2);
	/* A wrong token is refused, without a descriptor, and the message says why. */
	t->token.data[0] ^= 1;
	fd = cuip_fetch_on(s, t->alloc->creator, t->alloc->serial, t->token.data, t->token.len, err, sizeof(err));
	ck_assert_int_eq(fd, -EACCES);
	ck_assert_msg(strstr(err, "creator refused: allocation") && strstr(err, "token does not match"), "%s", err);
	close(s);
	cuip__ticket__free_unpacked(t, NULL);
	close(tk);
}
END_TEST

START_TEST(batched_fetch_answers_every_item_in_order)
{
	CUmemGenericAllocationHandle h[3];
	Cuip__Ticket *t[3];
	struct cuip_fetch_item it[6];
	uint8_t buf[4096], bad[16];
	struct stat st[6];
	char err[256];
	int tk[3], s;

	h_init(0);
	for (int i = 0; i < 3; i++) {
		h_create_map(h_gran(), &h[i]);
		tk[i] = h_export(h[i]);
		ssize_t n = pread(tk[i], buf, sizeof(buf), 0);
		ck_assert_int_eq(cuip_decode(buf, (size_t)n, CUIP_KIND_TICKET, &cuip__ticket__descriptor, NULL,
					     (ProtobufCMessage **)&t[i], err, sizeof(err)),
				 0);
	}
	s = h_connect(0);
	memcpy(bad, t[1]->token.data, sizeof(bad));
	bad[0] ^= 1;
	/* good, good, wrong token, good, unknown serial, the first one again */
	it[0] = (struct cuip_fetch_item){t[0]->alloc->serial, t[0]->token.data, t[0]->token.len, -1};
	it[1] = (struct cuip_fetch_item){t[1]->alloc->serial, t[1]->token.data, t[1]->token.len, -1};
	it[2] = (struct cuip_fetch_item){t[1]->alloc->serial, bad, sizeof(bad), -1};
	it[3] = (struct cuip_fetch_item){t[2]->alloc->serial, t[2]->token.data, t[2]->token.len, -1};
	it[4] = (struct cuip_fetch_item){t[2]->alloc->serial + 1000, t[2]->token.data, t[2]->token.len, -1};
	it[5] = it[0];
	ck_assert_int_eq(cuip_fetch_many_on(s, t[0]->alloc->creator, it, 6, err, sizeof(err)), 0);
	ck_assert_int_eq(it[2].fd, -EACCES);
	ck_assert_int_eq(it[4].fd, -ENOENT);
	ck_assert_str_eq(cuip_fetch_refusal(it[4].fd),
			 "not exported here (released, or never created by this process)");
	for (int i = 0; i < 6; i++) {
		if (i == 2 || i == 4)
			continue;
		ck_assert_int_ge(it[i].fd, 0);
		ck_assert(fcntl(it[i].fd, F_GETFD) & FD_CLOEXEC);
		ck_assert_int_eq(fstat(it[i].fd, &st[i]), 0);
	}
	/* Each FD is its own allocation's export: distinct objects, and the same
	 * one for the same allocation asked twice. */
	ck_assert(st[0].st_ino != st[1].st_ino && st[1].st_ino != st[3].st_ino && st[0].st_ino != st[3].st_ino);
	ck_assert_int_eq(st[5].st_ino, st[0].st_ino);
	for (int i = 0; i < 6; i++)
		if (it[i].fd >= 0)
			close(it[i].fd);
	/* Sizes out of bounds are refused before anything is sent... */
	ck_assert_int_eq(cuip_fetch_many_on(s, t[0]->alloc->creator, it, 0, err, sizeof(err)), -EINVAL);
	/* ...and by the creator, which answers an empty batch with an error. */
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__FetchMany fm = CUIP__FETCH_MANY__INIT;
	Cuip__Response *resp;
	int fd = -1;
	req.body_case = CUIP__REQUEST__BODY_FETCH_MANY;
	req.fetch_many = &fm;
	ck_assert_int_eq(h_request(s, &req, -1, &resp, &fd), 0);
	ck_assert_int_eq(resp->status, -EINVAL);
	ck_assert_int_eq(fd, -1);
	cuip__response__free_unpacked(resp, NULL);
	close(s);
	for (int i = 0; i < 3; i++) {
		cuip__ticket__free_unpacked(t[i], NULL);
		close(tk[i]);
	}
}
END_TEST

/* What the fetching child needs of the parent's export. */
struct fetch_arg {
	uint64_t creator, serial;
	uint8_t token[16];
};

/*
 * Child, outside the parent's CUDA: a FETCH_MANY whose reply the creator
 * cannot send (this end shut for reading first: the creator's send fails
 * with EPIPE, deterministically), 'a' once the creator hung up; on 'b', a
 * FETCH_MANY that works, 'c'; then waits for 'q', alive, so that INSPECT
 * does not forget it as gone.
 */
static int unsent_fetcher(void *arg, int sock)
{
	struct fetch_arg *fa = arg;
	struct cuip_fetch_item it;
	struct pollfd pf;
	char path[256], why[256], c;
	int s;

	if (h_recv_fd(sock, fa, sizeof(*fa)) != -1)
		return 10;
	if (h_sock_path(getppid(), path, sizeof(path)) || (s = cuip_client_connect(path)) < 0)
		return 11;
	if (cuip_client_handshake(s, "test", 0, NULL, why, sizeof(why)))
		return 12;
	if (shutdown(s, SHUT_RD))
		return 13;
	it = (struct cuip_fetch_item){fa->serial, fa->token, sizeof(fa->token), -1};
	if (cuip_fetch_many_send(s, fa->creator, &it, 1, why, sizeof(why)))
		return 14;
	pf = (struct pollfd){.fd = s, .events = 0};
	if (poll(&pf, 1, 10000) != 1 || !(pf.revents & POLLHUP)) /* the creator closed it */
		return 15;
	close(s);
	if (write(sock, "a", 1) != 1 || read(sock, &c, 1) != 1 || c != 'b')
		return 16;
	if ((s = cuip_client_connect(path)) < 0 || cuip_client_handshake(s, "test", 0, NULL, why, sizeof(why)))
		return 17;
	it = (struct cuip_fetch_item){fa->serial, fa->token, sizeof(fa->token), -1};
	if (cuip_fetch_many_on(s, fa->creator, &it, 1, why, sizeof(why)) || it.fd < 0)
		return 18;
	close(it.fd);
	close(s);
	if (write(sock, "c", 1) != 1 || read(sock, &c, 1) != 1 || c != 'q')
		return 19;
	return 0;
}

/* This process's one allocation, by INSPECT: its recorded importers. */
static Cuip__ProcessState *one_alloc_state(void)
{
	Cuip__ProcessState *st = h_state(0);

	ck_assert_uint_eq(st->n_allocations, 1);
	return st;
}

START_TEST(a_fetch_whose_reply_is_not_sent_records_no_importer)
{
	struct fetch_arg fa = {0};
	CUmemGenericAllocationHandle h;
	Cuip__ProcessState *st;
	Cuip__Ticket *t = NULL;
	uint8_t buf[512];
	char err[256], c;
	CUdeviceptr va;
	pid_t pid;
	ssize_t n;
	int sock, tk;

	pid = h_fork(unsent_fetcher, &fa, &sock);
	h_init(0);
	va = h_create_map(h_gran(), &h);
	tk = h_export(h);
	n = pread(tk, buf, sizeof(buf), 0);
	ck_assert_int_eq(cuip_decode(buf, (size_t)n, CUIP_KIND_TICKET, &cuip__ticket__descriptor, NULL,
				     (ProtobufCMessage **)&t, err, sizeof(err)),
			 0);
	fa.creator = t->alloc->creator;
	fa.serial = t->alloc->serial;
	ck_assert_uint_eq(t->token.len, sizeof(fa.token));
	memcpy(fa.token, t->token.data, sizeof(fa.token));
	cuip__ticket__free_unpacked(t, NULL);
	ck_assert_int_eq(h_send(sock, &fa, sizeof(fa)), 0);
	if (read(sock, &c, 1) != 1 || c != 'a')
		ck_abort_msg("fetcher exited with %d", h_wait(pid));
	/* The FD never left: the child is no importer, and nothing was dropped. */
	st = one_alloc_state();
	ck_assert_msg(st->allocations[0]->n_importers == 0,
		      "a fetch whose reply was not sent left %zu importer(s), the first pid %d (the fetcher is %d)",
		      st->allocations[0]->n_importers,
		      st->allocations[0]->n_importers ? st->allocations[0]->importers[0]->pid : 0, (int)pid);
	ck_assert_uint_eq(st->allocations[0]->importers_dropped, 0);
	ck_assert_uint_eq(st->counters->exports_served, 0);
	h_state_free(st);
	/* The same peer's fetch that is answered is recorded. */
	ck_assert_int_eq(write(sock, "b", 1), 1);
	if (read(sock, &c, 1) != 1 || c != 'c')
		ck_abort_msg("fetcher exited with %d", h_wait(pid));
	st = one_alloc_state();
	ck_assert_uint_eq(st->allocations[0]->n_importers, 1);
	ck_assert_int_eq(st->allocations[0]->importers[0]->pid, pid);
	ck_assert_uint_eq(st->allocations[0]->importers_dropped, 0);
	ck_assert_uint_eq(st->counters->exports_served, 1);
	h_state_free(st);
	ck_assert_int_eq(write(sock, "q", 1), 1);
	ck_assert_int_eq(h_wait(pid), 0);
	close(tk);
	h_unmap_release(va, h_gran(), h);
}
END_TEST

/* The server closed its copy of a pipe's read end iff writing fails. */
static bool reader_closed(int wfd)
{
	return write(wfd, "x", 1) < 0 && errno == EPIPE;
}

START_TEST(malformed_messages_close_the_connection_and_leak_nothing)
{
	char path[256], junk[64];
	int fds, s, pp[2];

	signal(SIGPIPE, SIG_IGN);
	h_init(0);
	ck_assert_int_eq(h_sock_path(0, path, sizeof(path)), 0);
	usleep(10000);
	fds = h_nfds();
	for (int kind = 0; kind < 4; kind++) {
		ck_assert_int_eq(pipe2(pp, O_CLOEXEC), 0);
		s = cuip_client_connect(path);
		ck_assert_int_ge(s, 0);
		memset(junk, 0xa5, sizeof(junk));
		if (kind == 1) {
			struct cuip_frame fr = {CUIP_MAGIC, CUIP_FORMAT_VERSION, CUIP_KIND_REQUEST, 1u << 30, 0};
			memcpy(junk, &fr, sizeof(fr)); /* too long */
		} else if (kind == 2) {
			struct cuip_frame fr = {CUIP_MAGIC, 99, CUIP_KIND_REQUEST, 4, 0};
			memcpy(junk, &fr, sizeof(fr)); /* wrong version */
		} else if (kind == 3) {
			struct cuip_frame fr = {CUIP_MAGIC, CUIP_FORMAT_VERSION, CUIP_KIND_REQUEST, 8, 0};
			memcpy(junk, &fr, sizeof(fr)); /* bad checksum */
		}
		ck_assert_int_eq(h_send_fd(s, pp[0], junk, kind == 1 || kind == 2 ? 16 : sizeof(junk)), 0);
		close(pp[0]);
		/* the server hangs up */
		char c;
		ck_assert_int_le(read(s, &c, 1), 0);
		close(s);
		ck_assert(reader_closed(pp[1]));
		close(pp[1]);
	}
	/* A request before the handshake. */
	s = cuip_client_connect(path);
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp;
	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ck_assert_int_eq(h_request(s, &req, -1, &resp, NULL), 0);
	ck_assert_int_eq(resp->status, -EPROTO);
	cuip__response__free_unpacked(resp, NULL);
	close(s);
	/* A handshake with the wrong protocol version. */
	s = cuip_client_connect(path);
	Cuip__Handshake hs = CUIP__HANDSHAKE__INIT;
	hs.protocol = CUIP_FORMAT_VERSION + 1;
	req.body_case = CUIP__REQUEST__BODY_HANDSHAKE;
	req.handshake = &hs;
	ck_assert_int_eq(h_request(s, &req, -1, &resp, NULL), 0);
	ck_assert_int_eq(resp->status, -EPROTONOSUPPORT);
	cuip__response__free_unpacked(resp, NULL);
	close(s);
	usleep(20000);
	ck_assert_int_eq(h_nfds_settled(fds), fds);
	/* Still serving. */
	Cuip__ProcessState *st = h_state(0);
	h_state_free(st);
}
END_TEST

START_TEST(a_peer_that_hangs_up_raises_no_sigpipe)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	int s;

	signal(SIGPIPE, SIG_DFL);
	h_init(0);
	for (int i = 0; i < 20; i++) {
		s = h_connect(0);
		req.body_case = CUIP__REQUEST__BODY_INSPECT;
		req.inspect = 1;
		ck_assert_int_eq(cuip_msg_send(s, CUIP_KIND_REQUEST, &req.base, -1), 0);
		close(s); /* before the answer */
	}
	usleep(50000);
	Cuip__ProcessState *st = h_state(0); /* alive and serving */
	h_state_free(st);
}
END_TEST

Suite *share_suite(void);
Suite *share_suite(void)
{
	Suite *s = suite_create("share");
	TCase *tc = tcase_create("tickets");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, export_mints_sealed_tickets_from_one_export);
	tcase_add_test(tc, same_process_import_aliases);
	tcase_add_test(tc, malformed_tickets_unsealed_memfds_and_devices_are_not_tickets);
	tcase_add_test(tc, raw_imports_pass_through_and_are_counted_until_released);
	tcase_add_test(tc, forked_child_imports_from_its_parent);
	tcase_add_test(tc, import_after_the_creator_released_fails_cleanly);
	tcase_add_test(tc, eight_threads_exporting_at_once_call_the_driver_once);
	tcase_add_test(tc, a_failed_driver_export_leaves_the_allocation_native);
	tcase_add_test(tc, the_listener_keeps_serving_while_allocations_churn);
	tcase_add_test(tc, descriptor_exhaustion_fails_cleanly);
	tcase_add_test(tc, a_forked_child_starts_with_fresh_state);
	suite_add_tcase(s, tc);
	tc = tcase_create("protocol");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, socket_threads_and_descriptors);
	tcase_add_test(tc, stale_sockets_of_dead_processes_are_removed);
	tcase_add_test(tc, fetched_descriptors_are_close_on_exec_and_need_the_token);
	tcase_add_test(tc, batched_fetch_answers_every_item_in_order);
	tcase_add_test(tc, a_fetch_whose_reply_is_not_sent_records_no_importer);
	tcase_add_test(tc, malformed_messages_close_the_connection_and_leak_nothing);
	tcase_add_test(tc, a_peer_that_hangs_up_raises_no_sigpipe);
	suite_add_tcase(s, tc);
	return s;
}
