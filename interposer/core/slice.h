/*
 * slice.h - a resource's checkpoint slice, as ops.c's phase machine runs
 * it. Each resource that keeps state across a checkpoint registers one
 * (CUIP_SLICE: vmm.c for unicast memory, carry.c for its carried bytes,
 * multicast.c, pool.c, peer.c for the peer-access matrix, ctx.c for the
 * contexts' stacks); ops.c and inspect.c walk them and name no resource
 * module. Every function runs on the op thread with cuip_state_lock held
 * (before_gate: without it);
 * a NULL member: the slice has no part in that step. Errors: 0 or a negative errno with err filled (no
 * pid: ops.c prefixes it). Declarations only, no state.
 */
#ifndef CUIP_SLICE_H
#define CUIP_SLICE_H

#include <stdbool.h>
#include <stddef.h>

#include "wire.h"

struct cuip_slice {
	const char *name;
	/* INSPECT: add this resource's part of the state (reply arena); 0 or -1. */
	int (*inspect)(Cuip__ProcessState *st);
	/* QUIESCE, before the gate closes, while the job still runs: ready
	 * what a later step would otherwise do inside the pause, waiting at
	 * most budget_ms (half of what is left of QUIESCE's timeout; work
	 * that is late goes on by itself). Runs WITHOUT cuip_state_lock (the
	 * job's calls may need it meanwhile; the member takes it for what it
	 * reads of the state). Its failures are its own to log: the
	 * checkpoint goes on without the head start. */
	void (*before_gate)(unsigned budget_ms);
	/* QUIESCE, the gate closed, before the device drains: non-zero with msg
	 * filled (pid first) when this resource cannot be checkpointed now (the
	 * gate then reopens, nothing changed), else 0. */
	int (*refuse)(char *msg, size_t len);
	/* PREPARE_*: the request that detaches this resource (from QUIESCED;
	 * messages name it with cuip_request_name), and the phase it leaves on
	 * success (0: the phase stays; a request in that phase again succeeds
	 * at once). */
	Cuip__Request__BodyCase prepare_request;
	Cuip__Phase prepared_phase;
	int (*prepare)(char *err, size_t errlen);
	/* Detached by its PREPARE while the process is still QUIESCED (a REBUILD
	 * then is a rollback). */
	bool (*detached)(void);
	/* SAVE and LOAD: the carried bytes to and from the carrier files (fds,
	 * one per file name; ops.c closes them). ops.c has checked the phase
	 * and runs the first slice that has the member. 0 with *out set (the
	 * reply's body, from the reply arena), or a negative errno with err
	 * filled. A LOAD that got past the carrier's setup leaves the process
	 * RESTORING, failed or not (the plugin then rolls back or kills). */
	int (*save)(const Cuip__Save *s, const int *fds, size_t nfds, Cuip__SaveReply **out, char *err, size_t errlen);
	int (*load)(const Cuip__Load *l, const int *fds, size_t nfds, Cuip__LoadReply **out, char *err, size_t errlen);
	/* REBUILD: the stages this slice runs, and one stage. */
	bool (*runs_stage)(Cuip__Stage stage);
	int (*rebuild)(const Cuip__Rebuild *rb, char *err, size_t errlen);
	/* VERIFY: what the generic comparison of records and mappings cannot see. */
	int (*verify)(const Cuip__ProcessState *exp, char *err, size_t errlen);
	/* After the PREPARE that leaves the process PREPARED (the last request
	 * before the native lock): shrink what the native checkpoint would copy
	 * for nothing; RESUME, before the gate opens: undo it. Both only make
	 * the checkpoint smaller, so their failures are the slice's to log. */
	void (*before_native)(void);
	void (*resume)(void);
};

#define CUIP_SLICE(id, ...)                            \
	static const struct cuip_slice cuip_slice_##id \
		__attribute__((used, section("cuip_slices"), aligned(sizeof(void *)))) = {__VA_ARGS__}

/* The registered slices, in link order (bounded by the linker). */
extern const struct cuip_slice __start_cuip_slices[] __attribute__((weak, visibility("hidden")));
extern const struct cuip_slice __stop_cuip_slices[] __attribute__((weak, visibility("hidden")));
#define cuip_for_each_slice(s) for (const struct cuip_slice *s = __start_cuip_slices; s < __stop_cuip_slices; s++)

#endif /* CUIP_SLICE_H */
