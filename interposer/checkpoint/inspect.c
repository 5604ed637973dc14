/*
 * inspect.c - this process's tracked state as a cuip.ProcessState: what
 * INSPECT answers, what the plugin stores in the topology image and what
 * VERIFY compares after a rebuild. Records are named by identity, never by
 * driver handle or FD. Runs on the op thread under the state lock; memory
 * comes from the op thread's reply arena.
 */
#include <stdlib.h>
#include <string.h>

#include "cuip.h"
#include "gate.h"
#include "importers.h"
#include "inspect.h"
#include "record.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"
#include "xcache.h"

#define NEW(T, init)                            \
	({                                      \
		T *p_ = cuip_zalloc(sizeof(T)); \
		if (p_)                         \
			*p_ = (T)init;          \
		p_;                             \
	})

static Cuip__AllocId *alloc_id(uint64_t creator, uint64_t serial)
{
	Cuip__AllocId *id = NEW(Cuip__AllocId, CUIP__ALLOC_ID__INIT);

	if (id) {
		id->creator = creator;
		id->serial = serial;
	}
	return id;
}

/* The UUID bytes stay in the device table (it outlives every reply). */
static bool uuid_field(int ordinal, ProtobufCBinaryData *b, protobuf_c_boolean *has)
{
	const uint8_t *u = cuip_dev_uuid(ordinal);

	if (!u)
		return false;
	b->data = (uint8_t *)u;
	b->len = 16;
	*has = 1;
	return true;
}

static Cuip__AllocProps *props_of(const struct cuip_alloc *a)
{
	Cuip__AllocProps *p = NEW(Cuip__AllocProps, CUIP__ALLOC_PROPS__INIT);

	if (!p)
		return NULL;
	p->type = a->prop.type;
	p->handle_types = a->prop.requestedHandleTypes;
	p->location_type = a->prop.location.type;
	p->location_id = a->prop.location.id;
	if (a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
		uuid_field(a->prop.location.id, &p->device_uuid, &p->has_device_uuid);
	p->has_compression_type = 1;
	p->compression_type = a->prop.allocFlags.compressionType;
	p->has_gpu_direct_rdma_capable = 1;
	p->gpu_direct_rdma_capable = a->prop.allocFlags.gpuDirectRDMACapable;
	p->has_usage = 1;
	p->usage = a->prop.allocFlags.usage;
	p->size = a->size;
	return p;
}

/* The live processes that fetched our export (importers.h); the dead were
 * forgotten by cuip_xc_prune_importers at the start of this INSPECT. */
static bool importers_of(const struct cuip_alloc *a, Cuip__Allocation *m)
{
	struct cuip_importer im[CUIP_IMPORTERS_MAX];
	unsigned dropped, n = cuip_xc_importers(a->serial, im, CUIP_IMPORTERS_MAX, &dropped);

	if (dropped) {
		m->has_importers_dropped = 1;
		m->importers_dropped = dropped;
	}
	if (!n)
		return true;
	m->importers = cuip_zalloc(sizeof(*m->importers) * n);
	if (!m->importers)
		return false;
	for (unsigned i = 0; i < n; i++) {
		Cuip__Importer *p = NEW(Cuip__Importer, CUIP__IMPORTER__INIT);

		if (!p)
			return false;
		p->pid = im[i].pid;
		p->has_start_time = im[i].start != 0;
		p->start_time = im[i].start;
		p->has_identity = im[i].id != 0;
		p->identity = im[i].id;
		p->has_uid = 1;
		p->uid = im[i].uid;
		if (im[i].self_pid) {
			p->has_self_pid = p->has_pid_ns = p->has_self_start_time = 1;
			p->self_pid = im[i].self_pid;
			p->pid_ns = im[i].pid_ns;
			p->self_start_time = im[i].self_start;
		}
		m->importers[m->n_importers++] = p;
	}
	return true;
}

/* What a record's kind says of it: the kind and either the kind's own
 * properties (multicast) or the allocation properties; false: out of memory. */
static bool kind_props(const struct cuip_alloc *a, Cuip__AllocKind *kind, Cuip__McProps **mc, Cuip__AllocProps **props)
{
	Cuip__McProps own = CUIP__MC_PROPS__INIT;

	if (!cuip_alloc_props(a, kind, &own)) {
		*props = props_of(a);
		return *props != NULL;
	}
	*mc = NEW(Cuip__McProps, CUIP__MC_PROPS__INIT);
	if (*mc)
		**mc = own;
	return *mc != NULL;
}

static Cuip__Allocation *allocation_of(const struct cuip_alloc *a)
{
	Cuip__Allocation *m = NEW(Cuip__Allocation, CUIP__ALLOCATION__INIT);

	if (!m)
		return NULL;
	m->id = alloc_id(a->creator, a->serial);
	m->owner = a->owner;
	m->origin = a->origin;
	if (!kind_props(a, &m->kind, &m->mc, &m->props))
		return NULL;
	m->has_app_handles = 1;
	m->app_handles = a->app_handles;
	if (a->logical) {
		m->has_logical_handle = 1;
		m->logical_handle = a->logical;
	}
	if (a->unsupported)
		m->unsupported_reason = cuip_strdup(a->unsupported);
	m->has_creator_pid = 1;
	m->creator_pid = a->creator_pid;
	m->has_carried = 1;
	m->carried = cuip_carried(a);
	m->has_exported = 1;
	m->exported = a->creator == self.id && a->has_token && cuip_xc_has(a->serial);
	if (a->requested) {
		m->has_requested_size = 1;
		m->requested_size = a->requested;
	}
	if (m->exported && !importers_of(a, m))
		return NULL;
	if (cuip_alloc_inspect(a, m))
		return NULL;
	return m;
}

static Cuip__Mapping *mapping_of(const struct cuip_mapping *mp)
{
	Cuip__Mapping *m = NEW(Cuip__Mapping, CUIP__MAPPING__INIT);

	if (!m)
		return NULL;
	m->va = mp->va;
	m->size = mp->size;
	m->offset = mp->offset;
	m->alloc = alloc_id(mp->a->creator, mp->a->serial);
	m->access = cuip_zalloc(sizeof(*m->access) * (mp->nacc ? mp->nacc : 1));
	if (!m->access || !m->alloc)
		return NULL;
	for (size_t i = 0; i < mp->nacc; i++) {
		const struct cuip_access *e = &mp->acc[i];
		Cuip__Access *ac = NEW(Cuip__Access, CUIP__ACCESS__INIT);
		if (!ac)
			return NULL;
		ac->va = e->va;
		ac->size = e->size;
		ac->location_type = e->loc.type;
		ac->location_id = e->loc.id;
		ac->flags = e->flags;
		if (e->loc.type == CU_MEM_LOCATION_TYPE_DEVICE)
			uuid_field(e->loc.id, &ac->device_uuid, &ac->has_device_uuid);
		m->access[m->n_access++] = ac;
	}
	return m;
}

static Cuip__Ticket *ticket_of(const struct cuip_alloc *a)
{
	Cuip__Ticket *t = NEW(Cuip__Ticket, CUIP__TICKET__INIT);
	Cuip__ProcessId *c = NEW(Cuip__ProcessId, CUIP__PROCESS_ID__INIT);

	if (!t || !c)
		return NULL;
	t->alloc = alloc_id(a->creator, a->serial);
	t->kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	t->token.data = cuip_zalloc(16);
	if (!t->token.data || !t->alloc)
		return NULL;
	memcpy(t->token.data, a->token, 16);
	t->token.len = 16;
	c->id = a->creator;
	c->pid = a->creator_pid;
	t->creator = c;
	t->creator_socket = cuip_strdup(a->creator_sock);
	if (!kind_props(a, &t->kind, &t->mc, &t->props))
		return NULL;
	return t;
}

Cuip__ProcessState *cuip_state_build(void)
{
	Cuip__ProcessState *st = NEW(Cuip__ProcessState, CUIP__PROCESS_STATE__INIT);
	Cuip__Counters *cn = NEW(Cuip__Counters, CUIP__COUNTERS__INIT);
	size_t nt = 0;

	cuip_state_assert_held();
	if (!st || !cn)
		return NULL;
	st->self = NEW(Cuip__ProcessId, CUIP__PROCESS_ID__INIT);
	if (!st->self)
		return NULL;
	st->self->id = self.id;
	st->self->pid = self.pid;
	st->phase = cuip_phase();
	st->version = (char *)CUIP_VERSION;
	st->socket = self.sock;
	if (cuip_failure())
		st->failure = cuip_strdup(cuip_failure());

	st->devices = cuip_zalloc(sizeof(*st->devices) * (size_t)(self.ndev ? self.ndev : 1));
	for (int i = 0; st->devices && i < self.ndev; i++) {
		Cuip__Device *d = NEW(Cuip__Device, CUIP__DEVICE__INIT);
		if (!d)
			return NULL;
		d->ordinal = self.dev[i].ordinal;
		d->uuid.data = (uint8_t *)self.dev[i].uuid;
		d->uuid.len = 16;
		if (self.dev[i].name[0])
			d->name = self.dev[i].name;
		st->devices[st->n_devices++] = d;
	}

	cuip_xc_prune_importers();
	st->allocations = cuip_zalloc(sizeof(*st->allocations) * (vmm.nallocs ? vmm.nallocs : 1));
	st->tickets = cuip_zalloc(sizeof(*st->tickets) * (vmm.nallocs ? vmm.nallocs : 1));
	if (!st->allocations || !st->tickets)
		return NULL;
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		Cuip__Allocation *m = allocation_of(a);
		if (!m)
			return NULL;
		st->allocations[st->n_allocations++] = m;
		if (a->minted) {
			Cuip__Ticket *t = ticket_of(a);
			if (!t)
				return NULL;
			st->tickets[nt++] = t;
		}
	}
	st->n_tickets = nt;

	st->mappings = cuip_zalloc(sizeof(*st->mappings) * (vmm.nmaps ? vmm.nmaps : 1));
	if (!st->mappings)
		return NULL;
	for (size_t i = 0; i < vmm.nmaps; i++) {
		Cuip__Mapping *m = mapping_of(vmm.maps[i]);
		if (!m)
			return NULL;
		st->mappings[st->n_mappings++] = m;
	}

	cn->has_exports_served = 1;
	cn->exports_served = cuip_xc_served_count();
	cn->has_gate_waits = 1;
	cn->gate_waits = cuip_gate_waits();
	st->counters = cn;
	/* The kinds' own parts (peer access, multicast bindings, pools, the
	 * counters of what is not carried). */
	cuip_for_each_slice(s)
	{
		if (s->inspect && s->inspect(st))
			return NULL;
	}
	return st;
}
