/*
 * preflight.c - checkpoint validation rules; see preflight.h. Stateless.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "criulog.h"
#include "preflight.h"

struct pf {
	const struct cuip_pf_proc *p;
	size_t n;
	cuip_pf_resolve_fn resolve;
	void *arg;
	char *err;
	size_t errlen;
	int ret;
};

static void refuse(struct pf *pf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void refuse(struct pf *pf, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pr_err("preflight: %s", msg);
	if (!pf->ret) {
		snprintf(pf->err, pf->errlen, "%s", msg);
		pf->ret = -EPERM;
	}
}

static int same_id(const Cuip__AllocId *a, const Cuip__AllocId *b)
{
	return a && b && a->creator == b->creator && a->serial == b->serial;
}

#define find_alloc cuip_find_alloc

static const struct cuip_pf_proc *find_proc(const struct pf *pf, uint64_t id)
{
	for (size_t i = 0; i < pf->n; i++)
		if (pf->p[i].st->self && pf->p[i].st->self->id == id)
			return &pf->p[i];
	return NULL;
}

#define AID(a) (unsigned long long)((a) ? (a)->creator : 0), (unsigned long long)((a) ? (a)->serial : 0)

static void check_process(struct pf *pf, const struct cuip_pf_proc *pp)
{
	const Cuip__ProcessState *st = pp->st;
	uint64_t self = st->self->id;

	if (st->phase != (pp->quiesced ? CUIP__PHASE__PHASE_QUIESCED : CUIP__PHASE__PHASE_ACTIVE))
		refuse(pf,
		       "pid %d is in interposer phase %s%s%s, not %s; wait for the previous operation to "
		       "finish (a FAILED process must be restarted)",
		       pp->pid, cuip_phase_name(st->phase), st->failure ? ": " : "", st->failure ? st->failure : "",
		       pp->quiesced ? "QUIESCED" : "ACTIVE");
	if (st->counters && st->counters->has_raw_imports && st->counters->raw_imports)
		refuse(pf,
		       "pid %d holds %u raw (non-ticket) imported allocation(s): memory imported from a raw "
		       "driver FD cannot be rebuilt after restore; import through interposer tickets or release "
		       "them, then checkpoint again",
		       pp->pid, st->counters->raw_imports);

	/* Stream-ordered pools shared by FD: the driver places their
	 * allocations itself, so they cannot be rebuilt at the same addresses,
	 * and native restore loses such a process (interposer/kinds/pool.c). */
	for (size_t i = 0; i < st->n_pools; i++) {
		const Cuip__Pool *p = st->pools[i];

		if (!p->exported && !p->imported)
			continue;
		refuse(pf,
		       "pid %d memory pool %llu (device %d) is %s%s, %u live pointer(s): a stream-ordered pool shared "
		       "by FD cannot be checkpointed (pool allocations are placed by the driver, so they cannot "
		       "be rebuilt at the same addresses, and native restore loses the process's CUDA state); "
		       "free its pointers and destroy the pool (cuMemPoolDestroy) in every process sharing it, "
		       "then checkpoint again",
		       pp->pid, (unsigned long long)p->serial, p->device,
		       p->imported ? "imported (cuMemPoolImportFromShareableHandle)"
				   : "exported (cuMemPoolExportToShareableHandle)",
		       p->destroyed ? " and destroyed" : "", p->live);
	}

	for (size_t i = 0; i < st->n_allocations; i++) {
		const Cuip__Allocation *a = st->allocations[i];
		const struct cuip_pf_proc *cp;
		const Cuip__Allocation *ca;

		if (!a->id) {
			refuse(pf, "pid %d reports an allocation without identity", pp->pid);
			continue;
		}
		if (a->owner == CUIP__OWNER__OWNER_UNSUPPORTED) {
			refuse(pf,
			       "pid %d allocation %llx:%llu cannot be checkpointed: %s; release it before "
			       "checkpointing",
			       pp->pid, AID(a->id), a->unsupported_reason ? a->unsupported_reason : "unsupported");
			continue;
		}
		if (a->owner != CUIP__OWNER__OWNER_SHARED)
			continue;
		if (a->kind == CUIP__ALLOC_KIND__KIND_UNICAST && !a->props)
			refuse(pf, "pid %d shared allocation %llx:%llu has no properties", pp->pid, AID(a->id));
		if (a->kind == CUIP__ALLOC_KIND__KIND_MULTICAST && !a->mc)
			refuse(pf, "pid %d multicast object %llx:%llu has no properties", pp->pid, AID(a->id));
		if (a->id->creator == self)
			continue;
		/* Imported: the creator must be checkpointed with us and still
		 * hold the allocation (its anchor), or the bytes are lost. */
		cp = find_proc(pf, a->id->creator);
		if (!cp) {
			pid_t outside = pf->resolve ? pf->resolve(a->id->creator, pf->arg) : 0;
			if (outside > 0)
				refuse(pf,
				       "pid %d imports allocation %llx:%llu from pid %d (identity %016llx), a sharing "
				       "peer outside the dumped tree; dump a tree that contains both processes",
				       pp->pid, AID(a->id), outside, (unsigned long long)a->id->creator);
			else
				refuse(pf,
				       "pid %d imports allocation %llx:%llu from process identity %016llx, which is "
				       "not in the dumped tree (a sharing peer outside it, or gone); dump a tree that "
				       "contains the creator",
				       pp->pid, AID(a->id), (unsigned long long)a->id->creator);
			continue;
		}
		ca = find_alloc(cp->st, a->id);
		if (!ca || ca->owner != CUIP__OWNER__OWNER_SHARED)
			refuse(pf,
			       "pid %d imports allocation %llx:%llu but its creator pid %d no longer tracks it as "
			       "shared (missing creator anchor); release the import or keep the allocation alive "
			       "in the creator",
			       pp->pid, AID(a->id), cp->pid);
		else if (ca->kind != a->kind)
			refuse(pf, "pid %d and its creator pid %d disagree about the kind of allocation %llx:%llu",
			       pp->pid, cp->pid, AID(a->id));
	}

	for (size_t i = 0; i < st->n_mappings; i++) {
		const Cuip__Mapping *m = st->mappings[i];
		const Cuip__Allocation *a = find_alloc(st, m->alloc);
		uint64_t size;

		if (!a) {
			refuse(pf, "pid %d maps %#llx+%#llx from allocation %llx:%llu it does not track", pp->pid,
			       (unsigned long long)m->va, (unsigned long long)m->size, AID(m->alloc));
			continue;
		}
		size = cuip_alloc_size(a);
		if (!m->size || m->va + m->size < m->va || m->offset > size || m->size > size - m->offset)
			refuse(pf,
			       "pid %d mapping %#llx+%#llx at offset %#llx is outside allocation %llx:%llu "
			       "(%#llx bytes)",
			       pp->pid, (unsigned long long)m->va, (unsigned long long)m->size,
			       (unsigned long long)m->offset, AID(m->alloc), (unsigned long long)size);
	}

	for (size_t i = 0; i < st->n_mc_bindings; i++) {
		const Cuip__McBinding *b = st->mc_bindings[i];
		const Cuip__Allocation *mc = find_alloc(st, b->mc), *mem = find_alloc(st, b->member);
		uint64_t mcs, ms;

		if (!mc || !mem) {
			refuse(pf, "pid %d binds %s into multicast object %llx:%llu that it does not track", pp->pid,
			       mem ? "memory" : "untracked memory", AID(b->mc));
			continue;
		}
		mcs = cuip_alloc_size(mc);
		ms = cuip_alloc_size(mem);
		if (!b->size || b->mc_offset > mcs || b->size > mcs - b->mc_offset || b->member_offset > ms ||
		    b->size > ms - b->member_offset)
			refuse(pf,
			       "pid %d multicast binding of %#llx bytes (mc offset %#llx, member offset %#llx) is "
			       "outside object %llx:%llu or member %llx:%llu",
			       pp->pid, (unsigned long long)b->size, (unsigned long long)b->mc_offset,
			       (unsigned long long)b->member_offset, AID(b->mc), AID(b->member));
	}
}

/* One object across the group: every device of the team added (once, by
 * UUID) and the importers' properties equal to the creator's. */
static void check_mc_team(struct pf *pf, const Cuip__Allocation *a)
{
	const Cuip__McDevice *seen[64];
	size_t ndev = 0;

	if (!a->mc)
		return;
	for (size_t j = 0; j < pf->n; j++) {
		const Cuip__ProcessState *st = pf->p[j].st;
		const Cuip__Allocation *o = find_alloc(st, a->id);

		if (o && o->mc &&
		    (o->mc->num_devices != a->mc->num_devices || o->mc->requested_size != a->mc->requested_size ||
		     o->mc->handle_types != a->mc->handle_types))
			refuse(pf,
			       "pid %d: multicast object %llx:%llu has properties (%u devices, %llu bytes) that "
			       "differ from its creator's (%u devices, %llu bytes)",
			       pf->p[j].pid, AID(a->id), o->mc->num_devices, (unsigned long long)o->mc->requested_size,
			       a->mc->num_devices, (unsigned long long)a->mc->requested_size);
		for (size_t k = 0; k < st->n_mc_devices; k++) {
			const Cuip__McDevice *d = st->mc_devices[k];

			if (!same_id(d->mc, a->id))
				continue;
			for (size_t i = 0; i < ndev; i++)
				if (d->has_device_uuid && seen[i]->has_device_uuid &&
				    d->device_uuid.len == seen[i]->device_uuid.len &&
				    !memcmp(d->device_uuid.data, seen[i]->device_uuid.data, d->device_uuid.len))
					refuse(pf, "pid %d: a GPU is added twice to multicast object %llx:%llu",
					       pf->p[j].pid, AID(a->id));
			if (ndev < sizeof(seen) / sizeof(seen[0]))
				seen[ndev] = d;
			ndev++;
		}
	}
	if (ndev != a->mc->num_devices)
		refuse(pf,
		       "multicast object %llx:%llu has %zu of its %u devices among the participants; a partial "
		       "multicast group cannot be rebuilt: dump a tree that contains every rank of the team",
		       AID(a->id), ndev, a->mc->num_devices);
}

/* Multicast groups: one creator, every device added once and bound. */
static void check_multicast(struct pf *pf)
{
	for (size_t i = 0; i < pf->n; i++) {
		const Cuip__ProcessState *st = pf->p[i].st;

		for (size_t k = 0; k < st->n_allocations; k++) {
			const Cuip__Allocation *a = st->allocations[k];
			unsigned creators = 0;

			if (a->kind != CUIP__ALLOC_KIND__KIND_MULTICAST || a->origin != CUIP__ORIGIN__ORIGIN_MC_CREATE)
				continue;
			for (size_t j = 0; j < pf->n; j++) {
				const Cuip__Allocation *o = find_alloc(pf->p[j].st, a->id);
				if (o && o->origin == CUIP__ORIGIN__ORIGIN_MC_CREATE)
					creators++;
			}
			if (creators != 1)
				refuse(pf, "multicast object %llx:%llu has %u creators among the participants",
				       AID(a->id), creators);
			check_mc_team(pf, a);
		}
		for (size_t k = 0; k < st->n_mc_devices; k++) {
			const Cuip__McDevice *d = st->mc_devices[k];
			int bound = 0;

			if (!find_proc(pf, d->participant))
				refuse(pf,
				       "pid %d: device %d of multicast object %llx:%llu was added by process identity "
				       "%016llx outside the dumped tree",
				       pf->p[i].pid, d->device, AID(d->mc), (unsigned long long)d->participant);
			for (size_t j = k + 1; j < st->n_mc_devices; j++) {
				const Cuip__McDevice *e = st->mc_devices[j];
				if (same_id(d->mc, e->mc) && d->participant == e->participant && d->device == e->device)
					refuse(pf, "pid %d: device %d is added twice to multicast object %llx:%llu",
					       pf->p[i].pid, d->device, AID(d->mc));
			}
			if (d->participant != st->self->id)
				continue;
			for (size_t j = 0; j < st->n_mc_bindings; j++) {
				const Cuip__McBinding *b = st->mc_bindings[j];
				if (same_id(b->mc, d->mc) && b->device == d->device)
					bound = 1;
			}
			if (!bound)
				refuse(pf,
				       "pid %d: device %d of multicast object %llx:%llu has no binding; bind memory "
				       "or remove the device before checkpointing",
				       pf->p[i].pid, d->device, AID(d->mc));
		}
	}
}

int cuip_preflight(const struct cuip_pf_proc *p, size_t n, cuip_pf_resolve_fn resolve, void *arg, char *err,
		   size_t errlen)
{
	struct pf pf = {.p = p, .n = n, .resolve = resolve, .arg = arg, .err = err, .errlen = errlen};

	for (size_t i = 0; i < n; i++)
		if (p[i].st)
			cuip_sort_allocs((Cuip__ProcessState *)p[i].st);
	for (size_t i = 0; i < n; i++) {
		if (!p[i].st || !p[i].st->self) {
			refuse(&pf, "pid %d did not report its identity", p[i].pid);
			return pf.ret;
		}
		for (size_t j = 0; j < i; j++)
			if (p[j].st->self->id == p[i].st->self->id)
				refuse(&pf, "pids %d and %d report the same interposer identity %016llx", p[j].pid,
				       p[i].pid, (unsigned long long)p[i].st->self->id);
	}
	for (size_t i = 0; i < n; i++)
		check_process(&pf, &p[i]);
	check_multicast(&pf);
	return pf.ret;
}

/* One allocation's recorded importers; see cuip_preflight_importers. */
static void check_importers(struct pf *pf, const struct cuip_pf_proc *cp, const Cuip__Allocation *a,
			    cuip_pf_importer_fn where, void *arg)
{
	const char *what = a->kind == CUIP__ALLOC_KIND__KIND_MULTICAST ? "multicast object" : "allocation";

	if (a->has_importers_dropped && a->importers_dropped)
		refuse(pf,
		       "pid %d %s %llx:%llu was imported by more processes than it records (%u not recorded): "
		       "whether they are all in the dumped tree cannot be told; release it in the surplus "
		       "importers or restart them, then checkpoint again",
		       cp->pid, what, AID(a->id), a->importers_dropped);
	for (size_t j = 0; j < a->n_importers; j++) {
		const Cuip__Importer *im = a->importers[j];
		pid_t here;
		size_t q;

		if (im->has_identity && im->identity && find_proc(pf, im->identity))
			continue;
		here = where ? where(cp, im, arg) : -1;
		if (here == 0)
			continue; /* gone since it fetched */
		for (q = 0; here > 0 && q < pf->n && pf->p[q].pid != here; q++)
			;
		if (here > 0 && q < pf->n)
			continue;
		if (here > 0)
			refuse(pf,
			       "pid %d %s %llx:%llu is imported by pid %d (identity %016llx), a live process "
			       "outside the dumped tree that would lose that memory; dump a tree that contains "
			       "both processes, or end pid %d first",
			       cp->pid, what, AID(a->id), here, (unsigned long long)im->identity, here);
		else
			refuse(pf,
			       "pid %d %s %llx:%llu is imported by a process outside the dumped tree that cannot "
			       "be found from here (pid %d in pid %d's pid namespace, 0: not visible there; "
			       "identity %016llx); dump a tree that contains it, or end it first",
			       cp->pid, what, AID(a->id), im->pid, cp->pid, (unsigned long long)im->identity);
	}
}

int cuip_preflight_importers(const struct cuip_pf_proc *p, size_t n, cuip_pf_importer_fn where, void *arg, char *err,
			     size_t errlen)
{
	struct pf pf = {.p = p, .n = n, .err = err, .errlen = errlen};

	for (size_t i = 0; i < n; i++) {
		const Cuip__ProcessState *st = p[i].st;

		for (size_t k = 0; st && st->self && k < st->n_allocations; k++)
			if (st->allocations[k]->id && st->allocations[k]->id->creator == st->self->id)
				check_importers(&pf, &p[i], st->allocations[k], where, arg);
	}
	return pf.ret;
}
