/*
 * criu_asan_init.c - preloaded beside libasan into an uninstrumented criu
 * (sanitizer builds of the end-to-end tests only; test/e2e/lib.sh).
 *
 * Why: criu links gnutls, whose libp11-kit calls newlocale() from its
 * constructor. That constructor runs before libasan's, so newlocale's
 * malloc is ASan's first intercepted call and initializes ASan while
 * newlocale holds glibc's __libc_setlocale_lock for writing. ASan's init
 * looks up the optional `swift_demangle` with dlsym(), and the dlerror()
 * that clears the failure translates its message through gettext, which
 * takes and releases that same lock. newlocale's own unlock then
 * underflows it: criu works (dump and restore succeed), then hangs for good
 * in exit(), when libp11-kit's destructor calls freelocale() (measured with
 * CRIU 4.1.1, GCC 12 libasan, glibc 2.36; gdb watchpoint on the lock).
 *
 * Defining swift_demangle makes that dlsym() succeed, so ASan's init never
 * touches gettext. ASan calls it first for every name it demangles; NULL
 * means "not a Swift name" and ASan falls back to the C++ demangler, which
 * is what it does without this file. Nothing else is changed.
 */
#include <stddef.h>

__attribute__((visibility("default"))) char *swift_demangle(const char *name, size_t len, char *out, size_t *outlen,
							    unsigned flags);

char *swift_demangle(const char *name, size_t len, char *out, size_t *outlen, unsigned flags)
{
	(void)name;
	(void)len;
	(void)out;
	(void)outlen;
	(void)flags;
	return NULL;
}
