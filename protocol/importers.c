/*
 * importers.c - the per-export importer sets; see importers.h. Called by
 * xcache.c under xc_lock (and by the unit tests); no state of its own.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "importers.h"
#include "procstat.h"

int cuip_proc_is_ours(void)
{
	char buf[32];
	ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);

	if (n <= 0)
		return 0;
	buf[n] = 0;
	return atoi(buf) == (int)getpid();
}

int cuip_importer_alive(const struct cuip_importer *p)
{
	uint64_t start;
	char state = 0;
	int ret;

	if (p->pid <= 0 || !cuip_proc_is_ours())
		return -1; /* invisible from our pid namespace, or not our /proc */
	ret = cuip_proc_stat_start(p->pid, &start, &state);
	if (ret == -ENOENT || ret == -ESRCH)
		return 0;
	if (ret)
		return -1;
	if (state == 'Z' || state == 'X')
		return 0;
	return !p->start || start == p->start ? 1 : 0;
}

static int same(const struct cuip_importer *a, const struct cuip_importer *b)
{
	if (a->pid != b->pid)
		return 0;
	if (a->pid > 0)
		return a->start == b->start;
	return a->id == b->id; /* invisible: only the identity tells them apart */
}

void cuip_importers_prune(struct cuip_importers *s, cuip_importer_alive_fn alive)
{
	unsigned k = 0;

	for (unsigned i = 0; i < s->n; i++)
		if (alive(&s->e[i]) != 0)
			s->e[k++] = s->e[i];
	s->n = k;
}

int cuip_importers_add(struct cuip_importers *s, const struct cuip_importer *p, cuip_importer_alive_fn alive)
{
	for (unsigned i = 0; i < s->n; i++) {
		if (same(&s->e[i], p))
			return 0;
		if (p->pid > 0 && s->e[i].pid == p->pid) {
			/* the pid was reused: the recorded process has exited */
			s->e[i] = *p;
			return 1;
		}
	}
	if (s->n == CUIP_IMPORTERS_MAX)
		cuip_importers_prune(s, alive);
	if (s->n == CUIP_IMPORTERS_MAX) {
		s->dropped++;
		return -ENOSPC;
	}
	if (s->n == s->cap) {
		unsigned cap = s->cap ? 2 * s->cap : 4;
		struct cuip_importer *e;

		if (cap > CUIP_IMPORTERS_MAX)
			cap = CUIP_IMPORTERS_MAX;
		e = realloc(s->e, cap * sizeof(*e));
		if (!e) {
			s->dropped++;
			return -ENOMEM;
		}
		s->e = e;
		s->cap = cap;
	}
	assert(s->n < s->cap && s->cap <= CUIP_IMPORTERS_MAX);
	s->e[s->n++] = *p;
	return 1;
}

void cuip_importers_undo(struct cuip_importers *s, const struct cuip_importer *p, int added)
{
	if (added < 0) {
		if (s->dropped)
			s->dropped--;
		return;
	}
	if (added == 0)
		return;
	for (unsigned i = 0; i < s->n; i++) {
		if (same(&s->e[i], p)) {
			memmove(&s->e[i], &s->e[i + 1], (s->n - i - 1) * sizeof(*s->e));
			s->n--;
			return;
		}
	}
}

void cuip_importers_free(struct cuip_importers *s)
{
	free(s->e);
	*s = (struct cuip_importers){0};
}
