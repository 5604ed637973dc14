/*
 * peer.c - peer access mirrored into VMM access. Memory from cuMemAlloc and
 * cuIpcOpenMemHandle is VMM here (ipc.c), and VMM access is per mapping, not
 * per context: cuCtxEnablePeerAccess(peer) from a context on device F must
 * give F read-write access to every such mapping of memory on the peer's
 * device T, existing ones now and future ones when they are made
 * (cuip_peer_grant); cuCtxDisablePeerAccess takes it back. The matrix
 * (matrix[F] bit T) is reported as ProcessState.peer_access; the access it
 * implies is recorded per mapping like any other, so a rebuild replays it
 * for both devices and VERIFY checks it.
 *
 * Callers: the application (resolve.c routes every path here); ipc.c calls
 * cuip_peer_grant. Locking: cuip_state_lock protects the matrix and the
 * mappings; held across the cuMemSetAccess calls it mirrors.
 */
#include <string.h>

#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "peer.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"

/* Bit `to` of matrix[from]: from's contexts may access to's memory. */
static uint64_t matrix[64];

/* Set flags for device `from` on mapping m and record it (lock held). */
static void mirror(struct cuip_mapping *m, int from, unsigned flags)
{
	CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, from}, (CUmemAccess_flags)flags};
	CUresult r;

	cuip_state_assert_held();
	if (m->detached)
		return;
	r = real.cuMemSetAccess(m->va, m->size, &d, 1);
	if (r != CUDA_SUCCESS) {
		pr_err("peer access: setting access of device %d to %#llx: %s", from, (unsigned long long)m->va,
		       cuip_cuerr(r));
		return;
	}
	if (cuip_access_set(m, m->va, m->size, &d.location, flags))
		pr_err("out of memory recording access of mapping %#llx", (unsigned long long)m->va);
}

static bool mirrored(const struct cuip_mapping *m)
{
	return m->legacy && m->a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
}

void cuip_peer_grant(struct cuip_mapping *m)
{
	int to = m->a->prop.location.id;

	cuip_state_assert_held();
	if (!mirrored(m) || to < 0 || to >= 64)
		return;
	for (int from = 0; from < 64; from++)
		if (from != to && (matrix[from] >> to & 1))
			mirror(m, from, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

/* Devices of the current context and of peer. */
static CUresult devices(CUcontext peer, int *from, int *to)
{
	CUcontext popped;
	CUdevice d;
	CUresult r = real.cuCtxGetDevice(&d);

	if (r != CUDA_SUCCESS)
		return r;
	*from = d;
	r = real.cuCtxPushCurrent_v2(peer);
	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuCtxGetDevice(&d);
	real.cuCtxPopCurrent_v2(&popped);
	*to = d;
	return r;
}

static CUresult peer_change(CUcontext peer, unsigned int flags, bool on)
{
	int from, to;
	CUresult r;

	if (cuip_driver_init())
		return CUDA_ERROR_NOT_FOUND;
	if (!(on ? (void *)real.cuCtxEnablePeerAccess : (void *)real.cuCtxDisablePeerAccess) || !real.cuCtxGetDevice ||
	    !real.cuCtxPushCurrent_v2 || !real.cuCtxPopCurrent_v2)
		return CUDA_ERROR_NOT_FOUND;
	r = cuip_gate_enter();
	if (r != CUDA_SUCCESS)
		return r;
	r = on ? real.cuCtxEnablePeerAccess(peer, flags) : real.cuCtxDisablePeerAccess(peer);
	if (r != CUDA_SUCCESS)
		goto out;
	if (devices(peer, &from, &to) != CUDA_SUCCESS || from < 0 || from >= 64 || to < 0 || to >= 64) {
		pr_err("peer access: cannot tell the devices of the contexts; not mirrored");
		goto out;
	}
	cuip_state_take();
	if (on)
		matrix[from] |= 1ull << to;
	else
		matrix[from] &= ~(1ull << to);
	for (size_t i = 0; i < vmm.nmaps; i++) {
		struct cuip_mapping *m = vmm.maps[i];
		if (mirrored(m) && m->a->prop.location.id == to)
			mirror(m, from, on ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE);
	}
	cuip_state_drop();
	pr_info("peer access %s: device %d -> memory of device %d", on ? "enabled" : "disabled", from, to);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	return peer_change(peerContext, Flags, true);
}

CUIP_API CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
	return peer_change(peerContext, 0, false);
}

/* INSPECT: the matrix, one PeerAccess per pair (reply arena). */
static int peer_inspect(Cuip__ProcessState *st)
{
	size_t n = 0;

	for (int f = 0; f < 64; f++)
		n += (size_t)__builtin_popcountll(matrix[f]);
	st->peer_access = cuip_zalloc(sizeof(*st->peer_access) * (n ? n : 1));
	if (!st->peer_access)
		return -1;
	for (int f = 0; f < 64; f++) {
		for (int t = 0; t < 64; t++) {
			Cuip__PeerAccess *pa;

			if (!(matrix[f] >> t & 1))
				continue;
			pa = cuip_zalloc(sizeof(*pa));
			if (!pa)
				return -1;
			cuip__peer_access__init(pa);
			pa->from_device = f;
			pa->to_device = t;
			st->peer_access[st->n_peer_access++] = pa;
		}
	}
	return 0;
}
CUIP_SLICE(peer, .name = "peer access", .inspect = peer_inspect);

/* The child's contexts are its own to enable. */
static void fork_child(void)
{
	memset(matrix, 0, sizeof(matrix));
}
CUIP_FORK_HOOK(peer, NULL, NULL, fork_child);
