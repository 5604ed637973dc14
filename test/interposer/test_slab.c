/*
 * test_slab.c - small cuMemAlloc requests as pieces of slabs (ipc.c): device
 * memory as native (cuMemGetInfo of 1,000 small allocations, the fake
 * driver packing them as the real one does), alignment, each piece's own
 * address range, reuse of freed pieces, release of an empty slab, IPC of a
 * piece (the importer maps the slab once and gets each piece at its
 * offset), malformed piece handles, SAVE/LOAD of a shared slab (live pieces
 * only, one carrier entry each; LOAD refuses a wrong, missing or duplicate
 * piece entry before recreating anything) and VERIFY of the pieces.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define IPC_MAGIC   0x50495543u
#define IPC_F_PIECE 1u
#define NSMALL	    1000

struct ipc_handle { /* the layout ipc.c writes */
	uint32_t magic;
	uint16_t version, flags;
	int32_t creator_pid;
	uint32_t offset;
	uint64_t creator, serial, size, requested;
	uint8_t token[16];
};

static size_t used_now(void)
{
	CUresult (*info)(size_t *, size_t *) = h_real("cuMemGetInfo_v2");
	size_t f = 0, t = 0;

	CK(info(&f, &t));
	return t - f;
}

static const Cuip__Allocation *slab_of(const Cuip__ProcessState *st, Cuip__Origin o, size_t k)
{
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->origin == o && st->allocations[i]->slab && k-- == 0)
			return st->allocations[i];
	return NULL;
}

static void fill_bytes(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *b = malloc(n);

	ck_assert_ptr_nonnull(b);
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed * 37 + i * 11 + (i >> 9));
	CK(cuMemcpyHtoD(p, b, n));
	free(b);
}

static bool check_bytes(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *b = malloc(n);
	bool ok = true;

	ck_assert_ptr_nonnull(b);
	CK(cuMemcpyDtoH(b, p, n));
	for (size_t i = 0; i < n && ok; i++)
		ok = b[i] == (unsigned char)(seed * 37 + i * 11 + (i >> 9));
	free(b);
	return ok;
}

/* ---- device memory as native ---------------------------------------------- */

static void small_allocations_cost(size_t size, size_t native_want)
{
	CUresult (*nalloc)(CUdeviceptr *, size_t) = h_real("cuMemAlloc_v2");
	CUresult (*nfree)(CUdeviceptr) = h_real("cuMemFree_v2");
	static CUdeviceptr p[NSMALL];
	size_t base, native, ours;
	Cuip__ProcessState *st;

	h_init(0);
	base = used_now();
	for (int i = 0; i < NSMALL; i++)
		CK(nalloc(&p[i], size));
	native = used_now() - base;
	for (int i = 0; i < NSMALL; i++)
		CK(nfree(p[i]));
	ck_assert_uint_eq(used_now(), base);
	/* The fake packs them as the H200's driver does (docs/driver-facts.md,
	 * 'Small allocations'). */
	ck_assert_uint_eq(native, native_want);
	for (int i = 0; i < NSMALL; i++)
		CK(cuMemAlloc(&p[i], size));
	ours = used_now() - base;
	printf("%d x %zu bytes: native %zu KiB, interposed %zu KiB (%.3fx)\n", NSMALL, size, native >> 10, ours >> 10,
	       (double)ours / (double)native);
	ck_assert_msg(ours * 10 <= native * 11, "interposed %zu bytes, native %zu: more than 1.1x", ours, native);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, ours / h_gran()); /* one record per slab */
	ck_assert_uint_eq(st->n_mappings, st->n_allocations);
	h_state_free(st);
	for (int i = 0; i < NSMALL; i++)
		CK(cuMemFree(p[i]));
	ck_assert_uint_eq(used_now(), base); /* every slab released */
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
}

START_TEST(thousand_4k_allocations_use_native_device_memory)
{
	small_allocations_cost(4096, 4 * MiB);
}
END_TEST

START_TEST(thousand_64k_allocations_use_native_device_memory)
{
	small_allocations_cost(65536, 64 * MiB);
}
END_TEST

/* ---- pieces ---------------------------------------------------------------- */

START_TEST(pieces_are_aligned_and_report_their_own_range)
{
	static const size_t sz[] = {1, 100, 511, 512, 513, 4095, 4097, 30001, 65536, MiB + 3};
	enum { N = sizeof(sz) / sizeof(sz[0]) };
	CUdeviceptr p[N], q, base;
	size_t got;
	Cuip__ProcessState *st;
	const Cuip__Allocation *a;

	h_init(0);
	for (int i = 0; i < N; i++) {
		CK(cuMemAlloc(&p[i], sz[i]));
		ck_assert_uint_eq(p[i] % 512, 0);
		fill_bytes(p[i], sz[i], (unsigned)i);
	}
	for (int i = 0; i < N; i++) {
		ck_assert_msg(check_bytes(p[i], sz[i], (unsigned)i), "piece %d", i);
		CK(cuMemGetAddressRange(&base, &got, p[i] + sz[i] - 1));
		ck_assert_uint_eq(base, p[i]);
		ck_assert_uint_eq(got, sz[i]);
		if (sz[i] % 512) /* the padding after a piece is no allocation */
			CK_ERR(cuMemGetAddressRange(&base, &got, p[i] + sz[i]), CUDA_ERROR_NOT_FOUND);
	}
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	a = slab_of(st, CUIP__ORIGIN__ORIGIN_MALLOC, 0);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_NATIVE);
	ck_assert_uint_eq(a->props->size, h_gran());
	ck_assert_uint_eq(a->n_pieces, N);
	ck_assert_uint_eq(st->n_mappings, 1);
	for (int i = 0; i < N; i++) {
		ck_assert_uint_eq(a->pieces[i]->offset, p[i] - st->mappings[0]->va);
		ck_assert_uint_eq(a->pieces[i]->size, sz[i]);
	}
	h_state_free(st);
	/* Not a piece's base: refused, nothing freed. */
	CK_ERR(cuMemFree(p[4] + 512), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemFree(p[2] + 4), CUDA_ERROR_INVALID_VALUE);
	/* A freed piece is reused at once. */
	CK(cuMemFree(p[5]));
	CK_ERR(cuMemFree(p[5]), CUDA_ERROR_INVALID_VALUE);
	CK_ERR(cuMemGetAddressRange(&base, &got, p[5]), CUDA_ERROR_NOT_FOUND);
	CK(cuMemAlloc(&q, sz[5]));
	ck_assert_uint_eq(q, p[5]);
	for (int i = 0; i < N; i++)
		if (i != 5)
			ck_assert_msg(check_bytes(p[i], sz[i], (unsigned)i), "piece %d after reuse", i);
	for (int i = 0; i < N; i++)
		CK(cuMemFree(p[i]));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->n_mappings, 0);
	h_state_free(st);
}
END_TEST

START_TEST(a_slab_whose_pieces_are_all_freed_is_released)
{
	enum { N = 40 }; /* 32 x 64 KiB fill one slab, 8 start another */
	CUdeviceptr p[N];
	size_t base, g;
	Cuip__ProcessState *st;

	h_init(0);
	g = h_gran();
	base = used_now();
	for (int i = 0; i < N; i++)
		CK(cuMemAlloc(&p[i], 65536));
	ck_assert_uint_eq(used_now() - base, 2 * g);
	for (int i = 0; i < 32; i++)
		CK(cuMemFree(p[i]));
	ck_assert_uint_eq(used_now() - base, g);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	ck_assert_uint_eq(st->n_mappings, 1);
	ck_assert_uint_eq(st->allocations[0]->n_pieces, N - 32);
	h_state_free(st);
	for (int i = 32; i < N; i++)
		CK(cuMemFree(p[i]));
	ck_assert_uint_eq(used_now(), base);
}
END_TEST

/* ---- IPC of a piece ------------------------------------------------------------ */

struct parg {
	CUipcMemHandle hb, hc;
	size_t sb, sc;
};

static int piece_importer(void *arg, int sock)
{
	struct parg x;
	CUdeviceptr b, b2, c, base;
	size_t size;
	Cuip__ProcessState *st;
	const Cuip__Allocation *a;
	struct ipc_handle hb, hc;
	char ok = 'w';

	(void)arg;
	if (read(sock, &x, sizeof(x)) != sizeof(x))
		return 10;
	memcpy(&hb, x.hb.reserved, sizeof(hb));
	memcpy(&hc, x.hc.reserved, sizeof(hc));
	h_init(0);
	if (cuIpcOpenMemHandle_v2(&b, x.hb, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
	    cuIpcOpenMemHandle_v2(&c, x.hc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || cuIpcOpenMemHandle_v2(&b2, x.hb, 0))
		return 11;
	if (b2 != b || c - b != (CUdeviceptr)hc.offset - hb.offset)
		return 12; /* one mapping of the slab, pieces at their offsets */
	{
		/* The slab named as a whole allocation while it is open as pieces. */
		struct ipc_handle whole = hb;
		CUipcMemHandle wh;
		CUdeviceptr w = 0;

		whole.flags = 0;
		whole.offset = 0;
		memcpy(wh.reserved, &whole, sizeof(whole));
		if (cuIpcOpenMemHandle_v2(&w, wh, 0) != CUDA_ERROR_INVALID_VALUE || w)
			return 24;
	}
	if (cuMemGetAddressRange(&base, &size, b + x.sb - 1) || base != b || size != x.sb)
		return 13;
	if (cuMemGetAddressRange(&base, &size, c) || base != c || size != x.sc)
		return 14;
	if (!check_bytes(b, x.sb, 2) || !check_bytes(c, x.sc, 3))
		return 15;
	st = h_state(0);
	a = slab_of(st, CUIP__ORIGIN__ORIGIN_IPC_OPEN, 0);
	if (!a || st->n_allocations != 1 || st->n_mappings != 1 || st->mappings[0]->va != b - hb.offset ||
	    a->ipc_opens != 3 || a->n_pieces != 2 || a->pieces[0]->offset != hb.offset || a->pieces[0]->opens != 2 ||
	    a->pieces[1]->offset != hc.offset || a->pieces[1]->size != x.sc)
		return 16;
	h_state_free(st);
	fill_bytes(b, x.sb, 4);
	if (cuIpcCloseMemHandle(b + 512) != CUDA_ERROR_INVALID_VALUE) /* not what an open returned */
		return 17;
	if (cuIpcCloseMemHandle(b) || cuIpcCloseMemHandle(b) || cuIpcCloseMemHandle(b) != CUDA_ERROR_INVALID_VALUE)
		return 18;
	if (!check_bytes(c, x.sc, 3)) /* c still open: the slab stays mapped */
		return 19;
	if (cuMemGetAddressRange(&base, &size, b) != CUDA_ERROR_NOT_FOUND)
		return 20;
	if (cuIpcCloseMemHandle(c))
		return 21;
	st = h_state(0);
	if (st->n_allocations != 0 || st->n_mappings != 0)
		return 22;
	h_state_free(st);
	return write(sock, &ok, 1) == 1 ? 0 : 23;
}

START_TEST(importer_maps_the_slab_once_and_gets_each_piece_at_its_offset)
{
	struct parg x = {.sb = 5000, .sc = 777};
	struct ipc_handle h;
	CUipcMemHandle bad;
	CUdeviceptr a, b, c;
	Cuip__ProcessState *st;
	pid_t pid;
	int sock;
	char ok;

	pid = h_fork(piece_importer, NULL, &sock);
	h_init(0);
	CK(cuMemAlloc(&a, 4096));
	CK(cuMemAlloc(&b, x.sb));
	CK(cuMemAlloc(&c, x.sc));
	fill_bytes(b, x.sb, 2);
	fill_bytes(c, x.sc, 3);
	CK_ERR(cuIpcGetMemHandle(&bad, b + 512), CUDA_ERROR_INVALID_VALUE); /* not a base */
	CK(cuIpcGetMemHandle(&x.hb, b));
	CK(cuIpcGetMemHandle(&x.hc, c));
	memcpy(&h, x.hb.reserved, sizeof(h));
	ck_assert_uint_eq(h.flags, IPC_F_PIECE);
	ck_assert_uint_eq(h.offset, b - a);
	ck_assert_uint_eq(h.requested, x.sb);
	ck_assert_uint_eq(h.size, h_gran());
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1); /* the whole slab is shared */
	ck_assert_int_eq(st->allocations[0]->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert(st->allocations[0]->exported);
	ck_assert_uint_eq(st->allocations[0]->n_pieces, 3);
	h_state_free(st);
	ck_assert_int_eq(write(sock, &x, sizeof(x)), sizeof(x));
	if (read(sock, &ok, 1) != 1)
		ck_abort_msg("importer exited with %d", h_wait(pid));
	ck_assert_int_eq(h_wait(pid), 0);
	ck_assert(check_bytes(b, x.sb, 4)); /* the importer's write */
	ck_assert(check_bytes(c, x.sc, 3));
	CK(cuMemFree(a));
	CK(cuMemFree(b));
	CK(cuMemFree(c));
}
END_TEST

START_TEST(malformed_piece_handles_are_refused)
{
	CUipcMemHandle ih;
	struct ipc_handle h = {.magic = IPC_MAGIC, .version = 1, .creator = 0x1234, .creator_pid = 999999};
	CUdeviceptr q = 0;

	h_init(0);
	h.size = 2 * MiB;
	h.flags = IPC_F_PIECE;
	h.requested = 0; /* a piece of nothing */
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	h.requested = 4096;
	h.offset = 2 * MiB - 4095; /* past the slab's end */
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	h.offset = 512;
	h.flags = 2; /* unknown flag */
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	h.flags = 0; /* a whole allocation has no offset */
	memcpy(ih.reserved, &h, sizeof(h));
	CK_ERR(cuIpcOpenMemHandle_v2(&q, ih, 0), CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(q, 0);
}
END_TEST

/* ---- SAVE, LOAD and VERIFY of a shared slab ------------------------------------- */

static Cuip__Response *load_call(int s, Cuip__CarrierEntry **e, size_t n, const char *file)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Load l = CUIP__LOAD__INIT;
	int fd = open(file, O_RDONLY | O_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	l.entries = e;
	l.n_entries = n;
	req.body_case = CUIP__REQUEST__BODY_LOAD;
	req.load = &l;
	return h_call(s, &req, fd);
}

static void load_refused(int s, Cuip__CarrierEntry **e, size_t n, const char *file, int status, const char *msg)
{
	Cuip__Response *r = load_call(s, e, n, file);

	ck_assert_int_eq(r->status, status);
	ck_assert_msg(r->error && strstr(r->error, msg), "LOAD said \"%s\", expected \"%s\"", r->error ? r->error : "",
		      msg);
	cuip__response__free_unpacked(r, NULL);
}

/* QUIESCE, then SAVE allocation id into CUIP_TMP/name (opened as *fd, its
 * path in file): SAVE's answer, its status 0. */
static Cuip__Response *quiesce_and_save(int s, Cuip__AllocId *id, const char *name, char *file, size_t flen, int *fd)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Save sv = CUIP__SAVE__INIT;
	Cuip__AllocId *ids[1] = {id};
	Cuip__Response *saved;

	q.timeout_ms = 5000;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	h_ok_call(s, &req, -1, "QUIESCE");
	snprintf(file, flen, "%s/%s", getenv("CUIP_TMP"), name);
	*fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(*fd, 0);
	sv.allocs = ids;
	sv.n_allocs = 1;
	sv.file = (char *)name;
	sv.chunk_size = 1 << 20;
	req = (Cuip__Request)CUIP__REQUEST__INIT;
	req.body_case = CUIP__REQUEST__BODY_SAVE;
	req.save = &sv;
	saved = h_call(s, &req, *fd);
	ck_assert_msg(saved->status == 0, "SAVE: %s", saved->error ? saved->error : "");
	return saved;
}

/* REBUILD of the creators' stage for process self. */
static void rebuild_creators(int s, Cuip__ProcessId *self)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Rebuild rb = CUIP__REBUILD__INIT;

	rb.stage = CUIP__STAGE__STAGE_CREATORS;
	rb.self = self;
	req.body_case = CUIP__REQUEST__BODY_REBUILD;
	req.rebuild = &rb;
	h_ok_call(s, &req, -1, "REBUILD creators");
}

START_TEST(shared_slab_saves_live_pieces_only_and_loads_them_back)
{
	static const size_t sz[] = {4096, 3000, 65536, 777, 100};
	enum { N = sizeof(sz) / sizeof(sz[0]) };
	CUdeviceptr p[N];
	CUipcMemHandle ih;
	Cuip__Response *st, *saved, *r;
	Cuip__CarrierEntry *e[N + 1], moved;
	const Cuip__Allocation *a;
	char file[300];
	uint64_t live = 0;
	int s, fd;

	h_init(0);
	for (int i = 0; i < N; i++) {
		CK(cuMemAlloc(&p[i], sz[i]));
		fill_bytes(p[i], sz[i], 10u + (unsigned)i);
	}
	CK(cuMemFree(p[1])); /* freed: not saved */
	CK(cuIpcGetMemHandle(&ih, p[2]));
	for (int i = 0; i < N; i++)
		live += i == 1 ? 0 : sz[i];

	s = h_connect(0);
	st = h_inspect(s);
	a = slab_of(st->state, CUIP__ORIGIN__ORIGIN_MALLOC, 0);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert_uint_eq(a->n_pieces, N - 1);
	saved = quiesce_and_save(s, a->id, "carrier-slab.img", file, sizeof(file), &fd);
	ck_assert_uint_eq(saved->save->n_entries, N - 1); /* one per live piece */
	ck_assert_uint_eq(saved->save->bytes, live);
	ck_assert_uint_eq((uint64_t)lseek(fd, 0, SEEK_END), live); /* nothing of the free space */
	for (size_t i = 0; i < N - 1; i++) {
		ck_assert(saved->save->entries[i]->has_alloc_offset);
		ck_assert_uint_eq(saved->save->entries[i]->alloc_offset, a->pieces[i]->offset);
		ck_assert_uint_eq(saved->save->entries[i]->size, a->pieces[i]->size);
		e[i] = saved->save->entries[i];
	}
	h_flag(s, CUIP__REQUEST__BODY_PREPARE_UNICAST, "PREPARE_UNICAST");

	/* Refused before anything is recreated: a piece that does not exist, a
	 * missing piece, a piece twice. */
	moved = *e[1];
	moved.alloc_offset += 512;
	e[N - 1] = e[1];
	e[1] = &moved;
	load_refused(s, e, N - 1, file, -EINVAL, "no live piece of the slab");
	e[1] = e[N - 1];
	load_refused(s, e, N - 2, file, -ENODATA, "has no carrier entry");
	e[N - 1] = e[0];
	load_refused(s, e, N, file, -EINVAL, "a second entry for one piece");
	r = load_call(s, e, N - 1, file);
	ck_assert_msg(r->status == 0, "LOAD: %s", r->error ? r->error : "");
	ck_assert_uint_eq(r->load->bytes, live);
	cuip__response__free_unpacked(r, NULL);
	rebuild_creators(s, st->state->self);
	{
		Cuip__Request req = CUIP__REQUEST__INIT;
		Cuip__Verify v = CUIP__VERIFY__INIT;

		v.expected = st->state;
		req.body_case = CUIP__REQUEST__BODY_VERIFY;
		req.verify = &v;
		h_ok_call(s, &req, -1, "VERIFY");
	}
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
	close(fd);
	cuip__response__free_unpacked(saved, NULL);
	cuip__response__free_unpacked(st, NULL);
	/* Same addresses, every live byte, and the pieces free as before. */
	for (int i = 0; i < N; i++)
		if (i != 1)
			ck_assert_msg(check_bytes(p[i], sz[i], 10u + (unsigned)i), "piece %d after LOAD", i);
	for (int i = 0; i < N; i++)
		if (i != 1)
			CK(cuMemFree(p[i]));
	st = h_inspect(s = h_connect(0));
	ck_assert_uint_eq(st->state->n_allocations, 0);
	cuip__response__free_unpacked(st, NULL);
	close(s);
}
END_TEST

/* A whole allocation (not a slab) comes in one entry: a second entry for
 * it, or stored lengths (compressed chunks) not one per chunk, are refused
 * before anything is recreated, and the LOAD right after brings its bytes
 * back. */
START_TEST(a_whole_allocation_named_twice_is_refused)
{
	const size_t sz = 4u << 20;
	CUdeviceptr p;
	CUipcMemHandle ih;
	Cuip__Response *st, *saved, *r;
	Cuip__CarrierEntry *e[2];
	char file[300];
	int s, fd;

	h_init(0);
	CK(cuMemAlloc(&p, sz));
	fill_bytes(p, sz, 7);
	CK(cuIpcGetMemHandle(&ih, p)); /* shared: carried */
	s = h_connect(0);
	st = h_inspect(s);
	ck_assert_uint_eq(st->state->n_allocations, 1);
	ck_assert(!st->state->allocations[0]->slab);
	saved = quiesce_and_save(s, st->state->allocations[0]->id, "carrier-whole.img", file, sizeof(file), &fd);
	ck_assert_uint_eq(saved->save->n_entries, 1);
	ck_assert(!saved->save->entries[0]->has_alloc_offset);
	h_flag(s, CUIP__REQUEST__BODY_PREPARE_UNICAST, "PREPARE_UNICAST");
	e[0] = e[1] = saved->save->entries[0];
	load_refused(s, e, 2, file, -EINVAL, "carrier entry 1 is a second entry for it");
	{
		uint32_t two[2] = {0, 0};

		e[0]->stored = two;
		e[0]->n_stored = 2;
		load_refused(s, e, 1, file, -EINVAL,
			     "carrier entry 0 has 2 stored lengths for 4 chunks (corrupt carrier index)");
		e[0]->stored = NULL;
		e[0]->n_stored = 0;
	}
	r = load_call(s, e, 1, file);
	ck_assert_msg(r->status == 0, "LOAD: %s", r->error ? r->error : "");
	ck_assert_uint_eq(r->load->bytes, sz);
	cuip__response__free_unpacked(r, NULL);
	rebuild_creators(s, st->state->self);
	h_flag(s, CUIP__REQUEST__BODY_RESUME, "RESUME");
	close(s);
	close(fd);
	cuip__response__free_unpacked(saved, NULL);
	cuip__response__free_unpacked(st, NULL);
	ck_assert_msg(check_bytes(p, sz, 7), "the allocation's bytes after LOAD");
	CK(cuMemFree(p));
}
END_TEST

START_TEST(verify_refuses_a_slab_whose_pieces_differ)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Verify v = CUIP__VERIFY__INIT;
	Cuip__Response *st, *r;
	CUipcMemHandle ih;
	CUdeviceptr p, q;
	int s;

	h_init(0);
	CK(cuMemAlloc(&p, 4096));
	CK(cuMemAlloc(&q, 5000));
	CK(cuIpcGetMemHandle(&ih, q));
	s = h_connect(0);
	st = h_inspect(s);
	ck_assert_uint_eq(st->state->allocations[0]->n_pieces, 2);
	st->state->allocations[0]->pieces[1]->size = 4999;
	v.expected = st->state;
	req.body_case = CUIP__REQUEST__BODY_VERIFY;
	req.verify = &v;
	r = h_call(s, &req, -1);
	ck_assert_int_eq(r->status, -EIO);
	ck_assert_msg(r->error && strstr(r->error, "differs from the checkpoint"), "VERIFY said %s",
		      r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	cuip__response__free_unpacked(st, NULL);
	close(s);
}
END_TEST

Suite *slab_suite(void)
{
	Suite *s = suite_create("slab");
	TCase *tc = tcase_create("pieces");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, thousand_4k_allocations_use_native_device_memory);
	tcase_add_test(tc, thousand_64k_allocations_use_native_device_memory);
	tcase_add_test(tc, pieces_are_aligned_and_report_their_own_range);
	tcase_add_test(tc, a_slab_whose_pieces_are_all_freed_is_released);
	tcase_add_test(tc, importer_maps_the_slab_once_and_gets_each_piece_at_its_offset);
	tcase_add_test(tc, malformed_piece_handles_are_refused);
	tcase_add_test(tc, shared_slab_saves_live_pieces_only_and_loads_them_back);
	tcase_add_test(tc, a_whole_allocation_named_twice_is_refused);
	tcase_add_test(tc, verify_refuses_a_slab_whose_pieces_differ);
	suite_add_tcase(s, tc);
	return s;
}
