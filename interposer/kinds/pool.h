/*
 * pool.h - stream-ordered memory pools (pool.c): tracked, private ones left
 * to native, shared ones refused. Own leaf lock pool_lock.
 */
#ifndef CUIP_POOL_H
#define CUIP_POOL_H

#include <stddef.h>
#include <stdint.h>
#include "wire.h"

/* A tracked pool block or imported pool pointer at va was freed (cuMemFree). */
void cuip_pool_freed(uint64_t va);

#endif /* CUIP_POOL_H */
