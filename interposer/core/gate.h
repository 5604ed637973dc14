/*
 * gate.h - the API gate and the lifecycle phase (gate.c): every gated
 * wrapper enters and leaves through it; a checkpoint closes it. The
 * open-gate path is inline here, in every wrapper (no call, no PLT); the
 * protocol and the locks are gate.c's.
 */
#ifndef CUIP_GATE_H
#define CUIP_GATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>

#include "wire.h" /* Cuip__Phase */

/* Enter a gated (tracked or launch-class) call; CUDA_SUCCESS or NOT_READY.
 * The open-gate path is inline in every wrapper (no call, no PLT): the
 * calling thread's slot in initial-exec TLS and one read-mostly cache line
 * of flags; everything else (first call of a thread, closed gate, fence
 * mode, wake-ups) is gate.c's slow path. The protocol is gate.c's. */
struct cuip_gate_slot {
	atomic_long depth; /* written by its thread only */
	struct cuip_gate_slot *prev, *next;
	bool registered;
};
struct cuip_gate_flags {
	atomic_int open;	/* 0 while a checkpoint holds the gate closed */
	bool fence;		/* no membarrier: entering threads fence (set once) */
} __attribute__((aligned(64))); /* a line of its own: no false sharing */
extern __thread struct cuip_gate_slot cuip_gate_me __attribute__((tls_model("initial-exec")));
extern struct cuip_gate_flags cuip_gate_flags; /* alone in its cache line */
CUresult cuip_gate_enter_slow(void);
void cuip_gate_exit_slow(void);

static inline bool cuip_gate_open_after_store(void)
{
	if (__builtin_expect(cuip_gate_flags.fence, 0))
		atomic_thread_fence(memory_order_seq_cst);
	else
		atomic_signal_fence(memory_order_seq_cst); /* the compiler keeps the order */
	return atomic_load_explicit(&cuip_gate_flags.open, memory_order_relaxed);
}

static inline CUresult cuip_gate_enter(void)
{
	struct cuip_gate_slot *s = &cuip_gate_me;

	if (__builtin_expect(s->registered, 1)) {
		long v = atomic_load_explicit(&s->depth, memory_order_relaxed);

		/* relaxed: the order comes from the closer's barrier (gate.c) */
		atomic_store_explicit(&s->depth, v + 1, memory_order_relaxed);
		if (__builtin_expect(cuip_gate_open_after_store(), 1)) {
			atomic_thread_fence(memory_order_acquire); /* pairs with cuip_gate_open */
			return CUDA_SUCCESS;
		}
		atomic_store_explicit(&s->depth, v, memory_order_release);
	}
	return cuip_gate_enter_slow(); /* registers, or waits for the gate */
}

static inline void cuip_gate_exit(void)
{
	struct cuip_gate_slot *s = &cuip_gate_me;

	/* release: the call's work happens before a closer reading 0 */
	atomic_store_explicit(&s->depth, atomic_load_explicit(&s->depth, memory_order_relaxed) - 1,
			      memory_order_release);
	if (__builtin_expect(!cuip_gate_open_after_store(), 0))
		cuip_gate_exit_slow(); /* wake the closer */
}
/* Close the gate and wait up to timeout_ms for in-flight calls: 0, or
 * -ETIMEDOUT or -EIO (membarrier failed) with the gate reopened. */
int cuip_gate_close(unsigned timeout_ms);
void cuip_gate_open(void);
void cuip_gate_prepare(void); /* process start: the slow one-time set-up */
Cuip__Phase cuip_phase(void);
void cuip_set_phase(Cuip__Phase p);
void cuip_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cuip_failure(void);
uint64_t cuip_gate_waits(void);
void cuip_gate_reset(void); /* fork child */

#endif /* CUIP_GATE_H */
