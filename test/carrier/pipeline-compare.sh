#!/bin/sh
# pipeline-compare.sh BUILD REV [ARGS...]: the carrier pipeline's CPU cost
# before and after: builds pipeline-bench (test/carrier/pipeline-bench.c on
# the stub driver) against carrier/carrier.c of git revision REV (where
# older revisions kept it: interposer/carrier.c) and of
# the working tree, with the flags of the configured build tree BUILD, then
# runs the two alternately ROUNDS times (default 5; ARGS go to both, e.g.
# -s 512 -F 4 -t 4 -S 56 -r 5) and prints every result, so that the minimum
# of each can be read off the same stretch of time on a loaded machine.
# Writes only to a mktemp directory, removed afterwards.
set -e
[ $# -ge 2 ] || { echo "usage: $0 BUILD REV [pipeline-bench ARGS...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
rev=$2
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC:-cc}
d=$(mktemp -d /tmp/pipeline-compare.XXXXXX)
trap 'rm -rf "$d"' EXIT
lib=$build/protocol/.libs/libcuiproto.a
[ -f "$lib" ] || { echo "$0: no $lib: build $build first" >&2; exit 1; }
flags="-std=gnu11 -D_GNU_SOURCE -O2 -pthread -I$src/carrier -I$build/protocol -I$src/protocol -I/usr/local/cuda/include"
old=carrier
git -C "$src" cat-file -e "$rev:carrier/carrier.c" 2>/dev/null || old=interposer
git -C "$src" show "$rev:$old/carrier.c" >"$d/carrier.c"
git -C "$src" show "$rev:$old/carrier.h" >"$d/carrier.h"
# The old build: its own carrier.h first on the include path.
old_flags=
grep -q pin_seconds "$d/carrier.h" || old_flags=-DNO_PIN_SECONDS
$cc $flags -I"$d" $old_flags -o "$d/old" "$d/carrier.c" "$src/test/carrier/stub.c" \
	"$src/test/carrier/pipeline-bench.c" "$lib" -lprotobuf-c
$cc $flags -o "$d/new" "$src/carrier/carrier.c" "$src/test/carrier/stub.c" \
	"$src/test/carrier/pipeline-bench.c" "$lib" -lprotobuf-c
for i in $(seq "${ROUNDS:-5}"); do
	for v in old new; do
		echo "== $v ($([ $v = old ] && echo "$rev" || echo "working tree"))"
		(cd "${TMPDIR:-/tmp}" && "$d/$v" "$@" | tail -n 2)
	done
done
