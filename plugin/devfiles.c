/*
 * devfiles.c - the driver's device files held by processes that are not
 * CUDA processes (devfiles.h says which, why, and the images). Owns the
 * cached driver majors and the list of claimed paths (dump: recorded so far;
 * restore: read from the images). No locks: criu calls the hooks from one
 * thread.
 */
#include "devfiles.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "criulog.h"
#include "wire.h"

#define DEVZERO	    makedev(1, 5)
#define MAX_LEARNED 64

static struct {
	unsigned majors[CUIP_DEVFILES_MAX_MAJORS];
	int n_majors; /* -1: not read yet */
	dev_t learned[MAX_LEARNED];
	size_t n_learned;
	char **paths; /* claimed device paths */
	size_t n_paths;
	bool loaded; /* restore: paths read from CUIP_DEVMAPS_IMG */
} D = {.n_majors = -1};

int cuip_devfiles_parse_majors(const char *path, unsigned *majors, size_t max)
{
	char line[256], name[128];
	bool chr = false;
	unsigned maj;
	size_t n = 0;
	FILE *f = fopen(path, "re");

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "Character devices:", 18))
			chr = true;
		else if (!strncmp(line, "Block devices:", 14))
			chr = false;
		else if (chr && sscanf(line, "%u %127s", &maj, name) == 2 && !strncmp(name, "nvidia", 6) && n < max)
			majors[n++] = maj;
	}
	fclose(f);
	return (int)n;
}

void cuip_devfiles_set_majors(const unsigned *majors, size_t n)
{
	if (n > CUIP_DEVFILES_MAX_MAJORS)
		n = CUIP_DEVFILES_MAX_MAJORS;
	for (size_t i = 0; i < n; i++)
		D.majors[i] = majors[i];
	D.n_majors = n ? (int)n : -1;
}

bool cuip_devfiles_driver_major(dev_t rdev)
{
	if (D.n_majors < 0) {
		int n = cuip_devfiles_parse_majors("/proc/devices", D.majors, CUIP_DEVFILES_MAX_MAJORS);

		D.n_majors = n < 0 ? 0 : n;
	}
	for (int i = 0; i < D.n_majors; i++)
		if (major(rdev) == D.majors[i])
			return true;
	return false;
}

static bool learned(dev_t rdev)
{
	for (size_t i = 0; i < D.n_learned; i++)
		if (D.learned[i] == rdev)
			return true;
	return false;
}

int cuip_devfiles_learn(dev_t rdev)
{
	if (learned(rdev))
		return 0;
	if (D.n_learned == MAX_LEARNED)
		return -ENOSPC;
	D.learned[D.n_learned++] = rdev;
	return 0;
}

void cuip_devfiles_forget(dev_t rdev)
{
	for (size_t i = 0; i < D.n_learned; i++)
		if (D.learned[i] == rdev)
			D.learned[i--] = D.learned[--D.n_learned];
}

static bool is_device(const struct stat *st)
{
	return (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) && st->st_rdev != DEVZERO;
}

bool cuip_devfiles_is_driver(const struct stat *st)
{
	if (S_ISCHR(st->st_mode) && cuip_devfiles_driver_major(st->st_rdev))
		return true;
	return is_device(st) && learned(st->st_rdev);
}

/* ---- scanning a process ---- */

static void note_first(struct cuip_devscan *s, const char *link)
{
	if (!s->first[0])
		snprintf(s->first, sizeof(s->first), "%.*s", (int)sizeof(s->first) - 1, link);
}

/* A mapping of a device that is not the driver's. */
static void note_other(struct cuip_devscan *s, uint64_t start, const char *link)
{
	if (!s->other_maps || start < s->other_start) {
		s->other_start = start;
		snprintf(s->other, sizeof(s->other), "%.*s", (int)sizeof(s->other) - 1, link);
	}
	s->other_maps++;
}

/* Each entry of /proc/PID/<sub> that stats as a device; maps: the entry's
 * name is START-END. */
static int scan_dir(pid_t pid, const char *sub, struct cuip_devscan *s, bool maps)
{
	char dpath[64], link[PATH_MAX];
	struct dirent *e;
	struct stat st;
	DIR *d;
	int dfd;

	snprintf(dpath, sizeof(dpath), "/proc/%d/%s", (int)pid, sub);
	d = opendir(dpath);
	if (!d)
		return -errno;
	dfd = dirfd(d);
	while ((e = readdir(d))) {
		uint64_t a, b;
		ssize_t k;

		if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, 0) || !is_device(&st))
			continue;
		k = readlinkat(dfd, e->d_name, link, sizeof(link) - 1);
		link[k > 0 ? k : 0] = 0;
		if (!maps) {
			if (cuip_devfiles_is_driver(&st)) {
				s->fds++;
				note_first(s, link);
			}
			continue;
		}
		if (sscanf(e->d_name, "%" SCNx64 "-%" SCNx64, &a, &b) != 2)
			continue;
		if (!cuip_devfiles_is_driver(&st)) {
			note_other(s, a, link);
			continue;
		}
		if (!s->maps || a < s->first_start)
			s->first_start = a;
		s->maps++;
		s->map_bytes += b - a;
		note_first(s, link);
	}
	closedir(d);
	return 0;
}

int cuip_devfiles_mapped(pid_t pid, dev_t *v, size_t max)
{
	char dpath[64];
	struct dirent *e;
	struct stat st;
	size_t n = 0;
	DIR *d;

	snprintf(dpath, sizeof(dpath), "/proc/%d/map_files", (int)pid);
	d = opendir(dpath);
	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		size_t i;

		if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, 0) || !is_device(&st))
			continue;
		for (i = 0; i < n && v[i] != st.st_rdev; i++)
			;
		if (i == n && n < max)
			v[n++] = st.st_rdev;
	}
	closedir(d);
	return (int)n;
}

int cuip_devfiles_scan(pid_t pid, struct cuip_devscan *out)
{
	memset(out, 0, sizeof(*out));
	return scan_dir(pid, "map_files", out, true) ?: scan_dir(pid, "fd", out, false);
}

/* ---- dump ---- */

static const char *base(const char *path)
{
	const char *b = strrchr(path, '/');

	return b ? b + 1 : path;
}

/* Paths compare by their last component: criu names a restored mapping's
 * file relative to the job's mount namespace (a container's /dev), the dump
 * saw it from criu's. Only mappings some plugin claimed reach this test. */
static bool claimed(const char *path)
{
	for (size_t i = 0; i < D.n_paths; i++)
		if (!strcmp(base(D.paths[i]), base(path)))
			return true;
	return false;
}

static int remember(const char *path)
{
	char **v = realloc(D.paths, (D.n_paths + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	D.paths = v;
	D.paths[D.n_paths] = strdup(path);
	if (!D.paths[D.n_paths])
		return -ENOMEM;
	D.n_paths++;
	return 0;
}

/* The path criu's descriptor fd names (readlink of /proc/self/fd/FD). */
static int fd_path(int fd, char *buf, size_t len)
{
	char l[64];
	ssize_t k;

	snprintf(l, sizeof(l), "/proc/self/fd/%d", fd);
	k = readlink(l, buf, len - 1);
	if (k < 0)
		return -errno;
	buf[k] = 0;
	return 0;
}

/* Append (or, with O_TRUNC, write) "path\n" to image `name`. */
static int put_line(int dirfd, const char *name, int how, const char *path)
{
	char line[PATH_MAX + 2];
	int ret, img;

	if (strchr(path, '\n'))
		return -EINVAL;
	img = openat(dirfd, name, O_WRONLY | O_CREAT | O_CLOEXEC | how, 0600);
	if (img < 0)
		return -errno;
	snprintf(line, sizeof(line), "%s\n", path);
	ret = cuip_write_all(img, line, strlen(line));
	if (close(img) && !ret)
		ret = -errno;
	return ret;
}

int cuip_devfiles_claim_map(int dirfd, int fd, const struct stat *st)
{
	char path[PATH_MAX];
	int ret;

	if (!cuip_devfiles_is_driver(st))
		return -ENOTSUP;
	ret = fd_path(fd, path, sizeof(path));
	if (ret)
		return ret;
	if (claimed(path))
		return 0;
	ret = put_line(dirfd, CUIP_DEVMAPS_IMG, O_APPEND, path);
	if (!ret)
		ret = remember(path);
	if (!ret)
		pr_info("mappings of %s (a driver device) held by a process the driver does not know: claimed, no "
			"contents saved; restored as inert memory",
			path);
	return ret;
}

int cuip_devfiles_claim_fd(int dirfd, int fd, uint32_t id)
{
	char path[PATH_MAX], name[64];
	struct stat st;
	int ret;

	if (fstat(fd, &st))
		return -errno;
	if (!cuip_devfiles_is_driver(&st))
		return -ENOTSUP;
	ret = fd_path(fd, path, sizeof(path));
	if (ret)
		return ret;
	snprintf(name, sizeof(name), CUIP_DEVFILE_IMG_FMT, id);
	ret = put_line(dirfd, name, O_TRUNC, path);
	if (!ret)
		pr_debug("descriptor of %s (file id %#x) claimed: restored as /dev/null", path, id);
	return ret;
}

/* ---- restore ---- */

/* Read a small image whole; 0, -ENOENT (absent), -errno. A file whose
 * lines are not all NUL-free, newline-terminated paths is -EBADMSG. */
static int read_img(int dirfd, const char *name, char *buf, size_t len)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	ssize_t k;

	if (fd < 0)
		return -errno;
	k = read(fd, buf, len - 1);
	close(fd);
	if (k < 0)
		return -errno;
	if ((size_t)k == len - 1)
		return -EFBIG;
	buf[k] = 0;
	if (k == 0 || buf[k - 1] != '\n' || strlen(buf) != (size_t)k || buf[0] != '/')
		return -EBADMSG;
	return 0;
}

int cuip_devfiles_restore_fd(int dirfd, uint32_t id)
{
	char name[64], path[PATH_MAX + 2];
	int ret, fd;

	snprintf(name, sizeof(name), CUIP_DEVFILE_IMG_FMT, id);
	ret = read_img(dirfd, name, path, sizeof(path));
	if (ret == -ENOENT)
		return -ENOTSUP;
	if (ret) {
		pr_err("%s: unreadable (%s): not a device path this plugin wrote", name, strerror(-ret));
		return ret;
	}
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	pr_debug("file id %#x (%.*s): restored as /dev/null", id, (int)strcspn(path, "\n"), path);
	return fd;
}

static int load_paths(int dirfd)
{
	static char buf[1 << 16];
	int ret;

	if (D.loaded)
		return 0;
	ret = read_img(dirfd, CUIP_DEVMAPS_IMG, buf, sizeof(buf));
	D.loaded = true;
	if (ret == -ENOENT)
		return 0;
	if (ret) {
		pr_err("%s: unreadable (%s): not the device paths this plugin wrote", CUIP_DEVMAPS_IMG, strerror(-ret));
		return ret;
	}
	for (char *save = NULL, *p = strtok_r(buf, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
		if (p[0] != '/')
			return -EBADMSG;
		ret = remember(p);
		if (ret)
			return ret;
	}
	return 0;
}

int cuip_devfiles_update_map(int dirfd, const char *path, int *fd, uint64_t *pgoff)
{
	int ret = load_paths(dirfd);

	if (ret)
		return ret;
	if (!claimed(path))
		return 0;
	*fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
	if (*fd < 0)
		return -errno;
	*pgoff = 0;
	return 1;
}

void cuip_devfiles_reset(void)
{
	for (size_t i = 0; i < D.n_paths; i++)
		free(D.paths[i]);
	free(D.paths);
	D.paths = NULL;
	D.n_paths = 0;
	D.loaded = false;
	D.n_learned = 0;
}
