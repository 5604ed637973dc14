/*
 * tmpname.h - where the C tests make their temporary files and
 * directories: under $TMPDIR when it is set, else /tmp. `make check` gives
 * each test program a directory of its own there and removes it when the
 * program ends, passed or failed (AM_TESTS_ENVIRONMENT in each Makefile.am
 * that runs one), so a failing test leaves nothing behind in /tmp.
 */
#ifndef CUIP_TEST_TMPNAME_H
#define CUIP_TEST_TMPNAME_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* buf <- "$TMPDIR/name" (or "/tmp/name"); name may end in XXXXXX for
 * mkdtemp() or mkstemp(). Returns buf; a name that does not fit ends the
 * test program, saying so (a cut template would fail later, less clearly). */
static inline char *test_tmpname(char *buf, size_t len, const char *name)
{
	const char *t = getenv("TMPDIR");
	size_t a, b;

	if (!t || !*t)
		t = "/tmp";
	a = strlen(t);
	b = strlen(name);
	if (a + 1 + b + 1 > len) {
		fprintf(stderr, "test_tmpname: TMPDIR=%s is too long for a %zu-byte name of %s\n", t, len, name);
		abort();
	}
	memcpy(buf, t, a);
	buf[a] = '/';
	memcpy(buf + a + 1, name, b + 1);
	return buf;
}

#endif /* CUIP_TEST_TMPNAME_H */
