/*
 * coord.c - phases, barriers, dump, rollback and rebuild; see coord.h.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client.h"
#include "deadline.h"
#include "coord.h"
#include "digest.h"
#include "errfmt.h"
#include "images.h"
#include "criulog.h"
#include "monitor.h"
#include "outside.h"
#include "preflight.h"
#include "proc.h"
#include "procstat.h"
#include "sockdiag.h"
#include "threads.h"

typedef int (*step_fn)(struct cuip_group *g, struct cuip_part *p, const void *arg);
typedef cuip_applies_fn applies_fn;

/* The participant's failure, in its own words (p->err). */
#define part_fail(p, ...) errfmt((p)->err, sizeof((p)->err), __VA_ARGS__)

/* An allocation of the coordinator's own failed: g->err says for what. */
static int out_of_memory(struct cuip_group *g, const char *what)
{
	errfmt(g->err, sizeof(g->err), "out of memory %s", what);
	return -ENOMEM;
}

/* One participant's step of a phase, on its own thread; a watched phase's
 * job tells the monitor when its step returned. */
struct job {
	struct cuip_group *g;
	struct cuip_part *p;
	step_fn fn;
	const void *arg;
	struct cuip_monitor *mon; /* NULL: the phase runs unwatched */
	pthread_t th;
	bool started;
};

/* Decimal units, as the rates (the SAVE summary): "112.6 GB". */
static void fmt_dec(uint64_t b, char *buf, size_t len)
{
	if (b >= 1000000000ull)
		snprintf(buf, len, "%.1f GB", b / 1e9);
	else if (b >= 1000000ull)
		snprintf(buf, len, "%.1f MB", b / 1e6);
	else if (b >= 1000ull)
		snprintf(buf, len, "%.1f kB", b / 1e3);
	else
		snprintf(buf, len, "%" PRIu64 " bytes", b);
}

/* ---- phases --------------------------------------------------------------- */

/* What a participant's flags may say after a phase's barrier: nothing is
 * detached unless QUIESCE was sent, and unicast down is a teardown. */
static void assert_flags(const struct cuip_part *p)
{
	assert(!p->torn_down || p->quiesced);
	assert(!p->unicast_down || p->torn_down);
	(void)p;
}

static void *job_main(void *a)
{
	struct job *j = a;

	j->p->status = j->fn(j->g, j->p, j->arg);
	if (j->mon)
		cuip_monitor_replied(j->mon, (size_t)(j->p - j->g->p));
	return NULL;
}

/* Run every job, one thread each (here when no thread can be had), and
 * wait for all of them: the barrier. */
static void run_jobs(struct cuip_group *g, struct job *jobs, struct cuip_monitor *mon)
{
	for (size_t i = 0; i < g->n; i++) {
		if (!jobs[i].fn)
			continue;
		jobs[i].mon = mon;
		if (cuip_thread_create(&jobs[i].th, NULL, job_main, &jobs[i]))
			job_main(&jobs[i]);
		else
			jobs[i].started = true;
	}
	for (size_t i = 0; i < g->n; i++)
		if (jobs[i].started)
			pthread_join(jobs[i].th, NULL);
}

/* Log each participant's result; the first failure in group order goes to
 * g->err and is returned. */
static int phase_results(struct cuip_group *g, const char *name, const struct job *jobs, size_t *records,
			 uint64_t *bytes)
{
	int ret = 0;

	for (size_t i = 0; i < g->n; i++) {
		struct cuip_part *p = &g->p[i];

		if (!jobs[i].fn)
			continue;
		*records += p->records;
		*bytes += p->bytes;
		if (!p->status) {
			pr_debug("%s: pid %d done (%zu records, %" PRIu64 " bytes)", name, p->pid, p->records,
				 p->bytes);
			continue;
		}
		pr_err("%s failed on pid %d: %s", name, p->pid, p->err[0] ? p->err : strerror(-p->status));
		if (!ret) {
			ret = p->status;
			snprintf(g->err, sizeof(g->err), "%s failed on pid %d: %s", name, p->pid,
				 p->err[0] ? p->err : strerror(-p->status));
		}
	}
	return ret;
}

/*
 * Run `fn` for every participant `applies` selects, one thread each, and
 * wait for all of them (the barrier). Logs one line for the phase. With a
 * meter (a phase that moves data) a monitor watches it: progress lines
 * every CUINTERPOSE_PROGRESS_MS, and a stall of CUINTERPOSE_STALL_TIMEOUT_MS
 * fails it. Returns the status of the first failing participant in group
 * order.
 */
static int run_phase_metered(struct cuip_group *g, enum cuip_gphase ph, step_fn fn, applies_fn applies, const void *arg,
			     const struct cuip_meter *m)
{
	const char *name = cuip_gphase_name(ph);
	struct job *jobs = calloc(g->n ? g->n : 1, sizeof(*jobs));
	struct cuip_monitor mn = {.g = g, .name = name, .applies = applies, .arg = arg, .m = m};
	size_t parts = 0, records = 0;
	uint64_t bytes = 0;
	char extra[256] = "";
	double t0 = cuip_now(), dt;
	bool watched;
	int ret = 0;

	if (!jobs) {
		errfmt(g->err, sizeof(g->err), "out of memory starting %s", name);
		return -ENOMEM;
	}
	if (g->on_phase && (ret = g->on_phase(g, ph, false, 0))) {
		free(jobs);
		return ret;
	}
	for (size_t i = 0; i < g->n; i++) {
		struct cuip_part *p = &g->p[i];

		p->status = 0;
		p->err[0] = 0;
		p->bytes = 0;
		p->records = 0;
		if (applies && !applies(g, p, arg))
			continue;
		jobs[i] = (struct job){.g = g, .p = p, .fn = fn, .arg = arg};
		parts++;
	}
	if ((ret = cuip_monitor_start(&mn)) < 0) {
		free(jobs);
		return ret;
	}
	watched = ret > 0;
	run_jobs(g, jobs, watched ? &mn : NULL);
	if (watched)
		cuip_monitor_stop(&mn);
	ret = phase_results(g, name, jobs, &records, &bytes);
	free(jobs);
	for (size_t i = 0; i < g->n; i++)
		assert_flags(&g->p[i]);
	dt = cuip_now() - t0;
	if (m && m->summary)
		m->summary(g, arg, extra, sizeof(extra));
	if (bytes)
		pr_info("%s: %zu participants, %zu records, %" PRIu64 " bytes, %.3f s, %.1f MB/s%s%s", name, parts,
			records, bytes, dt, dt > 0 ? (double)bytes / dt / 1e6 : 0.0, extra, ret ? " (FAILED)" : "");
	else
		pr_info("%s: %zu participants, %zu records, %.3f s%s%s", name, parts, records, dt, extra,
			ret ? " (FAILED)" : "");
	if (g->after_phase)
		g->after_phase(g, ph, ret);
	if (g->on_phase)
		g->on_phase(g, ph, true, ret);
	return ret;
}

static int run_phase(struct cuip_group *g, enum cuip_gphase ph, step_fn fn, applies_fn applies, const void *arg)
{
	return run_phase_metered(g, ph, fn, applies, arg, NULL);
}

static unsigned op_timeout(const struct cuip_group *g)
{
	return g->o->op_timeout_ms;
}

static int callv(struct cuip_group *g, struct cuip_part *p, Cuip__Request *req, const int *fds, size_t nfds,
		 unsigned timeout, Cuip__Response **resp)
{
	Cuip__Response *r = NULL;
	int ret;

	if (p->fd < 0) {
		part_fail(p, "not connected");
		return -ENOTCONN;
	}
	ret = cuip_client_requestv(p->fd, req, fds, nfds, timeout, resp ? resp : &r, p->err, sizeof(p->err));
	if (!resp)
		cuip_client_free(r);
	return ret;
}

static int call(struct cuip_group *g, struct cuip_part *p, Cuip__Request *req, int fd, unsigned timeout,
		Cuip__Response **resp)
{
	return callv(g, p, req, &fd, fd >= 0, timeout, resp);
}

/* ---- connect + handshake --------------------------------------------- */

static int step_connect(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	const uint64_t *expect_ids = arg;
	struct cuip_peer peer;
	int ret;

	if (p->fd >= 0 && !expect_ids)
		return 0; /* already connected and introduced */
	if (p->fd < 0) {
		ret = cuip_connect_control(p->pid, p->sock, p->pid, op_timeout(g), p->err, sizeof(p->err));
		if (ret < 0)
			return ret;
		p->fd = ret;
	}
	ret = cuip_client_handshake(p->fd, g->client ? g->client : "plugin", op_timeout(g), &peer, p->err,
				    sizeof(p->err));
	if (ret)
		return ret;
	if (peer.pid != p->vpid) {
		part_fail(p, "HANDSHAKE: the interposer says it is pid %d, expected %d", peer.pid, p->vpid);
		ret = -EPROTO;
	} else if (expect_ids && peer.id != expect_ids[p - g->p]) {
		part_fail(p, "HANDSHAKE: interposer identity %016llx, the checkpoint has %016llx for this pid",
			  (unsigned long long)peer.id, (unsigned long long)expect_ids[p - g->p]);
		ret = -ESRCH;
	}
	if (!ret)
		p->phase = peer.phase;
	p->records = 1;
	return ret;
}

static int connect_all(struct cuip_group *g, const uint64_t *expect_ids)
{
	return run_phase(g, CUIP_GPHASE_HANDSHAKE, step_connect, NULL, expect_ids);
}

void cuip_group_disconnect(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		if (g->p[i].fd < 0)
			continue;
		if (cuip_client_bye(g->p[i].fd, op_timeout(g)))
			pr_warn("pid %d did not close its control connection after BYE", g->p[i].pid);
		g->p[i].fd = -1;
	}
}

/* ---- dump steps -------------------------------------------------------- */

static int step_inspect(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp;
	int ret;

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ret = call(g, p, &req, -1, op_timeout(g), &resp);
	if (ret)
		return ret;
	if (resp->body_case != CUIP__RESPONSE__BODY_STATE || !resp->state->self) {
		cuip_client_free(resp);
		part_fail(p, "INSPECT reply carries no process state");
		return -EPROTO;
	}
	cuip_client_free(p->inspect);
	p->inspect = resp;
	p->st = resp->state;
	p->records = resp->state->n_allocations + resp->state->n_mappings;
	return 0;
}

static int step_quiesce(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Quiesce q = CUIP__QUIESCE__INIT;
	Cuip__Response *resp = NULL;
	int ret;

	q.timeout_ms = g->o->quiesce_timeout_ms;
	req.body_case = CUIP__REQUEST__BODY_QUIESCE;
	req.quiesce = &q;
	p->quiesced = true;
	p->has_gate_after = false;
	ret = call(g, p, &req, -1, g->o->quiesce_timeout_ms + op_timeout(g), &resp);
	if (!ret && resp && resp->has_gate_after_ms) {
		p->has_gate_after = true;
		p->gate_after_ms = resp->gate_after_ms;
		pr_info("pid %d closed its gate after %u ms of work with the job running", p->pid, p->gate_after_ms);
	}
	cuip_client_free(resp);
	/* Another checkpoint's gate: not ours to reopen. */
	if (ret == -EALREADY)
		p->quiesced = false;
	return ret;
}

static bool has_mc(const Cuip__ProcessState *st)
{
	if (!st)
		return true; /* unknown: rebuild, as before */
	if (st->n_mc_bindings)
		return true;
	for (size_t i = 0; i < st->n_allocations; i++)
		if (st->allocations[i]->kind == CUIP__ALLOC_KIND__KIND_MULTICAST)
			return true;
	return false;
}

/*
 * After a failed step: does p say QUIESCED (its unicast memory attached)?
 * *mc: it holds multicast state, which PREPARE_MULTICAST detached. Keeps
 * p->err.
 */
static bool still_quiesced(struct cuip_group *g, struct cuip_part *p, bool *mc)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = NULL;
	char err[sizeof(p->err)];
	bool yes;

	memcpy(err, p->err, sizeof(err));
	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	yes = !call(g, p, &req, -1, op_timeout(g), &resp) && resp->body_case == CUIP__RESPONSE__BODY_STATE &&
	      resp->state->phase == CUIP__PHASE__PHASE_QUIESCED;
	*mc = !yes || has_mc(resp->state);
	cuip_client_free(resp);
	memcpy(p->err, err, sizeof(err));
	return yes;
}

static int step_flag(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	Cuip__Request req = CUIP__REQUEST__INIT;

	req.body_case = (Cuip__Request__BodyCase)(intptr_t)arg;
	if (req.body_case == CUIP__REQUEST__BODY_PREPARE_UNICAST) {
		bool was = p->torn_down, was_unicast = p->unicast_down, mc;
		int ret;

		req.prepare_unicast = 1;
		p->torn_down = p->unicast_down = true;
		ret = call(g, p, &req, -1, op_timeout(g), NULL);
		/* A participant that undid its own partial teardown is still
		 * QUIESCED with its unicast memory attached: nothing to load
		 * there, and nothing at all to rebuild without multicast. */
		if (ret && still_quiesced(g, p, &mc)) {
			p->unicast_down = was_unicast;
			if (!mc)
				p->torn_down = was;
		}
		return ret;
	} else {
		req.prepare_multicast = 1;
		/* Multicast detached: a rollback must rebuild it. Not for a
		 * participant without multicast: it stays QUIESCED with
		 * everything attached, and REBUILD there is refused. */
		p->torn_down |= has_mc(p->st);
	}
	return call(g, p, &req, -1, op_timeout(g), NULL);
}

static bool has_carriers(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	for (size_t i = 0; i < p->st->n_allocations; i++)
		if (cuip_alloc_carried_by(p->st->allocations[i], p->st->self->id))
			return true;
	return false;
}

static bool is_quiesced(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	return p->quiesced;
}

/*
 * Carrier files for `bytes` carried by one process: CUINTERPOSE_TEST_CARRIER_FILES,
 * or one per CARRIER_FILE_BYTES up to min(16, online CPUs). Buffered writes
 * to one file serialize on its inode (one file ~3 GB/s, 16 files 32-35 GB/s
 * on the H200 host, docs/benchmarks.md); a small carrier stays one file.
 */
#define CARRIER_FILE_BYTES (256ull << 20)
#define CARRIER_FILES_AUTO 16

static unsigned carrier_files_for(const struct cuip_opts *o, uint64_t bytes)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t k = bytes / CARRIER_FILE_BYTES, cap = CARRIER_FILES_AUTO;

	if (o->carrier_files)
		return o->carrier_files;
	if (cpus > 0 && (uint64_t)cpus < cap)
		cap = (uint64_t)cpus;
	return k < 1 ? 1 : k > cap ? (unsigned)cap : (unsigned)k;
}

/* The SAVE reply's extents: in the files sent, adding up to each entry,
 * and within what each file holds. */
static int check_extents(struct cuip_part *p, const Cuip__SaveReply *sr, const int *fds, size_t nfds)
{
	uint64_t end[CUIP_CARRIER_FILES_MAX] = {0};

	for (size_t i = 0; i < sr->n_entries; i++) {
		const Cuip__CarrierEntry *e = sr->entries[i];
		uint64_t sum = 0;

		if (nfds > 1 && !e->n_extents && e->size) {
			part_fail(p, "SAVE returned carrier entry %zu without extents over %zu files", i, nfds);
			return -EPROTO;
		}
		if (!e->n_extents)
			end[0] = e->offset + e->size > end[0] ? e->offset + e->size : end[0];
		for (size_t k = 0; k < e->n_extents; k++) {
			const Cuip__CarrierExtent *x = e->extents[k];

			if (x->file >= nfds) {
				part_fail(p, "SAVE returned carrier entry %zu with an extent in file %u of %zu", i,
					  x->file, nfds);
				return -EPROTO;
			}
			sum += x->size;
			if (x->offset + x->size > end[x->file])
				end[x->file] = x->offset + x->size;
		}
		if (e->n_extents && sum != e->size) {
			part_fail(p,
				  "SAVE returned carrier entry %zu whose extents hold %" PRIu64 " of %" PRIu64 " bytes",
				  i, sum, e->size);
			return -EPROTO;
		}
	}
	for (size_t f = 0; f < nfds; f++) {
		struct stat sb;

		if (fstat(fds[f], &sb) || (uint64_t)sb.st_size < end[f]) {
			part_fail(p, "carrier image %s holds %lld bytes, expected %" PRIu64, p->carrier_names[f],
				  (long long)sb.st_size, end[f]);
			return -EIO;
		}
	}
	return 0;
}

/* Participant p's topology as saved, fields pointing into the group. */
static void saved_topology(const struct cuip_group *g, const struct cuip_part *p, Cuip__Topology *t)
{
	cuip__topology__init(t);
	t->checkpoint_id.data = (uint8_t *)g->ckpt_id;
	t->checkpoint_id.len = 16;
	t->state = (Cuip__ProcessState *)p->st;
	t->carriers = p->carriers;
	t->n_carriers = p->n_carriers;
	t->carrier_files = (char **)p->carrier_files;
	t->n_carrier_files = p->n_carrier_files;
}

/* The parent checkpoint's entries of the allocations in ids (hashed
 * ones, on the host or the device; shallow copies of the fields SAVE
 * compares, in *v, which the caller frees). Returns the count, or -ENOMEM. */
static long parent_entries(const struct cuip_group *g, Cuip__AllocId *const *ids, size_t n, Cuip__CarrierEntry **v)
{
	Cuip__CarrierEntry *out = NULL;
	size_t k = 0, cap = 0;

	*v = NULL;
	for (size_t t = 0; g->parent && t < g->parent->n; t++)
		for (size_t i = 0; i < g->parent->topo[t]->n_carriers; i++) {
			const Cuip__CarrierEntry *e = g->parent->topo[t]->carriers[i];
			bool want = false;

			for (size_t j = 0; j < n && !want && (e->has_sha256 || e->has_dhash); j++)
				want = ids[j]->creator == e->alloc->creator && ids[j]->serial == e->alloc->serial;
			if (!want)
				continue;
			if (k == cap) {
				Cuip__CarrierEntry *nv = realloc(out, (cap = cap ? 2 * cap : 16) * sizeof(*nv));
				if (!nv) {
					free(out);
					return -ENOMEM;
				}
				out = nv;
			}
			cuip__carrier_entry__init(&out[k]);
			out[k].alloc = e->alloc;
			out[k].file = e->file;
			out[k].size = e->size;
			out[k].chunk_size = e->chunk_size;
			out[k].has_alloc_offset = e->has_alloc_offset;
			out[k].alloc_offset = e->alloc_offset;
			out[k].has_sha256 = e->has_sha256;
			out[k].sha256 = e->sha256;
			/* The device's hashes, their keys and the CRCs an unchanged
			 * chunk takes over (carrier/devscan.h). */
			out[k].has_dhash = e->has_dhash;
			out[k].dhash = e->dhash;
			out[k].has_dhash_key = e->has_dhash_key;
			out[k].dhash_key = e->dhash_key;
			out[k].crc32c = e->crc32c;
			out[k].n_crc32c = e->n_crc32c;
			k++;
		}
	*v = out;
	return (long)k;
}

static int step_save(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Save save = CUIP__SAVE__INIT;
	const Cuip__ProcessState *st = p->st;
	Cuip__AllocId **ids;
	Cuip__Response *resp = NULL;
	Cuip__CarrierEntry *pents = NULL, **pptrs = NULL;
	char *file = p->carrier_names[0];
	int fds[CUIP_CARRIER_FILES_MAX + 1]; /* the carrier files, then the progress page */
	size_t n = 0, nent = 0, nfds = 0, k;
	int ret = 0;

	ids = calloc(st->n_allocations, sizeof(*ids));
	if (!ids) {
		part_fail(p, "out of memory listing the allocations to save");
		return -ENOMEM;
	}
	p->expected_bytes = 0;
	for (size_t i = 0; i < st->n_allocations; i++) {
		if (!cuip_alloc_carried_by(st->allocations[i], st->self->id))
			continue;
		ids[n++] = st->allocations[i]->id;
		nent += cuip_alloc_carrier_entries(st->allocations[i]);
		p->expected_bytes += cuip_alloc_carried_bytes(st->allocations[i]);
	}
	k = carrier_files_for(g->o, p->expected_bytes);
	p->n_carrier_files = 0;
	for (nfds = 0; nfds < k; nfds++) {
		cuip_carrier_stripe_name(p->vpid, (unsigned)nfds, p->carrier_names[nfds], sizeof(p->carrier_names[0]));
		p->carrier_files[nfds] = p->carrier_names[nfds];
		fds[nfds] = openat(g->imgdir, p->carrier_names[nfds], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fds[nfds] < 0) {
			ret = -errno;
			part_fail(p, "cannot create carrier image %s: %s", p->carrier_names[nfds], strerror(errno));
			free(ids);
			goto out;
		}
	}
	save.allocs = ids;
	save.n_allocs = n;
	save.offset = 0;
	save.file = file;
	save.chunk_size = g->o->chunk_size;
	if (nfds > 1) {
		save.files = p->carrier_files;
		save.n_files = nfds;
	}
	long np = parent_entries(g, ids, n, &pents);
	if (np < 0) {
		part_fail(p, "out of memory listing the parent checkpoint's entries");
		free(ids);
		ret = -ENOMEM;
		goto out;
	}
	pptrs = calloc(np ? (size_t)np : 1, sizeof(*pptrs));
	if (!pptrs) {
		part_fail(p, "out of memory listing the parent checkpoint's entries");
		free(ids);
		ret = -ENOMEM;
		goto out;
	}
	for (long i = 0; i < np; i++)
		pptrs[i] = &pents[i];
	save.parents = pptrs;
	save.n_parents = (size_t)np;
	req.body_case = CUIP__REQUEST__BODY_SAVE;
	req.save = &save;
	/* The progress page goes after the carrier files, within what the
	 * interposer takes with one request (CUIP_OP_MAX_FDS, the files' most). */
	p->progress_sent = p->progress && nfds < CUIP_CARRIER_FILES_MAX;
	if (p->progress_sent) {
		save.has_progress_page = save.progress_page = 1;
		fds[nfds] = p->progress_fd;
	}
	ret = callv(g, p, &req, fds, nfds + p->progress_sent, g->o->data_timeout_ms, &resp);
	if (ret == -EBADF && p->progress_sent) {
		/* An interposer older than the progress page (a job started
		 * before the upgrade) counts it as one more carrier file and
		 * refuses before anything is written: again without it; its
		 * progress is then the carrier files' blocks. */
		pr_debug("pid %d: SAVE refused with its progress page (%s); saving without it", p->pid, p->err);
		p->progress_sent = false;
		save.has_progress_page = save.progress_page = 0;
		p->err[0] = 0;
		ret = callv(g, p, &req, fds, nfds, g->o->data_timeout_ms, &resp);
	}
	free(ids);
	if (ret)
		goto out;
	if (resp->body_case != CUIP__RESPONSE__BODY_SAVE) {
		part_fail(p, "SAVE reply carries no carrier index");
		ret = -EPROTO;
		goto out;
	}
	/* Bytes moved must be exactly what the allocations hold. */
	uint64_t indexed = 0;
	for (size_t i = 0; i < resp->save->n_entries; i++) {
		const Cuip__CarrierEntry *e = resp->save->entries[i];
		const Cuip__Allocation *a = i < nent ? cuip_find_alloc(st, e->alloc) : NULL;
		int known = a && cuip_alloc_carried_by(a, st->self->id) && cuip_carrier_entry_fits(a, e);

		if (!known || !e->file || strcmp(e->file, file)) {
			part_fail(p, "SAVE returned carrier entry %zu that matches no saved allocation", i);
			ret = -EPROTO;
			goto out;
		}
		indexed += e->size;
	}
	if (resp->save->n_entries != nent || resp->save->bytes != p->expected_bytes || indexed != p->expected_bytes) {
		part_fail(p, "SAVE moved %" PRIu64 " bytes in %zu entries, expected %" PRIu64 " bytes in %zu",
			  resp->save->bytes, resp->save->n_entries, p->expected_bytes, nent);
		ret = -EIO;
		goto out;
	}
	ret = check_extents(p, resp->save, fds, nfds);
	if (ret)
		goto out;
	p->n_carrier_files = nfds > 1 ? nfds : 0;
	p->save = resp;
	p->carriers = resp->save->entries;
	p->n_carriers = resp->save->n_entries;
	p->bytes = resp->save->bytes;
	p->records = n;
	resp = NULL;
	if (g->parent) {
		Cuip__Topology t;
		char why[512];

		saved_topology(g, p, &t);
		ret = cuip_images_flatten(&t, g->parent_img->dir, g->parent, &p->flat, why, sizeof(why));
		if (ret) {
			part_fail(p, "following the parent checkpoint: %s", why);
			goto out;
		}
	}
out:
	free(pents);
	free(pptrs);
	cuip_client_free(resp);
	for (size_t f = 0; f < nfds; f++) {
		if (close(fds[f]) && !ret) {
			ret = -errno;
			part_fail(p, "closing carrier image %s: %s", p->carrier_names[f], strerror(errno));
		}
	}
	return ret;
}

/* SAVE's meter: the carried bytes of p, and the blocks its carrier image
 * holds so far (workers pwrite() slices out of order: the size runs ahead). */
static uint64_t save_total(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	uint64_t t = 0;

	for (size_t i = 0; i < p->st->n_allocations; i++)
		if (cuip_alloc_carried_by(p->st->allocations[i], p->st->self->id))
			t += cuip_alloc_carried_bytes(p->st->allocations[i]);
	return t;
}

/* p's progress page once p writes it (its magic set), else NULL. */
static const struct cuip_save_progress *save_page(const struct cuip_part *p)
{
	return p->progress && cuip_progress_load(&p->progress->magic) == CUIP_PROGRESS_MAGIC ? p->progress : NULL;
}

/*
 * The bytes of p decided so far: from its progress page when it writes one
 * (chunks the device scan found zero or unchanged, plus bytes copied:
 * a scan that writes nothing still moves), else the blocks its carrier
 * files hold. moved_by() keeps either within p's total.
 */
static int64_t save_done(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	const struct cuip_save_progress *pg = save_page(p);
	unsigned k = carrier_files_for(g->o, save_total(g, p, arg));
	int64_t done = 0;

	if (pg) {
		uint64_t d = cuip_progress_load(&pg->done);

		return d > INT64_MAX ? INT64_MAX : (int64_t)d;
	}
	for (unsigned f = 0; f < k; f++) {
		char file[64];
		struct stat sb;

		cuip_carrier_stripe_name(p->vpid, f, file, sizeof(file));
		if (!fstatat(g->imgdir, file, &sb, 0)) /* else not created yet */
			done += (int64_t)sb.st_blocks * 512;
	}
	return done;
}

static bool save_detail(const struct cuip_group *g, const struct cuip_part *p, const void *arg, uint64_t *scanned,
			uint64_t *copied)
{
	const struct cuip_save_progress *pg = save_page(p);
	uint64_t t = save_total(g, p, arg);

	if (!pg)
		return false;
	*scanned = cuip_progress_load(&pg->scanned);
	*copied = cuip_progress_load(&pg->copied);
	*scanned = *scanned > t ? t : *scanned;
	*copied = *copied > t ? t : *copied;
	return true;
}

/* SAVE's summary: what the replies say was scanned on the device, copied
 * to the host and found all zero, summed over the participants that say. */
static void save_summary(const struct cuip_group *g, const void *arg, char *buf, size_t len)
{
	uint64_t sum[3] = {0};
	bool has[3] = {false};
	static const char *const what[3] = {"scanned on the device", "copied to the host", "all zero"};
	size_t l = 0;

	buf[0] = 0;
	for (size_t i = 0; i < g->n; i++) {
		const Cuip__SaveReply *sr = g->p[i].save ? g->p[i].save->save : NULL;

		if (!sr || g->p[i].status || !has_carriers(g, &g->p[i], arg))
			continue;
		if (sr->has_scanned_bytes)
			has[0] = true, sum[0] += sr->scanned_bytes;
		if (sr->has_copied_bytes)
			has[1] = true, sum[1] += sr->copied_bytes;
		if (sr->has_zero_bytes)
			has[2] = true, sum[2] += sr->zero_bytes;
	}
	for (int k = 0; k < 3 && l < len; k++) {
		char b[32];

		if (!has[k])
			continue;
		fmt_dec(sum[k], b, sizeof(b));
		l += (size_t)snprintf(buf + l, len - l, ", %s %s", b, what[k]);
	}
}

static const struct cuip_meter save_meter = {
	.total = save_total, .done = save_done, .detail = save_detail, .summary = save_summary};

/*
 * SAVE's progress pages (protocol/progress.h): one memfd for each
 * participant that saves, mapped read-only here, passed with its SAVE; set
 * before the phase's monitor starts and released after it stopped. One
 * that cannot be made is only a coarser meter.
 */
static void progress_open(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		struct cuip_part *p = &g->p[i];
		void *m = MAP_FAILED;
		int fd, err;

		p->progress = NULL;
		p->progress_sent = false;
		if (!has_carriers(g, p, NULL))
			continue;
		fd = memfd_create("cuinterpose-progress", MFD_CLOEXEC);
		if (fd >= 0 && !ftruncate(fd, CUIP_PROGRESS_PAGE))
			m = mmap(NULL, CUIP_PROGRESS_PAGE, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			err = errno;
			if (fd >= 0)
				close(fd);
			pr_warn("pid %d: no SAVE progress page (%s): its progress counts the carrier files' blocks",
				p->pid, strerror(err));
			continue;
		}
		p->progress = m;
		p->progress_fd = fd;
	}
}

static void progress_close(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		struct cuip_part *p = &g->p[i];

		if (!p->progress)
			continue;
		munmap((void *)p->progress, CUIP_PROGRESS_PAGE);
		close(p->progress_fd);
		p->progress = NULL;
	}
}

static int save_phase(struct cuip_group *g)
{
	int ret;

	progress_open(g);
	ret = run_phase_metered(g, CUIP_GPHASE_SAVE, step_save, has_carriers, NULL, &save_meter);
	progress_close(g);
	return ret;
}

/* Name a process identity outside the group: an importer's allocation
 * records its creator's pid (as the creator sees itself), placed in our pid
 * namespace from the importer's; 0 when it is gone or cannot be told. */
static pid_t resolve_outside(uint64_t id, void *arg)
{
	struct cuip_group *g = arg;

	for (size_t i = 0; i < g->n; i++) {
		const Cuip__ProcessState *st = g->p[i].st;

		for (size_t k = 0; st && k < st->n_allocations; k++) {
			const Cuip__Allocation *a = st->allocations[k];
			pid_t here;

			if (!a->id || a->id->creator != id || !a->has_creator_pid || a->creator_pid <= 0)
				continue;
			here = cuip_importer_here(g->p[i].pid, a->creator_pid, 0);
			return here > 0 ? here : 0;
		}
	}
	return 0;
}

/*
 * Importers recorded by the creators, placed in our pid namespace (outside.h);
 * thousands of allocations share a few importers, so each (creator, pid,
 * start time) is looked up once per preflight.
 */
struct where_memo {
	size_t n;
	struct {
		pid_t creator, pid, self_pid;
		uint64_t start, ns;
		pid_t here;
	} e[256];
};

static pid_t importer_where(const struct cuip_pf_proc *creator, const Cuip__Importer *im, void *arg)
{
	struct where_memo *m = arg;
	uint64_t start = im->pid > 0 ? (im->has_start_time ? im->start_time : 0)
				     : (im->has_self_start_time ? im->self_start_time : 0);
	uint64_t ns = im->pid > 0 ? 0 : im->has_pid_ns ? im->pid_ns : 0;
	pid_t self_pid = im->pid > 0 ? 0 : im->has_self_pid ? im->self_pid : 0;
	pid_t here;

	for (size_t i = 0; i < m->n; i++)
		if (m->e[i].creator == creator->pid && m->e[i].pid == im->pid && m->e[i].start == start &&
		    m->e[i].ns == ns && m->e[i].self_pid == self_pid)
			return m->e[i].here;
	if (im->pid > 0)
		here = cuip_importer_here(creator->pid, im->pid, start);
	else /* not visible from the creator: by what it told of itself */
		here = cuip_importer_by_ns(ns, self_pid, start);
	if (m->n < sizeof(m->e) / sizeof(m->e[0])) {
		m->e[m->n].creator = creator->pid;
		m->e[m->n].pid = im->pid;
		m->e[m->n].start = start;
		m->e[m->n].ns = ns;
		m->e[m->n].self_pid = self_pid;
		m->e[m->n++].here = here;
	}
	return here;
}

static int preflight(struct cuip_group *g)
{
	struct cuip_pf_proc *pp = calloc(g->n ? g->n : 1, sizeof(*pp));
	double t0 = cuip_now();
	size_t records = 0;
	int ret;

	if (!pp)
		return out_of_memory(g, "starting PREFLIGHT");
	for (size_t i = 0; i < g->n; i++) {
		pp[i].pid = g->p[i].pid;
		pp[i].st = g->p[i].st;
		pp[i].quiesced = g->p[i].quiesced;
		records += g->p[i].st->n_allocations + g->p[i].st->n_mappings + g->p[i].st->n_mc_bindings;
	}
	ret = cuip_preflight(pp, g->n, resolve_outside, g, g->err, sizeof(g->err));
	if (!ret) {
		struct where_memo *memo = calloc(1, sizeof(*memo));

		ret = memo ? cuip_preflight_importers(pp, g->n, importer_where, memo, g->err, sizeof(g->err))
			   : out_of_memory(g, "checking the importers");
		free(memo);
	}
	free(pp);
	pr_info("%s: %zu participants, %zu records, %.3f s%s", cuip_gphase_name(CUIP_GPHASE_PREFLIGHT), g->n, records,
		cuip_now() - t0, ret ? " (REFUSED)" : "");
	if (g->after_phase)
		g->after_phase(g, CUIP_GPHASE_PREFLIGHT, ret);
	return ret;
}

void cuip_group_topology(const struct cuip_group *g, size_t i, Cuip__Topology *t)
{
	if (g->p[i].flat)
		*t = *g->p[i].flat;
	else
		saved_topology(g, &g->p[i], t);
}

static int write_images(struct cuip_group *g)
{
	struct cuip_img_proc *ip = calloc(g->n ? g->n : 1, sizeof(*ip));
	double t0 = cuip_now();
	int ret;

	if (!ip)
		return out_of_memory(g, "writing the images");
	g->carried_bytes = 0;
	for (size_t i = 0; i < g->n; i++) {
		ip[i].st = g->p[i].st;
		ip[i].carriers = g->p[i].carriers;
		ip[i].n_carriers = g->p[i].n_carriers;
		ip[i].carrier_files = g->p[i].carrier_files;
		ip[i].n_carrier_files = g->p[i].n_carrier_files;
		g->carried_bytes += g->p[i].expected_bytes;
	}
	if (g->parent) {
		uint64_t left = 0, zero = 0;

		/* Written: neither the parent's nor all zero (a hole). */
		for (size_t i = 0; i < g->n; i++)
			if (g->p[i].save && g->p[i].save->save) {
				left += g->p[i].save->save->inherited_bytes;
				zero += g->p[i].save->save->zero_bytes;
			}
		pr_info("SAVE: %" PRIu64 " of %" PRIu64 " carried bytes left to the parent checkpoint %s, %" PRIu64
			" written, %" PRIu64 " all zero",
			left, g->carried_bytes, g->parent_img->dir, g->carried_bytes - left - zero, zero);
	}
	ret = cuip_images_write(g->imgdir, g->ckpt_id, ip, g->n, g->carried_bytes, g->parent_img, g->err,
				sizeof(g->err));
	free(ip);
	if (!ret)
		g->images_written = true;
	pr_info("%s: %zu topology images + inventory, %.3f s%s", cuip_gphase_name(CUIP_GPHASE_IMAGES), g->n,
		cuip_now() - t0, ret ? " (FAILED)" : "");
	if (g->after_phase)
		g->after_phase(g, CUIP_GPHASE_IMAGES, ret);
	if (g->on_phase)
		g->on_phase(g, CUIP_GPHASE_IMAGES, true, ret);
	return ret;
}

/*
 * A participant that is not ACTIVE is in another checkpoint (in progress,
 * or dead and waiting for its guardian's rollback): refuse before anything
 * is sent that could disturb it. Nothing is marked quiesced, so the
 * rollback that follows only closes our connections.
 */
static int refuse_busy(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		const struct cuip_part *p = &g->p[i];

		if (p->phase == CUIP__PHASE__PHASE_ACTIVE)
			continue;
		snprintf(g->err, sizeof(g->err),
			 "pid %d is in phase %s: another checkpoint or restore of it is in progress (or is being "
			 "rolled back); this dump leaves it alone, try again when it has finished",
			 p->pid, cuip_phase_name(p->phase));
		return -EBUSY;
	}
	return 0;
}

/*
 * HANDSHAKE, INSPECT, PREFLIGHT, QUIESCE. A QUIESCE that times out (calls
 * still in flight or device work that cannot drain, e.g. a collective whose
 * peer is held at its own closed gate) reopens every gate, waits and starts
 * over, at most CUINTERPOSE_TEST_QUIESCE_RETRIES more times; nothing has been
 * torn down yet, so the job just keeps running meanwhile.
 */
static int quiesce_with_retries(struct cuip_group *g)
{
	unsigned retries = g->o->quiesce_retries;
	int ret;

	for (unsigned a = 0;; a++) {
		if ((ret = connect_all(g, NULL)) || (ret = refuse_busy(g)) ||
		    (ret = run_phase(g, CUIP_GPHASE_INSPECT, step_inspect, NULL, NULL)) || (ret = preflight(g)))
			return ret;
		ret = run_phase(g, CUIP_GPHASE_QUIESCE, step_quiesce, NULL, NULL);
		/* The records SAVE and the images go by are the quiesced ones:
		 * between INSPECT and the closed gate the job may have allocated,
		 * freed or shared memory (PREPARE_UNICAST releases every carried
		 * allocation, saved or not). Checked again before anything is
		 * torn down; a refusal rolls back. */
		if (!ret && (ret = run_phase(g, CUIP_GPHASE_REINSPECT, step_inspect, NULL, NULL)) == 0)
			ret = preflight(g);
		if (ret != -ETIMEDOUT)
			return ret;
		if (a >= retries) {
			size_t l = strlen(g->err);

			if (retries)
				snprintf(g->err + l, sizeof(g->err) - l, " (QUIESCE timed out %u times)", a + 1);
			return ret;
		}
		pr_warn("QUIESCE attempt %u of %u timed out (%s); reopening every gate and retrying", a + 1,
			retries + 1, g->err);
		if (cuip_group_rollback(g))
			return ret;
		usleep(100000u << (a < 4 ? a : 4)); /* 0.1 s, 0.2 s, ... 1.6 s: let the job progress */
	}
}

int cuip_group_dump(struct cuip_group *g)
{
	int ret;

	if (getrandom(g->ckpt_id, sizeof(g->ckpt_id), 0) != sizeof(g->ckpt_id))
		for (size_t i = 0; i < sizeof(g->ckpt_id); i++)
			g->ckpt_id[i] = (uint8_t)rand();
	if ((ret = quiesce_with_retries(g)) ||
	    (ret = run_phase(g, CUIP_GPHASE_PREPARE_MULTICAST, step_flag, NULL,
			     (void *)(intptr_t)CUIP__REQUEST__BODY_PREPARE_MULTICAST)) ||
	    (ret = save_phase(g)) || (ret = write_images(g)) ||
	    (ret = run_phase(g, CUIP_GPHASE_PREPARE_UNICAST, step_flag, NULL,
			     (void *)(intptr_t)CUIP__REQUEST__BODY_PREPARE_UNICAST))) {
		char why[sizeof(g->err)];

		memcpy(why, g->err, sizeof(why));
		cuip_group_rollback(g);
		memcpy(g->err, why, sizeof(why));
		return ret;
	}
	cuip_group_disconnect(g);
	return 0;
}

/* ---- rebuild ------------------------------------------------------------- */

struct rebuild_ctx {
	const Cuip__Topology *const *topo;
	Cuip__PeerSocket **peers;
	size_t n_peers;
	Cuip__Stage stage;
	bool only_torn_down; /* rollback: only participants that detached something */
	bool unicast;	     /* LOAD or a unicast stage: only where unicast was detached */
};

static const Cuip__Topology *topo_of(const struct cuip_group *g, const struct cuip_part *p, const struct rebuild_ctx *c)
{
	return c->topo[p - g->p];
}

static bool rebuild_applies(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	const struct rebuild_ctx *c = arg;

	if (!c->only_torn_down)
		return true;
	/* A rollback after PREPARE_MULTICAST but before PREPARE_UNICAST:
	 * unicast memory is attached and its bytes intact (LOAD and REBUILD
	 * of it are refused in QUIESCED); only multicast is rebuilt. */
	return p->torn_down && (!c->unicast || p->unicast_down);
}

static bool load_applies(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	return rebuild_applies(g, p, arg) && topo_of(g, p, arg)->n_carriers > 0 && !p->loaded;
}

static int step_load(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	const struct rebuild_ctx *c = arg;
	const Cuip__Topology *t = topo_of(g, p, c);
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Load load = CUIP__LOAD__INIT;
	Cuip__Response *resp;
	uint64_t want = 0;
	int fds[CUIP_CARRIER_FILES_MAX], ret = 0;
	size_t nfds = t->n_carrier_files ? t->n_carrier_files : 1, f;
	char *one = t->n_carriers ? t->carriers[0]->file : NULL; /* unstriped: every entry's file */

	for (size_t i = 0; i < t->n_carriers; i++)
		want += t->carriers[i]->size;
	if (nfds > CUIP_CARRIER_FILES_MAX) {
		part_fail(p, "the topology names %zu carrier files, at most %d", nfds, CUIP_CARRIER_FILES_MAX);
		return -EBADMSG;
	}
	for (f = 0; f < nfds; f++) {
		const char *name = t->n_carrier_files ? t->carrier_files[f] : t->carriers[0]->file;

		fds[f] = openat(g->imgdir, name, O_RDONLY | O_CLOEXEC);
		if (fds[f] < 0) {
			ret = -errno;
			part_fail(p, "cannot open carrier image %s (stripe %zu of %zu): %s", name, f, nfds,
				  strerror(errno));
			break;
		}
	}
	if (!ret) {
		load.entries = t->carriers;
		load.n_entries = t->n_carriers;
		/* names for LOAD's messages, the one file of an unstriped carrier too */
		load.files = t->n_carrier_files ? t->carrier_files : &one;
		load.n_files = t->n_carrier_files ? t->n_carrier_files : one ? 1 : 0;
		load.has_restored = 1;
		load.restored = !c->only_torn_down; /* from images, not a rollback */
		load.has_sync_copies = 1;
		load.sync_copies = g->o->load_sync;
		req.body_case = CUIP__REQUEST__BODY_LOAD;
		req.load = &load;
		ret = callv(g, p, &req, fds, nfds, g->o->data_timeout_ms, &resp);
	}
	while (f-- > 0)
		close(fds[f]);
	if (ret)
		return ret;
	if (resp->body_case != CUIP__RESPONSE__BODY_LOAD || resp->load->bytes != want) {
		part_fail(p, "LOAD moved %llu bytes, expected %llu",
			  (unsigned long long)(resp->body_case == CUIP__RESPONSE__BODY_LOAD ? resp->load->bytes : 0),
			  (unsigned long long)want);
		ret = -EIO;
	}
	p->bytes = want;
	p->records = t->n_carriers;
	cuip_client_free(resp);
	return ret;
}

/* LOAD's meter: the carrier bytes of p, and what p has read (rchar of
 * /proc/PID/io; the interposer pread()s its carrier image). */
static uint64_t load_total(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	const Cuip__Topology *t = topo_of(g, p, arg);
	uint64_t want = 0;

	for (size_t i = 0; i < t->n_carriers; i++)
		want += t->carriers[i]->size;
	return want;
}

static int64_t load_done(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	char path[64], line[128];
	long long rchar = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/io", p->pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "rchar: %lld", &rchar) == 1)
			break;
	fclose(f);
	return rchar;
}

static const struct cuip_meter load_meter = {.total = load_total, .done = load_done, .delta = true};

static int step_rebuild(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	const struct rebuild_ctx *c = arg;
	const Cuip__Topology *t = topo_of(g, p, c);
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Rebuild rb = CUIP__REBUILD__INIT;

	rb.stage = c->stage;
	rb.self = t->state->self;
	rb.peers = c->peers;
	rb.n_peers = c->n_peers;
	rb.has_restored = 1;
	rb.restored = !c->only_torn_down;
	req.body_case = CUIP__REQUEST__BODY_REBUILD;
	req.rebuild = &rb;
	p->records = t->state->n_mappings;
	return call(g, p, &req, -1, g->o->data_timeout_ms, NULL);
}

/*
 * VERIFY by digest when the state holds no multicast object (digest.h): 8
 * bytes instead of the whole state on the wire. If the digests differ, the
 * whole state follows, and the record-by-record comparison names what
 * differs; the participant fails either way.
 */
static int step_verify(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	const Cuip__Topology *t = topo_of(g, p, arg);
	const Cuip__ProcessState *st = t->state;
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Verify v = CUIP__VERIFY__INIT;
	bool mc = false;
	int ret;

	for (size_t k = 0; k < st->n_allocations; k++)
		mc |= st->allocations[k]->kind == CUIP__ALLOC_KIND__KIND_MULTICAST;
	req.body_case = CUIP__REQUEST__BODY_VERIFY;
	req.verify = &v;
	p->records = st->n_allocations + st->n_mappings;
	if (!mc && cuip_state_digest(st, &v.digest)) {
		v.has_digest = v.has_allocations = v.has_mappings = 1;
		v.allocations = st->n_allocations;
		v.mappings = st->n_mappings;
		v.self = st->self;
		ret = call(g, p, &req, -1, op_timeout(g), NULL);
		if (ret != -EBADE)
			return ret;
		pr_warn("pid %d: %s; comparing record by record", p->pid, p->err);
		v = (Cuip__Verify)CUIP__VERIFY__INIT;
	}
	v.expected = (Cuip__ProcessState *)st;
	return call(g, p, &req, -1, op_timeout(g), NULL);
}

static bool has_multicast(const Cuip__Topology *const *topo, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const Cuip__ProcessState *st = topo[i]->state;
		for (size_t k = 0; k < st->n_allocations; k++)
			if (st->allocations[k]->kind == CUIP__ALLOC_KIND__KIND_MULTICAST &&
			    st->allocations[k]->owner == CUIP__OWNER__OWNER_SHARED)
				return true;
	}
	return false;
}

static int rebuild(struct cuip_group *g, const Cuip__Topology *const *topo, bool only_torn_down)
{
	struct rebuild_ctx c = {.topo = topo, .only_torn_down = only_torn_down};
	Cuip__PeerSocket *ps = calloc(g->n ? g->n : 1, sizeof(*ps));
	Cuip__PeerSocket **pps = calloc(g->n ? g->n : 1, sizeof(*pps));
	Cuip__ProcessId *ids = calloc(g->n ? g->n : 1, sizeof(*ids));
	static const Cuip__Stage stages[] = {CUIP__STAGE__STAGE_CREATORS,    CUIP__STAGE__STAGE_IMPORTERS,
					     CUIP__STAGE__STAGE_MC_CREATORS, CUIP__STAGE__STAGE_MC_IMPORTERS,
					     CUIP__STAGE__STAGE_MC_DEVICES,  CUIP__STAGE__STAGE_MC_BINDINGS};
	size_t nstages = has_multicast(topo, g->n) ? 6 : 2;
	int ret = 0;

	if (!ps || !pps || !ids) {
		ret = out_of_memory(g, "starting the rebuild");
		goto out;
	}
	for (size_t i = 0; i < g->n; i++) {
		cuip__peer_socket__init(&ps[i]);
		cuip__process_id__init(&ids[i]);
		ids[i].id = topo[i]->state->self->id;
		ids[i].pid = topo[i]->state->self->pid;
		ps[i].proc = &ids[i];
		ps[i].socket = g->p[i].sock;
		pps[i] = &ps[i];
	}
	c.peers = pps;
	c.n_peers = g->n;
	c.unicast = true;
	ret = run_phase_metered(g, CUIP_GPHASE_LOAD, step_load, load_applies, &c, &load_meter);
	for (size_t s = 0; !ret && s < nstages; s++) {
		c.stage = stages[s];
		c.unicast = stages[s] == CUIP__STAGE__STAGE_CREATORS || stages[s] == CUIP__STAGE__STAGE_IMPORTERS;
		ret = run_phase_metered(g, cuip_gphase_of_stage(stages[s]), step_rebuild, rebuild_applies, &c,
					&cuip_meter_replies_only);
	}
	c.unicast = false;
	if (!ret)
		ret = run_phase(g, CUIP_GPHASE_VERIFY, step_verify, rebuild_applies, &c);
out:
	free(ps);
	free(pps);
	free(ids);
	return ret;
}

static int step_resume(struct cuip_group *g, struct cuip_part *p, const void *arg)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	int ret;

	req.body_case = CUIP__REQUEST__BODY_RESUME;
	req.resume = 1;
	ret = call(g, p, &req, -1, op_timeout(g), NULL);
	if (!ret) {
		p->quiesced = false;
		p->torn_down = false;
		p->unicast_down = false;
	}
	return ret;
}

/* Still attached after a failed teardown (the interposer undid its part). */
static bool mc_attached(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	return p->quiesced && !p->unicast_down && has_mc(p->st);
}

static bool unicast_attached(const struct cuip_group *g, const struct cuip_part *p, const void *arg)
{
	return p->quiesced && !p->unicast_down;
}

/*
 * A participant whose teardown failed and was undone still holds the memory
 * (or multicast object) that its peers already released: rebuilt, the
 * creator would make new memory that this importer does not see. So finish
 * the teardown everywhere first, as a complete dump would have; the rebuild
 * is then the one an in-place restore does. If that fails too, the rollback
 * fails (closed).
 */
static int finish_teardown(struct cuip_group *g, bool any_unicast_down)
{
	int ret = run_phase(g, CUIP_GPHASE_PREPARE_MULTICAST_ROLLBACK, step_flag, mc_attached,
			    (void *)(intptr_t)CUIP__REQUEST__BODY_PREPARE_MULTICAST);

	if (!ret && any_unicast_down)
		ret = run_phase(g, CUIP_GPHASE_PREPARE_UNICAST_ROLLBACK, step_flag, unicast_attached,
				(void *)(intptr_t)CUIP__REQUEST__BODY_PREPARE_UNICAST);
	return ret;
}

/* Alive and not a zombie (a SIGKILLed participant stays a zombie until criu's
 * children are reaped). */
static bool part_alive(pid_t pid)
{
	struct cuip_proc_stat st;
	int ret;

	if (kill(pid, 0) && errno == ESRCH)
		return false;
	ret = cuip_proc_stat_read(pid, &st);
	if (ret == -EINVAL)
		return true; /* there, but its line unread: as before, not a zombie */
	return !ret && st.state != 'Z' && st.state != 'X';
}

/*
 * A participant that died during the dump (killed, crashed) can neither be
 * rebuilt nor block the others: it leaves the group, named in the log, and
 * the survivors are rolled back. Survivors that imported from it cannot get
 * their memory back and make the rollback fail, which says so.
 */
static void drop_dead(struct cuip_group *g, Cuip__Topology *topo, const Cuip__Topology **tp)
{
	size_t k = 0;

	for (size_t i = 0; i < g->n; i++) {
		if (!part_alive(g->p[i].pid)) {
			pr_err("pid %d died during the dump; rolling back the other participants without it",
			       (int)g->p[i].pid);
			if (g->p[i].fd >= 0)
				close(g->p[i].fd);
			g->p[i].fd = -1;
			continue;
		}
		if (k != i) {
			g->p[k] = g->p[i];
			topo[k] = topo[i];
		}
		tp[k] = &topo[k];
		k++;
	}
	g->n = k;
}

/*
 * What the participants say (HANDSHAKE's phase) over what the flags
 * assumed: a step's flags are set before its request is sent, and a
 * coordinator that died mid-phase (the guardian's rollback) cannot know
 * who got it. ACTIVE: nothing to undo. QUIESCED: unicast memory attached
 * (the request never came, or was undone), only multicast may be detached.
 */
static void reconcile(struct cuip_group *g, bool *any_torn, bool *any_unicast_down)
{
	*any_torn = *any_unicast_down = false;
	for (size_t i = 0; i < g->n; i++) {
		struct cuip_part *p = &g->p[i];

		if (p->phase == CUIP__PHASE__PHASE_ACTIVE) {
			p->quiesced = p->torn_down = p->unicast_down = false;
		} else if (p->phase == CUIP__PHASE__PHASE_RESTORING) {
			/* A rebuild was under way (criu died in an in-place
			 * restore): its LOAD ran to the end on the interposer's
			 * op thread, and LOAD refuses attached memory. Had it
			 * failed, REBUILD_CREATORS refuses what it left. */
			pr_warn("pid %d is RESTORING: a rebuild was under way; redoing it from REBUILD", p->pid);
			p->loaded = true;
		} else if (p->phase == CUIP__PHASE__PHASE_QUIESCED && p->unicast_down) {
			pr_warn("pid %d is QUIESCED with its unicast memory attached: PREPARE_UNICAST never reached it",
				p->pid);
			p->unicast_down = false;
			p->torn_down = has_mc(p->st);
		}
		*any_torn |= p->torn_down;
		*any_unicast_down |= p->unicast_down;
	}
}

int cuip_group_rollback(struct cuip_group *g)
{
	Cuip__Topology *topo = calloc(g->n ? g->n : 1, sizeof(*topo));
	const Cuip__Topology **tp = calloc(g->n ? g->n : 1, sizeof(*tp));
	bool any_torn = false, any_quiesced = false, any_unicast_down = false;
	int ret = 0;

	if (!topo || !tp) {
		free(topo);
		free(tp);
		g->rollback_failed = true;
		return out_of_memory(g, "starting the rollback");
	}
	for (size_t i = 0; i < g->n; i++) {
		any_torn |= g->p[i].torn_down;
		any_unicast_down |= g->p[i].unicast_down;
		any_quiesced |= g->p[i].quiesced;
		cuip_group_topology(g, i, &topo[i]);
		tp[i] = &topo[i];
	}
	if (!any_quiesced) {
		cuip_group_disconnect(g);
		goto out;
	}
	pr_warn("rolling back: %s the participants and reopening their gates",
		any_torn ? "rebuilding the shared memory of" : "releasing");
	/* Fresh connections: the old ones may be closed (before a native
	 * lock) or broken (the failure itself). */
	cuip_group_disconnect(g);
	drop_dead(g, topo, tp);
	ret = connect_all(g, NULL);
	if (!ret)
		reconcile(g, &any_torn, &any_unicast_down);
	if (!ret && any_torn)
		ret = finish_teardown(g, any_unicast_down);
	if (!ret && any_torn)
		ret = rebuild(g, tp, true);
	if (!ret)
		ret = run_phase(g, CUIP_GPHASE_RESUME, step_resume, is_quiesced, NULL);
	g->rollback_failed = ret != 0;
	if (ret)
		pr_err("ROLLBACK FAILED: %s; the job may be left with its gate closed", g->err);
	else
		pr_info("rollback complete: every participant runs with its sharing intact");
	cuip_group_disconnect(g);
out:
	free(topo);
	free(tp);
	return ret;
}

int cuip_group_rebuild(struct cuip_group *g, const Cuip__Topology *const *topo)
{
	uint64_t *ids = calloc(g->n ? g->n : 1, sizeof(*ids));
	int ret;

	if (!ids)
		return out_of_memory(g, "starting the restore");
	for (size_t i = 0; i < g->n; i++)
		ids[i] = topo[i]->state->self->id;
	ret = connect_all(g, ids);
	free(ids);
	if (!ret)
		ret = rebuild(g, topo, false);
	if (!ret) {
		for (size_t i = 0; i < g->n; i++)
			g->p[i].quiesced = true;
		ret = run_phase(g, CUIP_GPHASE_RESUME, step_resume, NULL, NULL);
	}
	cuip_group_disconnect(g);
	return ret;
}

void cuip_group_free(struct cuip_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		if (g->p[i].fd >= 0)
			close(g->p[i].fd);
		cuip_client_free(g->p[i].inspect);
		cuip_client_free(g->p[i].save);
		if (g->p[i].flat)
			cuip__topology__free_unpacked(g->p[i].flat, NULL);
	}
	free(g->p);
	g->p = NULL;
	g->n = 0;
}
