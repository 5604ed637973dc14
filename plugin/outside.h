/*
 * outside.h - finding, from the plugin's side (the host), the processes a
 * creator recorded as importers of its memory (protocol/importers.h):
 * the creator reports each importer's pid in its own pid namespace and the
 * start time it read there; this maps it to our pid namespace through
 * /proc/PID/status NSpid and tells whether it is still the same live
 * process. Called by coord.c's preflight; no state, no locks.
 */
#ifndef CUIP_PLUGIN_OUTSIDE_H
#define CUIP_PLUGIN_OUTSIDE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* NSpid of pid, outermost (ours) first: the count (0 when unreadable);
 * up to max values in v. */
int cuip_proc_nspid(pid_t pid, pid_t *v, int max);
/* The importer that creator (a pid of ours) knows as pid `ipid`, started at
 * `start` (0: unknown): its pid here when it is alive, 0 when it is gone,
 * -1 when that cannot be told (ipid 0: invisible from the creator). */
pid_t cuip_importer_here(pid_t creator, pid_t ipid, uint64_t start);

/* The same for an importer the creator cannot see (its pid 0 there), by
 * what the importer told of itself: the process in pid namespace `pid_ns`
 * (inode) known there as `self_pid`, started at `start` (its own view). */
pid_t cuip_importer_by_ns(uint64_t pid_ns, pid_t self_pid, uint64_t start);

#endif /* CUIP_PLUGIN_OUTSIDE_H */
