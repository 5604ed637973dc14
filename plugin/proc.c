/*
 * proc.c - /proc parsing for the plugin; see proc.h. Stateless. Called by
 * the hooks (discovery), the start gate and `cuinterpose check`.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proc.h"
#include "startmark.h"

struct pidvec {
	pid_t *v;
	size_t n, cap;
};

static int pv_push(struct pidvec *pv, pid_t p)
{
	if (pv->n == pv->cap) {
		size_t cap = pv->cap ? pv->cap * 2 : 16;
		pid_t *v = realloc(pv->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		pv->v = v;
		pv->cap = cap;
	}
	pv->v[pv->n++] = p;
	return 0;
}

static bool pv_has(const struct pidvec *pv, pid_t p)
{
	for (size_t i = 0; i < pv->n; i++)
		if (pv->v[i] == p)
			return true;
	return false;
}

/* Children of every thread of pid (a child's parent is the thread that forked
 * it). The tree is not frozen yet (PAUSE_DEVICES runs before CRIU seizes it):
 * a process that exits meanwhile has no children left to find, and opening
 * its task directory fails with ENOENT, or ESRCH while it is exiting. */
static int add_children(struct pidvec *pv, pid_t pid)
{
	char path[64];
	struct dirent *de;
	DIR *d;
	int ret = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d)
		return errno == ENOENT || errno == ESRCH ? 0 : -errno;
	while (!ret && (de = readdir(d))) {
		char cpath[320];
		FILE *f;
		long c;

		if (de->d_name[0] == '.')
			continue;
		snprintf(cpath, sizeof(cpath), "/proc/%d/task/%s/children", pid, de->d_name);
		f = fopen(cpath, "re");
		if (!f)
			continue;
		while (fscanf(f, "%ld", &c) == 1) {
			if (!pv_has(pv, (pid_t)c) && (ret = pv_push(pv, (pid_t)c)))
				break;
		}
		fclose(f);
	}
	closedir(d);
	return ret;
}

int cuip_proc_tree(pid_t root, pid_t **out)
{
	struct pidvec pv = {0};
	int ret;

	*out = NULL;
	ret = pv_push(&pv, root);
	/* Breadth over the growing vector: every entry's children get appended. */
	for (size_t i = 0; !ret && i < pv.n; i++)
		ret = add_children(&pv, pv.v[i]);
	if (ret) {
		free(pv.v);
		return ret;
	}
	*out = pv.v;
	return (int)pv.n;
}

int cuip_proc_has_interposer(pid_t pid)
{
	return cuip_proc_maps_lib(pid, CUIP_INTERPOSER_LIB);
}

int cuip_proc_maps_lib(pid_t pid, const char *lib)
{
	char path[64], line[4096];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *slash = strrchr(line, '/');
		if (slash && !strncmp(slash + 1, lib, strlen(lib))) {
			found = 1;
			break;
		}
	}
	fclose(f);
	return found;
}

static int status_field(pid_t pid, pid_t tid, const char *key, char *val, size_t len)
{
	char path[96], line[512];
	size_t klen = strlen(key);
	int ret = -ENOENT;
	FILE *f;

	if (tid > 0)
		snprintf(path, sizeof(path), "/proc/%d/task/%d/status", pid, tid);
	else
		snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, key, klen) && line[klen] == ':') {
			char *v = line + klen + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = 0;
			snprintf(val, len, "%s", v);
			ret = 0;
			break;
		}
	}
	fclose(f);
	return ret;
}

pid_t cuip_proc_vpid(pid_t pid)
{
	char val[256], *last;
	int ret;

	ret = status_field(pid, 0, "NSpid", val, sizeof(val));
	if (ret)
		return ret;
	last = strrchr(val, '\t');
	last = last ? last + 1 : val;
	return (pid_t)atoi(last);
}

pid_t cuip_proc_tracer(pid_t pid, pid_t tid)
{
	char val[64];
	int ret = status_field(pid, tid, "TracerPid", val, sizeof(val));

	return ret ? ret : (pid_t)atoi(val);
}

void cuip_proc_comm(pid_t pid, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(buf, len, "?");
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0) {
		snprintf(buf, len, "?");
		return;
	}
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
}

int cuip_proc_threads(pid_t pid, const char *prefix, pid_t **out)
{
	struct pidvec pv = {0};
	char path[64];
	struct dirent *de;
	DIR *d;
	int ret = 0;

	*out = NULL;
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while (!ret && (de = readdir(d))) {
		char cpath[320], comm[64] = "";
		ssize_t n;
		int fd;

		if (de->d_name[0] == '.')
			continue;
		snprintf(cpath, sizeof(cpath), "/proc/%d/task/%s/comm", pid, de->d_name);
		fd = open(cpath, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, comm, sizeof(comm) - 1);
		close(fd);
		if (n <= 0)
			continue;
		comm[n] = 0;
		if (!strncmp(comm, prefix, strlen(prefix)))
			ret = pv_push(&pv, (pid_t)atoi(de->d_name));
	}
	closedir(d);
	if (ret) {
		free(pv.v);
		return ret;
	}
	*out = pv.v;
	return (int)pv.n;
}

unsigned long cuip_proc_ns_ino(pid_t pid, const char *ns)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d/ns/%s", pid, ns);
	if (stat(path, &st))
		return 0;
	return (unsigned long)st.st_ino;
}

int cuip_proc_socket_inodes(pid_t pid, unsigned long **out)
{
	unsigned long *v = NULL, *nv;
	size_t n = 0, cap = 0;
	char path[64];
	struct dirent *de;
	DIR *d;

	*out = NULL;
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		char lpath[320], target[64];
		unsigned long ino;
		ssize_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(lpath, sizeof(lpath), "/proc/%d/fd/%s", pid, de->d_name);
		len = readlink(lpath, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (sscanf(target, "socket:[%lu]", &ino) != 1)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				free(v);
				closedir(d);
				return -ENOMEM;
			}
			v = nv;
		}
		v[n++] = ino;
	}
	closedir(d);
	*out = v;
	return (int)n;
}

void cuip_proc_kill_all(const pid_t *pids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (pids[i] > 0)
			kill(pids[i], SIGKILL);
}

/* The first /proc/PID/maps line whose path ends in `name` (or contains it,
 * for "/memfd:" names): start, end and the path. 1 found, 0 not, -errno. */
static int maps_find(pid_t pid, const char *name, bool contains, unsigned long *lo, unsigned long *hi, char *path,
		     size_t len)
{
	char mpath[64], line[PATH_MAX + 128];
	int found = 0;
	FILE *f;

	snprintf(mpath, sizeof(mpath), "/proc/%d/maps", pid);
	f = fopen(mpath, "re");
	if (!f)
		return -errno;
	while (!found && fgets(line, sizeof(line), f)) {
		char *p = strchr(line, '/'), *slash;

		if (!p)
			continue;
		p[strcspn(p, "\n")] = 0;
		slash = strrchr(p, '/');
		if (contains ? !strstr(p, name) : strncmp(slash + 1, name, strlen(name)))
			continue;
		if (sscanf(line, "%lx-%lx", lo, hi) != 2)
			continue;
		if (path)
			snprintf(path, len, "%s", p);
		found = 1;
	}
	fclose(f);
	return found;
}

int cuip_proc_start_state(pid_t pid, int *err)
{
	struct cuip_mark m;
	unsigned long lo, hi;
	char path[64];
	ssize_t n;
	int fd, ret;

	*err = 0;
	ret = maps_find(pid, "/memfd:" CUIP_MARK_NAME, true, &lo, &hi, NULL, 0);
	if (ret <= 0)
		return ret ? ret : CUIP_MARK_NONE;
	snprintf(path, sizeof(path), "/proc/%d/mem", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = pread(fd, &m, sizeof(m), (off_t)lo);
	ret = n == (ssize_t)sizeof(m) ? 0 : n < 0 ? -errno : -EIO;
	close(fd);
	if (ret)
		return ret;
	if (m.magic != CUIP_MARK_MAGIC || m.state > CUIP_MARK_NOSOCKET)
		return -EBADMSG;
	*err = m.err;
	return (int)m.state;
}

const char *cuip_proc_start_state_name(int s)
{
	static const char *const n[] = {"none", "starting", "started", "failed", "no socket"};

	return s >= 0 && s <= CUIP_MARK_NOSOCKET ? n[s] : "unknown";
}

int cuip_proc_open_interposer(pid_t pid, char *path, size_t len)
{
	unsigned long lo, hi;
	char p[PATH_MAX + 64];
	int ret, fd;

	ret = maps_find(pid, CUIP_INTERPOSER_LIB, false, &lo, &hi, path, len);
	if (ret <= 0)
		return ret ? ret : -ENOENT;
	/* The inode the process has mapped, whatever its mount namespace. */
	snprintf(p, sizeof(p), "/proc/%d/map_files/%lx-%lx", pid, lo, hi);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd >= 0)
		return fd;
	snprintf(p, sizeof(p), "/proc/%d/root%s", pid, path);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	return fd >= 0 ? fd : -errno;
}

/*
 * A /dev/shm file whose path is gone but which lives on under another name
 * (nlink > 0): glibc's sem_open maps a temporary name it then replaces by
 * sem.NAME. CRIU cannot reopen it by the path it has and needs
 * --link-remap; a file with no name left at all (nlink 0) CRIU saves as a
 * ghost file without any option.
 */
static bool shm_needs_link_remap(const char *p, const char *via)
{
	size_t n = strlen(p);
	struct stat st;

	return !strncmp(p, "/dev/shm/", 9) && n > 10 && !strcmp(p + n - 10, " (deleted)") && !stat(via, &st) &&
	       st.st_nlink > 0;
}

int cuip_proc_unlinked_shm(pid_t pid, char *buf, size_t len)
{
	char path[PATH_MAX + 64], line[PATH_MAX + 128], via[320];
	struct dirent *de;
	int count = 0;
	FILE *f;
	DIR *d;

	buf[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *p = strchr(line, '/');
		unsigned long lo, hi;

		if (!p || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
			continue;
		p[strcspn(p, "\n")] = 0;
		snprintf(via, sizeof(via), "/proc/%d/map_files/%lx-%lx", pid, lo, hi);
		if (shm_needs_link_remap(p, via) && count++ == 0)
			snprintf(buf, len, "%s", p);
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		char target[PATH_MAX];
		ssize_t n;

		snprintf(via, sizeof(via), "/proc/%d/fd/%s", pid, de->d_name);
		n = readlink(via, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (shm_needs_link_remap(target, via) && count++ == 0)
			snprintf(buf, len, "%s", target);
	}
	if (d)
		closedir(d);
	return count;
}

int cuip_proc_stale_link_remaps(pid_t pid, char *buf, size_t len)
{
	char path[64];
	struct dirent *de;
	int count = 0;
	DIR *d;

	buf[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/root/dev/shm", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "link_remap.", 11) && count++ == 0)
			snprintf(buf, len, "/dev/shm/%s", de->d_name);
	closedir(d);
	return count;
}

void cuip_proc_close_inherited(const int *keep, size_t n)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);

	while (d && (de = readdir(d))) {
		int fd = atoi(de->d_name);
		bool k = de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d) || fd == devnull;

		for (size_t i = 0; i < n; i++)
			k |= keep[i] == fd;
		if (k)
			continue;
		if (fd <= 2 && devnull >= 0)
			dup2(devnull, fd);
		else
			close(fd);
	}
	if (d)
		closedir(d);
	if (devnull > 2)
		close(devnull);
}

#define IO_URING_FILE "anon_inode:[io_uring]"

int cuip_proc_io_uring(pid_t pid, char *buf, size_t len)
{
	char path[64], line[PATH_MAX + 128], target[64];
	struct dirent *de;
	int found = 0;
	FILE *f;
	DIR *d;

	buf[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (strstr(line, IO_URING_FILE) && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
			snprintf(buf, len, "maps an io_uring ring at 0x%lx-0x%lx", lo, hi);
			found = 1;
		}
	}
	fclose(f);
	if (found)
		return 1;
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while (!found && (de = readdir(d))) {
		char via[320];
		ssize_t n;

		snprintf(via, sizeof(via), "/proc/%d/fd/%s", pid, de->d_name);
		n = readlink(via, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (!strcmp(target, IO_URING_FILE)) {
			snprintf(buf, len, "holds an io_uring instance as fd %s", de->d_name);
			found = 1;
		}
	}
	closedir(d);
	return found;
}
