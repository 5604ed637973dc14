/*
 * startgate.h - the plugin's half of the start gate (protocol/startmark.h):
 * while a checkpoint is under way, no process of the dumped tree that maps
 * the interposer may begin CUDA; one that is beginning is waited for.
 *
 * Called from the hooks' thread only (criu is single-threaded there); the
 * held descriptors are this module's state.
 */
#ifndef CUIP_PLUGIN_STARTGATE_H
#define CUIP_PLUGIN_STARTGATE_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Hold the gate of the library pid maps (a shared flock on its inode; one
 * hold per distinct inode), waiting at most timeout_ms for a process that is
 * passing it. 0, or -errno with err naming pid and cause.
 */
int cuip_startgate_hold(pid_t pid, unsigned timeout_ms, char *err, size_t errlen);

/*
 * Wait until pid is no longer STARTING (its first cuInit under way), at most
 * timeout_ms. Returns its start state (CUIP_MARK_*), or -ETIMEDOUT / -errno
 * with err set. *sock_err: its control socket's errno when NOSOCKET.
 */
int cuip_startgate_settle(pid_t pid, unsigned timeout_ms, int *sock_err, char *err, size_t errlen);

/* Release every hold (the tree is frozen, or the dump is over). */
void cuip_startgate_release(void);

/* How many distinct library files are held. */
size_t cuip_startgate_held(void);

#endif /* CUIP_PLUGIN_STARTGATE_H */
