/*
 * cli_lib.c - where libcuinterpose.so is, for `run` (cli.c) and `check`
 * (cli_check.c): $CUINTERPOSE_LIB if set, else the build tree's copy when
 * this binary runs from the build tree, else the installed one. Stateless.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "cli.h"

static int exists(const char *p)
{
	return access(p, R_OK) == 0;
}

int cli_find_lib(char *buf, size_t len)
{
	const char *env = getenv("CUINTERPOSE_LIB");
	char exe[PATH_MAX], *slash;
	ssize_t n;

	if (env && *env) {
		snprintf(buf, len, "%s", env);
		return exists(buf) ? 0 : -ENOENT;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = 0;
		slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			/* cli/cuinterpose or cli/.libs/cuinterpose in a build tree */
			static const char *const rel[] = {"/../interposer/.libs/libcuinterpose.so",
							  "/../../interposer/.libs/libcuinterpose.so"};
			for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
				if (snprintf(buf, len, "%.*s%s", (int)(len - 64), exe, rel[i]) >= (int)len)
					continue;
				if (exists(buf)) {
					char *r = realpath(buf, NULL);
					if (r) {
						snprintf(buf, len, "%s", r);
						free(r);
					}
					return 0;
				}
			}
		}
	}
	snprintf(buf, len, "%s/libcuinterpose.so", CUIP_LIBDIR);
	return exists(buf) ? 0 : -ENOENT;
}
