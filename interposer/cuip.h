/*
 * cuip.h - internal interfaces of libcuinterpose.so, the LD_PRELOAD half of
 * cuinterpose.
 *
 * Modules and what each owns:
 *   driver.c   the real driver (dlopen "libcuda.so.1") and the real dlsym
 *   resolve.c  every resolution path: ELF symbols, dlsym, cuGetProcAddress*,
 *              cudaGetDriverEntryPoint*; the table of replaced entry points
 *   runtime.c  process identity, start after cuInit, fork, logging
 *   gate.c     the API gate and the lifecycle phase
 *   vmm.c      tracked VMM allocations, logical handles, mappings, access
 *   ctx.c      contexts the application creates (synchronized at QUIESCE)
 *   ticket.c   ticket memfds (mint, recognise)
 *   xcache.c   export cache and the peer FD service (own lock, no driver)
 *   control.c  control socket, the "cuip-ctl" and "cuip-op" threads
 *   client.c   connecting to a control socket (importers, CLI)
 *   inspect.c  ProcessState of this process
 *   ops.c      checkpoint operations run by the op thread
 *   ipc.c      cuMemAlloc converted to POSIX-capable VMM (small requests as
 *              pieces of shared granularity-sized slabs); cuIpc* emulated
 *   peer.c     cuCtxEnable/DisablePeerAccess mirrored into VMM access
 *   multicast.c multicast objects: devices, bindings, teardown and rebuild
 *   pool.c     stream-ordered memory pools: tracked, private ones left to native,
 *              shared ones refused (own leaf lock pool_lock)
 *
 * Locks, outermost first: state_lock (vmm.c: records, mappings, handles),
 * xc_lock (xcache.c), gate lock (gate.c). The control thread takes only
 * xc_lock, never state_lock, and never calls the driver.
 */
#ifndef CUIP_INTERNAL_H
#define CUIP_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <cuda.h>

#include "client.h"
#include "wire.h"

/* cuda.h maps cuGetProcAddress to _v2; the 4-argument ELF symbol is ours too. */
#undef cuGetProcAddress

#define CUIP_API __attribute__((visibility("default")))
/* Code that sanitizer runtimes reach before they are initialized (their
 * interceptors resolve libc through our dlsym) must not be instrumented. */
#define CUIP_NOSAN __attribute__((no_sanitize_address, no_sanitize("undefined")))

/* CUDA 13.1 device-explicit multicast binds; the 13.0 cuda.h lacks them. */
CUresult CUDAAPI cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
				       CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				       unsigned long long flags);
CUresult CUDAAPI cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset,
					CUdeviceptr memptr, size_t size, unsigned long long flags);
/* The pre-12.0 four-argument form, still exported by the driver. */
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
/* cuda.h maps cuIpcOpenMemHandle to _v2; the old ELF symbol is ours too. */
#undef cuIpcOpenMemHandle
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult CUDAAPI cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					  CUdriverProcAddressQueryResult *symbolStatus);

/* Per-thread-default-stream pool entry points (cuda.h declares them only in that mode). */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* ---- logging (runtime.c) ------------------------------------------------ */

extern int cuip_log_level; /* CUINTERPOSE_LOG: 0 quiet, 1 errors (default), 2 info, 3 debug */
void cuip_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define pr_err(fmt, ...)   cuip_log(1, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...)  cuip_log(2, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...) cuip_log(3, fmt, ##__VA_ARGS__)

/* ---- the real driver (driver.c) ----------------------------------------- */

/* Every driver entry point the interposer itself calls. */
#define CUIP_REAL_FUNCS(X)                        \
	X(cuInit)                                 \
	X(cuDriverGetVersion)                     \
	X(cuDeviceGet)                            \
	X(cuDeviceGetCount)                       \
	X(cuDeviceGetUuid_v2)                     \
	X(cuDevicePrimaryCtxRetain)               \
	X(cuDevicePrimaryCtxRelease_v2)           \
	X(cuDevicePrimaryCtxGetState)             \
	X(cuCtxGetCurrent)                        \
	X(cuCtxSetCurrent)                        \
	X(cuCtxSynchronize)                       \
	X(cuMemCreate)                            \
	X(cuMemRelease)                           \
	X(cuMemRetainAllocationHandle)            \
	X(cuMemMap)                               \
	X(cuMemUnmap)                             \
	X(cuMemSetAccess)                         \
	X(cuMemExportToShareableHandle)           \
	X(cuMemImportFromShareableHandle)         \
	X(cuMemGetAllocationPropertiesFromHandle) \
	X(cuMemAddressReserve)                    \
	X(cuMemAddressFree)                       \
	X(cuMemcpyDtoH_v2)                        \
	X(cuMemcpyHtoD_v2)                        \
	X(cuMemcpyDtoHAsync_v2)                   \
	X(cuMemcpyHtoDAsync_v2)                   \
	X(cuMemHostAlloc)                         \
	X(cuMemFreeHost)                          \
	X(cuStreamCreate)                         \
	X(cuStreamDestroy_v2)                     \
	X(cuStreamSynchronize)                    \
	X(cuGetErrorString)                       \
	X(cuMulticastCreate)                      \
	X(cuMulticastAddDevice)                   \
	X(cuMulticastUnbind)                      \
	X(cuMulticastBindMem)                     \
	X(cuMulticastBindAddr)                    \
	X(cuMulticastBindMem_v2)                  \
	X(cuMulticastBindAddr_v2)                 \
	X(cuGetProcAddress)                       \
	X(cuGetProcAddress_v2)

struct cuip_real {
#define X(name) __typeof__(&name) name;
	CUIP_REAL_FUNCS(X)
#undef X
	void *cuGetProcAddress_v2_ptsz; /* not always exported */
};

extern struct cuip_real real;
/* Resolve the real driver once; 0 or -ENOENT (no libcuda.so.1). */
int cuip_driver_init(void);
CUIP_NOSAN void *cuip_real_dlsym(void *handle, const char *name);
void *cuip_driver_handle(void);
const char *cuip_cuerr(CUresult r);

/* ---- resolution (resolve.c) --------------------------------------------- */

/* Replace *pfn by our wrapper when it is a real entry point we replace. */
void cuip_substitute(const char *symbol, int version, cuuint64_t flags, void **pfn);

/* ---- runtime (runtime.c) ------------------------------------------------ */

struct cuip_device {
	int ordinal;
	uint8_t uuid[16];
};

struct cuip_self {
	uint64_t id;	/* process identity, random per incarnation */
	pid_t pid;	/* pid that owns this state */
	char sock[108]; /* control socket path */
	int ndev;
	struct cuip_device dev[64];
};

extern struct cuip_self self;
/* CUINTERPOSE_PRIVATE=native (read once at load, runtime.c): private
 * tracked memory is left to the driver's native checkpoint; otherwise the
 * carrier saves and reloads it like shared memory (cuip_carried). */
extern bool cuip_private_native;
/* Start the control server (after the first successful cuInit); idempotent. */
void cuip_start(void);
bool cuip_started(void);
/* cuInit's start-up: begin passes the start gate (startmark.h) and returns
 * true when this call is the one to start the runtime; then end(ok) with
 * whether the driver's cuInit succeeded. */
bool cuip_start_begin(void);
void cuip_start_end(bool ok);
/* Device ordinal -> UUID (NULL when unknown); UUID -> ordinal or -1. */
const uint8_t *cuip_dev_uuid(int ordinal);
int cuip_dev_by_uuid(const uint8_t *uuid);
/* Re-read the device list (after a restore, devices may have been remapped). */
void cuip_devices_rescan(void);
void cuip_random(void *buf, size_t len);

/* ---- gate and lifecycle (gate.c) ---------------------------------------- */

/* Enter a gated (tracked or launch-class) call; CUDA_SUCCESS or NOT_READY. */
CUresult cuip_gate_enter(void);
void cuip_gate_exit(void);
/* Close the gate and wait up to timeout_ms for in-flight calls: 0 or -ETIMEDOUT. */
int cuip_gate_close(unsigned timeout_ms);
void cuip_gate_open(void);
Cuip__Phase cuip_phase(void);
void cuip_set_phase(Cuip__Phase p);
void cuip_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cuip_failure(void);
uint64_t cuip_gate_waits(void);
void cuip_gate_reset(void); /* fork child */
/* Synchronize every context on a helper thread, waiting at most timeout_ms
 * (drain.c): 0, -ETIMEDOUT or -EIO, with msg saying why. */
int cuip_drain(unsigned timeout_ms, char *msg, size_t len);
void cuip_drain_reset(void); /* fork child */
unsigned cuip_ms_since(const struct timespec *t0);

/* ---- tracked VMM state (vmm.c) ------------------------------------------ */

/* Logical handles: top 16 bits are this tag; the fake and real drivers
 * never use them (real handles are user-space pointers or small values). */
#define CUIP_HTAG	   0xC1D0ull
#define CUIP_HTAG_SHIFT	   48
#define cuip_is_logical(h) (((uint64_t)(h) >> CUIP_HTAG_SHIFT) == CUIP_HTAG)

struct cuip_access {
	uint64_t va, size;
	CUmemLocation loc;
	unsigned flags;
};

struct cuip_alloc;

/* A piece of a slab (ipc.c): [off, off+size) of the allocation. The
 * creator's pieces are its live cuMemAlloc results; an importer's are the
 * pieces it IPC-opened, with their open counts. Sorted by off, disjoint. */
struct cuip_piece {
	uint64_t off, size; /* size: what cuMemAlloc was asked for */
	uint32_t opens;	    /* importer: opens not yet closed */
	bool loaded;	    /* LOAD: its carrier entry was read */
};

struct cuip_mapping {
	uint64_t va, size, offset;
	struct cuip_alloc *a;
	unsigned long long map_flags;
	bool detached;		 /* unmapped by PREPARE_UNICAST, VA kept for the rebuild */
	bool legacy;		 /* made by cuMemAlloc/cuIpcOpenMemHandle (ipc.c): the VA reservation is ours */
	struct cuip_access *acc; /* sorted by (location, va), non-overlapping, coalesced */
	size_t nacc, capacc;
};

struct cuip_alloc {
	uint64_t creator, serial;
	int creator_pid;
	Cuip__Owner owner;
	Cuip__Origin origin;
	CUmemAllocationProp prop;
	uint64_t size;
	CUmemGenericAllocationHandle drv; /* 0 while detached (PREPARED) */
	uint64_t logical;		  /* 0 once the application released it */
	uint32_t app_handles;
	uint32_t nmaps;
	uint32_t minted; /* tickets minted by this process */
	bool has_token;
	uint8_t token[16];
	char creator_sock[108];
	const char *unsupported; /* OWNER_UNSUPPORTED: why */
	uint64_t requested;	 /* ORIGIN_MALLOC/IPC_OPEN: the size the application asked for */
	uint64_t ipc_va;	 /* IPC-opened here: the mapping's address ... */
	uint32_t ipc_opens;	 /* ... and how many opens it has not closed */
	struct cuip_mc *mc;	 /* multicast object (multicast.c); NULL: unicast */
	uint32_t mc_binds;	 /* live multicast bindings of this member */
	bool slab;		 /* small cuMemAlloc requests share it as pieces (ipc.c) */
	struct cuip_piece *pieces;
	size_t npieces, cappieces;
	uint64_t slab_va;			  /* creator: where its one mapping is */
	uint64_t slab_used;			  /* creator: bytes its pieces take, PIECE_ALIGN-rounded */
	struct cuip_alloc *slab_prev, *slab_next; /* creator's slabs (vmm.slabs) */
	int32_t load_ix;			  /* LOAD: entry whose temporary map holds it, or -1 */
	struct cuip_alloc *id_next, *log_next;
	struct cuip_alloc *prev, *next; /* all records, creation order */
};

extern pthread_mutex_t cuip_state_lock;
struct cuip_vmm {
	struct cuip_alloc *head, *tail;
	size_t nallocs;
	struct cuip_mapping **maps; /* sorted by va */
	size_t nmaps, capmaps;
	uint64_t next_serial;
	uint64_t next_logical;
	uint32_t raw_imports;
	uint32_t unsupported;
	uint64_t peer[64];	  /* peer.c: bit `to` of peer[from]: from's contexts may access to's memory */
	struct cuip_alloc *slabs; /* ipc.c: this process's slabs, newest first */
};
extern struct cuip_vmm vmm;

struct cuip_alloc *cuip_alloc_by_id(uint64_t creator, uint64_t serial);
/* Unicast memory whose bytes the carrier saves and reloads, detached from
 * PREPARE_UNICAST to REBUILD: shared allocations (created or imported
 * here), and the private ones this process created unless
 * CUINTERPOSE_PRIVATE=native (then native checkpoint keeps them). */
bool cuip_carried(const struct cuip_alloc *a);
struct cuip_mapping *cuip_mapping_at(uint64_t va);
void cuip_vmm_reset(void); /* fork child: forget everything */
/* Re-hash after identities were reassigned (not needed: identities are stable). */
int cuip_map_insert(struct cuip_mapping *m);
int cuip_access_set(struct cuip_mapping *m, uint64_t va, uint64_t size, const CUmemLocation *loc, unsigned flags);
void cuip_logical_assign(struct cuip_alloc *a);
/* For ipc.c (caller holds the lock unless said otherwise): a new record; take
 * the mapping at va out of the table (nmaps of its record drops); unlink a
 * record nothing names any more (true: call cuip_alloc_release after
 * unlocking, which releases its driver handle and frees it). */
struct cuip_alloc *cuip_alloc_create(uint64_t creator, uint64_t serial);
struct cuip_mapping *cuip_map_take(uint64_t va);
void cuip_map_free(struct cuip_mapping *m);
bool cuip_alloc_unlink_if_dead(struct cuip_alloc *a);
void cuip_alloc_release(struct cuip_alloc *a);
/* Slab pieces (ipc.c, lock held): the piece of a that holds byte offset off
 * (exact: starts there), or NULL. */
struct cuip_piece *cuip_piece_at(const struct cuip_alloc *a, uint64_t off, bool exact);

/* ---- peer access mirror (peer.c) ----------------------------------------- */

/* Grant m the access that enabled peer access implies (caller holds the lock). */
void cuip_peer_grant(struct cuip_mapping *m);
/* For multicast.c (caller holds state_lock unless noted). */
struct cuip_alloc *cuip_alloc_new(uint64_t creator, uint64_t serial);
struct cuip_alloc *cuip_by_logical(uint64_t h);
/* Drop one member reference; true when the record died and was unlinked
 * (destroy it with cuip_alloc_destroy after unlocking). */
bool cuip_alloc_unbound(struct cuip_alloc *a);
void cuip_alloc_destroy(struct cuip_alloc *a); /* without state_lock */

/* ---- multicast objects (multicast.c) ------------------------------------ */

struct cuip_mc_dev {
	int ordinal;
	uint8_t uuid[16];
	bool has_uuid;
};

struct cuip_mc_bind {
	int dev;
	uint64_t mc_offset, size, member_offset, member_va, flags;
	struct cuip_alloc *member; /* holds one mc_binds reference */
	bool by_addr;
	unsigned abi; /* 1, or 2 for the device-explicit _v2 forms */
};

struct cuip_mc {
	uint32_t num_devices;
	uint64_t requested, effective; /* effective: the extent the driver accepted */
	uint64_t handle_types, flags;
	struct cuip_mc_dev *devs;
	size_t ndevs, capdevs;
	struct cuip_mc_bind *binds;
	size_t nbinds, capbinds;
	bool detached; /* torn down by PREPARE_MULTICAST, not yet rebuilt */
};

/* Fill a McProps (arena or caller memory) from a multicast record. */
void cuip_mc_props(const struct cuip_alloc *a, Cuip__McProps *p);
struct cuip_mc *cuip_mc_from_props(const Cuip__McProps *p);
void cuip_mc_note_extent(struct cuip_alloc *a, uint64_t end);
/* Record death (after the driver handle was released, without state_lock). */
void cuip_mc_forget(struct cuip_alloc *a);
void cuip_mc_free(struct cuip_mc *m); /* fork child: data only */
/* INSPECT: add this process's devices and bindings (arena memory). */
int cuip_mc_state(Cuip__ProcessState *st);
/* Op thread, state_lock held: 0 or a negative errno with err filled. */
int cuip_mc_prepare(char *err, size_t errlen);
bool cuip_mc_any_detached(void);
int cuip_mc_rebuild(const Cuip__Rebuild *rb, char *err, size_t errlen);
int cuip_mc_verify(const Cuip__ProcessState *exp, char *err, size_t errlen);

/* ---- tickets (ticket.c) ------------------------------------------------- */

/* Mint a sealed ticket memfd for a; returns the FD or a negative errno. */
int cuip_ticket_mint(const struct cuip_alloc *a, bool cloexec);
/* 1: fd is a ticket (*out filled, free with cuip__ticket__free_unpacked);
 * 0: not a ticket; negative errno: looks like ours but is malformed. */
int cuip_ticket_read(int fd, Cuip__Ticket **out);

/* ---- export cache (xcache.c) -------------------------------------------- */

/* Ensure one real export of (creator, serial) exists: 0 or CUresult via *cr. */
int cuip_xc_export(uint64_t serial, CUmemGenericAllocationHandle drv, const uint8_t token[16], CUresult *cr);
/* Drop the entry, waiting for in-flight serves; closes the real FD. */
void cuip_xc_drop(uint64_t serial);
/* Serve a dup of the cached export; returns an FD or a negative errno. A
 * successful serve records `by` (when not NULL) among the entry's importers. */
struct cuip_importer;
int cuip_xc_dup(uint64_t creator, uint64_t serial, const uint8_t *token, size_t toklen, const struct cuip_importer *by);
/* Forget the importers that are gone (INSPECT, before the copies). */
void cuip_xc_prune_importers(void);
/* Copy up to max importers of serial's export; *dropped: those not copied
 * or never recorded. Returns the count (0 when nothing is exported). */
unsigned cuip_xc_importers(uint64_t serial, struct cuip_importer *out, unsigned max, unsigned *dropped);
void cuip_xc_served(void);
uint64_t cuip_xc_served_count(void);
bool cuip_xc_has(uint64_t serial);
int cuip_xc_fd_cloexec(uint64_t serial); /* the cached FD's FD_CLOEXEC, or -1 */
void cuip_xc_reset(void);		 /* fork child */

/* ---- application-created contexts (ctx.c) ------------------------------- */

/* Snapshot of the live contexts created with cuCtxCreate*; returns the count. */
size_t cuip_contexts(CUcontext *out, size_t max);
void cuip_ctx_reset(void); /* fork child */

/* ---- control (control.c, client.c) -------------------------------------- */

int cuip_ctl_start(void);
void cuip_ctl_reset(void); /* fork child: close inherited sockets */
void cuip_ctl_stop(void);  /* exit: unlink the socket */

/* Talking to a control socket: client.h. */

/* ---- inspection and operations (inspect.c, ops.c) ----------------------- */

/* The op thread's reply arena: everything a reply points to comes from
 * here and is freed at once after the reply is sent (op thread only). */
void *cuip_zalloc(size_t size);
char *cuip_strdup(const char *s);
void cuip_arena_release(void);
/* Build this process's state from the records (caller holds state_lock);
 * memory from the arena. */
Cuip__ProcessState *cuip_state_build(void);
/* Run one plugin operation (op thread). fds: the FDs that came with it
 * (consumed; SAVE and LOAD: the carrier files, at most CUIP_OP_MAX_FDS). */
#define CUIP_OP_MAX_FDS 64 /* = CARRIER_FILES_MAX */
Cuip__Response *cuip_op_run(const Cuip__Request *req, const int *fds, size_t nfds);
void cuip_response_free(Cuip__Response *r);

/* ---- stream-ordered memory pools (pool.c) -------------------------------- */

/* A tracked pool block or imported pool pointer at va was freed (cuMemFree). */
void cuip_pool_freed(uint64_t va);
/* How many pools are shared (refused); msg names the first with pid and why. */
int cuip_pool_refusal(char *msg, size_t len);
/* INSPECT: add the pools (arena memory; caller holds state_lock). 0 or -1. */
int cuip_pool_state(Cuip__ProcessState *st);

#endif /* CUIP_INTERNAL_H */
