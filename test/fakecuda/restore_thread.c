/*
 * The target side of native checkpoint: the mailbox (mailbox.h) and the
 * restore thread that cuInit starts ("fakecuda-rstr").  It sleeps on the
 * mailbox doorbell and performs lock, checkpoint, restore and unlock itself.
 *
 * CRIU's plugins resume only this thread (PTRACE_CONT, every signal blocked)
 * while all other threads are frozen, so the checkpoint and restore paths here
 * take no lock, never call malloc/stdio (mmap and plain system calls only) and
 * never use signals.  This is safe because checkpoint and restore happen only
 * in the LOCKED state: the gate (apigate.c) guarantees no thread is inside the
 * API and the work queue is drained, so nobody else touches G.
 *
 * State: the mailbox page (shared with callers), rt_refusal (what a later
 * restore must fail with), and G's tables while LOCKED.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "mailbox.h"

static struct fk_mailbox *mb;
static CUresult rt_refusal; /* set by a checkpoint that held imported memory */

static long futex(uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

static CUresult rt_lock(void)
{
	if (mb->state != CU_PROCESS_STATE_RUNNING)
		return CUDA_ERROR_ILLEGAL_STATE;
	if (gate_close(mb->timeout_ms) < 0)
		return CUDA_ERROR_NOT_READY; /* the timeout: left RUNNING */
	/* devd sees every queued release and import before the process stops */
	conn_flush_gated();
	__atomic_store_n(&mb->state, CU_PROCESS_STATE_LOCKED, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

/*
 * The gate opens before the answer is posted: a caller that stops this
 * thread as soon as Unlock returns (CRIU's plugins do) must find the API
 * open, as on the real driver. A target that exits right after is noticed by
 * the caller's liveness check.
 */
static CUresult rt_unlock(int *open_gate)
{
	if (mb->state != CU_PROCESS_STATE_LOCKED)
		return CUDA_ERROR_ILLEGAL_STATE;
	__atomic_store_n(&mb->state, CU_PROCESS_STATE_RUNNING, __ATOMIC_RELEASE);
	*open_gate = 1;
	return CUDA_SUCCESS;
}

static int saved(const struct fk_alloc *a)
{
	return a->used && a->kind != FK_A_IPC && !a->imported;
}

/*
 * FAKECUDA_CKPT_US_PER_MB: a real driver moves device memory at 2-4 GB/s
 * with its copy engines while the CPU mostly waits. The pacer models that:
 * the copies go in steps of PACE_STEP bytes, and after each one the thread
 * sleeps until the modelled transfer has caught up with it, so the CPU work
 * of several processes checkpointing at once interleaves with the others'
 * waiting, as DMA would (one sleep after all the copying would instead make
 * every process's CPU work collide at the start).  No lock, no malloc:
 * restore-thread safe.
 */
#define PACE_STEP (1u << 20)

struct pacer {
	struct timespec t0;
	uint64_t bytes;
};

static void pace_start(struct pacer *pc)
{
	clock_gettime(CLOCK_MONOTONIC, &pc->t0);
	pc->bytes = 0;
}

/* `bytes` more were moved: wait until the model says they are done. */
static void pace(struct pacer *pc, uint64_t bytes)
{
	uint64_t us;
	struct timespec until;

	pc->bytes += bytes;
	if (!fk_ckpt_us_per_mb)
		return;
	us = pc->bytes * fk_ckpt_us_per_mb >> 20;
	until.tv_sec = pc->t0.tv_sec + (time_t)(us / 1000000);
	until.tv_nsec = pc->t0.tv_nsec + (long)(us % 1000000) * 1000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
		;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/*
 * The bytes of every saved allocation while CHECKPOINTED: one anonymous
 * mapping (CRIU dumps it as ordinary memory), each allocation's at a->save,
 * followed by the list of the saved slots (save_slot[save_n], in slot
 * order), so that restore visits those instead of the whole table (65536
 * slots, 8 MiB, per pass).
 */
static unsigned char *save_buf;
static size_t save_len;
static uint32_t *save_slot;
static uint32_t save_n;

static void save_free(void)
{
	for (uint32_t k = 0; k < save_n; k++)
		G.alloc[save_slot[k]].save = NULL;
	if (save_buf)
		munmap(save_buf, save_len);
	save_buf = NULL;
	save_len = 0;
	save_slot = NULL;
	save_n = 0;
}

/*
 * Host memory for len bytes, populated at once rather than one page fault
 * per 4 KiB page while copying, in huge pages where the kernel allows
 * (transparent huge pages "madvise" or "always": 512 times fewer pages to
 * allocate and free).  Either madvise may be refused (older kernels: EINVAL);
 * the copy then faults the pages in as before.
 */
static void *save_map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, len, MADV_HUGEPAGE);
	madvise(p, len, MADV_POPULATE_WRITE);
	return p;
}

/* Bytes that are contiguous on both sides of a copy. */
/*
 * A run of allocations contiguous on both sides, copied in PACE_STEP steps
 * with the modelled transfer paced between them. With an arena file (fd >=
 * 0: restore), the bytes go in through pwrite at off, not through the
 * mapping: the pages come into the arena in bulk, without a page fault per
 * 4 KiB page and without being zeroed first (the process's page tables fill
 * later, on touch); the mapping (dst) is the fallback.
 */
struct run {
	unsigned char *dst;
	const unsigned char *src;
	size_t len;
	int fd;
	uint64_t off;
};

static void run_copy(struct run *r, struct pacer *pc)
{
	size_t done = 0;

	while (done < r->len) {
		size_t step = r->len - done < PACE_STEP ? r->len - done : PACE_STEP;
		ssize_t n = r->fd >= 0 ? pwrite(r->fd, r->src + done, step, (off_t)(r->off + done)) : -1;

		if (n < 0 && r->fd >= 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			memcpy(r->dst + done, r->src + done, step);
			n = (ssize_t)step;
		}
		pace(pc, (uint64_t)n);
		done += (size_t)n;
	}
	r->len = 0;
}

/* Extends r by len bytes when both sides (and the file) continue it; else
 * copies r first and starts a new run. */
static void run_add(struct run *r, unsigned char *dst, const unsigned char *src, size_t len, int fd, uint64_t off,
		    struct pacer *pc)
{
	if (r->len && r->dst + r->len == dst && r->src + r->len == src && r->fd == fd) {
		r->len += len;
		return;
	}
	run_copy(r, pc);
	*r = (struct run){.dst = dst, .src = src, .len = len, .fd = fd, .off = off};
}

/* Decimal digits of v at the end of buf[0..len): returns where they start. */
static char *utoa_end(char *end, uint64_t v)
{
	do {
		*--end = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	return end;
}

/* FAKECUDA_CKPT_LOG: one line per checkpoint, plain system calls only. */
static void ckpt_log(uint64_t bytes, uint32_t n, uint64_t stack_bytes)
{
	char line[200], num[24], *p = line, *d;
	const char *parts[] = {"pid ",
			       NULL,
			       " native checkpoint saved ",
			       NULL,
			       " bytes in ",
			       NULL,
			       " allocations and ",
			       NULL,
			       " bytes of context stacks\n"};
	uint64_t vals[] = {0, (uint64_t)getpid(), 0, bytes, 0, n, 0, stack_bytes, 0};
	int fd;

	if (!fk_ckpt_log[0])
		return;
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		const char *s = parts[i];
		if (!s) {
			d = utoa_end(num + sizeof(num), vals[i]);
			s = d;
			while (d < num + sizeof(num))
				*p++ = *d++;
			continue;
		}
		while (*s)
			*p++ = *s++;
	}
	fd = open(fk_ckpt_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)(p - line)) < 0) {
		/* nothing to do: the test sees no line */
	}
	close(fd);
}

static CUresult rt_checkpoint(void)
{
	struct run run = {.fd = -1};
	struct pacer pc;
	uint64_t bytes = 0, stack_bytes = 0;
	CUresult refusal = CUDA_SUCCESS;
	size_t len = 0, slots;
	uint32_t n = 0;
	unsigned char *p;
	int i;

	if (mb->state != CU_PROCESS_STATE_LOCKED)
		return CUDA_ERROR_ILLEGAL_STATE;
	for (i = 0; i < FK_MAX_MC; i++)
		if (G.mc[i].used)
			return CUDA_ERROR_NOT_SUPPORTED; /* multicast is not checkpointable natively */
	pace_start(&pc);				 /* the model's clock runs from the start of the step */
	/* First get all the host memory, so that failing leaves everything as it was. */
	for (i = 0; i < FK_MAX_ALLOC; i++)
		if (saved(&G.alloc[i])) {
			len += G.alloc[i].size;
			n++;
		}
	/* The contexts' stack reservations go with them, at the end (nothing
	 * reads them back: the stacks hold nothing between kernels). */
	for (i = 0; i < atomic_load(&G.ctx.n); i++) {
		const struct fk_ctx *c = FK_AT(&G.ctx, struct fk_ctx, i);

		if (c->used && c->magic == FK_CTX_MAGIC)
			stack_bytes += ctx_stack_bytes(c);
	}
	if (n || stack_bytes) {
		slots = (len + stack_bytes + 7) / 8 * 8;
		p = save_map(slots + sizeof(*save_slot) * n);
		if (!p)
			return CUDA_ERROR_OUT_OF_MEMORY;
		save_buf = p;
		save_len = slots + sizeof(*save_slot) * n;
		save_slot = (uint32_t *)(p + slots);
	}
	/* Allocations next to each other in the arena (the usual case: a bump
	 * pointer hands them out in order) are copied as one run. */
	for (i = 0; i < FK_MAX_ALLOC; i++) {
		struct fk_alloc *a = &G.alloc[i];

		if (!a->used)
			continue;
		if (a->kind == FK_A_IPC && refusal == CUDA_SUCCESS)
			refusal = CUDA_ERROR_INVALID_VALUE;
		if (a->imported)
			refusal = CUDA_ERROR_NOT_SUPPORTED;
		if (saved(a)) {
			save_slot[save_n++] = (uint32_t)i;
			a->save = save_buf + bytes;
			run_add(&run, a->save, a->win, a->size, -1, 0, &pc);
			bytes += a->size;
		}
		a->win = NULL;
	}
	run_copy(&run, &pc);
	if (stack_bytes) { /* copied like the rest: the pacer's time and the pages */
		memset(save_buf + bytes, 0x5a, stack_bytes);
		pace(&pc, stack_bytes);
	}
	/* A shared pool keeps a device descriptor open (mempools.c): measured on
	 * the H200, the restore then fails this way and the CUDA state is lost. */
	if (pool_shared())
		refusal = CUDA_ERROR_OPERATING_SYSTEM;
	/* Releasing the device connection drops every device-side reference at
	 * once; the arena mappings and descriptors go too, so that CRIU finds no
	 * device memory to dump.  The queue is empty (the lock flushed it and
	 * the gate stayed closed); flushing again closes any copy of an export
	 * FD it could hold. */
	conn_flush_gated();
	conn_close_all();
	devnode_close();
	rt_refusal = refusal;
	ckpt_log(bytes, n, stack_bytes);
	__atomic_store_n(&mb->state, CU_PROCESS_STATE_CHECKPOINTED, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
}

static int uuid_eq(const uint8_t *a, const uint8_t *b)
{
	return !memcmp(a, b, 16);
}

/* Maps every ordinal onto a physical device of the new devd, following gpuPairs. */
static CUresult remap(const struct fk_devices *nd, int *ord2phys)
{
	uint32_t taken = 0;
	int ord, p;

	for (ord = 0; ord < G.dev.n; ord++) {
		const uint8_t *want = G.dev.phys[G.dev.ord2phys[ord]].uuid;
		int used = (G.used_ord >> ord) & 1;

		if (mb->npairs) {
			uint32_t k;

			for (k = 0; k < mb->npairs; k++)
				if (uuid_eq((const uint8_t *)mb->pairs[k].oldUuid.bytes, want))
					break;
			if (k < mb->npairs)
				want = (const uint8_t *)mb->pairs[k].newUuid.bytes;
			else if (used)
				return CUDA_ERROR_INVALID_VALUE; /* the pairs must cover every checkpointed GPU */
		}
		ord2phys[ord] = -1;
		for (p = 0; p < nd->n; p++)
			if (uuid_eq(nd->phys[p].uuid, want))
				ord2phys[ord] = p;
		if (ord2phys[ord] < 0 && used)
			return CUDA_ERROR_INVALID_DEVICE;
		if (ord2phys[ord] >= 0) {
			if (taken & (1u << ord2phys[ord]))
				return CUDA_ERROR_INVALID_VALUE;
			taken |= 1u << ord2phys[ord];
		}
	}
	/* Unused ordinals whose GPU is gone take whatever is left. */
	for (ord = 0; ord < G.dev.n; ord++)
		if (ord2phys[ord] < 0) {
			for (p = 0; p < nd->n && (taken & (1u << p)); p++)
				;
			ord2phys[ord] = p < nd->n ? p : 0;
			taken |= 1u << ord2phys[ord];
		}
	return CUDA_SUCCESS;
}

/* Saved bytes contiguous in the save buffer and in one new arena. */
/*
 * Re-creates every saved allocation with one FKW_ALLOC_BATCH round trip,
 * however many there are (entries and results share one mmap'd buffer: no
 * malloc here), and copies the bytes into the new arenas, one run per range
 * of allocations that are contiguous in both (the batch is handed out in
 * order, so usually a few runs for all of them).
 */
static CUresult recreate(int fd, struct fk_arena *arenas, const int *ord2phys, uint64_t *bytes, struct pacer *pc)
{
	struct fkw_req q = {.op = FKW_ALLOC_BATCH};
	struct fkw_resp r;
	struct run run = {.fd = -1};
	union slot {
		struct fkw_alloc_ent ent;
		struct fkw_alloc_ret ret;
	} * buf;
	size_t len;
	uint32_t n = save_n, k;
	CUresult res = CUDA_SUCCESS;

	if (n == 0)
		return CUDA_SUCCESS;
	len = sizeof(*buf) * n;
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (k = 0; k < n; k++) {
		struct fk_alloc *a = &G.alloc[save_slot[k]];

		assert(a->used && a->save);
		buf[k].ent.dev = (uint32_t)ord2phys[a->ord];
		buf[k].ent.size = a->size;
		buf[k].ent.flags = a->dflags & (FKW_AF_POSIX | FKW_AF_LINEAR | FKW_AF_GPUDIRECT);
	}
	q.n = n;
	if (fkw_send(fd, &q, sizeof(q), NULL, 0) < 0 || fkw_send(fd, buf, len, NULL, 0) < 0 ||
	    fkw_recv(fd, &r, FKW_RESP_HDR, NULL, 0, NULL) < 0) {
		res = CUDA_ERROR_DEVICE_UNAVAILABLE;
		goto out;
	}
	res = (CUresult)r.result;
	if (res == CUDA_SUCCESS && (r.n != n || fkw_recv(fd, buf, len, NULL, 0, NULL) < 0))
		res = CUDA_ERROR_DEVICE_UNAVAILABLE;
	if (res)
		goto out;
	for (k = 0; k < n; k++) {
		struct fk_alloc *a = &G.alloc[save_slot[k]];

		a->win = arena_ptr(&arenas[ord2phys[a->ord]], buf[k].ret.off, a->size);
		if (!a->win) {
			res = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		a->devd_id = buf[k].ret.id;
		a->aoff = buf[k].ret.off;
		run_add(&run, a->win, a->save, a->size, arenas[ord2phys[a->ord]].fd, a->aoff, pc);
		*bytes += a->size;
	}
	run_copy(&run, pc);
out:
	munmap(buf, len);
	return res;
}

static CUresult rt_restore(void)
{
	struct pacer pc;
	struct fk_devices nd;
	struct fk_arena arenas[FKW_MAX_DEV];
	int ord2phys[FKW_MAX_DEV];
	uint64_t bytes = 0;
	CUresult res;
	uint32_t k;
	int fd, i;

	if (mb->state != CU_PROCESS_STATE_CHECKPOINTED)
		return CUDA_ERROR_ILLEGAL_STATE;
	if (rt_refusal != CUDA_SUCCESS)
		return rt_refusal;
	pace_start(&pc);
	res = conn_open(&fd, &nd, arenas);
	if (res)
		return res;
	res = remap(&nd, ord2phys);
	if (res)
		goto err;
	res = recreate(fd, arenas, ord2phys, &bytes, &pc);
	if (res)
		goto err;
	/* Commit: nothing can fail from here on. */
	for (k = 0; k < save_n; k++)
		G.alloc[save_slot[k]].dflags &= ~FKW_AF_IPC; /* a new allocation is no IPC source */
	save_free();
	memcpy(G.dev.phys, nd.phys, sizeof(nd.phys));
	G.dev.mc_gran = nd.mc_gran;
	G.dev.mc_rec_gran = nd.mc_rec_gran;
	memcpy(G.dev.ord2phys, ord2phys, sizeof(ord2phys));
	memcpy(G.arena, arenas, sizeof(arenas));
	G.conn = fd;
	devnode_open();
	__atomic_store_n(&mb->state, CU_PROCESS_STATE_LOCKED, __ATOMIC_RELEASE);
	return CUDA_SUCCESS;
err:
	/* Closing the new connection frees what it created; keep the saved bytes for a retry. */
	for (i = 0; i < FK_MAX_ALLOC; i++)
		G.alloc[i].win = NULL;
	arena_drop(arenas, FKW_MAX_DEV);
	close(fd);
	return res;
}

static void *restore_thread(void *arg)
{
	uint32_t seen = 0;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_setname_np(pthread_self(), "fakecuda-rstr");
	__atomic_store_n(&mb->restore_tid, (int32_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	for (;;) {
		uint32_t s = __atomic_load_n(&mb->req_seq, __ATOMIC_ACQUIRE);
		int open_gate = 0;
		CUresult r;

		if (s == seen) {
			futex(&mb->req_seq, FUTEX_WAIT, s);
			continue;
		}
		seen = s;
		switch (mb->action) {
		case FK_MB_LOCK:
			r = rt_lock();
			break;
		case FK_MB_CHECKPOINT:
			r = rt_checkpoint();
			break;
		case FK_MB_RESTORE:
			r = rt_restore();
			break;
		case FK_MB_UNLOCK:
			r = rt_unlock(&open_gate);
			break;
		case FK_MB_STATE:
			r = CUDA_SUCCESS; /* the caller reads mb->state */
			break;
		default:
			r = CUDA_ERROR_INVALID_VALUE;
			break;
		}
		if (open_gate)
			gate_open();
		mb->result = r;
		__atomic_store_n(&mb->done_seq, s, __ATOMIC_RELEASE);
		futex(&mb->done_seq, FUTEX_WAKE, INT_MAX);
	}
	return NULL;
}

int rt_start(void)
{
	struct timespec nap = {0, 100000};
	pthread_attr_t attr;
	pthread_t t;
	int fd, err;

	fd = memfd_create(FK_MB_NAME, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, FK_MB_SIZE) < 0) {
		close(fd);
		return -errno;
	}
	mb = mmap(NULL, FK_MB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (mb == MAP_FAILED) {
		mb = NULL;
		return -ENOMEM;
	}
	mb->magic = FK_MB_MAGIC;
	mb->version = FK_MB_VERSION;
	mb->pid = getpid();
	mb->state = CU_PROCESS_STATE_RUNNING;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&t, &attr, restore_thread, NULL);
	pthread_attr_destroy(&attr);
	if (err) {
		munmap(mb, FK_MB_SIZE);
		mb = NULL;
		return -err;
	}
	while (!__atomic_load_n(&mb->restore_tid, __ATOMIC_ACQUIRE))
		nanosleep(&nap, NULL);
	return 0;
}

void rt_after_fork_child(void)
{
	/* The child has no restore thread: it must not look like a CUDA process to callers. */
	if (mb)
		munmap(mb, FK_MB_SIZE);
	mb = NULL;
}
