/*
 * fixtures.c - see fixtures.h.
 */
#include "config.h"

#include <string.h>

#include "fixtures.h"

void fx_init(struct fx_proc *p, uint64_t id, int pid)
{
	memset(p, 0, sizeof(*p));
	cuip__process_state__init(&p->st);
	cuip__process_id__init(&p->self);
	cuip__counters__init(&p->counters);
	p->self.id = id;
	p->self.pid = pid;
	p->st.self = &p->self;
	p->st.phase = CUIP__PHASE__PHASE_ACTIVE;
	p->st.counters = &p->counters;
	p->st.allocations = p->ap;
	p->st.mappings = p->mp;
}

static int add(struct fx_proc *p, uint64_t creator, uint64_t serial, uint64_t size, Cuip__Owner owner,
	       Cuip__Origin origin, uint64_t va)
{
	int i = (int)p->st.n_allocations++;

	cuip__allocation__init(&p->a[i]);
	cuip__alloc_id__init(&p->aid[i]);
	cuip__alloc_props__init(&p->props[i]);
	p->aid[i].creator = creator;
	p->aid[i].serial = serial;
	p->props[i].size = size;
	p->props[i].type = 1;
	p->props[i].handle_types = 1;
	p->props[i].location_type = 1;
	p->a[i].id = &p->aid[i];
	p->a[i].kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	p->a[i].owner = owner;
	p->a[i].origin = origin;
	p->a[i].props = &p->props[i];
	p->ap[i] = &p->a[i];
	if (va) {
		int m = (int)p->st.n_mappings++;
		cuip__mapping__init(&p->m[m]);
		p->m[m].va = va;
		p->m[m].size = size;
		p->m[m].offset = 0;
		p->m[m].alloc = &p->aid[i];
		p->mp[m] = &p->m[m];
	}
	return i;
}

int fx_create(struct fx_proc *p, uint64_t serial, uint64_t size, int shared, uint64_t va)
{
	return add(p, p->self.id, serial, size, shared ? CUIP__OWNER__OWNER_SHARED : CUIP__OWNER__OWNER_NATIVE,
		   CUIP__ORIGIN__ORIGIN_VMM_CREATE, va);
}

int fx_import(struct fx_proc *p, uint64_t creator, uint64_t serial, uint64_t size, uint64_t va)
{
	return add(p, creator, serial, size, CUIP__OWNER__OWNER_SHARED, CUIP__ORIGIN__ORIGIN_VMM_IMPORT, va);
}

void fx_importer(struct fx_proc *p, int i, uint64_t id, pid_t pid, uint64_t start)
{
	Cuip__Allocation *a = &p->a[i];
	Cuip__Importer *im = &p->imp[i][a->n_importers];

	cuip__importer__init(im);
	im->pid = pid;
	im->has_start_time = start != 0;
	im->start_time = start;
	im->has_identity = id != 0;
	im->identity = id;
	p->impp[i][a->n_importers++] = im;
	a->importers = p->impp[i];
}
