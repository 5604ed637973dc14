/*
 * errfmt.c - filling a caller's error buffer; see errfmt.h. Stateless.
 */
#include <stdarg.h>
#include <stdio.h>

#include "errfmt.h"

void cuip_errfmt(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}
