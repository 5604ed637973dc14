/*
 * images.c - writing and validating the plugin's images; see images.h.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "errfmt.h"
#include "images.h"
#include "threads.h"
#include "zchunk.h"

void cuip_carrier_name(pid_t vpid, char *buf, size_t len)
{
	snprintf(buf, len, CUIP_CARRIER_FMT, (int)vpid);
}

void cuip_carrier_stripe_name(pid_t vpid, unsigned k, char *buf, size_t len)
{
	if (k)
		snprintf(buf, len, "cuinterpose-carrier-%d-%u.img", (int)vpid, k);
	else
		cuip_carrier_name(vpid, buf, len);
}

int cuip_entry_locate(const Cuip__Topology *t, const Cuip__CarrierEntry *e, uint64_t pos, const char **file,
		      uint64_t *foff, uint64_t *run)
{
	uint64_t at = 0;

	if (pos >= e->size)
		return -EBADMSG;
	if (!e->n_extents) {
		*file = e->file;
		*foff = e->offset + pos;
		*run = e->size - pos;
		return 0;
	}
	for (size_t k = 0; k < e->n_extents; k++) {
		const Cuip__CarrierExtent *x = e->extents[k];

		if (pos < at + x->size) {
			if (x->file >= t->n_carrier_files)
				return -EBADMSG;
			*file = t->carrier_files[x->file];
			*foff = x->offset + (pos - at);
			*run = x->size - (pos - at);
			return 0;
		}
		at += x->size;
	}
	return -EBADMSG;
}

/* One participant's topology image, on a thread of its own: encoding,
 * checksumming and the fsync of each image overlap with the others'. */
struct topo_job {
	int dirfd;
	const uint8_t *ckpt_id;
	const struct cuip_img_proc *p;
	char name[64];
	pthread_t th;
	bool started;
	int ret;
};

static void *topo_write(void *arg)
{
	struct topo_job *j = arg;
	Cuip__Topology t = CUIP__TOPOLOGY__INIT;

	t.checkpoint_id.data = (uint8_t *)j->ckpt_id;
	t.checkpoint_id.len = 16;
	t.state = (Cuip__ProcessState *)j->p->st;
	t.carriers = j->p->carriers;
	t.n_carriers = j->p->n_carriers;
	t.carrier_files = j->p->carrier_files;
	t.n_carrier_files = j->p->n_carrier_files;
	j->ret = cuip_image_write(j->dirfd, j->name, CUIP_KIND_TOPOLOGY, &t.base);
	return NULL;
}

int cuip_images_write(int dirfd, const uint8_t ckpt_id[16], const struct cuip_img_proc *p, size_t n,
		      uint64_t carried_bytes, const struct cuip_img_parent *parent, char *err, size_t errlen)
{
	Cuip__Inventory inv = CUIP__INVENTORY__INIT;
	struct topo_job *jobs = calloc(n ? n : 1, sizeof(*jobs));
	Cuip__ProcessId **ids;
	struct timespec ts;
	int ret = 0;

	if (!jobs) {
		errfmt(err, errlen, "out of memory writing the topology images of %zu processes", n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		jobs[i] = (struct topo_job){.dirfd = dirfd, .ckpt_id = ckpt_id, .p = &p[i]};
		snprintf(jobs[i].name, sizeof(jobs[i].name), CUIP_TOPOLOGY_FMT, (int)p[i].st->self->pid);
		jobs[i].started = pthread_create(&jobs[i].th, NULL, topo_write, &jobs[i]) == 0;
		if (!jobs[i].started)
			topo_write(&jobs[i]); /* no thread: here, the result is the same */
	}
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].started)
			pthread_join(jobs[i].th, NULL);
		if (jobs[i].ret && !ret) {
			ret = jobs[i].ret;
			errfmt(err, errlen, "cannot write %s: %s", jobs[i].name, strerror(-ret));
		}
	}
	free(jobs);
	/* The inventory last: its presence says every topology image is there. */
	if (ret)
		return ret;
	ids = calloc(n ? n : 1, sizeof(*ids));
	if (!ids) {
		errfmt(err, errlen, "out of memory writing %s", CUIP_INVENTORY_IMG);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		ids[i] = p[i].st->self;
	clock_gettime(CLOCK_REALTIME, &ts);
	inv.checkpoint_id.data = (uint8_t *)ckpt_id;
	inv.checkpoint_id.len = 16;
	inv.participants = ids;
	inv.n_participants = n;
	inv.has_created_unix_ns = 1;
	inv.created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	inv.version = (char *)PACKAGE_VERSION;
	inv.has_carried_bytes = 1;
	inv.carried_bytes = carried_bytes;
	if (parent) {
		inv.parent = (char *)parent->dir;
		inv.parent_relative = (char *)parent->rel;
		inv.has_parent_checkpoint_id = 1;
		inv.parent_checkpoint_id.data = (uint8_t *)parent->id;
		inv.parent_checkpoint_id.len = 16;
	}
	ret = cuip_image_write(dirfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &inv.base);
	if (ret)
		errfmt(err, errlen, "cannot write %s: %s", CUIP_INVENTORY_IMG, strerror(-ret));
	free(ids);
	return ret;
}

void cuip_images_free(struct cuip_ckpt *c)
{
	for (size_t i = 0; i < c->n; i++)
		if (c->topo && c->topo[i])
			protobuf_c_message_free_unpacked(&c->topo[i]->base, NULL);
	free(c->topo);
	if (c->inv)
		protobuf_c_message_free_unpacked(&c->inv->base, NULL);
	memset(c, 0, sizeof(*c));
}

static int same_ckpt(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
	return a->len == 16 && b->len == 16 && !memcmp(a->data, b->data, 16);
}

/* A striped participant's files are its own, in order (no other name is
 * ever opened). */
static int check_stripe_names(const char *tname, const Cuip__Topology *t, char *err, size_t errlen)
{
	const Cuip__ProcessState *st = t->state;

	if (t->n_carrier_files > CUIP_CARRIER_FILES_MAX) {
		errfmt(err, errlen, "%s: %zu carrier files, at most %d", tname, t->n_carrier_files,
		       CUIP_CARRIER_FILES_MAX);
		return -EBADMSG;
	}
	for (size_t k = 0; k < t->n_carrier_files; k++) {
		char name[64];

		cuip_carrier_stripe_name(st->self->pid, (unsigned)k, name, sizeof(name));
		if (!t->carrier_files[k] || strcmp(t->carrier_files[k], name)) {
			errfmt(err, errlen, "%s: carrier file %zu is \"%s\", expected %s", tname, k,
			       t->carrier_files[k] ? t->carrier_files[k] : "(none)", name);
			return -EBADMSG;
		}
	}
	return 0;
}

/* Entry i names this participant's carrier, an allocation it carries, a
 * size that fits it, and one checksum per chunk. */
static int check_entry(const char *tname, const Cuip__Topology *t, size_t i, char *err, size_t errlen)
{
	const Cuip__ProcessState *st = t->state;
	const Cuip__CarrierEntry *e = t->carriers[i];
	const Cuip__Allocation *a = NULL;
	char want[64];
	uint64_t chunks;

	cuip_carrier_name(st->self->pid, want, sizeof(want));
	if (!e->alloc || !e->file || strcmp(e->file, want)) {
		errfmt(err, errlen, "%s: carrier entry %zu names file \"%s\", expected %s", tname, i,
		       e->file ? e->file : "(none)", want);
		return -EBADMSG;
	}
	for (size_t k = 0; k < st->n_allocations; k++) {
		const Cuip__AllocId *id = st->allocations[k]->id;
		if (id && id->creator == e->alloc->creator && id->serial == e->alloc->serial)
			a = st->allocations[k];
	}
	if (!a || !cuip_alloc_carried_by(a, st->self->id)) {
		errfmt(err, errlen,
		       "%s: carrier entry for allocation %llx:%llu which this participant did not "
		       "create as shared",
		       tname, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial);
		return -EBADMSG;
	}
	if (!cuip_carrier_entry_fits(a, e)) {
		if (a->slab)
			errfmt(err, errlen,
			       "%s: carrier entry for %llx:%llu holds %llu bytes at offset %#llx, which is no "
			       "live piece of that slab",
			       tname, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)e->size, (unsigned long long)e->alloc_offset);
		else
			errfmt(err, errlen, "%s: carrier entry for %llx:%llu holds %llu bytes, the allocation has %llu",
			       tname, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)e->size, (unsigned long long)cuip_alloc_size(a));
		return -EBADMSG;
	}
	if (!e->chunk_size) {
		errfmt(err, errlen, "%s: carrier entry %zu has chunk size 0", tname, i);
		return -EBADMSG;
	}
	chunks = (e->size + e->chunk_size - 1) / e->chunk_size;
	if (e->n_crc32c != chunks) {
		errfmt(err, errlen, "%s: carrier entry %zu has %zu checksums for %llu chunks", tname, i, e->n_crc32c,
		       (unsigned long long)chunks);
		return -EBADMSG;
	}
	if ((e->has_zero && e->zero.len != (chunks + 7) / 8) ||
	    (e->has_dhash && (e->dhash.len != chunks * 16 || !e->has_dhash_key || e->dhash_key.len != 16))) {
		errfmt(err, errlen,
		       "%s: carrier entry %zu has %zu zero-chunk bitmap bytes and %zu device hash bytes (key %zu) for "
		       "%llu chunks",
		       tname, i, e->has_zero ? e->zero.len : 0, e->has_dhash ? e->dhash.len : 0,
		       e->has_dhash_key ? e->dhash_key.len : 0, (unsigned long long)chunks);
		return -EBADMSG;
	}
	for (uint64_t k = 0; e->has_zero && e->has_inherited && k < chunks && k / 8 < e->inherited.len; k++)
		if ((e->zero.data[k / 8] >> (k % 8)) & (e->inherited.data[k / 8] >> (k % 8)) & 1) {
			errfmt(err, errlen, "%s: carrier entry %zu marks chunk %llu both zero and inherited", tname, i,
			       (unsigned long long)k);
			return -EBADMSG;
		}
	return cuip_entry_check_stored(tname, e, i, err, errlen);
}

int cuip_entry_check_stored(const char *tname, const Cuip__CarrierEntry *e, size_t i, char *err, size_t errlen)
{
	uint64_t chunks = e->chunk_size ? (e->size + e->chunk_size - 1) / e->chunk_size : 0;

	if (e->n_stored && e->n_stored != chunks) {
		errfmt(err, errlen, "%s: carrier entry %zu has %zu stored lengths for %llu chunks", tname, i,
		       e->n_stored, (unsigned long long)chunks);
		return -EBADMSG;
	}
	for (size_t k = 0; k < e->n_stored; k++) {
		uint64_t len =
			e->size - k * e->chunk_size < e->chunk_size ? e->size - k * e->chunk_size : e->chunk_size;

		if (!cuip_zchunk_stored_ok(e->stored[k], len)) {
			errfmt(err, errlen,
			       "%s: carrier entry %zu stores chunk %zu in %u bytes, which is not less than its %llu",
			       tname, i, k, e->stored[k], (unsigned long long)len);
			return -EBADMSG;
		}
	}
	return 0;
}

/* Every byte of entry i lies in a file of dirfd that holds it; a striped
 * entry's extents are whole chunks but the last. */
static int check_entry_extents(int dirfd, const char *tname, const Cuip__Topology *t, size_t i, char *err,
			       size_t errlen)
{
	const Cuip__CarrierEntry *e = t->carriers[i];
	struct stat sb;

	for (uint64_t pos = 0; pos < e->size;) {
		const char *f;
		uint64_t foff, run;

		if (cuip_entry_locate(t, e, pos, &f, &foff, &run) || !f || strchr(f, '/') ||
		    (run < e->size - pos && (pos + run) % e->chunk_size)) {
			errfmt(err, errlen,
			       "%s: carrier entry %zu (allocation %llx:%llu): extents do not cover its %llu "
			       "bytes in whole chunks (byte %llu)",
			       tname, i, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)e->size, (unsigned long long)pos);
			return -EBADMSG;
		}
		if (fstatat(dirfd, f, &sb, 0)) {
			int ret = -errno;
			errfmt(err, errlen, "%s: %s (allocation %llx:%llu chunk %llu)", f,
			       errno == ENOENT ? "missing" : strerror(errno), (unsigned long long)e->alloc->creator,
			       (unsigned long long)e->alloc->serial, (unsigned long long)(pos / e->chunk_size));
			return ret;
		}
		if (!S_ISREG(sb.st_mode)) {
			errfmt(err, errlen, "%s: not a regular file (allocation %llx:%llu chunk %llu)", f,
			       (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)(pos / e->chunk_size));
			return -EBADMSG;
		}
		if (foff + run < foff || (uint64_t)sb.st_size < foff + run) {
			errfmt(err, errlen,
			       "%s: truncated: %lld bytes, the index needs %llu (allocation %llx:%llu chunk "
			       "%llu)",
			       f, (long long)sb.st_size, (unsigned long long)(foff + run),
			       (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)((pos + ((uint64_t)sb.st_size > foff ? sb.st_size - foff : 0)) /
						    e->chunk_size));
			return -ENODATA;
		}
		pos += run;
	}
	return 0;
}

/* Every carried allocation has its entries: one, or one per live piece of
 * a slab. */
static int check_coverage(const char *tname, const Cuip__Topology *t, char *err, size_t errlen)
{
	const Cuip__ProcessState *st = t->state;

	for (size_t k = 0; k < st->n_allocations; k++) {
		const Cuip__Allocation *a = st->allocations[k];
		size_t found = 0;

		if (!cuip_alloc_carried_by(a, st->self->id))
			continue;
		for (size_t i = 0; i < t->n_carriers; i++)
			if (t->carriers[i]->alloc->creator == a->id->creator &&
			    t->carriers[i]->alloc->serial == a->id->serial)
				found++;
		if (a->slab && found != a->n_pieces) {
			errfmt(err, errlen, "%s: shared slab %llx:%llu has %zu live pieces but %zu carrier entries",
			       tname, (unsigned long long)a->id->creator, (unsigned long long)a->id->serial,
			       a->n_pieces, found);
			return -EBADMSG;
		}
		if (!found) {
			errfmt(err, errlen, "%s: shared allocation %llx:%llu has no carrier entry", tname,
			       (unsigned long long)a->id->creator, (unsigned long long)a->id->serial);
			return -EBADMSG;
		}
	}
	return 0;
}

/* Carrier index of one topology against its own state and the files. */
static int check_carriers(int dirfd, const char *tname, const Cuip__Topology *t, uint64_t *bytes, char *err,
			  size_t errlen)
{
	int ret;

	if ((ret = check_stripe_names(tname, t, err, errlen)))
		return ret;
	for (size_t i = 0; i < t->n_carriers; i++) {
		if ((ret = check_entry(tname, t, i, err, errlen)) ||
		    (ret = check_entry_extents(dirfd, tname, t, i, err, errlen)))
			return ret;
		*bytes += t->carriers[i]->size;
	}
	/* Each stripe file is there (checked after the entries, which name
	 * the allocation and chunk a missing file holds). */
	for (size_t k = 0; k < t->n_carrier_files; k++) {
		struct stat sb;

		if (fstatat(dirfd, t->carrier_files[k], &sb, 0)) {
			ret = -errno;
			errfmt(err, errlen, "%s: %s (stripe %zu of %zu of pid %d's carrier)", t->carrier_files[k],
			       ret == -ENOENT ? "missing" : strerror(-ret), k, t->n_carrier_files,
			       (int)t->state->self->pid);
			return ret;
		}
	}
	return check_coverage(tname, t, err, errlen);
}

static int read_one(int dirfd, struct cuip_ckpt *c, char *err, size_t errlen)
{
	ProtobufCMessage *m;
	int ret;

	memset(c, 0, sizeof(*c));
	ret = cuip_image_read(dirfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor, NULL, &m,
			      err, errlen);
	if (ret)
		return ret;
	c->inv = (Cuip__Inventory *)m;
	if (c->inv->checkpoint_id.len != 16) {
		errfmt(err, errlen, "%s: checkpoint id has %zu bytes, not 16", CUIP_INVENTORY_IMG,
		       c->inv->checkpoint_id.len);
		ret = -EBADMSG;
		goto fail;
	}
	c->topo = calloc(c->inv->n_participants ? c->inv->n_participants : 1, sizeof(*c->topo));
	if (!c->topo) {
		errfmt(err, errlen, "%s: out of memory for %zu participants", CUIP_INVENTORY_IMG,
		       c->inv->n_participants);
		ret = -ENOMEM;
		goto fail;
	}
	c->n = c->inv->n_participants;
	for (size_t i = 0; i < c->n; i++) {
		const Cuip__ProcessId *pid = c->inv->participants[i];
		char name[64];

		for (size_t j = 0; j < i; j++) {
			if (c->inv->participants[j]->pid == pid->pid || c->inv->participants[j]->id == pid->id) {
				errfmt(err, errlen, "%s: participant pid %d / identity %016llx listed twice",
				       CUIP_INVENTORY_IMG, pid->pid, (unsigned long long)pid->id);
				ret = -EBADMSG;
				goto fail;
			}
		}
		snprintf(name, sizeof(name), CUIP_TOPOLOGY_FMT, pid->pid);
		ret = cuip_image_read(dirfd, name, CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor, NULL, &m, err,
				      errlen);
		if (ret)
			goto fail;
		c->topo[i] = (Cuip__Topology *)m;
		if (!same_ckpt(&c->topo[i]->checkpoint_id, &c->inv->checkpoint_id)) {
			errfmt(err, errlen, "%s belongs to another checkpoint than %s (mixed image directories?)", name,
			       CUIP_INVENTORY_IMG);
			ret = -EBADMSG;
			goto fail;
		}
		if (!c->topo[i]->state->self || c->topo[i]->state->self->id != pid->id ||
		    c->topo[i]->state->self->pid != pid->pid) {
			errfmt(err, errlen, "%s describes another process than the inventory's pid %d / %016llx", name,
			       pid->pid, (unsigned long long)pid->id);
			ret = -EBADMSG;
			goto fail;
		}
		ret = check_carriers(dirfd, name, c->topo[i], &c->carried_bytes, err, errlen);
		if (ret)
			goto fail;
	}
	if (c->inv->has_carried_bytes && c->inv->carried_bytes != c->carried_bytes) {
		errfmt(err, errlen, "%s: records %llu carried bytes, the topology images index %llu",
		       CUIP_INVENTORY_IMG, (unsigned long long)c->inv->carried_bytes,
		       (unsigned long long)c->carried_bytes);
		ret = -EBADMSG;
		goto fail;
	}
	return 0;
fail:
	cuip_images_free(c);
	return ret;
}

/* ---- incremental checkpoints: the parent chain ---------------------------- */

static bool inherits(const Cuip__CarrierEntry *e, uint64_t k)
{
	return e->has_inherited && k / 8 < e->inherited.len && (e->inherited.data[k / 8] >> (k % 8)) & 1;
}

/*
 * A chunk's content identity: the device's two hashes (16 bytes, under
 * the entry's dhash_key) where the entry has them for every chunk, else
 * its SHA-256 (32 bytes). Two entries' chunks compare only under the same
 * function: both device hashes with the same keys, or both SHA-256.
 */
static bool has_dhash(const Cuip__CarrierEntry *e, uint64_t chunks)
{
	return e->has_dhash && e->dhash.len == chunks * 16 && e->has_dhash_key && e->dhash_key.len == 16;
}

static bool has_ident(const Cuip__CarrierEntry *e, uint64_t chunks)
{
	return has_dhash(e, chunks) || e->sha256.len == chunks * 32;
}

static bool idents_comparable(const Cuip__CarrierEntry *e, const Cuip__CarrierEntry *pe, uint64_t chunks)
{
	if (has_dhash(e, chunks))
		return has_dhash(pe, chunks) && !memcmp(e->dhash_key.data, pe->dhash_key.data, 16);
	return e->sha256.len == chunks * 32 && pe->sha256.len == chunks * 32;
}

/* Chunk k of e and of pe hold the same bytes (idents_comparable). */
static bool same_chunk(const Cuip__CarrierEntry *e, const Cuip__CarrierEntry *pe, uint64_t chunks, uint64_t k)
{
	if (has_dhash(e, chunks))
		return !memcmp(e->dhash.data + k * 16, pe->dhash.data + k * 16, 16);
	return !memcmp(e->sha256.data + k * 32, pe->sha256.data + k * 32, 32);
}

static bool entry_inherits(const Cuip__CarrierEntry *e)
{
	for (size_t i = 0; e->has_inherited && i < e->inherited.len; i++)
		if (e->inherited.data[i])
			return true;
	return false;
}

/* The parent's entry for the same bytes as e (allocation and slab offset). */
static const Cuip__CarrierEntry *parent_entry(const struct cuip_ckpt *par, const Cuip__CarrierEntry *e,
					      const Cuip__Topology **pt, size_t *at)
{
	for (size_t i = 0; i < par->n; i++)
		for (size_t k = 0; k < par->topo[i]->n_carriers; k++) {
			const Cuip__CarrierEntry *p = par->topo[i]->carriers[k];

			if (p->alloc && p->alloc->creator == e->alloc->creator &&
			    p->alloc->serial == e->alloc->serial &&
			    (p->has_alloc_offset ? p->alloc_offset : 0) ==
				    (e->has_alloc_offset ? e->alloc_offset : 0)) {
				*pt = par->topo[i];
				*at = k;
				return p;
			}
		}
	return NULL;
}

/* The stored lengths of entry k of the parent's topology pt (in dir). */
static int check_parent_stored(const char *dir, const Cuip__Topology *pt, const Cuip__CarrierEntry *pe, size_t k,
			       char *err, size_t errlen)
{
	char name[PATH_MAX + 64];

	snprintf(name, sizeof(name), "parent checkpoint %s, topology of pid %d", dir,
		 pt->state && pt->state->self ? (int)pt->state->self->pid : 0);
	return cuip_entry_check_stored(name, pe, k, err, errlen);
}

/* The files one flattened topology reads: its own first, then the
 * ancestors' (absolute paths), each once. */
struct files {
	char *name[CUIP_CARRIER_FILES_MAX];
	size_t n;
};

/* Index of file `name` (relative names are the parent's, in dir), added
 * when new; -E2BIG past CUIP_CARRIER_FILES_MAX. */
static int file_index(struct files *fl, const char *dir, const char *name)
{
	char path[PATH_MAX];

	int n = dir && name[0] != '/' ? snprintf(path, sizeof(path), "%s/%s", dir, name)
				      : snprintf(path, sizeof(path), "%s", name);

	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	for (size_t i = 0; i < fl->n; i++)
		if (!strcmp(fl->name[i], path))
			return (int)i;
	if (fl->n == CUIP_CARRIER_FILES_MAX)
		return -E2BIG;
	fl->name[fl->n] = strdup(path);
	return fl->name[fl->n] ? (int)fl->n++ : -ENOMEM;
}

/* Append chunk bytes at (file, off) to the extents, merging with the last. */
static int add_extent(Cuip__CarrierExtent ***v, size_t *n, uint32_t file, uint64_t off, uint64_t len)
{
	Cuip__CarrierExtent *x, **nv;

	if (*n && (*v)[*n - 1]->file == file && (*v)[*n - 1]->offset + (*v)[*n - 1]->size == off) {
		(*v)[*n - 1]->size += len;
		return 0;
	}
	nv = realloc(*v, (*n + 1) * sizeof(*nv));
	x = malloc(sizeof(*x));
	if (nv)
		*v = nv;
	if (!nv || !x) {
		free(x);
		return -ENOMEM;
	}
	cuip__carrier_extent__init(x);
	x->file = file;
	x->offset = off;
	x->size = len;
	nv[(*n)++] = x;
	return 0;
}

static void free_extents(Cuip__CarrierExtent **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		protobuf_c_message_free_unpacked(&v[i]->base, NULL);
	free(v);
}

/*
 * Entry e of topology t, whose inherited chunks are those of pe (in the
 * parent's flattened topology pt, directory dir): its extents rewritten to
 * name, chunk by chunk, the file that holds the bytes (fl).
 */
static int flatten_entry(const char *tname, const Cuip__Topology *t, Cuip__CarrierEntry *e, const char *dir,
			 const Cuip__Topology *pt, const Cuip__CarrierEntry *pe, struct files *fl, char *err,
			 size_t errlen)
{
	Cuip__CarrierExtent **v = NULL;
	uint64_t chunks = (e->size + e->chunk_size - 1) / e->chunk_size;
	uint32_t *stored = NULL;
	size_t n = 0;
	int ret = 0;

	/* Compressed chunks keep their lengths: the parent's where inherited. */
	if (e->n_stored || (pe && pe->n_stored)) {
		stored = calloc(chunks ? chunks : 1, sizeof(*stored));
		if (!stored) {
			errfmt(err, errlen, "%s: out of memory following the parent checkpoint", tname);
			return -ENOMEM;
		}
	}
	for (uint64_t k = 0; stored && k < chunks; k++) {
		const Cuip__CarrierEntry *from = inherits(e, k) ? pe : e;

		stored[k] = k < from->n_stored ? from->stored[k] : 0;
	}
	for (uint64_t k = 0, pos = 0; !ret && pos < e->size; k++, pos += e->chunk_size) {
		bool par = inherits(e, k);
		const char *f;
		uint64_t foff, run, len = e->size - pos < e->chunk_size ? e->size - pos : e->chunk_size;
		int ix;

		if (par && (!same_chunk(e, pe, chunks, k) || e->crc32c[k] != pe->crc32c[k])) {
			errfmt(err, errlen,
			       "%s: allocation %llx:%llu chunk %llu is inherited, but the parent checkpoint %s holds "
			       "other bytes there (changed parent)",
			       tname, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)k, dir);
			ret = -ESTALE;
			break;
		}
		ret = par ? cuip_entry_locate(pt, pe, pos, &f, &foff, &run)
			  : cuip_entry_locate(t, e, pos, &f, &foff, &run);
		if (ret || !f || run < len) {
			errfmt(err, errlen, "%s: allocation %llx:%llu chunk %llu lies in no file of the %s", tname,
			       (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial,
			       (unsigned long long)k, par ? "parent checkpoint" : "index");
			ret = -EBADMSG;
			break;
		}
		ix = file_index(fl, par ? dir : NULL, f);
		if (ix == -ENAMETOOLONG || ix == -ENOMEM) {
			errfmt(err, errlen,
			       ix == -ENOMEM ? "%s: out of memory naming %s in the parent chain"
					     : "%s: the path of %s in the parent chain is too long",
			       tname, f);
			ret = ix;
			break;
		}
		if (ix < 0) {
			errfmt(err, errlen,
			       "%s: the checkpoint and its parents spread pid %d's carrier over more than %d files",
			       tname, (int)t->state->self->pid, CUIP_CARRIER_FILES_MAX);
			ret = ix;
			break;
		}
		ret = add_extent(&v, &n, (uint32_t)ix, foff, len);
	}
	if (ret) {
		free_extents(v, n);
		free(stored);
		return ret;
	}
	free_extents(e->extents, e->n_extents);
	e->extents = v;
	e->n_extents = n;
	if (stored) {
		free(e->stored);
		e->stored = stored;
		e->n_stored = chunks;
	}
	return 0;
}

/* Topology t (of a checkpoint whose parent, in dir, is par): every
 * inherited chunk's extent names the ancestor file that holds it. */
static int flatten_topology(const char *tname, Cuip__Topology *t, const char *dir, const struct cuip_ckpt *par,
			    char *err, size_t errlen)
{
	struct files fl = {.n = 0};
	char own[64];
	bool any = false;
	int ret = 0;

	for (size_t i = 0; i < t->n_carriers; i++)
		any |= entry_inherits(t->carriers[i]);
	if (!any)
		return 0;
	for (size_t k = 0; k < t->n_carrier_files && !ret; k++)
		ret = file_index(&fl, NULL, t->carrier_files[k]) < 0 ? -ENOMEM : 0;
	cuip_carrier_name(t->state->self->pid, own, sizeof(own));
	if (!ret && !t->n_carrier_files)
		ret = file_index(&fl, NULL, own) < 0 ? -ENOMEM : 0;
	for (size_t i = 0; i < t->n_carriers && !ret; i++) {
		Cuip__CarrierEntry *e = t->carriers[i];
		const Cuip__Topology *pt = NULL;
		const Cuip__CarrierEntry *pe;
		size_t pk = 0;
		uint64_t chunks;

		/* cuinterpose show flattens topologies no reader checked. */
		if (!e->alloc || !e->chunk_size || e->n_crc32c != (e->size + e->chunk_size - 1) / e->chunk_size) {
			errfmt(err, errlen, "%s: carrier entry %zu has no allocation, chunk size or checksum per chunk",
			       tname, i);
			ret = -EBADMSG;
			break;
		}
		chunks = (e->size + e->chunk_size - 1) / e->chunk_size;
		pe = entry_inherits(e) ? parent_entry(par, e, &pt, &pk) : NULL;
		if (entry_inherits(e) && (e->inherited.len != (chunks + 7) / 8 || !has_ident(e, chunks))) {
			errfmt(err, errlen,
			       "%s: carrier entry %zu inherits chunks but has %zu SHA-256, %zu device hash and %zu "
			       "bitmap bytes for %llu chunks",
			       tname, i, e->sha256.len, e->dhash.len, e->inherited.len, (unsigned long long)chunks);
			ret = -EBADMSG;
		} else if (entry_inherits(e) && (!pe || pe->size != e->size || pe->chunk_size != e->chunk_size ||
						 !idents_comparable(e, pe, chunks))) {
			errfmt(err, errlen,
			       "%s: allocation %llx:%llu inherits chunks from the parent checkpoint %s, which holds no "
			       "such chunks (no such allocation, another size or chunk size, or no hashes): changed "
			       "parent",
			       tname, (unsigned long long)e->alloc->creator, (unsigned long long)e->alloc->serial, dir);
			ret = -ESTALE;
		} else if (!(ret = cuip_entry_check_stored(tname, e, i, err, errlen)) &&
			   !(ret = pe ? check_parent_stored(dir, pt, pe, pk, err, errlen) : 0)) {
			/* Checked first: the flattened entry has one stored length per chunk. */
			ret = flatten_entry(tname, t, e, dir, pt, pe, &fl, err, errlen);
		}
	}
	if (!ret) {
		for (size_t k = 0; k < t->n_carrier_files; k++)
			free(t->carrier_files[k]);
		free(t->carrier_files);
		t->carrier_files = malloc(fl.n * sizeof(char *));
		if (!t->carrier_files) {
			t->n_carrier_files = 0;
			ret = -ENOMEM;
		} else {
			memcpy(t->carrier_files, fl.name, fl.n * sizeof(char *));
			t->n_carrier_files = fl.n;
			fl.n = 0;
		}
	}
	for (size_t k = 0; k < fl.n; k++)
		free(fl.name[k]);
	if (ret == -ENOMEM)
		errfmt(err, errlen, "%s: out of memory following the parent checkpoint", tname);
	return ret;
}

static int read_chain(int dirfd, struct cuip_ckpt *c, unsigned depth, char *err, size_t errlen);

int cuip_images_flatten(const Cuip__Topology *t, const char *parent_dir, const struct cuip_ckpt *parent,
			Cuip__Topology **out, char *err, size_t errlen)
{
	size_t len = cuip__topology__get_packed_size(t);
	uint8_t *buf = malloc(len ? len : 1);
	Cuip__Topology *c;
	char name[64];
	int ret;

	*out = NULL;
	if (!buf) {
		errfmt(err, errlen, "out of memory copying a topology");
		return -ENOMEM;
	}
	cuip__topology__pack(t, buf);
	c = cuip__topology__unpack(NULL, len, buf);
	free(buf);
	if (!c) {
		errfmt(err, errlen, "out of memory copying a topology");
		return -ENOMEM;
	}
	snprintf(name, sizeof(name), CUIP_TOPOLOGY_FMT, t->state->self->pid);
	ret = flatten_topology(name, c, parent_dir, parent, err, errlen);
	if (ret) {
		cuip__topology__free_unpacked(c, NULL);
		return ret;
	}
	*out = c;
	return 0;
}

/* The parent of checkpoint c, read (and itself flattened), then c's
 * topologies flattened onto it. */
/* Append s to out at *o; false when it does not fit. */
static bool append(char *out, size_t len, size_t *o, const char *s, size_t n)
{
	if (*o + n + 1 > len)
		return false;
	memcpy(out + *o, s, n);
	*o += n;
	out[*o] = 0;
	return true;
}

bool cuip_path_relative(const char *from, const char *to, char *out, size_t len)
{
	size_t common = 0, o = 0;
	const char *p, *rest;

	if (!len)
		return false;
	out[0] = 0;
	/* The longest shared prefix that ends at a component boundary. */
	for (size_t i = 0;; i++) {
		if ((from[i] == 0 || from[i] == '/') && (to[i] == 0 || to[i] == '/'))
			common = i;
		if (!from[i] || !to[i] || from[i] != to[i])
			break;
	}
	/* ".." for each component of `from` past it, then the rest of `to`. */
	for (p = from + common; *p;) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		if (!append(out, len, &o, o ? "/.." : "..", o ? 3 : 2))
			return false;
		while (*p && *p != '/')
			p++;
	}
	for (rest = to + common; *rest == '/'; rest++)
		;
	if (*rest && ((o && !append(out, len, &o, "/", 1)) || !append(out, len, &o, rest, strlen(rest))))
		return false;
	return o ? true : append(out, len, &o, ".", 1);
}

/* Whether the directory fd holds the checkpoint whose id is `id`. */
static bool holds_ckpt(int fd, const ProtobufCBinaryData *id)
{
	ProtobufCMessage *m = NULL;
	char why[256];
	bool same;

	if (cuip_image_read(fd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor, NULL, &m, why,
			    sizeof(why)))
		return false;
	same = same_ckpt(&((Cuip__Inventory *)m)->checkpoint_id, id);
	protobuf_c_message_free_unpacked(m, NULL);
	return same;
}

int cuip_images_open_parent(int dirfd, const Cuip__Inventory *inv, const char **via)
{
	const char *rel = inv->parent_relative && inv->parent_relative[0] && inv->parent_relative[0] != '/'
				  ? inv->parent_relative
				  : NULL;
	int rfd = rel ? openat(dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1, fd;

	/* The relative path first (a chain moved as a whole), when it leads
	 * to the checkpoint recorded; else the absolute path, whatever it
	 * holds (the reader judges it); else the relative one's directory. */
	if (rfd >= 0 && holds_ckpt(rfd, &inv->parent_checkpoint_id)) {
		*via = rel;
		return rfd;
	}
	fd = open(inv->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && rfd >= 0) {
		*via = rel;
		return rfd;
	}
	if (rfd >= 0)
		close(rfd);
	*via = inv->parent;
	return fd >= 0 ? fd : -errno;
}

/*
 * The parent of the checkpoint whose inventory is inv (in dirfd), read with
 * its own chain at depth, from the directory cuip_images_open_parent
 * chooses (one per level: a chain is read in linear time). Messages name
 * the directory at fault as it was reached.
 */
static int read_parent_at(int dirfd, const Cuip__Inventory *inv, unsigned depth, struct cuip_ckpt *par,
			  const char **via, char *err, size_t errlen)
{
	const char *rel = inv->parent_relative;
	char why[768];
	int pfd, ret;

	if (inv->parent[0] != '/' || inv->parent_checkpoint_id.len != 16) {
		errfmt(err, errlen, "%s: parent checkpoint \"%s\" is not an absolute directory with a checkpoint id",
		       CUIP_INVENTORY_IMG, inv->parent);
		return -EBADMSG;
	}
	if (depth >= CUIP_CHAIN_MAX) {
		errfmt(err, errlen, "%s: more than %d checkpoints in the parent chain (a loop?)", inv->parent,
		       CUIP_CHAIN_MAX);
		return -ELOOP;
	}
	pfd = cuip_images_open_parent(dirfd, inv, via);
	if (pfd < 0) {
		errfmt(err, errlen, "the parent checkpoint %s of this incremental checkpoint is %s%s%s%s", inv->parent,
		       pfd == -ENOENT ? "missing" : strerror(-pfd), rel ? " (nor is it at " : "", rel ? rel : "",
		       rel ? " from here)" : "");
		return -ESTALE;
	}
	ret = read_chain(pfd, par, depth + 1, why, sizeof(why));
	close(pfd);
	if (ret == -ESTALE || ret == -ELOOP) { /* a link further down: its message names it */
		errfmt(err, errlen, "%s", why);
		return ret;
	}
	if (ret) {
		errfmt(err, errlen, "the parent checkpoint %s cannot be read: %s", *via,
		       ret == -ENOENT ? "it holds no cuinterpose inventory" : why);
		return -ESTALE;
	}
	if (!same_ckpt(&par->inv->checkpoint_id, &inv->parent_checkpoint_id)) {
		errfmt(err, errlen,
		       "the parent checkpoint %s is not the one this checkpoint was made against (another dump was "
		       "written there since: changed parent)",
		       *via);
		cuip_images_free(par);
		return -ESTALE;
	}
	return 0;
}

int cuip_images_read_parent(int dirfd, const Cuip__Inventory *inv, struct cuip_ckpt *par, const char **via, char *err,
			    size_t errlen)
{
	return read_parent_at(dirfd, inv, 0, par, via, err, errlen);
}

/* The parent of checkpoint c (in dirfd), read (and itself flattened), then
 * c's topologies flattened onto it. */
static int follow_parent(struct cuip_ckpt *c, int dirfd, unsigned depth, char *err, size_t errlen)
{
	struct cuip_ckpt par;
	const char *via;
	int ret = read_parent_at(dirfd, c->inv, depth, &par, &via, err, errlen);

	if (ret)
		return ret;
	for (size_t i = 0; i < c->n && !ret; i++) {
		char name[64];

		snprintf(name, sizeof(name), CUIP_TOPOLOGY_FMT, c->topo[i]->state->self->pid);
		ret = flatten_topology(name, c->topo[i], via, &par, err, errlen);
	}
	c->depth = par.depth + 1;
	cuip_images_free(&par);
	return ret;
}

static int read_chain(int dirfd, struct cuip_ckpt *c, unsigned depth, char *err, size_t errlen)
{
	int ret = read_one(dirfd, c, err, errlen);

	if (ret || !c->inv->parent)
		return ret;
	ret = follow_parent(c, dirfd, depth, err, errlen);
	if (ret)
		cuip_images_free(c);
	return ret;
}

int cuip_images_read(int dirfd, struct cuip_ckpt *c, char *err, size_t errlen)
{
	return read_chain(dirfd, c, 0, err, errlen);
}

/*
 * Verifying the carriers: every chunk of every entry is one unit, taken in
 * turn by up to VERIFY_THREADS threads (the reads and checksums of a large
 * carrier run at the machine's parallel read speed, not one thread's). The
 * failure reported is the one of the lowest unit, as a single pass in order
 * would report it: a thread stops at units above the lowest failure seen.
 */
#define VERIFY_THREADS 16

struct vunit {
	uint32_t topo, entry;
	uint64_t chunk;
};

#define VERIFY_BLOCK (1u << 20) /* bytes each verification thread reads at a time */

struct verify {
	int dirfd;
	const struct cuip_ckpt *c;
	const struct vunit *units;
	size_t nunits;
	pthread_mutex_t mu;
	size_t next;   /* next unit to take */
	size_t failed; /* lowest failing unit, nunits: none */
	int ret;       /* its status */
	char err[512]; /* its message */
};

static void verify_fail(struct verify *v, size_t u, int ret, const char *msg)
{
	pthread_mutex_lock(&v->mu);
	if (u < v->failed) {
		v->failed = u;
		v->ret = ret;
		snprintf(v->err, sizeof(v->err), "%s", msg);
	}
	pthread_mutex_unlock(&v->mu);
}

/* A verification thread's buffers: buf (VERIFY_BLOCK bytes) for raw
 * chunks; for compressed ones, a chunk and its frame (zbuf, grown to
 * need) and a decompressing context. */
struct vbufs {
	uint8_t *buf;
	uint8_t *zbuf;
	size_t zcap;
	void *dws;
	void *dctx;
};

/* Check compressed chunk ch (len bytes, stored in z at foff of fd). */
static int verify_frame(struct vbufs *b, int fd, const char *f, uint64_t foff, size_t len, uint32_t z, uint32_t want,
			const Cuip__CarrierEntry *e, size_t ch, char *msg, size_t msglen)
{
	unsigned long long cr = e->alloc->creator, se = e->alloc->serial;
	uint64_t got;
	int ret;

	if (len + z > b->zcap) {
		uint8_t *nb = realloc(b->zbuf, len + z);

		if (!nb) {
			errfmt(msg, msglen, "out of memory for a %zu-byte compressed chunk", len);
			return -ENOMEM;
		}
		b->zbuf = nb;
		b->zcap = len + z;
	}
	if (!b->dctx) {
		b->dws = malloc(cuip_zchunk_dctx_size());
		b->dctx = b->dws ? cuip_zchunk_dctx(b->dws, cuip_zchunk_dctx_size()) : NULL;
		if (!b->dctx) {
			errfmt(msg, msglen, "out of memory for a decompressing context");
			return -ENOMEM;
		}
	}
	ret = cuip_zchunk_read(fd, foff, len, z, b->zbuf, b->zbuf + len, b->dctx, &got);
	if (ret == -ENODATA || (ret && ret != -EBADMSG)) {
		errfmt(msg, msglen, "%s: %s at byte %llu (allocation %llx:%llu chunk %zu)", f,
		       ret == -ENODATA ? "truncated" : strerror(-ret), (unsigned long long)(foff + got), cr, se, ch);
		return ret;
	}
	if (ret || cuip_crc32c(0, b->zbuf, len) != want) {
		errfmt(msg, msglen,
		       "%s: corrupt: %s in chunk %zu (bytes %llu..%llu, stored compressed in %u) of allocation "
		       "%llx:%llu",
		       f, ret ? "a frame that does not decompress" : "checksum mismatch", ch, (unsigned long long)foff,
		       (unsigned long long)(foff + z), z, cr, se);
		return -EBADMSG;
	}
	return 0;
}

/* Check one chunk: 0, or a negative errno with msg filled. */
static int verify_unit(struct verify *v, const struct vunit *w, struct vbufs *b, const char **open_name, int *fd,
		       char *msg, size_t msglen)
{
	const Cuip__Topology *t = v->c->topo[w->topo];
	const Cuip__CarrierEntry *e = t->carriers[w->entry];
	uint64_t off = w->chunk * e->chunk_size, foff, run;
	size_t len = (size_t)(e->size - off < e->chunk_size ? e->size - off : e->chunk_size);
	unsigned long long cr = e->alloc->creator, se = e->alloc->serial;
	size_t ch = (size_t)w->chunk;
	const char *f;
	ssize_t got = 0;
	uint32_t c = 0;

	/* Chunks never straddle extents (checked at read). */
	if (cuip_entry_locate(t, e, off, &f, &foff, &run) || run < len) {
		errfmt(msg, msglen, "carrier entry of allocation %llx:%llu: no extent for chunk %zu", cr, se, ch);
		return -EBADMSG;
	}
	if (!*open_name || strcmp(*open_name, f)) {
		if (*fd >= 0)
			close(*fd);
		*open_name = f;
		*fd = openat(v->dirfd, f, O_RDONLY | O_CLOEXEC);
		if (*fd < 0) {
			int ret = -errno;

			*open_name = NULL;
			errfmt(msg, msglen, "%s: %s (allocation %llx:%llu chunk %zu)", f, strerror(-ret), cr, se, ch);
			return ret;
		}
	}
	if (ch < e->n_stored && e->stored[ch]) {
		if (!cuip_zchunk_stored_ok(e->stored[ch], len)) {
			errfmt(msg, msglen,
			       "carrier entry of allocation %llx:%llu stores chunk %zu in %u bytes of its %zu", cr, se,
			       ch, e->stored[ch], len);
			return -EBADMSG;
		}
		return verify_frame(b, *fd, f, foff, len, e->stored[ch], e->crc32c[ch], e, ch, msg, msglen);
	}
	/* In blocks of VERIFY_BLOCK whatever the chunk size (the image's own,
	 * up to 4 GiB): the threads' buffers stay small. */
	for (size_t done = 0; done < len; done += (size_t)got) {
		size_t want = len - done < VERIFY_BLOCK ? len - done : VERIFY_BLOCK;
		uint8_t *buf = b->buf;

		got = pread(*fd, buf, want, (off_t)(foff + done));
		if (got < 0 && errno == EINTR) {
			got = 0;
			continue;
		}
		if (got <= 0) {
			errfmt(msg, msglen, "%s: truncated at byte %llu (allocation %llx:%llu chunk %zu)", f,
			       (unsigned long long)foff, cr, se, ch);
			return -ENODATA;
		}
		c = cuip_crc32c(c, buf, (size_t)got);
	}
	if (c != e->crc32c[ch]) {
		errfmt(msg, msglen,
		       "%s: corrupt: checksum mismatch in chunk %zu (bytes %llu..%llu) of allocation %llx:%llu", f, ch,
		       (unsigned long long)foff, (unsigned long long)(foff + len), cr, se);
		return -EBADMSG;
	}
	return 0;
}

static void *verify_main(void *arg)
{
	struct verify *v = arg;
	struct vbufs b = {.buf = malloc(VERIFY_BLOCK)};
	const char *open_name = NULL;
	char msg[512];
	int fd = -1;

	for (;;) {
		size_t u;
		int ret;

		pthread_mutex_lock(&v->mu);
		u = v->next++;
		if (u >= v->failed || u >= v->nunits) {
			pthread_mutex_unlock(&v->mu);
			break;
		}
		pthread_mutex_unlock(&v->mu);
		if (!b.buf) {
			verify_fail(v, u, -ENOMEM, "out of memory for a verification buffer");
			break;
		}
		ret = verify_unit(v, &v->units[u], &b, &open_name, &fd, msg, sizeof(msg));
		if (ret)
			verify_fail(v, u, ret, msg);
	}
	if (fd >= 0)
		close(fd);
	free(b.buf);
	free(b.zbuf);
	free(b.dws);
	return NULL;
}

int cuip_images_verify_carriers(int dirfd, const struct cuip_ckpt *c, char *err, size_t errlen)
{
	struct verify v = {.dirfd = dirfd, .c = c, .mu = PTHREAD_MUTEX_INITIALIZER};
	pthread_t th[VERIFY_THREADS];
	struct vunit *units;
	size_t n = 0, u = 0, nthreads = 0;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	for (size_t i = 0; i < c->n; i++)
		for (size_t k = 0; k < c->topo[i]->n_carriers; k++) {
			const Cuip__CarrierEntry *e = c->topo[i]->carriers[k];

			n += e->n_crc32c;
		}
	if (!n)
		return 0;
	units = calloc(n, sizeof(*units));
	if (!units) {
		errfmt(err, errlen, "out of memory verifying %zu carrier chunks", n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < c->n; i++)
		for (size_t k = 0; k < c->topo[i]->n_carriers; k++)
			for (size_t ch = 0; ch < c->topo[i]->carriers[k]->n_crc32c; ch++)
				units[u++] = (struct vunit){.topo = (uint32_t)i, .entry = (uint32_t)k, .chunk = ch};
	v.units = units;
	v.nunits = n;
	v.failed = n;
	/* The calling thread works too; helpers only where there is work, with
	 * every signal blocked (they run inside criu, whose handlers are not
	 * theirs to run). */
	for (size_t want = cpus > 1 ? (size_t)cpus : 1;
	     nthreads + 1 < want && nthreads + 1 < VERIFY_THREADS && nthreads + 1 < n; nthreads++)
		if (cuip_thread_create(&th[nthreads], NULL, verify_main, &v))
			break;
	verify_main(&v);
	for (size_t i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	free(units);
	if (v.failed < n)
		errfmt(err, errlen, "%s", v.err);
	return v.failed < n ? v.ret : 0;
}

int cuip_images_match(const struct cuip_ckpt *c, const pid_t *vpids, size_t n, char *err, size_t errlen)
{
	for (size_t i = 0; i < c->n; i++) {
		int found = 0;
		for (size_t k = 0; k < n; k++)
			if (vpids[k] == c->inv->participants[i]->pid)
				found = 1;
		if (!found) {
			errfmt(err, errlen,
			       "checkpointed participant pid %d is not among the restored processes running the "
			       "interposer",
			       c->inv->participants[i]->pid);
			return -ESRCH;
		}
	}
	for (size_t k = 0; k < n; k++) {
		int found = 0;
		for (size_t i = 0; i < c->n; i++)
			if (vpids[k] == c->inv->participants[i]->pid)
				found = 1;
		if (!found) {
			errfmt(err, errlen,
			       "restored pid %d runs the interposer but was not a participant of the "
			       "checkpoint (images from another dump?)",
			       vpids[k]);
			return -EEXIST;
		}
	}
	return 0;
}
