/*
 * test_mc.c - multicast tracking (interposer/kinds/multicast.c): logical handles,
 * requested and effective extent, devices by UUID, BindMem/BindAddr v1 and
 * _v2, unbind of a slice and rebind by address, refusal of untracked
 * members, and PREPARE_MULTICAST + REBUILD MC_* in one process driving two
 * fake devices (handle type 0), with a fault injected into the rebuild.
 * run-test.sh gives 2 devices; the Makefile sets FAKECUDA_MC_ROUND_MB=8.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MC_REQ (4 * MiB)
#define MC_EFF (8 * MiB) /* FAKECUDA_MC_ROUND_MB=8 */

struct member {
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
};

/* A POSIX-capable allocation on device ord, mapped RW for that device. */
static void member_on(int ord, size_t size, struct member *m)
{
	CUmemAllocationProp p = h_prop(ord, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, ord}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

	CK(cuMemCreate(&m->h, size, &p, 0));
	CK(cuMemAddressReserve(&m->va, size, 0, 0, 0));
	CK(cuMemMap(m->va, size, 0, m->h, 0));
	CK(cuMemSetAccess(m->va, size, &d, 1));
}

static CUmemGenericAllocationHandle mc_new(unsigned long long types)
{
	CUmulticastObjectProp p = {0};
	CUmemGenericAllocationHandle h;

	p.numDevices = 2;
	p.size = MC_REQ;
	p.handleTypes = types;
	CK(cuMulticastCreate(&h, &p));
	ck_assert_uint_eq((uint64_t)h >> TAG_SHIFT, TAG);
	return h;
}

/* Map the whole effective extent of the object, RW for both devices. */
static CUdeviceptr mc_map(CUmemGenericAllocationHandle h)
{
	CUmemAccessDesc d[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
				{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
	CUdeviceptr va;

	CK(cuMemAddressReserve(&va, MC_EFF, 0, 0, 0));
	CK(cuMemMap(va, MC_EFF, 0, h, 0));
	CK(cuMemSetAccess(va, MC_EFF, d, 2));
	return va;
}

static const Cuip__Allocation *find_mc(const Cuip__ProcessState *st)
{
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->kind == CUIP__ALLOC_KIND__KIND_MULTICAST)
			return st->allocations[i];
	return NULL;
}

static bool all_words(CUdeviceptr va, size_t size, uint32_t v)
{
	uint32_t *b = malloc(size);
	bool ok = true;

	CK(cuMemcpyDtoH(b, va, size));
	for (size_t i = 0; i < size / 4 && ok; i++)
		ok = b[i] == v;
	free(b);
	return ok;
}

/* Two devices, a member each: BindMem v1 on device 0, BindAddr _v2 on device 1. */
static CUmemGenericAllocationHandle team(unsigned long long types, struct member m[2])
{
	CUmemGenericAllocationHandle h;

	h_init(0);
	h = mc_new(types);
	CK(cuMulticastAddDevice(h, 0));
	CK(cuMulticastAddDevice(h, 1));
	member_on(0, MC_REQ, &m[0]);
	member_on(1, MC_REQ, &m[1]);
	CK(cuMulticastBindMem(h, 0, m[0].h, 0, MC_REQ, 0));
	CK(cuMulticastBindAddr_v2(h, 1, 0, m[1].va, MC_REQ, 0));
	return h;
}

START_TEST(multicast_records_requested_and_effective_extent_devices_and_bindings)
{
	struct member m[2];
	CUmemGenericAllocationHandle h = team(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, m);
	CUdeviceptr mva = mc_map(h);
	Cuip__ProcessState *st = h_state(0);
	const Cuip__Allocation *a = find_mc(st);

	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a->origin, CUIP__ORIGIN__ORIGIN_MC_CREATE);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_SHARED);
	ck_assert_uint_eq(a->logical_handle, h);
	ck_assert_uint_eq(a->mc->num_devices, 2);
	ck_assert_uint_eq(a->mc->requested_size, MC_REQ);
	ck_assert_uint_eq(a->mc->effective_size, MC_EFF);
	ck_assert_uint_eq(st->n_mc_devices, 2);
	for (size_t i = 0; i < 2; i++) {
		ck_assert_int_eq(st->mc_devices[i]->device, (int)i);
		ck_assert_uint_eq(st->mc_devices[i]->device_uuid.len, 16);
		ck_assert_int_eq(memcmp(st->mc_devices[i]->device_uuid.data, st->devices[i]->uuid.data, 16), 0);
	}
	ck_assert_uint_eq(st->n_mc_bindings, 2);
	ck_assert_int_eq(st->mc_bindings[0]->device, 0);
	ck_assert_uint_eq(st->mc_bindings[0]->abi, 1);
	ck_assert(!st->mc_bindings[0]->by_addr);
	ck_assert_int_eq(st->mc_bindings[1]->device, 1);
	ck_assert_uint_eq(st->mc_bindings[1]->abi, 2);
	ck_assert(st->mc_bindings[1]->by_addr);
	ck_assert_uint_eq(st->mc_bindings[1]->member_va, m[1].va);
	/* Every bound member became SHARED (its creator carries it). */
	for (size_t i = 0; i < st->n_allocations; i++)
		ck_assert_int_eq(st->allocations[i]->owner, CUIP__OWNER__OWNER_SHARED);
	h_state_free(st);
	/* A write through the multicast mapping reaches both members. */
	CK(cuMemsetD32(mva, 0xC0FFEE01u, MC_REQ / 4));
	ck_assert(all_words(m[0].va, MC_REQ, 0xC0FFEE01u));
	ck_assert(all_words(m[1].va, MC_REQ, 0xC0FFEE01u));
	/* A multicast ticket carries the object's properties. */
	int fd;
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	st = h_state(0);
	ck_assert_uint_eq(st->n_tickets, 1);
	ck_assert_int_eq(st->tickets[0]->kind, CUIP__ALLOC_KIND__KIND_MULTICAST);
	ck_assert_uint_eq(st->tickets[0]->mc->requested_size, MC_REQ);
	h_state_free(st);
	close(fd);
}
END_TEST

START_TEST(unbound_slice_rebound_by_address_replaces_only_that_slice)
{
	struct member m[2];
	CUmemGenericAllocationHandle h = team(0, m);
	Cuip__ProcessState *st;

	/* PyTorch's pattern: device 0's member bound in two slices, the second
	 * unbound and bound again by address. */
	CK(cuMulticastUnbind(h, 0, 0, MC_REQ));
	CK(cuMulticastBindMem(h, 0, m[0].h, 0, 2 * MiB, 0));
	CK(cuMulticastBindMem(h, 2 * MiB, m[0].h, 2 * MiB, 2 * MiB, 0));
	CK(cuMulticastUnbind(h, 0, 2 * MiB, 2 * MiB));
	st = h_state(0);
	ck_assert_uint_eq(st->n_mc_bindings, 2); /* device 1's and the first slice */
	h_state_free(st);
	CK(cuMulticastBindAddr(h, 2 * MiB, m[0].va + 2 * MiB, 2 * MiB, 0));
	st = h_state(0);
	ck_assert_uint_eq(st->n_mc_bindings, 3);
	ck_assert_uint_eq(st->mc_bindings[2]->device, 0);
	ck_assert_uint_eq(st->mc_bindings[2]->mc_offset, 2 * MiB);
	ck_assert_uint_eq(st->mc_bindings[2]->member_offset, 2 * MiB);
	ck_assert_uint_eq(st->mc_bindings[2]->member_va, m[0].va + 2 * MiB);
	ck_assert_uint_eq(st->mc_bindings[2]->abi, 1);
	ck_assert(st->mc_bindings[2]->by_addr);
	h_state_free(st);
	/* The driver refuses an unbind that matches no binding; nothing changes. */
	CK_ERR(cuMulticastUnbind(h, 1, 1 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
	st = h_state(0);
	ck_assert_uint_eq(st->n_mc_bindings, 3);
	h_state_free(st);
	/* Only live bindings are replayed: tear down and rebuild in place. */
	CUdeviceptr mva = mc_map(h);
	CK(cuMemsetD32(mva, 0x5A5A5A5Au, MC_REQ / 4));
	ck_assert(all_words(m[0].va, MC_REQ, 0x5A5A5A5Au));
	ck_assert(all_words(m[1].va, MC_REQ, 0x5A5A5A5Au));
}
END_TEST

START_TEST(binding_untracked_memory_into_a_tracked_object_is_refused)
{
	CUmemAllocationProp p;
	CUmemGenericAllocationHandle h, priv;
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr va;
	Cuip__ProcessState *st;

	h_init(0);
	h = mc_new(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CK(cuMulticastAddDevice(h, 0));
	p = h_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CK(cuMemCreate(&priv, MC_REQ, &p, 0)); /* private: native owns it, untracked */
	ck_assert_uint_ne((uint64_t)priv >> TAG_SHIFT, TAG);
	CK_ERR(cuMulticastBindMem_v2(h, 0, 0, priv, 0, MC_REQ, 0), CUDA_ERROR_NOT_SUPPORTED);
	CK(cuMemAddressReserve(&va, MC_REQ, 0, 0, 0));
	CK(cuMemMap(va, MC_REQ, 0, priv, 0));
	CK(cuMemSetAccess(va, MC_REQ, &d, 1));
	CK_ERR(cuMulticastBindAddr(h, 0, va, MC_REQ, 0), CUDA_ERROR_NOT_SUPPORTED);
	/* A unicast logical handle is no multicast object. */
	struct member m;
	member_on(0, MC_REQ, &m);
	CK_ERR(cuMulticastBindMem(m.h, 0, m.h, 0, MC_REQ, 0), CUDA_ERROR_INVALID_VALUE);
	st = h_state(0);
	ck_assert_uint_eq(st->n_mc_bindings, 0);
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->kind == CUIP__ALLOC_KIND__KIND_UNICAST)
			ck_assert_int_eq(st->allocations[i]->owner, CUIP__OWNER__OWNER_NATIVE);
	h_state_free(st);
}
END_TEST

START_TEST(fabric_multicast_is_tracked_as_unsupported)
{
	CUmulticastObjectProp p = {0};
	CUmemGenericAllocationHandle h;
	const Cuip__Allocation *a;
	Cuip__ProcessState *st;

	h_init(0);
	p.numDevices = 1;
	p.size = MC_REQ;
	p.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	/* Without IMEX the driver refuses fabric objects: nothing is tracked. */
	unsetenv("FAKECUDA_FABRIC");
	CK_ERR(cuMulticastCreate(&h, &p), CUDA_ERROR_NOT_SUPPORTED);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	h_state_free(st);
	/* On a fabric-capable system it is created, tracked, and named unsupported. */
	setenv("FAKECUDA_FABRIC", "1", 1);
	CK(cuMulticastCreate(&h, &p));
	ck_assert_uint_eq((uint64_t)h >> TAG_SHIFT, TAG);
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 1);
	a = find_mc(st);
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a->owner, CUIP__OWNER__OWNER_UNSUPPORTED);
	ck_assert_str_eq(a->unsupported_reason,
			 "multicast handle type FABRIC: fabric multicast objects cannot be rebuilt");
	ck_assert_uint_eq(st->counters->unsupported, 1);
	h_state_free(st);
	CK(cuMemRelease(h));
	st = h_state(0);
	ck_assert_uint_eq(st->n_allocations, 0);
	ck_assert_uint_eq(st->counters->unsupported, 0);
	h_state_free(st);
	unsetenv("FAKECUDA_FABRIC");
}
END_TEST

static Cuip__Response *req(int s, Cuip__Request *rq)
{
	Cuip__Response *r = NULL;

	ck_assert_int_eq(h_request(s, rq, -1, &r, NULL), 0);
	return r;
}

/* A request whose body is a flag; its status, and its error in err. */
static int flag_err(int s, Cuip__Request__BodyCase bc, char *err, size_t errlen)
{
	Cuip__Request rq = CUIP__REQUEST__INIT;
	Cuip__Response *r;
	int st;

	rq.body_case = bc;
	rq.resume = 1; /* every flag body is a protobuf bool in the same union */
	r = req(s, &rq);
	st = r->status;
	snprintf(err, errlen, "%s", r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	return st;
}

static int flag(int s, Cuip__Request__BodyCase bc)
{
	char err[512];

	return flag_err(s, bc, err, sizeof(err));
}

static int stage(int s, Cuip__Stage sg, Cuip__ProcessState *exp, char *err, size_t errlen)
{
	Cuip__Request rq = CUIP__REQUEST__INIT;
	Cuip__Rebuild rb = CUIP__REBUILD__INIT;
	Cuip__Response *r;
	int st;

	rb.stage = sg;
	rb.self = exp->self;
	rq.body_case = CUIP__REQUEST__BODY_REBUILD;
	rq.rebuild = &rb;
	r = req(s, &rq);
	st = r->status;
	snprintf(err, errlen, "%s", r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
	return st;
}

static int quiesce(int s)
{
	Cuip__Request rq = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *r;
	int st;

	q.timeout_ms = 2000;
	rq.body_case = CUIP__REQUEST__BODY_QUIESCE;
	rq.quiesce = &q;
	r = req(s, &rq);
	st = r->status;
	cuip__response__free_unpacked(r, NULL);
	return st;
}

START_TEST(private_object_on_two_devices_is_torn_down_and_rebuilt_in_place)
{
	struct member m[2];
	CUmemGenericAllocationHandle h = team(0, m);
	CUdeviceptr mva = mc_map(h);
	Cuip__ProcessState *exp = h_state(0), *now;
	char err[512];
	int s = h_connect(0);
	Cuip__Stage st[] = {CUIP__STAGE__STAGE_MC_CREATORS, CUIP__STAGE__STAGE_MC_IMPORTERS,
			    CUIP__STAGE__STAGE_MC_DEVICES, CUIP__STAGE__STAGE_MC_BINDINGS};

	CK(cuMemsetD32(mva, 0x11111111u, MC_REQ / 4));
	ck_assert_int_eq(quiesce(s), 0);
	ck_assert_int_eq(flag(s, CUIP__REQUEST__BODY_PREPARE_MULTICAST), 0);
	/* Detached: RESUME refuses until the rebuild. */
	ck_assert_int_ne(flag(s, CUIP__REQUEST__BODY_RESUME), 0);
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(stage(s, st[i], exp, err, sizeof(err)) == 0, "stage %d: %s", (int)st[i], err);
	{
		Cuip__Request rq = CUIP__REQUEST__INIT;
		Cuip__Verify v = CUIP__VERIFY__INIT;
		Cuip__Response *r;

		v.expected = exp;
		rq.body_case = CUIP__REQUEST__BODY_VERIFY;
		rq.verify = &v;
		r = req(s, &rq);
		ck_assert_msg(r->status == 0, "VERIFY: %s", r->error ? r->error : "");
		cuip__response__free_unpacked(r, NULL);
	}
	ck_assert_int_eq(flag(s, CUIP__REQUEST__BODY_RESUME), 0);
	close(s);
	now = h_state(0);
	ck_assert_uint_eq(now->n_mc_bindings, exp->n_mc_bindings);
	ck_assert_uint_eq(now->n_mc_devices, 2);
	ck_assert_uint_eq(find_mc(now)->logical_handle, h);
	h_state_free(now);
	h_state_free(exp);
	/* Members kept their bytes; the rebuilt object reaches both again. */
	ck_assert(all_words(m[1].va, MC_REQ, 0x11111111u));
	CK(cuMemsetD32(mva, 0x22222222u, MC_REQ / 4));
	ck_assert(all_words(m[0].va, MC_REQ, 0x22222222u));
	ck_assert(all_words(m[1].va, MC_REQ, 0x22222222u));
	ck_assert(all_words(mva, MC_REQ, 0x22222222u));
}
END_TEST

START_TEST(failed_recreate_stops_the_rebuild_with_the_object_named)
{
	struct member m[2];
	CUmemGenericAllocationHandle h;
	Cuip__ProcessState *exp;
	char err[512];
	int s;

	setenv("FAKECUDA_FAIL", "cuMulticastCreate:2:CUDA_ERROR_OUT_OF_MEMORY", 1);
	h = team(0, m);
	mc_map(h);
	exp = h_state(0);
	s = h_connect(0);
	ck_assert_int_eq(quiesce(s), 0);
	ck_assert_int_eq(flag(s, CUIP__REQUEST__BODY_PREPARE_MULTICAST), 0);
	ck_assert_int_ne(stage(s, CUIP__STAGE__STAGE_MC_CREATORS, exp, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "re-creating it") && strstr(err, "out of memory"), "%s", err);
	/* Devices cannot be added to an object that is not there. */
	ck_assert_int_ne(stage(s, CUIP__STAGE__STAGE_MC_DEVICES, exp, err, sizeof(err)), 0);
	ck_assert_int_ne(flag(s, CUIP__REQUEST__BODY_RESUME), 0);
	/* Retrying the stage (the fault was one-shot) completes the rebuild. */
	for (Cuip__Stage sg = CUIP__STAGE__STAGE_MC_CREATORS; sg <= CUIP__STAGE__STAGE_MC_BINDINGS; sg++)
		ck_assert_msg(stage(s, sg, exp, err, sizeof(err)) == 0, "stage %d: %s", (int)sg, err);
	ck_assert_int_eq(flag(s, CUIP__REQUEST__BODY_RESUME), 0);
	close(s);
	h_state_free(exp);
}
END_TEST

/* After a PREPARE_MULTICAST that failed and set its object back: nothing is
 * detached (RESUME needs no REBUILD), and the object reaches both members. */
static void still_attached(int s, struct member m[2], const CUdeviceptr *va, size_t nva)
{
	Cuip__ProcessState *now;

	ck_assert_int_eq(flag(s, CUIP__REQUEST__BODY_RESUME), 0);
	now = h_state(0);
	ck_assert_uint_eq(now->n_mc_bindings, 2);
	for (size_t i = 0; i < now->n_mappings; i++)
		ck_assert_msg(now->mappings[i]->n_access > 0, "mapping %#llx has no access",
			      (unsigned long long)now->mappings[i]->va);
	h_state_free(now);
	for (size_t i = 0; i < nva; i++) {
		uint32_t v = 0x30303030u + (uint32_t)i;

		CK(cuMemsetD32(va[i], v, MC_REQ / 4));
		ck_assert(all_words(m[0].va, MC_REQ, v));
		ck_assert(all_words(m[1].va, MC_REQ, v));
	}
}

/*
 * A team of two (team()) whose object has nva VAs mapped here, and a
 * PREPARE_MULTICAST that fails as `faults` (FAKECUDA_FAIL) make it: -EIO,
 * its message in err. Returns the control connection; *exp (when given)
 * is the state from before.
 */
static int prepare_multicast_fails(const char *faults, struct member m[2], CUdeviceptr *va, size_t nva,
				   Cuip__ProcessState **exp, char *err, size_t errlen)
{
	CUmemGenericAllocationHandle h;
	int s;

	setenv("FAKECUDA_FAIL", faults, 1);
	h = team(0, m);
	for (size_t i = 0; i < nva; i++)
		va[i] = mc_map(h);
	if (exp)
		*exp = h_state(0);
	s = h_connect(0);
	ck_assert_int_eq(quiesce(s), 0);
	ck_assert_int_eq(flag_err(s, CUIP__REQUEST__BODY_PREPARE_MULTICAST, err, errlen), -EIO);
	return s;
}

/* An object left detached: RESUME refuses, and the REBUILD's multicast
 * stages (by the state from before, which is freed) bring it back. */
static void left_to_the_rebuild(int s, Cuip__ProcessState *exp)
{
	static const Cuip__Stage st[] = {CUIP__STAGE__STAGE_MC_CREATORS, CUIP__STAGE__STAGE_MC_IMPORTERS,
					 CUIP__STAGE__STAGE_MC_DEVICES, CUIP__STAGE__STAGE_MC_BINDINGS};
	char err[512];

	ck_assert_int_eq(flag_err(s, CUIP__REQUEST__BODY_RESUME, err, sizeof(err)), -EBUSY);
	ck_assert_msg(strstr(err, "REBUILD first"), "%s", err);
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(stage(s, st[i], exp, err, sizeof(err)) == 0, "stage %d: %s", (int)st[i], err);
	h_state_free(exp);
}

START_TEST(failed_unbind_fails_prepare_multicast_and_sets_the_object_back)
{
	struct member m[2];
	CUdeviceptr va;
	char err[512];
	int s;

	/* The second unbind fails: the first binding is bound again, the VA
	 * mapped again with its access. */
	s = prepare_multicast_fails("cuMulticastUnbind:2:CUDA_ERROR_UNKNOWN", m, &va, 1, NULL, err, sizeof(err));
	ck_assert_msg(strstr(err, "unbinding") && strstr(err, "its bindings and VAs were set back"), "%s", err);
	still_attached(s, m, &va, 1);
	close(s);
}
END_TEST

/* The unmap fails and so does mapping the first VA back: the object is left
 * detached, RESUME refuses, and the rollback's REBUILD brings it back. */
START_TEST(failed_unmap_and_failed_map_back_leave_the_object_to_the_rebuild)
{
	struct member m[2];
	CUdeviceptr va[2];
	Cuip__ProcessState *exp;
	char err[512];
	int s;

	/* cuMemMap: two members and two VAs here, the 5th is the map-back. */
	s = prepare_multicast_fails("cuMemUnmap:2:CUDA_ERROR_UNKNOWN,cuMemMap:5:CUDA_ERROR_UNKNOWN", m, va, 2, &exp,
				    err, sizeof(err));
	ck_assert_msg(strstr(err, "unmapping") && strstr(err, "mapping the others back failed too: ") &&
			      strstr(err, "mapping at the original address"),
		      "%s", err);
	left_to_the_rebuild(s, exp);
	still_attached(s, m, va, 2);
	close(s);
}
END_TEST

/* Mapping the first VA back works but setting its access does not: it is
 * unmapped again and stays detached, and the REBUILD maps it with all of
 * its access (not a mapping left without access that nothing revisits). */
START_TEST(failed_access_on_the_map_back_leaves_the_va_to_the_rebuild)
{
	struct member m[2];
	CUdeviceptr va[2];
	Cuip__ProcessState *exp;
	char err[512];
	int s;

	/* cuMemSetAccess: two members and two VAs here, the 5th is the map-back's. */
	s = prepare_multicast_fails("cuMemUnmap:2:CUDA_ERROR_UNKNOWN,cuMemSetAccess:5:CUDA_ERROR_UNKNOWN", m, va, 2,
				    &exp, err, sizeof(err));
	ck_assert_msg(strstr(err, "mapping the others back failed too: ") && strstr(err, "access of"), "%s", err);
	left_to_the_rebuild(s, exp);
	still_attached(s, m, va, 2);
	close(s);
}
END_TEST

/* The handle will not go: the object stays detached with its handle, its
 * devices and no binding; the REBUILD binds and maps it again. */
START_TEST(failed_release_leaves_the_kept_handle_to_the_rebuild)
{
	struct member m[2];
	CUdeviceptr va;
	Cuip__ProcessState *exp;
	char err[512];
	int s;

	s = prepare_multicast_fails("cuMemRelease:1:CUDA_ERROR_UNKNOWN", m, &va, 1, &exp, err, sizeof(err));
	ck_assert_msg(strstr(err, "releasing it failed"), "%s", err);
	left_to_the_rebuild(s, exp);
	still_attached(s, m, &va, 1);
	close(s);
}
END_TEST

START_TEST(failed_unmap_of_a_multicast_va_maps_the_others_back)
{
	struct member m[2];
	CUdeviceptr va[2];
	char err[512];
	int s;

	/* Two VAs of one object; unmapping the second fails. */
	s = prepare_multicast_fails("cuMemUnmap:2:CUDA_ERROR_UNKNOWN", m, va, 2, NULL, err, sizeof(err));
	ck_assert_msg(strstr(err, "unmapping") && strstr(err, "the others were mapped back"), "%s", err);
	still_attached(s, m, va, 2);
	close(s);
}
END_TEST

Suite *mc_suite(void)
{
	Suite *s = suite_create("multicast");
	TCase *tc = tcase_create("multicast");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, multicast_records_requested_and_effective_extent_devices_and_bindings);
	tcase_add_test(tc, unbound_slice_rebound_by_address_replaces_only_that_slice);
	tcase_add_test(tc, binding_untracked_memory_into_a_tracked_object_is_refused);
	tcase_add_test(tc, fabric_multicast_is_tracked_as_unsupported);
	tcase_add_test(tc, private_object_on_two_devices_is_torn_down_and_rebuilt_in_place);
	tcase_add_test(tc, failed_recreate_stops_the_rebuild_with_the_object_named);
	tcase_add_test(tc, failed_unbind_fails_prepare_multicast_and_sets_the_object_back);
	tcase_add_test(tc, failed_unmap_of_a_multicast_va_maps_the_others_back);
	tcase_add_test(tc, failed_release_leaves_the_kept_handle_to_the_rebuild);
	tcase_add_test(tc, failed_access_on_the_map_back_leaves_the_va_to_the_rebuild);
	tcase_add_test(tc, failed_unmap_and_failed_map_back_leave_the_object_to_the_rebuild);
	suite_add_tcase(s, tc);
	return s;
}
