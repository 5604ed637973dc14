#!/bin/sh
# pipeline-compare.sh BUILD REV [ARGS...]: the carrier pipeline's CPU cost
# before and after: builds pipeline-bench (test/carrier/pipeline-bench.c on
# the stub driver) against the carrier's sources (carrier/*.c) of git
# revision REV (where older revisions kept it: interposer/carrier.c) and of
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
mkdir "$d/src"
if [ $old = carrier ]; then
	# Every source and header of the revision's carrier/.
	for f in $(git -C "$src" ls-tree --name-only "$rev" carrier/ | grep '\.[ch]$'); do
		git -C "$src" show "$rev:$f" >"$d/src/${f#carrier/}"
	done
else
	git -C "$src" show "$rev:$old/carrier.c" >"$d/src/carrier.c"
	git -C "$src" show "$rev:$old/carrier.h" >"$d/src/carrier.h"
fi
# The chunk scan's PTX (carrier/Makefile.am makes it) where a side uses it.
ptx() { grep -qs cuip_chunkscan_ptx "$@" && echo "$build/carrier/chunkscan_ptx.c"; }
# The old build: its own headers first on the include path.
old_flags=
grep -q pin_seconds "$d/src/carrier.h" || old_flags=-DNO_PIN_SECONDS
$cc $flags -I"$d/src" $old_flags -o "$d/old" "$d"/src/*.c $(ptx "$d"/src/*.c) "$src/test/carrier/stub.c" \
	"$src/test/carrier/pipeline-bench.c" "$lib" -lprotobuf-c -lzstd
$cc $flags -o "$d/new" "$src"/carrier/*.c $(ptx "$src"/carrier/*.c) "$src/test/carrier/stub.c" \
	"$src/test/carrier/pipeline-bench.c" "$lib" -lprotobuf-c -lzstd
for i in $(seq "${ROUNDS:-5}"); do
	for v in old new; do
		echo "== $v ($([ $v = old ] && echo "$rev" || echo "working tree"))"
		(cd "${TMPDIR:-/tmp}" && "$d/$v" "$@" | tail -n 2)
	done
done
