/*
 * monitor.c - progress lines and the stall bound of a data phase; see
 * monitor.h for what it owns, its caller and its locking.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "criulog.h"
#include "deadline.h"
#include "errfmt.h"
#include "monitor.h"
#include "threads.h"

const struct cuip_meter cuip_meter_replies_only = {.total = NULL, .done = NULL};

static void fmt_bytes(uint64_t b, char *buf, size_t len)
{
	if (b >= 1ull << 30)
		snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
	else if (b >= 1ull << 20)
		snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
	else
		snprintf(buf, len, "%.1f KiB", (double)b / 1024);
}

static void fmt_rate(double bps, char *buf, size_t len)
{
	if (bps >= 1e9)
		snprintf(buf, len, "%.1f GB/s", bps / 1e9);
	else
		snprintf(buf, len, "%.1f MB/s", bps / 1e6);
}

static bool monitor_on(const struct cuip_monitor *mn, const struct cuip_part *p)
{
	return !mn->applies || mn->applies(mn->g, p, mn->arg);
}

static bool lines_on(const struct cuip_monitor *mn)
{
	return mn->g->o->progress_ms && mn->total;
}

/* Bytes participant i moved in this phase, at most its total; false when
 * it cannot say (its /proc entry is unreadable). */
static bool moved_by(const struct cuip_monitor *mn, size_t i, uint64_t *moved)
{
	const struct cuip_part *p = &mn->g->p[i];
	uint64_t t = mn->m->total(mn->g, p, mn->arg);
	int64_t d = mn->m->done(mn->g, p, mn->arg);

	if (d < 0 || mn->w[i].base < 0)
		return false;
	d -= mn->w[i].base;
	*moved = d < 0 ? 0 : (uint64_t)d > t ? t : (uint64_t)d;
	return true;
}

/* Bytes moved by the whole phase so far; false when a participant cannot say. */
static bool monitor_sample(const struct cuip_monitor *mn, uint64_t *done)
{
	*done = 0;
	for (size_t i = 0; i < mn->g->n; i++) {
		uint64_t d;

		if (!monitor_on(mn, &mn->g->p[i]))
			continue;
		if (!moved_by(mn, i, &d))
			return false;
		*done += d;
	}
	return true;
}

/* What the progress line adds after its time: how the participants that
 * say so decided their bytes ("" when none does). */
static void monitor_detail(const struct cuip_monitor *mn, char *buf, size_t len)
{
	uint64_t scanned = 0, copied = 0;
	char s_s[32], c_s[32];
	bool any = false;

	buf[0] = 0;
	for (size_t i = 0; mn->m->detail && i < mn->g->n; i++) {
		uint64_t s, c;

		if (monitor_on(mn, &mn->g->p[i]) && mn->m->detail(mn->g, &mn->g->p[i], mn->arg, &s, &c)) {
			scanned += s;
			copied += c;
			any = true;
		}
	}
	if (!any)
		return;
	fmt_bytes(scanned, s_s, sizeof(s_s));
	fmt_bytes(copied, c_s, sizeof(c_s));
	snprintf(buf, len, " (decided; %s scanned on the device, %s copied to the host)", s_s, c_s);
}

static void monitor_line(struct cuip_monitor *mn, double now)
{
	char done_s[32], total_s[32], rate_s[32], detail[160];
	uint64_t done;

	fmt_bytes(mn->total, total_s, sizeof(total_s));
	if (!monitor_sample(mn, &done)) {
		pr_info("%s in progress: %s expected, %.1f s (no byte count: /proc/PID/io unreadable)", mn->name,
			total_s, now - mn->t0);
		return;
	}
	fmt_bytes(done, done_s, sizeof(done_s));
	fmt_rate(now > mn->last_t ? (double)(done - mn->last) / (now - mn->last_t) : 0.0, rate_s, sizeof(rate_s));
	monitor_detail(mn, detail, sizeof(detail));
	pr_info("%s in progress: %s of %s (%u%%), %s, %.1f s%s", mn->name, done_s, total_s,
		(unsigned)(done * 100 / mn->total), rate_s, now - mn->t0, detail);
	mn->last = done;
	mn->last_t = now;
}

/* Under lock: is participant i's reply still outstanding? */
static bool pending(const struct cuip_monitor *mn, size_t i)
{
	return monitor_on(mn, &mn->g->p[i]) && !mn->w[i].done;
}

/*
 * Did a pending participant move a byte of the phase since the last look?
 * The bytes of the phase, what the progress lines and the stall message
 * show: rchar past the total is the process reading something else (in a
 * rollback the job runs), not LOAD. A count that cannot be read does not
 * move, so that a stall still ends.
 */
static bool monitor_moved(struct cuip_monitor *mn)
{
	bool moved = false;

	for (size_t i = 0; mn->m->done && i < mn->g->n; i++) {
		uint64_t d;
		bool wait;

		pthread_mutex_lock(&mn->lock);
		wait = pending(mn, i);
		pthread_mutex_unlock(&mn->lock);
		if (!wait || !moved_by(mn, i, &d))
			continue;
		moved |= (int64_t)d != mn->w[i].seen;
		mn->w[i].seen = (int64_t)d;
	}
	return moved;
}

/* Give up every request still pending: shut its connection down, so that
 * its job's recv returns; the phase fails it (cuip_monitor_stop). */
static size_t monitor_abandon(struct cuip_monitor *mn)
{
	size_t n = 0;
	uint64_t d;

	pthread_mutex_lock(&mn->lock);
	for (size_t i = 0; i < mn->g->n; i++) {
		if (!pending(mn, i))
			continue;
		mn->w[i].stalled = true;
		mn->w[i].moved = -1;
		if (mn->m->total && moved_by(mn, i, &d))
			mn->w[i].moved = (int64_t)d;
		if (mn->g->p[i].fd >= 0)
			shutdown(mn->g->p[i].fd, SHUT_RDWR);
		n++;
	}
	pthread_mutex_unlock(&mn->lock);
	return n;
}

/* One look for a stall; true when it found one and gave the phase up. */
static bool monitor_stalled(struct cuip_monitor *mn, bool replied, double now)
{
	unsigned ms = mn->g->o->stall_timeout_ms;
	size_t n;

	if (!ms)
		return false;
	if (replied || monitor_moved(mn)) {
		mn->move_t = now;
		return false;
	}
	if (now - mn->move_t < ms / 1000.0)
		return false;
	n = monitor_abandon(mn);
	if (!n)
		return false; /* every reply is in: the phase is ending */
	pr_err("%s: no byte moved and no reply for %g s: abandoning %zu pending requests", mn->name, ms / 1000.0, n);
	return true;
}

/* Under lock: sleep ms or until stopped; true when stopped. */
static bool monitor_wait(struct cuip_monitor *mn, unsigned ms)
{
	struct timespec ts;

	cuip_deadline_ms(&ts, ms);
	while (!mn->stop && pthread_cond_timedwait(&mn->cond, &mn->lock, &ts) != ETIMEDOUT)
		;
	return mn->stop;
}

/* Wake for every progress line, and often enough to end a stall within an
 * eighth of its bound (at most 1 s late). */
static unsigned monitor_tick(const struct cuip_monitor *mn)
{
	unsigned stall = mn->g->o->stall_timeout_ms, tick = lines_on(mn) ? mn->g->o->progress_ms : UINT_MAX;
	unsigned look = stall / 8 < 10 ? 10 : stall / 8 > 1000 ? 1000 : stall / 8;

	return stall && look < tick ? look : tick;
}

static void *monitor_main(void *a)
{
	struct cuip_monitor *mn = a;
	unsigned tick = monitor_tick(mn);
	size_t replies = 0;

	pthread_mutex_lock(&mn->lock);
	while (!monitor_wait(mn, tick)) {
		bool replied = mn->replies != replies;
		double now = cuip_now();

		replies = mn->replies;
		pthread_mutex_unlock(&mn->lock);
		if (lines_on(mn) && now - mn->line_t >= mn->g->o->progress_ms / 1000.0) {
			monitor_line(mn, now);
			mn->line_t = now;
		}
		if (monitor_stalled(mn, replied, now))
			return NULL; /* every pending job is on its way back */
		pthread_mutex_lock(&mn->lock);
	}
	pthread_mutex_unlock(&mn->lock);
	return NULL;
}

/* The counts the phase starts from and the total it is to move; returns
 * how many participants take part. */
static size_t monitor_baseline(struct cuip_monitor *mn)
{
	struct cuip_group *g = mn->g;
	size_t n = 0;

	mn->total = 0;
	for (size_t i = 0; i < g->n; i++) {
		uint64_t d;

		if (!monitor_on(mn, &g->p[i]))
			continue;
		n++;
		if (mn->m->total)
			mn->total += mn->m->total(g, &g->p[i], mn->arg);
		if (mn->m->delta)
			mn->w[i].base = mn->m->done(g, &g->p[i], mn->arg);
		mn->w[i].seen = mn->m->done && moved_by(mn, i, &d) ? (int64_t)d : -1;
	}
	return n;
}

/* Start the monitor of a data phase: 1 when it watches, 0 when it has
 * nothing to do (no meter, progress lines and the stall bound both off, no
 * participant) or could not start for progress lines only; a negative
 * errno, with g->err set, when the phase's stall bound cannot be kept (no
 * memory, no thread): the phase is not run unbounded. */
int cuip_monitor_start(struct cuip_monitor *mn)
{
	pthread_condattr_t ca;
	struct cuip_group *g = mn->g;
	int ret;

	if (!mn->m || (!g->o->progress_ms && !g->o->stall_timeout_ms))
		return 0;
	mn->w = calloc(g->n ? g->n : 1, sizeof(*mn->w));
	if (!mn->w) {
		ret = -ENOMEM;
		goto fail;
	}
	if (!monitor_baseline(mn) || (!lines_on(mn) && !g->o->stall_timeout_ms)) {
		ret = 0;
		goto fail;
	}
	mn->t0 = mn->line_t = mn->move_t = mn->last_t = cuip_now();
	pthread_mutex_init(&mn->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&mn->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (!(ret = -cuip_thread_create(&mn->th, NULL, monitor_main, mn)))
		return 1;
	pthread_cond_destroy(&mn->cond);
	pthread_mutex_destroy(&mn->lock);
fail:
	free(mn->w);
	mn->w = NULL;
	if (!ret)
		return 0;
	if (!g->o->stall_timeout_ms) {
		pr_warn("%s: no progress lines (%s)", mn->name, strerror(-ret));
		return 0;
	}
	errfmt(g->err, sizeof(g->err), "%s: cannot watch its stall bound: %s", mn->name, strerror(-ret));
	return ret;
}

/* A request the monitor gave up fails, saying how far it had got; its
 * connection, shut down, is closed (a late reply must not be read as the
 * answer to the next request). */
static void fail_stalled(const struct cuip_monitor *mn, size_t i)
{
	struct cuip_part *p = &mn->g->p[i];
	int64_t moved = mn->w[i].moved;
	char how[96];

	if (!mn->m->total)
		snprintf(how, sizeof(how), "no reply");
	else if (moved >= 0)
		snprintf(how, sizeof(how), "%" PRId64 " of %" PRIu64 " bytes moved", moved,
			 mn->m->total(mn->g, p, mn->arg));
	else
		snprintf(how, sizeof(how), "%" PRIu64 " bytes to move, /proc/%d/io unreadable",
			 mn->m->total(mn->g, p, mn->arg), (int)p->pid);
	p->status = -ETIMEDOUT;
	errfmt(p->err, sizeof(p->err), "no progress for %g s in %s (%s)", mn->g->o->stall_timeout_ms / 1000.0, mn->name,
	       how);
	close(p->fd);
	p->fd = -1;
}

void cuip_monitor_replied(struct cuip_monitor *mn, size_t i)
{
	pthread_mutex_lock(&mn->lock);
	mn->w[i].done = true;
	mn->replies++;
	pthread_mutex_unlock(&mn->lock);
}

/* Stop and join the monitor, after the phase's jobs; fail what it gave up. */
void cuip_monitor_stop(struct cuip_monitor *mn)
{
	pthread_mutex_lock(&mn->lock);
	mn->stop = true;
	pthread_cond_signal(&mn->cond);
	pthread_mutex_unlock(&mn->lock);
	pthread_join(mn->th, NULL);
	for (size_t i = 0; i < mn->g->n; i++) {
		assert(!pending(mn, i)); /* the jobs are joined */
		if (mn->w[i].stalled)
			fail_stalled(mn, i);
	}
	pthread_cond_destroy(&mn->cond);
	pthread_mutex_destroy(&mn->lock);
	free(mn->w);
	mn->w = NULL;
}
