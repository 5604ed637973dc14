/*
 * ops.c - plugin operations, run one at a time by the "cuip-op" thread: the
 * phase machine. It checks each request against the phase and runs the
 * resources' checkpoint slices (slice.h: unicast in vmm.c and its carried
 * bytes in carry.c, multicast.c, pool.c, the contexts' stacks in ctx.c) for
 * INSPECT, QUIESCE's head start and refusals, PREPARE_*, SAVE, LOAD, REBUILD
 * stages, VERIFY and RESUME, naming no resource module for them, and
 * builds the replies; QUIESCE (release hooks, gate, drain) and RESUME are
 * its own. Called by control.c (the op thread).
 *
 * Lifecycle: ACTIVE -QUIESCE-> QUIESCED -PREPARE_UNICAST-> PREPARED
 * -LOAD/REBUILD-> RESTORING -RESUME-> ACTIVE. A failed step replies a
 * negative errno naming the allocation and leaves the gate closed, so the
 * plugin can roll back (LOAD + REBUILD + RESUME on the running job) or kill
 * a half-restored tree; RESUME refuses while shared memory is detached. A
 * topology that comes back different (VERIFY) makes the process FAILED.
 *
 * The op thread holds cuip_state_lock for each operation: application
 * threads cannot want it meanwhile (they wait at the closed gate), and the
 * control thread never takes it. QUIESCE drops it while the slices get
 * their head start (slice.h's before_gate: the job still runs and its calls
 * may want the lock) and while it closes the gate: a call in flight may
 * need it to leave (an import takes it after its FETCH), and waiting for
 * that call with the lock held would stall both until the timeout. Replies
 * come from the reply arena (reply.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "cuip.h"
#include "gate.h"
#include "drain.h"
#include "driver.h"
#include "inspect.h"
#include "ops.h"
#include "record.h"
#include "release.h"
#include "reply.h"
#include "runtime.h"
#include "slice.h"
#include "digest.h"

static Cuip__Response *reply(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static Cuip__Response *reply(int status, const char *fmt, ...)
{
	Cuip__Response *r = cuip_zalloc(sizeof(*r));
	char buf[512];
	va_list ap;

	if (!r)
		return NULL;
	cuip__response__init(r);
	r->status = status;
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		r->error = cuip_strdup(buf);
		if (status)
			pr_err("%s", buf);
	}
	return r;
}

/* ---- QUIESCE --------------------------------------------------------------- */

static uint64_t carried_bytes(void)
{
	uint64_t n = 0;

	for (const struct cuip_alloc *a = vmm.head; a; a = a->next)
		if (cuip_carried(a))
			n += a->size;
	return n;
}

/*
 * The job's release hooks (release.c) run before the gate closes, while the
 * job still runs: what they free is not carried. Without the state lock
 * (their frees take it), at most CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS and half
 * the QUIESCE timeout; a hook that fails or overruns costs only the bytes
 * it would have freed, so the checkpoint goes on.
 */
static void release_first(const struct timespec *t0, unsigned most_ms)
{
	unsigned ms = cuip_release_timeout_ms < most_ms ? cuip_release_timeout_ms : most_ms;
	uint64_t before = carried_bytes(), after;
	char msg[256];
	int ret;

	cuip_state_drop();
	ret = cuip_release_run(ms, msg, sizeof(msg));
	cuip_state_take();
	after = carried_bytes();
	if (ret)
		pr_err("pid %d: %s; the checkpoint carries what is allocated when the gate closes", self.pid, msg);
	pr_info("pid %d: release hooks: %llu of %llu carried bytes freed in %u ms", self.pid,
		(unsigned long long)(before > after ? before - after : 0), (unsigned long long)before,
		cuip_ms_since(t0));
}

static Cuip__Response *op_quiesce(const Cuip__Quiesce *q)
{
	Cuip__Phase ph = cuip_phase();
	unsigned elapsed, pre_gate_ms;
	struct timespec t0, tg;
	Cuip__Response *r;
	char msg[640];
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ph == CUIP__PHASE__PHASE_QUIESCED)
		return reply(0, NULL);
	if (ph != CUIP__PHASE__PHASE_ACTIVE)
		return reply(-EBUSY, "pid %d: QUIESCE in phase %s", self.pid, cuip_phase_name(ph));
	if (cuip_release_wanted())
		release_first(&t0, q->timeout_ms / 2);
	/* The slices' head start (the chunk scan's compile) while the job
	 * still runs, at most half of what is left of the timeout, then the
	 * gate with the rest; neither with the state lock (see the top of
	 * this file). What ran before the gate is not the job's pause. */
	cuip_state_drop();
	cuip_for_each_slice(s)
	{
		if (s->before_gate) {
			elapsed = cuip_ms_since(&t0);
			s->before_gate(q->timeout_ms > elapsed ? (q->timeout_ms - elapsed) / 2 : 0);
		}
	}
	pre_gate_ms = elapsed = cuip_ms_since(&t0);
	clock_gettime(CLOCK_MONOTONIC, &tg);
	ret = cuip_gate_close(q->timeout_ms > elapsed ? q->timeout_ms - elapsed : 1);
	cuip_state_take();
	if (ret == -ETIMEDOUT)
		return reply(ret, "pid %d: CUDA calls still in flight after %u ms; gate reopened", self.pid,
			     cuip_ms_since(&tg));
	if (ret)
		return reply(ret, "pid %d: cannot close the API gate: %s; gate reopened", self.pid, strerror(-ret));
	/* A resource the preflight's INSPECT found checkpointable and that
	 * changed since (a pool shared meanwhile): refused before anything changes. */
	cuip_for_each_slice(s)
	{
		if (s->refuse && s->refuse(msg, sizeof(msg))) {
			cuip_gate_open();
			return reply(-EPERM, "%s; gate reopened", msg);
		}
	}
	/* Everything queued on the devices completes before anything is torn
	 * down, within what is left of the timeout (drain.c): work that cannot
	 * drain (a kernel waiting for a gated peer) reopens the gate. */
	elapsed = cuip_ms_since(&t0);
	ret = cuip_drain(q->timeout_ms > elapsed ? q->timeout_ms - elapsed : 1, msg, sizeof(msg));
	if (ret) {
		cuip_gate_open();
		return reply(ret, "pid %d: %s; gate reopened", self.pid, msg);
	}
	cuip_set_phase(CUIP__PHASE__PHASE_QUIESCED);
	r = reply(0, NULL);
	if (r) {
		r->has_gate_after_ms = 1;
		r->gate_after_ms = pre_gate_ms;
	}
	return r;
}

/* ---- SAVE and LOAD: the carried bytes, by the slice that carries them ------- */

/* The slice with a save (or load) member: the one that moves bytes. */
static const struct cuip_slice *carrying_slice(bool load)
{
	cuip_for_each_slice(s)
	{
		if (load ? s->load != NULL : s->save != NULL)
			return s;
	}
	return NULL;
}

/* A slice's answer (slice.h): its error with this process's pid, or success. */
static Cuip__Response *slice_reply(int ret, const char *why)
{
	return ret ? reply(ret, "pid %d: %s", self.pid, why) : reply(0, NULL);
}

static Cuip__Response *not_implemented(const Cuip__Request *req)
{
	return reply(-ENOSYS, "request %d is not implemented by this interposer", (int)req->body_case);
}

/* SAVE or LOAD: the phase checks, then the slice that carries the bytes. */
static Cuip__Response *op_carry(const Cuip__Request *req, const int *fds, size_t nfds)
{
	bool load = req->body_case == CUIP__REQUEST__BODY_LOAD;
	const struct cuip_slice *c = carrying_slice(load);
	Cuip__Phase ph = cuip_phase();
	Cuip__SaveReply *sr = NULL;
	Cuip__LoadReply *lr = NULL;
	Cuip__Response *r;
	char why[512] = "";
	int ret;

	if (!c)
		return not_implemented(req);
	if (!load && req->save->live && ph != CUIP__PHASE__PHASE_ACTIVE)
		return reply(-EBUSY, "pid %d: pre-copy in phase %s (only a running job is pre-copied)", self.pid,
			     cuip_phase_name(ph));
	if (!load && !req->save->live && ph != CUIP__PHASE__PHASE_QUIESCED)
		return reply(-EBUSY, "pid %d: SAVE in phase %s (QUIESCE first)", self.pid, cuip_phase_name(ph));
	if (load && !nfds)
		return reply(-EBADF, "pid %d: LOAD came without a carrier file", self.pid);
	if (load && (ph == CUIP__PHASE__PHASE_ACTIVE || ph == CUIP__PHASE__PHASE_QUIESCED))
		return reply(-EBUSY, "pid %d: LOAD in phase %s (shared memory is attached)", self.pid,
			     cuip_phase_name(ph));
	ret = load ? c->load(req->load, fds, nfds, &lr, why, sizeof(why))
		   : c->save(req->save, fds, nfds, &sr, why, sizeof(why));
	r = slice_reply(ret, why);
	if (ret || !r)
		return r;
	if (load) {
		r->body_case = CUIP__RESPONSE__BODY_LOAD;
		r->load = lr;
	} else {
		r->body_case = CUIP__RESPONSE__BODY_SAVE;
		r->save = sr;
	}
	return r;
}

/* ---- PREPARE_* (one per slice) ----------------------------------------------- */

static Cuip__Response *op_prepare(const struct cuip_slice *s)
{
	Cuip__Phase ph = cuip_phase();
	char why[512] = "";
	int ret;

	if (s->prepared_phase && ph == s->prepared_phase)
		return reply(0, NULL);
	if (ph != CUIP__PHASE__PHASE_QUIESCED)
		return reply(-EBUSY, "pid %d: %s in phase %s", self.pid, cuip_request_name(s->prepare_request),
			     cuip_phase_name(ph));
	ret = s->prepare(why, sizeof(why));
	if (ret)
		return slice_reply(ret, why);
	if (s->prepared_phase)
		cuip_set_phase(s->prepared_phase);
	if (s->prepared_phase == CUIP__PHASE__PHASE_PREPARED)
		cuip_for_each_slice(b)
		{
			if (b->before_native)
				b->before_native();
		}
	return reply(0, NULL);
}

/* ---- carried unicast memory ------------------------------------------------- */

static bool is_shared(const struct cuip_alloc *a)
{
	return a->owner == CUIP__OWNER__OWNER_SHARED;
}

/* Detached by PREPARE_UNICAST, refilled by LOAD (carry.c) and REBUILD: the
 * unicast memory the carrier moves (shared, and private unless left to
 * native). */
static bool unicast_carried(const struct cuip_alloc *a)
{
	return cuip_carried(a);
}

/* ---- REBUILD --------------------------------------------------------------- */

/* A REBUILD or VERIFY that names another process (the coordinator talking
 * to the wrong socket) is refused before it touches anything. */
static bool not_us(const Cuip__ProcessId *id)
{
	return id && id->id != self.id;
}

static Cuip__Response *wrong_process(const char *op, const Cuip__ProcessId *id)
{
	return reply(-ESRCH, "pid %d: %s names process %016llx, this is %016llx", self.pid, op,
		     (unsigned long long)id->id, (unsigned long long)self.id);
}

/* Detached by a PREPARE while still QUIESCED: a REBUILD is a rollback. */
static bool any_detached(void)
{
	cuip_for_each_slice(s)
	{
		if (s->detached && s->detached())
			return true;
	}
	return false;
}

static Cuip__Response *op_rebuild(const Cuip__Rebuild *rb)
{
	Cuip__Phase ph = cuip_phase();
	char why[512] = "";
	int ret;

	if (not_us(rb->self))
		return wrong_process("REBUILD", rb->self);
	/* QUIESCED with multicast detached: a rollback after PREPARE_MULTICAST. */
	if (ph == CUIP__PHASE__PHASE_ACTIVE || (ph == CUIP__PHASE__PHASE_QUIESCED && !any_detached()))
		return reply(-EBUSY, "pid %d: REBUILD in phase %s (shared memory is attached)", self.pid,
			     cuip_phase_name(ph));
	cuip_set_phase(CUIP__PHASE__PHASE_RESTORING);
	cuip_for_each_slice(s)
	{
		if (!s->runs_stage || !s->runs_stage(rb->stage))
			continue;
		ret = s->rebuild(rb, why, sizeof(why));
		return slice_reply(ret, why);
	}
	return reply(-EINVAL, "pid %d: unknown rebuild stage %d", self.pid, (int)rb->stage);
}

/* ---- VERIFY ---------------------------------------------------------------- */

static bool same_access(Cuip__Access **x, size_t nx, Cuip__Access **y, size_t ny)
{
	if (nx != ny)
		return false;
	qsort(x, nx, sizeof(*x), cuip_cmp_access_by_location);
	qsort(y, ny, sizeof(*y), cuip_cmp_access_by_location);
	for (size_t i = 0; i < nx; i++)
		if (x[i]->va != y[i]->va || x[i]->size != y[i]->size || x[i]->location_type != y[i]->location_type ||
		    x[i]->location_id != y[i]->location_id || x[i]->flags != y[i]->flags)
			return false;
	return true;
}

static bool same_pieces(const Cuip__Allocation *x, const Cuip__Allocation *y)
{
	if (x->slab != y->slab || x->n_pieces != y->n_pieces)
		return false;
	for (size_t i = 0; i < x->n_pieces; i++) /* both in offset order (inspect.c) */
		if (x->pieces[i]->offset != y->pieces[i]->offset || x->pieces[i]->size != y->pieces[i]->size ||
		    x->pieces[i]->opens != y->pieces[i]->opens)
			return false;
	return true;
}

/* What VERIFY checks before comparing records: nothing may still be
 * detached, and the counts must match. NULL or the failure reply. */
static Cuip__Response *verify_attached(const Cuip__ProcessState *now, size_t nalloc, size_t nmap)
{
	for (struct cuip_alloc *a = vmm.head; a; a = a->next) {
		if ((is_shared(a) || unicast_carried(a)) && !a->drv) {
			cuip_fail("allocation " ID_FMT " is still detached after the rebuild", ID(a));
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	for (size_t i = 0; i < vmm.nmaps; i++) {
		if (vmm.maps[i]->detached) {
			cuip_fail("allocation " ID_FMT " is still detached after the rebuild", ID(vmm.maps[i]->a));
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	if (now->n_allocations != nalloc || now->n_mappings != nmap) {
		cuip_fail("%zu allocations and %zu mappings, the checkpoint had %zu and %zu", now->n_allocations,
			  now->n_mappings, nalloc, nmap);
		return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
	}
	return NULL;
}

/* VERIFY by digest (digest.h): the same checks as the record-by-record
 * comparison, 8 bytes on the wire instead of the whole state. A differing
 * digest does not fail the process: the coordinator follows up with the
 * whole state, whose comparison says what differs (and fails it). */
static Cuip__Response *verify_digest(const Cuip__Verify *v)
{
	Cuip__ProcessState *now;
	Cuip__Response *err;
	uint64_t d;

	if (!v->has_digest || !v->has_allocations || !v->has_mappings)
		return reply(-EINVAL, "pid %d: VERIFY without an expected state or a digest with its counts", self.pid);
	if (not_us(v->self))
		return wrong_process("VERIFY", v->self);
	now = cuip_state_build();
	if (!now)
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	err = verify_attached(now, v->allocations, v->mappings);
	if (err)
		return err;
	if (!cuip_state_digest(now, &d))
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	if (d != v->digest)
		return reply(-EBADE, "pid %d: the restored records' digest %016llx is not the checkpoint's %016llx",
			     self.pid, (unsigned long long)d, (unsigned long long)v->digest);
	pr_info("verified %zu allocations and %zu mappings (digest %016llx)", now->n_allocations, now->n_mappings,
		(unsigned long long)d);
	return reply(0, NULL);
}

static Cuip__Response *op_verify(Cuip__Verify *v)
{
	Cuip__ProcessState *exp = v->expected, *now;
	Cuip__Response *err;
	size_t shared = 0;

	if (!exp)
		return verify_digest(v);
	if (not_us(exp->self))
		return wrong_process("VERIFY", exp->self);
	now = cuip_state_build();
	if (!now)
		return reply(-ENOMEM, "pid %d: out of memory", self.pid);
	err = verify_attached(now, exp->n_allocations, exp->n_mappings);
	if (err)
		return err;
	/* Matched by sorting both sides (identity, address): linear after the
	 * sort, where a search per record was quadratic in the record count. */
	qsort(now->allocations, now->n_allocations, sizeof(*now->allocations), cuip_cmp_alloc_by_id);
	qsort(exp->allocations, exp->n_allocations, sizeof(*exp->allocations), cuip_cmp_alloc_by_id);
	qsort(now->mappings, now->n_mappings, sizeof(*now->mappings), cuip_cmp_mapping_by_va);
	qsort(exp->mappings, exp->n_mappings, sizeof(*exp->mappings), cuip_cmp_mapping_by_va);
	for (size_t i = 0; i < exp->n_allocations; i++) {
		const Cuip__Allocation *e = exp->allocations[i];
		const Cuip__Allocation *f = now->allocations[i];

		if (!e->id || !f->id || f->id->creator != e->id->creator || f->id->serial != e->id->serial)
			f = NULL;
		if (!f || f->owner != e->owner || f->origin != e->origin || !f->props != !e->props ||
		    (f->props && f->props->size != e->props->size) || !same_pieces(f, e)) {
			cuip_fail("allocation " ID_FMT " %s after the rebuild", ID(e->id),
				  f ? "differs from the checkpoint" : "is missing");
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
		shared += e->owner == CUIP__OWNER__OWNER_SHARED;
	}
	for (size_t i = 0; i < exp->n_mappings; i++) {
		Cuip__Mapping *e = exp->mappings[i], *f = now->mappings[i];

		if (f->va != e->va)
			f = NULL;
		if (!f || f->size != e->size || f->offset != e->offset || f->alloc->creator != e->alloc->creator ||
		    f->alloc->serial != e->alloc->serial ||
		    !same_access(f->access, f->n_access, e->access, e->n_access)) {
			cuip_fail("mapping at %#llx of allocation " ID_FMT " %s after the rebuild",
				  (unsigned long long)e->va, ID(e->alloc),
				  f ? "differs from the checkpoint" : "is missing");
			return reply(-EIO, "pid %d: %s", self.pid, cuip_failure());
		}
	}
	cuip_for_each_slice(s)
	{
		char why[512] = "";
		if (s->verify && s->verify(exp, why, sizeof(why))) {
			cuip_fail("%s", why);
			return reply(-EIO, "pid %d: %s", self.pid, why);
		}
	}
	pr_info("verified %zu allocations (%zu shared) and %zu mappings", exp->n_allocations, shared, exp->n_mappings);
	return reply(0, NULL);
}

/* ---- RESUME ---------------------------------------------------------------- */

static Cuip__Response *op_resume(void)
{
	Cuip__Phase ph = cuip_phase();

	if (ph == CUIP__PHASE__PHASE_ACTIVE)
		return reply(0, NULL);
	if (ph == CUIP__PHASE__PHASE_FAILED)
		return reply(-EIO, "pid %d: FAILED (%s); the gate stays closed", self.pid, cuip_failure());
	for (struct cuip_alloc *a = vmm.head; a; a = a->next)
		if ((is_shared(a) || unicast_carried(a)) && !a->drv)
			return reply(-EBUSY, "pid %d: allocation " ID_FMT " is detached; LOAD and REBUILD first",
				     self.pid, ID(a));
	for (size_t i = 0; i < vmm.nmaps; i++)
		if (vmm.maps[i]->detached)
			return reply(-EBUSY, "pid %d: mapping %#llx is detached; REBUILD first", self.pid,
				     (unsigned long long)vmm.maps[i]->va);
	cuip_for_each_slice(s)
	{
		if (s->resume)
			s->resume();
	}
	cuip_set_phase(CUIP__PHASE__PHASE_ACTIVE);
	cuip_gate_open();
	return reply(0, NULL);
}

/* ---- INSPECT and dispatch ------------------------------------------------- */

static Cuip__Response *op_inspect(void)
{
	Cuip__Response *r = reply(0, NULL);

	if (!r)
		return NULL;
	r->state = cuip_state_build();
	if (!r->state)
		return reply(-ENOMEM, "out of memory building the state");
	r->body_case = CUIP__RESPONSE__BODY_STATE;
	return r;
}

Cuip__Response *cuip_op_run(const Cuip__Request *req, const int *fds, size_t nfds)
{
	Cuip__Response *r;

	if (cuip_driver_init())
		return reply(-ENOENT, "no CUDA driver");
	/* Restored from images: no log line reaches a file before RESUME, where
	 * the phase machine ends the hold (log.c). */
	if ((req->body_case == CUIP__REQUEST__BODY_LOAD && req->load->restored) ||
	    (req->body_case == CUIP__REQUEST__BODY_REBUILD && req->rebuild->restored))
		cuip_log_hold(true);
	cuip_state_take();
	switch (req->body_case) {
	case CUIP__REQUEST__BODY_INSPECT:
		r = op_inspect();
		break;
	case CUIP__REQUEST__BODY_QUIESCE:
		r = op_quiesce(req->quiesce);
		break;
	case CUIP__REQUEST__BODY_SAVE:
	case CUIP__REQUEST__BODY_LOAD:
		r = op_carry(req, fds, nfds);
		break;
	case CUIP__REQUEST__BODY_REBUILD:
		r = op_rebuild(req->rebuild);
		break;
	case CUIP__REQUEST__BODY_VERIFY:
		r = op_verify(req->verify);
		break;
	case CUIP__REQUEST__BODY_RESUME:
		r = op_resume();
		break;
	default: {
		const struct cuip_slice *prep = NULL;

		cuip_for_each_slice(s)
		{
			if (s->prepare && s->prepare_request == req->body_case)
				prep = s;
		}
		r = prep ? op_prepare(prep) : not_implemented(req);
		break;
	}
	}
	cuip_state_drop();
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	return r;
}

void cuip_response_free(Cuip__Response *r)
{
	(void)r;
	cuip_arena_release();
}
