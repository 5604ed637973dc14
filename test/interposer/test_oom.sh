#!/bin/sh
# test_oom.sh: out-of-memory injection over the interposer (test_oom.c),
# with libcuinterpose-oom.so (interposer/Makefile.am: the library compiled
# with test/harness/failalloc.h) preloaded in place of libcuinterpose.so,
# after the ASan runtime in sanitizer builds. Run by `make check` through
# run-test.sh, which gives it a private fake driver and socket directory
# and preloads nothing for .sh tests.
set -u
lib=${CUIP_OOM_LIB:-}
[ -f "$lib" ] || {
	echo "FAIL: libcuinterpose-oom.so not built (CUIP_OOM_LIB=$lib)"
	exit 1
}
[ -x "${CUIP_OOM_TEST:-}" ] || {
	echo "FAIL: test_oom not built (CUIP_OOM_TEST=${CUIP_OOM_TEST:-})"
	exit 1
}
preload=$lib
[ -n "${CUIP_ASAN_RT:-}" ] && preload=$CUIP_ASAN_RT:$preload
exec env LD_PRELOAD="$preload" "$CUIP_OOM_TEST"
