/*
 * preflight.h - the rules a checkpoint must pass before anything changes.
 *
 * Pure functions over the participants' inspected states (no I/O), so they
 * are unit-tested directly. The first violation is returned with a message
 * naming the process, the resource and what to do; every violation is also
 * logged.
 */
#ifndef CUIP_PLUGIN_PREFLIGHT_H
#define CUIP_PLUGIN_PREFLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "alloc.h"
#include "wire.h"

struct cuip_pf_proc {
	pid_t pid; /* for messages */
	const Cuip__ProcessState *st;
	bool quiesced; /* st was taken after this checkpoint's QUIESCE: phase QUIESCED expected */
};

/* Names a process identity that is not a participant (e.g. the pid of a
 * sharing peer outside the tree); returns 0 when unknown. */
typedef pid_t (*cuip_pf_resolve_fn)(uint64_t id, void *arg);

int cuip_preflight(const struct cuip_pf_proc *p, size_t n, cuip_pf_resolve_fn resolve, void *arg, char *err,
		   size_t errlen);

/*
 * Importers a creator recorded (Allocation.importers, interposer/
 * importers.h): every live one must be a participant, or the dump would
 * tear down memory it still uses. where() places one in our pid namespace:
 * its pid here when it is alive, 0 when it is gone, -1 when that cannot be
 * told. A participant's identity or pid passes; so does a gone importer.
 */
typedef pid_t (*cuip_pf_importer_fn)(const struct cuip_pf_proc *creator, const Cuip__Importer *im, void *arg);
int cuip_preflight_importers(const struct cuip_pf_proc *p, size_t n, cuip_pf_importer_fn where, void *arg, char *err,
			     size_t errlen);

#endif /* CUIP_PLUGIN_PREFLIGHT_H */
