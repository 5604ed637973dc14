/*
 * The device node: what the fake has of the driver's /dev/nvidia* files.
 * On NVIDIA's driver a CUDA process maps /dev/nvidiactl and /dev/nvidia0
 * (30 mappings, 72 MiB on the H200) and holds descriptors of them, all
 * close-on-exec; the native checkpoint removes them, and a child forked
 * after cuInit inherits them although the driver does not know the child
 * (docs/driver-facts.md, "Forked children of CUDA processes"). CRIU cannot dump such a mapping or descriptor ("Can't handle
 * non-regular mapping", "Can't dump file ... unknown") unless a plugin
 * claims it.
 *
 * The fake maps FAKECUDA_DEVNODE (a block or character device; fakecuda-run
 * picks a free loop device where it can) with PROT_NONE, MAP_SHARED, not
 * MADV_DONTFORK, and keeps its descriptor open, from cuInit (or a native
 * restore) to the native checkpoint; a forked child keeps both. Nothing is
 * ever read or written through it. Without FAKECUDA_DEVNODE, or when it
 * cannot be opened (another user), there is no node: the rest works as
 * before, and a forked child holds nothing CRIU stops on.
 *
 * State under G.lock (the callers hold it, or run alone: the restore
 * thread with the API gate closed).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define NODE_MAP_BYTES (2 * 4096)

static int node_fd = -1;
static void *node_map = MAP_FAILED;

void devnode_open(void)
{
	const char *p = getenv("FAKECUDA_DEVNODE");
	struct stat st;
	int fd;

	if (node_fd >= 0 || !p || !*p)
		return;
	fd = open(p, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &st) || !(S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode))) {
		close(fd);
		return;
	}
	node_map = mmap(NULL, NODE_MAP_BYTES, PROT_NONE, MAP_SHARED, fd, 0);
	if (node_map == MAP_FAILED) {
		close(fd);
		return;
	}
	node_fd = fd;
}

void devnode_close(void)
{
	if (node_map != MAP_FAILED)
		munmap(node_map, NODE_MAP_BYTES);
	if (node_fd >= 0)
		close(node_fd);
	node_map = MAP_FAILED;
	node_fd = -1;
}

int devnode_dup(void)
{
	return node_fd >= 0 ? fcntl(node_fd, F_DUPFD_CLOEXEC, 3) : -1;
}

void devnode_forget(void)
{
	node_map = MAP_FAILED;
	node_fd = -1;
}
