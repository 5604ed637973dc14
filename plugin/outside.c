/*
 * outside.c - importers recorded by a creator, found in our pid namespace;
 * see outside.h. Reads /proc only; stateless.
 */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "importers.h"
#include "procstat.h"
#include "outside.h"

#define NSPID_MAX 32

int cuip_proc_nspid(pid_t pid, pid_t *v, int max)
{
	char path[64], line[512];
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char *p = line + 6, *end;

		if (strncmp(line, "NSpid:", 6))
			continue;
		for (;;) {
			long x = strtol(p, &end, 10);

			if (end == p)
				break;
			if (n < max)
				v[n] = (pid_t)x;
			n++;
			p = end;
		}
		break;
	}
	fclose(f);
	return n;
}

static unsigned long ns_ino(pid_t pid, const char *ns)
{
	char path[64];
	struct stat st;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, ns);
	else
		snprintf(path, sizeof(path), "/proc/self/ns/%s", ns);
	return stat(path, &st) ? 0 : (unsigned long)st.st_ino;
}

/* h is the importer when it is alive and started when the creator saw it
 * (only comparable in the same time namespace: starttime is shifted by the
 * time namespace's boot-time offset). */
static pid_t check(pid_t h, uint64_t start, int same_time)
{
	uint64_t s;
	char state = 0;
	int ret = cuip_proc_stat_start(h, &s, &state);

	if (ret == -ENOENT || ret == -ESRCH)
		return 0;
	if (ret)
		return -1;
	if (state == 'Z' || state == 'X')
		return 0;
	if (start && same_time && s != start)
		return 0; /* the pid was reused */
	return h;
}

/* Every process under /proc in turn until try_one answers non-zero (the
 * importer, or -1 on an error): that answer; 0 when none did; -1 when /proc
 * cannot be read. */
static pid_t scan_proc(pid_t (*try_one)(pid_t h, const void *arg), const void *arg)
{
	struct dirent *de;
	pid_t found = 0;
	DIR *d = opendir("/proc");

	if (!d)
		return -1;
	while (!found && (de = readdir(d)))
		if (isdigit((unsigned char)de->d_name[0]))
			found = try_one((pid_t)atoi(de->d_name), arg);
	closedir(d);
	return found;
}

struct nested {
	pid_t ipid;
	int levels;
	unsigned long cns;
	uint64_t start;
	int same_time;
};

/* h holds n->ipid at the creator's depth, in the creator's namespace. */
static pid_t try_nested(pid_t h, const void *arg)
{
	const struct nested *n = arg;
	pid_t hv[NSPID_MAX];
	int k = cuip_proc_nspid(h, hv, NSPID_MAX);

	if (k < n->levels || k > NSPID_MAX || hv[n->levels - 1] != n->ipid)
		return 0;
	/* the same depth in another container is another namespace */
	if (k == n->levels && ns_ino(h, "pid") != n->cns)
		return 0;
	/* 0: that pid in another namespace, or reused: look on */
	return check(h, n->start, n->same_time);
}

pid_t cuip_importer_here(pid_t creator, pid_t ipid, uint64_t start)
{
	pid_t cv[NSPID_MAX];
	int levels = cuip_proc_nspid(creator, cv, NSPID_MAX), same_time;
	struct nested n;

	if (ipid <= 0 || levels <= 0 || levels > NSPID_MAX)
		return -1;
	same_time = ns_ino(creator, "time") == ns_ino(0, "time");
	if (levels == 1) /* the creator's pid namespace is ours */
		return check(ipid, start, same_time);
	/* The creator is `levels - 1` namespaces below ours: find the process
	 * whose NSpid holds ipid at that depth, in the creator's namespace. */
	n = (struct nested){
		.ipid = ipid, .levels = levels, .cns = ns_ino(creator, "pid"), .start = start, .same_time = same_time};
	return scan_proc(try_nested, &n);
}

struct by_ns {
	uint64_t pid_ns;
	pid_t self_pid;
	uint64_t start;
};

/* h lives in pid namespace b->pid_ns, where it is b->self_pid. */
static pid_t try_by_ns(pid_t h, const void *arg)
{
	const struct by_ns *b = arg;
	pid_t hv[NSPID_MAX];
	int k;

	if (ns_ino(h, "pid") != b->pid_ns)
		return 0;
	k = cuip_proc_nspid(h, hv, NSPID_MAX);
	if (k < 1 || k > NSPID_MAX || hv[k - 1] != b->self_pid)
		return 0;
	return check(h, b->start, ns_ino(h, "time") == ns_ino(0, "time"));
}

pid_t cuip_importer_by_ns(uint64_t pid_ns, pid_t self_pid, uint64_t start)
{
	struct by_ns b = {.pid_ns = pid_ns, .self_pid = self_pid, .start = start};

	if (!pid_ns || self_pid <= 0)
		return -1;
	return scan_proc(try_by_ns, &b);
}
