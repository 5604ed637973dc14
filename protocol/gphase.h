/*
 * gphase.h - the coordinator's phases by number, and their one spelling
 * (gphase.c). The coordinator (plugin/coord.c) runs its phases by these
 * values, the guardian (plugin/guardian.c) reads the names criu reports
 * back into them, the control client names its requests with them and the
 * tests look for the names in logs. Stateless: a constant table.
 */
#ifndef CUIP_GPHASE_H
#define CUIP_GPHASE_H

#include <stdbool.h>

enum cuip_gphase {
	CUIP_GPHASE_NONE = 0, /* not a coordinator phase ("native-lock", ...) */
	CUIP_GPHASE_HANDSHAKE,
	CUIP_GPHASE_INSPECT,
	CUIP_GPHASE_PREFLIGHT,
	CUIP_GPHASE_QUIESCE,
	CUIP_GPHASE_REINSPECT, /* INSPECT again, the gates closed */
	CUIP_GPHASE_PREPARE_MULTICAST,
	CUIP_GPHASE_SAVE,
	CUIP_GPHASE_IMAGES,
	CUIP_GPHASE_PREPARE_UNICAST,
	CUIP_GPHASE_LOAD,
	CUIP_GPHASE_REBUILD, /* the request; its phases are the stages below */
	CUIP_GPHASE_REBUILD_CREATORS,
	CUIP_GPHASE_REBUILD_IMPORTERS,
	CUIP_GPHASE_REBUILD_MC_CREATORS,
	CUIP_GPHASE_REBUILD_MC_IMPORTERS,
	CUIP_GPHASE_REBUILD_MC_DEVICES,
	CUIP_GPHASE_REBUILD_MC_BINDINGS,
	CUIP_GPHASE_VERIFY,
	CUIP_GPHASE_RESUME,
	/* A rollback finishing a teardown that failed part-way. */
	CUIP_GPHASE_PREPARE_MULTICAST_ROLLBACK,
	CUIP_GPHASE_PREPARE_UNICAST_ROLLBACK,
	CUIP_GPHASE_COUNT
};

/* The phase's name as every log line and the guardian channel spell it
 * ("PREPARE_MULTICAST (rollback)" for the rollback's); "?" out of range. */
const char *cuip_gphase_name(enum cuip_gphase ph);

/* The phase a name spells (cuip_gphase_name's inverse); CUIP_GPHASE_NONE
 * for NULL or any other text. */
enum cuip_gphase cuip_gphase_parse(const char *name);

/* The request a phase's name is spelled after, its rollback's included:
 * PREPARE_MULTICAST for CUIP_GPHASE_PREPARE_MULTICAST_ROLLBACK, REBUILD
 * for every stage; the phase itself otherwise. */
enum cuip_gphase cuip_gphase_base(enum cuip_gphase ph);

/* The phase of a control request (Cuip__Request__BodyCase) and of a
 * REBUILD stage (Cuip__Stage); CUIP_GPHASE_NONE for one that is not. */
enum cuip_gphase cuip_gphase_of_request(int body_case);
enum cuip_gphase cuip_gphase_of_stage(int stage);

#endif /* CUIP_GPHASE_H */
