/*
 * pstree.h - CRIU's process tree image (pstree.img): every process a dump
 * holds, the root first and each parent before its children, with its pid,
 * parent, process group, session and threads as the dumped tree saw them
 * (in the pid namespace of the tree's root: a root of pid 1 was dumped in a
 * pid namespace of its own). CRIU recreates each process under that pid.
 *
 * The format: two little-endian u32 magic words (IMG_COMMON, PSTREE), then
 * per process a little-endian u32 size and that many bytes of one
 * PstreeEntry message (criu_pstree.proto says where the format comes from).
 * Every size is checked against the bytes left before it is used; each
 * message is decoded by the code protoc-c generates from criu_pstree.proto.
 * A short or corrupt image is -EINVAL with a reason naming the entry and its
 * byte offset (the caller names the file); nothing is read past the buffer.
 *
 * Read by the restore's guardian (plugin/hooks.c, plugin/guardian.c: which
 * processes a dead criu left) and `cuinterpose restore` (cli/cli_pstree.c:
 * which ids the restore recreates). Stateless; the caller owns the result.
 */
#ifndef CUIP_PSTREE_H
#define CUIP_PSTREE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CUIP_PSTREE_IMG	      "pstree.img"
#define CUIP_PSTREE_MAX_BYTES (16u << 20) /* far beyond any tree criu dumps */

struct cuip_pstree_task {
	pid_t pid, ppid, pgid, sid;
	pid_t *threads; /* its thread ids, the pid among them (n_threads may be 0) */
	size_t n_threads;
};

struct cuip_pstree {
	struct cuip_pstree_task *t; /* t[0] is the root */
	size_t n;
};

/* The image's bytes b[0..n) into pt: 0, or -EINVAL / -ENOMEM with err
 * saying why (pt is then empty). */
int cuip_pstree_parse(struct cuip_pstree *pt, const uint8_t *b, size_t n, char *err, size_t errlen);

/* The image `name` relative to dirfd (AT_FDCWD: a path) into pt: 0, or
 * -errno with err saying why ("" when strerror says it all). */
int cuip_pstree_read(int dirfd, const char *name, struct cuip_pstree *pt, char *err, size_t errlen);

/* Whether pid is a process of the tree. */
int cuip_pstree_has(const struct cuip_pstree *pt, pid_t pid);

void cuip_pstree_free(struct cuip_pstree *pt);

#endif /* CUIP_PSTREE_H */
