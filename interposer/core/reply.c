/*
 * reply.c - the op thread's reply arena. The records of a reply
 * (ProcessState, multicast and pool entries, error strings) are carved from
 * arena blocks (protocol/arena.h) and all go at once after the reply is sent
 * (ops.c). Base layer: calls nothing of the interposer. Used by inspect.c,
 * multicast.c, pool.c, carry.c and ops.c, on the op thread only, so no
 * lock.
 */
#include <string.h>

#include "arena.h"
#include "reply.h"

static struct cuip_arena reply_arena;

void *cuip_zalloc(size_t size)
{
	return cuip_arena_alloc(&reply_arena, size);
}

void cuip_arena_release(void)
{
	cuip_arena_clear(&reply_arena);
}

char *cuip_strdup(const char *s)
{
	char *p = s ? cuip_zalloc(strlen(s) + 1) : NULL;

	if (p)
		strcpy(p, s);
	return p;
}
