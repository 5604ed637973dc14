/*
 * importers.h - who fetched a creator's export (importers.c).
 *
 * Every import of a shared allocation or multicast object, however its
 * ticket travelled (SCM_RIGHTS, pidfd_getfd, a cuIpc handle), ends in a
 * FETCH from the creator's control socket; the creator records the peer
 * there (SO_PEERCRED pid and uid, the start time of that pid, the identity
 * it announced), per cached export, so that a checkpoint can refuse while a
 * process outside the dumped tree still uses the memory, wherever that
 * process's own socket lives. A set is deduplicated by (pid, start time),
 * bounded (CUIP_IMPORTERS_MAX; the overflow is counted, never forgotten),
 * and forgets an entry when its process is gone (the pid no longer exists,
 * is a zombie, or now belongs to a process started at another time).
 *
 * Pure functions over a set plus cuip_importer_alive() (/proc); no locks:
 * the caller (xcache.c, under xc_lock) serializes.
 */
#ifndef CUIP_IMPORTERS_H
#define CUIP_IMPORTERS_H

#include <stdint.h>
#include <sys/types.h>

#define CUIP_IMPORTERS_MAX 64

struct cuip_importer {
	pid_t pid;	/* in our pid namespace; 0: not visible from here */
	uint64_t start; /* /proc/PID/stat field 22; 0 when unknown */
	uint64_t id;	/* announced interposer identity; 0: none */
	uint32_t uid;
	/* as the importer told it; only used when pid is 0 */
	pid_t self_pid;
	uint64_t pid_ns, self_start;
};

struct cuip_importers {
	unsigned n, cap;
	unsigned dropped; /* importers not recorded because the set was full */
	struct cuip_importer *e;
};

/* 1: p is the same live process as when recorded; 0: gone; < 0: cannot tell. */
typedef int (*cuip_importer_alive_fn)(const struct cuip_importer *p);

/* Record p: 1 added, 0 already there (same pid and start time, or the same
 * identity for an invisible pid), -ENOSPC full even after forgetting the
 * dead (counted in dropped), -ENOMEM. An entry with p's pid but another
 * start time is a reused pid: it is replaced. */
int cuip_importers_add(struct cuip_importers *s, const struct cuip_importer *p, cuip_importer_alive_fn alive);
/* Take back what cuip_importers_add(s, p) did when it returned `added`,
 * because p never got the memory (the reply carrying it was not sent):
 * 1 forgets p (an exited process whose reused pid p replaced stays
 * forgotten), < 0 takes one off dropped, 0 (p was there before) nothing. */
void cuip_importers_undo(struct cuip_importers *s, const struct cuip_importer *p, int added);
/* Forget the entries alive() says are gone (0); keeps those it cannot tell. */
void cuip_importers_prune(struct cuip_importers *s, cuip_importer_alive_fn alive);
void cuip_importers_free(struct cuip_importers *s);

/* 1 when /proc is mounted for our pid namespace (/proc/self is getpid()):
 * otherwise (a pid namespace without its own /proc) /proc/PID names other
 * processes, and liveness is left to the plugin. */
int cuip_proc_is_ours(void);
/* The real check: the pid exists, is not a zombie and started at p->start
 * (-1 when /proc is not ours). */
int cuip_importer_alive(const struct cuip_importer *p);

#endif /* CUIP_IMPORTERS_H */
