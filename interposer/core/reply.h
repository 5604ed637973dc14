/*
 * reply.h - the op thread's reply arena (reply.c): everything a reply to
 * the plugin points to comes from here and is freed at once after the reply
 * is sent. Base layer; op thread only, so no lock.
 */
#ifndef CUIP_REPLY_H
#define CUIP_REPLY_H

#include <stddef.h>

void *cuip_zalloc(size_t size);
char *cuip_strdup(const char *s);
void cuip_arena_release(void);

#endif /* CUIP_REPLY_H */
