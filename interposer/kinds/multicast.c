/*
 * multicast.c - multicast objects: the entry points that create them, add
 * devices and bind or unbind member memory, and their teardown before a
 * checkpoint and rebuild after it.
 *
 * A multicast object is topology over unicast members: it holds no bytes of
 * its own. Its record is a struct cuip_alloc with ->mc set (so logical
 * handles, cuMemMap/SetAccess/Unmap/Release, tickets and the export cache
 * work on it as on any tracked allocation); ->mc keeps the requested
 * properties, the extent the driver accepted, the devices this process
 * added (ordinal and UUID) and the live bindings this process made. Any
 * tracked allocation bound into an object becomes SHARED (its creator
 * carries it) and is kept alive by its bindings (->mc_binds). Memory the
 * interposer does not track cannot be bound into a tracked object.
 *
 * Callers: application threads (inside the API gate) and the op thread
 * (PREPARE_MULTICAST, REBUILD stages MC_*, VERIFY, INSPECT).
 *
 * Locking: cuip_state_lock (record.c) protects every record. Binds wait in the
 * driver until every device of the team has been added, possibly by other
 * processes, so no lock is held across a driver call here; after one, the
 * object is looked up again by identity and its driver handle compared
 * before anything is recorded. The op thread holds the lock for a whole
 * operation: the gate keeps application threads out, and by MC_BINDINGS
 * every device has been added (MC_DEVICES is a global barrier before it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "multicast.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"
#include "xcache.h"

#define lock()	 cuip_state_take()
#define unlock() cuip_state_drop()

static CUresult enter(void *fn)
{
	if (cuip_driver_init() || !fn)
		return CUDA_ERROR_NOT_FOUND;
	return cuip_gate_enter();
}

/* ---- records ------------------------------------------------------------- */

void cuip_mc_props(const struct cuip_alloc *a, Cuip__McProps *p)
{
	const struct cuip_mc *m = a->mc;

	p->num_devices = m->num_devices;
	p->requested_size = m->requested;
	p->has_effective_size = 1;
	p->effective_size = m->effective;
	p->handle_types = m->handle_types;
	p->has_flags = 1;
	p->flags = m->flags;
}

struct cuip_mc *cuip_mc_from_props(const Cuip__McProps *p)
{
	struct cuip_mc *m = p ? calloc(1, sizeof(*m)) : NULL;

	if (!m)
		return NULL;
	m->num_devices = p->num_devices;
	m->requested = p->requested_size;
	m->effective =
		p->has_effective_size && p->effective_size > p->requested_size ? p->effective_size : p->requested_size;
	m->handle_types = p->handle_types;
	m->flags = p->has_flags ? p->flags : 0;
	return m;
}

void cuip_mc_note_extent(struct cuip_alloc *a, uint64_t end)
{
	if (a->mc && end > a->mc->effective)
		a->mc->effective = end;
}

static void mc_free(struct cuip_mc *m)
{
	if (!m)
		return;
	free(m->devs);
	free(m->binds);
	free(m);
}

/* Record death (after the driver handle was released, without state_lock):
 * the bindings it held drop their members. */
static void mc_died(struct cuip_alloc *a)
{
	struct cuip_mc *m = a->mc;
	struct cuip_alloc **dead;
	size_t ndead = 0;

	a->mc = NULL;
	if (!m)
		return;
	dead = calloc(m->nbinds ? m->nbinds : 1, sizeof(*dead));
	lock();
	for (size_t i = 0; i < m->nbinds; i++)
		if (cuip_alloc_unbound(m->binds[i].member) && dead)
			dead[ndead++] = m->binds[i].member;
	unlock();
	for (size_t i = 0; i < ndead; i++)
		cuip_alloc_destroy(dead[i]);
	free(dead);
	mc_free(m);
}

static bool mc_owns(const struct cuip_alloc *a)
{
	return a->mc != NULL;
}

/* Fork child: data only (the members are forgotten with every record). */
static void mc_forget(struct cuip_alloc *a)
{
	mc_free(a->mc);
}
static bool mc_kind_props(const struct cuip_alloc *a, Cuip__AllocKind *kind, Cuip__McProps *p)
{
	*kind = CUIP__ALLOC_KIND__KIND_MULTICAST;
	cuip_mc_props(a, p);
	return true;
}
CUIP_RECORD_EXT(multicast, .owns = mc_owns, .died = mc_died, .forget = mc_forget, .props = mc_kind_props);

static int push(void **v, size_t *n, size_t *cap, size_t elsz, const void *e)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 4;
		void *p = realloc(*v, c * elsz);
		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	memcpy((char *)*v + *n * elsz, e, elsz);
	(*n)++;
	return 0;
}

static int dev_push(struct cuip_mc *m, int ordinal)
{
	struct cuip_mc_dev d = {.ordinal = ordinal};
	const uint8_t *u = cuip_dev_uuid(ordinal);

	if (u) {
		memcpy(d.uuid, u, 16);
		d.has_uuid = true;
	}
	return push((void **)&m->devs, &m->ndevs, &m->capdevs, sizeof(d), &d);
}

static const char *mc_unsupported(uint64_t types)
{
	if (types & CU_MEM_HANDLE_TYPE_FABRIC)
		return "multicast handle type FABRIC: fabric multicast objects cannot be rebuilt";
	return "multicast handle types other than POSIX_FILE_DESCRIPTOR cannot be rebuilt";
}

/* ---- entry points -------------------------------------------------------- */

CUIP_API CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
	struct cuip_alloc *a;
	struct cuip_mc *m;
	uint64_t types;
	CUresult r = enter(real.cuMulticastCreate);

	if (r != CUDA_SUCCESS)
		return r;
	r = real.cuMulticastCreate(mcHandle, prop);
	if (r != CUDA_SUCCESS)
		goto out;
	if (cuip_is_logical(*mcHandle)) {
		pr_err("driver multicast handle %#llx collides with cuinterpose's logical handle space; refusing it",
		       (unsigned long long)*mcHandle);
		real.cuMemRelease(*mcHandle);
		r = CUDA_ERROR_UNKNOWN;
		goto out;
	}
	cuip_start();
	types = prop->handleTypes;
	m = calloc(1, sizeof(*m));
	lock();
	a = m ? cuip_alloc_new(0, 0) : NULL;
	if (!a) {
		unlock();
		free(m);
		real.cuMemRelease(*mcHandle);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->num_devices = prop->numDevices;
	m->requested = m->effective = prop->size;
	m->handle_types = types;
	m->flags = prop->flags;
	a->mc = m;
	a->size = prop->size;
	a->prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
	a->drv = *mcHandle;
	a->origin = CUIP__ORIGIN__ORIGIN_MC_CREATE;
	/* Handle type 0 (one process driving several GPUs) is rebuilt too. */
	if (types & ~(uint64_t)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		a->owner = CUIP__OWNER__OWNER_UNSUPPORTED;
		a->unsupported = mc_unsupported(types);
		vmm.unsupported++;
	} else {
		a->owner = CUIP__OWNER__OWNER_SHARED;
	}
	a->app_handles = 1;
	cuip_logical_assign(a);
	*mcHandle = a->logical;
	unlock();
out:
	cuip_gate_exit();
	return r;
}

/* Look up a tracked multicast object: its identity and driver handle. */
static struct cuip_alloc *mc_lookup(CUmemGenericAllocationHandle h)
{
	struct cuip_alloc *a = cuip_by_logical(h);

	return a && a->mc && a->drv ? a : NULL;
}

/*
 * A multicast object named across a driver call that may block on other
 * ranks (add device, bind, unbind): no lock is held across the call, so the
 * object is remembered by identity and driver handle, and found again after
 * it. Anything else (released, re-created) means it changed meanwhile.
 */
struct mc_ref {
	uint64_t creator, serial;
	CUmemGenericAllocationHandle drv;
};

static void mc_ref_of(const struct cuip_alloc *a, struct mc_ref *ref)
{
	ref->creator = a->creator;
	ref->serial = a->serial;
	ref->drv = a->drv;
}

/* Takes the state lock for the lookup only; CUDA_ERROR_INVALID_VALUE if h is no tracked object. */
static CUresult mc_ref_take(CUmemGenericAllocationHandle h, struct mc_ref *ref)
{
	struct cuip_alloc *a;

	lock();
	a = mc_lookup(h);
	if (a)
		mc_ref_of(a, ref);
	unlock();
	return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* State lock held: the same object, still tracked with the same driver handle, or NULL. */
static struct cuip_alloc *mc_ref_find(const struct mc_ref *ref)
{
	struct cuip_alloc *a = cuip_alloc_by_id(ref->creator, ref->serial);

	cuip_state_assert_held();
	return a && a->mc && a->drv == ref->drv ? a : NULL;
}

CUIP_API CUresult CUDAAPI cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
	struct mc_ref ref;
	struct cuip_alloc *a;
	CUresult r = enter(real.cuMulticastAddDevice);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(mcHandle)) {
		r = real.cuMulticastAddDevice(mcHandle, dev);
		goto out;
	}
	r = mc_ref_take(mcHandle, &ref);
	if (r != CUDA_SUCCESS)
		goto out;
	r = real.cuMulticastAddDevice(ref.drv, dev);
	if (r != CUDA_SUCCESS)
		goto out;
	lock();
	a = mc_ref_find(&ref);
	if (!a) {
		pr_err("multicast object " ID_FMT " was released while device %d was being added; not recorded",
		       (unsigned long long)ref.creator, (unsigned long long)ref.serial, (int)dev);
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (dev_push(a->mc, (int)dev)) {
		pr_err("out of memory recording device %d of multicast object " ID_FMT, (int)dev, ID(a));
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	unlock();
out:
	cuip_gate_exit();
	return r;
}

struct bind_req {
	unsigned abi; /* 1 or 2 */
	bool by_addr;
	CUmemGenericAllocationHandle mch, memh;
	CUdevice dev; /* abi 2 */
	size_t mc_offset, mem_offset, size;
	CUdeviceptr memptr;
	unsigned long long flags;
};

static CUresult bind_real(const struct bind_req *q, CUmemGenericAllocationHandle mc, CUmemGenericAllocationHandle mem)
{
	if (q->abi == 2)
		return q->by_addr ? real.cuMulticastBindAddr_v2(mc, q->dev, q->mc_offset, q->memptr, q->size, q->flags)
				  : real.cuMulticastBindMem_v2(mc, q->dev, q->mc_offset, mem, q->mem_offset, q->size,
							       q->flags);
	return q->by_addr ? real.cuMulticastBindAddr(mc, q->mc_offset, q->memptr, q->size, q->flags)
			  : real.cuMulticastBindMem(mc, q->mc_offset, mem, q->mem_offset, q->size, q->flags);
}

static void *bind_fn(const struct bind_req *q)
{
	if (q->abi == 2)
		return q->by_addr ? (void *)real.cuMulticastBindAddr_v2 : (void *)real.cuMulticastBindMem_v2;
	return q->by_addr ? (void *)real.cuMulticastBindAddr : (void *)real.cuMulticastBindMem;
}

/* An object the interposer does not track: translate a tracked member handle
 * and pass through. */
static CUresult bind_untracked(const struct bind_req *q)
{
	CUmemGenericAllocationHandle mem = q->memh;
	struct cuip_alloc *a;

	if (!q->by_addr && cuip_is_logical(mem)) {
		lock();
		a = cuip_by_logical(mem);
		mem = a ? a->drv : 0;
		unlock();
		if (!a)
			return CUDA_ERROR_INVALID_VALUE;
	}
	return bind_real(q, q->mch, mem);
}

static CUresult bind(const struct bind_req *q)
{
	CUmemGenericAllocationHandle memdrv;
	struct mc_ref ref;
	struct cuip_alloc *mc, *mem = NULL;
	struct cuip_mc_bind b = {0};
	bool dead;
	CUresult r = enter(bind_fn(q));

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(q->mch)) {
		r = bind_untracked(q);
		goto out;
	}
	lock();
	mc = mc_lookup(q->mch);
	if (!mc) {
		unlock();
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	b.member_offset = q->mem_offset;
	if (q->by_addr) {
		struct cuip_mapping *m = cuip_mapping_at(q->memptr);
		if (m && !m->a->mc && q->memptr + q->size <= m->va + m->size) {
			mem = m->a;
			b.member_offset = m->offset + (q->memptr - m->va);
			b.member_va = q->memptr;
		}
	} else if (cuip_is_logical(q->memh)) {
		mem = cuip_by_logical(q->memh);
		if (!mem || mem->mc) {
			unlock();
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
	}
	if (!mem || !mem->drv) {
		pr_err("binding memory cuinterpose does not track (%s %#llx, %zu bytes) into multicast object " ID_FMT
		       " refused: it could not be rebuilt after a checkpoint; bind memory from cuMemCreate with "
		       "POSIX_FILE_DESCRIPTOR handles",
		       q->by_addr ? "address" : "handle", (unsigned long long)(q->by_addr ? q->memptr : q->memh),
		       q->size, ID(mc));
		unlock();
		r = CUDA_ERROR_NOT_SUPPORTED;
		goto out;
	}
	mc_ref_of(mc, &ref);
	memdrv = mem->drv;
	mem->mc_binds++; /* keeps the member alive while we wait in the driver */
	unlock();

	r = bind_real(q, ref.drv, memdrv);

	lock();
	if (r == CUDA_SUCCESS) {
		mc = mc_ref_find(&ref);
		if (!mc || cuip_phase() != CUIP__PHASE__PHASE_ACTIVE) {
			pr_err("multicast object %016llx:%llu changed while binding into it; binding undone",
			       (unsigned long long)ref.creator, (unsigned long long)ref.serial);
			real.cuMulticastUnbind(ref.drv, q->abi == 2 ? q->dev : mem->prop.location.id, q->mc_offset,
					       q->size);
			r = CUDA_ERROR_INVALID_VALUE;
		}
	}
	if (r == CUDA_SUCCESS) {
		b.dev = q->abi == 2 ? (int)q->dev : mem->prop.location.id;
		b.mc_offset = q->mc_offset;
		b.size = q->size;
		b.flags = q->flags;
		b.member = mem;
		b.by_addr = q->by_addr;
		b.abi = q->abi;
		if (push((void **)&mc->mc->binds, &mc->mc->nbinds, &mc->mc->capbinds, sizeof(b), &b)) {
			real.cuMulticastUnbind(ref.drv, b.dev, q->mc_offset, q->size);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			if (mem->owner == CUIP__OWNER__OWNER_NATIVE)
				mem->owner = CUIP__OWNER__OWNER_SHARED;
			cuip_mc_note_extent(mc, q->mc_offset + q->size);
			unlock();
			goto out; /* the pin became the binding's reference */
		}
	}
	dead = cuip_alloc_unbound(mem);
	unlock();
	if (dead)
		cuip_alloc_destroy(mem);
out:
	cuip_gate_exit();
	return r;
}

CUIP_API CUresult CUDAAPI cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
					     CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
					     unsigned long long flags)
{
	struct bind_req q = {.abi = 1,
			     .mch = mcHandle,
			     .memh = memHandle,
			     .mc_offset = mcOffset,
			     .mem_offset = memOffset,
			     .size = size,
			     .flags = flags};
	return bind(&q);
}

CUIP_API CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
						CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
						unsigned long long flags)
{
	struct bind_req q = {.abi = 2,
			     .mch = mcHandle,
			     .dev = dev,
			     .memh = memHandle,
			     .mc_offset = mcOffset,
			     .mem_offset = memOffset,
			     .size = size,
			     .flags = flags};
	return bind(&q);
}

CUIP_API CUresult CUDAAPI cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
					      CUdeviceptr memptr, size_t size, unsigned long long flags)
{
	struct bind_req q = {.abi = 1,
			     .by_addr = true,
			     .mch = mcHandle,
			     .mc_offset = mcOffset,
			     .memptr = memptr,
			     .size = size,
			     .flags = flags};
	return bind(&q);
}

CUIP_API CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
						 CUdeviceptr memptr, size_t size, unsigned long long flags)
{
	struct bind_req q = {.abi = 2,
			     .by_addr = true,
			     .mch = mcHandle,
			     .dev = dev,
			     .mc_offset = mcOffset,
			     .memptr = memptr,
			     .size = size,
			     .flags = flags};
	return bind(&q);
}

/*
 * Forget the bindings of dev over [lo, hi): a binding partly inside keeps
 * the parts outside (PyTorch unbinds a slice and binds it again by address).
 * Members that die are returned in dead[] (room for m->nbinds entries).
 */
static int unbind_range(struct cuip_mc *m, int dev, uint64_t lo, uint64_t hi, struct cuip_alloc **dead, size_t *ndead)
{
	for (size_t i = 0; i < m->nbinds;) {
		struct cuip_mc_bind *b = &m->binds[i], right;
		uint64_t end = b->mc_offset + b->size;
		bool keep_left, keep_right;

		if (b->dev != dev || end <= lo || b->mc_offset >= hi) {
			i++;
			continue;
		}
		keep_left = b->mc_offset < lo;
		keep_right = end > hi;
		right = *b;
		if (keep_right) {
			uint64_t cut = hi - b->mc_offset;
			right.mc_offset = hi;
			right.member_offset += cut;
			if (right.member_va)
				right.member_va += cut;
			right.size = end - hi;
		}
		if (keep_left) {
			b->size = lo - b->mc_offset;
			if (keep_right) {
				if (push((void **)&m->binds, &m->nbinds, &m->capbinds, sizeof(right), &right))
					return -ENOMEM;
				right.member->mc_binds++;
			}
			i++;
		} else if (keep_right) {
			*b = right;
			i++;
		} else {
			struct cuip_alloc *mem = b->member;
			memmove(b, b + 1, (m->nbinds - i - 1) * sizeof(*b));
			m->nbinds--;
			if (cuip_alloc_unbound(mem))
				dead[(*ndead)++] = mem;
		}
	}
	return 0;
}

CUIP_API CUresult CUDAAPI cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					    size_t size)
{
	struct cuip_alloc *a, **dead = NULL;
	struct mc_ref ref;
	size_t ndead = 0;
	CUresult r = enter(real.cuMulticastUnbind);

	if (r != CUDA_SUCCESS)
		return r;
	if (!cuip_is_logical(mcHandle)) {
		r = real.cuMulticastUnbind(mcHandle, dev, mcOffset, size);
		goto out;
	}
	r = mc_ref_take(mcHandle, &ref);
	if (r != CUDA_SUCCESS)
		goto out;
	r = real.cuMulticastUnbind(ref.drv, dev, mcOffset, size);
	if (r != CUDA_SUCCESS)
		goto out;
	lock();
	a = mc_ref_find(&ref);
	if (a) {
		dead = calloc(a->mc->nbinds + 1, sizeof(*dead));
		if (!dead || unbind_range(a->mc, (int)dev, mcOffset, (uint64_t)mcOffset + size, dead, &ndead)) {
			pr_err("out of memory recording an unbind of multicast object " ID_FMT, ID(a));
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	unlock();
	for (size_t i = 0; i < ndead; i++)
		cuip_alloc_destroy(dead[i]);
	free(dead);
out:
	cuip_gate_exit();
	return r;
}

/* ---- INSPECT ------------------------------------------------------------- */

static Cuip__AllocId *arena_id(uint64_t creator, uint64_t serial)
{
	Cuip__AllocId *id = cuip_zalloc(sizeof(*id));

	if (id) {
		cuip__alloc_id__init(id);
		id->creator = creator;
		id->serial = serial;
	}
	return id;
}

static int mc_slice_state(Cuip__ProcessState *st)
{
	size_t nd = 0, nb = 0;

	cuip_state_assert_held();
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		if (a->mc) {
			nd += a->mc->ndevs;
			nb += a->mc->nbinds;
		}
	}
	if (!nd && !nb)
		return 0;
	st->mc_devices = cuip_zalloc(sizeof(*st->mc_devices) * (nd ? nd : 1));
	st->mc_bindings = cuip_zalloc(sizeof(*st->mc_bindings) * (nb ? nb : 1));
	if (!st->mc_devices || !st->mc_bindings)
		return -ENOMEM;
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		struct cuip_mc *m = a->mc;

		if (!m)
			continue;
		for (size_t i = 0; i < m->ndevs; i++) {
			Cuip__McDevice *d = cuip_zalloc(sizeof(*d));
			if (!d)
				return -ENOMEM;
			cuip__mc_device__init(d);
			d->mc = arena_id(a->creator, a->serial);
			d->participant = self.id;
			d->device = m->devs[i].ordinal;
			if (m->devs[i].has_uuid) {
				d->has_device_uuid = 1;
				d->device_uuid.data = cuip_zalloc(16);
				if (!d->device_uuid.data)
					return -ENOMEM;
				memcpy(d->device_uuid.data, m->devs[i].uuid, 16);
				d->device_uuid.len = 16;
			}
			if (!d->mc)
				return -ENOMEM;
			st->mc_devices[st->n_mc_devices++] = d;
		}
		for (size_t i = 0; i < m->nbinds; i++) {
			const struct cuip_mc_bind *b = &m->binds[i];
			Cuip__McBinding *e = cuip_zalloc(sizeof(*e));
			if (!e)
				return -ENOMEM;
			cuip__mc_binding__init(e);
			e->mc = arena_id(a->creator, a->serial);
			e->member = arena_id(b->member->creator, b->member->serial);
			if (!e->mc || !e->member)
				return -ENOMEM;
			e->participant = self.id;
			e->device = b->dev;
			e->mc_offset = b->mc_offset;
			e->member_offset = b->member_offset;
			e->size = b->size;
			e->has_by_addr = 1;
			e->by_addr = b->by_addr;
			e->has_member_va = b->by_addr;
			e->member_va = b->member_va;
			e->has_abi = 1;
			e->abi = b->abi;
			e->has_flags = 1;
			e->flags = b->flags;
			st->mc_bindings[st->n_mc_bindings++] = e;
		}
	}
	return 0;
}

/* ---- PREPARE_MULTICAST (op thread, state lock held) ----------------------- */

static bool rebuildable(const struct cuip_alloc *a)
{
	return a->mc && a->owner == CUIP__OWNER__OWNER_SHARED;
}

static bool mc_slice_any_detached(void)
{
	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		if (a->mc && a->mc->detached)
			return true;
	return false;
}

static bool same_object(const struct cuip_alloc *a, const void *arg);
static int mc_bind_again(struct cuip_alloc *a, size_t n, char *err, size_t errlen);

/*
 * Detach one shared object: its VAs (the reservations are the
 * application's and stay), its bindings, its cached export, its handle.
 * The record owner's failure policy: a failure undoes this object's steps
 * (bindings and VAs set back), so it stays attached; when the undo fails
 * too, or the handle will not go, the object is left marked detached and
 * the rollback's REBUILD rebuilds it, as it does the objects detached
 * before it.
 */
static int mc_detach(struct cuip_alloc *a, char *err, size_t errlen)
{
	char why[256];
	CUresult r;
	int ret = cuip_maps_detach(same_object, a, "multicast object", err, errlen);

	if (ret == -ENOTRECOVERABLE)
		a->mc->detached = a->mc->kept = true;
	if (ret)
		return -EIO;
	for (size_t i = 0; i < a->mc->nbinds; i++) {
		const struct cuip_mc_bind *b = &a->mc->binds[i];
		bool undone;

		r = real.cuMulticastUnbind(a->drv, b->dev, b->mc_offset, b->size);
		if (r == CUDA_SUCCESS) {
			a->mc->binds[i].unbound = true;
			continue;
		}
		undone = mc_bind_again(a, i, why, sizeof(why)) == 0;
		if (!undone)
			a->mc->detached = a->mc->kept = true;
		snprintf(err, errlen, "multicast object " ID_FMT ": unbinding %#llx+%#llx of device %d failed: %s%s%s",
			 ID(a), (unsigned long long)b->mc_offset, (unsigned long long)b->size, b->dev, cuip_cuerr(r),
			 undone ? "; its bindings and VAs were set back" : "; setting it back failed too: ",
			 undone ? "" : why);
		return -EIO;
	}
	/* The multicast ticket's cached export goes before the object. */
	if (a->creator == self.id && a->has_token)
		cuip_xc_drop(a->serial);
	a->mc->detached = true;
	r = real.cuMemRelease(a->drv);
	if (r != CUDA_SUCCESS) {
		/* Kept: this process's REBUILD binds and maps it again. A team
		 * does not rebuild around it (its cached export is gone, and
		 * the importers, which released theirs, would add their
		 * devices to an object that has them): such a rollback fails
		 * and says the job must be restarted. */
		a->mc->kept = true;
		snprintf(err, errlen, "multicast object " ID_FMT ": releasing it failed: %s", ID(a), cuip_cuerr(r));
		return -EIO;
	}
	a->drv = 0;
	return 0;
}

static int mc_slice_prepare(char *err, size_t errlen)
{
	cuip_state_assert_held();
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		int ret;

		if (!rebuildable(a) || !a->drv || a->mc->detached)
			continue;
		ret = mc_detach(a, err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

/* ---- REBUILD stages MC_* (op thread, state lock held) -------------------- */

static int mc_create_again(struct cuip_alloc *a, char *err, size_t errlen)
{
	CUmulticastObjectProp p = {0};
	CUresult r;

	/* The requested size: the driver rounds it up to the same extent again. */
	p.numDevices = a->mc->num_devices;
	p.size = a->mc->requested;
	p.handleTypes = a->mc->handle_types;
	p.flags = a->mc->flags;
	r = real.cuMulticastCreate(&a->drv, &p);
	if (r != CUDA_SUCCESS) {
		a->drv = 0;
		snprintf(err, errlen, "multicast object " ID_FMT ": re-creating it (%u devices, %llu bytes) failed: %s",
			 ID(a), p.numDevices, (unsigned long long)p.size, cuip_cuerr(r));
		return -EIO;
	}
	if (a->has_token && (a->mc->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
	    cuip_xc_export(a->serial, a->drv, a->token, &r)) {
		snprintf(err, errlen, "multicast object " ID_FMT ": export failed: %s", ID(a), cuip_cuerr(r));
		return -EIO;
	}
	return 0;
}

static int mc_import_again(const Cuip__Rebuild *rb, struct cuip_alloc *a, char *err, size_t errlen)
{
	const char *sock = cuip_creator_socket(rb, a);
	char why[384] = "";
	CUresult r;
	int fd;

	if (!sock) {
		snprintf(err, errlen, "multicast object " ID_FMT ": no socket for its creator (pid %d)", ID(a),
			 a->creator_pid);
		return -ESRCH;
	}
	fd = cuip_fetch(sock, a->creator, a->serial, a->token, sizeof(a->token), why, sizeof(why));
	if (fd < 0) {
		snprintf(err, errlen, "multicast object " ID_FMT " from pid %d: %s", ID(a), a->creator_pid, why);
		return fd;
	}
	r = real.cuMemImportFromShareableHandle(&a->drv, (void *)(uintptr_t)fd,
						CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(fd);
	if (r != CUDA_SUCCESS) {
		a->drv = 0;
		snprintf(err, errlen, "multicast object " ID_FMT ": import failed: %s", ID(a), cuip_cuerr(r));
		return -EIO;
	}
	return 0;
}

/* Devices by UUID (a restore may remap GPUs); bindings follow their device. */
static int mc_add_devices(struct cuip_alloc *a, char *err, size_t errlen)
{
	struct cuip_mc *m = a->mc;

	for (size_t i = 0; i < m->nbinds; i++) {
		for (size_t k = 0; k < m->ndevs; k++) {
			int now = m->devs[k].has_uuid ? cuip_dev_by_uuid(m->devs[k].uuid) : -1;
			if (m->binds[i].dev == m->devs[k].ordinal && now >= 0) {
				m->binds[i].dev = now;
				break;
			}
		}
	}
	for (size_t k = 0; k < m->ndevs; k++) {
		int now = m->devs[k].has_uuid ? cuip_dev_by_uuid(m->devs[k].uuid) : -1;
		CUresult r;

		if (now >= 0)
			m->devs[k].ordinal = now;
		r = real.cuMulticastAddDevice(a->drv, m->devs[k].ordinal);
		if (r != CUDA_SUCCESS) {
			snprintf(err, errlen, "multicast object " ID_FMT ": adding device %d failed: %s", ID(a),
				 m->devs[k].ordinal, cuip_cuerr(r));
			return -EIO;
		}
	}
	return 0;
}

static bool same_object(const struct cuip_alloc *a, const void *arg)
{
	return a == arg;
}

/* Bindings [0, n) of a bound again (of a kept handle: those a PREPARE
 * unbound), then its VAs mapped at their original addresses with their
 * access: 0 or a negative errno with err filled. */
static int mc_bind_again(struct cuip_alloc *a, size_t n, char *err, size_t errlen)
{
	struct cuip_mc *m = a->mc;

	for (size_t i = 0; i < n; i++) {
		struct cuip_mc_bind *b = &m->binds[i];
		struct bind_req q = {.abi = b->abi,
				     .by_addr = b->by_addr,
				     .dev = b->dev,
				     .mc_offset = b->mc_offset,
				     .mem_offset = b->member_offset,
				     .size = b->size,
				     .memptr = b->member_va,
				     .flags = b->flags};
		CUresult r;

		if (m->kept && !b->unbound)
			continue;
		if (!b->member->drv) {
			snprintf(err, errlen, "multicast object " ID_FMT ": member " ID_FMT " is still detached", ID(a),
				 ID(b->member));
			return -ENODATA;
		}
		r = bind_real(&q, a->drv, b->member->drv);
		if (r != CUDA_SUCCESS) {
			snprintf(err, errlen,
				 "multicast object " ID_FMT ": binding member " ID_FMT
				 " at %#llx (device %d) failed: %s",
				 ID(a), ID(b->member), (unsigned long long)b->mc_offset, b->dev, cuip_cuerr(r));
			return -EIO;
		}
		b->unbound = false;
	}
	return cuip_maps_attach(same_object, a, "multicast object", err, errlen);
}

static int mc_slice_rebuild(const Cuip__Rebuild *rb, char *err, size_t errlen)
{
	size_t n = 0;
	int ret = 0;

	cuip_state_assert_held();
	for (struct cuip_alloc *a = vmm.head; a && !ret; a = a->next) {
		if (!rebuildable(a) || !a->mc->detached)
			continue;
		switch (rb->stage) {
		case CUIP__STAGE__STAGE_MC_CREATORS:
			if (a->origin == CUIP__ORIGIN__ORIGIN_MC_CREATE && !a->drv)
				ret = mc_create_again(a, err, errlen);
			break;
		case CUIP__STAGE__STAGE_MC_IMPORTERS:
			if (a->origin == CUIP__ORIGIN__ORIGIN_MC_IMPORT && !a->drv)
				ret = mc_import_again(rb, a, err, errlen);
			break;
		case CUIP__STAGE__STAGE_MC_DEVICES:
			ret = !a->drv ? -ENODATA : a->mc->kept ? 0 : mc_add_devices(a, err, errlen);
			break;
		case CUIP__STAGE__STAGE_MC_BINDINGS:
			ret = a->drv ? mc_bind_again(a, a->mc->nbinds, err, errlen) : -ENODATA;
			if (!ret)
				a->mc->detached = a->mc->kept = false;
			break;
		default:
			snprintf(err, errlen, "unknown rebuild stage %d", (int)rb->stage);
			return -EINVAL;
		}
		if (ret == -ENODATA && !err[0])
			snprintf(err, errlen, "multicast object " ID_FMT " was not re-created or imported", ID(a));
		n++;
	}
	if (!ret && n)
		pr_info("multicast stage %d: %zu objects", (int)rb->stage, n);
	return ret;
}

/* ---- VERIFY -------------------------------------------------------------- */

static bool same_id(const Cuip__AllocId *id, const struct cuip_alloc *a)
{
	return id && id->creator == a->creator && id->serial == a->serial;
}

static int mc_slice_verify(const Cuip__ProcessState *exp, char *err, size_t errlen)
{
	size_t nd = 0, nb = 0, ed = 0, eb = 0;

	cuip_state_assert_held();
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		if (!a->mc)
			continue;
		if (a->mc->detached) {
			snprintf(err, errlen, "multicast object " ID_FMT " is still detached after the rebuild", ID(a));
			return -EIO;
		}
		nd += a->mc->ndevs;
		nb += a->mc->nbinds;
	}
	for (size_t i = 0; i < exp->n_mc_devices; i++)
		ed += exp->mc_devices[i]->participant == self.id;
	for (size_t i = 0; i < exp->n_mc_bindings; i++) {
		const Cuip__McBinding *e = exp->mc_bindings[i];
		bool found = false;

		if (e->participant != self.id)
			continue;
		eb++;
		for (struct cuip_alloc *a = vmm.head; a && !found; a = a->next) {
			if (!a->mc || !same_id(e->mc, a))
				continue;
			for (size_t k = 0; k < a->mc->nbinds && !found; k++) {
				const struct cuip_mc_bind *b = &a->mc->binds[k];
				found = b->mc_offset == e->mc_offset && b->size == e->size &&
					b->member_offset == e->member_offset && same_id(e->member, b->member);
			}
		}
		if (!found) {
			snprintf(err, errlen,
				 "binding at %#llx of multicast object %016llx:%llu is missing after the rebuild",
				 (unsigned long long)e->mc_offset, (unsigned long long)(e->mc ? e->mc->creator : 0),
				 (unsigned long long)(e->mc ? e->mc->serial : 0));
			return -EIO;
		}
	}
	if (nd != ed || nb != eb) {
		snprintf(err, errlen, "%zu multicast devices and %zu bindings, the checkpoint had %zu and %zu", nd, nb,
			 ed, eb);
		return -EIO;
	}
	return 0;
}

static bool mc_runs_stage(Cuip__Stage stage)
{
	return stage == CUIP__STAGE__STAGE_MC_CREATORS || stage == CUIP__STAGE__STAGE_MC_IMPORTERS ||
	       stage == CUIP__STAGE__STAGE_MC_DEVICES || stage == CUIP__STAGE__STAGE_MC_BINDINGS;
}

CUIP_SLICE(multicast, .name = "multicast", .inspect = mc_slice_state,
	   .prepare_request = CUIP__REQUEST__BODY_PREPARE_MULTICAST, .prepare = mc_slice_prepare,
	   .detached = mc_slice_any_detached, .runs_stage = mc_runs_stage, .rebuild = mc_slice_rebuild,
	   .verify = mc_slice_verify);
