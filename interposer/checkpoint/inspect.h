/*
 * inspect.h - this process's tracked state as a cuip.ProcessState
 * (inspect.c). Op thread, caller holds cuip_state_lock; reply arena memory.
 */
#ifndef CUIP_INSPECT_H
#define CUIP_INSPECT_H

#include "wire.h"

/* Build this process's state from the records (caller holds state_lock);
 * memory from the arena. */
Cuip__ProcessState *cuip_state_build(void);

#endif /* CUIP_INSPECT_H */
