/*
 * Private wire format between libcuda.so.1 (the fake driver) and fakecuda-devd
 * (the fake device service).  Test-only and versioned by FKW_VERSION: both
 * sides are always built from the same tree, so plain fixed-size C structs are
 * enough.  Every request gets exactly one response of fixed size; descriptors
 * (memfds of device memory, export sockets) travel as SCM_RIGHTS on it.
 *
 * Used by devd.c and conn.c/restore_thread.c.  No state lives here.
 */
#ifndef FAKECUDA_WIRE_H
#define FAKECUDA_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FKW_VERSION  3
#define FKW_MAX_DEV  16
#define FKW_MAX_BIND 64
#define FKW_MAX_FDS  FKW_MAX_BIND

/* Device memory granularity: the VMM minimum and recommended granularity. */
#define FKW_GRANULARITY (2ul << 20)

enum fkw_op {
	FKW_HELLO = 1,	 /* -> device table */
	FKW_MEMINFO,	 /* dev -> size (free), size2 (total) */
	FKW_ALLOC,	 /* dev, size, flags -> id, memfd */
	FKW_DROP,	 /* kind, id: the connection drops one reference */
	FKW_EXPORT,	 /* kind, id -> export socket fd */
	FKW_IMPORT,	 /* export fd -> kind, id, size, dev, flags [, memfd] */
	FKW_IPC_GET,	 /* id -> token */
	FKW_IPC_OPEN,	 /* id, token -> size, dev, pid, memfd */
	FKW_MC_CREATE,	 /* n (numDevices), size, flags -> id, size2 (effective size) */
	FKW_MC_ADD,	 /* id, dev */
	FKW_MC_STATUS,	 /* id -> n (added), n2 (numDevices) */
	FKW_MC_BIND,	 /* id, dev, off (mc), id2 (alloc), off2 (mem), size */
	FKW_MC_UNBIND,	 /* id, dev, off, size */
	FKW_MC_BINDINGS, /* id, gen -> gen, n bindings + memfds if gen changed */
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
	uint32_t pad;
	uint64_t mcoff;
	uint64_t memoff;
	uint64_t size;
	uint64_t alloc_size;
};

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
	uint32_t dev;
	uint32_t flags;
	uint32_t kind;
	uint32_t n;
	uint32_t n2;
	int32_t pid;
	union {
		struct fkw_dev_info devs[FKW_MAX_DEV];
		struct fkw_binding b[FKW_MAX_BIND];
	} u;
};

/*
 * Helpers shared by both sides (wire.c).  They use only system calls, never
 * malloc or stdio, because the restore thread calls them while the rest of the
 * process may be frozen.
 */
int fkw_send(int fd, const void *buf, size_t len, const int *fds, int nfds);
/* Receives exactly len bytes; received descriptors (close-on-exec) go to fds. */
int fkw_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *nfds);
/* The socket path: $FAKECUDA_SOCKET or the built-in default. */
const char *fkw_socket_path(char *buf, size_t len);
int fkw_connect(const char *path);

#endif
