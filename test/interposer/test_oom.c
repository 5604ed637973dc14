/*
 * test_oom.c - out-of-memory injection over the interposer's own paths (the
 * n-th allocation fails, as SQLite's tests do). Run by test_oom.sh with
 * libcuinterpose-oom.so preloaded instead of libcuinterpose.so: the same
 * library with its sources, the protocol's and the carrier's compiled with
 * test/harness/failalloc.h in front; the test reaches failalloc's controls
 * through dlsym.
 *
 * For each path a clean run counts the allocations it makes, then the path
 * runs again with the 1st, the 2nd, ... the last of them failing. A driver
 * call that fails returns a CUDA error (CUDA_ERROR_OUT_OF_MEMORY where the
 * interposer ran out) and leaves no record of what failed; a control request
 * that fails answers a negative status with a message that blames no bytes.
 * Then, with nothing armed, the process is brought back as the plugin's
 * coordinator would (RESUME, or LOAD + REBUILD + VERIFY + RESUME where
 * something was torn down), its bytes are checked at the same addresses and
 * INSPECT must show the expected records; the path then works again. Paths:
 * creating, mapping, sharing and unmapping an allocation; importing
 * another process's ticket; importing a raw driver FD (counted or refused,
 * never lost); INSPECT; a whole checkpoint cycle over the
 * control socket (a shared and a private allocation). Leaks are the
 * sanitizer build's to find. Counts may vary by a few allocations between
 * runs (the interposer's threads), so an armed allocation that a run did
 * not reach is reported, and passes only beyond the count of that run.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static void (*fa_arm)(unsigned long n);
static bool (*fa_fired)(void);
static unsigned long (*fa_count)(void);

static void controls(void)
{
	fa_arm = (void (*)(unsigned long))dlsym(RTLD_DEFAULT, "failalloc_arm");
	fa_fired = (bool (*)(void))dlsym(RTLD_DEFAULT, "failalloc_fired");
	fa_count = (unsigned long (*)(void))dlsym(RTLD_DEFAULT, "failalloc_count");
	ck_assert_msg(fa_arm && fa_fired && fa_count,
		      "failalloc_arm/fired/count not found: run through test_oom.sh (libcuinterpose-oom.so preloaded)");
}

/* One run of a path: 0, a negative errno (a control request's status) or
 * a CUresult (positive), with err naming what failed. */
typedef int path_fn(char *err, size_t errlen);

/* Memory that ran out is never blamed on the bytes or the checkpoint. */
static void not_damage(const char *name, unsigned long n, const char *err)
{
	ck_assert_msg(!strstr(err, "corrupt") && !strstr(err, "does not decode") && !strstr(err, "malformed") &&
			      !strstr(err, "mismatch") && !strstr(err, "differs"),
		      "%s: allocation %lu failed, reported as damage: %s", name, n, err);
}

/*
 * Run fn twice clean (the first grows the tables that stay), count the
 * second, then run it with each of its allocations failing in turn; after
 * each run, disarmed, recover() brings the process back and checks it
 * (rc: what the run returned). Returns the count.
 */
static unsigned long exhaust(const char *name, path_fn *fn, void (*recover)(int rc))
{
	char err[512];
	unsigned long total, failed = 0, missed = 0;
	int rc;

	for (int i = 0; i < 2; i++) {
		fa_arm(0);
		err[0] = 0;
		rc = fn(err, sizeof(err));
		ck_assert_msg(rc == 0, "%s, clean: %d %s", name, rc, err);
		total = fa_count();
		recover(0);
	}
	ck_assert_msg(total > 0, "%s: no allocation counted: the injection reaches nothing", name);
	for (unsigned long n = 1; n <= total; n++) {
		unsigned long seen;
		bool fired;

		err[0] = 0;
		fa_arm(n);
		rc = fn(err, sizeof(err));
		fired = fa_fired();
		seen = fa_count();
		fa_arm(0);
		if (!fired) {
			/* Only a run that made fewer allocations than counted
			 * may miss the armed one. */
			ck_assert_msg(seen < n, "%s: allocation %lu of %lu (this run %lu) not failed", name, n, total,
				      seen);
			missed++;
		}
		if (rc) {
			ck_assert_msg(fired, "%s: failed (%d %s) with allocation %lu not reached", name, rc, err, n);
			ck_assert_msg(err[0], "%s: allocation %lu failed: error %d without a message", name, n, rc);
			not_damage(name, n, err);
			failed++;
		}
		recover(rc);
	}
	ck_assert_msg(failed > 0, "%s: no failed allocation made the path fail", name);
	ck_assert_msg(missed * 10 <= total, "%s: %lu of %lu armed allocations not reached", name, missed, total);
	printf("%s: %lu allocations, %lu failures reported, %lu not reached\n", name, total, failed, missed);
	return total;
}

/* ---- records: create, map, access, export, import, partial unmap ------------------ */

static size_t g;
static const CUmemAccessDesc d0 = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
static CUmemGenericAllocationHandle rec_h;
static CUdeviceptr rec_va;
static int rec_ticket = -1;

#define FAIL(r, what)                                                                                              \
	do {                                                                                                       \
		snprintf(err, errlen, "%s: %s", what, h_name(r));                                                  \
		ck_assert_msg((r) == CUDA_ERROR_OUT_OF_MEMORY, "%s: %s, expected out of memory", what, h_name(r)); \
	} while (0)

/*
 * Create (POSIX), map its 2 granules apart, give access over both, fill,
 * export a ticket, import it back (the same record), unmap the first. Success keeps
 * the allocation, the ticket and the second granule mapped; a failure
 * undoes what the path did (the driver's own calls cannot run out here).
 */
static int records_path(char *err, size_t errlen)
{
	CUmemAllocationProp p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemGenericAllocationHandle h2;
	CUresult r;
	int t = -1;

	r = cuMemCreate(&rec_h, 2 * g, &p, 0);
	if (r) {
		FAIL(r, "cuMemCreate");
		return (int)r;
	}
	CK(cuMemAddressReserve(&rec_va, 2 * g, 0, 0, 0));
	r = cuMemMap(rec_va, g, 0, rec_h, 0);
	if (r) {
		FAIL(r, "cuMemMap of the first granule");
		goto release;
	}
	r = cuMemMap(rec_va + g, g, g, rec_h, 0);
	if (r) {
		FAIL(r, "cuMemMap of the second granule");
		CK(cuMemUnmap(rec_va, g));
		goto release;
	}
	r = cuMemSetAccess(rec_va, 2 * g, &d0, 1); /* over both mappings */
	if (r) {
		FAIL(r, "cuMemSetAccess");
		goto unmap;
	}
	h_fill(rec_va, g, 30);
	h_fill(rec_va + g, g, 31);
	r = cuMemExportToShareableHandle(&t, rec_h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r) {
		FAIL(r, "cuMemExportToShareableHandle");
		goto unmap;
	}
	r = cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)t, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r) {
		FAIL(r, "cuMemImportFromShareableHandle");
		goto unmap;
	}
	ck_assert_uint_eq(h2, rec_h); /* one record per allocation */
	CK(cuMemRelease(h2));
	r = cuMemUnmap(rec_va, g);
	if (r) {
		FAIL(r, "cuMemUnmap of the first granule");
		goto unmap;
	}
	rec_ticket = t;
	return 0;
unmap:
	if (t >= 0)
		close(t);
	CK(cuMemUnmap(rec_va, g));
	CK(cuMemUnmap(rec_va + g, g));
release:
	CK(cuMemRelease(rec_h));
	CK(cuMemAddressFree(rec_va, 2 * g));
	return (int)r;
}

/* The records of this process, by INSPECT, disarmed. */
static Cuip__Response *inspect_self(void)
{
	int s = h_connect(0);
	Cuip__Response *r = h_inspect(s);

	close(s);
	return r;
}

static void records_recover(int rc)
{
	Cuip__Response *r = inspect_self();
	Cuip__ProcessState *st = r->state;

	if (rc) { /* nothing left of what failed */
		ck_assert_msg(st->n_allocations == 0 && st->n_mappings == 0,
			      "a failed path left %zu allocations and %zu mappings", st->n_allocations, st->n_mappings);
		cuip__response__free_unpacked(r, NULL);
		return;
	}
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_int_eq(st->allocations[0]->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert(st->allocations[0]->exported);
	ck_assert_uint_eq(st->n_mappings, 1);
	ck_assert_uint_eq(st->mappings[0]->va, rec_va + g);
	ck_assert_uint_eq(st->mappings[0]->size, g);
	ck_assert_uint_eq(st->mappings[0]->offset, g);
	ck_assert_msg(st->mappings[0]->n_access == 1 && st->mappings[0]->access[0]->va == rec_va + g &&
			      st->mappings[0]->access[0]->size == g &&
			      st->mappings[0]->access[0]->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
		      "the second granule's access is not recorded (%zu intervals)", st->mappings[0]->n_access);
	cuip__response__free_unpacked(r, NULL);
	ck_assert(h_check(rec_va + g, g, 31));
	close(rec_ticket);
	rec_ticket = -1;
	CK(cuMemUnmap(rec_va + g, g));
	CK(cuMemRelease(rec_h));
	CK(cuMemAddressFree(rec_va, 2 * g));
	r = inspect_self();
	ck_assert_uint_eq(r->state->n_allocations, 0);
	ck_assert_uint_eq(r->state->n_mappings, 0);
	cuip__response__free_unpacked(r, NULL);
}

START_TEST(creating_mapping_sharing_and_unmapping_survive_each_failed_allocation)
{
	controls();
	h_init(0);
	g = h_gran();
	exhaust("records", records_path, records_recover);
}
END_TEST

/* ---- importing another process's ticket ------------------------------------------- */

struct info {
	uint64_t size;
	uint32_t seed;
};

/* The creator: one shared allocation, its ticket sent once, then it
 * serves fetches until the parent writes 'q'. */
static int creator(void *arg, int sock)
{
	struct info in = {0, 53};
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	char c;
	int t;

	(void)arg;
	h_init(0);
	in.size = 2 * h_gran();
	va = h_create_map(in.size, &h);
	h_fill(va, in.size, in.seed);
	t = h_export(h);
	if (h_send_fd(sock, t, &in, sizeof(in)))
		return 10;
	close(t);
	return read(sock, &c, 1) == 1 && c == 'q' ? 0 : 11;
}

static int imp_ticket = -1;
static struct info imp_info;
static CUmemGenericAllocationHandle imp_h;
static CUdeviceptr imp_va;

/* Import the creator's ticket (a FETCH from its control socket), map it,
 * give access. Success keeps it; a failure undoes the path. */
static int import_path(char *err, size_t errlen)
{
	CUresult r;

	r = cuMemImportFromShareableHandle(&imp_h, (void *)(uintptr_t)imp_ticket,
					   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r) {
		FAIL(r, "cuMemImportFromShareableHandle of another process's ticket");
		return (int)r;
	}
	r = cuMemMap(imp_va, imp_info.size, 0, imp_h, 0);
	if (r) {
		FAIL(r, "cuMemMap");
		goto release;
	}
	r = cuMemSetAccess(imp_va, imp_info.size, &d0, 1);
	if (r) {
		FAIL(r, "cuMemSetAccess");
		CK(cuMemUnmap(imp_va, imp_info.size));
		goto release;
	}
	return 0;
release:
	CK(cuMemRelease(imp_h));
	return (int)r;
}

static void import_recover(int rc)
{
	Cuip__Response *r = inspect_self();
	Cuip__ProcessState *st = r->state;

	if (rc) {
		ck_assert_msg(st->n_allocations == 0 && st->n_mappings == 0,
			      "a failed import left %zu allocations and %zu mappings", st->n_allocations,
			      st->n_mappings);
		cuip__response__free_unpacked(r, NULL);
		return;
	}
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_int_eq(st->allocations[0]->origin, CUIP__ORIGIN__ORIGIN_VMM_IMPORT);
	ck_assert_int_eq(st->allocations[0]->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert_uint_ne(st->allocations[0]->id->creator, st->self->id);
	ck_assert_uint_eq(st->n_mappings, 1);
	ck_assert_uint_eq(st->mappings[0]->n_access, 1);
	cuip__response__free_unpacked(r, NULL);
	ck_assert(h_check(imp_va, imp_info.size, imp_info.seed));
	CK(cuMemUnmap(imp_va, imp_info.size));
	CK(cuMemRelease(imp_h));
}

START_TEST(importing_a_ticket_survives_each_failed_allocation)
{
	pid_t child;
	int sock;

	controls();
	child = h_fork(creator, NULL, &sock);
	h_init(0);
	imp_ticket = h_recv_fd(sock, &imp_info, sizeof(imp_info));
	ck_assert_int_ge(imp_ticket, 0);
	CK(cuMemAddressReserve(&imp_va, imp_info.size, 0, 0, 0));
	exhaust("import", import_path, import_recover);
	close(imp_ticket);
	ck_assert_int_eq(write(sock, "q", 1), 1);
	ck_assert_int_eq(h_wait(child), 0);
}
END_TEST

/* ---- a raw import (a driver FD that is no ticket) ------------------------------------ */

/*
 * The plugin refuses a dump while the process holds a raw import, by
 * INSPECT's counters.raw_imports: an import that succeeds must be counted
 * whatever ran out, and one that cannot be counted must not succeed. The
 * FD is the driver's own export of an allocation made behind the
 * interposer's back.
 */
static int raw_fd = -1;
static CUmemGenericAllocationHandle raw_src, raw_imp;

static uint32_t raw_count(void)
{
	Cuip__Response *r = inspect_self();
	uint32_t n;

	ck_assert(r->state->counters->has_raw_imports);
	n = r->state->counters->raw_imports;
	cuip__response__free_unpacked(r, NULL);
	return n;
}

static int raw_path(char *err, size_t errlen)
{
	CUresult r;

	raw_imp = 0;
	r = cuMemImportFromShareableHandle(&raw_imp, (void *)(uintptr_t)raw_fd,
					   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r) {
		FAIL(r, "cuMemImportFromShareableHandle of a raw driver FD");
		return (int)r;
	}
	ck_assert_uint_ne(raw_imp, 0);
	ck_assert_uint_ne(raw_imp >> TAG_SHIFT, TAG); /* passed through, not a record */
	return 0;
}

static void raw_recover(int rc)
{
	uint32_t n;

	if (rc) { /* refused: nothing imported, so nothing to count */
		ck_assert_uint_eq(raw_imp, 0);
		ck_assert_uint_eq(raw_count(), 0);
		return;
	}
	n = raw_count();
	ck_assert_msg(n == 1, "a raw import succeeded but INSPECT counts %u live raw imports", n);
	CK(cuMemRelease(raw_imp));
	ck_assert_uint_eq(raw_count(), 0);
}

START_TEST(a_raw_import_is_counted_or_refused_under_each_failed_allocation)
{
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
	CUresult (*release)(CUmemGenericAllocationHandle);
	CUmemAllocationProp p;

	controls();
	create = h_real("cuMemCreate");
	export = h_real("cuMemExportToShareableHandle");
	release = h_real("cuMemRelease");
	h_init(0);
	p = h_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(create(&raw_src, h_gran(), &p, 0));
	CK(export(&raw_fd, raw_src, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	exhaust("raw import", raw_path, raw_recover);
	CK(release(raw_src));
	close(raw_fd);
	raw_fd = -1;
}
END_TEST

/* ---- the checkpoint cycle over the control socket ------------------------------------ */

/* A shared allocation (exported as a ticket) and a private one, filled. */
static CUmemGenericAllocationHandle sh_h, pr_h;
static CUdeviceptr sh_va, pr_va;
static int sh_ticket = -1;
static Cuip__Response *before; /* INSPECT before the cycle: what VERIFY expects */
static Cuip__Response *saved;  /* the last SAVE that succeeded */
static int carrier = -1;

static void workload(void)
{
	h_init(0);
	g = h_gran();
	sh_va = h_create_map(3 * g, &sh_h);
	h_fill(sh_va, 3 * g, 7);
	sh_ticket = h_export(sh_h);
	pr_va = h_create_map(g, &pr_h);
	h_fill(pr_va, g, 8);
	before = inspect_self();
	ck_assert_uint_eq(before->state->n_allocations, 2);
}

static void workload_end(void)
{
	ck_assert(h_check(sh_va, 3 * g, 7));
	ck_assert(h_check(pr_va, g, 8));
	h_unmap_release(sh_va, 3 * g, sh_h);
	h_unmap_release(pr_va, g, pr_h);
	close(sh_ticket);
	cuip__response__free_unpacked(before, NULL);
	if (saved)
		cuip__response__free_unpacked(saved, NULL);
	saved = NULL;
	close(carrier);
	carrier = -1;
}

/* One request, its status and message into err; the response kept in
 * *keep when given (else freed). */
static int request(int s, Cuip__Request *req, int fd, const char *what, char *err, size_t errlen, Cuip__Response **keep)
{
	Cuip__Response *r = NULL;
	int rc = h_request(s, req, fd, &r, NULL), st;

	ck_assert_msg(rc == 0, "%s: the connection failed (%d): the interposer closed it", what, rc);
	st = r->status;
	ck_assert_msg(st <= 0, "%s: status %d", what, st);
	if (st)
		snprintf(err, errlen, "%s: %d %s", what, st, r->error ? r->error : "");
	if (keep && !st)
		*keep = r;
	else
		cuip__response__free_unpacked(r, NULL);
	return st;
}

static int flag(int s, Cuip__Request__BodyCase bc, const char *what, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;

	req.body_case = bc;
	req.resume = 1; /* every flag body is a protobuf bool in the same union */
	return request(s, &req, -1, what, err, errlen, NULL);
}

static int do_inspect(int s, char *err, size_t errlen, Cuip__Response **keep)
{
	Cuip__Request req = CUIP__REQUEST__INIT;

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	return request(s, &req, -1, "INSPECT", err, errlen, keep);
}

static int do_quiesce(int s, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;

	q.timeout_ms = 5000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	return request(s, &req, -1, "QUIESCE", err, errlen, NULL);
}

/* SAVE of what the plugin saves: the carried allocations created here. */
static int do_save(int s, const Cuip__ProcessState *st, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Save sv = CUIP__SAVE__INIT;
	Cuip__AllocId *ids[8];
	Cuip__Response *r = NULL;
	int rc;

	for (size_t i = 0; i < st->n_allocations && sv.n_allocs < 8; i++)
		if (st->allocations[i]->has_carried && st->allocations[i]->carried &&
		    st->allocations[i]->id->creator == st->self->id)
			ids[sv.n_allocs++] = st->allocations[i]->id;
	ck_assert_uint_eq(sv.n_allocs, 2);
	sv.allocs = ids;
	sv.file = (char *)"carrier.img";
	sv.chunk_size = 1 << 20;
	req.body_case = CUIP__REQUEST__BODY_SAVE;
	req.save = &sv;
	ck_assert_int_eq(ftruncate(carrier, 0), 0);
	rc = request(s, &req, carrier, "SAVE", err, errlen, &r);
	if (rc)
		return rc;
	ck_assert_int_eq(r->body_case, CUIP__RESPONSE__BODY_SAVE);
	ck_assert_uint_eq(r->save->n_entries, 2);
	ck_assert_uint_eq(r->save->bytes, 4 * g);
	if (saved)
		cuip__response__free_unpacked(saved, NULL);
	saved = r;
	return 0;
}

static int do_load(int s, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Load l = CUIP__LOAD__INIT;
	Cuip__Response *r = NULL;
	int rc;

	ck_assert_ptr_nonnull(saved);
	l.entries = saved->save->entries;
	l.n_entries = saved->save->n_entries;
	req.body_case = CUIP__REQUEST__BODY_LOAD;
	req.load = &l;
	lseek(carrier, 0, SEEK_SET);
	rc = request(s, &req, carrier, "LOAD", err, errlen, &r);
	if (rc)
		return rc;
	ck_assert_uint_eq(r->load->bytes, saved->save->bytes);
	cuip__response__free_unpacked(r, NULL);
	return 0;
}

static int do_rebuild(int s, Cuip__Stage stage, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Rebuild rb = CUIP__REBUILD__INIT;
	Cuip__PeerSocket ps = CUIP__PEER_SOCKET__INIT, *pps = &ps;
	char path[256];

	ck_assert_int_eq(h_sock_path(0, path, sizeof(path)), 0);
	ps.proc = before->state->self;
	ps.socket = path;
	rb.stage = stage;
	rb.self = before->state->self;
	rb.peers = &pps;
	rb.n_peers = 1;
	req.body_case = CUIP__REQUEST__BODY_REBUILD;
	req.rebuild = &rb;
	return request(s, &req, -1, stage == CUIP__STAGE__STAGE_CREATORS ? "REBUILD creators" : "REBUILD importers",
		       err, errlen, NULL);
}

static int do_verify(int s, char *err, size_t errlen)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Verify v = CUIP__VERIFY__INIT;

	v.expected = before->state;
	req.body_case = CUIP__REQUEST__BODY_VERIFY;
	req.verify = &v;
	return request(s, &req, -1, "VERIFY", err, errlen, NULL);
}

/* LOAD (unless already loaded), REBUILD both stages, VERIFY, RESUME. */
static int rebuild_resume(int s, bool load, char *err, size_t errlen)
{
	int rc = load ? do_load(s, err, errlen) : 0;

	if (!rc)
		rc = do_rebuild(s, CUIP__STAGE__STAGE_CREATORS, err, errlen);
	if (!rc)
		rc = do_rebuild(s, CUIP__STAGE__STAGE_IMPORTERS, err, errlen);
	if (!rc)
		rc = do_verify(s, err, errlen);
	if (!rc)
		rc = flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME", err, errlen);
	return rc;
}

/* A connection and its HANDSHAKE, armed: the socket, or a negative errno
 * with err filled. */
static int dial(char *err, size_t errlen)
{
	char path[256], why[256] = "";
	int s, rc;

	ck_assert_int_eq(h_sock_path(0, path, sizeof(path)), 0);
	s = cuip_client_connect(path);
	ck_assert_int_ge(s, 0);
	rc = cuip_client_handshake(s, "test", 0, NULL, why, sizeof(why));
	if (rc) {
		close(s);
		ck_assert_msg(rc < 0, "HANDSHAKE: %d", rc);
		snprintf(err, errlen, "HANDSHAKE: %d %s", rc, why);
		return rc;
	}
	return s;
}

/* The dump of a checkpoint, then the rollback of --leave-running: the
 * whole cycle the plugin drives, on one connection, ending with BYE. */
static int cycle_path(char *err, size_t errlen)
{
	Cuip__Response *st = NULL;
	int s = dial(err, errlen), rc;

	if (s < 0)
		return s;
	rc = do_inspect(s, err, errlen, NULL);
	if (!rc)
		rc = do_quiesce(s, err, errlen);
	if (!rc)
		rc = do_inspect(s, err, errlen, &st); /* what SAVE goes by */
	if (!rc)
		rc = flag(s, CUIP__REQUEST__BODY_PREPARE_MULTICAST, "PREPARE_MULTICAST", err, errlen);
	if (!rc)
		rc = do_save(s, st->state, err, errlen);
	if (!rc)
		rc = flag(s, CUIP__REQUEST__BODY_PREPARE_UNICAST, "PREPARE_UNICAST", err, errlen);
	if (!rc)
		rc = rebuild_resume(s, true, err, errlen);
	if (!rc)
		rc = flag(s, CUIP__REQUEST__BODY_BYE, "BYE", err, errlen);
	if (st)
		cuip__response__free_unpacked(st, NULL);
	close(s);
	return rc;
}

/*
 * Disarmed: what the coordinator's rollback does (plugin/coord.c) on a
 * fresh connection, by the phase the process reports. Then the process
 * runs: same bytes at the same addresses, the records as before.
 */
static void cycle_recover(int rc)
{
	Cuip__Response *r;
	char err[512] = "";
	int s = h_connect(0);

	r = h_inspect(s);
	switch (r->state->phase) {
	case CUIP__PHASE__PHASE_ACTIVE:
		break;
	case CUIP__PHASE__PHASE_QUIESCED: /* nothing of unicast torn down */
		ck_assert_msg(flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME", err, sizeof(err)) == 0, "rollback: %s",
			      err);
		break;
	case CUIP__PHASE__PHASE_PREPARED:
		ck_assert_msg(rebuild_resume(s, true, err, sizeof(err)) == 0, "rollback: %s", err);
		break;
	case CUIP__PHASE__PHASE_RESTORING:
		/* A rebuild was under way: the coordinator redoes it from
		 * REBUILD; what a failed LOAD left detached is loaded first. */
		rc = rebuild_resume(s, false, err, sizeof(err));
		if (rc == -ENODATA)
			rc = rebuild_resume(s, true, err, sizeof(err));
		ck_assert_msg(rc == 0, "rollback: %s", err);
		break;
	default:
		ck_abort_msg("after a failed allocation the process is in phase %d", (int)r->state->phase);
	}
	cuip__response__free_unpacked(r, NULL);
	r = h_inspect(s);
	ck_assert_int_eq(r->state->phase, CUIP__PHASE__PHASE_ACTIVE);
	ck_assert_uint_eq(r->state->n_allocations, before->state->n_allocations);
	ck_assert_uint_eq(r->state->n_mappings, before->state->n_mappings);
	for (size_t i = 0; i < r->state->n_allocations; i++) {
		const Cuip__Allocation *a = r->state->allocations[i];

		ck_assert_int_eq(a->owner, a->exported ? CUIP__OWNER__OWNER_SHARED : CUIP__OWNER__OWNER_NATIVE);
	}
	cuip__response__free_unpacked(r, NULL);
	close(s);
	ck_assert(h_check(sh_va, 3 * g, 7));
	ck_assert(h_check(pr_va, g, 8));
}

START_TEST(a_checkpoint_cycle_survives_each_failed_allocation)
{
	char path[300];

	controls();
	workload();
	snprintf(path, sizeof(path), "%s/carrier.img", getenv("CUIP_TMP"));
	carrier = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(carrier, 0);
	exhaust("cycle", cycle_path, cycle_recover);
	workload_end();
}
END_TEST

/* ---- INSPECT alone ---------------------------------------------------------------- */

static int inspect_path(char *err, size_t errlen)
{
	Cuip__Response *r = NULL;
	int s = dial(err, errlen), rc;

	if (s < 0)
		return s;
	rc = do_inspect(s, err, errlen, &r);
	close(s);
	if (rc)
		return rc;
	ck_assert_uint_eq(r->state->n_allocations, 2);
	ck_assert_uint_eq(r->state->n_mappings, 2);
	cuip__response__free_unpacked(r, NULL);
	return 0;
}

static void inspect_recover(int rc)
{
	(void)rc;
	ck_assert(h_check(sh_va, 3 * g, 7));
}

START_TEST(inspect_survives_each_failed_allocation)
{
	controls();
	workload();
	exhaust("inspect", inspect_path, inspect_recover);
	workload_end();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("oom");
	TCase *t = tcase_create("interposer");

	tcase_set_timeout(t, 600);
	tcase_add_test(t, creating_mapping_sharing_and_unmapping_survive_each_failed_allocation);
	tcase_add_test(t, importing_a_ticket_survives_each_failed_allocation);
	tcase_add_test(t, a_raw_import_is_counted_or_refused_under_each_failed_allocation);
	tcase_add_test(t, inspect_survives_each_failed_allocation);
	tcase_add_test(t, a_checkpoint_cycle_survives_each_failed_allocation);
	suite_add_tcase(s, t);
	return h_run(s, NULL);
}
