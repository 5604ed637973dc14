/*
 * monitor.h - the watch over a coordinator phase that moves data (SAVE,
 * LOAD, the REBUILD stages): a progress line every CUINTERPOSE_PROGRESS_MS
 * and the stall bound CUINTERPOSE_STALL_TIMEOUT_MS (monitor.c).
 *
 * Owns: one thread per watched phase and, per participant, whether its
 * reply is in, whether the monitor gave its request up, and the byte
 * counts it compares. When for the stall bound no participant still at
 * work moved a byte of the phase (one whose count cannot be read counts as
 * still) and no reply came, it gives up every request still pending: it
 * shuts that participant's connection down (the job's recv returns at
 * once), and after the join fails the participant (status -ETIMEDOUT, err
 * saying how far it had got, connection closed). A stall, not a total: a
 * slow phase that keeps moving runs on (CUINTERPOSE_TEST_DATA_TIMEOUT_MS bounds
 * the total).
 *
 * Caller: coord.c's run_phase_metered only, from the hook thread: it fills
 * the first fields, calls cuip_monitor_start before the phase's job threads
 * start, each job thread calls cuip_monitor_replied when its step returned,
 * and the hook thread calls cuip_monitor_stop after joining them, so criu
 * is single-threaded again when the phase returns. The monitor calls
 * nothing of coord.c by name: only the phase's `applies` and meter
 * functions it is handed, which read the participants' records, the files
 * and /proc entries of the phase, never what a job thread writes.
 *
 * Locking: lock protects stop, replies and each participant's done and
 * stalled while the thread runs; the rest of w[] and the fields after th
 * are the monitor thread's own until cuip_monitor_stop joined it.
 */
#ifndef CUIP_PLUGIN_MONITOR_H
#define CUIP_PLUGIN_MONITOR_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord.h"

/* Whether participant p takes part in the phase (NULL: all do). */
typedef bool (*cuip_applies_fn)(const struct cuip_group *g, const struct cuip_part *p, const void *arg);

/*
 * How a data phase measures itself from outside its job threads: `total`
 * is what participant p will move, `done` what it has moved so far (< 0:
 * unknown). Both only read the participant's records and the files and
 * /proc entries of the phase, never what the job thread writes. A phase
 * without a byte count (REBUILD) has neither: its watchdog goes by replies
 * alone, and it logs no progress lines.
 */
struct cuip_meter {
	uint64_t (*total)(const struct cuip_group *g, const struct cuip_part *p, const void *arg);
	int64_t (*done)(const struct cuip_group *g, const struct cuip_part *p, const void *arg);
	bool delta; /* done counts from an arbitrary origin: subtract its start value */
	/* Optional, SAVE: how p's bytes were decided so far (scanned on the
	 * device, copied to the host); false when p does not say. */
	bool (*detail)(const struct cuip_group *g, const struct cuip_part *p, const void *arg, uint64_t *scanned,
		       uint64_t *copied);
	/* Optional: what the phase's summary line adds after its rate (from
	 * the replies, once the phase is over); "" for nothing. */
	void (*summary)(const struct cuip_group *g, const void *arg, char *buf, size_t len);
};

/* A phase watched by its replies alone (REBUILD's stages). */
extern const struct cuip_meter cuip_meter_replies_only;

/* One participant, as the monitor sees it. */
struct cuip_watch {
	bool done;     /* its step returned (under lock) */
	bool stalled;  /* the monitor gave its request up (under lock) */
	int64_t moved; /* stalled: bytes it had moved when given up; < 0 unknown */
	int64_t base;  /* done() when the phase started (delta meters) */
	int64_t seen;  /* moved at the last look, -1 unknown */
};

struct cuip_monitor {
	/* set by the caller */
	struct cuip_group *g;
	const char *name;
	cuip_applies_fn applies;
	const void *arg;
	const struct cuip_meter *m; /* NULL: not watched */
	/* the monitor's */
	struct cuip_watch *w; /* per participant */
	uint64_t total;
	size_t replies;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* CLOCK_MONOTONIC; signalled with stop set */
	bool stop;
	pthread_t th;
	double t0, line_t, move_t; /* phase start, last progress line, last byte or reply */
	uint64_t last;		   /* bytes at the last line with a count */
	double last_t;
};

/* Start watching: 1 when it watches, 0 when it has nothing to do (no
 * meter, progress lines and the stall bound both off, no participant) or
 * could not start for progress lines only; a negative errno, with g->err
 * set, when the phase's stall bound cannot be kept (no memory, no
 * thread): the phase is not to run unbounded. */
int cuip_monitor_start(struct cuip_monitor *mn);

/* Participant i's step returned (its job thread; the monitor watches). */
void cuip_monitor_replied(struct cuip_monitor *mn, size_t i);

/* Stop and join the monitor, after the phase's jobs are joined; fail
 * every participant whose request it gave up. */
void cuip_monitor_stop(struct cuip_monitor *mn);

#endif /* CUIP_PLUGIN_MONITOR_H */
