/*
 * gate.c - the API gate and the lifecycle phase.
 *
 * Every tracked and launch-class wrapper brackets its driver call with
 * cuip_gate_enter()/cuip_gate_exit(). A checkpoint closes the gate
 * (cuip_gate_close, QUIESCE in ops.c, on the op thread), waits until no call
 * is in flight, and from then on no application thread is inside the driver
 * through us nor inside the interposer's state; new calls wait here until
 * the gate reopens (after a complete restore or a rollback), or fail with
 * CUDA_ERROR_NOT_READY once the process is FAILED.
 *
 * Open gate, per call (inline in every wrapper, cuip.h): the calling
 * thread's own counter (`depth` in its thread-local slot) goes up, one
 * shared read-mostly flag is loaded, the counter goes down. No
 * read-modify-write, no fence, no call, no cache line another thread
 * writes while the gate is open (the flags have a line of their own).
 *
 * Protocol (asymmetric Dekker). Entering thread T: store depth+1 (relaxed,
 * only T writes it), compiler barrier, load `cuip_gate_flags.open`; closed: undo,
 * wait on gate_cv. Closer: store open = 0, then heavy_barrier(), then sum
 * every registered slot's depth (acquire) until it reads 0. heavy_barrier()
 * is membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which runs a full memory
 * barrier on every thread of the process that is running (a thread that is
 * not running passes one when it is scheduled). For each T the barrier falls
 * somewhere in T's program: before T's depth store, T's later load of the
 * flag sees 0 (the closer stored it before the barrier) and T backs off;
 * after it, the depth store is visible to the closer's scan, which waits.
 * Exit stores depth-1 with release, so everything T did inside the gate
 * happens before the closer's acquire read of 0. The closer rescans every
 * few milliseconds as well as on wake-ups, so a missed wake-up costs a
 * few ms, never the checkpoint. Where membarrier is unavailable (old kernel,
 * seccomp), decided once before the first thread registers, entering threads
 * use a sequentially consistent fence between the store and the load
 * instead (classic Dekker with the closer's seq_cst store and loads).
 * After a CRIU restore the process's membarrier registration is gone: the
 * closer registers again when the kernel answers EPERM, or falls back to
 * MEMBARRIER_CMD_GLOBAL; if membarrier fails altogether after the process
 * relied on it, cuip_gate_close reopens the gate and returns -EIO (the
 * checkpoint is refused, the job keeps running).
 *
 * Slots: a thread's slot lives in its TLS, registered on the list `slots`
 * on its first gated call (under gate_mu) and unlinked by a thread-specific
 * destructor when the thread exits (under gate_mu too), so an exited thread
 * leaves no count and the closer never reads a freed slot: the closer scans
 * with gate_mu held. A fork child keeps only the forking thread's slot.
 * gate_mu/gate_cv serve the slow paths and the slot list only.
 *
 * The closer waits for calls in flight, so it must hold no lock such a call
 * may take before it leaves: QUIESCE (ops.c) closes the gate without the
 * state lock, which imports take after their FETCH. The membarrier
 * registration (an RCU grace period) is made at process start
 * (cuip_gate_prepare from runtime.c), else by the first gated call or close.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cuip.h"
#include "gate.h"
#include "deadline.h"
#include "qtable.h"

/* Initial-exec TLS: one %fs-relative load, no __tls_get_addr. A library
 * loaded at start by LD_PRELOAD gets it in the static TLS block; one
 * dlopen'ed later takes it from glibc's static TLS surplus (the slot is
 * 32 bytes; test_dlopen.sh dlopens the library). */
__thread struct cuip_gate_slot cuip_gate_me __attribute__((tls_model("initial-exec")));
struct cuip_gate_flags cuip_gate_flags = {.open = 1}; /* read-mostly */
static atomic_int phase = CUIP__PHASE__PHASE_ACTIVE;
static atomic_ullong waits;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv; /* CLOCK_MONOTONIC, see gate_once_init */
static pthread_once_t gate_once = PTHREAD_ONCE_INIT;
static pthread_key_t slot_key;
static struct cuip_gate_slot *slots; /* gate_mu */
static char failure[512];

#define RESCAN_NS 5000000L /* the closer rescans the slots this often */

static void wake_all(void);

static int membarrier(int cmd)
{
	return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

static void slot_gone(void *p)
{
	struct cuip_gate_slot *s = p;

	pthread_mutex_lock(&gate_mu);
	if (s->registered) {
		if (s->prev)
			s->prev->next = s->next;
		else
			slots = s->next;
		if (s->next)
			s->next->prev = s->prev;
		s->registered = false;
	}
	pthread_mutex_unlock(&gate_mu);
	/* A thread exiting inside a gated call (pthread_exit from a callback)
	 * takes its count with it: wake a closer that may wait for it. */
	if (atomic_load_explicit(&s->depth, memory_order_relaxed) && !atomic_load(&cuip_gate_flags.open))
		wake_all();
}

static void gate_once_init(void)
{
	pthread_condattr_t a;
	int q;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&gate_cv, &a);
	pthread_condattr_destroy(&a);
	pthread_key_create(&slot_key, slot_gone);
	q = membarrier(MEMBARRIER_CMD_QUERY);
	cuip_gate_flags.fence = q < 0 || !(q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) ||
				membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0;
	if (cuip_gate_flags.fence)
		pr_info("membarrier(PRIVATE_EXPEDITED) unavailable: the open gate fences each call");
}

void cuip_gate_prepare(void)
{
	/* membarrier registration waits for an RCU grace period (6 to 23 ms
	 * measured on the 2-core test machine, more under load): at process
	 * start rather than in the first gated call. */
	pthread_once(&gate_once, gate_once_init);
}

/* The calling thread's first gated call: put its slot on the list. */
static struct cuip_gate_slot *slot_register(void)
{
	pthread_once(&gate_once, gate_once_init);
	pthread_mutex_lock(&gate_mu);
	cuip_gate_me.prev = NULL;
	cuip_gate_me.next = slots;
	if (slots)
		slots->prev = &cuip_gate_me;
	slots = &cuip_gate_me;
	cuip_gate_me.registered = true;
	pthread_mutex_unlock(&gate_mu);
	pthread_setspecific(slot_key, &cuip_gate_me);
	return &cuip_gate_me;
}

/* Make every thread's earlier stores visible to the caller's later loads
 * and the caller's earlier stores to every thread's later loads: 0 or
 * -errno (no barrier: the caller must not trust a scan). */
static int heavy_barrier(void)
{
	if (cuip_gate_flags.fence) {
		atomic_thread_fence(memory_order_seq_cst);
		return 0;
	}
	if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		return 0;
	/* Not registered (a restored process) or refused: register and retry. */
	if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
	    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		return 0;
	/* The slow global barrier (an RCU grace period): milliseconds, once
	 * per checkpoint. */
	if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0)
		return 0;
	return -errno;
}

static void wake_all(void)
{
	pthread_once(&gate_once, gate_once_init);
	pthread_mutex_lock(&gate_mu);
	pthread_cond_broadcast(&gate_cv);
	pthread_mutex_unlock(&gate_mu);
}

static inline void slot_add(struct cuip_gate_slot *s, long d)
{
	long v = atomic_load_explicit(&s->depth, memory_order_relaxed) + d;

	/* release on the way out: the call's work happens before a closer
	 * reading 0; on the way in the order comes from the barrier below */
	atomic_store_explicit(&s->depth, v, d < 0 ? memory_order_release : memory_order_relaxed);
}

/* cuip_gate_enter (cuip.h) found its slot unregistered or the gate closed,
 * and left its count as it was. */
CUresult cuip_gate_enter_slow(void)
{
	struct cuip_gate_slot *s = &cuip_gate_me;

	if (!s->registered)
		slot_register();
	for (;;) {
		slot_add(s, 1);
		if (cuip_gate_open_after_store()) {
			atomic_thread_fence(memory_order_acquire); /* pairs with cuip_gate_open */
			return CUDA_SUCCESS;
		}
		slot_add(s, -1);
		wake_all(); /* the closer may be waiting for this slot */
		atomic_fetch_add(&waits, 1);
		pthread_mutex_lock(&gate_mu);
		while (!atomic_load(&cuip_gate_flags.open) && atomic_load(&phase) != CUIP__PHASE__PHASE_FAILED)
			pthread_cond_wait(&gate_cv, &gate_mu);
		pthread_mutex_unlock(&gate_mu);
		if (atomic_load(&phase) == CUIP__PHASE__PHASE_FAILED)
			return CUDA_ERROR_NOT_READY;
	}
}

/* cuip_gate_exit (cuip.h) left while the gate was closed. */
void cuip_gate_exit_slow(void)
{
	wake_all();
}

/* Calls in flight (gate_mu held). */
static long inflight(void)
{
	long n = 0;

	for (struct cuip_gate_slot *s = slots; s; s = s->next)
		n += atomic_load_explicit(&s->depth, memory_order_acquire);
	return n;
}

/* Open again after a close that did not complete: nothing ran while it
 * was closed, so the query table is current (and the caller, QUIESCE,
 * does not hold the state lock that republishing needs). */
static void reopen(void)
{
	atomic_store(&cuip_gate_flags.open, 1);
	wake_all();
}

int cuip_gate_close(unsigned timeout_ms)
{
	struct timespec dl, now, step;
	int ret = 0;

	pthread_once(&gate_once, gate_once_init);
	cuip_deadline_ms(&dl, timeout_ms);
	atomic_store(&cuip_gate_flags.open, 0);
	ret = heavy_barrier();
	if (ret) {
		/* Threads that entered without a fence may be unseen: refuse to
		 * close rather than claim it; the job keeps running. */
		pr_err("cannot close the API gate: membarrier failed (%s) after this process relied on it; "
		       "gate reopened",
		       strerror(-ret));
		reopen();
		return -EIO;
	}
	pthread_mutex_lock(&gate_mu);
	while (inflight() > 0) {
		if (cuip_deadline_passed(&dl)) {
			ret = -ETIMEDOUT;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		step = now;
		step.tv_nsec += RESCAN_NS;
		if (step.tv_nsec >= 1000000000L) {
			step.tv_sec++;
			step.tv_nsec -= 1000000000L;
		}
		if (step.tv_sec > dl.tv_sec || (step.tv_sec == dl.tv_sec && step.tv_nsec > dl.tv_nsec))
			step = dl;
		pthread_cond_timedwait(&gate_cv, &gate_mu, &step);
	}
	pthread_mutex_unlock(&gate_mu);
	if (ret)
		reopen();
	return ret;
}

void cuip_gate_open(void)
{
	/* Driver handles may have changed while it was closed (restore). */
	cuip_qt_republish();
	reopen();
}

Cuip__Phase cuip_phase(void)
{
	return (Cuip__Phase)atomic_load(&phase);
}

void cuip_set_phase(Cuip__Phase p)
{
	atomic_store(&phase, (int)p);
	/* The log lines a restore held (ops.c) go out once the gate reopens;
	 * a restore that fails keeps them (its tree is killed). */
	if (p == CUIP__PHASE__PHASE_ACTIVE)
		cuip_log_hold(false);
	if (p == CUIP__PHASE__PHASE_FAILED)
		wake_all();
}

void cuip_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
	pr_err("process failed: %s", failure);
	cuip_set_phase(CUIP__PHASE__PHASE_FAILED);
}

const char *cuip_failure(void)
{
	return failure[0] ? failure : NULL;
}

uint64_t cuip_gate_waits(void)
{
	return atomic_load(&waits);
}

void cuip_gate_reset(void)
{
	/* A forked child has only the forking thread: the other threads'
	 * slots (their TLS) are gone, its own keeps its count. */
	slots = NULL;
	if (cuip_gate_me.registered) {
		cuip_gate_me.prev = cuip_gate_me.next = NULL;
		slots = &cuip_gate_me;
	}
	atomic_store(&cuip_gate_flags.open, 1);
	atomic_store(&phase, CUIP__PHASE__PHASE_ACTIVE);
	atomic_store(&waits, 0);
	failure[0] = 0;
	pthread_mutex_init(&gate_mu, NULL);
}
