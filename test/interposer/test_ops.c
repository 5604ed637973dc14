/*
 * test_ops.c - the checkpoint operations driven directly over the control
 * sockets, as the plugin drives them (no CRIU): QUIESCE, PREPARE_MULTICAST,
 * SAVE, PREPARE_UNICAST, then LOAD, REBUILD (creators, importers), VERIFY,
 * RESUME on the running job (the rollback / --leave-running path), across
 * two processes that each create one shared allocation and import the
 * other's. Bytes, addresses and sharing are checked afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "digest.h"
#include "harness.h"

struct info {
	uint64_t size;
	uint32_t seed;
};

/* The peer: imports the parent's A, creates and exports D, then serves
 * commands: 'c' check both, 'w' write A with seed+1, 'i' import the kept
 * ticket of A again (must alias), 'q' quit. */
static int peer(void *arg, int sock)
{
	struct info ia, id = {0, 77};
	CUmemGenericAllocationHandle ha, hd, h2;
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr va, vd;
	int t, td;
	char c, ok;

	(void)arg;
	h_init(0);
	t = h_recv_fd(sock, &ia, sizeof(ia));
	if (t < 0 ||
	    cuMemImportFromShareableHandle(&ha, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		return 10;
	if (cuMemAddressReserve(&va, ia.size, 0, 0, 0) || cuMemMap(va, ia.size, 0, ha, 0) ||
	    cuMemSetAccess(va, ia.size, &d, 1) || !h_check(va, ia.size, ia.seed))
		return 11;
	id.size = 2 * h_gran();
	vd = h_create_map(id.size, &hd);
	h_fill(vd, id.size, id.seed);
	td = h_export(hd);
	if (h_send_fd(sock, td, &id, sizeof(id)))
		return 12;
	close(td);
	for (;;) {
		if (read(sock, &c, 1) != 1)
			return 13;
		switch (c) {
		case 'c':
			ok = h_check(va, ia.size, ia.seed) && h_check(vd, id.size, id.seed);
			break;
		case 'w':
			ia.seed++;
			h_fill(va, ia.size, ia.seed);
			ok = 1;
			break;
		case 'i':
			ok = cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)t,
							    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS &&
			     h2 == ha && cuMemRelease(h2) == CUDA_SUCCESS;
			break;
		case 'q':
			return 0;
		default:
			return 14;
		}
		if (write(sock, &ok, 1) != 1)
			return 15;
	}
}

static char ask(int sock, char c)
{
	char ok = 0;

	ck_assert_int_eq(write(sock, &c, 1), 1);
	ck_assert_int_eq(read(sock, &ok, 1), 1);
	return ok;
}

static Cuip__Response *save(int s, const Cuip__ProcessState *st, const char *file, int fd)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Save sv = CUIP__SAVE__INIT;
	Cuip__AllocId *ids[8];
	Cuip__Response *r;

	/* What the plugin saves: the carried allocations created here (shared
	 * ones, and private ones under the default CUINTERPOSE_PRIVATE). */
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->has_carried && st->allocations[i]->carried &&
		    st->allocations[i]->id->creator == st->self->id)
			ids[sv.n_allocs++] = st->allocations[i]->id;
	sv.allocs = ids;
	sv.file = (char *)file;
	sv.chunk_size = 1 << 20;
	req.body_case = CUIP__REQUEST__BODY_SAVE;
	req.save = &sv;
	r = h_call(s, &req, fd);
	ck_assert_msg(r->status == 0, "SAVE: %s", r->error ? r->error : "");
	ck_assert_int_eq(r->body_case, CUIP__RESPONSE__BODY_SAVE);
	return r;
}

static void load(int s, Cuip__SaveReply *sr, int fd)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Load l = CUIP__LOAD__INIT;
	Cuip__Response *r;

	l.entries = sr->entries;
	l.n_entries = sr->n_entries;
	req.body_case = CUIP__REQUEST__BODY_LOAD;
	req.load = &l;
	r = h_call(s, &req, fd);
	ck_assert_msg(r->status == 0, "LOAD: %s", r->error ? r->error : "");
	ck_assert_uint_eq(r->load->bytes, sr->bytes);
	cuip__response__free_unpacked(r, NULL);
}

static Cuip__Response *rebuild_call(int s, Cuip__Stage stage, Cuip__ProcessState *exp, Cuip__PeerSocket **peers,
				    size_t np)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Rebuild rb = CUIP__REBUILD__INIT;

	rb.stage = stage;
	rb.self = exp->self;
	rb.peers = peers;
	rb.n_peers = np;
	req.body_case = CUIP__REQUEST__BODY_REBUILD;
	req.rebuild = &rb;
	return h_call(s, &req, -1);
}

static void rebuild(int s, Cuip__Stage stage, Cuip__ProcessState *exp, Cuip__PeerSocket **peers, size_t np)
{
	Cuip__Response *r = rebuild_call(s, stage, exp, peers, np);

	ck_assert_msg(r->status == 0, "%s: %d %s",
		      stage == CUIP__STAGE__STAGE_CREATORS ? "REBUILD creators" : "REBUILD importers", r->status,
		      r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
}

static void verify(int s, Cuip__ProcessState *exp)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Verify v = CUIP__VERIFY__INIT;

	v.expected = exp;
	req.body_case = CUIP__REQUEST__BODY_VERIFY;
	req.verify = &v;
	h_ok_call(s, &req, -1, "VERIFY");
}

struct blocked {
	CUresult r;
	volatile int done;
};

static void *gated_call(void *arg)
{
	struct blocked *b = arg;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	b->r = cuMemCreate(&h, h_gran(), &p, 0);
	if (b->r == CUDA_SUCCESS)
		cuMemRelease(h);
	b->done = 1;
	return NULL;
}

START_TEST(save_prepare_load_rebuild_verify_resume_across_two_processes)
{
	CUmemGenericAllocationHandle ha, hd, hb;
	CUmemAccessDesc d0 = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAccessDesc d1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemAllocationProp p;
	struct info ia, id;
	CUdeviceptr va, vd, vb;
	Cuip__Response *st[2], *sv[2];
	Cuip__ProcessId pid_of[2];
	Cuip__PeerSocket ps[2], *pps[2];
	char path[2][256], file[2][300];
	int sock, t, td, conn[2], cfd[2];
	size_t g;
	pid_t child;

	child = h_fork(peer, NULL, &sock);
	h_init(0);
	g = h_gran();
	/* A: 3 granules, two mappings (the second with access for both devices). */
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(cuMemCreate(&ha, 3 * g, &p, 0));
	CK(cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
	CK(cuMemMap(va, 2 * g, 0, ha, 0));
	CK(cuMemMap(va + 2 * g, g, 2 * g, ha, 0));
	CK(cuMemSetAccess(va, 2 * g, &d0, 1));
	CK(cuMemSetAccess(va + 2 * g, g, &d0, 1));
	CK(cuMemSetAccess(va + 2 * g, g, &d1, 1));
	ia = (struct info){3 * g, 5};
	h_fill(va, 3 * g, ia.seed);
	/* B: POSIX-capable, never shared: private, carried like A (the default
	 * CUINTERPOSE_PRIVATE=carrier), released and recreated at its address. */
	vb = h_create_map(g, &hb);
	h_fill(vb, g, 9);
	t = h_export(ha);
	ck_assert_int_eq(h_send_fd(sock, t, &ia, sizeof(ia)), 0);
	td = h_recv_fd(sock, &id, sizeof(id));
	ck_assert_int_ge(td, 0);
	CK(cuMemImportFromShareableHandle(&hd, (void *)(uintptr_t)td, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(td);
	CK(cuMemAddressReserve(&vd, id.size, 0, 0, 0));
	CK(cuMemMap(vd, id.size, 0, hd, 0));
	CK(cuMemSetAccess(vd, id.size, &d0, 1));
	ck_assert(h_check(vd, id.size, id.seed));

	/* ---- dump side ---- */
	for (int i = 0; i < 2; i++) {
		conn[i] = h_connect(i ? child : 0);
		ck_assert_int_eq(h_sock_path(i ? child : 0, path[i], sizeof(path[i])), 0);
		st[i] = h_inspect(conn[i]);
	}
	for (int i = 0; i < 2; i++) {
		Cuip__Request req = CUIP__REQUEST__INIT;
		Cuip__Quiesce q = CUIP__QUIESCE__INIT;
		q.timeout_ms = 5000;
		req.body_case = CUIP__REQUEST__BODY_QUIESCE;
		req.quiesce = &q;
		h_ok_call(conn[i], &req, -1, "QUIESCE");
	}
	/* The gate is closed: a tracked call of ours waits. */
	struct blocked b = {0};
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, gated_call, &b), 0);
	usleep(100000);
	ck_assert(!b.done);
	for (int i = 0; i < 2; i++)
		h_flag(conn[i], CUIP__REQUEST__BODY_PREPARE_MULTICAST, "PREPARE_MULTICAST");
	for (int i = 0; i < 2; i++) {
		snprintf(file[i], sizeof(file[i]), "%s/carrier-%d.img", getenv("CUIP_TMP"), i);
		cfd[i] = open(file[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		ck_assert_int_ge(cfd[i], 0);
		sv[i] = save(conn[i], st[i]->state, "carrier.img", cfd[i]);
		ck_assert_uint_eq(sv[i]->save->n_entries, i ? 1 : 2);
		ck_assert_uint_eq(sv[i]->save->bytes, i ? id.size : ia.size + g);
	}
	for (int i = 0; i < 2; i++)
		h_flag(conn[i], CUIP__REQUEST__BODY_PREPARE_UNICAST, "PREPARE_UNICAST");
	/* Nothing of carried memory (shared, and private B) remains in the driver. */
	CUresult (*retain)(CUmemGenericAllocationHandle *, void *) = h_real("cuMemRetainAllocationHandle");
	CUmemGenericAllocationHandle raw;
	ck_assert_int_ne(retain(&raw, (void *)va), CUDA_SUCCESS);
	ck_assert_int_ne(retain(&raw, (void *)vd), CUDA_SUCCESS);
	ck_assert_int_ne(retain(&raw, (void *)vb), CUDA_SUCCESS);
	Cuip__Response *mid = h_inspect(conn[0]);
	ck_assert_int_eq(mid->state->phase, CUIP__PHASE__PHASE_PREPARED);
	cuip__response__free_unpacked(mid, NULL);
	/* RESUME now would expose unmapped memory: refused. */
	{
		Cuip__Request req = CUIP__REQUEST__INIT;
		req.body_case = CUIP__REQUEST__BODY_RESUME;
		req.resume = 1;
		Cuip__Response *r = h_call(conn[0], &req, -1);
		ck_assert_int_eq(r->status, -EBUSY);
		cuip__response__free_unpacked(r, NULL);
	}

	/* ---- restore side (on the running job: the rollback path) ---- */
	for (int i = 0; i < 2; i++) {
		cuip__process_id__init(&pid_of[i]);
		pid_of[i] = *st[i]->state->self;
		cuip__peer_socket__init(&ps[i]);
		ps[i].proc = &pid_of[i];
		ps[i].socket = path[i];
		pps[i] = &ps[i];
	}
	for (int i = 0; i < 2; i++) {
		lseek(cfd[i], 0, SEEK_SET);
		load(conn[i], sv[i]->save, cfd[i]);
	}
	/* Importers before their creator has exported again: the creator refuses
	 * the batched fetch item by item, the importer names the allocation and
	 * imports nothing; the proper order then succeeds. */
	{
		Cuip__Response *r = rebuild_call(conn[0], CUIP__STAGE__STAGE_IMPORTERS, st[0]->state, pps, 2);
		ck_assert_int_eq(r->status, -ENOENT);
		ck_assert_msg(strstr(r->error, "creator refused: not exported here"), "%s", r->error);
		cuip__response__free_unpacked(r, NULL);
	}
	/* A REBUILD meant for the other process is refused by this one. */
	{
		Cuip__Response *r = rebuild_call(conn[0], CUIP__STAGE__STAGE_CREATORS, st[1]->state, pps, 2);
		ck_assert_int_eq(r->status, -ESRCH);
		ck_assert_msg(strstr(r->error, "REBUILD names process"), "%s", r->error);
		cuip__response__free_unpacked(r, NULL);
	}
	for (int i = 0; i < 2; i++)
		rebuild(conn[i], CUIP__STAGE__STAGE_CREATORS, st[i]->state, pps, 2);
	for (int i = 0; i < 2; i++)
		rebuild(conn[i], CUIP__STAGE__STAGE_IMPORTERS, st[i]->state, pps, 2);
	/* VERIFY by digest: a wrong one is answered -EBADE without failing the
	 * process (the coordinator then sends the whole state); wrong counts
	 * are not asked here (they fail the process, as in the full VERIFY). */
	for (int i = 0; i < 2; i++) {
		Cuip__Request req = CUIP__REQUEST__INIT;
		Cuip__Verify v = CUIP__VERIFY__INIT;
		Cuip__Response *r;
		uint64_t d;

		ck_assert(cuip_state_digest(st[i]->state, &d));
		v.has_digest = v.has_allocations = v.has_mappings = 1;
		v.digest = d ^ 1;
		v.allocations = st[i]->state->n_allocations;
		v.mappings = st[i]->state->n_mappings;
		v.self = st[i]->state->self;
		req.body_case = CUIP__REQUEST__BODY_VERIFY;
		req.verify = &v;
		r = h_call(conn[i], &req, -1);
		ck_assert_int_eq(r->status, -EBADE);
		ck_assert_msg(strstr(r->error, "digest"), "%s", r->error);
		cuip__response__free_unpacked(r, NULL);
		v.self = st[1 - i]->state->self; /* meant for the other process */
		v.digest = d;
		r = h_call(conn[i], &req, -1);
		ck_assert_int_eq(r->status, -ESRCH);
		cuip__response__free_unpacked(r, NULL);
		v.self = st[i]->state->self;
		h_ok_call(conn[i], &req, -1, "VERIFY by digest");
		v.has_digest = 0; /* neither a state nor a digest */
		r = h_call(conn[i], &req, -1);
		ck_assert_int_eq(r->status, -EINVAL);
		cuip__response__free_unpacked(r, NULL);
	}
	for (int i = 0; i < 2; i++)
		verify(conn[i], st[i]->state);
	ck_assert(!b.done);
	for (int i = 0; i < 2; i++)
		h_flag(conn[i], CUIP__REQUEST__BODY_RESUME, "RESUME");
	pthread_join(th, NULL);
	ck_assert_int_eq(b.r, CUDA_SUCCESS);

	/* Same addresses, same bytes, still shared. */
	ck_assert(h_check(va, 3 * g, ia.seed));
	ck_assert(h_check(vd, id.size, id.seed));
	ck_assert(h_check(vb, g, 9));
	ck_assert(ask(sock, 'c'));
	ck_assert(ask(sock, 'w'));
	ck_assert(h_check(va, 3 * g, ia.seed + 1));
	ck_assert(ask(sock, 'i')); /* the old ticket still names the same allocation */
	Cuip__Response *after = h_inspect(conn[0]);
	ck_assert_int_eq(after->state->phase, CUIP__PHASE__PHASE_ACTIVE);
	for (size_t i = 0; i < after->state->n_allocations; i++)
		if (after->state->allocations[i]->id->creator == after->state->self->id &&
		    after->state->allocations[i]->owner == CUIP__OWNER__OWNER_SHARED)
			ck_assert(after->state->allocations[i]->exported);
	cuip__response__free_unpacked(after, NULL);
	/* A new ticket from the rebuilt export imports in a fresh process view. */
	int t2 = h_export(ha);
	close(t2);

	for (int i = 0; i < 2; i++) {
		Cuip__Request req = CUIP__REQUEST__INIT;
		req.body_case = CUIP__REQUEST__BODY_BYE;
		req.bye = 1;
		h_ok_call(conn[i], &req, -1, "BYE");
		char c;
		ck_assert_int_eq(read(conn[i], &c, 1), 0); /* EOF after BYE */
		close(conn[i]);
		close(cfd[i]);
		cuip__response__free_unpacked(st[i], NULL);
		cuip__response__free_unpacked(sv[i], NULL);
	}
	close(t);
	ck_assert_int_eq(write(sock, "q", 1), 1);
	ck_assert_int_eq(h_wait(child), 0);
}
END_TEST

/* PREPARE_UNICAST lowers the stack limit of every context, primary and
 * created, to 0 (the native checkpoint then copies no stacks); RESUME sets
 * each one's own back. A second round with the created context's lowering
 * failing (FAKECUDA_FAIL_DIR): the primary's is set back at once, the
 * created one is untouched, and PREPARE_UNICAST still succeeds. */
static void quiesce_prepare(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;

	q.timeout_ms = 5000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	h_ok_call(s, &req, -1, "QUIESCE");
	h_flag(s, CUIP__REQUEST__BODY_PREPARE_UNICAST, "PREPARE_UNICAST");
}

static size_t stack_of(CUcontext c)
{
	CUresult (*set_current)(CUcontext) = h_real("cuCtxSetCurrent");
	CUresult (*get_limit)(size_t *, CUlimit) = h_real("cuCtxGetLimit");
	size_t v = 12345;

	CK(set_current(c));
	CK(get_limit(&v, CU_LIMIT_STACK_SIZE));
	return v;
}

/* The stack limits of the primary and the created context are p and m. */
static void expect_stacks(CUcontext prim, size_t p, CUcontext mine, size_t m)
{
	ck_assert_uint_eq(stack_of(prim), p);
	ck_assert_uint_eq(stack_of(mine), m);
}

START_TEST(prepare_lowers_every_contexts_stack_and_resume_sets_each_back)
{
	CUresult (*set_limit)(CUlimit, size_t) = h_real("cuCtxSetLimit");
	char dir[300], arm[320];
	CUcontext prim, mine;
	FILE *f;
	int s;

	snprintf(dir, sizeof(dir), "%s/faults", getenv("CUIP_TMP"));
	ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
	setenv("FAKECUDA_FAIL_DIR", dir, 1);
	prim = h_init(0);
	CK(set_limit(CU_LIMIT_STACK_SIZE, 2048));
	CK(cuCtxCreate(&mine, NULL, 0, 0)); /* tracked: the interposer's wrapper */
	CK(set_limit(CU_LIMIT_STACK_SIZE, 4096));
	s = h_connect(0);
	quiesce_prepare(s);
	expect_stacks(prim, 0, mine, 0);
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	expect_stacks(prim, 2048, mine, 4096);

	/* The primary context comes first: its lowering is the first call
	 * after arming, the created one's the second. */
	snprintf(arm, sizeof(arm), "%s/%d", dir, (int)getpid());
	f = fopen(arm, "w");
	ck_assert_ptr_nonnull(f);
	fputs("cuCtxSetLimit:2\n", f);
	fclose(f);
	quiesce_prepare(s);
	expect_stacks(prim, 2048, mine, 4096);
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	expect_stacks(prim, 2048, mine, 4096);
	/* Still armed: the interposer made the failing second call (two more
	 * of ours pass); had it skipped lowering, the second of these fails. */
	ck_assert_uint_eq(stack_of(mine), 4096); /* mine is current */
	CK(set_limit(CU_LIMIT_STACK_SIZE, 4096));
	CK(set_limit(CU_LIMIT_STACK_SIZE, 4096));
	unlink(arm);
	close(s);
}
END_TEST

START_TEST(quiesce_then_resume_without_teardown)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r;
	int s;

	CUcontext own, prev;
	CUstream st;
	h_init(0);
	va = h_create_map(h_gran(), &h);
	h_fill(va, h_gran(), 3);
	/* A context of the application's own, with work queued in it. */
	CK(cuCtxGetCurrent(&prev));
	CK(cuCtxCreate(&own, NULL, 0, 0));
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CK(cuMemsetD32Async(va, 7, h_gran() / 4, st));
	s = h_connect(0);
	/* Out of order: SAVE and PREPARE_UNICAST before QUIESCE are refused. */
	req.body_case = CUIP__REQUEST__BODY_PREPARE_UNICAST;
	req.prepare_unicast = 1;
	r = h_call(s, &req, -1);
	ck_assert_int_eq(r->status, -EBUSY);
	cuip__response__free_unpacked(r, NULL);
	q.timeout_ms = 1000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	h_ok_call(s, &req, -1, "QUIESCE");
	CK(cuStreamQuery(st)); /* QUIESCE synchronized every context */
	/* A SAVE that leaves out a carried allocation (made after the
	 * plugin's INSPECT) is refused before anything is written: PREPARE_UNICAST
	 * would release it unsaved. */
	{
		Cuip__Save sv = CUIP__SAVE__INIT;
		char file[300];
		int fd;

		snprintf(file, sizeof(file), "%s/carrier-stale.img", getenv("CUIP_TMP"));
		fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		ck_assert_int_ge(fd, 0);
		sv.file = "carrier-stale.img";
		sv.chunk_size = 1 << 20;
		req.body_case = CUIP__REQUEST__BODY_SAVE;
		req.save = &sv;
		r = h_call(s, &req, fd);
		ck_assert_int_eq(r->status, -ESTALE);
		ck_assert_msg(
			strstr(r->error, "is carried but not in the SAVE request (made after INSPECT); nothing saved"),
			"%s", r->error);
		cuip__response__free_unpacked(r, NULL);
		/* No carrier file at all, and two files without their names. */
		r = h_call(s, &req, -1);
		ck_assert_int_eq(r->status, -EBADF);
		ck_assert_msg(strstr(r->error, "SAVE came with 0 carrier files for 0 names"), "%s", r->error);
		cuip__response__free_unpacked(r, NULL);
		{
			int two[2] = {fd, fd}, got = -1;
			char err[256];

			ck_assert_int_eq(cuip_msg_sendv(s, CUIP_KIND_REQUEST, &req.base, two, 2), 0);
			ck_assert_int_eq(cuip_msg_recv(s, CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL,
						       (ProtobufCMessage **)&r, &got, err, sizeof(err)),
					 0);
			ck_assert_int_eq(r->status, -EBADF);
			ck_assert_msg(strstr(r->error, "SAVE came with 2 carrier files for 0 names"), "%s", r->error);
			cuip__response__free_unpacked(r, NULL);
		}
		close(fd);
		unlink(file);
	}
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
	CK(cuStreamDestroy(st));
	CK(cuCtxDestroy(own));
	CK(cuCtxSetCurrent(prev));
	h_fill(va, h_gran(), 3);
	ck_assert(h_check(va, h_gran(), 3));
	h_unmap_release(va, h_gran(), h);
}
END_TEST

/* A second checkpoint's QUIESCE on another connection is refused while the
 * first's connection is open (whatever the phase), and accepted once it is
 * gone; the first's gate stays closed throughout. */
START_TEST(a_second_checkpoint_is_refused_while_the_first_is_connected)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r;
	int a, b;

	h_init(0);
	a = h_connect(0);
	b = h_connect(0);
	q.timeout_ms = 1000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	h_ok_call(a, &req, -1, "QUIESCE");
	r = h_call(b, &req, -1);
	ck_assert_int_eq(r->status, -EALREADY);
	ck_assert_ptr_nonnull(strstr(r->error, "another checkpoint of this process is in progress (phase QUIESCED)"));
	cuip__response__free_unpacked(r, NULL);
	r = h_inspect(b);
	ck_assert_int_eq(r->state->phase, CUIP__PHASE__PHASE_QUIESCED);
	cuip__response__free_unpacked(r, NULL);
	/* The first's coordinator dies (no BYE): the gate stays closed until
	 * someone rolls it back; then a new checkpoint may start. */
	close(a);
	r = h_inspect(b);
	ck_assert_int_eq(r->state->phase, CUIP__PHASE__PHASE_QUIESCED);
	cuip__response__free_unpacked(r, NULL);
	h_flag(b, CUIP__REQUEST__BODY_RESUME, "RESUME");
	h_ok_call(b, &req, -1, "QUIESCE");
	h_flag(b, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(b);
}
END_TEST

struct slow {
	CUcontext ctx;
	CUdeviceptr va;
	size_t size;
	CUresult r;
};

/* A synchronous copy that waits behind a slow kernel: in flight for a while. */
static void *slow_copy(void *arg)
{
	struct slow *s = arg;
	void *buf = malloc(s->size);

	cuCtxSetCurrent(s->ctx); /* contexts are per thread */
	s->r = cuMemcpyDtoH(buf, s->va, s->size);
	free(buf);
	return NULL;
}

START_TEST(quiesce_times_out_on_a_call_in_flight_and_reopens_the_gate)
{
	CUmemGenericAllocationHandle h;
	CUmodule mod;
	CUfunction fill;
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r;
	struct slow sl;
	pthread_t th;
	int s;

	setenv("FAKECUDA_KERNEL_DELAY_US", "700000", 1);
	h_init(0);
	sl.size = h_gran();
	sl.va = h_create_map(sl.size, &h);
	CK(cuCtxGetCurrent(&sl.ctx));
	CK(cuModuleLoadData(&mod, "any image"));
	CK(cuModuleGetFunction(&fill, mod, "fake_fill_u32"));
	size_t n = sl.size / 4;
	unsigned v = 1;
	void *args[] = {&sl.va, &n, &v};
	CK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	ck_assert_int_eq(pthread_create(&th, NULL, slow_copy, &sl), 0);
	usleep(100000);
	s = h_connect(0);
	q.timeout_ms = 50;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	r = h_call(s, &req, -1);
	ck_assert_int_eq(r->status, -ETIMEDOUT);
	cuip__response__free_unpacked(r, NULL);
	/* The gate is open again: the application goes on. */
	pthread_join(th, NULL);
	CK(sl.r);
	CK(cuCtxSynchronize());
	Cuip__Response *st = h_inspect(s);
	ck_assert_int_eq(st->state->phase, CUIP__PHASE__PHASE_ACTIVE);
	cuip__response__free_unpacked(st, NULL);
	q.timeout_ms = 5000;
	h_ok_call(s, &req, -1, "QUIESCE");
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
}
END_TEST

/* Device work that outlives the timeout (a kernel waiting for a peer that is
 * gated elsewhere) with no call in flight: QUIESCE gives up within its
 * timeout instead of hanging in cuCtxSynchronize, reopens the gate, and a
 * QUIESCE after the work finished succeeds. */
START_TEST(quiesce_times_out_on_device_work_that_cannot_drain_and_reopens_the_gate)
{
	CUmemGenericAllocationHandle h;
	CUmodule mod;
	CUfunction fill;
	CUdeviceptr va;
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r;
	struct timespec t0, t1;
	double dt;
	int s;

	setenv("FAKECUDA_KERNEL_DELAY_US", "1000000", 1); /* outlasts the 0.2 s timeout by 0.8 s */
	h_init(0);
	va = h_create_map(h_gran(), &h);
	CK(cuModuleLoadData(&mod, "any image"));
	CK(cuModuleGetFunction(&fill, mod, "fake_fill_u32"));
	size_t n = h_gran() / 4;
	unsigned v = 5;
	void *args[] = {&va, &n, &v};
	CK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
	s = h_connect(0);
	q.timeout_ms = 200;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = h_call(s, &req, -1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	ck_assert_int_eq(r->status, -ETIMEDOUT);
	ck_assert_msg(r->error && strstr(r->error, "device work still running"), "error: %s", r->error);
	ck_assert_msg(dt < 1.0, "QUIESCE took %.3f s, timeout 0.2 s", dt);
	cuip__response__free_unpacked(r, NULL);
	Cuip__Response *st = h_inspect(s);
	ck_assert_int_eq(st->state->phase, CUIP__PHASE__PHASE_ACTIVE);
	cuip__response__free_unpacked(st, NULL);
	/* The gate is open: a gated call goes through while the kernel runs. */
	CUdeviceptr va2;
	CUmemGenericAllocationHandle h2;
	va2 = h_create_map(h_gran(), &h2);
	h_unmap_release(va2, h_gran(), h2);
	/* A retry once the work is done drains and quiesces. */
	q.timeout_ms = 5000;
	h_ok_call(s, &req, -1, "QUIESCE");
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
	uint32_t *b = malloc(h_gran());
	ck_assert_ptr_nonnull(b);
	CK(cuMemcpyDtoH(b, va, h_gran()));
	for (size_t j = 0; j < n; j++)
		ck_assert_uint_eq(b[j], 5);
	free(b);
	h_unmap_release(va, h_gran(), h);
}
END_TEST

/* Release hooks (cuinterpose_on_checkpoint): QUIESCE runs every one the
 * process registered; a forked child has none of its parent's (they name
 * the parent's allocator state) and registers its own sixteen, while the
 * parent keeps its sixteen. */
static atomic_int hook_runs; /* written on the release thread */
static void count_hook(void *arg)
{
	(void)arg;
	hook_runs++;
}

START_TEST(quiesce_runs_the_release_hooks_and_a_fork_child_has_none_of_them)
{
	int (*on_ckpt)(void (*)(void *), void *) =
		(int (*)(void (*)(void *), void *))h_ours_sym("cuinterpose_on_checkpoint");
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	pid_t child;
	int s, st = -1;

	ck_assert_ptr_nonnull(on_ckpt);
	h_init(0);
	for (int i = 0; i < 16; i++)
		ck_assert_int_eq(on_ckpt(count_hook, NULL), 0);
	ck_assert_int_eq(on_ckpt(count_hook, NULL), -ENOSPC);
	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		int n = 0;

		while (n < 16 && on_ckpt(count_hook, NULL) == 0)
			n++;
		_exit(n == 16 && on_ckpt(count_hook, NULL) == -ENOSPC ? 0 : 10 + n);
	}
	st = waitchild(child, 15000);
	ck_assert_msg(st == 0,
		      "child: exit %d (10 + n: only n of 16 hooks registered, or a 17th was accepted; %d: hung)", st,
		      WAITCHILD_TIMEOUT);
	ck_assert_int_eq(on_ckpt(count_hook, NULL), -ENOSPC); /* the parent kept its own */
	s = h_connect(0);
	q.timeout_ms = 5000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	h_ok_call(s, &req, -1, "QUIESCE");
	ck_assert_int_eq(hook_runs, 16);
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
}
END_TEST

Suite *ops_suite(void);
Suite *ops_suite(void)
{
	Suite *s = suite_create("ops");
	TCase *tc = tcase_create("checkpoint");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, save_prepare_load_rebuild_verify_resume_across_two_processes);
	tcase_add_test(tc, quiesce_then_resume_without_teardown);
	tcase_add_test(tc, prepare_lowers_every_contexts_stack_and_resume_sets_each_back);
	tcase_add_test(tc, a_second_checkpoint_is_refused_while_the_first_is_connected);
	tcase_add_test(tc, quiesce_times_out_on_a_call_in_flight_and_reopens_the_gate);
	tcase_add_test(tc, quiesce_times_out_on_device_work_that_cannot_drain_and_reopens_the_gate);
	tcase_add_test(tc, quiesce_runs_the_release_hooks_and_a_fork_child_has_none_of_them);
	suite_add_tcase(s, tc);
	return s;
}
