/*
 * agent.h - the native agent: a child process of criu that loads the CUDA
 * driver and makes every driver call of the plugin (cuCheckpointProcess*),
 * so that criu itself never loads libcuda.
 *
 * Why a process: a driver's cuInit starts threads (NVIDIA's does, and the
 * fake's restore thread and worker), and a multithreaded criu can no longer
 * setns(CLONE_NEWNS) into a container's mount namespace (EINVAL). CRIU's
 * cuda_plugin runs the cuda-checkpoint binary for the same reason.
 *
 * Lifetime: started by native.c on first use (fork of criu, no exec; the
 * child keeps only its end of a SOCK_STREAM socketpair), stopped and
 * reaped by cuip_agent_stop() from the hooks (fini, end of restore) before
 * criu waits for its own children. A dead agent is reaped and reported by
 * the call that notices; the next call starts a new one.
 *
 * Protocol: the agent's hello (the driver loaded, or why not), then one
 * request (an operation and up to CUIP_AGENT_BATCH pids) and one reply (a
 * result per pid, in request order) at a time: AgentMessage frames of
 * protocol/cuinterpose.proto, checked and versioned by wire.c like every
 * other message. The agent runs the driver calls of one request in
 * parallel, one thread per pid, and joins them before it replies. A
 * request it cannot read ends it (status 3, the reason on stderr); a reply
 * criu cannot read gets it killed and counts as its death.
 *
 * State: one agent per criu process, used only by the hook thread (CRIU
 * calls hooks serially); no lock.
 */
#ifndef CUIP_PLUGIN_AGENT_H
#define CUIP_PLUGIN_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "options.h"

#define CUIP_AGENT_BATCH 1024 /* pids per request; callers split larger sets */
#define CUIP_AGENT_COMM	 "criu-cuda-agent"

enum cuip_agent_op {
	CUIP_AGENT_PROBE = 1, /* GetRestoreThreadId, then GetState */
	CUIP_AGENT_STATE,     /* GetState */
	CUIP_AGENT_LOCK,      /* Lock(timeout_ms), then GetState */
	CUIP_AGENT_CHECKPOINT,
	CUIP_AGENT_RESTORE, /* Restore(remap pairs) */
	CUIP_AGENT_UNLOCK,
	CUIP_AGENT_TID, /* GetRestoreThreadId only: the one call NVIDIA's driver
			 * answers while the target's threads are stopped
			 * (GetState and Restore wait for its restore thread) */
};

struct cuip_agent_result {
	int32_t pid;
	int32_t cu;	  /* CUresult of the operation's call */
	int32_t tid;	  /* PROBE: the restore thread */
	int32_t state_cu; /* CUresult of the GetState that follows */
	int32_t state;	  /* CUprocessState read after the call, when state_cu is 0 */
	char cu_name[48]; /* cuGetErrorName(cu), "" when the driver has no name */
};

/*
 * Start the agent for driver library `lib` (no-op while one runs for it).
 * 0; -ENOENT when the library cannot be loaded, -ENOTSUP when it has no
 * checkpoint API (err says which); another -errno when no agent could start.
 */
int cuip_agent_start(const char *lib, char *err, size_t errlen);

/* The running agent's pid, 0 when none. */
pid_t cuip_agent_pid(void);

/*
 * Run `op` for pids[0..n) in the agent (n <= CUIP_AGENT_BATCH), res[i] for
 * pids[i]. 0, or -EPIPE when the agent died or answered what this build
 * cannot read (reaped, states unknown; err says which), or
 * another -errno. Starts the agent again first if the last one died.
 */
int cuip_agent_call(enum cuip_agent_op op, const pid_t *pids, size_t n, unsigned timeout_ms,
		    const struct cuip_gpu_pair *remap, unsigned n_remap, struct cuip_agent_result *res, char *err,
		    size_t errlen);

/* Close the channel, wait for the agent to exit (kill it after 2 s), reap it. */
void cuip_agent_stop(void);

/* In a fork of criu: drop criu's agent without touching it (its channel
 * end closed, nothing reaped); the next call starts this process's own. */
void cuip_agent_forget(void);

#endif /* CUIP_PLUGIN_AGENT_H */
