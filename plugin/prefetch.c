/*
 * prefetch.c - carrier files read ahead while criu restores; see prefetch.h.
 * No state of its own: the list is the caller's, the process is detached.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "proc.h"

#define CARRIER_PREFIX "cuinterpose-carrier-"

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct cuip_prefetch_file *)a)->name, ((const struct cuip_prefetch_file *)b)->name);
}

int cuip_prefetch_list(int dirfd, struct cuip_prefetch *p, char *err, size_t errlen)
{
	struct dirent *de;
	int fd = dup(dirfd), ret = 0;
	DIR *d;

	memset(p, 0, sizeof(*p));
	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		ret = -errno;
		snprintf(err, errlen, "cannot list the image directory: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		struct cuip_prefetch_file *nf;
		struct stat st;

		if (strncmp(de->d_name, CARRIER_PREFIX, strlen(CARRIER_PREFIX)) ||
		    strlen(de->d_name) >= sizeof(p->f->name) || fstatat(dirfd, de->d_name, &st, 0) ||
		    !S_ISREG(st.st_mode))
			continue;
		nf = realloc(p->f, (p->n + 1) * sizeof(*p->f));
		if (!nf) {
			snprintf(err, errlen, "out of memory listing carrier files");
			ret = -ENOMEM;
			break;
		}
		p->f = nf;
		snprintf(p->f[p->n].name, sizeof(p->f->name), "%s", de->d_name);
		p->f[p->n].size = (uint64_t)st.st_size;
		p->bytes += (uint64_t)st.st_size;
		p->n++;
	}
	closedir(d);
	if (ret)
		cuip_prefetch_free(p);
	else if (p->n)
		qsort(p->f, p->n, sizeof(*p->f), by_name);
	return ret;
}

void cuip_prefetch_free(struct cuip_prefetch *p)
{
	free(p->f);
	memset(p, 0, sizeof(*p));
}

uint64_t cuip_prefetch_budget(long long mb)
{
	unsigned long long kb = 0;
	char line[128];
	FILE *f;

	if (mb >= 0)
		return (uint64_t)mb << 20;
	f = fopen("/proc/meminfo", "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024 / 2;
}

/* The units of a run, offset-major: every file's first chunk, then every
 * file's second, ... until the budget; taken in order by the readers. */
struct run {
	int dirfd;
	const struct cuip_prefetch *p;
	uint64_t budget, asked, off;
	uint32_t chunk;
	size_t file;
	pthread_mutex_t mu;
};

/* The next unit: file index, offset and length; 0 when none is left. */
static int next_unit(struct run *r, size_t *fi, uint64_t *off, uint64_t *len)
{
	int got = 0;

	pthread_mutex_lock(&r->mu);
	while (!got && r->asked < r->budget) {
		int any = 0;

		for (; r->file < r->p->n; r->file++) {
			const struct cuip_prefetch_file *f = &r->p->f[r->file];

			if (r->off >= f->size)
				continue;
			*fi = r->file++;
			*off = r->off;
			*len = f->size - r->off < r->chunk ? f->size - r->off : r->chunk;
			if (*len > r->budget - r->asked)
				*len = r->budget - r->asked;
			r->asked += *len;
			got = 1;
			break;
		}
		if (got)
			break;
		for (size_t i = 0; i < r->p->n; i++)
			any |= r->off + r->chunk < r->p->f[i].size;
		if (!any)
			break;
		r->off += r->chunk;
		r->file = 0;
	}
	pthread_mutex_unlock(&r->mu);
	return got;
}

/* A reader: reads its units through a small buffer (a real read, paced by
 * the disk, where a readahead hint would queue the whole budget at once
 * ahead of criu's own reads). */
static void *reader(void *arg)
{
	struct run *r = arg;
	char *buf = malloc(1u << 20);
	uint64_t off, len;
	size_t fi;

	while (buf && next_unit(r, &fi, &off, &len)) {
		int fd = openat(r->dirfd, r->p->f[fi].name, O_RDONLY | O_CLOEXEC);

		for (uint64_t done = 0; fd >= 0 && done < len;) {
			ssize_t got =
				pread(fd, buf, len - done < (1u << 20) ? len - done : (1u << 20), (off_t)(off + done));

			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0)
				break; /* a hint only: LOAD reports what is wrong with the file */
			done += (uint64_t)got;
		}
		if (fd >= 0)
			close(fd);
	}
	free(buf);
	return NULL;
}

uint64_t cuip_prefetch_run(int dirfd, const struct cuip_prefetch *p, uint64_t budget, uint32_t chunk)
{
	struct run r = {.dirfd = dirfd, .p = p, .budget = budget, .chunk = chunk, .mu = PTHREAD_MUTEX_INITIALIZER};
	pthread_t th[CUIP_PREFETCH_READERS];
	size_t n = 0;

	if (!p->n || !budget || !chunk)
		return 0;
	while (n + 1 < CUIP_PREFETCH_READERS && !pthread_create(&th[n], NULL, reader, &r))
		n++;
	reader(&r);
	for (size_t i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	return r.asked;
}

int cuip_prefetch_start(int dirfd, const struct cuip_prefetch *p, uint64_t budget, char *err, size_t errlen)
{
	int sv[2], st, ret;
	sigset_t s, old;
	pid_t c1, pid = 0;

	if (pipe2(sv, O_CLOEXEC)) {
		ret = -errno;
		snprintf(err, errlen, "cannot create the prefetcher's pipe: %s", strerror(errno));
		return ret;
	}
	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	sigprocmask(SIG_BLOCK, &s, &old); /* criu's handlers would call our child an error */
	c1 = fork();
	if (c1 == 0) {
		pid_t c2;

		setsid();
		c2 = fork();
		if (c2 == 0) {
			pid_t self = getpid();

			struct sigaction dfl = {.sa_handler = SIG_DFL};
			int keep[2] = {dirfd, sv[1]};

			for (int sig = 1; sig < NSIG; sig++)
				sigaction(sig, &dfl, NULL); /* criu's handlers are not ours */
			prctl(PR_SET_NAME, CUIP_PREFETCH_COMM);
			cuip_proc_close_inherited(keep, 2);
			if (write(sv[1], &self, sizeof(self)) != sizeof(self))
				_exit(1);
			close(sv[1]);
			alarm(CUIP_PREFETCH_MAX_S);
			cuip_prefetch_run(dirfd, p, budget, CUIP_PREFETCH_CHUNK);
			_exit(0);
		}
		_exit(c2 < 0);
	}
	close(sv[1]);
	if (c1 < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot fork the prefetcher: %s", strerror(errno));
		goto out;
	}
	while (waitpid(c1, &st, __WALL) < 0 && errno == EINTR)
		;
	ret = read(sv[0], &pid, sizeof(pid)) == sizeof(pid) ? pid : -EPIPE;
	if (ret < 0)
		snprintf(err, errlen, "the prefetcher did not start");
out:
	close(sv[0]);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}
