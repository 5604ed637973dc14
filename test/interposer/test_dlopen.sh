#!/bin/sh
# test_dlopen.sh: libcuinterpose.so dlopen'ed by a running process (no
# LD_PRELOAD) passes gated calls to the driver on every thread
# (test_dlopen.c). Run by `make check` through run-test.sh (a private fake
# driver, nothing preloaded for .sh tests). In a sanitizer build the ASan
# runtime is preloaded alone: it must come first.
set -u
[ -x "${CUIP_DLOPEN:-}" ] || {
	echo "FAIL: test_dlopen not built (CUIP_DLOPEN=${CUIP_DLOPEN:-})"
	exit 1
}
if [ -n "${CUIP_ASAN_RT:-}" ]; then
	LD_PRELOAD=$CUIP_ASAN_RT "$CUIP_DLOPEN" "$CUIP_LIB"
else
	env -u LD_PRELOAD "$CUIP_DLOPEN" "$CUIP_LIB"
fi
