/*
 * pstree.c - CRIU's pstree.img, read by hand (pstree.h). Called by
 * hooks.c at init(RESTORE), for the restore's guardian. Stateless: the
 * caller owns the tree it is given.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pstree.h"

#define IMG_COMMON_MAGIC 0x54564319u
#define PSTREE_MAGIC	 0x50273030u

static const uint8_t *varint(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int s = 0; p < end && s < 64; s += 7) {
		*v |= (uint64_t)(*p & 0x7f) << s;
		if (!(*p++ & 0x80))
			return p;
	}
	return NULL;
}

/* One PstreeEntry: its pid and ppid (threads and ids skipped). */
static int entry(const uint8_t *p, const uint8_t *end, struct cuip_pstree_task *t)
{
	bool has_pid = false;
	uint64_t key, v;

	t->pid = t->ppid = 0;
	while (p < end) {
		if (!(p = varint(p, end, &key)) || !(p = varint(p, end, &v)))
			return -EINVAL;
		if ((key & 7) == 0) {
			if ((key >> 3) == 1 && v > 0 && v <= INT32_MAX) {
				t->pid = (pid_t)v;
				has_pid = true;
			} else if ((key >> 3) == 2 && v <= INT32_MAX) {
				t->ppid = (pid_t)v;
			}
			continue;
		}
		if ((key & 7) != 2 || v > (uint64_t)(end - p))
			return -EINVAL; /* no fixed-size field in PstreeEntry */
		p += v;
	}
	return has_pid ? 0 : -EINVAL;
}

int cuip_pstree_parse(struct cuip_pstree *pt, const uint8_t *b, size_t n, char *err, size_t errlen)
{
	uint32_t m[2], sz;
	size_t off = 8;

	memset(pt, 0, sizeof(*pt));
	if (n < 8 || (memcpy(m, b, 8), m[0] != IMG_COMMON_MAGIC || m[1] != PSTREE_MAGIC)) {
		snprintf(err, errlen, "%s: not a CRIU process tree image (magic)", CUIP_PSTREE_IMG);
		return -EINVAL;
	}
	while (off + 4 <= n) {
		struct cuip_pstree_task *nt;

		memcpy(&sz, b + off, 4);
		off += 4;
		if (sz > n - off) {
			snprintf(err, errlen, "%s: entry %zu is cut short (%u bytes, %zu left)", CUIP_PSTREE_IMG, pt->n,
				 sz, n - off);
			goto bad;
		}
		nt = realloc(pt->t, (pt->n + 1) * sizeof(*nt));
		if (!nt) {
			snprintf(err, errlen, "%s: out of memory", CUIP_PSTREE_IMG);
			cuip_pstree_free(pt);
			return -ENOMEM;
		}
		pt->t = nt;
		if (entry(b + off, b + off + sz, &pt->t[pt->n])) {
			snprintf(err, errlen, "%s: entry %zu is not a process entry", CUIP_PSTREE_IMG, pt->n);
			goto bad;
		}
		pt->n++;
		off += sz;
	}
	if (off != n || !pt->n) {
		snprintf(err, errlen, "%s: %s", CUIP_PSTREE_IMG, pt->n ? "trailing bytes" : "no process");
		goto bad;
	}
	return 0;
bad:
	cuip_pstree_free(pt);
	return -EINVAL;
}

int cuip_pstree_read(int dirfd, struct cuip_pstree *pt, char *err, size_t errlen)
{
	int fd = openat(dirfd, CUIP_PSTREE_IMG, O_RDONLY | O_CLOEXEC), ret;
	uint8_t *b = NULL;
	struct stat st;

	memset(pt, 0, sizeof(*pt));
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		snprintf(err, errlen, "cannot read %s: %s", CUIP_PSTREE_IMG, strerror(errno));
		goto out;
	}
	if (st.st_size > CUIP_PSTREE_MAX_BYTES || !(b = malloc((size_t)st.st_size + 1))) {
		ret = st.st_size > CUIP_PSTREE_MAX_BYTES ? -EFBIG : -ENOMEM;
		snprintf(err, errlen, "cannot read %s: %jd bytes", CUIP_PSTREE_IMG, (intmax_t)st.st_size);
		goto out;
	}
	if (read(fd, b, (size_t)st.st_size) != st.st_size) {
		ret = -EIO;
		snprintf(err, errlen, "cannot read %s: short read", CUIP_PSTREE_IMG);
		goto out;
	}
	ret = cuip_pstree_parse(pt, b, (size_t)st.st_size, err, errlen);
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

void cuip_pstree_free(struct cuip_pstree *pt)
{
	free(pt->t);
	pt->t = NULL;
	pt->n = 0;
}
