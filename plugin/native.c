/*
 * native.c - driver-API native checkpoint, in parallel; see native.h.
 *
 * Every driver call happens in the native agent (agent.c), a child process:
 * criu never loads libcuda and never runs a thread of the driver. This
 * module decides which processes each step applies to, checks the state
 * the driver reports after each step, and turns the results into one line
 * per failure naming the call, the pid and the CUresult.
 *
 * State: none of its own beyond the agent's; called from the hook thread.
 */
#include "config.h"

#include <cuda.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "criulog.h"
#include "native.h"

int cuip_native_open(const char *lib, char *err, size_t errlen)
{
	return cuip_agent_start(lib, err, errlen);
}

bool cuip_native_available(void)
{
	return cuip_agent_pid() > 0;
}

void cuip_native_close(void)
{
	cuip_agent_stop();
}

static const char *cuname(const struct cuip_agent_result *r)
{
	return r->cu_name[0] ? r->cu_name : "CUDA error";
}

const char *cuip_native_state_name(int s)
{
	switch (s) {
	case CUIP_NATIVE_RUNNING:
		return "running";
	case CUIP_NATIVE_LOCKED:
		return "locked";
	case CUIP_NATIVE_CHECKPOINTED:
		return "checkpointed";
	case CUIP_NATIVE_FAILED:
		return "failed";
	}
	return "unknown";
}

int cuip_native_state(pid_t pid)
{
	struct cuip_agent_result r;
	char err[256];

	if (cuip_agent_pid() <= 0)
		return -ENOENT;
	if (cuip_agent_call(CUIP_AGENT_STATE, &pid, 1, 0, NULL, 0, &r, err, sizeof(err))) {
		pr_err("native: %s", err);
		return -EIO;
	}
	return r.state_cu == 0 ? r.state : -EIO;
}

int cuip_native_tid(pid_t pid, int *tid, char *err, size_t errlen)
{
	struct cuip_agent_result r;
	int ret;

	if (cuip_agent_pid() <= 0)
		return -ENOENT;
	ret = cuip_agent_call(CUIP_AGENT_TID, &pid, 1, 0, NULL, 0, &r, err, errlen);
	if (ret)
		return ret;
	if (r.cu)
		return -ENOENT; /* no CUDA in this process */
	*tid = r.tid;
	return 0;
}

int cuip_native_probe(pid_t pid, int *tid, int *state, char *err, size_t errlen)
{
	struct cuip_agent_result r;
	int ret;

	if (cuip_agent_pid() <= 0)
		return -ENOENT;
	ret = cuip_agent_call(CUIP_AGENT_PROBE, &pid, 1, 0, NULL, 0, &r, err, errlen);
	if (ret)
		return ret;
	if (r.cu)
		return -ENOENT; /* no CUDA in this process (or not yet) */
	if (r.state_cu) {
		snprintf(err, errlen, "cuCheckpointProcessGetState(%d) failed: %s (%d)", pid,
			 r.cu_name[0] ? r.cu_name : "CUDA error", (int)r.state_cu);
		return -EIO;
	}
	*tid = r.tid;
	*state = r.state;
	return 0;
}

enum op { OP_LOCK, OP_CHECKPOINT, OP_RESTORE, OP_UNLOCK };

static const char *op_name(enum op op)
{
	static const char *n[] = {"cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
				  "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"};
	return n[op];
}

static const enum cuip_agent_op agent_op[] = {CUIP_AGENT_LOCK, CUIP_AGENT_CHECKPOINT, CUIP_AGENT_RESTORE,
					      CUIP_AGENT_UNLOCK};
static const int want_state[] = {CUIP_NATIVE_LOCKED, CUIP_NATIVE_CHECKPOINTED, CUIP_NATIVE_LOCKED, CUIP_NATIVE_RUNNING};

/* Record one process's answer: flags, then the state check. */
static void settle(struct cuip_native_proc *p, enum op op, const struct cuip_agent_result *r)
{
	int want = want_state[op];

	if (r->cu) {
		snprintf(p->err, sizeof(p->err), "%s(pid %d) failed: %s (%d)", op_name(op), p->pid, cuname(r),
			 (int)r->cu);
		p->status = r->cu == CUDA_ERROR_TIMEOUT ? -ETIMEDOUT : -EIO;
		return;
	}
	switch (op) {
	case OP_LOCK:
		p->locked = true;
		break;
	case OP_CHECKPOINT:
		p->checkpointed = true;
		break;
	case OP_RESTORE:
		p->checkpointed = false;
		break;
	case OP_UNLOCK:
		p->locked = false;
		break;
	}
	if (r->state_cu || r->state != want) {
		snprintf(p->err, sizeof(p->err), "after %s pid %d is %s, expected %s", op_name(op), p->pid,
			 r->state_cu ? "unreadable" : cuip_native_state_name(r->state), cuip_native_state_name(want));
		p->status = -EIO;
	}
}

/*
 * The agent died with calls in flight: what happened to them is unknown.
 * Ask a fresh agent for the states, so that flags (and the rollback that
 * follows) match what the driver did.
 */
static void resync(struct cuip_native_proc **todo, const pid_t *pids, size_t n, enum op op, const char *why)
{
	struct cuip_agent_result r[CUIP_AGENT_BATCH];
	char err[512];
	bool known = !cuip_agent_call(CUIP_AGENT_STATE, pids, n, 0, NULL, 0, r, err, sizeof(err));

	if (!known)
		pr_err("native: a new agent cannot read the states either: %s", err);
	for (size_t i = 0; i < n; i++) {
		struct cuip_native_proc *p = todo[i];

		snprintf(p->err, sizeof(p->err), "%s(pid %d): no answer: %.160s", op_name(op), p->pid, why);
		p->status = -EIO;
		if (!known || r[i].state_cu)
			continue;
		p->locked = r[i].state == CUIP_NATIVE_LOCKED || r[i].state == CUIP_NATIVE_CHECKPOINTED;
		p->checkpointed = r[i].state == CUIP_NATIVE_CHECKPOINTED;
		pr_warn("native: pid %d is %s after the agent died", p->pid, cuip_native_state_name(r[i].state));
	}
}

static int run_batch(struct cuip_native_proc **todo, size_t n, enum op op, unsigned timeout_ms,
		     const struct cuip_gpu_pair *remap, unsigned n_remap)
{
	struct cuip_agent_result r[CUIP_AGENT_BATCH];
	pid_t pids[CUIP_AGENT_BATCH];
	char err[512];
	int ret;

	for (size_t i = 0; i < n; i++)
		pids[i] = todo[i]->pid;
	ret = cuip_agent_call(agent_op[op], pids, n, timeout_ms, remap, n_remap, r, err, sizeof(err));
	if (ret == -EPIPE) {
		pr_err("native: %s", err);
		resync(todo, pids, n, op, err);
		return 0;
	}
	if (ret) {
		for (size_t i = 0; i < n; i++) {
			snprintf(todo[i]->err, sizeof(todo[i]->err), "%s(pid %d): %.160s", op_name(op), todo[i]->pid,
				 err[0] ? err : strerror(-ret));
			todo[i]->status = ret;
		}
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		settle(todo[i], op, &r[i]);
	return 0;
}

static int run_all(struct cuip_native_proc *v, size_t n, enum op op, unsigned timeout_ms,
		   const struct cuip_gpu_pair *remap, unsigned n_remap,
		   bool (*applies)(const struct cuip_native_proc *), char *err, size_t errlen)
{
	struct cuip_native_proc *todo[CUIP_AGENT_BATCH];
	size_t count = 0, k = 0;
	double t0 = cuip_now();
	int ret = 0;

	for (size_t i = 0; i < n; i++) {
		v[i].status = 0;
		v[i].err[0] = 0;
		if (!applies(&v[i]))
			continue;
		todo[k++] = &v[i];
		count++;
		if (k == CUIP_AGENT_BATCH) {
			run_batch(todo, k, op, timeout_ms, remap, n_remap);
			k = 0;
		}
	}
	if (k)
		run_batch(todo, k, op, timeout_ms, remap, n_remap);
	for (size_t i = 0; i < n; i++) {
		if (!v[i].status)
			continue;
		pr_err("native: %s", v[i].err);
		if (!ret) {
			ret = v[i].status;
			snprintf(err, errlen, "%s", v[i].err);
		}
	}
	if (count)
		pr_info("NATIVE %s: %zu processes, %.3f s%s", op_name(op) + strlen("cuCheckpointProcess"), count,
			cuip_now() - t0, ret ? " (FAILED)" : "");
	return ret;
}

static bool want_lock(const struct cuip_native_proc *p)
{
	return p->initial == CUIP_NATIVE_RUNNING && !p->locked;
}

static bool want_checkpoint(const struct cuip_native_proc *p)
{
	return p->locked && !p->checkpointed && p->initial != CUIP_NATIVE_CHECKPOINTED;
}

static bool want_restore(const struct cuip_native_proc *p)
{
	return p->checkpointed;
}

static bool want_unlock(const struct cuip_native_proc *p)
{
	return p->locked;
}

int cuip_native_lock_all(struct cuip_native_proc *v, size_t n, unsigned timeout_ms, char *err, size_t errlen)
{
	return run_all(v, n, OP_LOCK, timeout_ms, NULL, 0, want_lock, err, errlen);
}

int cuip_native_checkpoint_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen)
{
	return run_all(v, n, OP_CHECKPOINT, 0, NULL, 0, want_checkpoint, err, errlen);
}

int cuip_native_restore_all(struct cuip_native_proc *v, size_t n, const struct cuip_gpu_pair *remap, unsigned n_remap,
			    char *err, size_t errlen)
{
	return run_all(v, n, OP_RESTORE, 0, remap, n_remap, want_restore, err, errlen);
}

int cuip_native_unlock_all(struct cuip_native_proc *v, size_t n, char *err, size_t errlen)
{
	return run_all(v, n, OP_UNLOCK, 0, NULL, 0, want_unlock, err, errlen);
}
