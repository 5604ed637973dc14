/*
 * Internal state of the fake driver (libcuda.so.1).  Declared here, defined in
 * the module that owns each table (see the comment on each).
 *
 * Locking: G.lock (a mutex) protects every table below and is taken inside the
 * API gate only.  conn.c's connection mutex nests inside it.  The work queue
 * (stream.c) has its own q_lock.  The restore thread never takes any of them:
 * it runs only while the process is LOCKED, when the gate guarantees that no
 * thread is inside the API and the queue is drained (restore_thread.c).
 *
 * No table comes from malloc, so that the restore thread can walk and change
 * them with no allocator (CRIU's plugins resume it alone while the other
 * threads are frozen, possibly inside malloc): the fixed ones are arrays in G,
 * and those a large job outgrows (reservations, contexts, streams, events)
 * are struct fk_table, which grows in place (table.c).
 */
#ifndef FAKECUDA_FAKE_H
#define FAKECUDA_FAKE_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "devdwire.h"

#define FK_API __attribute__((visibility("default")))

/* CUDA 13.1 device-explicit multicast binds; not in the 13.0 cuda.h. */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);
/* Old ABI entry points still exported by real drivers, not declared by cuda.h 13.0 outside its internal block. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
				CUdevice dev);
/* The unversioned names of those are macros in cuda.h: define them under asm labels. */
CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle,
				       unsigned int Flags) __asm__("cuIpcOpenMemHandle");
CUresult CUDAAPI cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
				     cuuint64_t flags) __asm__("cuGetProcAddress");
CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
CUresult CUDAAPI cuDevicePrimaryCtxRelease_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v1(CUdevice dev, unsigned int flags) __asm__("cuDevicePrimaryCtxSetFlags");
CUresult CUDAAPI cuEventElapsedTime_v1(float *pMilliseconds, CUevent hStart,
				       CUevent hEnd) __asm__("cuEventElapsedTime");

/* Fixed tables of G (allocations, mappings, multicast objects, modules,
 * host allocations): large jobs hold tens of thousands of allocations (issue
 * 11).  G has no initialiser, so it is in .bss (13 MB of the library's .bss,
 * `size libcuda.so`; init.c's constructor sets what is not zero): untouched
 * slots cost no memory.  Mappings are found through map_by_va (sorted);
 * cuIpcOpenMemHandle of a handle opened before still scans alloc[] and
 * map[].  The reservation, context, stream and event tables are not fixed:
 * they grow in place (struct fk_table, table.c). */
#define FK_MAX_ALLOC 65536
#define FK_MAX_MAP   65536
#define FK_MAX_MC    64
#define FK_MAX_MOD   256
#define FK_MAX_HOST  1024
/* What the growing tables may reach: address space reserved, not memory
 * (table.c makes it usable 64 KiB at a time). */
#define FK_CAP_RESV (1 << 22)
#define FK_CAP_CTX  (1 << 16)
#define FK_CAP_STRM (1 << 20)
#define FK_CAP_EVT  (1 << 20)

/*
 * A table that grows in place (table.c): entries [0, n) are usable, the rest
 * of the reservation of cap entries is not; entries never move.  Each entry
 * type has an int `used` (0: free).
 */
struct fk_table {
	unsigned char *base; /* NULL until first grown */
	size_t esize, used_off;
	int cap;
	atomic_int n;
	size_t made; /* bytes of the reservation made usable */
	int hint;    /* where table_new looks first */
};
#define FK_TABLE_INIT(type, cap_) \
	((struct fk_table){.esize = sizeof(type), .used_off = offsetof(type, used), .cap = (cap_)})
#define FK_AT(t, type, i) ((type *)((t)->base + (size_t)(i) * (t)->esize))
/* A free entry, zeroed, growing the table when none is; -1 when it is full
 * or the kernel gives no memory.  G.lock held.  The caller sets `used`. */
int table_new(struct fk_table *t);
/* Index of the entry p points at, -1 if p is no entry's start.  Any thread. */
int table_index(const struct fk_table *t, const void *p);

/*
 * Handle values (CUmemGenericAllocationHandle) handed to the application:
 *   bits 63..48  always 0 (free for an interposer's tags)
 *   bits 47..40  0xA1 physical allocation, 0xC1 multicast object
 *   bits 39..16  generation of the slot (stale handles are detected)
 *   bits 15..0   slot index
 */
#define FK_HTAG_ALLOC 0xA1ull
#define FK_HTAG_MC    0xC1ull

static inline CUmemGenericAllocationHandle fk_handle(uint64_t tag, int slot, uint32_t gen)
{
	return tag << 40 | (uint64_t)(gen & 0xffffff) << 16 | (uint64_t)slot;
}

/* Slot of a live VMM allocation handle (handle references > 0), or -1.  G.lock held. */
int handle_alloc_slot(CUmemGenericAllocationHandle h);
/* Slot of a live multicast handle, or -1.  G.lock held. */
int handle_mc_slot(CUmemGenericAllocationHandle h);
int mc_slot_new(void);

enum fk_akind {
	FK_A_LINEAR = 1, /* cuMemAlloc */
	FK_A_VMM,	 /* cuMemCreate or imported */
	FK_A_IPC,	 /* cuIpcOpenMemHandle */
};

/* One physical allocation this process holds one devd connection reference on. */
struct fk_alloc {
	int used;
	uint32_t gen;
	enum fk_akind kind;
	uint64_t devd_id;
	uint64_t aoff; /* offset in devd's arena of its device */
	int ord;       /* device ordinal as the application sees it */
	size_t size;
	uint32_t dflags; /* FKW_AF_* */
	int imported;	 /* VMM import (cuMemImportFromShareableHandle) */
	int handle_refs; /* VMM: cuMemCreate/Import/Retain minus cuMemRelease */
	int map_refs;	 /* mappings that name this slot */
	int ipc_open_refs;
	CUmemAllocationProp prop;
	struct fk_ctx *ctx;  /* linear: owning context */
	unsigned char *win;  /* its bytes in the process's mapping of the arena (NULL when checkpointed) */
	unsigned char *save; /* checkpoint: its part of the one anonymous save buffer */
};

/* A multicast object this process holds a devd reference on. */
struct fk_mc {
	int used;
	uint32_t gen;
	uint64_t devd_id;
	size_t size, size_eff;
	unsigned int ndev;
	int handle_refs;
	int map_refs;
	int imported;
	uint64_t bgen; /* generation of the cached bindings below */
	int nb;
	struct fk_mcb {
		int phys;
		size_t mcoff, memoff, size, alloc_size;
		unsigned char *win;
	} b[FKW_MAX_BIND];
};

/* A device virtual address range backed by an allocation or a multicast object. */
struct fk_map {
	int used;
	uint64_t va;
	size_t size;
	int is_mc;
	int slot; /* fk_alloc or fk_mc index */
	size_t off;
	uint32_t access; /* bit per ordinal: read-write access set */
};

/* A PROT_NONE reservation of device virtual addresses in the process. */
struct fk_resv {
	int used;
	uint64_t va;
	size_t size;
	int vmm; /* cuMemAddressReserve (else owned by a linear/IPC allocation) */
};

struct fk_ctx {
	uint32_t magic;
	int used;
	int ord;
	unsigned int flags;
	int primary;
	uint32_t peer;	 /* ordinals this context has peer access to */
	size_t limit[5]; /* CUlimit 0..4 (cuCtxGetLimit), contexts.c */
	int launched;	 /* a kernel ran: the printf FIFO is fixed */
};

/* Stack threads a context reserves device memory for: CU_LIMIT_STACK_SIZE
 * bytes each (the H200: 132 SMs x 2048 threads, 264 MiB at the default 1024
 * bytes; here 1 MiB). The native checkpoint copies the reservation into
 * the process, as NVIDIA's does (test/gpu/ctxrss.py); unlike the H200's
 * cuMemGetInfo, the fake's counts only allocations (the devd's). */
#define FK_STACK_THREADS 1024u
/* Device bytes of c's stack reservation. */
static inline uint64_t ctx_stack_bytes(const struct fk_ctx *c)
{
	return (uint64_t)c->limit[CU_LIMIT_STACK_SIZE] * FK_STACK_THREADS;
}

struct fk_stream {
	uint32_t magic;
	int used;
	struct fk_ctx *ctx;
	unsigned int flags;
	int prio;
	uint64_t last_seq; /* sequence of the last work item queued */
};

struct fk_event {
	uint32_t magic;
	int used;
	struct fk_ctx *ctx;
	unsigned int flags;
	uint64_t rec_seq; /* 0: never recorded */
	int64_t t_ns;
};

/* Kernel parameters: at most this many, each at most 8 bytes (the fake's
 * kernels; struct fk_op packs them in 8-byte slots). */
#define FK_MAX_ARGS 8
/* Entries of a PTX module the fake can run, recorded per module. */
#define FK_MOD_FUNCS 4

/* A function of a PTX module (module.c): one of the kernels the fake runs,
 * with the parameter layout the PTX declares. CUfunction points at one. */
struct fk_pfunc {
	uint32_t magic;
	const struct fk_kernel *k;
	int nargs;
	uint8_t argsz[FK_MAX_ARGS], argalign[FK_MAX_ARGS];
};

struct fk_module {
	uint32_t magic;
	int used;
	struct fk_ctx *ctx;
	int ptx; /* the image was PTX text: only fn[] are its functions */
	int nfn;
	struct fk_pfunc fn[FK_MOD_FUNCS];
};

struct fk_hostmem {
	int used;
	void *p;
	size_t size;
	int registered; /* cuMemHostRegister (else allocated by us) */
};

struct fk_primary {
	int refs;
	unsigned int flags;
	int ctx; /* index in G.ctx, -1 when inactive */
};

/* A device arena as this process maps it (arena.c). */
struct fk_arena {
	int fd;		     /* devd's memfd, -1 with no connection */
	unsigned char *base; /* PROT_NONE reservation of span bytes, NULL until first needed */
	uint64_t span;
	uint64_t mapped; /* [base, base + mapped) maps the arena from offset 0 */
};

/* What the process knows of the devices (from devd's HELLO). */
struct fk_devices {
	int n; /* devd's physical devices == ordinals visible */
	struct fkw_dev_info phys[FKW_MAX_DEV];
	int ord2phys[FKW_MAX_DEV];
	uint64_t mc_gran, mc_rec_gran;
	struct fkw_config cfg; /* the machine devd serves (cuInit checks it) */
};

struct fk_global {
	pthread_mutex_t lock;
	atomic_int initialized;
	pid_t pid;
	int conn;			    /* the device connection, -1 when closed (checkpointed) */
	struct fk_arena arena[FKW_MAX_DEV]; /* per physical device */
	pthread_mutex_t conn_lock;
	char sockpath[108];
	struct fk_devices dev;
	uint32_t used_ord; /* ordinals the process used (checkpointed GPUs) */
	struct fk_alloc alloc[FK_MAX_ALLOC];
	struct fk_mc mc[FK_MAX_MC];
	struct fk_map map[FK_MAX_MAP];
	int map_by_va[FK_MAX_MAP]; /* slots of used mappings, sorted by va */
	int nmap;
	int alloc_hint;	      /* where alloc_slot_new looks first */
	struct fk_table resv; /* struct fk_resv */
	struct fk_table ctx;  /* struct fk_ctx; CUcontext points at one */
	struct fk_primary prim[FKW_MAX_DEV];
	struct fk_table strm; /* struct fk_stream; CUstream points at one */
	struct fk_table evt;  /* struct fk_event; CUevent points at one */
	struct fk_module mod[FK_MAX_MOD];
	struct fk_hostmem host[FK_MAX_HOST];
	CUresult sticky; /* asynchronous error, reported by later synchronizing calls */
};

extern struct fk_global G;

#define FK_CTX_MAGIC 0x43545846u
#define FK_STR_MAGIC 0x53545246u
#define FK_EVT_MAGIC 0x45565446u
#define FK_MOD_MAGIC 0x4d4f4446u

/* devnode.c: the driver's device files (open at cuInit and native restore,
 * closed at native checkpoint; a forked child keeps the parent's: forget). */
void devnode_open(void);
void devnode_close(void);
void devnode_forget(void);
/* Another descriptor of the node (a shared pool's channel keeps one open
 * through native checkpoint, as the H200 keeps /dev/nvidiactl), or -1. */
int devnode_dup(void);

/* init.c */
CUresult fk_enter(const char *api);
void fk_leave(void);
#define FK_CALL(name, expr)                   \
	do {                                  \
		CUresult r_ = fk_enter(name); \
		if (r_ != CUDA_SUCCESS)       \
			return r_;            \
		r_ = (expr);                  \
		fk_leave();                   \
		return r_;                    \
	} while (0)
/*
 * The checkpoint API answers in a process that never called cuInit, as
 * NVIDIA's driver does (measured on an H200: test/gpu/facts.sh, "no-cuinit"):
 * it touches no state of the caller, so before cuInit there is no gate to
 * pass, only the fault table.  *entered: fk_leave is owed.
 */
CUresult fk_enter_any(const char *api, int *entered);
#define FK_CALL_ANY(name, expr)                        \
	do {                                           \
		int e_;                                \
		CUresult r_ = fk_enter_any(name, &e_); \
		if (r_ != CUDA_SUCCESS)                \
			return r_;                     \
		r_ = (expr);                           \
		if (e_)                                \
			fk_leave();                    \
		return r_;                             \
	} while (0)
#define LOCK()	 pthread_mutex_lock(&G.lock)
#define UNLOCK() pthread_mutex_unlock(&G.lock)
int64_t fk_now_ns(void);

/* apigate.c: the API gate the checkpoint lock closes. */
void gate_enter(void);
void gate_leave(void);
int gate_try_enter(void);		 /* 1 entered, 0 closed (does not wait) */
int gate_close(unsigned int timeout_ms); /* restore thread; 0 or -ETIMEDOUT */
void gate_open(void);

/* faults.c */
void faults_init(void);
CUresult faults_check(const char *api);

/* conn.c: requests to devd. */
void conn_setup(void); /* cuInit: FAKECUDA_FLUSH_US */
/* A synchronous request (after everything queued, on the same sendmsg). */
CUresult conn_rpc(const struct fkw_req *q, struct fkw_resp *r, int *fds, int maxfds);
CUresult conn_rpc_unlocked(int fd, const struct fkw_req *q, struct fkw_resp *r, int *fds, int maxfds);
/* One-way, sent now after everything queued; sendfd stays the caller's. */
CUresult conn_send(const struct fkw_req *q, int sendfd);
/* One-way, queued (sent in a batch); fd (-1: none) is duplicated into the queue. */
CUresult conn_queue(const struct fkw_req *q, int fd);
int64_t conn_flush_due(void); /* when the queue must go out (ns), 0: empty */
int conn_flush_async(void);   /* the worker: 0 flushed, -1 the gate is closed */
void conn_flush_gated(void);  /* the restore thread, gate closed */
void conn_fork_prepare(void);
void conn_fork_parent(void);
void conn_fork_child(void);
CUresult conn_open(int *fdp, struct fk_devices *dev, struct fk_arena *arenas);
void conn_close_all(void);
void conn_drop(int kind, uint64_t id); /* one-way */

/* arena.c: each device's arena mapped once; see there. */
void arena_setup(void);
void arena_reset(struct fk_arena *ar, int n);
/* The bytes [off, off+size) of the arena, mapping what is new; NULL if out of the reservation. */
unsigned char *arena_ptr(struct fk_arena *ar, uint64_t off, size_t size);
/* The same in this process's arena of physical device `dev` (NULL when dev
 * is out of range: a value that came from devd or an export record). */
unsigned char *arena_at(unsigned dev, uint64_t off, size_t size);
void arena_drop(struct fk_arena *ar, int n); /* unmaps and closes */

/* device.c */
CUresult dev_check(CUdevice d);
int dev_phys(int ord);
int dev_ord_of_phys(int phys);
/* FAKECUDA_FABRIC: creation accepts FABRIC handle types (export/import of one still fail). */
int fk_fabric(void);

/* contexts.c */
struct fk_ctx *ctx_current(void);
CUresult ctx_require(struct fk_ctx **out);
int ctx_valid(struct fk_ctx *c);
void ctx_note_use(int ord);
void linear_free_ctx(struct fk_ctx *c); /* mem.c; G.lock held */

/* devmem.c: device virtual addresses. */
uint64_t va_reserve(size_t size, size_t align, uint64_t hint);
void va_release(uint64_t va, size_t size);
struct fk_map *map_find(uint64_t va);
int map_add(uint64_t va, size_t size, int is_mc, int slot, size_t off, uint32_t access);
/* Mark a mapping unused and drop it from the va index.  G.lock held. */
void map_del(struct fk_map *m);
/* Index in G.map_by_va of the first mapping that ends above va.  G.lock held. */
int map_lower(uint64_t va);
/* FAKECUDA_VMM_GRANULARITY_KB (default 2 MiB, as the real driver). */
size_t fk_granularity(void);
/* FAKECUDA_CKPT_US_PER_MB: native checkpoint/restore pace (0: memcpy speed). */
extern unsigned fk_ckpt_us_per_mb;
/* FAKECUDA_CKPT_LOG: a file each native checkpoint appends one line to,
 * "pid P native checkpoint saved B bytes in N allocations and S bytes of
 * context stacks" (tests see what native moved; empty: none). Read at
 * cuInit. */
extern char fk_ckpt_log[256];
/* FAKECUDA_COPY_US_PER_MB: pace of async host<->device copies (0: memcpy speed). */
extern unsigned fk_copy_us_per_mb;
/* FAKECUDA_COPY_LOG: a file every device-to-host copy appends one line to,
 * "pid P dtoh BYTES" (tests prove what crossed to the host; empty: none).
 * Read at cuInit; written by stream.c's op_execute. */
extern char fk_copy_log[256];
/* Copy between device VAs and host memory; G.lock held.  ord < 0: any accessor. */
CUresult devmem_read(void *dst, uint64_t va, size_t n, int ord);
CUresult devmem_write(uint64_t va, const void *src, size_t n, int ord);
CUresult devmem_fill(uint64_t va, const void *pattern, size_t psize, size_t count, int ord);
CUresult devmem_copy(uint64_t dst, uint64_t src, size_t n, int ord);
/*
 * The bytes [va, va+n) in place, for a kernel that only reads them: *p
 * points at them when they lie in one mapping of one allocation (else NULL:
 * read them with devmem_read), and *fd, *foff name the arena file and
 * offset that back *p (-1: unknown), where a hole reads as zeros
 * (lseek SEEK_DATA). Errors as devmem_read's.  G.lock held.
 */
CUresult devmem_view(uint64_t va, size_t n, int ord, const unsigned char **p, int *fd, uint64_t *foff);
int devmem_is_device(uint64_t va);
int alloc_slot_new(void);
void alloc_slot_put(int slot); /* drops the devd reference when nothing holds the slot */
/*
 * Slot `slot` (new, used) takes the devd allocation request q gives (FKW_ALLOC
 * or FKW_IPC_OPEN): devd's answer in *r, its arena window on physical device
 * dev (~0u: the one devd answered) of size bytes (0: the size devd answered),
 * and unless align is 0 (VMM memory, mapped by the application) a fresh VA
 * range of that size aligned to align in *va with a mapping of its first
 * map_size bytes (0: all).  On failure the devd allocation is dropped and
 * the slot given back.  mem.c, mempools.c, ipchandles.c, vmemory.c; G.lock held.
 */
CUresult alloc_open(int slot, const struct fkw_req *q, uint32_t dev, uint64_t size, uint64_t align, uint64_t map_size,
		    struct fkw_resp *r, uint64_t *va);
void mc_slot_put(int slot);
CUresult mc_refresh(struct fk_mc *m);

/* stream.c: the in-order work queue that stands for device execution. */
enum fk_op_type { OP_COPY, OP_FILL, OP_KERNEL, OP_RECORD, OP_HOST_TO_DEV, OP_DEV_TO_HOST, OP_HOST_COPY };
struct fk_op {
	enum fk_op_type type;
	struct fk_stream *stream;
	int ord;
	uint64_t dst, src;
	void *host;
	size_t n;
	uint32_t pattern;
	size_t psize;
	struct fk_event *event;
	const struct fk_kernel *kernel;
	unsigned char args[8 * FK_MAX_ARGS]; /* kernel: argument i in bytes [8i, 8i+8) */
	unsigned grid[3], block[3];	     /* kernel: its launch dimensions */
	uint32_t delay_us;
	const char *hold; /* kernel: also runs until this file exists (at most FK_HOLD_MAX_S) */
};
#define FK_HOLD_MAX_S 120
void stream_init(void);
void stream_kick(void); /* the worker looks at the one-way queue's deadline */
CUresult stream_resolve(CUstream s, struct fk_stream **out);
CUresult stream_enqueue(struct fk_op *op, struct fk_stream *s);
CUresult stream_sync_seq(uint64_t seq);
CUresult stream_sync_all(void);
int stream_idle(void);
uint64_t stream_done_seq(void);
CUresult op_execute(struct fk_op *op);

/* module.c: a kernel the fake runs in C (on the stream's worker, G.lock
 * held); check (may be NULL) refuses a launch at cuLaunchKernel time. */
struct fk_kernel {
	const char *name;
	size_t argsz[FK_MAX_ARGS];
	int nargs;
	CUresult (*run)(const struct fk_op *op);
	CUresult (*check)(const struct fk_op *op);
};

/* ipchandles.c: devd's IPC tokens, shared by legacy IPC and pool pointer export
 * (mempools.c).  Both under G.lock. ipc_token_get marks allocation a as shared
 * by IPC and answers the token an importer presents; ipc_attach opens
 * devd allocation id with that token into the free slot `slot` (FK_A_IPC,
 * mapped at a fresh VA returned in *va, one open reference) and on failure
 * gives the slot back. */
CUresult ipc_token_get(struct fk_alloc *a, uint64_t *token);
CUresult ipc_attach(uint64_t id, uint64_t token, int slot, uint64_t *va);

/* mempools.c: a pool is shared (exported or imported) and live; no lock (restore thread). */
int pool_shared(void);

/* restore_thread.c */
int rt_start(void);
void rt_after_fork_child(void);

/* errors.c */
const char *fk_err_name(CUresult r);
int fk_err_from_name(const char *name, size_t len, CUresult *out);

#endif
