/*
 * release.h - the job's hooks that give memory back before a checkpoint
 * (release.c; cuinterpose_on_checkpoint in cuinterpose.h,
 * CUINTERPOSE_RELEASE). Called by QUIESCE (ops.c) without cuip_state_lock:
 * the hooks free memory through the interposer, which takes it.
 */
#ifndef CUIP_RELEASE_H
#define CUIP_RELEASE_H

#include <stdbool.h>
#include <stddef.h>

/* CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS (read at load; default 5000): the most
 * a QUIESCE waits for the hooks. */
extern unsigned cuip_release_timeout_ms;
/* Whether this process has a hook to run (registered or from the environment). */
bool cuip_release_wanted(void);
/* Run every hook once on the release thread and wait at most timeout_ms:
 * 0 when they returned (or there are none); -ETIMEDOUT (still running,
 * they finish on their own), -EIO (a Python hook raised) or another
 * negative errno, with msg saying what. The caller goes on either way. */
int cuip_release_run(unsigned timeout_ms, char *msg, size_t len);

#endif /* CUIP_RELEASE_H */
