/*
 * pstree.c - CRIU's pstree.img; see pstree.h. Stateless.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "criu_pstree.pb-c.h"
#include "pstree.h"

#define IMG_COMMON_MAGIC 0x54564319u
#define PSTREE_MAGIC	 0x50273030u

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void cuip_pstree_free(struct cuip_pstree *pt)
{
	for (size_t i = 0; i < pt->n; i++)
		free(pt->t[i].threads);
	free(pt->t);
	pt->t = NULL;
	pt->n = 0;
}

/* Entry e as task t: 0 or -ENOMEM. */
static int take(struct cuip_pstree_task *t, const CriuImg__PstreeEntry *e)
{
	t->pid = (pid_t)e->pid;
	t->ppid = (pid_t)e->ppid;
	t->pgid = (pid_t)e->pgid;
	t->sid = (pid_t)e->sid;
	t->n_threads = 0;
	t->threads = NULL;
	if (!e->n_threads)
		return 0;
	t->threads = malloc(e->n_threads * sizeof(*t->threads));
	if (!t->threads)
		return -ENOMEM;
	for (size_t i = 0; i < e->n_threads; i++)
		t->threads[i] = (pid_t)e->threads[i];
	t->n_threads = e->n_threads;
	return 0;
}

int cuip_pstree_parse(struct cuip_pstree *pt, const uint8_t *b, size_t n, char *err, size_t errlen)
{
	size_t off = 8;
	int ret = -EINVAL;

	memset(pt, 0, sizeof(*pt));
	*err = 0;
	if (n < 8) {
		snprintf(err, errlen, "%zu bytes, short of the 8 of its magic words", n);
		return -EINVAL;
	}
	if (le32(b) != IMG_COMMON_MAGIC || le32(b + 4) != PSTREE_MAGIC) {
		snprintf(err, errlen, "magic 0x%08x 0x%08x, not a pstree image's (0x%08x 0x%08x)", le32(b), le32(b + 4),
			 IMG_COMMON_MAGIC, PSTREE_MAGIC);
		return -EINVAL;
	}
	while (off < n) {
		size_t left = n - off, at = off;
		struct cuip_pstree_task *nt;
		CriuImg__PstreeEntry *e;
		uint32_t sz;

		if (left < 4) {
			snprintf(err, errlen, "entry %zu at byte %zu: %zu bytes left, short of its 4-byte size",
				 pt->n + 1, at, left);
			goto bad;
		}
		sz = le32(b + off);
		off += 4;
		if (sz > n - off) {
			snprintf(err, errlen, "entry %zu at byte %zu: size %u runs past the end, %zu bytes left",
				 pt->n + 1, at, sz, n - off);
			goto bad;
		}
		e = criu_img__pstree_entry__unpack(NULL, sz, b + off);
		if (!e) {
			snprintf(err, errlen, "entry %zu at byte %zu: %u bytes that do not decode as a pstree entry",
				 pt->n + 1, at, sz);
			goto bad;
		}
		nt = realloc(pt->t, (pt->n + 1) * sizeof(*nt));
		if (!nt || take(&nt[pt->n], e)) {
			if (nt)
				pt->t = nt;
			criu_img__pstree_entry__free_unpacked(e, NULL);
			snprintf(err, errlen, "out of memory at entry %zu", pt->n + 1);
			ret = -ENOMEM;
			goto bad;
		}
		pt->t = nt;
		pt->n++;
		criu_img__pstree_entry__free_unpacked(e, NULL);
		off += sz;
	}
	if (!pt->n || pt->t[0].pid <= 0) {
		snprintf(err, errlen, "%s", pt->n ? "the root's pid is 0" : "no entry, no process tree");
		goto bad;
	}
	return 0;
bad:
	cuip_pstree_free(pt);
	return ret;
}

int cuip_pstree_read(int dirfd, const char *name, struct cuip_pstree *pt, char *err, size_t errlen)
{
	uint8_t *b = NULL;
	struct stat st;
	size_t got = 0;
	ssize_t r;
	int fd, ret;

	memset(pt, 0, sizeof(*pt));
	*err = 0;
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		snprintf(err, errlen, "not a regular file");
		goto out;
	}
	if (st.st_size > CUIP_PSTREE_MAX_BYTES) {
		ret = -EFBIG;
		snprintf(err, errlen, "%lld bytes, more than a pstree image holds (%u)", (long long)st.st_size,
			 CUIP_PSTREE_MAX_BYTES);
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
		snprintf(err, errlen, "read %zu of its %lld bytes", got, (long long)st.st_size);
		goto out;
	}
	ret = cuip_pstree_parse(pt, b, got, err, errlen);
out:
	free(b);
	if (fd >= 0)
		close(fd);
	return ret;
}

int cuip_pstree_has(const struct cuip_pstree *pt, pid_t pid)
{
	for (size_t i = 0; i < pt->n; i++)
		if (pt->t[i].pid == pid)
			return 1;
	return 0;
}
