/*
 * pstree.h - the process tree of a CRIU image directory (pstree.img), as
 * the restore's guardian needs it: every process's pid and its parent's,
 * in the images' order (a parent before its children). CRIU recreates
 * each process under that pid (in the pid namespace of the tree's root:
 * a root of pid 1 means a new pid namespace). Read by hand: the file is
 * two magics then, per process, a little-endian u32 size and a
 * PstreeEntry message (protobuf: 1 pid, 2 ppid, 3 pgid, 4 sid,
 * 5 threads); no CRIU schema is built into this project. Stateless.
 */
#ifndef CUIP_PLUGIN_PSTREE_H
#define CUIP_PLUGIN_PSTREE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CUIP_PSTREE_IMG	      "pstree.img"
#define CUIP_PSTREE_MAX_BYTES (16u << 20)

struct cuip_pstree_task {
	pid_t pid, ppid;
};

struct cuip_pstree {
	struct cuip_pstree_task *t; /* t[0] is the root */
	size_t n;
};

/* Parse pstree.img's bytes b[0..n): 0, or -EINVAL (-ENOMEM) with err set. */
int cuip_pstree_parse(struct cuip_pstree *pt, const uint8_t *b, size_t n, char *err, size_t errlen);

/* pstree.img of image directory dirfd: 0, or -errno with err set. */
int cuip_pstree_read(int dirfd, struct cuip_pstree *pt, char *err, size_t errlen);

/* Whether pid is a process of the tree. */
int cuip_pstree_has(const struct cuip_pstree *pt, pid_t pid);

void cuip_pstree_free(struct cuip_pstree *pt);

#endif /* CUIP_PLUGIN_PSTREE_H */
