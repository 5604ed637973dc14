/*
 * stripe.c - striping a carrier over several files, and the index's form
 * of the extents. Contract in carrier.h; called by the interposer's SAVE
 * and LOAD (interposer/checkpoint/carry.c) and by the tests.
 *
 * Striping (carrier_save_striped/_load_striped) sits on top: a pure split
 * (carrier_stripe_split) cuts each item into extents of whole chunks and
 * gives each to the least-filled file; the extents are items of their own
 * for the pipeline (carrier.c), with crc pointing into their item's array and
 * name_offset keeping chunk numbers in messages those of the allocation.
 * Staging is sized to need: at most the bytes carried (or two chunks).
 *
 * No state of its own: the extents' arrays belong to the call that made
 * them (one mapping, unmapped before it returns, or the caller's items'
 * ext arrays, freed by carrier_items_free_extents()).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "carrier.h"
#include "errfmt.h"
#include "xfer.h"

/* ---- striping ----------------------------------------------------------- */

uint64_t carrier_stripe_unit(uint64_t total, size_t nfiles, uint32_t chunk_size)
{
	uint64_t c = chunk_size ? chunk_size : DEFAULT_CHUNK, u;

	if (nfiles < 1)
		nfiles = 1;
	/* Four extents per file balance the files within a quarter of a
	 * share; bigger extents only make the index shorter. */
	u = total / nfiles / 4;
	if (u > CARRIER_STRIPE_MAX)
		u = CARRIER_STRIPE_MAX;
	u = (u + c - 1) / c * c;
	return u ? u : c;
}

/* Extent size for item it: unit in whole chunks of it. */
static uint64_t item_unit(const struct carrier_item *it, uint64_t unit)
{
	return (unit + it->chunk_size - 1) / it->chunk_size * it->chunk_size;
}

size_t carrier_stripe_count(const struct carrier_item *items, size_t n, uint64_t unit)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t u = items[i].chunk_size && unit ? item_unit(&items[i], unit) : 0;

		k += !u || items[i].size <= u ? 1 : (size_t)((items[i].size + u - 1) / u);
	}
	return k;
}

int carrier_stripe_split(const struct carrier_item *items, size_t n, size_t nfiles, uint64_t unit,
			 struct carrier_item *out, size_t nout, size_t *parent)
{
	uint64_t load[CARRIER_FILES_MAX] = {0};
	size_t j = 0;

	if (!nfiles || nfiles > CARRIER_FILES_MAX || !unit || nout < carrier_stripe_count(items, n, unit))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t u, off = 0;

		if (!it->chunk_size || (it->crc && it->ncrc < carrier_nchunks(it->size, it->chunk_size)))
			return -EINVAL;
		u = item_unit(it, unit);
		do {
			struct carrier_item *e = &out[j];
			uint64_t len = it->size - off < u ? it->size - off : u;
			size_t f = 0;

			for (size_t k = 1; k < nfiles; k++)
				if (load[k] < load[f])
					f = k;
			load[f] += len;
			*e = (struct carrier_item){.va = it->va + off,
						   .size = len,
						   .ctx = it->ctx,
						   .name = it->name,
						   .chunk_size = it->chunk_size,
						   .file = (unsigned)f,
						   .crc = it->crc ? it->crc + off / it->chunk_size : NULL,
						   .ncrc = carrier_nchunks(len, it->chunk_size),
						   .name_offset = it->name_offset + off};
			if (it->sha)
				e->sha = it->sha + off / it->chunk_size * CARRIER_HASH_LEN;
			if (it->inherited)
				e->inherited = it->inherited + off / it->chunk_size;
			if (it->stored)
				e->stored = it->stored + off / it->chunk_size;
			if (it->zero)
				e->zero = it->zero + off / it->chunk_size;
			if (it->dhash)
				e->dhash = it->dhash + off / it->chunk_size * CARRIER_DHASH_LEN;
			e->dhash_key[0] = it->dhash_key[0];
			e->dhash_key[1] = it->dhash_key[1];
			if ((it->parent_sha || it->parent_dhash) && off / it->chunk_size < it->n_parent_sha) {
				if (it->parent_sha)
					e->parent_sha = it->parent_sha + off / it->chunk_size * CARRIER_HASH_LEN;
				if (it->parent_dhash)
					e->parent_dhash = it->parent_dhash + off / it->chunk_size * CARRIER_DHASH_LEN;
				if (it->parent_crc)
					e->parent_crc = it->parent_crc + off / it->chunk_size;
				e->n_parent_sha = it->n_parent_sha - off / it->chunk_size;
			}
			if (parent)
				parent[j] = i;
			j++;
			off += len;
		} while (off < it->size);
	}
	assert(j == carrier_stripe_count(items, n, unit));
	return 0;
}

void carrier_items_free_extents(struct carrier_item *items, size_t n)
{
	for (size_t i = 0; items && i < n; i++) {
		free(items[i].ext);
		items[i].ext = NULL;
		items[i].next = 0;
	}
}

/* The extents' item arrays live in one mapping: a load runs while the
 * application's threads are frozen, maybe inside malloc. */
static void *map_array(size_t count, size_t size, size_t *len)
{
	void *p;

	*len = (count ? count : 1) * size;
	p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

int carrier_save_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 uint64_t offset, struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen)
{
	struct carrier_config envcfg;
	struct carrier_item *sub;
	size_t *parent, nsub, len_sub, len_par;
	uint64_t total = 0, unit;
	uint32_t chunk = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		items[i].ext = NULL;
		items[i].next = 0;
	}
	if (nfds <= 1 || !items)
		return carrier_save_files(ops, cfg, fds, nfds, offset, items, n, stats, err, errlen);
	if (stats)
		memset(stats, 0, sizeof(*stats));
	for (size_t i = 0; i < n; i++)
		items[i].file = 0;
	rc = carrier_check_args("save", ops, &cfg, &envcfg, fds, nfds, items, n, false, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!items[i].chunk_size)
			items[i].chunk_size = cfg->chunk_size;
		if (items[i].chunk_size > chunk)
			chunk = items[i].chunk_size;
		total += items[i].size;
	}
	rc = carrier_check_items("save", items, n, false, err, errlen);
	if (rc)
		return rc;
	unit = carrier_stripe_unit(total, nfds, chunk);
	nsub = carrier_stripe_count(items, n, unit);
	sub = map_array(nsub, sizeof(*sub), &len_sub);
	parent = map_array(nsub, sizeof(*parent), &len_par);
	if (!sub || !parent) {
		errfmt(err, errlen, "carrier save: cannot map %zu extents: %s", nsub, strerror(errno));
		rc = -ENOMEM;
		goto out;
	}
	rc = carrier_stripe_split(items, n, nfds, unit, sub, nsub, parent);
	assert(!rc); /* arguments checked above */
	rc = carrier_save_files(ops, cfg, fds, nfds, offset, sub, nsub, stats, err, errlen);
	if (rc)
		goto out;
	for (size_t j = 0; j < nsub; j++) {
		struct carrier_item *it = &items[parent[j]];

		if (!it->ext) {
			size_t k = carrier_stripe_count(it, 1, unit);

			it->ext = calloc(k, sizeof(*it->ext));
			if (!it->ext) {
				errfmt(err, errlen, "carrier save: out of memory for the extents of %zu items", n);
				rc = -ENOMEM;
				goto out;
			}
			it->offset = sub[j].offset;
			it->file = sub[j].file;
			it->ncrc = carrier_nchunks(it->size, it->chunk_size);
		}
		it->ext[it->next++] =
			(struct carrier_extent){.file = sub[j].file, .offset = sub[j].offset, .size = sub[j].size};
	}
out:
	if (sub)
		munmap(sub, len_sub);
	if (parent)
		munmap(parent, len_par);
	return rc;
}

int carrier_load_striped(const struct carrier_ops *ops, const struct carrier_config *cfg, const int *fds, size_t nfds,
			 const struct carrier_item *items, size_t n, struct carrier_stats *stats, char *err,
			 size_t errlen)
{
	struct carrier_item *sub;
	size_t nsub = 0, len_sub, j = 0;
	bool striped = false;
	int rc;

	if (stats)
		memset(stats, 0, sizeof(*stats));
	for (size_t i = 0; i < n && items; i++) {
		nsub += items[i].ext ? items[i].next : 1;
		striped = striped || items[i].ext;
	}
	if (!striped)
		return carrier_load_files(ops, cfg, fds, nfds, items, n, stats, err, errlen);
	sub = map_array(nsub, sizeof(*sub), &len_sub);
	if (!sub) {
		errfmt(err, errlen, "carrier load: cannot map %zu extents: %s", nsub, strerror(errno));
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const struct carrier_item *it = &items[i];
		uint64_t off = 0;
		char nb[32];

		if (!it->ext) {
			sub[j++] = *it;
			continue;
		}
		for (size_t k = 0; k < it->next; k++) {
			const struct carrier_extent *e = &it->ext[k];
			const char *why = NULL;

			if (!it->chunk_size)
				why = "has no chunk size";
			else if (e->file >= nfds)
				why = "names a file beyond the carrier files";
			else if (e->size > it->size - off || (!e->size && it->size))
				why = "runs past the item's size";
			else if (k + 1 < it->next && e->size % it->chunk_size)
				why = "splits a chunk";
			else if (it->crc && it->ncrc < carrier_nchunks(off + e->size, it->chunk_size))
				why = "has no checksums";
			if (why) {
				errfmt(err, errlen,
				       "carrier load: %s: extent %zu (file %u, %" PRIu64 " bytes at offset %" PRIu64
				       ") %s (corrupt carrier index)",
				       carrier_item_name(it, i, nb, sizeof(nb)), k, e->file, e->size, e->offset, why);
				rc = -EINVAL;
				goto out;
			}
			sub[j] = (struct carrier_item){.va = it->va + off,
						       .size = e->size,
						       .ctx = it->ctx,
						       .name = it->name,
						       .chunk_size = it->chunk_size,
						       .offset = e->offset,
						       .file = e->file,
						       .crc = it->crc ? it->crc + off / it->chunk_size : NULL,
						       .ncrc = carrier_nchunks(e->size, it->chunk_size),
						       .name_offset = it->name_offset + off,
						       .stored = it->stored ? it->stored + off / it->chunk_size : NULL,
						       .zero = it->zero ? it->zero + off / it->chunk_size : NULL};
			j++;
			off += e->size;
		}
		if (off != it->size) {
			errfmt(err, errlen,
			       "carrier load: %s: its %zu extents hold %" PRIu64 " bytes, the item %" PRIu64
			       " (corrupt carrier index)",
			       carrier_item_name(it, i, nb, sizeof(nb)), it->next, off, it->size);
			rc = -EINVAL;
			goto out;
		}
	}
	assert(j == nsub);
	rc = carrier_load_files(ops, cfg, fds, nfds, sub, nsub, stats, err, errlen);
out:
	munmap(sub, len_sub);
	return rc;
}

/* ---- the index's form of the extents -------------------------------------- */

int carrier_extents_to_entry(const struct carrier_item *it, Cuip__CarrierEntry *e, void *(*zalloc)(size_t))
{
	if (!it->ext)
		return 0;
	e->extents = zalloc(sizeof(*e->extents) * it->next);
	if (!e->extents)
		return -ENOMEM;
	for (size_t k = 0; k < it->next; k++) {
		Cuip__CarrierExtent *x = zalloc(sizeof(*x));

		if (!x)
			return -ENOMEM;
		cuip__carrier_extent__init(x);
		x->file = it->ext[k].file;
		x->offset = it->ext[k].offset;
		x->size = it->ext[k].size;
		e->extents[e->n_extents++] = x;
	}
	return 0;
}

int carrier_extents_from_entry(struct carrier_item *it, const Cuip__CarrierEntry *e)
{
	it->ext = NULL;
	it->next = 0;
	if (!e->n_extents)
		return 0;
	it->ext = calloc(e->n_extents, sizeof(*it->ext));
	if (!it->ext)
		return -ENOMEM;
	for (size_t k = 0; k < e->n_extents; k++)
		it->ext[k] = (struct carrier_extent){
			.file = e->extents[k]->file, .offset = e->extents[k]->offset, .size = e->extents[k]->size};
	it->next = e->n_extents;
	return 0;
}
