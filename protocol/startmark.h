/*
 * startmark.h - the start marker and the start gate: the contract between
 * the interposer's start-up path (runtime.c) and the plugin's discovery
 * (plugin/startgate.c, plugin/proc.c). Header only, no state.
 *
 * Marker: at its first cuInit a process maps one page of a memfd named
 * CUIP_MARK_NAME (MAP_SHARED, MADV_DONTFORK), seen from outside as
 * "/memfd:cuinterpose-cuda (deleted)" in /proc/PID/maps, and keeps its start
 * state there. The kernel shows it in every namespace, CRIU saves and
 * restores it with its content, a fork child does not inherit it.
 *
 * Gate: the library file itself (the inode mapped as libcuinterpose.so).
 * A process passes the gate with flock(LOCK_EX) for the moment it takes to
 * set STARTING, then releases it; a checkpoint holds flock(LOCK_SH) from
 * discovery until the dumped tree is frozen. So a process either set
 * STARTING before discovery (the plugin waits until it is STARTED and makes
 * it a participant) or waits in flock until the tree is frozen (it is an
 * ordinary process for that checkpoint). Checkpoints share the gate; only
 * processes starting CUDA exclude each other, for microseconds. The kernel
 * drops criu's lock if criu dies; a process frozen while it waits holds no
 * lock, and its flock restarts after --leave-running, rollback or restore.
 */
#ifndef CUIP_STARTMARK_H
#define CUIP_STARTMARK_H

#include <stdint.h>

#define CUIP_MARK_NAME	"cuinterpose-cuda"
#define CUIP_MARK_MAGIC 0x6b72616du /* "mark" */

enum cuip_mark_state {
	CUIP_MARK_NONE = 0,	/* never began CUDA (no marker reads as this too) */
	CUIP_MARK_STARTING = 1, /* inside its first cuInit, control socket not yet up */
	CUIP_MARK_STARTED = 2,	/* CUDA initialized, control socket listening */
	CUIP_MARK_FAILED = 3,	/* its cuInit failed: no CUDA, an ordinary process */
	CUIP_MARK_NOSOCKET = 4, /* CUDA initialized, control socket could not be created */
};

struct cuip_mark {
	uint32_t magic;
	uint32_t state; /* enum cuip_mark_state */
	int32_t pid;	/* getpid() of the process that wrote it */
	int32_t err;	/* NOSOCKET: the errno of the failure */
};

#endif /* CUIP_STARTMARK_H */
