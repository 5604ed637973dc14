/*
 * arena.c - see arena.h.
 */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "arena.h"

#define ARENA_BLOCK (1u << 20)

struct cuip_arena_block {
	struct cuip_arena_block *next;
	size_t used, cap;
	max_align_t data[];
};

void *cuip_arena_alloc(struct cuip_arena *a, size_t size)
{
	struct cuip_arena_block *b = a->head;
	void *p;

	size = (size ? size : 1);
	size = (size + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) * _Alignof(max_align_t);
	if (!b || b->cap - b->used < size) {
		size_t cap = size > ARENA_BLOCK ? size : ARENA_BLOCK;

		b = calloc(1, sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->cap = cap;
		b->next = a->head;
		a->head = b;
	}
	p = (char *)b->data + b->used;
	b->used += size;
	assert(b->used <= b->cap && (uintptr_t)p % _Alignof(max_align_t) == 0);
	return p;
}

void cuip_arena_clear(struct cuip_arena *a)
{
	while (a->head) {
		struct cuip_arena_block *b = a->head;

		a->head = b->next;
		free(b);
	}
}
