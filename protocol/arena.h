/*
 * arena.h - zeroed memory carved from 1 MiB blocks, all freed at once.
 *
 * Protocol messages describe tens of thousands of records, each a handful
 * of small structs: building one (the interposer's replies) or decoding one
 * (the plugin's responses, through a ProtobufCAllocator) with a malloc per
 * struct and a free per struct later costs more than the work itself.
 * Not thread-safe: one arena per owner.
 */
#ifndef CUIP_ARENA_H
#define CUIP_ARENA_H

#include <stddef.h>

struct cuip_arena_block;

struct cuip_arena {
	struct cuip_arena_block *head;
};

/* `size` zeroed bytes, aligned for any type; NULL when out of memory. */
void *cuip_arena_alloc(struct cuip_arena *a, size_t size);
/* Free every block; the arena is empty and usable again. */
void cuip_arena_clear(struct cuip_arena *a);

#endif
