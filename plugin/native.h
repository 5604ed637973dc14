/*
 * native.h - NVIDIA's native checkpoint through the driver API
 * (cuCheckpointProcess*), called from criu on other processes, for every
 * CUDA process of the tree at once (one thread each).
 *
 * The driver runs in the native agent (agent.h), a child process that
 * cuip_native_open starts and cuip_native_close reaps: criu itself never
 * loads libcuda (its threads would keep criu from entering a container's
 * mount namespace). In the agent the entry points are called without
 * cuInit, and only if one answers CUDA_ERROR_NOT_INITIALIZED is cuInit(0)
 * called, once, and the call retried. The ptrace side (letting a
 * frozen process's restore thread run) is tracee.c's; callers resume the
 * restore threads before checkpoint/restore and stop them afterwards.
 */
#ifndef CUIP_PLUGIN_NATIVE_H
#define CUIP_PLUGIN_NATIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "options.h"

enum cuip_native_state {
	CUIP_NATIVE_RUNNING = 0, /* values of CUprocessState */
	CUIP_NATIVE_LOCKED = 1,
	CUIP_NATIVE_CHECKPOINTED = 2,
	CUIP_NATIVE_FAILED = 3,
};

struct cuip_native_proc {
	pid_t pid;	 /* real pid */
	int restore_tid; /* the driver's restore thread */
	int initial;	 /* enum cuip_native_state before we touched it */
	bool locked;	 /* we locked it */
	bool checkpointed;
	int status;
	char err[256];
};

/* Start the agent for `lib`: 0, -ENOENT (cannot load), -ENOTSUP (no API). */
int cuip_native_open(const char *lib, char *err, size_t errlen);
bool cuip_native_available(void);
/* Stop and reap the agent (the next open starts a new one). */
void cuip_native_close(void);

/* 0 and the restore thread + state for a CUDA process, -ENOENT for a process
 * without CUDA, another negative errno on driver trouble. */
int cuip_native_probe(pid_t pid, int *tid, int *state, char *err, size_t errlen);
/*
 * Restore thread only (-ENOENT: not a CUDA process). At restore the tasks
 * are stopped, and NVIDIA's driver answers GetState (and Restore) only once
 * the restore thread runs again (measured on r580): this is the probe to use
 * before thawing it.
 */
int cuip_native_tid(pid_t pid, int *tid, char *err, size_t errlen);

/* Each returns 0 or the first failure (err names the pid and the call);
 * every process is attempted and its own status recorded. */
int cuip_native_lock_all(struct cuip_native_proc *v, size_t n, unsigned timeout_ms, char *err, size_t errlen);
int cuip_native_checkpoint_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen);
int cuip_native_restore_all(struct cuip_native_proc *v, size_t n, const struct cuip_gpu_pair *remap, unsigned n_remap,
			    char *err, size_t errlen);
int cuip_native_unlock_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen);

/* Current state, or -errno. */
int cuip_native_state(pid_t pid);
const char *cuip_native_state_name(int s);

#endif /* CUIP_PLUGIN_NATIVE_H */
