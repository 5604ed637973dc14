/*
 * ops.h - the checkpoint operations (ops.c): the phase machine the op
 * thread (control.c) runs, one request at a time, holding cuip_state_lock
 * for each.
 */
#ifndef CUIP_OPS_H
#define CUIP_OPS_H

#include "wire.h"

/* Run one plugin operation (op thread). fds: the FDs that came with it
 * (consumed; SAVE and LOAD: the carrier files, at most CUIP_OP_MAX_FDS). */
#define CUIP_OP_MAX_FDS CUIP_CARRIER_FILES_MAX /* wire.h */
Cuip__Response *cuip_op_run(const Cuip__Request *req, const int *fds, size_t nfds);
void cuip_response_free(Cuip__Response *r);

#endif /* CUIP_OPS_H */
