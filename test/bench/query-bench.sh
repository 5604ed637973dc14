#!/usr/bin/env bash
# query-bench.sh BUILDDIR GPUBIN LIB_BEFORE LIB_AFTER [ROUNDS]: the interposition
# cost of two interposers in one run on the fake driver (test/bench/RESULTS.md,
# issue 17). gate-bench (BUILDDIR/test/e2e/gate-bench, `make -C test/e2e
# gate-bench`) with -i each library, then ROUNDS (default 5) rounds of
# gpu_microbench (GPUBIN from test/gpu/build.sh BUILDDIR GPUBIN) plain, with
# LIB_BEFORE and with LIB_AFTER preloaded, alternating, under one private
# fakecuda-devd. Prints the raw lines; compare medians of one run.
set -euo pipefail
b=$(cd "${1:?usage: query-bench.sh BUILDDIR GPUBIN LIB_BEFORE LIB_AFTER [ROUNDS]}" && pwd)
bin=${2:?}
before=${3:?}
after=${4:?}
rounds=${5:-5}
run=$b/test/fakecuda/fakecuda-run
tmp=$(mktemp -d /tmp/cuip-qbench.XXXXXX)
export FAKECUDA_SOCKET=$tmp/devd.sock CUINTERPOSE_SOCKET_DIR=$tmp/sock
trap '"$run" --stop; rm -rf "$tmp"' EXIT
for lib in "$before" "$after"; do
	echo "== gate-bench $lib"
	"$run" "$b/test/e2e/gate-bench" -i "$lib" -n 50000 -r 7
done
for ((i = 1; i <= rounds; i++)); do
	echo "== micro plain $i"
	"$run" "$bin/gpu_microbench" 200000 5
	echo "== micro before $i"
	"$run" env LD_PRELOAD="$before" "$bin/gpu_microbench" 200000 5
	echo "== micro after $i"
	"$run" env LD_PRELOAD="$after" "$bin/gpu_microbench" 200000 5
done
