/*
 * Private wire format between libcuda.so.1 (the fake driver) and fakecuda-devd
 * (the fake device service).  Test-only and versioned by FKW_VERSION: both
 * sides are always built from the same tree, so plain fixed-size C structs are
 * enough.  A synchronous request gets exactly one response; one-way messages
 * (FKW_DROP, FKW_EXPORT, FKW_IMPORT_REF) get none, and devd processes a
 * connection's messages in order, all of them before its hangup, so a later
 * synchronous request on the same connection is ordered after them (another
 * connection's is not).  The library queues one-way messages and sends them
 * in batches, several fkw_req records on one sendmsg (conn.c); EXPORT and
 * IMPORT_REF records each take one descriptor, in record order, from those
 * the batch carries; no other record carries one.  Responses carry only the header (fkw_resp_len) except
 * for the ops that fill the union.  Descriptors (the device arenas at HELLO,
 * export sockets) travel as SCM_RIGHTS.
 *
 * Device memory: devd keeps one sparse memfd per device, the arena; an
 * allocation is an offset range of it, never reused, whose pages are punched
 * out when it is freed.  A process maps allocations with mmap(arena, offset).
 *
 * Used by devd.c and conn.c/restore_thread.c.  No state lives here.
 */
#ifndef FAKECUDA_WIRE_H
#define FAKECUDA_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FKW_VERSION  6
#define FKW_MAX_DEV  16
#define FKW_MAX_BIND 64
/* Descriptors on one message: the kernel's SCM_MAX_FD.  A batch of one-way
 * messages carries the descriptors of its EXPORT/IMPORT_REF records in
 * record order, on its first byte. */
#define FKW_MAX_FDS 253

/* Device memory granularity: the VMM minimum and recommended granularity. */
#define FKW_GRANULARITY (2ul << 20)

enum fkw_op {
	FKW_HELLO = 1,	 /* -> device table, one arena fd per device */
	FKW_MEMINFO,	 /* dev -> size (free), size2 (total) */
	FKW_ALLOC,	 /* dev, size, flags -> id, off (in the device's arena) */
	FKW_DROP,	 /* one-way: kind, id: the connection drops one reference */
	FKW_EXPORT,	 /* one-way: kind, id + devd's end of the export socketpair */
	FKW_IMPORT_REF,	 /* one-way: kind, id + the export fd: the connection takes a reference */
	FKW_ALLOC_BATCH, /* n, then n fkw_alloc_ent -> n, then n fkw_alloc_ret (all or nothing) */
	FKW_IPC_GET,	 /* id -> token */
	FKW_IPC_OPEN,	 /* id, token -> size, dev, pid, off */
	FKW_MC_CREATE,	 /* n (numDevices), size, flags -> id, size2 (effective size) */
	FKW_MC_ADD,	 /* id, dev */
	FKW_MC_STATUS,	 /* id -> n (added), n2 (numDevices) */
	FKW_MC_BIND,	 /* id, dev, off (mc), id2 (alloc), off2 (mem), size */
	FKW_MC_UNBIND,	 /* id, dev, off, size */
	FKW_MC_BINDINGS, /* id, gen -> gen, n bindings if gen changed */
	FKW_STATS,	 /* -> n (allocations), n2 (multicast objects), size (exports) */
	FKW_SHUTDOWN,
};

enum fkw_kind {
	FKW_KIND_ALLOC = 1,
	FKW_KIND_MC = 2,
};

/* Allocation flags, kept by devd so that importers learn them. */
#define FKW_AF_POSIX	 0x1u /* requestedHandleTypes has POSIX_FILE_DESCRIPTOR */
#define FKW_AF_LINEAR	 0x2u /* cuMemAlloc (not VMM) */
#define FKW_AF_IPC	 0x4u /* IPC-exported */
#define FKW_AF_GPUDIRECT 0x8u

struct fkw_req {
	uint32_t op;
	uint32_t kind;
	uint64_t id;
	uint64_t id2;
	uint64_t size;
	uint64_t off;
	uint64_t off2;
	uint64_t token;
	uint64_t gen;
	uint32_t dev;
	uint32_t flags;
	uint32_t n;
	int32_t pid;
};

struct fkw_dev_info {
	uint8_t uuid[16];
	char name[64];
	uint64_t total;
};

struct fkw_binding {
	uint32_t dev;
	uint32_t adev; /* the member allocation's device (its arena) */
	uint64_t mcoff;
	uint64_t memoff;
	uint64_t size;
	uint64_t alloc_size;
	uint64_t aoff; /* the member allocation's arena offset */
};

/*
 * The machine a devd serves, read from its environment when it starts
 * (FAKECUDA_DEVICES, _MEM_MB, _UUID_SEED, _MC_GRANULARITY_MB,
 * _MC_REC_GRANULARITY_MB, _MC_ROUND_MB, with devd's defaults).  HELLO hands it
 * over, and cuInit refuses a devd that differs from what its own environment
 * sets: a test asking for 2 devices never runs on a devd of 1.
 */
struct fkw_config {
	uint64_t devices, mem_mb, uuid_seed, mc_gran_mb, mc_rec_gran_mb, mc_round_mb;
};
void fkw_config_from_env(struct fkw_config *c);
/* "FAKECUDA_DEVICES=1 FAKECUDA_MEM_MB=4096 ..." */
void fkw_config_str(const struct fkw_config *c, char *buf, size_t len);
/* 1 and the first variable this environment sets that c differs from
 * ("FAKECUDA_DEVICES=2") in want; 0 when they agree. */
int fkw_config_mismatch(const struct fkw_config *c, char *want, size_t len);

struct fkw_resp {
	int32_t result; /* a CUresult */
	uint32_t nfds;
	uint64_t id;
	uint64_t size;
	uint64_t size2;
	uint64_t token;
	uint64_t gen;
	uint64_t mc_gran;
	uint64_t mc_rec_gran;
	uint64_t off; /* arena offset of an allocation */
	uint32_t dev;
	uint32_t flags;
	uint32_t kind;
	uint32_t n;
	uint32_t n2;
	int32_t pid;
	union {
		struct { /* HELLO */
			struct fkw_dev_info devs[FKW_MAX_DEV];
			struct fkw_config cfg;
		};
		struct fkw_binding b[FKW_MAX_BIND];
	} u;
};

/* Only HELLO and MC_BINDINGS responses carry the union (2.6 KB); the others
 * are the header alone. */
#define FKW_RESP_HDR offsetof(struct fkw_resp, u)
static inline size_t fkw_resp_len(uint32_t op)
{
	return op == FKW_HELLO || op == FKW_MC_BINDINGS ? sizeof(struct fkw_resp) : FKW_RESP_HDR;
}

/* FKW_ALLOC_BATCH (native restore): entries after the request, results after the response. */
struct fkw_alloc_ent {
	uint32_t dev;
	uint32_t flags;
	uint64_t size;
};
struct fkw_alloc_ret {
	uint64_t id;
	uint64_t off;
};
#define FKW_MAX_BATCH 65536

/*
 * What an export FD says about itself.  The exporting process writes it into
 * devd's end of the socketpair, so that it waits, unread, at the
 * application's end; an importer reads it with MSG_PEEK (it stays there for
 * the next importer).  Exactly what an importer needs to make its handle.
 */
#define FKW_EXPORT_MAGIC 0x46584b45u /* "EKXF" */
struct fkw_export_rec {
	uint32_t magic;
	uint32_t version; /* FKW_VERSION */
	uint32_t kind;	  /* FKW_KIND_* */
	uint32_t dev;	  /* physical device (allocations) */
	uint64_t id;
	uint64_t off; /* arena offset (allocations) */
	uint64_t size;
	uint64_t size2; /* multicast: effective size */
	uint32_t flags; /* FKW_AF_* or the multicast object's flags */
	int32_t pid;	/* creator */
	uint32_t ndev;	/* multicast: numDevices */
	uint32_t pad;
};

/*
 * Helpers shared by both sides (devdwire.c).  They use only system calls, never
 * malloc or stdio, because the restore thread calls them while the rest of the
 * process may be frozen.
 */
int fkw_send(int fd, const void *buf, size_t len, const int *fds, int nfds);
/* The same for several buffers (consumed: iov is advanced); fds go on the first byte. */
struct iovec;
int fkw_sendv(int fd, struct iovec *iov, int niov, const int *fds, int nfds);
/* Receives exactly len bytes; received descriptors (close-on-exec) go to fds. */
int fkw_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *nfds);
/* The socket path: $FAKECUDA_SOCKET or the built-in default. */
const char *fkw_socket_path(char *buf, size_t len);
int fkw_connect(const char *path);

#endif
