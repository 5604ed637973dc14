/*
 * Streams, events and the work queue that stands for device execution.
 *
 * One executor at a time runs queued work in FIFO order, which is
 * a legal (stricter) schedule for any set of streams: per-stream order holds,
 * legacy default-stream barriers hold, and cuStreamWaitEvent is satisfied by
 * construction.  Device work is "in flight" until an executor has run it; the
 * checkpoint lock waits for the queue to drain (stream_idle).
 *
 * The executor is the worker thread, or a thread that waits for the work
 * (stream_sync_seq) or for room in the full ring (stream_enqueue): a device
 * makes progress whatever the process's threads do, and during a restore
 * CRIU keeps every thread stopped but the driver's restore thread and the
 * interposer's, whose LOAD queues thousands of copies (issue 32).  So no
 * caller ever waits for the worker: it waits only for an item that another
 * running executor has taken, or runs the oldest one itself.
 *
 * The worker sleeps on a futex word (q_kick), never on a condition variable
 * that callers share: glibc's broadcast waits for the waiters it woke to
 * leave their group before it can wake newer ones, and a worker stopped
 * inside its wait never leaves, so every later broadcast with another waiter
 * would hang (seen: a LOAD thread in run()'s broadcast, blocked on the
 * stopped worker's reference in the condition variable it then slept on).
 * A futex wake never waits.
 *
 * q_lock protects the ring and exec_busy; enq_seq/done_seq are atomics
 * readable without it.  q_done (under q_lock) has callers as waiters, never
 * the worker.
 * Execution takes G.lock per work item (never across a kernel's delay); the
 * order is G.lock -> q_lock, so an executor drops q_lock before run().
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

#define QCAP 1024

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_done = PTHREAD_COND_INITIALIZER; /* an item finished */
static struct fk_op ring[QCAP];
static uint64_t ring_head; /* next to run */
static atomic_uint_fast64_t enq_seq, done_seq;
static uint64_t default_last;
static int exec_busy; /* an item is being executed (q_lock) */
/* The worker's wakeups: q_kick changes whenever it may have something to do
 * (an item queued or finished, a one-way message queued); worker_idle says
 * it sleeps, or is about to, so that a kick without it costs no system call. */
static atomic_uint q_kick;
static atomic_int worker_idle;

/*
 * Take the next queued item if nobody is executing one (q_lock held). One
 * executor at a time keeps the FIFO order and done_seq monotonic.
 */
static int take(struct fk_op *op, uint64_t *seq)
{
	if (exec_busy || ring_head == atomic_load(&enq_seq))
		return 0;
	*op = ring[ring_head % QCAP];
	*seq = ++ring_head;
	exec_busy = 1;
	return 1;
}

/* Sleep to an absolute end (no drift from steps); a long kernel must not
 * hold back the one-way queue's timed flush. */
static void sleep_until(int64_t end, int *flushing)
{
	for (;;) {
		int64_t due = *flushing ? conn_flush_due() : 0, until = due && due < end ? due : end;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000), .tv_nsec = (long)(until % 1000000000)};

		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		if (until == end)
			return;
		*flushing = conn_flush_async() == 0;
	}
}

/* Execute a taken item (q_lock not held) and publish its completion. */
static void run(struct fk_op *op, uint64_t seq)
{
	CUresult r;

	/* The kernel's delay, then its hold: until the file exists, looked at
	 * every 10 ms, at most FK_HOLD_MAX_S (a test that forgets it does not
	 * hang the queue forever). */
	if (op->delay_us || op->hold) {
		int64_t now = fk_now_ns(), give_up = now + (int64_t)FK_HOLD_MAX_S * 1000000000;
		int flushing = 1; /* until the gate refuses it (a lock flushed) */

		sleep_until(now + (int64_t)op->delay_us * 1000, &flushing);
		while (op->hold && access(op->hold, F_OK) && fk_now_ns() < give_up)
			sleep_until(fk_now_ns() + 10 * 1000000, &flushing);
	}
	LOCK();
	r = op_execute(op);
	if (r != CUDA_SUCCESS && G.sticky == CUDA_SUCCESS)
		G.sticky = r;
	UNLOCK();

	pthread_mutex_lock(&q_lock);
	exec_busy = 0;
	atomic_store(&done_seq, seq);
	pthread_cond_broadcast(&q_done); /* waiters for it, producers for room */
	pthread_mutex_unlock(&q_lock);
	stream_kick(); /* the next item */
}

/*
 * Move the queue on by one item (q_lock held, G.lock not): run the oldest
 * one here if no executor has it, else wait until that one is done.  Never
 * waits for the worker (see the top of the file).
 */
static void advance(void)
{
	struct fk_op op;
	uint64_t seq;

	if (take(&op, &seq)) {
		pthread_mutex_unlock(&q_lock);
		run(&op, seq);
		pthread_mutex_lock(&q_lock);
	} else {
		assert(exec_busy); /* the ring is not empty: somebody runs its head */
		pthread_cond_wait(&q_done, &q_lock);
	}
}

void stream_kick(void)
{
	atomic_fetch_add(&q_kick, 1);
	if (atomic_load(&worker_idle))
		syscall(SYS_futex, &q_kick, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/*
 * The worker's sleep until q_kick moves from `kick` (read before it last
 * looked at the ring), or until the one-way message queue is due: idle, it
 * also sends the connection's queue once its oldest record is
 * FAKECUDA_FLUSH_US old (1 ms; conn.c), so that devd sees a release soon
 * without one wakeup per message.  No lock held.
 *
 * worker_idle is set before the futex compares q_kick and stream_kick bumps
 * q_kick before it reads worker_idle (both sequentially consistent): either
 * the futex sees the new value or the kicker sees the sleeper.
 */
static void idle_wait(unsigned int kick)
{
	int64_t due = conn_flush_due(), now;
	struct timespec ts;

	if (due) {
		now = fk_now_ns();
		if (now >= due) {
			if (conn_flush_async() == 0)
				return;
			due = now + 1000000; /* the gate is closed: the lock flushed; look again later */
		}
		ts.tv_sec = (time_t)(due / 1000000000);
		ts.tv_nsec = (long)(due % 1000000000);
	}
	atomic_store(&worker_idle, 1);
	/* absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT_BITSET), none when nothing is due */
	syscall(SYS_futex, &q_kick, FUTEX_WAIT_BITSET_PRIVATE, kick, due ? &ts : NULL, NULL, FUTEX_BITSET_MATCH_ANY);
	atomic_store(&worker_idle, 0);
}

static void *worker(void *arg)
{
	pthread_setname_np(pthread_self(), "fakecuda-work");
	for (;;) {
		unsigned int kick = atomic_load(&q_kick);
		struct fk_op op;
		uint64_t seq;
		int got;

		pthread_mutex_lock(&q_lock);
		got = take(&op, &seq);
		pthread_mutex_unlock(&q_lock);
		if (got)
			run(&op, seq);
		else
			idle_wait(kick);
	}
	return NULL;
}

void stream_init(void)
{
	pthread_t t;
	pthread_attr_t a;

	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_create(&t, &a, worker, NULL);
	/* Named here too, before the call that started it returns: on a busy
	 * machine the thread may not have run its first line yet when a test
	 * looks it up by name (it never exits, so t stays valid). */
	pthread_setname_np(t, "fakecuda-work");
	pthread_attr_destroy(&a);
}

int stream_idle(void)
{
	return atomic_load(&done_seq) == atomic_load(&enq_seq);
}

uint64_t stream_done_seq(void)
{
	return atomic_load(&done_seq);
}

static int is_default(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

static int stream_valid(struct fk_stream *s)
{
	return table_index(&G.strm, s) >= 0 && s->magic == FK_STR_MAGIC && s->used && ctx_valid(s->ctx);
}

CUresult stream_resolve(CUstream s, struct fk_stream **out)
{
	if (is_default(s)) {
		struct fk_ctx *c;

		*out = NULL;
		return ctx_require(&c);
	}
	if (!stream_valid((struct fk_stream *)s))
		return CUDA_ERROR_INVALID_HANDLE;
	*out = (struct fk_stream *)s;
	return CUDA_SUCCESS;
}

/* G.lock held by the caller (the stream's last_seq is table state). */
CUresult stream_enqueue(struct fk_op *op, struct fk_stream *s)
{
	uint64_t seq;

	op->stream = s;
	pthread_mutex_lock(&q_lock);
	while (atomic_load(&enq_seq) - ring_head >= QCAP) {
		/* Full: make room as a waiter does (advance), without G.lock,
		 * which run() takes; the caller's state is rechecked after. */
		UNLOCK();
		while (atomic_load(&enq_seq) - ring_head >= QCAP)
			advance();
		pthread_mutex_unlock(&q_lock);
		LOCK();
		pthread_mutex_lock(&q_lock);
	}
	seq = atomic_load(&enq_seq) + 1;
	ring[(seq - 1) % QCAP] = *op;
	atomic_store(&enq_seq, seq);
	if (s)
		s->last_seq = seq;
	else
		default_last = seq;
	if (op->event)
		op->event->rec_seq = seq;
	pthread_mutex_unlock(&q_lock);
	stream_kick();
	return CUDA_SUCCESS;
}

CUresult stream_sync_seq(uint64_t seq)
{
	CUresult r;

	/*
	 * A waiter runs queued work itself when no executor has taken it
	 * (advance; why: the top of the file).  The worker is never stopped
	 * mid-item: checkpoint locks only an idle device.
	 */
	pthread_mutex_lock(&q_lock);
	while (atomic_load(&done_seq) < seq)
		advance();
	pthread_mutex_unlock(&q_lock);
	LOCK();
	r = G.sticky;
	UNLOCK();
	return r;
}

CUresult stream_sync_all(void)
{
	return stream_sync_seq(atomic_load(&enq_seq));
}

/* FAKECUDA_COPY_LOG: "pid P dtoh BYTES", one write (O_APPEND) per copy. */
static void copy_log(size_t n)
{
	char line[64];
	int fd, len;

	if (!fk_copy_log[0])
		return;
	len = snprintf(line, sizeof(line), "pid %d dtoh %zu\n", (int)getpid(), n);
	fd = open(fk_copy_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)len) < 0) {
		/* nothing to do: the test sees no line */
	}
	close(fd);
}

CUresult op_execute(struct fk_op *op)
{
	CUresult r;

	switch (op->type) {
	case OP_COPY:
		return devmem_copy(op->dst, op->src, op->n, -1);
	case OP_HOST_TO_DEV:
		return devmem_write(op->dst, op->host, op->n, -1);
	case OP_DEV_TO_HOST:
		r = devmem_read(op->host, op->src, op->n, -1);
		if (!r)
			copy_log(op->n);
		return r;
	case OP_HOST_COPY:
		memcpy((void *)(uintptr_t)op->dst, (void *)(uintptr_t)op->src, op->n);
		return CUDA_SUCCESS;
	case OP_FILL:
		return devmem_fill(op->dst, &op->pattern, op->psize, op->n, -1);
	case OP_KERNEL:
		r = op->kernel->run(op);
		/* a kernel that touches memory it cannot reach faults, like on a GPU */
		return r == CUDA_ERROR_INVALID_VALUE ? CUDA_ERROR_ILLEGAL_ADDRESS : r;
	case OP_RECORD:
		op->event->t_ns = fk_now_ns();
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_UNKNOWN;
}

/* --- streams -------------------------------------------------------------------- */

static CUresult stream_create(CUstream *ph, unsigned int flags, int prio)
{
	struct fk_stream *s;
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);
	int i;

	if (r)
		return r;
	if (!ph || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	i = table_new(&G.strm);
	if (i < 0) {
		UNLOCK();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s = FK_AT(&G.strm, struct fk_stream, i);
	s->used = 1;
	s->magic = FK_STR_MAGIC;
	s->ctx = c;
	s->flags = flags;
	s->prio = prio < -5 ? -5 : prio > 0 ? 0 : prio;
	*ph = (CUstream)s;
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	FK_CALL("cuStreamCreate", stream_create(phStream, Flags, 0));
}

FK_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	FK_CALL("cuStreamCreateWithPriority", stream_create(phStream, flags, priority));
}

static CUresult stream_destroy(CUstream h)
{
	struct fk_stream *s = (struct fk_stream *)h;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	if (is_default(h) || !stream_valid(s))
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		s->used = 0, s->magic = 0; /* queued work still runs, as on a real device */
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
	FK_CALL("cuStreamDestroy", stream_destroy(hStream));
}

static CUresult stream_last(CUstream h, uint64_t *seq)
{
	struct fk_stream *s;
	CUresult r;

	LOCK();
	r = stream_resolve(h, &s);
	if (!r)
		*seq = s ? s->last_seq : atomic_load(&enq_seq); /* legacy default stream: everything */
	UNLOCK();
	return r;
}

static CUresult stream_sync(CUstream h)
{
	uint64_t seq;
	CUresult r = stream_last(h, &seq);

	return r ? r : stream_sync_seq(seq);
}

FK_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	FK_CALL("cuStreamSynchronize", stream_sync(hStream));
}

static CUresult stream_query(CUstream h)
{
	uint64_t seq;
	CUresult r = stream_last(h, &seq);

	if (r)
		return r;
	return atomic_load(&done_seq) >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FK_API CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	FK_CALL("cuStreamQuery", stream_query(hStream));
}

static int event_valid(struct fk_event *e)
{
	return table_index(&G.evt, e) >= 0 && e->magic == FK_EVT_MAGIC && e->used;
}

static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned int flags)
{
	struct fk_stream *s;
	CUresult r;

	LOCK();
	r = stream_resolve(h, &s);
	if (!r && !event_valid((struct fk_event *)ev))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (!r && flags & ~1u)
		r = CUDA_ERROR_INVALID_VALUE;
	/* FIFO execution: the event's last record is already ahead of anything queued from now on. */
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	FK_CALL("cuStreamWaitEvent", stream_wait_event(hStream, hEvent, Flags));
}

/* --- events --------------------------------------------------------------------- */

static CUresult event_create(CUevent *ph, unsigned int flags)
{
	struct fk_event *e;
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);
	int i;

	if (r)
		return r;
	if (!ph || (flags & ~0xfu))
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	i = table_new(&G.evt);
	if (i < 0) {
		UNLOCK();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e = FK_AT(&G.evt, struct fk_event, i);
	e->used = 1;
	e->magic = FK_EVT_MAGIC;
	e->ctx = c;
	e->flags = flags;
	*ph = (CUevent)e;
	UNLOCK();
	return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	FK_CALL("cuEventCreate", event_create(phEvent, Flags));
}

static CUresult event_record(CUevent ev, CUstream h)
{
	struct fk_event *e = (struct fk_event *)ev;
	struct fk_op op = {.type = OP_RECORD};
	struct fk_stream *s;
	CUresult r;

	LOCK();
	r = stream_resolve(h, &s);
	if (!r && !event_valid(e))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (!r) {
		op.event = e;
		r = stream_enqueue(&op, s);
	}
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	FK_CALL("cuEventRecord", event_record(hEvent, hStream));
}

static CUresult event_seq(CUevent ev, uint64_t *seq)
{
	struct fk_event *e = (struct fk_event *)ev;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	if (!event_valid(e))
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		*seq = e->rec_seq;
	UNLOCK();
	return r;
}

static CUresult event_sync(CUevent ev)
{
	uint64_t seq;
	CUresult r = event_seq(ev, &seq);

	return r ? r : stream_sync_seq(seq);
}

FK_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	FK_CALL("cuEventSynchronize", event_sync(hEvent));
}

static CUresult event_query(CUevent ev)
{
	uint64_t seq;
	CUresult r = event_seq(ev, &seq);

	if (r)
		return r;
	return atomic_load(&done_seq) >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FK_API CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	FK_CALL("cuEventQuery", event_query(hEvent));
}

static CUresult event_destroy(CUevent ev)
{
	struct fk_event *e = (struct fk_event *)ev;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	if (!event_valid(e))
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		e->used = 0, e->magic = 0;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
	FK_CALL("cuEventDestroy", event_destroy(hEvent));
}

static CUresult event_elapsed(float *ms, CUevent a, CUevent b)
{
	struct fk_event *s = (struct fk_event *)a, *e = (struct fk_event *)b;
	CUresult r = CUDA_SUCCESS;

	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	if (!event_valid(s) || !event_valid(e) || (s->flags | e->flags) & CU_EVENT_DISABLE_TIMING)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (!s->rec_seq || !e->rec_seq)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (atomic_load(&done_seq) < s->rec_seq || atomic_load(&done_seq) < e->rec_seq)
		r = CUDA_ERROR_NOT_READY;
	else
		*ms = (float)(e->t_ns - s->t_ns) / 1e6f;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	FK_CALL("cuEventElapsedTime", event_elapsed(pMilliseconds, hStart, hEnd));
}

FK_API CUresult CUDAAPI cuEventElapsedTime_v1(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	FK_CALL("cuEventElapsedTime", event_elapsed(pMilliseconds, hStart, hEnd));
}
