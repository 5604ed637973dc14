#!/bin/sh
# run-test.sh PROGRAM [ARGS]: the LOG_COMPILER of the interposer tests.
# Gives the test a private fake driver (its own fakecuda-devd socket) and a
# private control-socket directory, preloads libcuinterpose.so (after the
# ASan runtime in sanitizer builds) into the test program only, and stops
# the fake driver afterwards. Paths come from AM_TESTS_ENVIRONMENT.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cuip-test.XXXXXX") || exit 99
FAKECUDA_SOCKET=$tmp/devd.sock
CUINTERPOSE_SOCKET_DIR=$tmp/sock
FAKECUDA_DEVICES=${FAKECUDA_DEVICES:-2}
CUIP_TMP=$tmp
export FAKECUDA_SOCKET CUINTERPOSE_SOCKET_DIR FAKECUDA_DEVICES CUIP_TMP
preload=$CUIP_LIB
[ -n "${CUIP_ASAN_RT:-}" ] && preload=$CUIP_ASAN_RT:$preload
case "$1" in
*.sh) "$FAKECUDA_RUN" "$@" ;;
*) "$FAKECUDA_RUN" env LD_PRELOAD="$preload" "$@" ;;
esac
rc=$?
"$FAKECUDA_RUN" --stop
rm -rf "$tmp"
exit $rc
