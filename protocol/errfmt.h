/*
 * errfmt.h - the one way every module fills a caller's error buffer
 * (errfmt.c): wire framing, the control client, the image reader, the
 * carriers, the plugin's option parser and socket diagnosis. Stateless.
 */
#ifndef CUIP_ERRFMT_H
#define CUIP_ERRFMT_H

#include <stddef.h>

/* printf into err (errlen bytes, always terminated); nothing when err is
 * NULL or errlen 0, so callers that want no text pass NULL. */
void cuip_errfmt(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The short name the modules write it under. */
#define errfmt cuip_errfmt

#endif /* CUIP_ERRFMT_H */
