/*
 * guardian.h - the process that owns the rollback when criu cannot.
 *
 * A dump that dies before its commit point (criu killed or crashed, or
 * stopped beyond CUINTERPOSE_GUARDIAN_STOP_MS) would leave the job gated
 * or natively checkpointed with nobody to bring it back. The guardian is a
 * double-forked, setsid() copy of criu started by the hooks at
 * PAUSE_DEVICES (dump) and init(RESTORE) (restore): not criu's
 * child, not traced by criu, never in the dumped tree. It holds a pidfd on
 * criu and a stream socket from it, over which criu reports progress: each
 * coordinator phase before it starts and after its barrier, with the
 * participants' flags, and their topologies (after INSPECT and SAVE), as
 * GuardianMessage frames of protocol/cuinterpose.proto (checked and
 * versioned by wire.c; one it cannot read ends the channel, logged, and
 * the guardian goes on watching criu's pidfd).
 *
 * Commit point (dump): the plugin's fini of a dump that succeeded without
 * --leave-running (CRIU kills the tasks next), or the end of the in-place
 * restore of a failed or --leave-running dump. Before it, if criu goes
 * away, the guardian thaws the freezer cgroup (--freeze-cgroup), restores
 * and unlocks what the driver reports locked or checkpointed, rebuilds the
 * sharing from what was saved and reopens every gate (coord.c's rollback),
 * then exits. Restore: until fini(RESTORE, 0), criu's death makes the
 * guardian SIGKILL the restored tree (images are only read: the next
 * attempt uses them as they are), from the first fork of the tree on:
 * criu killed while it forks and fills the tasks leaves them waiting in
 * CRIU's restorer for a criu that is gone, holding the job's pids. The
 * guardian, started before criu forks anything, knows the tree from the
 * images' pstree.img and kills only processes at those pids that started
 * after it and hang from the tree's root (or, restored in a new pid
 * namespace, that namespace's init), waits (10 s at most) until they are
 * gone, and logs each.
 *
 * What happened is logged to criu's log and to cuinterpose-guardian.log in
 * the image directory. State: one guardian per criu process, criu's main
 * thread only.
 */
#ifndef CUIP_PLUGIN_GUARDIAN_H
#define CUIP_PLUGIN_GUARDIAN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "coord.h"
#include "native.h"
#include "pstree.h"

#define CUIP_GUARDIAN_LOG  "cuinterpose-guardian.log"
#define CUIP_GUARDIAN_COMM "criu-cuip-guard"

/*
 * Dump: start the guardian for group g (participants found, not yet
 * connected) and the CUDA processes nat[0..n_nat). freeze_cgroup: CRIU's
 * --freeze-cgroup or NULL. 0, or -errno with err set (the dump must not go
 * on without it).
 */
int cuip_guardian_start_dump(struct cuip_group *g, struct cuip_native_proc *nat, size_t n_nat,
			     const char *freeze_cgroup, char *err, size_t errlen);

/* Restore, at init(RESTORE): guard the tree of the images (img, kept by
 * the caller until the end of the restore; kill what criu made of it if
 * criu dies before commit). 0, or -errno with err set. */
int cuip_guardian_start_restore(const struct cuip_pstree *img, int imgdir, char *err, size_t errlen);

/* Progress of the dump (coordinator phases, "native-lock", ...): 0, or
 * -EPIPE with g->err set when the guardian is gone. */
int cuip_guardian_phase(struct cuip_group *g, const char *phase, bool after);

/* The duty ends: commit (the tasks will be killed, or run rebuilt) or
 * criu did the rollback itself. The guardian exits. */
void cuip_guardian_end(const char *how);

/* The guardian's pid, 0 when none. */
pid_t cuip_guardian_pid(void);

/* Test seam: when set (by check_guardian, before the guardian forks), the
 * restore's guardian calls it in each round between finding processes of
 * the restored tree and killing them, so that a test can fork another in
 * that window. NULL in the product. */
extern void (*cuip_guardian_test_before_kill)(void);

#endif /* CUIP_PLUGIN_GUARDIAN_H */
