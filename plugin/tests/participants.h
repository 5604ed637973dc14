/*
 * participants.h - fake participants for the coordinator's tests: threads
 * (or a child process, where a test needs the participant's own
 * /proc/PID/io) that speak the control protocol on real unix sockets as an
 * interposer would, log each request, keep the phase an interposer would
 * report, and fail, hang, delay or trickle on the request a test names.
 * Shared by check_coord.c and check_oom.c; one group at a time per process.
 */
#ifndef CUIP_TEST_PARTICIPANTS_H
#define CUIP_TEST_PARTICIPANTS_H

#include <pthread.h>
#include <sys/types.h>

#include "coord.h"
#include "fixtures.h"

#define NFAKE 4

struct fake {
	int idx;
	char path[108];
	int lfd;
	pthread_t th;
	struct fx_proc fx;
	const char *fail_on; /* request name answered with -EIO */
	const char *delay_on;
	unsigned delay_ms;
	const char *hang_on;	/* request neither answered nor worked on until the connection closes */
	const char *trickle_on; /* request that reads 256 bytes every 20 ms for trickle_ms before its answer */
	unsigned trickle_ms;
	int forked; /* served by a child process (its own /proc/PID/io), not a thread */
	pid_t child;
	int save_short;
	int bad_extent;		/* SAVE answers an extent in a file it was not given (1), one byte short (2) */
	int phase;		/* Cuip__Phase as an interposer would report it; 0: ACTIVE */
	int restored, in_place; /* LOADs and REBUILDs with Load/Rebuild.restored set, and without */
	int sync_loads;		/* LOADs with sync_copies set */
	char log[64][24];
	int nlog;
};

extern struct fake fk[NFAKE];
/* Called first in each fake's thread, when set. */
extern void (*fake_thread_start)(void);
/* Requests and replies in the order the fakes saw them ("REQ SAVE", "REP
 * SAVE"); nev counts them, a test may set it back to 0. */
extern int nev;
/* Index of the first (last) event matching what, of fake (-1: any), or -1. */
int ev_first(int fake, const char *what);
int ev_last(int fake, const char *what);

/* A fresh temporary directory and no fake (Check fixture). */
void fakes_setup(void);
/* Stop every fake and remove the directory. */
void fakes_teardown(void);

/* The group the coordinator works on, and its options. */
extern struct cuip_opts opts;
extern struct cuip_group g;
/* Creator 0 (two shared allocations, one not a multiple of the chunk, plus
 * a private one), importers 1..n-1 mapping the first shared one; starts
 * the fakes and fills g. */
void group_of(int n);
void group_done(void);
/* Fake i's log of requests is exactly want[0..n). */
void assert_log(int i, const char *const *want, int n);

#endif
