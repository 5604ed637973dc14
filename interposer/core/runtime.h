/*
 * runtime.h - the per-process runtime (runtime.c): identity, devices, the
 * start after cuInit, and the hooks other modules register for start and
 * fork. Base layer: runtime.c calls only the log, the driver table, the
 * gate (its fork reset), the importer helpers and client.c's identity
 * (what a FETCH tells the creator); start_mu protects the
 * start, the identity is written once under it and read-only afterwards.
 */
#ifndef CUIP_RUNTIME_H
#define CUIP_RUNTIME_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct cuip_device {
	int ordinal;
	uint8_t uuid[16];
	char name[64]; /* cuDeviceGetName, "" when it failed */
};

struct cuip_self {
	uint64_t id;	/* process identity, random per incarnation */
	pid_t pid;	/* pid that owns this state */
	char sock[108]; /* control socket path */
	int ndev;
	struct cuip_device dev[64];
};

extern struct cuip_self self;
/* CUINTERPOSE_PRIVATE=native (read once at load, runtime.c): private
 * tracked memory is left to the driver's native checkpoint; otherwise the
 * carrier saves and reloads it like shared memory (cuip_carried). */
extern bool cuip_private_native;
/* CUINTERPOSE_TEST_STACKS (read once at load): "lower" (default) lowers the
 * contexts' stack limits for the native checkpoint (ctx.c), "keep" not. */
extern bool cuip_stacks_lower;
/* Whether a CUINTERPOSE_* variable the job's processes read has a value
 * protocol/settings.c's table refuses: checked once, each bad one said on
 * stderr with its range; cuInit then fails, before anything changes. */
bool cuip_settings_refused(void);
/* Start the runtime (after the first successful cuInit); idempotent. */
void cuip_start(void);
bool cuip_started(void);
/* cuInit's start-up: begin passes the start gate (startmark.h) and returns
 * true when this call is the one to start the runtime; then end(ok) with
 * whether the driver's cuInit succeeded. */
bool cuip_start_begin(void);
void cuip_start_end(bool ok);
/* Device ordinal -> UUID (NULL when unknown); UUID -> ordinal or -1. */
const uint8_t *cuip_dev_uuid(int ordinal);
int cuip_dev_by_uuid(const uint8_t *uuid);
/* Re-read the device list (after a restore, devices may have been remapped). */
void cuip_devices_rescan(void);
void cuip_random(void *buf, size_t len);

/*
 * Hooks, registered statically (each entry is placed in a linker section
 * that runtime.c walks, so a hook exists before any constructor runs and
 * the runtime names no module above it).
 *
 * CUIP_FORK_HOOK: around fork(2), prepare runs in the parent before the
 * fork (after the runtime took its start lock), parent after it in the
 * parent, child in the child, which starts with fresh, empty state: each
 * module drops what it inherited (never uses it). Any of the three may be
 * NULL. prepare hooks run in link order, parent hooks in reverse, child
 * hooks in link order; no module's reset depends on another's.
 *
 * CUIP_START_HOOK: runs once when the runtime starts (after the first
 * successful cuInit, identity and devices known); 0 or a negative errno,
 * which marks the process NOSOCKET (lifecycle.c starts the control server).
 */
struct cuip_fork_hook {
	void (*prepare)(void);
	void (*parent)(void);
	void (*child)(void);
};
#define CUIP_FORK_HOOK(name, prepare, parent, child)             \
	static const struct cuip_fork_hook cuip_fork_hook_##name \
		__attribute__((used, section("cuip_fork_hooks"), aligned(sizeof(void *)))) = {prepare, parent, child}

typedef int (*cuip_start_hook_fn)(void);
#define CUIP_START_HOOK(name, fn)                              \
	static const cuip_start_hook_fn cuip_start_hook_##name \
		__attribute__((used, section("cuip_start_hooks"), aligned(sizeof(void *)))) = fn

#endif /* CUIP_RUNTIME_H */
