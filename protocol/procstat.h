/*
 * procstat.h - the one reader of /proc/PID/stat (procstat.c): the plugin
 * (the guardian, the coordinator, placing outside importers), the CLI's
 * check and criu wrapper, and the interposer (an importer's start time,
 * through importers.c) all go through it. Field 2, the command name, may
 * hold spaces and parentheses: the fields after it are found from the last
 * ')'. Stateless; no allocation; open, read and close only (the
 * interposer calls it in its processes).
 */
#ifndef CUIP_PROCSTAT_H
#define CUIP_PROCSTAT_H

#include <stdint.h>
#include <sys/types.h>

struct cuip_proc_stat {
	char comm[65];	/* field 2 without its parentheses (at most 64 bytes) */
	char state;	/* field 3: 'R', 'S', 'D', 'T', 't', 'Z', 'X', ... */
	pid_t ppid;	/* field 4 */
	uint64_t start; /* field 22, starttime: clock ticks after boot */
};

/* Parse the text of a /proc/PID/stat (NUL-terminated) into *st: 0, or
 * -EINVAL when it is not one (no "(comm) " or a field up to 22 missing). */
int cuip_proc_stat_parse(const char *text, struct cuip_proc_stat *st);

/* Read and parse /proc/PID/stat: 0; -ENOENT (or another open errno) when
 * there is no such process; -ESRCH when it went away while being read;
 * -EINVAL when the text is not a stat line. */
int cuip_proc_stat_read(pid_t pid, struct cuip_proc_stat *st);

/* Field 22 (starttime) and field 3 (state, when state is not NULL) of
 * /proc/PID/stat; 0 or as cuip_proc_stat_read. */
int cuip_proc_stat_start(pid_t pid, uint64_t *start, char *state);

#endif /* CUIP_PROCSTAT_H */
