/*
 * coord.h - the group coordinator: drives every participant through the
 * checkpoint and rebuild phases over their control sockets.
 *
 * Each phase runs one thread per participant and ends with a barrier: the
 * next phase starts only when every participant has answered, and not at
 * all if one failed. Used by the CRIU hooks (hooks.c) and by unit tests
 * against fake participant servers. A group is used by one thread (the
 * hook) at a time; phase threads touch only their own participant, and a
 * data phase's monitor (monitor.c) only reads the participants' progress
 * and, on a stall, shuts down the connections still waiting for a reply.
 */
#ifndef CUIP_PLUGIN_COORD_H
#define CUIP_PLUGIN_COORD_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gphase.h"
#include "images.h"
#include "options.h"
#include "progress.h"
#include "wire.h"

struct cuip_part {
	pid_t pid;	     /* real pid (criu's view) */
	pid_t vpid;	     /* pid the participant sees for itself */
	char sock[PATH_MAX]; /* control socket, inside the participant's mount ns */
	int fd;		     /* connection, -1 when closed */

	/* dump */
	Cuip__Response *inspect;      /* owns st at dump */
	const Cuip__ProcessState *st; /* dump: inspected; restore: checkpointed */
	Cuip__Response *save;	      /* owns the carrier entries below */
	Cuip__CarrierEntry **carriers;
	size_t n_carriers;
	/* Incremental dump: the topology as a LOAD reads it (inherited chunks
	 * in the parent's files; cuip_images_flatten), owned; NULL: full. */
	Cuip__Topology *flat;
	/* striped carrier: its files in order (Topology.carrier_files); none
	 * with one file. Dump: names in carrier_names; restore: the topology's. */
	char *carrier_files[CUIP_CARRIER_FILES_MAX];
	size_t n_carrier_files;
	char carrier_names[CUIP_CARRIER_FILES_MAX][48];
	uint64_t expected_bytes; /* sum of the carried allocations */
	/* SAVE's progress page (protocol/progress.h): a memfd the plugin
	 * maps read-only and passes after the carrier files; the participant
	 * writes how far its SAVE is. Set before the SAVE phase starts and
	 * cleared after its monitor stopped (so the monitor reads it without
	 * a lock); NULL: none (no memfd, or not a SAVE). progress_fd is valid
	 * only with progress set. progress_sent: this SAVE request carried it. */
	const struct cuip_save_progress *progress;
	int progress_fd;
	bool progress_sent;
	bool quiesced; /* QUIESCE was sent: the gate may be closed */
	/* QUIESCE's reply: ms the participant worked before its gate closed
	 * (the job running; has_gate_after: the reply said). */
	bool has_gate_after;
	unsigned gate_after_ms;
	bool torn_down;	   /* multicast or unicast detached: rebuild needed */
	bool unicast_down; /* PREPARE_UNICAST was sent: LOAD and unicast stages too */
	int phase;	   /* Cuip__Phase from the last HANDSHAKE */
	bool loaded;	   /* rollback: found RESTORING, its LOAD already ran */

	/* result of the phase in progress */
	int status;
	char err[512];
	uint64_t bytes;
	size_t records;
};

struct cuip_group {
	struct cuip_part *p;
	size_t n;
	const struct cuip_opts *o;
	int imgdir; /* CRIU's image directory */
	uint8_t ckpt_id[16];
	uint64_t carried_bytes;
	bool images_written;
	bool rollback_failed; /* the last rollback could not reopen every gate */
	char err[1024];	      /* the first failure, for the caller's message */
	/* test hook: called after every phase barrier (cuip_gphase_name) */
	void (*after_phase)(struct cuip_group *g, enum cuip_gphase phase, int status);
	/*
	 * Progress hook (hooks.c: the guardian and fault injection): called
	 * before a phase starts (after = false; a nonzero return fails the
	 * phase with g->err set by the hook) and after its barrier.
	 */
	int (*on_phase)(struct cuip_group *g, enum cuip_gphase phase, bool after, int status);
	const char *client; /* HANDSHAKE client name; NULL: "plugin" */
	/* Incremental dump (CUINTERPOSE_PARENT): the parent checkpoint as read
	 * (its entries' hashes go with each SAVE) and what the images record
	 * of it; NULL: a full dump. */
	const struct cuip_ckpt *parent;
	const struct cuip_img_parent *parent_img;
};

/*
 * Dump: HANDSHAKE/INSPECT, PREFLIGHT, QUIESCE, PREPARE_MULTICAST, SAVE,
 * images, PREPARE_UNICAST, BYE. On failure the group is rolled back in
 * place (cuip_group_rollback) and the error returned; g->err says why.
 */
int cuip_group_dump(struct cuip_group *g);

/* Undo a (partial) dump on the running job: rebuild what was torn down from
 * what was saved, reopen every gate, close every connection. */
int cuip_group_rollback(struct cuip_group *g);

/*
 * Rebuild from checkpointed topologies (restore, or in place after a native
 * checkpoint): connect, LOAD, REBUILD CREATORS | IMPORTERS (| multicast
 * stages), VERIFY, RESUME, BYE. `topo[i]` belongs to g->p[i].
 */
int cuip_group_rebuild(struct cuip_group *g, const Cuip__Topology *const *topo);

/* BYE and close every open connection. */
void cuip_group_disconnect(struct cuip_group *g);

/* Release everything the dump kept (inspect/save replies). */
void cuip_group_free(struct cuip_group *g);

/* The topology of participant i as the dump saw it (for in-place rebuild);
 * fields point into the group. */
void cuip_group_topology(const struct cuip_group *g, size_t i, Cuip__Topology *t);

#endif /* CUIP_PLUGIN_COORD_H */
