/*
 * fault.h - deterministic fault injection for the tests of the rollback
 * (CUINTERPOSE_TEST_FAULT=ACTION@POINT, a testing aid in the SQLite spirit).
 *
 * POINT names a moment of the plugin's own sequence: "discovery" (the
 * group is known, the guardian runs), every coordinator phase by its log
 * name, reached after its barrier ("QUIESCE", "PREPARE_MULTICAST", "SAVE",
 * "IMAGES", "PREPARE_UNICAST", "LOAD", "REBUILD_CREATORS", "VERIFY",
 * "RESUME", ...), "native-lock", "native-checkpoint", "native-restore",
 * "begin:PHASE" for a coordinator phase that is about to send its first
 * request (the guardian already knows it started), "restore-start" (the
 * start of init(RESTORE) for images of ours: no guardian yet, criu has
 * forked nothing), "restore-guardian" (the GPUs checked, the guardian
 * about to start), "restore-init" (the
 * end of init(RESTORE): the restore's guardian runs, criu has forked
 * nothing), "post-forking" (CRIU's POST_FORKING hook: the tree's root is
 * forked, the other tasks fork and fill themselves in after it),
 * and "memdump" (CRIU has started writing the memory pages: a watcher
 * process sees the first pages-*.img appear in the image directory).
 * ACTION: "kill" (SIGKILL criu), "stop" (SIGSTOP criu: the guardian's
 * bound applies), "kill-agent" (SIGKILL the native agent, criu goes on),
 * "kill-guardian" (SIGKILL the guardian, criu goes on). A fault fires once
 * per criu process. Called by hooks.c from criu's main thread only.
 */
#ifndef CUIP_PLUGIN_FAULT_H
#define CUIP_PLUGIN_FAULT_H

/* Read CUINTERPOSE_TEST_FAULT: 0, or -EINVAL with err naming what is wrong. */
int cuip_fault_load(char *err, size_t errlen);

/* Reached POINT: act if the armed fault names it. */
void cuip_fault(const char *point);

/* The armed point is "memdump": start its watcher on image directory
 * `dirfd` (a child of criu that SIGKILLs criu at the first pages image). */
void cuip_fault_memdump(int dirfd);

#endif /* CUIP_PLUGIN_FAULT_H */
