/*
 * ops.h - the checkpoint operations (ops.c): the phase machine the op
 * thread (control.c) runs, one request at a time, holding cuip_state_lock
 * for each.
 */
#ifndef CUIP_OPS_H
#define CUIP_OPS_H

#include "wire.h"

/* Run one plugin operation (op thread). fd: the FD that came with it (consumed). */
Cuip__Response *cuip_op_run(const Cuip__Request *req, int fd);
void cuip_response_free(Cuip__Response *r);

#endif /* CUIP_OPS_H */
