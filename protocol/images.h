/*
 * images.h - the plugin's files in CRIU's image directory, written by the
 * plugin at dump and read back by its restore and by `cuinterpose show`.
 *
 *   cuinterpose-inventory.img      Inventory: checkpoint id + participants
 *   cuinterpose-<pid>.img          Topology: one participant's state and
 *                                  the index of its carrier bytes
 *   cuinterpose-carrier-<pid>.img  raw shared bytes (written by the
 *                                  interposer into a file the plugin opened)
 *   cuinterpose-carrier-<pid>-<k>.img  further stripes of a striped carrier
 *                                  (k = 1..files-1; Topology.carrier_files)
 *
 * <pid> is the pid the participant sees for itself, which CRIU restores.
 * Reading validates everything before a restore touches any process:
 * framing (via wire.c), checkpoint ids, identities, carrier index against
 * the state, carrier file sizes and, optionally, every chunk checksum.
 * Stateless apart from the caller's struct cuip_ckpt.
 */
#ifndef CUIP_IMAGES_H
#define CUIP_IMAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

/* One participant as written at dump. */
struct cuip_img_proc {
	const Cuip__ProcessState *st; /* st->self->pid names the files */
	Cuip__CarrierEntry **carriers;
	size_t n_carriers;
	char **carrier_files; /* striped: the files in order; none: one file */
	size_t n_carrier_files;
};

/* An incremental checkpoint's parent: its directory (absolute), the same
 * relative to the checkpoint's own directory (NULL: none), and its id. */
struct cuip_img_parent {
	const char *dir;
	const char *rel;
	uint8_t id[16];
};

/* `to` (absolute) as seen from directory `from` (absolute): "../b" for
 * from /x/a, to /x/b. Both without trailing slashes or dot components (as
 * realpath() gives them). False when it does not fit in len. */
bool cuip_path_relative(const char *from, const char *to, char *out, size_t len);

/*
 * Open the parent directory of the checkpoint in dirfd whose inventory is
 * inv: its relative path when it leads to the checkpoint recorded (a chain
 * moved as a whole), else its absolute one (whatever it holds), else the
 * relative one's. Returns the descriptor and sets *via to the path the
 * parent's files are named by from dirfd (relative or absolute), or -errno
 * of the absolute path's open. Every reader of a chain (and the dump's
 * check that its directory is none of the chain's) goes through it.
 */
int cuip_images_open_parent(int dirfd, const Cuip__Inventory *inv, const char **via);

/* A checkpoint as read back; topo[i] belongs to inv->participants[i]. */
struct cuip_ckpt {
	Cuip__Inventory *inv;
	Cuip__Topology **topo;
	size_t n;
	uint64_t carried_bytes;
	unsigned depth; /* checkpoints below this one in its parent chain (0: a full one) */
};

/* Most checkpoints in one parent chain. */
#define CUIP_CHAIN_MAX 32

/*
 * 0, -ENOENT when there is no inventory (not a cuinterpose checkpoint),
 * or another negative errno with `err` naming the file and the problem.
 *
 * An incremental checkpoint (Inventory.parent) is read with its parent
 * chain and flattened: each entry's extents name, chunk by chunk, the file
 * that holds the bytes (its own or an ancestor's, by absolute path, listed
 * in the topology's carrier_files), so every reader (restore's LOAD,
 * verification, show) follows the chain without knowing of it. A parent
 * that is missing, unreadable, has another checkpoint id than the one
 * recorded, or holds other hashes for an inherited chunk is refused with
 * -ESTALE (-ELOOP: more than CUIP_CHAIN_MAX checkpoints in the chain), the
 * message naming the directory at fault, before anything is restored.
 */
int cuip_images_read(int dirfd, struct cuip_ckpt *c, char *err, size_t errlen);

/*
 * The parent checkpoint of inventory inv (of the checkpoint in dirfd), read
 * with its chain into *par (free with cuip_images_free), in the directory
 * cuip_images_open_parent chooses. *via: the path it was read at. 0, or -ESTALE
 * (missing, unreadable, another checkpoint: changed parent), -ELOOP or
 * -EBADMSG with err naming the directory at fault.
 */
int cuip_images_read_parent(int dirfd, const Cuip__Inventory *inv, struct cuip_ckpt *par, const char **via, char *err,
			    size_t errlen);

int cuip_images_write(int dirfd, const uint8_t ckpt_id[16], const struct cuip_img_proc *p, size_t n,
		      uint64_t carried_bytes, const struct cuip_img_parent *parent, char *err, size_t errlen);

/*
 * A copy of topology t (of an incremental checkpoint whose parent, read,
 * is `parent` in parent_dir) flattened as cuip_images_read does, for a
 * rollback that must load what a dump saved. *out is the caller's
 * (cuip__topology__free_unpacked).
 */
int cuip_images_flatten(const Cuip__Topology *t, const char *parent_dir, const struct cuip_ckpt *parent,
			Cuip__Topology **out, char *err, size_t errlen);

/* Read every carrier byte and compare chunk checksums, chunks in parallel
 * (up to 16 threads, joined before it returns); the failure reported is
 * the first in image order. */
int cuip_images_verify_carriers(int dirfd, const struct cuip_ckpt *c, char *err, size_t errlen);

/* The restored participants (self-view pids) must be exactly the
 * checkpointed set. */
int cuip_images_match(const struct cuip_ckpt *c, const pid_t *vpids, size_t n, char *err, size_t errlen);

void cuip_images_free(struct cuip_ckpt *c);

/* Carrier file name of a participant; stripe k > 0 of a striped carrier. */
void cuip_carrier_name(pid_t vpid, char *buf, size_t len);
void cuip_carrier_stripe_name(pid_t vpid, unsigned k, char *buf, size_t len);

/*
 * Where byte `pos` of a carrier entry lies: the file's name (*file), the
 * offset in it (*foff) and how many of the entry's bytes follow there
 * contiguously (*run). Reads the extents of a striped entry (their file
 * indexes name t->carrier_files), else `offset` of `file`. Returns 0, or
 * -EBADMSG when pos is past the entry or an extent names no file.
 */
int cuip_entry_locate(const Cuip__Topology *t, const Cuip__CarrierEntry *e, uint64_t pos, const char **file,
		      uint64_t *foff, uint64_t *run);

/*
 * Entry i of topology image tname: its stored lengths (compressed chunks,
 * zchunk.h) absent or one per chunk, each less than its chunk. 0, or
 * -EBADMSG with err filled. The image checks run it; cuinterpose show too.
 */
int cuip_entry_check_stored(const char *tname, const Cuip__CarrierEntry *e, size_t i, char *err, size_t errlen);

#endif /* CUIP_IMAGES_H */
