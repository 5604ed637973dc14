/*
 * cli_pstree.c - CRIU's pstree.img, read for `cuinterpose restore`
 * (cli_criu.c: which ids the restore recreates, whether the root led its
 * session) and by test/cli/pstreeread.c.
 *
 * The framing is read here, by hand: two little-endian u32 magic words
 * (IMG_COMMON, PSTREE), then entries, each a little-endian u32 size and
 * that many bytes of one message (criu_pstree.proto, which says where the
 * format comes from). Every size is checked against the bytes left before
 * it is used; each message is decoded by the code protoc-c generates from
 * criu_pstree.proto. A short or corrupt file is -EINVAL and a reason
 * naming the entry and its byte offset (the caller names the file); never
 * a read past the buffer.
 * Stateless; the caller owns the result.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "criu_pstree.pb-c.h"

#define IMG_COMMON_MAGIC 0x54564319u
#define PSTREE_MAGIC	 0x50273030u
#define PSTREE_MAX_SIZE	 (16u << 20) /* far beyond any tree criu dumps */

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void add_id(struct cli_ptree *t, uint32_t id)
{
	if (t->n < sizeof(t->ids) / sizeof(t->ids[0]))
		t->ids[t->n++] = (pid_t)id;
}

/* The whole image in b[0..n) into t: 0 or -EINVAL (why says it). */
static int parse(const uint8_t *b, size_t n, struct cli_ptree *t, char *why, size_t len)
{
	size_t off = 8;

	if (n < 8) {
		snprintf(why, len, "%zu bytes, short of the 8 of its magic words", n);
		return -EINVAL;
	}
	if (le32(b) != IMG_COMMON_MAGIC || le32(b + 4) != PSTREE_MAGIC) {
		snprintf(why, len, "magic 0x%08x 0x%08x, not a pstree image's (0x%08x 0x%08x)", le32(b), le32(b + 4),
			 IMG_COMMON_MAGIC, PSTREE_MAGIC);
		return -EINVAL;
	}
	while (off < n) {
		size_t left = n - off, at = off;
		CriuImg__PstreeEntry *e;
		uint32_t sz;

		if (left < 4) {
			snprintf(why, len, "entry %zu at byte %zu: %zu bytes left, short of its 4-byte size",
				 t->entries + 1, at, left);
			return -EINVAL;
		}
		sz = le32(b + off);
		off += 4;
		if (sz > n - off) {
			snprintf(why, len, "entry %zu at byte %zu: size %u runs past the end, %zu bytes left",
				 t->entries + 1, at, sz, n - off);
			return -EINVAL;
		}
		e = criu_img__pstree_entry__unpack(NULL, sz, b + off);
		if (!e) {
			snprintf(why, len, "entry %zu at byte %zu: %u bytes that do not decode as a pstree entry",
				 t->entries + 1, at, sz);
			return -EINVAL;
		}
		if (!t->entries) {
			t->root = (pid_t)e->pid;
			t->root_sid = (pid_t)e->sid;
		}
		add_id(t, e->pid);
		for (size_t i = 0; i < e->n_threads; i++)
			if (e->threads[i] != e->pid)
				add_id(t, e->threads[i]);
		criu_img__pstree_entry__free_unpacked(e, NULL);
		t->entries++;
		off += sz;
	}
	if (!t->entries || t->root <= 0) {
		snprintf(why, len, "%s", t->entries ? "the root's pid is 0" : "no entry, no process tree");
		return -EINVAL;
	}
	return 0;
}

int cli_pstree_read(const char *path, struct cli_ptree *t, char *why, size_t len)
{
	uint8_t *b = NULL;
	struct stat st;
	size_t got = 0;
	ssize_t r;
	int fd, ret;

	memset(t, 0, sizeof(*t));
	*why = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (st.st_size > PSTREE_MAX_SIZE) {
		ret = -EFBIG;
		snprintf(why, len, "%lld bytes, more than a pstree image holds (%u)", (long long)st.st_size,
			 PSTREE_MAX_SIZE);
		goto out;
	}
	b = malloc((size_t)st.st_size + 1);
	if (!b) {
		ret = -ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		r = read(fd, b + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (got < (size_t)st.st_size) {
		ret = -EIO;
		snprintf(why, len, "read %zu of its %lld bytes", got, (long long)st.st_size);
		goto out;
	}
	ret = parse(b, got, t, why, len);
out:
	free(b);
	if (fd >= 0)
		close(fd);
	return ret;
}
